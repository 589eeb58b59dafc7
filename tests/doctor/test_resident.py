"""A weight load that fails in a process already holding an earlier engine: not weights that do not fit (a
notebook's second `LLM()`). Lines from vLLM 0.5.4's format strings (llm_engine.py, model_runner.py,
gpu_executor.py) and PyTorch 2.3's OOM message."""

from __future__ import annotations

from sidecar.doctor.diagnose import diagnose
from sidecar.doctor.finding import Cause, Finding
from sidecar.doctor.log_parser import parse_log
from tests.doctor.builders import evidence, live

DOWN = live(error="connection refused", version=None, max_model_len=None)


def _start(model: str, *, loaded: str | None, tp: int = 1) -> str:
    lines = [
        f"INFO 11-02 04:23:09 llm_engine.py:174] Initializing an LLM engine (v0.5.4) with config: model='{model}', "
        f"tokenizer='{model}', dtype=torch.float16, max_seq_len=2048, tensor_parallel_size={tp}, enforce_eager=False",
        f"INFO 11-02 04:23:11 model_runner.py:720] Starting to load model {model}...",
    ]
    if loaded is not None:
        lines += [
            f"INFO 11-02 04:23:13 model_runner.py:732] Loading model weights took {loaded} GB",
            "INFO 11-02 04:23:14 gpu_executor.py:102] # GPU blocks: 2881, # CPU blocks: 819",
        ]
    return "\n".join(lines) + "\n"


OOM = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 50.00 MiB. GPU 0 has a total capacity of 22.03 GiB "
    "of which 43.06 MiB is free. Including non-PyTorch memory, this process has 21.98 GiB memory in use. Of the "
    "allocated memory 21.56 GiB is allocated by PyTorch, and 153.46 MiB is reserved by PyTorch but unallocated.\n"
)


def _finding(text: str) -> Finding:
    return diagnose(evidence(live_evidence=DOWN, log_facts=parse_log(text))).findings[0]


def test_a_second_engine_of_the_same_model_is_not_weights_that_do_not_fit() -> None:
    text = _start("microsoft/phi-2", loaded="5.1933") + _start("microsoft/phi-2", loaded=None) + OOM
    assert parse_log(text).earlier_weights_gib == 5.1933
    finding = _finding(text)
    assert finding.cause is Cause.CONFIGURATION_OVERSHOOT
    flags = {r.flag for r in finding.recommendations}
    assert not flags & {"--tensor-parallel-size", "--cpu-offload-gb", "--quantization", "--gpu-memory-utilization"}
    assert any("earlier start of the same model" in line for line in finding.evidence)
    assert any("earlier engine" in step for step in finding.steps)


def test_an_earlier_start_of_another_model_says_nothing_of_this_ones_weights() -> None:
    text = _start("microsoft/phi-2", loaded="5.1933") + _start("mistralai/Mistral-Large", loaded=None) + OOM
    assert parse_log(text).earlier_weights_gib is None
    assert _finding(text).cause is Cause.DOES_NOT_FIT


def test_a_process_holding_about_its_weights_is_still_a_load_that_does_not_fit() -> None:
    """An earlier load of the same model measured 12 GiB: 21.98 GiB held is under twice that and some slack, so the
    load itself may be what filled the card."""
    text = _start("some/model", loaded="12.0") + _start("some/model", loaded=None) + OOM
    assert _finding(text).cause is Cause.DOES_NOT_FIT


def test_an_earlier_start_split_over_more_gpus_measured_less_than_this_load_needs() -> None:
    """The same model over two GPUs measured 5.19 GiB each; on one GPU its load needs twice that, so a process
    full at its load is the load itself."""
    text = _start("microsoft/phi-2", loaded="5.1933", tp=2) + _start("microsoft/phi-2", loaded=None) + OOM
    assert parse_log(text).earlier_weights_gib is None
