"""LMCache's vLLM connector logs the scheduler's preemptions (`<preempted> by preempted requests: {...}`) where V1
before 0.11.2 prints none of its own. The notices' format is LMCache's (lmcache_mp_connector.py); the request ids
and counts are made up."""

from __future__ import annotations

from sidecar.doctor.diagnose import diagnose
from sidecar.doctor.finding import Cause
from sidecar.doctor.log_parser import parse_log
from tests.doctor.builders import evidence, live

DOWN = live(error="connection refused", version=None, max_model_len=None)
STATS = (
    "(APIServer pid=7) INFO 07-09 09:13:49 [loggers.py:273] Engine 000: Avg prompt throughput: 1813.8 tokens/s, "
    "Avg generation throughput: 130.4 tokens/s, Running: {running} reqs, Waiting: 35 reqs, GPU KV cache usage: "
    "{usage}%, Prefix cache hit rate: 0.3%"
)


def _notice(kind: str, ids: list[str]) -> str:
    named = ", ".join(f"'chatcmpl-{name}'" for name in ids)
    return (
        "(EngineCore pid=8) \x1b[33;20m[2026-07-09 09:13:57,282] LMCache WARNING:\x1b[0m <preempted> by "
        f"{kind} requests: {{{named}}} \x1b[3m(lmcache_mp_connector.py:126:lmcache.integration.vllm)\x1b[0m"
    )


def test_lmcache_preemption_notices_count_each_request_once_and_size_max_num_seqs() -> None:
    text = "\n".join(
        [
            STATS.format(running=15, usage=98.7),
            _notice("preempted", ["a", "b", "c"]),
            _notice("resumed", ["a", "b", "c", "d"]),  # d was preempted in a step whose notice named resumed ones
            STATS.format(running=14, usage=94.8),
        ]
    )
    log = parse_log(text)
    assert (log.preemptions, log.preemptions_noticed_by) == (4, "LMCache")
    finding = diagnose(evidence(live_evidence=DOWN, log_facts=log)).findings[0]
    assert finding.cause is Cause.CONCURRENCY_MISJUDGEMENT
    assert "LMCache's notices" in finding.evidence[0]
    # 15 running filled 98.7 %: 15 / 0.987 = 15.2 requests, x 0.9 headroom -> 13
    assert {r.flag: r.value for r in finding.recommendations}["--max-num-seqs"] == 13


def test_vllms_own_count_wins_over_the_connectors() -> None:
    text = "\n".join(
        [
            "WARNING 07-09 09:13:50 scheduler.py:1057] Sequence group 7 is preempted by PreemptionMode.RECOMPUTE mode "
            "because there is not enough KV cache space. This can affect the end-to-end performance. Increase "
            "gpu_memory_utilization or tensor_parallel_size to provide more KV cache memory. "
            "total_num_cumulative_preemption=51",
            _notice("preempted", ["a", "b"]),
        ]
    )
    log = parse_log(text)
    assert (log.preemptions, log.preemption_mode, log.preemptions_noticed_by) == (51, "RECOMPUTE", None)
