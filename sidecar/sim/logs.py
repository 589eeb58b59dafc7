"""The log lines a real vLLM prints at start, on refusing to start and on a CUDA OOM, per version. Pure text.

Timestamps are formatted from a wall time the caller passes (UTC); nothing here reads a clock.
"""

from __future__ import annotations

from datetime import UTC, datetime

from sidecar.sim.config import GIB, KIB, MIB, SimConfig, VllmVersion
from sidecar.sim.memory import OutOfMemory

_PACKAGE = "/usr/local/lib/python3.12/dist-packages/vllm"

# Source locations printed in each version's lines ([file:line]), as seen in that release's logs.
_WHERE: dict[VllmVersion, dict[str, str]] = {
    VllmVersion.V0_6: {
        "args": "api_server.py:585",
        "engine_config": "llm_engine.py:237",
        "weights": "model_runner.py:1099",
        "blocks": "gpu_executor.py:122",
        "concurrency": "gpu_executor.py:126",
        "engine_error": "engine.py:135",
        "launcher": "launcher.py:99",
    },
    VllmVersion.V0_10: {
        "args": "utils.py:326",
        "engine_config": "core.py:74",
        "weights": "gpu_model_runner.py:1892",
        "available": "gpu_worker.py:276",
        "kv_size": "kv_cache_utils.py:829",
        "concurrency": "kv_cache_utils.py:833",
        "info": "loggers.py:142",
        "failed_start": "core.py:700",
        "fatal": "core.py:702",
        "output_handler": "async_llm.py:416",
    },
    VllmVersion.V0_32: {
        "args": "api_utils.py:286",
        "engine_config": "core.py:133",
        "weights": "gpu_model_runner.py:4213",
        "available": "gpu_worker.py:424",
        "kv_size": "kv_cache_utils.py:1291",
        "info": "loggers.py:258",
        "failed_start": "core.py:1338",
        "fatal": "core.py:1346",
        "output_handler": "async_llm.py:704",
    },
}


def format_size(size: int) -> str:
    """PyTorch's c10 format_size: bytes, KiB, MiB or GiB with two decimals."""
    if size <= KIB:
        return f"{size} bytes"
    if size <= MIB:
        return f"{size / KIB:.2f} KiB"
    if size <= GIB:
        return f"{size / MIB:.2f} MiB"
    return f"{size / GIB:.2f} GiB"


def stamp(wall_s: float) -> str:
    return datetime.fromtimestamp(wall_s, tz=UTC).strftime("%m-%d %H:%M:%S")


class _Printer:
    """Formats lines as one vLLM version prints them at one wall time."""

    def __init__(self, config: SimConfig, wall_s: float) -> None:
        self._config = config
        self._stamp = stamp(wall_s)
        self._places = _WHERE[config.vllm_version]
        self._v0 = config.vllm_version == VllmVersion.V0_6

    def engine(self, engine: int, level: str, where: str, message: str) -> str:
        """A line of the engine process: V0 prints a bare `file:line]`, V1 names the process and brackets the place."""
        place = self._places[where]
        if self._v0:
            return f"{level} {self._stamp} {place}] {message}"
        config = self._config
        process = f"EngineCore_{engine}" if config.vllm_version == VllmVersion.V0_10 else f"EngineCore_DP{engine}"
        return f"({process} pid={config.engine_pid + engine}) {level} {self._stamp} [{place}] {message}"

    def api(self, level: str, where: str, message: str) -> str:
        place = self._places[where]
        if self._v0:
            return f"{level} {self._stamp} {place}] {message}"
        return f"(APIServer pid={self._config.api_server_pid}) {level} {self._stamp} [{place}] {message}"


RELEASES = {VllmVersion.V0_6: "0.6.6", VllmVersion.V0_10: "0.10.2", VllmVersion.V0_32: "0.32.0"}


def preamble_lines(config: SimConfig, wall_s: float) -> tuple[str, ...]:
    """What vLLM prints before it sizes its KV cache: its arguments, the engine's configuration, the weights.

    The simulated operator passes every sizing flag explicitly, so all of them are in V1's `non-default args`.
    """
    out = _Printer(config, wall_s)
    release = RELEASES[config.vllm_version]
    settings: list[tuple[str, object]] = [
        ("model", config.model_name),
        ("max_model_len", config.max_model_len),
        ("max_num_seqs", config.max_num_seqs),
        ("max_num_batched_tokens", config.max_num_batched_tokens),
        ("gpu_memory_utilization", config.gpu_memory_utilization),
        ("block_size", config.block_size),
        ("enable_prefix_caching", config.enable_prefix_caching),
    ]
    if config.data_parallel > 1:
        settings.append(("data_parallel_size", config.data_parallel))
    if config.num_gpu_blocks is not None:
        settings.append(("num_gpu_blocks_override", config.num_gpu_blocks))
    engine_config = (
        f"model={config.model_name!r}, speculative_config=None, tokenizer={config.model_name!r}, dtype=torch.bfloat16, "
        f"max_seq_len={config.max_model_len}, tensor_parallel_size=1, data_parallel_size={config.data_parallel}, "
        "quantization=None, enforce_eager=False, kv_cache_dtype=auto, device_config=cuda, "
        f"served_model_name={config.model_name}, enable_prefix_caching={config.enable_prefix_caching}"
    )
    weights_gib = config.weights_bytes / GIB
    if config.vllm_version == VllmVersion.V0_6:
        namespace = ", ".join(f"{key}={value!r}" for key, value in settings)
        return (
            out.api("INFO", "args", f"args: Namespace({namespace})"),
            out.engine(
                0, "INFO", "engine_config", f"Initializing an LLM engine (v{release}) with config: {engine_config}"
            ),
            # vLLM <= 0.7 divides by 2**30 but prints "GB".
            out.engine(0, "INFO", "weights", f"Loading model weights took {weights_gib:.4f} GB"),
        )
    non_default = "{" + ", ".join(f"{key!r}: {value!r}" for key, value in settings) + "}"
    lines = [out.api("INFO", "args", f"non-default args: {non_default}")]
    for engine in range(config.data_parallel):
        lines.append(
            out.engine(
                engine,
                "INFO",
                "engine_config",
                f"Initializing a V1 LLM engine (v{release}) with config: {engine_config}",
            )
        )
        lines.append(
            out.engine(engine, "INFO", "weights", f"Model loading took {weights_gib:.4f} GiB and 4.521337 seconds")
        )
    return tuple(lines)


def max_concurrency(config: SimConfig, num_gpu_blocks: int) -> float:
    """How many max_model_len requests the pool holds at once."""
    if config.vllm_version == VllmVersion.V0_6:
        return num_gpu_blocks * config.block_size / config.max_model_len
    blocks_per_request = -(-config.max_model_len // config.block_size)
    return num_gpu_blocks / blocks_per_request


def kv_capacity_lines(
    config: SimConfig, engine: int, num_gpu_blocks: int, total_blocks: int, wall_s: float
) -> list[str]:
    """The KV capacity lines of one engine (`total_blocks` sums the data-parallel engines, as the frontend does)."""
    out = _Printer(config, wall_s)
    concurrency = max_concurrency(config, num_gpu_blocks)
    if config.vllm_version == VllmVersion.V0_6:
        blocks = f"# GPU blocks: {num_gpu_blocks}, # CPU blocks: {config.num_cpu_blocks}"
        per_request = f"Maximum concurrency for {config.max_model_len} tokens per request: {concurrency:.2f}x"
        return [out.engine(engine, "INFO", "blocks", blocks), out.engine(engine, "INFO", "concurrency", per_request)]
    available = out.engine(engine, "INFO", "available", _available(config))
    initialized = f"vllm cache_config_info with initialization after num_gpu_blocks is: {total_blocks}"
    info = out.api("INFO", "info", f"Engine {engine:03d}: {initialized}")
    per_request = f"Maximum concurrency for {config.max_model_len:,} tokens per request: {concurrency:.2f}x"
    if config.vllm_version == VllmVersion.V0_10:
        size = f"GPU KV cache size: {num_gpu_blocks * config.block_size:,} tokens"
        return [
            available,
            out.engine(engine, "INFO", "kv_size", size),
            out.engine(engine, "INFO", "concurrency", per_request),
            info,
        ]
    # 0.24+ derives the token count from the concurrency, and 0.30+ prints both on one line.
    size = f"GPU KV cache size: {int(concurrency * config.max_model_len):,} tokens"
    return [available, out.engine(engine, "INFO", "kv_size", f"{size}, {per_request}"), info]


def _available(config: SimConfig) -> str:
    return f"Available KV cache memory: {config.available_kv_bytes / GIB:.2f} GiB"


def refusal_message(config: SimConfig, num_gpu_blocks: int) -> str | None:
    """vLLM's ValueError when the KV cache cannot hold one max_model_len request (None when it can)."""
    version = config.vllm_version
    available = config.available_kv_bytes
    if available <= 0 or num_gpu_blocks <= 0:
        return (
            "ValueError: No available memory for the cache blocks. "
            "Try increasing `gpu_memory_utilization` when initializing the engine."
        )
    if version == VllmVersion.V0_6:
        capacity_tokens = num_gpu_blocks * config.block_size
        if config.max_model_len <= capacity_tokens:
            return None
        return (
            f"ValueError: The model's max seq len ({config.max_model_len}) is larger than the maximum number of "
            f"tokens that can be stored in KV cache ({capacity_tokens}). Try increasing `gpu_memory_utilization` "
            "or decreasing `max_model_len` when initializing the engine."
        )
    needed = -(-config.max_model_len // config.block_size) * config.block_bytes
    if needed <= available:
        return None
    estimated = min(config.max_model_len, available // config.block_bytes * config.block_size)
    estimate = (
        f"Based on the available memory, the estimated maximum model length is {estimated}. " if estimated else ""
    )
    model = "models's" if version == VllmVersion.V0_10 else "model's"  # 0.10's typo, fixed later
    return (
        f"ValueError: To serve at least one request with the {model} max seq len ({config.max_model_len}), "
        f"({needed / GIB:.2f} GiB KV cache is needed, which is larger than the available KV cache memory "
        f"({available / GIB:.2f} GiB). {estimate}Try increasing `gpu_memory_utilization` or decreasing "
        "`max_model_len` when initializing the engine."
    )


def refusal_lines(config: SimConfig, message: str, num_gpu_blocks: int, wall_s: float) -> tuple[str, ...]:
    """What a refused start prints, ending with the API server's own failure."""
    if config.vllm_version == VllmVersion.V0_6:
        # V0 logs the capacity, then the engine process dies with a bare traceback.
        head = kv_capacity_lines(config, 0, num_gpu_blocks, num_gpu_blocks, wall_s) if num_gpu_blocks > 0 else []
        return (
            *head,
            "Process SpawnProcess-1:",
            "Traceback (most recent call last):",
            f'  File "{_PACKAGE}/worker/worker.py", line 493, in raise_if_cache_size_invalid',
            "    raise ValueError(",
            message,
        )
    out = _Printer(config, wall_s)
    return (
        out.engine(0, "INFO", "available", _available(config)),
        out.engine(0, "ERROR", "failed_start", "EngineCore failed to start."),
        out.engine(0, "ERROR", "failed_start", "Traceback (most recent call last):"),
        out.engine(0, "ERROR", "failed_start", message),
        f"(APIServer pid={config.api_server_pid}) RuntimeError: Engine core initialization failed. "
        "See root cause above. Failed core proc(s): {}",
    )


def oom_text(oom: OutOfMemory) -> str:
    """PyTorch's CUDA OOM message, with the numbers of the failed allocation (other processes listed first)."""
    others = "".join(f"Process {p.pid} has {format_size(p.used_bytes)} memory in use. " for p in oom.other_processes)
    return (
        f"CUDA out of memory. Tried to allocate {format_size(oom.tried_bytes)}. GPU {oom.gpu} has a total capacity of "
        f"{format_size(oom.total_bytes)} of which {format_size(oom.free_bytes)} is free. {others}Including non-PyTorch "
        f"memory, this process has {format_size(oom.process_bytes)} memory in use. Of the allocated memory "
        f"{format_size(oom.allocated_bytes)} is allocated by PyTorch, and "
        f"{format_size(oom.reserved_unallocated_bytes)} is reserved by PyTorch but unallocated. "
        "If reserved but unallocated memory is large try setting "
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for Memory "
        "Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)"
    )


def death_lines(config: SimConfig, engine: int, oom: OutOfMemory, wall_s: float) -> tuple[str, ...]:
    """The engine's fatal error and the API server's reaction, in the order vLLM prints them."""
    out = _Printer(config, wall_s)
    text = oom_text(oom)
    if config.vllm_version == VllmVersion.V0_6:
        core = [
            f"OutOfMemoryError('{text}')",
            "Traceback (most recent call last):",
            f'  File "{_PACKAGE}/engine/multiprocessing/engine.py", line 133, in start',
            "    self.run_engine_loop()",
            f"torch.OutOfMemoryError: {text}",
        ]
        dead = out.api("CRITICAL", "launcher", "MQLLMEngine is already dead, terminating server process")
        return (*(out.engine(engine, "ERROR", "engine_error", line) for line in core), dead)
    core = [
        "EngineCore encountered a fatal error.",
        "Traceback (most recent call last):",
        f'  File "{_PACKAGE}/v1/engine/core.py", line 1337, in run_engine_core',
        "    engine_core.run_busy_loop()",
        f"torch.OutOfMemoryError: {text}",
    ]
    api = [
        "AsyncLLM output_handler failed.",
        "Traceback (most recent call last):",
        f'  File "{_PACKAGE}/v1/engine/async_llm.py", line 650, in output_handler',
        "    outputs = await engine_core.get_output_async()",
        "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. "
        "See stack trace (above) for the root cause.",
    ]
    return (
        *(out.engine(engine, "ERROR", "fatal", line) for line in core),
        *(out.api("ERROR", "output_handler", line) for line in api),
    )
