"""Readiness's half about vLLM itself: seen healthy within the last 3 polls, and if not, why, in one line."""

from __future__ import annotations

from sidecar.model.health import HealthAnswer, HealthCheck
from sidecar.model.snapshot import Snapshot
from sidecar.model.source import SourceResult
from sidecar.model.vllm import MetricSchema, VllmReading
from sidecar.policy.presence import READY, Presence
from tests.unit.builders import engine

URL = "http://vllm:8000"
OK = HealthCheck(answer=HealthAnswer.OK, detail=f"vLLM {URL}/health answered HTTP 200")
REFUSED = HealthCheck(answer=HealthAnswer.REFUSED, detail=f"vLLM unreachable at {URL}/health: connection refused")
TIMEOUT = HealthCheck(answer=HealthAnswer.NO_ANSWER, detail=f"vLLM {URL}/health did not answer within 1.6 s")
DEAD = HealthCheck(answer=HealthAnswer.FAILING, detail=f"vLLM {URL}/health answered HTTP 503")
NO_HEALTH = HealthCheck(answer=HealthAnswer.NO_ENDPOINT, detail=f"vLLM {URL}/health answered HTTP 404")


def reading(schema: MetricSchema = MetricSchema.V1) -> SourceResult[VllmReading]:
    engines = (engine(),) if schema is not MetricSchema.NO_VLLM_METRICS else ()
    return SourceResult(
        source="vllm", duration_s=0.01, value=VllmReading(url=URL, version="0.32.0", schema=schema, engines=engines)
    )


def failed(error: str, *, refused: bool = False) -> SourceResult[VllmReading]:
    return SourceResult(source="vllm", duration_s=0.01, error=error, unreachable=refused)


def poll(t: float, health: HealthCheck | None, vllm: SourceResult[VllmReading] | None = None) -> Snapshot:
    return Snapshot(
        monotonic_s=t,
        wall_time_s=1e9 + t,
        vllm=vllm if vllm is not None else reading(),
        vllm_healthy=None if health is None else health.ok,
        vllm_health=health,
        gpu=None,
    )


REFUSED_METRICS = failed(f"vLLM unreachable at {URL}/metrics: connection refused", refused=True)


def test_nothing_polled_yet_is_not_ready() -> None:
    verdict = Presence().verdict()
    assert (verdict.ready, verdict.reason) == (False, "vLLM not polled yet")


def test_healthy_is_ready() -> None:
    presence = Presence()
    presence.observe(poll(0, OK))
    assert (presence.verdict().ready, presence.verdict().reason) == (True, READY)


def test_nothing_listening_since_start_is_unreachable_and_says_it_may_be_loading() -> None:
    presence = Presence()
    presence.observe(poll(0, REFUSED, REFUSED_METRICS))
    verdict = presence.verdict()
    assert not verdict.ready
    assert verdict.reason == (
        "unreachable (not started, or still loading: vLLM listens once its model is loaded): "
        f"vLLM unreachable at {URL}/health: connection refused"
    )


def test_a_web_server_that_is_not_vllm_is_never_ready() -> None:
    presence = Presence()
    not_found = failed(f"vLLM {URL}/metrics answered HTTP 404")
    for t in range(5):
        presence.observe(poll(t, NO_HEALTH, not_found))
    verdict = presence.verdict()
    assert not verdict.ready
    assert verdict.reason == (
        f"not vLLM (the sidecar cannot read its metrics: vLLM {URL}/metrics answered HTTP 404): "
        f"vLLM {URL}/health answered HTTP 404"
    )
    # Nor is one that serves an exposition without any vllm: family and no /health.
    presence.observe(poll(6, NO_HEALTH, reading(MetricSchema.NO_VLLM_METRICS)))
    presence.observe(poll(7, NO_HEALTH, reading(MetricSchema.NO_VLLM_METRICS)))
    presence.observe(poll(8, NO_HEALTH, reading(MetricSchema.NO_VLLM_METRICS)))
    assert not presence.verdict().ready
    assert presence.verdict().reason.startswith("not vLLM (its /metrics has no vllm: family")


def test_a_vllm_without_health_is_ready_on_its_vllm_metrics() -> None:
    presence = Presence()
    presence.observe(poll(0, NO_HEALTH, reading()))
    assert presence.verdict().ready


def test_two_bad_polls_are_forgiven_the_third_withdraws_readiness_and_says_gone() -> None:
    presence = Presence()
    presence.observe(poll(0, OK))
    presence.observe(poll(2, TIMEOUT, failed(f"vLLM {URL}/metrics did not answer within 1.6 s")))
    verdict = presence.verdict()
    assert verdict.ready
    assert verdict.reason == f"{READY}; vLLM seen healthy 1 poll ago, last poll: {TIMEOUT.detail}"
    presence.observe(poll(4, REFUSED, REFUSED_METRICS))
    assert presence.verdict().ready
    presence.observe(poll(6, REFUSED, REFUSED_METRICS))
    verdict = presence.verdict()
    assert not verdict.ready
    assert verdict.reason == f"gone (was healthy 6 s ago): {REFUSED.detail}"


def test_an_engine_that_died_is_not_healthy_and_says_since_when() -> None:
    presence = Presence()
    presence.observe(poll(10, OK))
    for t in (12, 14, 16):
        presence.observe(poll(t, DEAD))
    verdict = presence.verdict()
    assert not verdict.ready
    assert verdict.reason == f"not healthy (was healthy 6 s ago): {DEAD.detail}"


def test_failing_health_before_it_was_ever_healthy_is_not_healthy_yet() -> None:
    presence = Presence()
    presence.observe(poll(0, DEAD))
    assert presence.verdict().reason == f"not healthy yet (still loading, or failing at start): {DEAD.detail}"


def test_healthy_with_unreadable_metrics_stays_ready_and_says_the_sidecar_cannot_watch() -> None:
    presence = Presence()
    presence.observe(poll(0, OK, failed(f"vLLM {URL}/metrics answered HTTP 500")))
    verdict = presence.verdict()
    assert verdict.ready
    assert verdict.reason == f"{READY}; but the sidecar cannot read its metrics: vLLM {URL}/metrics answered HTTP 500"
    presence.observe(poll(2, OK, reading(MetricSchema.NO_VLLM_METRICS)))
    assert presence.verdict().ready
    assert "--disable-log-stats" in presence.verdict().reason


def test_after_a_restart_the_old_health_does_not_count() -> None:
    presence = Presence()
    presence.observe(poll(0, OK))
    presence.forget_healthy()
    presence.observe(poll(2, REFUSED, REFUSED_METRICS))
    verdict = presence.verdict()
    assert not verdict.ready
    assert verdict.reason.startswith("unreachable (not started, or still loading")


def test_a_recording_without_health_details_uses_the_verdict() -> None:
    presence = Presence()
    snapshot = Snapshot(monotonic_s=0, wall_time_s=1e9, vllm=reading(), vllm_healthy=True, gpu=None)
    presence.observe(snapshot)
    assert presence.verdict().ready
    for t in (2, 4, 6):
        presence.observe(Snapshot(monotonic_s=t, wall_time_s=1e9, vllm=REFUSED_METRICS, vllm_healthy=False, gpu=None))
    assert not presence.verdict().ready
    assert presence.verdict().reason.startswith("gone (was healthy 6 s ago)")
