"""What the Deriver adds from vLLM's queue reasons, rejections and fault tolerance, and the short horizon of the
preemption rate, on virtual time."""

from __future__ import annotations

import pytest

from sidecar.derive.settings import DeriveSettings
from sidecar.derive.tick import Deriver
from sidecar.derive.window import Window
from sidecar.model.derived import Derived
from sidecar.model.snapshot import Snapshot
from sidecar.model.vllm import EngineMetrics, MetricSchema, ModelMetrics
from tests.unit.builders import engine, snapshot

INTERVAL_S = 2.0


class Run:
    """A Deriver fed one snapshot per poll, `INTERVAL_S` apart."""

    def __init__(self, settings: DeriveSettings | None = None) -> None:
        self.deriver = Deriver(settings or DeriveSettings())
        self.window = Window(span_s=600)
        self.t = 0.0

    def poll(self, *engines: EngineMetrics, **kwargs: object) -> Derived:
        self.window.push(snapshot(self.t, engines or None, **kwargs))  # type: ignore[arg-type]
        self.t += INTERVAL_S
        return self.deriver.derive(self.window)

    def push(self, shot: Snapshot) -> Derived:
        self.window.push(shot)
        return self.deriver.derive(self.window)


def test_the_preemption_rate_is_judged_on_the_last_five_polls_and_the_count_on_the_window() -> None:
    run = Run()
    total = 0.0
    for _ in range(30):  # a storm: 6 preemptions per 2 s poll, 3/s, for a minute
        derived = run.poll(engine(preemptions_total=total))
        total += 6
    assert derived.engines[0].preemptions_per_second == pytest.approx(3.0)
    rates = []
    for _ in range(8):  # the storm ends: the counter stands still
        derived = run.poll(engine(preemptions_total=total - 6))
        rates.append(derived.engines[0].preemptions_per_second)
    # Over 5 poll intervals (10 s): the rate falls as the storm's last steps leave the horizon, and is 0 from the
    # 5th poll after it. Averaged over the 300 s window it would still read about 1.8/s here.
    assert rates[0] == pytest.approx(2.4)
    assert rates[4] == pytest.approx(0.0)
    assert rates[5:] == [0.0, 0.0, 0.0]
    # The count over the window keeps every preemption of the storm (29 steps of 6, from the first reading).
    assert derived.engines[0].preemptions_in_window == 174.0


def test_the_short_horizon_follows_the_interval_in_polls() -> None:
    run = Run(DeriveSettings(short_horizon_polls=2))
    for total in (0.0, 10.0, 20.0, 20.0):
        derived = run.poll(engine(preemptions_total=total))
    assert derived.engines[0].preemptions_per_second == pytest.approx(10 / 4)  # 20 -> 20 and 10 -> 20 over 4 s


def test_one_reading_has_no_rate_and_no_count() -> None:
    derived = Run().poll(engine(preemptions_total=5.0))
    assert derived.engines[0].preemptions_per_second is None
    assert derived.engines[0].preemptions_in_window is None


def test_deferred_share_of_waiting() -> None:
    run = Run()
    split = run.poll(engine(requests_waiting=8.0, requests_waiting_capacity=6.0, requests_waiting_deferred=2.0))
    (e,) = split.engines
    assert (e.requests_waiting_capacity, e.requests_waiting_deferred, e.requests_waiting_deferred_ratio) == (6, 2, 0.25)
    nothing_waits = run.poll(engine(requests_waiting=0.0, requests_waiting_capacity=0.0, requests_waiting_deferred=0.0))
    assert nothing_waits.engines[0].requests_waiting_deferred_ratio is None
    no_split = run.poll(engine(requests_waiting=8.0))
    assert no_split.engines[0].requests_waiting_deferred_ratio is None


def test_unhealthy_seconds_count_from_the_first_unhealthy_reading() -> None:
    run = Run()
    assert run.poll(engine(engine_healthy=None)).engines[0].engine_unhealthy_seconds is None  # no FT metric
    assert run.poll(engine(engine_healthy=True)).engines[0].engine_unhealthy_seconds == 0.0
    seconds = [run.poll(engine(engine_healthy=False)).engines[0].engine_unhealthy_seconds for _ in range(4)]
    assert seconds == [0.0, 2.0, 4.0, 6.0]
    run.poll(vllm_error="timeout")  # an unreadable poll says nothing: the run goes on
    assert run.poll(engine(engine_healthy=False)).engines[0].engine_unhealthy_seconds == 10.0
    assert run.poll(engine(engine_healthy=True)).engines[0].engine_unhealthy_seconds == 0.0
    assert run.poll(engine(engine_healthy=False)).engines[0].engine_unhealthy_seconds == 0.0


def test_unhealthy_seconds_outlast_the_window() -> None:
    run = Run(DeriveSettings(window_s=10.0))
    for _ in range(20):
        derived = run.poll(engine(engine_healthy=False))
    assert derived.engines[0].engine_unhealthy_seconds == 38.0


def test_vllms_rejections_per_model() -> None:
    run = Run()
    derived = Derived(engines=(), gpus=(), problems=())
    for total in (0.0, 0.0, 10.0, 30.0, 50.0, 70.0, 90.0, 110.0):
        models = (
            ModelMetrics(
                model_name="m",
                admission_rejections_total=total,
                admission_rejections_by_reason=(("max_num_queued_reqs", total), ("max_num_queued_tokens", 0.0)),
            ),
        )
        derived = run.poll(models=models)
    (model,) = derived.models
    assert model.model_name == "m"
    assert model.admission_rejections_total == 110.0
    assert dict(model.admission_rejections_by_reason) == {"max_num_queued_reqs": 110.0, "max_num_queued_tokens": 0.0}
    assert model.admission_rejections_per_second == pytest.approx(10.0)  # 10 -> 110 over the last 5 polls (10 s)
    assert model.admission_rejections_in_window == 110.0


def test_no_rejection_counter_before_vllm_032() -> None:
    derived = Run().poll(models=(ModelMetrics(model_name="m", admission_rejections_total=None),))
    (model,) = derived.models
    assert (model.admission_rejections_per_second, model.admission_rejections_in_window) == (None, None)
    assert Run().poll().models == ()


@pytest.mark.parametrize(
    ("version", "schema", "used"),
    [
        ("0.32.0", MetricSchema.V1, 64.0),  # 64 / 127 read as 64 blocks (null block excluded)
        ("0.9.2", MetricSchema.V1, 64.0 * 128 / 127 - 1),  # counted as used: usage x 128 - 1
        ("0.6.6", MetricSchema.V0, 64.0 * 128 / 127),  # no null block: usage x 128
        (None, MetricSchema.V1, 64.0),
    ],
)
def test_used_blocks_follow_the_version_of_the_reading(version: str | None, schema: MetricSchema, used: float) -> None:
    derived = Run().poll(engine(kv_cache_usage_ratio=64 / 127), version=version, schema=schema)
    assert derived.engines[0].kv_cache_used_blocks == pytest.approx(used)


def test_the_short_horizon_needs_at_least_one_poll_interval() -> None:
    with pytest.raises(ValueError, match="short_horizon_polls must be >= 1"):
        DeriveSettings(short_horizon_polls=0)
