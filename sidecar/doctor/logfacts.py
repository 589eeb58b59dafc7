"""What a vLLM log says about its configuration, its memory and why it stopped. Pure data.

Every field is None when the log does not say it; `log_parser.parse_log` fills them from the exact lines
listed in docs/doctor.md ("Log lines read").
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

# Where a start's arguments were read (`ServerArgs.stated_by`), as each reading names its source.
STATED_BY_VLLM = "the arguments vLLM logged at start"
STATED_BY_PASTED = "the command line pasted with the log"
STATED_BY_OPTION = "--vllm-command"
STATED_BY_INCIDENT = "the vLLM command line the incident kept"
STATED_BY_PROCESS = "vLLM's server command line, as the sidecar saw it while vLLM served"

# What the parser's line handlers gather as they read, keyed by LogFacts' field names (and a few working keys
# they drop before building it).
Facts = dict[str, object]


@dataclass(frozen=True, slots=True, kw_only=True)
class CpuKvSpace:
    """The CPU backend's KV space as set explicitly: "Explicitly set (S/T) GiB for KV cache on node N."."""

    line: str
    space_gib: float
    node_total_gib: float


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerArgs:
    """The command-line arguments a start ran with: as vLLM logged them, or as a command line gave them.

    `complete` is True for the `args: Namespace(...)` line (<= 0.8.x: every argument, None when unset), and for a
    command line that names a `--config` file (what it leaves out may be in the file): a missing key is unknown.
    It is False for `non-default args: {...}` (0.9+: only what differs from the default) and for a command line:
    a missing key means vLLM's default.
    """

    complete: bool
    stated_by: str = STATED_BY_VLLM
    max_model_len: int | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    gpu_memory_utilization: float | None = None
    block_size: int | None = None
    enable_prefix_caching: bool | None = None
    kv_cache_memory_bytes: int | None = None
    tensor_parallel_size: int | None = None
    shutdown_timeout: int | None = None
    quantization: str | None = None
    kv_cache_dtype: str | None = None
    model: str | None = None
    dtype: str | None = None
    pipeline_parallel_size: int | None = None
    enforce_eager: bool | None = None
    swap_space: float | None = None  # V0: GiB of pinned host memory per GPU for swapped-out KV blocks
    cpu_offload_gb: float | None = None


class RefusalKind(StrEnum):
    MAX_LEN_EXCEEDS_KV = "max_len_exceeds_kv"  # one max_model_len request does not fit the KV cache
    NO_CACHE_MEMORY = "no_cache_memory"  # nothing at all is left for the KV cache
    INSUFFICIENT_FREE_MEMORY = "insufficient_free_memory"  # V1: free memory at start < utilization x total
    SAMPLER_WARMUP = "sampler_warmup"  # V1: CUDA OOM warming up the sampler with max_num_seqs dummy requests
    CPU_KV_OVER_AVAILABLE = "cpu_kv_over_available"  # CPU backend: the KV cache asked for more than the node has
    PROFILE_FREE_DID_NOT_FALL = "profile_free_did_not_fall"  # the memory profile's check: free memory did not fall
    PROMPT_OVER_KV = "prompt_over_kv"  # V0 before 0.2.7: a prompt longer than the whole KV cache, ignored
    STATE_BLOCKS = "state_blocks"  # a hybrid (Mamba, linear attention) model: more sequences than state blocks
    EXTERNAL_WEIGHTS = "external_weights"  # 0.32+: weights another process holds exceed the whole budget


@dataclass(frozen=True, slots=True, kw_only=True)
class Refusal:
    kind: RefusalKind
    line: str  # the error as vLLM printed it, without the log prefix
    max_model_len: int | None = None
    capacity_tokens: int | None = None  # V0: tokens the KV cache holds
    needed_gib: float | None = None  # V1: KV cache one max_model_len request needs
    available_gib: float | None = None  # V1: KV cache memory there is
    printed_half_unit_gib: float = 0.0  # V1: half the last printed digit of those two (1.1 GiB: 0.05), the error
    estimated_max_len: int | None = None  # V1: what vLLM says would fit
    prompt_tokens: int | None = None  # V0's ignored prompt: the KV cache holds fewer tokens than this
    max_num_seqs: int | None = None  # state blocks: the sequences asked for, and the blocks there are
    state_blocks: int | None = None
    free_gib: float | None = None  # insufficient free memory: free and total at start (the profile check: at start)
    free_after_gib: float | None = None  # the profile check: free after loading and profiling
    total_gib: float | None = None
    utilization: float | None = None
    requested_gib: float | None = None
    external_weights_gib: float | None = None  # 0.32+: weights another process holds for vLLM, inside its budget
    budget_gib: float | None = None  # CPU backend: the budget the KV cache was asked within
    dummy_requests: int | None = None  # sampler warm-up: how many dummy requests (max_num_seqs) it ran
    state_reserve_gib: float | None = None  # a hybrid model's per-sequence state, for max_num_seqs, outside the KV
    budget_env: str | None = None  # the environment variable that sets the budget, where a plugin reads its own
    phase: OomPhase | None = None  # sampler warm-up: in the profile run (before the KV cache) or in the warm-up after


class OomPhase(StrEnum):
    """Where in vLLM's life an out-of-memory error hit, in the order a start goes through them.

    The order matters for the budget: weights and the profile run come before the KV cache is allocated, so
    `--gpu-memory-utilization` does not cap them (lowering it cannot help); from the KV cache's allocation on,
    vLLM has filled its budget and a transient needs room the budget leaves."""

    WEIGHT_LOADING = "weight_loading"  # creating or loading the model's weights: before any budget applies
    PROFILING = "profiling"  # the profile run sizing the KV cache (a dummy batch, the sampler, the encoder)
    # vLLM 0.20+ measures its CUDA graphs before sizing the KV cache: a minimal KV cache (a block per captured
    # token) and a few captures, inside the memory profile, before any budget applies
    GRAPH_PROFILING = "graph_profiling"
    KV_ALLOCATION = "kv_allocation"  # allocating the KV cache itself
    WARMUP = "warmup"  # after the KV cache: compiling, warming up kernels or the sampler
    GRAPH_CAPTURE = "graph_capture"  # CUDA graph capture after the KV cache was allocated
    SERVING = "serving"  # a forward pass while serving requests
    WAKE_UP = "wake_up"  # sleep mode: mapping the weights and the KV cache back (RL trainers share the card)
    AFTER_KV_CACHE = "after_kv_cache"  # CUDA graphs exist, so the KV cache is allocated: capturing or serving
    UNKNOWN = "unknown"

    @property
    def before_kv_cache(self) -> bool:
        return self in (OomPhase.WEIGHT_LOADING, OomPhase.PROFILING, OomPhase.GRAPH_PROFILING)

    @property
    def after_kv_cache(self) -> bool:
        return self in (
            OomPhase.KV_ALLOCATION,
            OomPhase.WARMUP,
            OomPhase.GRAPH_CAPTURE,
            OomPhase.SERVING,
            OomPhase.WAKE_UP,
            OomPhase.AFTER_KV_CACHE,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class CudaOom:
    """An out-of-memory error of the accelerator (CUDA, HIP, XPU...): PyTorch's message with its numbers, or a
    bare `CUDA error: out of memory` without any. Every number is None when the message does not state it."""

    phase: OomPhase
    phase_evidence: str = ""  # the frame or the progress line that placed it
    # A V1 worker answered an executor's RPC with it ("Worker failed with error '...'"): the worker loads its
    # weights as it starts, not by an RPC, so whatever the phase, it was after the weights had loaded.
    after_load: bool = False
    device: str = "CUDA"
    message: str = ""  # the error as printed, without the log's prefix
    rank: int | None = None  # the tensor-parallel rank whose line it was, when the prefix says
    tried_bytes: int | None
    gpu: int | None
    total_bytes: int | None
    free_bytes: int | None
    process_bytes: int | None  # "this process has X memory in use" (non-PyTorch memory included)
    allocated_bytes: int | None = None  # "Of the allocated memory A is allocated by PyTorch"
    private_pool_bytes: int | None = None  # "with P allocated in private pools (e.g., CUDA Graphs)": graphs exist
    allowed_bytes: int | None = None  # "X allowed;": a per-process memory fraction caps PyTorch's allocator
    reserved_unallocated_bytes: int | None
    other_processes: tuple[tuple[int, int], ...]  # (pid, bytes) of the other processes PyTorch lists

    @property
    def shortfall_bytes(self) -> int | None:
        """What the failed allocation lacked: tried - free (0 when it should have fitted)."""
        if self.tried_bytes is None or self.free_bytes is None:
            return None
        return max(0, self.tried_bytes - self.free_bytes)

    @property
    def held_bytes(self) -> int | None:
        """What the failed process held: its whole use where the message states it, else PyTorch's allocation."""
        return self.process_bytes if self.process_bytes is not None else self.allocated_bytes


class HostMemoryKind(StrEnum):
    MAP_REFUSED = "map_refused"  # the host refused to map a file (a weights file) into memory: ENOMEM
    KILLED = "killed"  # the process was killed: the kernel's OOM killer (a container's memory limit), or SIGKILL
    NODE_LOW = "node_low"  # Ray's memory monitor killed a task or actor: the node's memory passed its threshold


@dataclass(frozen=True, slots=True, kw_only=True)
class HostMemory:
    """The host's memory, not the accelerator's, gave out."""

    kind: HostMemoryKind
    line: str  # as printed, without the log's prefix
    bytes: int | None = None  # what a refused map asked for


@dataclass(frozen=True, slots=True, kw_only=True)
class MemoryProfile:
    """The budget arithmetic vLLM logged at start (V0 `Memory profiling` or V1 `Free memory on device`)."""

    total_gib: float | None
    utilization: float | None
    budget_gib: float | None
    weights_gib: float | None
    activation_gib: float | None
    non_torch_gib: float | None
    cudagraph_gib: float | None = None
    kv_gib: float | None = None
    free_gib: float | None = None
    source: str = "vLLM's memory-profiling line"  # what the evidence names as where these came from

    @classmethod
    def empty(cls, source: str = "vLLM's memory-profiling line") -> MemoryProfile:
        """Nothing known yet: a line that states one amount fills it in."""
        return cls(
            total_gib=None,
            utilization=None,
            budget_gib=None,
            weights_gib=None,
            activation_gib=None,
            non_torch_gib=None,
            source=source,
        )


FULL_CACHE = 0.98  # a stats line at this KV cache usage or more: the cache, not max_num_seqs, caps what runs


@dataclass(frozen=True, slots=True, kw_only=True)
class SchedulerStats:
    """One of vLLM's periodic stats lines: `Running: R reqs, [Swapped: S reqs, ]Pending|Waiting: W reqs, GPU KV
    cache usage: U%`."""

    running: int
    waiting: int
    swapped: int | None
    kv_usage: float  # 0..1


@dataclass(frozen=True, slots=True, kw_only=True)
class LogFacts:
    lines_read: int
    lines_recognised: int
    version: str | None = None
    device: str | None = None  # device_config of the engine: "cuda", "cpu", ...
    args: ServerArgs | None = None
    max_seq_len: int | None = None  # from the engine's config line or "Using max model len"
    tensor_parallel_size: int | None = None
    quantization: str | None = None
    kv_cache_dtype: str | None = None
    weights_gib: float | None = None
    available_kv_gib: float | None = None  # the least any rank printed: V1 sizes every rank's cache by it
    available_kv_max_gib: float | None = None  # the most any rank printed
    tpu_devices: int | None = None  # tpu-inference's per-device HBM lines: how many devices
    tpu_device_gib: float | None = None  # and each one's HBM
    xla_refusal: bool = False  # tpu-inference refused a budget below what its devices hold
    metal_refusal: bool = False  # vllm-metal refused a KV budget that is not positive
    kv_cache_tokens: int | None = None
    num_gpu_blocks: int | None = None
    concurrency: tuple[int, float] | None = None  # (tokens per request, max concurrency)
    profile: MemoryProfile | None = None
    graph_capture_gib: float | None = None
    graph_estimate_gib: float | None = (
        None  # 0.18+: "Estimated CUDA graph memory: X GiB total", taken from the KV share
    )
    graphs_profiled: bool = False  # `Profiling CUDA graph memory` (0.2x+): their memory is kept out of the KV budget
    graphs_charged_utilization: float | None = None  # the budget 0.21+'s graph-profiling line states
    refusal: Refusal | None = None
    oom: CudaOom | None = None
    host_memory: HostMemory | None = None
    cpu_kv_space: CpuKvSpace | None = None  # the CPU backend's KV space, where it was set explicitly
    cpu_blocks: int | None = None  # V0: KV blocks in pinned host memory (--swap-space), from `# CPU blocks: N`
    swap_exhausted: bool = False  # V0 aborted a swap preemption: "Aborted due to the lack of CPU swap space"
    swap_gib: float | None = None  # the node's whole --swap-space, from vLLM's "Possibly too large swap space"
    host_total_gib: float | None = None  # the host's memory, from the same warning
    preemptions: int | None = None  # V0's cumulative count from its warnings; V1 (0.11.2+) the stats lines' sum
    v1_preemptions: int | None = None  # the part of it from V1's stats lines (`Preemptions: N`)
    preemption_mode: str | None = None  # RECOMPUTE or SWAP, from the same warning
    preemption_warnings: int = 0  # V0's warnings, printed at the 1st, 51st, 101st... preemption
    preemptions_noticed_by: str | None = None  # a KV connector that logged them where vLLM did not (LMCache)
    busiest: SchedulerStats | None = None  # the stats line with the highest KV cache usage
    full_most_running: int | None = None  # the most requests running on a stats line with the KV cache full
    # a full-cache stats line (or the next) with requests waiting, of these the one with the fewest requests per
    # share of the cache (running / usage)
    full_least: SchedulerStats | None = None
    engine_dead: bool = False  # the engine (or a worker) died: EngineDeadError, "Engine core proc ... died", ...
    capture_sizes: tuple[int, ...] | None = None  # CUDA-graph batch sizes from the engine's config line, ascending
    traceback: bool = False  # a Python traceback follows the start: something raised
    cut_in: OomPhase | None = None  # the log ends inside a traceback, before its error line: the phase it was in
    kv_check_failed: bool = False  # the traceback runs through vLLM's check that the KV cache holds max_model_len
    engine: str | None = None  # "v0" or "v1", from the engine's process names and source paths
    gpu_name: str | None = None  # the card's name where the log prints it (collect_env, a launcher's banner)
    model: str | None = None  # the model vLLM serves, as its arguments or its engine config line name it
    dtype: str | None = None  # the engine config's dtype (torch.bfloat16, float16, ...)
    pipeline_parallel_size: int | None = None
    ranks_seen: int | None = None  # the highest rank a prefix names + 1: at least this many GPUs serve the model
    parallel_workers: bool = False  # prefixes name a multi-GPU executor's workers: the model spans several GPUs
    max_capture_size: int | None = None  # the largest of them as the config line states it
    # The log ends while a later start was still starting; these are the facts of the start before it, which failed.
    later_start_unfinished: bool = False
    # The weights a start before this one measured for the same model (its load finished): a process that runs
    # several engines (a notebook's second LLM()) keeps the earlier ones on the card.
    earlier_weights_gib: float | None = None
