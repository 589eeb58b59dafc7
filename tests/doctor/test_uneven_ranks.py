"""A tensor-parallel start where each rank prints its own 'Available KV cache memory': V1 sizes every rank's cache
by the least of them, and ranks far apart under one budget mean something else holds the short rank's card.
Lines as vLLM 0.10's V1 workers print them (gpu_worker.py); the amounts are made up."""

from __future__ import annotations

import pytest

from sidecar.doctor.diagnose import diagnose
from sidecar.doctor.finding import Cause, Finding
from sidecar.doctor.log_parser import parse_log
from tests.doctor.builders import evidence, live

DOWN = live(error="connection refused", version=None, max_model_len=None)
FAILED = "(EngineCore_DP0 pid=7) ERROR 10-01 12:00:01 [core.py:708] EngineCore failed to start."


def _log(*kv_per_rank: float) -> str:
    return "\n".join(
        [
            *(
                f"(Worker_TP{rank} pid={10 + rank}) INFO 10-01 12:00:00 [gpu_worker.py:298] "
                f"Available KV cache memory: {kv} GiB"
                for rank, kv in enumerate(kv_per_rank)
            ),
            FAILED,
        ]
    )


def _findings(text: str) -> tuple[Finding, ...]:
    return diagnose(evidence(live_evidence=DOWN, log_facts=parse_log(text))).findings


def test_the_least_rank_is_the_engines_kv_cache_whatever_the_order() -> None:
    assert parse_log(_log(9.9, -3.86)).available_kv_gib == -3.86
    assert parse_log(_log(-3.86, 9.9)).available_kv_gib == -3.86
    assert parse_log(_log(-3.86, 9.9)).available_kv_max_gib == 9.9


@pytest.mark.parametrize("kv", [(-3.86, 9.9), (9.9, -3.86), (12.0, 11.5, -1.0, 12.0)])
def test_one_short_rank_beside_ranks_with_room_is_another_tenant_not_the_model(kv: tuple[float, ...]) -> None:
    (finding,) = _findings(_log(*kv))
    assert finding.cause is Cause.CONFIGURATION_OVERSHOOT
    # The weights fit on the other ranks: no flag that splits them, and no length, which V1's budget ignores.
    assert not {r.flag for r in finding.recommendations} & {"--tensor-parallel-size", "--max-model-len"}
    assert any("memory outside this engine" in line for line in finding.evidence)
    assert any("nvidia-smi" in step for step in finding.steps)


@pytest.mark.parametrize("kv", [(-0.5, 1.0), (-2.0, -1.5)])
def test_ranks_close_together_are_read_as_one_short_budget(kv: tuple[float, ...]) -> None:
    """A gap an uneven split of the weights can give, or no rank with room: the usual no-KV reading."""
    (finding,) = _findings(_log(*kv))
    assert not any("memory outside this engine" in line for line in finding.evidence)
