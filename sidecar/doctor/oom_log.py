"""PyTorch's CUDA out-of-memory message in a vLLM log, and the phase it happened in. Pure.

The phase comes from the traceback that ends in the error (the frames name vLLM's functions), or, without
one, from the INFO lines just before it: a graph capture, the profile run that sizes the KV cache, or serving.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from sidecar.doctor.logfacts import CudaOom, OomPhase

_UNITS = {"bytes": 1, "B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40, "KB": 10**3, "MB": 10**6}
_UNITS |= {"GB": 10**9}
_SIZE = r"([\d.]+ (?:bytes|B|KiB|MiB|GiB|TiB|KB|MB|GB))"
_MODERN = re.compile(
    r"CUDA out of memory\. Tried to allocate " + _SIZE + r"\. GPU (\d+)? ?has a total capac(?:i)?ty of " + _SIZE
    + r" of which " + _SIZE + r" is free\."
)  # fmt: skip
_THIS_PROCESS = re.compile(r"this process has " + _SIZE + r" memory in use")
_UNALLOCATED = re.compile(_SIZE + r" is reserved by PyTorch but unallocated")
_ALLOCATED = re.compile(r"Of the allocated memory " + _SIZE + r" is allocated by PyTorch")
# torch < 2.1: "Tried to allocate 20.00 MiB (GPU 0; 15.78 GiB total capacity; 14.56 GiB already allocated; 3.12 MiB
# free; 14.66 GiB reserved in total by PyTorch)"
_LEGACY = re.compile(
    r"CUDA out of memory\. Tried to allocate " + _SIZE + r" \(GPU (\d+); " + _SIZE + r" total capacity; "
    + _SIZE + r" already allocated; " + _SIZE + r" free; " + _SIZE + r" reserved in total by PyTorch\)"
)  # fmt: skip
_OTHER_PROCESS = re.compile(r"Process (\d+) has " + _SIZE + r" memory in use")
_TRACEBACK = "Traceback (most recent call last)"
_LOOKBACK_LINES = 40

# Checked in this order: a capture runs inside KV-cache initialisation, so its frames also name the profiler's.
_FRAME_MARKERS: tuple[tuple[OomPhase, tuple[str, ...]], ...] = (
    (OomPhase.GRAPH_CAPTURE, ("capture_model", "_capture_cudagraphs", "graph_capture", "capture_graph")),
    (OomPhase.WEIGHT_LOADING, ("load_model", "create_weights", "load_weights", "_initialize_model", "get_model(")),
    (OomPhase.PROFILING, ("profile_run", "determine_available_memory", "determine_num_available_blocks")),
    (OomPhase.SERVING, ("run_busy_loop", "run_engine_loop", "execute_model", "step_with_batch_queue", "engine_step")),
)
_INFO_MARKERS: tuple[tuple[OomPhase, tuple[str, ...]], ...] = (
    (OomPhase.GRAPH_CAPTURE, ("Capturing cudagraphs", "Capturing CUDA graph", "Capturing CUDA graphs")),
    (OomPhase.WEIGHT_LOADING, ("Starting to load model", "Loading safetensors checkpoint shards: ")),
    (OomPhase.PROFILING, ("Memory profiling", "profile run", "Starting profile run", "Model loading took")),
    (OomPhase.SERVING, ("Avg prompt throughput", "Application startup complete", "KV cache usage")),
)


def size_bytes(text: str) -> int:
    """`1.95 GiB` as PyTorch prints sizes (binary units; GB/MB taken as decimal) to bytes."""
    number, unit = text.split()
    return int(float(number) * _UNITS[unit])


def find_oom(lines: Sequence[str]) -> CudaOom | None:
    """The last CUDA OOM in `lines` (vLLM repeats it in the API server's traceback; the last is the fatal one)."""
    for index in range(len(lines) - 1, -1, -1):
        line = lines[index]
        if "CUDA out of memory" not in line:
            continue
        try:
            parsed = _parse(line)
        except ValueError:  # a size PyTorch never prints ("1.2.3 GiB"): not its message
            parsed = None
        if parsed is not None:
            phase = _phase(lines, index)
            return CudaOom(phase=phase, **parsed)  # type: ignore[arg-type]
    return None


def _parse(line: str) -> dict[str, object] | None:
    modern = _MODERN.search(line)
    if modern is not None:
        rest = line[modern.end() :]
        process = _THIS_PROCESS.search(rest)
        unallocated = _UNALLOCATED.search(rest)
        allocated_match = _ALLOCATED.search(rest)
        allocated = size_bytes(allocated_match.group(1)) if allocated_match else None
        processes = [(int(pid), size_bytes(size)) for pid, size in _OTHER_PROCESS.findall(rest)]
        process_bytes = size_bytes(process.group(1)) if process else None
        if process_bytes is None and allocated is not None:
            # In a container PyTorch cannot tell its own PID apart and lists itself as "Process N": the one
            # process that holds at least what PyTorch allocated is vLLM's own.
            own = [entry for entry in processes if entry[1] >= allocated]
            if len(own) == 1:
                process_bytes = own[0][1]
                processes.remove(own[0])
        return {
            "tried_bytes": size_bytes(modern.group(1)),
            "gpu": int(modern.group(2)) if modern.group(2) else None,
            "total_bytes": size_bytes(modern.group(3)),
            "free_bytes": size_bytes(modern.group(4)),
            "process_bytes": process_bytes,
            "allocated_bytes": allocated,
            "reserved_unallocated_bytes": size_bytes(unallocated.group(1)) if unallocated else None,
            "other_processes": tuple(processes),
        }
    legacy = _LEGACY.search(line)
    if legacy is not None:
        reserved = size_bytes(legacy.group(6))
        return {
            "tried_bytes": size_bytes(legacy.group(1)),
            "gpu": int(legacy.group(2)),
            "total_bytes": size_bytes(legacy.group(3)),
            "free_bytes": size_bytes(legacy.group(5)),
            "process_bytes": reserved,
            "reserved_unallocated_bytes": max(0, reserved - size_bytes(legacy.group(4))),
            "other_processes": (),
        }
    return None


def _phase(lines: Sequence[str], oom_index: int) -> OomPhase:
    if "Failed to create" in lines[oom_index] and "weights" in lines[oom_index]:
        return OomPhase.WEIGHT_LOADING  # vLLM's linear layers say so on the error line itself
    start = max(0, oom_index - _LOOKBACK_LINES)
    window = lines[start : oom_index + 1]
    traceback_at = max((i for i, line in enumerate(window) if _TRACEBACK in line), default=None)
    if traceback_at is not None:
        frames = "\n".join(window[traceback_at:])
        for phase, markers in _FRAME_MARKERS:
            if any(marker in frames for marker in markers):
                return phase
    before = "\n".join(window)
    found = [(before.rfind(marker), phase) for phase, markers in _INFO_MARKERS for marker in markers]
    latest = max(found)
    return latest[1] if latest[0] >= 0 else OomPhase.UNKNOWN
