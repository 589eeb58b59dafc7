"""How many preemptions a log shows. V0 warns at the 1st, 51st, 101st... preemption only; LMCache's vLLM connector
logs the scheduler's preemptions (`<preempted> by preempted requests: {...}`) where V1 before 0.11.2 prints none of
its own. The formats are vLLM's (core/scheduler.py) and LMCache's (lmcache_mp_connector.py); ids and counts are
made up."""

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


V0_WARNING = (
    "WARNING 03-04 07:39:28 scheduler.py:1754] Sequence group {group} is preempted by PreemptionMode.RECOMPUTE mode "
    "because there is not enough KV cache space. This can affect the end-to-end performance. Increase "
    "gpu_memory_utilization or tensor_parallel_size to provide more KV cache memory. "
    "total_num_cumulative_preemption={count}"
)


def test_each_v0_warning_after_the_first_stands_for_fifty_preemptions_even_when_cut() -> None:
    one = parse_log(V0_WARNING.format(group=16, count=1))
    assert (one.preemptions, one.preemption_warnings) == (1, 1)
    cut = V0_WARNING.format(group=13, count=51)[:110]  # "... Sequence group 13 is preempted by PreemptionM"
    two = parse_log(V0_WARNING.format(group=16, count=1) + "\n" + cut)
    assert (two.preemptions, two.preemption_warnings, two.preemption_mode) == (51, 2, "RECOMPUTE")
    finding = diagnose(evidence(live_evidence=DOWN, log_facts=two)).findings[0]
    assert "at least 51 times" in finding.evidence[0]
    # 51 is a storm: V0's default 256 sequences halved as a first step, no stats line to size it
    assert {r.flag: r.value for r in finding.recommendations}["--max-num-seqs"] == 128
    # A single warning sizes no step: one preemption is vLLM working under load.
    alone = diagnose(evidence(live_evidence=DOWN, log_facts=one)).findings[0]
    assert "--max-num-seqs" not in {r.flag for r in alone.recommendations}
