"""The shapes issue 14 names that the corpus has no real log of with its numbers, read from lines in vLLM's own
format strings (quoted beside each test from the release's source): CUDA-graph capture OOM with the capture
sizes, V1's negative KV budget, V1's preemption counter in its stats line, the engine's death after an OOM."""

from __future__ import annotations

import json

import pytest

from sidecar.doctor.capture_sizes import default_capture_sizes
from sidecar.doctor.diagnose import diagnose
from sidecar.doctor.finding import Cause, Finding
from sidecar.doctor.log_memory import log_memory
from sidecar.doctor.log_parser import parse_log
from sidecar.doctor.logfacts import CudaOom, OomPhase
from sidecar.doctor.setup import resolve
from tests.doctor.builders import GIB, args, evidence, live, log

DOWN = live(error="connection refused", version=None, max_model_len=None)  # nothing running: the log alone


def _flags(finding: Finding | None) -> list[tuple[str, object]]:
    assert finding is not None
    return [(r.flag, r.value) for r in finding.recommendations]


def _capture_oom() -> CudaOom:
    return CudaOom(
        phase=OomPhase.GRAPH_CAPTURE,
        tried_bytes=GIB,
        gpu=0,
        total_bytes=80 * GIB,
        free_bytes=GIB // 4,
        process_bytes=80 * GIB - GIB // 4,  # the card is vLLM's alone: this process + free = the total
        reserved_unallocated_bytes=10 * 2**20,
        other_processes=(),
    )


def _graph_finding(**facts: object) -> Finding | None:
    ev = evidence(live_evidence=DOWN, log_facts=log(oom=_capture_oom(), **facts))
    return log_memory(ev, resolve(ev))


def test_default_capture_sizes_follow_vllms_own_lists() -> None:
    # vllm/config/vllm.py `_set_cudagraph_sizes` (0.11.2, 0.12.0, 0.32.0): [1, 2, 4] + range(8, 256, 8) +
    # range(256, max + 1, 16); vllm/config/__init__.py (0.10.2): [1, 2, 4] + range(8, max + 1, 8).
    assert len(default_capture_sizes(512, (0, 32, 0))) == 3 + 31 + 17
    assert default_capture_sizes(256, (0, 11, 2))[-3:] == [240, 248, 256]
    assert len(default_capture_sizes(512, (0, 10, 2))) == 3 + 64
    assert default_capture_sizes(4, (0, 32, 0)) == [1, 2, 4]


def test_graph_capture_oom_on_032_caps_the_capture_size_from_max_num_seqs() -> None:
    finding = _graph_finding(version="0.32.0", args=args(max_num_seqs=256))
    # 0.9 (default) - (1 GiB - 0.25 GiB) / 80 GiB - 0.01 = 0.8806 -> 0.88; min(2 x 256, 512) = 512 -> 256
    assert _flags(finding) == [
        ("--gpu-memory-utilization", 0.88),
        ("--max-cudagraph-capture-size", 256),
        ("--enforce-eager", ""),
    ]
    assert finding is not None
    why = finding.recommendations[1].why
    assert "51 batch sizes up to 512" in why
    assert "min(2 x max_num_seqs 256" in why
    assert "keeps 35 of them" in why


def test_graph_capture_oom_on_0102_uses_cuda_graph_sizes_and_its_8_step_list() -> None:
    finding = _graph_finding(version="0.10.2", args=args(max_num_seqs=128, gpu_memory_utilization=0.95))
    # min(2 x 128, 512) = 256 -> 128; 0.95 - 0.0094 - 0.01 = 0.9306 -> 0.93
    assert _flags(finding) == [
        ("--gpu-memory-utilization", 0.93),
        ("--cuda-graph-sizes", 128),
        ("--enforce-eager", ""),
    ]


def test_graph_capture_oom_on_085_rewrites_the_logged_capture_list_as_compilation_config() -> None:
    # The compilation_config part of the engine's config line as vLLM 0.7-0.8 printed it (vllm#12529's paste).
    sizes = ",".join(str(size) for size in [*range(512, 7, -8), 4, 2, 1])
    text = (
        "INFO 03-12 14:57:37 [core.py:50] Initializing a V1 LLM engine (v0.8.5) with config: model='m', "
        "max_seq_len=2000, tensor_parallel_size=1, quantization=None, kv_cache_dtype=auto,  device_config=cuda, "
        'compilation_config={"level":3,"use_cudagraph":true,"cudagraph_num_of_warmups":1,'
        f'"cudagraph_capture_sizes":[{sizes}],"max_capture_size":512}}\n'
    )
    facts = parse_log(text)
    assert facts.capture_sizes is not None
    assert (len(facts.capture_sizes), facts.max_capture_size) == (67, 512)
    ev = evidence(live_evidence=DOWN, log_facts=log(**{**_fields(facts), "oom": _capture_oom()}))
    finding = log_memory(ev, resolve(ev))
    flags = dict(_flags(finding))
    expected = [1, 2, 4, *range(8, 257, 8)]
    assert flags["--compilation-config"] == json.dumps({"cudagraph_capture_sizes": expected}, separators=(",", ":"))


def _fields(facts: object) -> dict[str, object]:
    return {name: getattr(facts, name) for name in ("version", "capture_sizes", "max_capture_size", "max_seq_len")}


def test_graph_capture_oom_without_the_version_says_why_no_size_is_given() -> None:
    finding = _graph_finding(args=args())  # non-default args without the budget: vLLM's default, known
    assert _flags(finding) == [("--gpu-memory-utilization", 0.88), ("--enforce-eager", "")]
    assert finding is not None
    assert any("fewer captured graph sizes cannot be sized" in line for line in finding.evidence)


def test_graph_capture_oom_with_the_budget_unknown_gives_its_lowering_as_a_step() -> None:
    """No arguments in the log: 0.88 from vLLM's default could be a raise for whoever set 0.8, so the lowering is
    relative (by 0.019 from what was set) and only what holds at any budget is a value."""
    finding = _graph_finding()
    assert _flags(finding) == [("--enforce-eager", "")]
    assert finding is not None
    assert finding.steps[0].startswith("lower --gpu-memory-utilization by 0.019 below what you set")


# vllm/v1/worker/gpu_worker.py 0.10.2: logger.info("Available KV cache memory: %.2f GiB", ...); 0.32.0 prints
# format_gib(...). vllm/v1/core/kv_cache_utils.py: ValueError("No available memory for the cache blocks. ...").
NEGATIVE_V1 = """\
(EngineCore_DP0 pid=72) INFO 08-25 09:12:20 [gpu_model_runner.py:2007] Model loading took 14.25 GiB and 19.42 seconds
(EngineCore_DP0 pid=72) INFO 08-25 09:12:34 [gpu_worker.py:276] Available KV cache memory: -2.16 GiB
(EngineCore_DP0 pid=72) ERROR 08-25 09:12:34 [core.py:700] ValueError: No available memory for the cache blocks. \
Try increasing `gpu_memory_utilization` when initializing the engine.
"""


@pytest.mark.parametrize("weights", [True, False])
def test_a_negative_v1_kv_budget_without_the_card_raises_the_budget_and_says_what_is_unknown(weights: bool) -> None:
    text = NEGATIVE_V1 if weights else NEGATIVE_V1.split("\n", 1)[1]
    facts = parse_log(text)
    assert facts.available_kv_gib == -2.16
    diagnosis = diagnose(evidence(live_evidence=DOWN, log_facts=facts))
    finding = diagnosis.findings[0]
    # Neither the card nor the budget is in these lines: a larger budget is the one direction that cannot hurt
    # (vLLM's own advice), one step above vLLM's default (recommending the default would repeat the likeliest
    # configuration that failed), 0.9 first for a budget below it; and no tensor parallelism is guessed.
    assert finding.cause is Cause.CONFIGURATION_OVERSHOOT
    assert _flags(finding) == [("--gpu-memory-utilization", 0.95)]
    assert "below 0.9, 0.9 first" in finding.recommendations[0].why
    assert any("KV cache -2.16 GiB" in line for line in finding.evidence), finding.evidence
    assert any("whether the weights fit is not decided" in line for line in finding.evidence)


def test_a_negative_v1_kv_budget_with_weights_that_fill_the_card_is_does_not_fit() -> None:
    free = (
        "(EngineCore_DP0 pid=72) INFO 08-25 09:12:33 [gpu_worker.py:270] Free memory on device (15.2/15.57 GiB) on "
        "startup. Desired GPU memory utilization is (0.9, 14.01 GiB). Actual usage is 14.25 GiB for weight, 1.2 GiB "
        "for peak activation, 0.5 GiB for non-torch memory, and 0.0 GiB for CUDAGraph memory.\n"
    )
    finding = diagnose(evidence(live_evidence=DOWN, log_facts=parse_log(free + NEGATIVE_V1))).findings[0]
    assert finding.cause is Cause.DOES_NOT_FIT
    flags = dict(_flags(finding))
    assert flags["--tensor-parallel-size"] == 2  # 14.25 / 2 = 7.1 <= 0.75 x 15.57
    assert "--gpu-memory-utilization" not in flags


# vllm/v1/metrics/loggers.py 0.11.2: "Engine %03d: Avg prompt throughput: %.1f tokens/s, Avg generation
# throughput: %.1f tokens/s, Running: %d reqs, Waiting: %d reqs, Preemptions: %d, GPU KV cache usage: %.1f%%,
# Prefix cache hit rate: %.1f%%"; 0.32.0 adds the device name ("%s KV cache usage").
V1_PREEMPTING = """\
(APIServer pid=1) INFO 11-26 03:41:07 [loggers.py:207] Engine 000: Avg prompt throughput: 812.4 tokens/s, \
Avg generation throughput: 402.1 tokens/s, Running: 48 reqs, Waiting: 9 reqs, GPU KV cache usage: 88.0%, \
Prefix cache hit rate: 2.1%
(APIServer pid=1) INFO 11-26 03:41:17 [loggers.py:207] Engine 000: Avg prompt throughput: 0.0 tokens/s, \
Avg generation throughput: 391.7 tokens/s, Running: 44 reqs, Waiting: 13 reqs, Preemptions: 4, GPU KV cache \
usage: 99.6%, Prefix cache hit rate: 2.1%
(APIServer pid=1) INFO 11-26 03:41:27 [loggers.py:260] Engine 000: Avg prompt throughput: 0.0 tokens/s, \
Avg generation throughput: 388.0 tokens/s, Running: 44 reqs, Waiting: 13 reqs, Preemptions: 3, CPU KV cache \
usage: 98.0%, Prefix cache hit rate: 2.0%
"""


def test_v1_preemptions_in_the_stats_lines_are_a_concurrency_finding() -> None:
    facts = parse_log(V1_PREEMPTING)
    assert (facts.preemptions, facts.v1_preemptions) == (7, 7)
    assert facts.busiest is not None
    assert (facts.busiest.running, facts.busiest.kv_usage) == (44, 0.996)
    finding = diagnose(evidence(live_evidence=DOWN, log_facts=facts)).findings[0]
    assert finding.cause is Cause.CONCURRENCY_MISJUDGEMENT
    assert "7 times" in finding.summary
    assert dict(_flags(finding))["--max-num-seqs"] == 39  # 44 / 0.996 = 44.2 x 0.9 = 39.8 -> 39


@pytest.mark.parametrize(
    "line",
    [
        # vllm/v1/engine/core_client.py 0.10.2 / 0.11.2
        "(APIServer pid=1) ERROR 05-05 12:36:59 [core_client.py:565] Engine core proc EngineCore_DP0 died "
        "unexpectedly, shutting down client.",
        # vllm/v1/utils.py 0.33 (the API servers' watcher)
        "(APIServer pid=1) ERROR 05-05 12:36:59 [utils.py:600] RuntimeError: Engine core process EngineCore_DP0 died "
        "unexpectedly.",
        # vllm/v1/engine/exceptions.py
        "(APIServer pid=1) ERROR 05-05 12:36:59 [serving.py:1173] vllm.v1.engine.exceptions.EngineDeadError: "
        "EngineCore encountered an issue. See stack trace (above) for the root cause.",
        # vllm/v1/executor/multiproc_executor.py
        "ERROR 05-21 09:27:46 [multiproc_executor.py:123] Worker proc VllmWorker-6 died unexpectedly, shutting down "
        "executor.",
    ],
)
def test_the_engine_dying_after_an_oom_is_said(line: str) -> None:
    oom = (
        "(EngineCore_DP0 pid=104) ERROR 05-05 12:36:59 [core.py:1131] torch.OutOfMemoryError: CUDA out of memory. "
        "Tried to allocate 50.00 MiB. GPU 0 has a total capacity of 23.56 GiB of which 21.75 MiB is free. Including "
        "non-PyTorch memory, this process has 23.50 GiB memory in use. Of the allocated memory 22.88 GiB is allocated "
        "by PyTorch, with 24.00 MiB allocated in private pools (e.g., CUDA Graphs), and 75.38 MiB is reserved by "
        "PyTorch but unallocated."
    )
    facts = parse_log(oom + "\n" + line + "\n")
    assert facts.engine_dead
    finding = diagnose(evidence(live_evidence=DOWN, log_facts=facts)).findings[0]
    assert finding.summary.startswith("vLLM died of an out-of-memory error while capturing CUDA graphs or serving")
    assert any(text.startswith("the engine died of this error") for text in finding.evidence)
    alone = diagnose(evidence(live_evidence=DOWN, log_facts=parse_log(oom + "\n"))).findings[0]
    assert not any(text.startswith("the engine died of this error") for text in alone.evidence)
