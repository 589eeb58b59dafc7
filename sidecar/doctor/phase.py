"""Where an out-of-memory error hit, from the stack frames above it, else from vLLM's progress lines. Pure.

The frames are read, not the message's wording: a message vLLM or PyTorch words differently in a new release
is still placed when it is raised inside `capture_model` or `profile_run`. The functions named are vLLM's own
across V0 (`worker.py`, `model_runner.py`, `cache_engine.py`) and V1 (`gpu_worker.py`, `gpu_model_runner.py`,
`core.py`), read in the sources of 0.5.4, 0.8.5, 0.11.0 and 0.32.0. A traceback's outer frames name the
engine's start or its busy loop; the innermost frame of vLLM's that names a phase is the most specific, so
the phases are checked from the most specific (a capture runs inside the warm-up, which runs inside the
engine's start) to the least (any forward pass is "serving" unless a start-up frame encloses it).

Without a traceback, the last progress line before the error says which step vLLM had reached: the weights
loaded (`Model loading took`) means the profile run came next, the KV cache sized (`# GPU blocks`, `GPU KV
cache size`) means the warm-up and the graphs came next.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from sidecar.doctor.log_records import Record
from sidecar.doctor.logfacts import OomPhase

_FRAME = re.compile(r'File "([^"]*)", line \d+, in ([\w<>.]+)')
# V0's multiprocessing worker: "Exception in worker VllmWorkerProcess while processing method load_model: ...".
_WORKER_METHOD = re.compile(r"while processing method (\w+)")
# Lines a start prints once it serves (or has finished starting).
SERVING_SIGNS = (
    r"Application startup complete|Uvicorn running|Started server process|Avg prompt throughput"
    r"|Running: \d+ reqs|Received request|POST /v1/|init engine \(profile, create kv cache, warmup model\) took"
)
# Most specific first. Each entry: the phase, then function names (exact) and path fragments.
_FRAME_PHASES: tuple[tuple[OomPhase, frozenset[str], tuple[str, ...]], ...] = (
    (OomPhase.WAKE_UP, frozenset({"wake_up"}), ("device_allocator/cumem",)),
    # Before the captures it encloses and the minimal KV cache it allocates: all of it runs before the budget.
    (OomPhase.GRAPH_PROFILING, frozenset({"profile_cudagraph_memory", "_init_minimal_kv_cache_for_profiling"}), ()),
    (
        OomPhase.GRAPH_CAPTURE,
        frozenset(
            {"capture_model", "_capture_cudagraphs", "capture_graph", "graph_capture", "capture", "capture_end",
             "capture_begin", "_capture_model", "capture_graphs"}
        ),
        ("cuda_graph", "cudagraph"),
    ),
    (
        OomPhase.KV_ALLOCATION,
        frozenset(
            {"initialize_kv_cache", "_allocate_kv_cache", "allocate_kv_cache", "_allocate_kv_cache_tensors",
             "initialize_cache", "_init_cache_engine", "init_cache_engine", "_init_cache", "_reshape_kv_cache_tensors",
             "initialize_kv_cache_tensors", "_allocate_kv_cache_on_device", "init_caches"}
        ),
        ("cache_engine.py",),
    ),
    (
        OomPhase.WARMUP,
        frozenset({"compile_or_warm_up_model", "_warmup", "kernel_warmup", "warmup_model", "warm_up_model"}),
        (),
    ),
    (
        OomPhase.PROFILING,
        frozenset(
            {"profile_run", "determine_available_memory", "determine_num_available_blocks", "_profile_run",
             "profile_encoder", "_dummy_pooler_run"}
        ),
        (),
    ),
    (
        OomPhase.WEIGHT_LOADING,
        frozenset(
            {"load_model", "load_weights", "create_weights", "_initialize_model", "initialize_model", "get_model",
             "process_weights_after_loading", "weight_loader", "_load_weights", "load_weights_and_postprocess",
             "init_model", "_init_model"}
        ),
        ("model_loader",),
    ),
    (
        OomPhase.SERVING,
        frozenset(
            {"execute_model", "run_busy_loop", "step_with_batch_queue", "engine_step", "run_engine_loop",
             "_process_engine_step", "step", "step_async", "sample_tokens", "_model_forward", "execute_model_spmd",
             "_process_input_queue", "process_input_sockets", "generate"}
        ),
        (),
    ),
)  # fmt: skip
# V1 wraps the model in a CUDA-graph wrapper (compilation/cuda_graph.py) whose __call__ runs on every forward,
# the profile run's and serving's too: its file alone does not say a capture.
_EVERY_FORWARD = frozenset({"__call__", "forward"})
# Progress lines: the step each one says vLLM had reached (an OOM after it hit in that step or a later one).
_PROGRESS: tuple[tuple[OomPhase, re.Pattern[str]], ...] = (
    (
        OomPhase.WEIGHT_LOADING,
        re.compile(
            r"Starting to load model|Loading weights (?:on|from)|Loading (?:safetensors|pt) checkpoint shards"
            r"|Loading model from|Using model weights format|Loading model weights"
        ),
    ),
    (OomPhase.PROFILING, re.compile(r"Model loading took|Loading model weights took|Loading weights took")),
    (OomPhase.GRAPH_PROFILING, re.compile(r"Profiling CUDA graph memory")),
    # V0 prints "# GPU blocks: N" before it allocates them (init_cache_engine), then warms up.
    (
        OomPhase.KV_ALLOCATION,
        re.compile(r"Memory profiling takes|Available KV cache memory|model weights take|# (?:GPU|cuda) blocks: \d+"),
    ),
    (
        OomPhase.WARMUP,
        re.compile(
            r"# (?!GPU|cuda|CPU)\w+ blocks: \d+|GPU KV cache size|Maximum concurrency for|num_gpu_blocks is"
            r"|Graph capturing finished|Compile and warming up model|Warming up"
        ),
    ),
    (
        OomPhase.GRAPH_CAPTURE,
        re.compile(
            r"Capturing cudagraphs|Capturing CUDA graph|Capturing the model for CUDA graphs|CUDA graphs can take"
        ),
    ),
    (
        OomPhase.SERVING,
        re.compile(SERVING_SIGNS),
    ),
)
_CODE_LINE = re.compile(r"^\s{2,}(?!File \")\S")
_CALL = re.compile(r"\.?(\w+)\(")
_TRACEBACK_ISH = re.compile(
    r"^\s*(?:$|Traceback|File \"|During handling|The above exception|\^+|~+|[\w.]*(?:Error|Exception)\b|\s)"
)
_HEADER = re.compile(r"^\s*Traceback \(most recent call last\)")
_CHAIN_MARKER = re.compile(r"^\s*(?:During handling of the above exception|The above exception was the direct cause)")
_MAX_TRACEBACK_RECORDS = 600
_MAX_STRAY_RECORDS = 3  # other processes' lines interleaved in a traceback


def oom_phase(records: Sequence[Record], at: int) -> tuple[OomPhase, str]:
    """The phase of the error in `records[at]` and the frame or line that says it."""
    start = traceback_start(records, at)
    process = records[at].process
    chain = [record for record in records[start : at + 1] if not process or record.process in ("", process)]
    frames = [frame for record in chain for frame in _frames(record.payload)]
    method = _WORKER_METHOD.search(records[at].payload)
    if method is not None:  # V0's worker names the method it ran on the error's own line
        frames.append(("", method.group(1)))
    for phase, names, paths in _FRAME_PHASES:
        for path, name in frames:
            if name in names or (name not in _EVERY_FORWARD and any(part in path for part in paths)):
                return (
                    phase,
                    f"frame {name} ({path.rsplit('/', 1)[-1]})" if path else f"the call {name}() in a frame's code",
                )
    # From the error itself back: the walk to the chain's start can step over progress lines between blank and
    # indented ones (uvicorn's "INFO:     Application startup complete."), and no frame or code line reads as one.
    before = range(at - 1, -1, -1)
    after = range(at + 1, len(records))  # a paste that put the error first and the lines that led to it after
    for indices, where in ((before, "before"), (after, "after, in the paste's order,")):
        for index in indices:
            text = records[index].payload
            for phase, pattern in reversed(_PROGRESS):
                match = pattern.search(text)
                if match is not None:
                    return phase, f"the last progress line {where} it: {match.group(0)!r}"
    return OomPhase.UNKNOWN, "no traceback frame or progress line places it"


def _frames(payload: str) -> list[tuple[str, str]]:
    """(path, function) of a frame line; a code line under a frame names the functions it calls, which the
    traceback enters next (a traceback cut short by a paste still shows `engine_core.run_busy_loop()`). A
    traceback joined into one line (a web page's copy, a wrapper that flattens newlines) holds several frames,
    each followed by its code."""
    frames = list(_FRAME.finditer(payload))
    if frames:
        found: list[tuple[str, str]] = []
        for frame, following in zip(frames, [*frames[1:], None], strict=True):
            found.append((frame.group(1), frame.group(2)))
            code = payload[frame.end() : following.start() if following is not None else len(payload)]
            found.extend(("", name) for name in _CALL.findall(code))
        return found
    if _CODE_LINE.match(payload):
        return [("", name) for name in _CALL.findall(payload)]
    return []


def _chained(records: Sequence[Record], header: int) -> bool:
    """Whether the traceback header at `header` continues an earlier exception's (a chain marker above it)."""
    for index in range(header - 1, max(-1, header - 4), -1):
        payload = records[index].payload
        if payload.strip():
            return _CHAIN_MARKER.match(payload) is not None
    return False


def cut_in_traceback(records: Sequence[Record]) -> OomPhase | None:
    """Where a log that ends inside a traceback, before its error line (an excerpt cut short), had got to: the
    phase its frames name, or None when the last record is no frame or code line of one."""
    if not records:
        return None
    last = records[-1].payload
    if _FRAME.search(last) is None and _CODE_LINE.match(last) is None:
        return None
    phase, _ = oom_phase(records, len(records) - 1)
    return phase if phase is not OomPhase.UNKNOWN else None


def traceback_start(records: Sequence[Record], at: int) -> int:
    """The first record of the traceback chain that ends at `at` (`at` itself when there is none): walking back
    over frames, code lines, exception lines and chain markers, past a few interleaved lines of other processes."""
    start = at
    stray = 0
    process = records[at].process
    for index in range(at - 1, max(-1, at - _MAX_TRACEBACK_RECORDS), -1):
        if process and records[index].process not in ("", process):
            continue  # another process's lines, interleaved
        if _HEADER.match(records[start].payload) and not _chained(records, start):
            break  # the chain's first line: the lines above it (progress lines, a blank) led to it
        if _TRACEBACK_ISH.match(records[index].payload):
            start = index
            stray = 0
            continue
        stray += 1
        if stray > _MAX_STRAY_RECORDS:
            break
    return start


RAN_OUT = "vLLM ran out of memory"

_PHASE_TEXT = {
    OomPhase.WEIGHT_LOADING: "loading the model's weights",
    OomPhase.PROFILING: "profiling memory at start (before the KV cache)",
    OomPhase.GRAPH_PROFILING: "profiling CUDA graphs' memory at start (before the KV cache)",
    OomPhase.KV_ALLOCATION: "allocating the KV cache",
    OomPhase.WARMUP: "warming up after the KV cache was allocated",
    OomPhase.GRAPH_CAPTURE: "capturing CUDA graphs at start",
    OomPhase.SERVING: "serving",
    OomPhase.WAKE_UP: "waking up from sleep mode",
    OomPhase.AFTER_KV_CACHE: "capturing CUDA graphs or serving (after the KV cache was allocated)",
    OomPhase.UNKNOWN: "in a step the log does not name",  # not "running": that reads as serving
}


def phase_text(phase: OomPhase) -> str:
    return _PHASE_TEXT[phase]
