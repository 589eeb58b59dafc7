"""Frames V1 runs on every forward do not place an error in graph capture, and an allocation that failed inside
torch.compile is told to run eager. The traceback is shaped as vLLM 0.11's V1 engine prints it; paths and amounts
are made up."""

from __future__ import annotations

from sidecar.doctor.diagnose import diagnose
from sidecar.doctor.finding import Cause, Finding
from sidecar.doctor.log_parser import parse_log
from sidecar.doctor.logfacts import OomPhase
from tests.doctor.builders import evidence, live

DOWN = live(error="connection refused", version=None, max_model_len=None)
CORE = "(EngineCore_DP0 pid=9) ERROR 03-14 05:16:58 [core.py:843] "
SITE = "/venv/lib/python3.11/site-packages"
FRAMES = [
    (
        "vllm/v1/engine/core.py",
        "_initialize_kv_caches",
        "available_gpu_memory = self.model_executor.determine_available_memory()",
    ),
    ("vllm/v1/worker/gpu_worker.py", "determine_available_memory", "self.model_runner.profile_run()"),
    ("vllm/v1/worker/gpu_model_runner.py", "profile_run", "hidden_states, last_hidden_states = self._dummy_run("),
    ("vllm/v1/worker/gpu_model_runner.py", "_dummy_run", "outputs = self.model("),
    ("vllm/compilation/cuda_graph.py", "__call__", "return self.runnable(*args, **kwargs)"),
    ("torch/_inductor/codegen/wrapper.py", "_generate", "self.generate_and_run_autotune_block()"),
]
ERROR = (
    "torch._inductor.exc.InductorError: RuntimeError: Failed to run autotuning code block: CUDA out of memory. "
    "Tried to allocate 500.00 MiB. GPU 0 has a total capacity of 12.00 GiB of which {free} is free. Of the "
    "allocated memory 3.00 GiB is allocated by PyTorch, and 50.00 MiB is reserved by PyTorch but unallocated."
)


def _log(free: str) -> str:
    lines = [f"{CORE}Traceback (most recent call last):"]
    for number, (path, function, code) in enumerate(FRAMES, start=100):
        lines += [f'{CORE}  File "{SITE}/{path}", line {number}, in {function}', f"{CORE}    {code}"]
    return "\n".join([*lines, CORE + ERROR.format(free=free)])


def _finding(text: str) -> Finding:
    return diagnose(evidence(live_evidence=DOWN, log_facts=parse_log(text))).findings[0]


def test_the_graph_wrappers_call_on_the_profile_runs_forward_is_not_a_capture() -> None:
    oom = parse_log(_log("0.20 GiB")).oom
    assert oom is not None
    assert oom.phase is OomPhase.PROFILING


def test_an_allocation_that_failed_in_torch_compile_with_memory_free_is_told_to_run_eager() -> None:
    finding = _finding(_log("7.00 GiB"))
    assert finding.cause is Cause.OTHER
    assert [(r.flag, r.value) for r in finding.recommendations] == [("--enforce-eager", "")]
