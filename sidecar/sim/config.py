"""The simulated server's settings and the preset of each scenario. Pure data, no I/O.

Sizes default to an 8B-class model (Llama-3-8B: 32 layers x 8 KV heads x 128 dims x 2 (K, V) x 2 bytes = 128 KiB
per token, 16 GiB of bf16 weights) on an 80 GiB H100, served with vLLM's defaults.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum

KIB = 1024
MIB = 1024 * KIB
GIB = 1024 * MIB


class VllmVersion(StrEnum):
    """The release lines whose metrics, log lines and KV usage formula the simulator reproduces."""

    V0_6 = "0.6"  # V0 engine: no null block, `# GPU blocks` log line, swap space (CPU blocks)
    V0_10 = "0.10"  # V1 engine, 0.10.2: the null block excluded from the usage denominator (since 0.10.2)
    V0_32 = "0.32"  # V1 engine: the null block excluded from the usage denominator


class Scenario(StrEnum):
    HEALTHY = "healthy"
    BURST = "burst"
    LEAK = "leak"
    TENANT = "tenant"
    PREFIX_THRASH = "prefix-thrash"
    HANG = "hang"
    HANG_QUEUE = "hang-queue"
    HANG_IDLE = "hang-idle"
    STARTUP = "startup"


SCENARIOS: tuple[str, ...] = tuple(scenario.value for scenario in Scenario)


@dataclass(frozen=True, slots=True, kw_only=True)
class SimConfig:
    vllm_version: VllmVersion = VllmVersion.V0_32
    scenario: Scenario = Scenario.HEALTHY
    seed: int = 0  # jitter of utilisation and temperature; the load driver takes its own
    model_name: str = "sim-llama"
    max_model_len: int = 4096
    block_size: int = 16
    num_gpu_blocks: int | None = None  # None: derived from memory the way vLLM's profiler does
    kv_bytes_per_token: int = 128 * KIB
    swap_space_bytes: int = 4 * GIB  # V0 only: becomes the CPU blocks of cache_config_info
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 8192
    enable_prefix_caching: bool = True
    data_parallel: int = 1  # engines, one per simulated GPU
    decode_step_s: float = 0.02
    prefill_s_per_token: float = 2e-5
    gpu_name: str = "NVIDIA H100 80GB HBM3"
    gpu_total_bytes: int = 80 * GIB
    gpu_memory_utilization: float = 0.9
    weights_bytes: int = 16 * GIB
    cuda_context_bytes: int = 500 * MIB
    # Activation memory of one step. The profile run (one dummy batch of max_num_batched_tokens short sequences)
    # reserves base + (per_batched_token + per_context_token) x max_num_batched_tokens; context beyond that
    # (many long sequences attended at once) is what the profiler never saw.
    activation_base_bytes: int = 256 * MIB
    activation_bytes_per_batched_token: int = 128 * KIB
    activation_bytes_per_context_token: int = 0
    leak_bytes_per_request: int = 0  # allocator growth per finished request (vllm#8413, #12610)
    leak_bytes_per_s: float = 0.0
    tenant_name: str = "python train.py"
    tenant_pid: int = 31337
    tenant_start_s: float | None = None  # None: no other process; else seconds after the simulation's first call
    tenant_bytes_per_s: float = float(GIB)
    tenant_max_bytes: int = 6 * GIB
    hang_after_s: float | None = None  # seconds after the first request; None: never hangs
    # vLLM's own admission control (0.29+ flag; counted in vllm:admission_rejections_total from 0.32): in-flight
    # requests (waiting + running, a request with n > 1 counts n) above which a new one is answered 503.
    max_num_queued_reqs: int | None = None
    # --enable-fault-tolerance (0.29+): /metrics shows vllm:engine_healthy (vLLM main after 0.33.0; the simulator
    # shows it on its newest profile); an engine that dies waits engine_recovery_timeout_s for recovery, unhealthy,
    # answering 503 and /health 200, before the server stops as it does without fault tolerance.
    enable_fault_tolerance: bool = False
    engine_recovery_timeout_s: float = 120.0  # vLLM's FaultToleranceConfig.engine_recovery_timeout_sec default
    # The scheduler stops admitting this many seconds after the simulation's first call (vllm#53130): running
    # requests finish, every other request waits with 0 running; /health 200, gauges live, counters frozen.
    hang_queue_after_s: float | None = None
    # The engine stops at the first idle moment this many seconds or more after the simulation's first call, as
    # an EngineCore SIGSTOPped while idle: /metrics frozen at 0 running and 0 waiting, /health 200, requests
    # accepted and never answered.
    hang_idle_after_s: float | None = None
    engine_pid: int = 4242  # engine i has pid engine_pid + i
    api_server_pid: int = 4100
    wall_offset_s: float = 1_763_784_000.0  # added to now_s to stamp log lines (the shell passes its own)

    def __post_init__(self) -> None:
        if self.vllm_version not in set(VllmVersion):
            raise ValueError(f"vllm_version must be one of {', '.join(VllmVersion)}, got {self.vllm_version!r}")
        if self.scenario not in set(Scenario):
            raise ValueError(f"scenario must be one of {', '.join(SCENARIOS)}, got {self.scenario!r}")
        if not self.model_name:
            raise ValueError("model_name must not be empty")
        self._check_ranges()
        if self.vllm_version != VllmVersion.V0_32 and self.max_num_queued_reqs is not None:
            raise ValueError(f"vLLM {self.vllm_version} has no --max-num-queued-reqs (0.29+): use --vllm-version 0.32")
        if self.vllm_version != VllmVersion.V0_32 and self.enable_fault_tolerance:
            raise ValueError(
                f"vLLM {self.vllm_version} has no --enable-fault-tolerance (0.29+): use --vllm-version 0.32"
            )
        if self.vllm_version == VllmVersion.V0_6 and self.data_parallel > 1:
            raise ValueError("vLLM 0.6 (V0 engine) has no data parallelism: data_parallel must be 1")
        if self.num_gpu_blocks is not None and self.num_gpu_blocks < 2:
            raise ValueError(f"num_gpu_blocks must be at least 2 (V1 keeps one null block), got {self.num_gpu_blocks}")
        if self.max_num_batched_tokens < self.max_num_seqs:
            # vLLM's own check: every running sequence must be able to decode in one step.
            raise ValueError(
                f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be greater than or equal to "
                f"max_num_seqs ({self.max_num_seqs})"
            )

    def _check_ranges(self) -> None:
        positive: dict[str, float] = {
            "max_model_len": self.max_model_len,
            "block_size": self.block_size,
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "max_num_seqs": self.max_num_seqs,
            "max_num_batched_tokens": self.max_num_batched_tokens,
            "data_parallel": self.data_parallel,
            "gpu_total_bytes": self.gpu_total_bytes,
            "decode_step_s": self.decode_step_s,
        }
        for name, value in positive.items():
            if value <= 0:
                raise ValueError(f"{name} must be positive, got {value}")
        non_negative: dict[str, float | None] = {
            "weights_bytes": self.weights_bytes,
            "cuda_context_bytes": self.cuda_context_bytes,
            "activation_base_bytes": self.activation_base_bytes,
            "activation_bytes_per_batched_token": self.activation_bytes_per_batched_token,
            "activation_bytes_per_context_token": self.activation_bytes_per_context_token,
            "leak_bytes_per_request": self.leak_bytes_per_request,
            "leak_bytes_per_s": self.leak_bytes_per_s,
            "tenant_bytes_per_s": self.tenant_bytes_per_s,
            "tenant_max_bytes": self.tenant_max_bytes,
            "swap_space_bytes": self.swap_space_bytes,
            "prefill_s_per_token": self.prefill_s_per_token,
            "tenant_start_s": self.tenant_start_s,
            "hang_after_s": self.hang_after_s,
            "max_num_queued_reqs": self.max_num_queued_reqs,
            "engine_recovery_timeout_s": self.engine_recovery_timeout_s,
            "hang_queue_after_s": self.hang_queue_after_s,
            "hang_idle_after_s": self.hang_idle_after_s,
        }
        for name, optional in non_negative.items():
            if optional is not None and optional < 0:
                raise ValueError(f"{name} must not be negative, got {optional}")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")

    @property
    def block_bytes(self) -> int:
        return self.kv_bytes_per_token * self.block_size

    @property
    def budget_bytes(self) -> int:
        """What vLLM may use of the GPU: total x gpu_memory_utilization."""
        return int(self.gpu_total_bytes * self.gpu_memory_utilization)

    @property
    def profiled_activation_bytes(self) -> int:
        """The activation peak vLLM's profile run measures, and so reserves outside the KV cache."""
        per_token = self.activation_bytes_per_batched_token + self.activation_bytes_per_context_token
        return self.activation_base_bytes + per_token * self.max_num_batched_tokens

    @property
    def available_kv_bytes(self) -> int:
        """KV cache memory: budget - weights - non-torch memory - profiled activation peak (may be negative)."""
        if self.num_gpu_blocks is not None:
            return self.num_gpu_blocks * self.block_bytes
        return self.budget_bytes - self.weights_bytes - self.cuda_context_bytes - self.profiled_activation_bytes

    @property
    def derived_num_gpu_blocks(self) -> int:
        """Blocks per engine (0 when nothing is left for the cache: vLLM refuses to start)."""
        if self.num_gpu_blocks is not None:
            return self.num_gpu_blocks
        return max(0, self.available_kv_bytes // self.block_bytes)

    @property
    def num_cpu_blocks(self) -> int | None:
        """V0 swap blocks; V1 has no swapping and reports None."""
        if self.vllm_version == VllmVersion.V0_6:
            return self.swap_space_bytes // self.block_bytes
        return None


# Each preset reproduces one documented failure within about a minute of simulated time under the load that
# `scenarios.scenario_load` describes. The comments give the arithmetic with the defaults above.
_PRESETS: dict[Scenario, dict[str, object]] = {
    Scenario.HEALTHY: {},
    # Long contexts attended at once need workspace the profile run never measured (vllm#13100, #52871): about
    # 72 KiB per running context token beyond the profiled 8,192. 8 GiB lie above the 72 GiB budget, so free
    # memory drops below 5 % (4 GiB) past ~66k context tokens (~30 running 2k-token requests) and runs out past
    # ~125k (~58 running).
    Scenario.BURST: {"activation_bytes_per_context_token": 72 * KIB},
    # Allocator growth per finished request plus a slow drift (vllm#8413, #15785): ~180 MiB/s at ~12 requests/s,
    # so the 8 GiB above the budget are gone after ~45-60 s.
    Scenario.LEAK: {"leak_bytes_per_request": 12 * MIB, "leak_bytes_per_s": 32.0 * MIB},
    # A training job starts on the same GPU after 5 s and grows by 1 GiB/s to 6 GiB: used exceeds vLLM's budget.
    Scenario.TENANT: {"tenant_start_s": 5.0},
    # A GPU shared at 0.3 utilisation: 24 - 16.5 - 1.25 GiB leave 3,200 blocks (51,200 tokens), less than the
    # working set of distinct shared prefixes, so LRU evicts each prefix before it is reused.
    Scenario.PREFIX_THRASH: {"gpu_memory_utilization": 0.3},
    # The engine stops making progress 10 s after the first request (vllm#15996, #39863).
    Scenario.HANG: {"hang_after_s": 10.0},
    # The scheduler stops admitting 20 s after the start (vllm#53130; the wedge of vllm#46811 read 0 running with
    # /health 200 for hours): the requests running then finish, later ones wait with 0 running, counters freeze.
    Scenario.HANG_QUEUE: {"hang_queue_after_s": 20.0},
    # The engine stops at its first idle moment from 20 s after the start (an idle EngineCore SIGSTOPped, measured
    # on vLLM 0.32): /metrics freeze at 0 running and 0 waiting while every later request hangs.
    Scenario.HANG_IDLE: {"hang_idle_after_s": 20.0},
    # 128k context on the same 0.3 budget: one max-length request needs 16 GiB of KV cache, 6.25 GiB exist.
    Scenario.STARTUP: {"gpu_memory_utilization": 0.3, "max_model_len": 131072},
}


def scenario_config(name: str, **overrides: object) -> SimConfig:
    """The preset of scenario `name`, with `overrides` (SimConfig field names) applied on top."""
    try:
        scenario = Scenario(name)
    except ValueError:
        raise ValueError(f"unknown scenario {name!r}; choose one of {', '.join(SCENARIOS)}") from None
    fields: dict[str, object] = {**_PRESETS[scenario], **overrides, "scenario": scenario}
    if "vllm_version" in fields:
        fields["vllm_version"] = VllmVersion(str(fields["vllm_version"]))
    unknown = sorted(set(fields) - set(SimConfig.__dataclass_fields__))
    if unknown:
        raise ValueError(f"unknown SimConfig field(s): {', '.join(unknown)}")
    return replace(SimConfig(), **fields)  # type: ignore[arg-type]
