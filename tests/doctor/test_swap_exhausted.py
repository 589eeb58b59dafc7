"""V0 aborts its engine when preempted requests fill the CPU swap space: read wherever the error surfaces (here
inside a serving wrapper's message, as an application that runs vLLM printed it). The wording is V0's scheduler's
(vllm/core/scheduler.py); the wrapper's is made up."""

from __future__ import annotations

from sidecar.doctor.diagnose import diagnose
from sidecar.doctor.finding import Cause
from sidecar.doctor.log_parser import parse_log
from tests.doctor.builders import evidence, live

DOWN = live(error="connection refused", version=None, max_model_len=None)
LINE = (
    "ValueError: an exception was caught while processing the generator: MQEngineDeadError: Engine loop is not "
    "running. Inspect the stacktrace to find the original error: RuntimeError('Aborted due to the lack of CPU swap "
    "space. Please increase the swap space to avoid this error.')."
)


def test_swap_space_run_out_by_preemptions_asks_for_fewer_sequences_or_more_swap() -> None:
    facts = parse_log(LINE)
    assert facts.swap_exhausted
    assert facts.engine == "v0"
    finding = diagnose(evidence(live_evidence=DOWN, log_facts=facts)).findings[0]
    assert finding.cause is Cause.CONCURRENCY_MISJUDGEMENT
    # V0's default 256 sequences halved; V0's default 4 GiB of swap doubled
    assert {r.flag: r.value for r in finding.recommendations} == {"--max-num-seqs": 128, "--swap-space": 8}


def test_with_the_arguments_logged_the_swap_space_doubles_todays() -> None:
    args = "INFO 06-10 02:40:00 [api_server.py:1] args: Namespace(swap_space=16.0, max_num_seqs=64)\n"
    finding = diagnose(evidence(live_evidence=DOWN, log_facts=parse_log(args + LINE))).findings[0]
    assert {r.flag: r.value for r in finding.recommendations} == {"--max-num-seqs": 32, "--swap-space": 32}
