"""The pure derivations: counters, trend, KV arithmetic, prefix ratio, progress, GPU forecast."""

from __future__ import annotations

import math

import pytest

from sidecar.derive.counter import increase
from sidecar.derive.engine import lifetime_hit_ratio
from sidecar.derive.kv import derive_kv, fragmentation
from sidecar.derive.progress import EngineProgress, ProgressTracker
from sidecar.derive.settings import DeriveSettings
from sidecar.derive.tick import Deriver
from sidecar.derive.trend import fit_line
from sidecar.derive.window import Window
from sidecar.model.gpu import GpuProcess, ProcessOwner
from sidecar.model.health import HealthAnswer
from sidecar.model.vllm import EngineMetrics
from tests.unit.builders import GIB, cache_config, device, engine, snapshot
from tests.unit.derive_oracles import preemption_rate, windowed_hit_ratio


class TestIncrease:
    def test_plain(self) -> None:
        assert increase([1.0, 3.0, 10.0]) == 9.0

    def test_reset_counts_the_new_value_as_increase(self) -> None:
        # 100 -> 120 (+20), reset to 5 (+5), -> 8 (+3): what Prometheus' increase() would count.
        assert increase([100.0, 120.0, 5.0, 8.0]) == 28.0

    def test_single_or_no_value(self) -> None:
        assert increase([5.0]) == 0.0
        assert increase([]) == 0.0


class TestFitLine:
    def test_exact_line(self) -> None:
        fit = fit_line([(1000.0 + t, 5e10 + 1e6 * t) for t in range(10)])
        assert fit is not None
        assert fit.slope_per_s == pytest.approx(1e6)
        assert fit.r2 == pytest.approx(1.0)
        assert fit.points == 10
        assert fit.span_s == 9.0

    def test_flat_values_explain_nothing(self) -> None:
        fit = fit_line([(float(t), 7.0) for t in range(5)])
        assert fit is not None
        assert fit.slope_per_s == 0.0
        assert fit.r2 == 0.0

    def test_degenerate(self) -> None:
        assert fit_line([(1.0, 2.0)]) is None
        assert fit_line([(1.0, 2.0), (1.0, 3.0)]) is None

    def test_precision_with_large_clock_and_bytes(self) -> None:
        fit = fit_line([(1e7 + 2 * t, 8e10 + 3.0 * 2 * t) for t in range(300)])
        assert fit is not None
        assert fit.slope_per_s == pytest.approx(3.0, rel=1e-9)


class TestKv:
    def test_contract_definitions(self) -> None:
        # vLLM >= 0.10.2 (the default): usage = used / (128 - 1), the null block left out.
        kv = derive_kv(engine(kv_cache_usage_ratio=64 / 127, requests_running=4.0))
        assert kv.capacity_blocks == 128
        assert kv.block_size_tokens == 32
        assert kv.used_blocks == pytest.approx(64.0)
        assert kv.free_blocks == pytest.approx(63.0)
        assert kv.blocks_per_request == pytest.approx(16.0)
        assert kv.request_headroom == pytest.approx(63 / 16)  # 63 free blocks / 16 per request
        assert kv.fragmentation_ratio == pytest.approx(4 * 31 / 2 / (64 * 32))

    def test_capacity_is_divided_among_data_parallel_engines(self) -> None:
        kv = derive_kv(engine(cache_config=cache_config(num_gpu_blocks_server=8192, engines_in_server=2)))
        assert kv.capacity_blocks == 4096

    def test_nothing_running_leaves_per_request_values_absent(self) -> None:
        kv = derive_kv(engine(kv_cache_usage_ratio=0.0, requests_running=0.0))
        assert kv.used_blocks == 0.0
        assert kv.blocks_per_request is None
        assert kv.request_headroom is None
        assert kv.fragmentation_ratio is None

    def test_unknown_capacity(self) -> None:
        kv = derive_kv(engine(cache_config=cache_config(num_gpu_blocks_server=None)))
        assert kv.capacity_blocks is None
        assert kv.used_blocks is None
        assert kv.blocks_per_request is None
        assert kv.block_size_tokens == 32
        kv = derive_kv(engine(cache_config=None))
        assert kv.capacity_blocks is None
        assert kv.block_size_tokens is None

    def test_unknown_usage(self) -> None:
        kv = derive_kv(engine(kv_cache_usage_ratio=None))
        assert kv.capacity_blocks == 128
        assert kv.used_blocks is None

    def test_full_cache_has_no_headroom(self) -> None:
        kv = derive_kv(engine(kv_cache_usage_ratio=1.0, requests_running=8.0))
        assert kv.request_headroom == 0.0

    @pytest.mark.parametrize(("running", "used", "block"), [(100.0, 1.0, 16), (1.0, 1000.0, 16), (3.0, 0.5, 1)])
    def test_fragmentation_stays_within_bounds(self, running: float, used: float, block: int) -> None:
        value = fragmentation(running=running, used_blocks=used, block_size_tokens=block)
        assert value is not None
        assert 0.0 <= value <= 1.0


class TestPrefixAndRates:
    def test_windowed_ratio_uses_increases(self) -> None:
        history = [
            (0.0, engine(prefix_cache_queries_total=1000.0, prefix_cache_hits_total=900.0)),
            (2.0, engine(prefix_cache_queries_total=1300.0, prefix_cache_hits_total=960.0)),
        ]
        # Lifetime says 74 %, the window says 20 %: the window is what changed.
        assert windowed_hit_ratio(history) == pytest.approx(60 / 300)
        assert lifetime_hit_ratio(history[-1][1]) == pytest.approx(960 / 1300)

    def test_windowed_ratio_counts_through_a_vllm_restart(self) -> None:
        history = [
            (0.0, engine(prefix_cache_queries_total=1000.0, prefix_cache_hits_total=500.0)),
            (2.0, engine(prefix_cache_queries_total=1100.0, prefix_cache_hits_total=600.0)),
            (4.0, engine(prefix_cache_queries_total=50.0, prefix_cache_hits_total=10.0)),  # restarted
        ]
        assert windowed_hit_ratio(history) == pytest.approx((100 + 10) / (100 + 50))

    def test_no_queries_is_unknown_not_zero(self) -> None:
        history = [
            (0.0, engine(prefix_cache_queries_total=10.0)),
            (2.0, engine(prefix_cache_queries_total=10.0)),
        ]
        assert windowed_hit_ratio(history) is None
        assert lifetime_hit_ratio(engine(prefix_cache_queries_total=0.0)) is None

    def test_v0_gauge_is_the_fallback_and_minus_one_means_disabled(self) -> None:
        v0 = {"prefix_cache_queries_total": None, "prefix_cache_hits_total": None}
        assert windowed_hit_ratio([(0.0, engine(**v0, prefix_cache_hit_rate_gauge=0.42))]) == 0.42
        assert lifetime_hit_ratio(engine(**v0, prefix_cache_hit_rate_gauge=0.42)) == 0.42
        assert windowed_hit_ratio([(0.0, engine(**v0, prefix_cache_hit_rate_gauge=-1.0))]) is None
        assert lifetime_hit_ratio(engine(**v0, prefix_cache_hit_rate_gauge=-1.0)) is None

    def test_preemption_rate(self) -> None:
        history = [(0.0, engine(preemptions_total=5.0)), (10.0, engine(preemptions_total=25.0))]
        assert preemption_rate(history) == 2.0
        assert preemption_rate(history[:1]) is None


class TestProgress:
    @staticmethod
    def stalled(tracker: ProgressTracker, engines: tuple[EngineMetrics, ...], t: float) -> float | None:
        progress = tracker.observe(engines, t)[("m", "0")]
        return None if progress is None else progress.stalled_s

    def test_stall_grows_only_while_requests_run_and_counters_stand_still(self) -> None:
        tracker = ProgressTracker()
        busy = engine(requests_running=2.0, generation_tokens_total=100.0)
        assert self.stalled(tracker, (busy,), 0.0) == 0.0
        assert self.stalled(tracker, (busy,), 2.0) == 2.0
        assert self.stalled(tracker, (busy,), 130.0) == 130.0
        moved = engine(requests_running=2.0, generation_tokens_total=101.0)
        assert self.stalled(tracker, (moved,), 132.0) == 0.0

    def test_idle_is_not_stalled_but_is_quiet(self) -> None:
        tracker = ProgressTracker()
        idle = engine(requests_running=0.0, requests_waiting=0.0)
        tracker.observe((idle,), 0.0)
        assert tracker.observe((idle,), 500.0)[("m", "0")] == EngineProgress(stalled_s=0.0, quiet_s=500.0)
        busy = engine(requests_running=1.0)
        # Requests arrived after the last idle reading; the stall counts from that moment, the quiet from the last
        # movement of the counters.
        assert tracker.observe((busy,), 502.0)[("m", "0")] == EngineProgress(stalled_s=0.0, quiet_s=502.0)
        assert tracker.observe((busy,), 510.0)[("m", "0")] == EngineProgress(stalled_s=8.0, quiet_s=510.0)

    def test_requests_waiting_with_none_running_and_frozen_counters_are_a_stall(self) -> None:
        # A scheduler that admits nothing: vLLM's queue grows, its running count stays 0.
        tracker = ProgressTracker()
        assert self.stalled(tracker, (engine(requests_running=0.0, requests_waiting=0.0),), 0.0) == 0.0
        queued = engine(requests_running=0.0, requests_waiting=3.0)
        assert self.stalled(tracker, (queued,), 2.0) == 0.0
        assert self.stalled(tracker, (queued,), 40.0) == 38.0

    def test_requests_in_flight_at_the_api_server_are_work_the_gauges_do_not_show(self) -> None:
        # An engine wedged while idle: its metrics read 0 running, 0 waiting; vLLM's /load counts 3 in flight.
        tracker = ProgressTracker()
        idle = engine(requests_running=0.0, requests_waiting=0.0)
        tracker.observe((idle,), 0.0)
        assert tracker.observe((idle,), 2.0, in_flight=3)[("m", "0")] == EngineProgress(stalled_s=0.0, quiet_s=2.0)
        assert tracker.observe((idle,), 30.0, in_flight=3)[("m", "0")] == EngineProgress(stalled_s=28.0, quiet_s=30.0)
        assert tracker.observe((idle,), 32.0, in_flight=0)[("m", "0")] == EngineProgress(stalled_s=0.0, quiet_s=32.0)

    def test_engines_are_tracked_separately_and_unknown_without_counters(self) -> None:
        tracker = ProgressTracker()
        a = engine(engine="0", requests_running=1.0, iterations_total=5.0)
        b = engine(engine="1", requests_running=1.0, iterations_total=5.0)
        silent = engine(engine="2", generation_tokens_total=None, prompt_tokens_total=None, iterations_total=None)
        tracker.observe((a, b, silent), 0.0)
        result = tracker.observe((a, engine(engine="1", requests_running=1.0, iterations_total=9.0), silent), 3.0)
        assert result == {
            ("m", "0"): EngineProgress(stalled_s=3.0, quiet_s=3.0),
            ("m", "1"): EngineProgress(stalled_s=0.0, quiet_s=0.0),
            ("m", "2"): None,
        }


class TestDeriver:
    def test_vllm_down_gives_no_engine_values_and_one_problem(self) -> None:
        window = Window(span_s=600)
        window.push(snapshot(0.0, vllm_error="vLLM unreachable at http://vllm/metrics: connection refused"))
        derived = Deriver(DeriveSettings()).derive(window)
        assert derived.engines == ()
        assert derived.problems == ("vLLM unreachable at http://vllm/metrics: connection refused",)

    def test_health_failing_while_metrics_answer_is_a_problem(self) -> None:
        window = Window(span_s=600)
        window.push(snapshot(0.0, healthy=False))
        assert Deriver(DeriveSettings()).derive(window).problems == (
            "vLLM /health is not answering 200 while /metrics answers",
        )

    def test_stall_survives_a_failed_poll(self) -> None:
        deriver = Deriver(DeriveSettings())
        window = Window(span_s=600)
        busy = engine(requests_running=1.0)
        for t, kwargs in [(0.0, {}), (2.0, {}), (4.0, {"vllm_error": "timeout"}), (6.0, {})]:
            window.push(snapshot(t, (busy,), **kwargs))  # type: ignore[arg-type]
            derived = deriver.derive(window)
        assert derived.engines[0].engine_stalled_seconds == 6.0

    def test_growing_memory_gives_a_forecast(self) -> None:
        deriver = Deriver(DeriveSettings(min_trend_points=6, min_trend_span_s=30, memory_trend_window_s=600))
        window = Window(span_s=600)
        growth = 10 * 2**20  # 10 MiB/s
        for step in range(31):
            t = 2.0 * step
            window.push(snapshot(t, devices=(device(used=40 * GIB + int(growth * t)),)))
            derived = deriver.derive(window)
        (gpu,) = derived.gpus
        assert gpu.memory_growth_bytes_per_second == pytest.approx(growth, rel=1e-6)
        assert gpu.time_to_oom_seconds == pytest.approx((80 * GIB - gpu.memory_used_bytes) / growth, rel=1e-6)
        assert gpu.memory_budget_bytes == int(80 * GIB * 0.9)
        assert gpu.memory_over_budget_bytes == gpu.memory_used_bytes - int(80 * GIB * 0.9)

    def test_no_forecast_from_too_little_history(self) -> None:
        deriver = Deriver(DeriveSettings(min_trend_points=6, min_trend_span_s=30))
        window = Window(span_s=600)
        for step in range(5):
            window.push(snapshot(2.0 * step, devices=(device(used=40 * GIB + step * GIB),)))
            derived = deriver.derive(window)
        assert derived.gpus[0].memory_growth_bytes_per_second is None
        assert derived.gpus[0].time_to_oom_seconds is None

    def test_no_forecast_from_shrinking_or_noisy_memory(self) -> None:
        deriver = Deriver(DeriveSettings(min_trend_points=6, min_trend_span_s=10, min_trend_r2=0.5))
        shrinking = Window(span_s=600)
        noisy = Window(span_s=600)
        for step in range(40):
            shrinking.push(snapshot(2.0 * step, devices=(device(used=60 * GIB - step * 2**20),)))
            wobble = (GIB if step % 2 else -GIB) + step * 1024  # a tiny upward drift under large swings
            noisy.push(snapshot(2.0 * step, devices=(device(used=40 * GIB + wobble),)))
        gpu = Deriver(DeriveSettings(min_trend_points=6, min_trend_span_s=10)).derive(shrinking).gpus[0]
        assert gpu.memory_growth_bytes_per_second is not None
        assert gpu.memory_growth_bytes_per_second < 0
        assert gpu.time_to_oom_seconds is None
        gpu = deriver.derive(noisy).gpus[0]
        assert gpu.memory_growth_bytes_per_second is not None
        assert gpu.memory_growth_bytes_per_second > 0
        assert gpu.memory_growth_fit_r2 is not None
        assert gpu.memory_growth_fit_r2 < 0.5
        assert gpu.time_to_oom_seconds is None

    def test_budget_from_override_and_disagreeing_engines(self) -> None:
        two = (
            engine(engine="0", cache_config=cache_config(gpu_memory_utilization=0.9)),
            engine(engine="1", cache_config=cache_config(gpu_memory_utilization=0.8)),
        )
        window = Window(span_s=600)
        window.push(snapshot(0.0, two, devices=(device(),)))
        derived = Deriver(DeriveSettings()).derive(window)
        assert derived.gpus[0].memory_budget_bytes is None
        assert any("different gpu_memory_utilization" in problem for problem in derived.problems)
        derived = Deriver(DeriveSettings(gpu_memory_utilization=0.5)).derive(window)
        assert derived.gpus[0].memory_budget_bytes == 40 * GIB

    def test_budget_survives_vllm_being_briefly_unreachable(self) -> None:
        window = Window(span_s=600)
        window.push(snapshot(0.0, devices=(device(),)))
        window.push(snapshot(2.0, devices=(device(),), vllm_error="down"))
        assert Deriver(DeriveSettings()).derive(window).gpus[0].memory_budget_bytes == int(80 * GIB * 0.9)

    def test_process_memory_by_owner(self) -> None:
        processes = (
            GpuProcess(pid=1, used_memory_bytes=30 * GIB, name="vllm", owner=ProcessOwner.VLLM),
            GpuProcess(pid=2, used_memory_bytes=5 * GIB, name="python", owner=ProcessOwner.OTHER),
            GpuProcess(pid=3, used_memory_bytes=None, name=None, owner=ProcessOwner.UNKNOWN),
            GpuProcess(pid=4, used_memory_bytes=2 * GIB, name=None, owner=ProcessOwner.UNKNOWN),
        )
        window = Window(span_s=600)
        window.push(snapshot(0.0, devices=(device(processes=processes),)))
        gpu = Deriver(DeriveSettings()).derive(window).gpus[0]
        assert (
            gpu.vllm_process_memory_bytes,
            gpu.other_process_memory_bytes,
            gpu.unknown_process_memory_bytes,
        ) == (
            30 * GIB,
            5 * GIB,
            2 * GIB,
        )


class TestWindow:
    def test_drops_what_is_older_than_its_span(self) -> None:
        window = Window(span_s=10)
        for t in range(0, 30, 2):
            window.push(snapshot(float(t)))
        assert [s.monotonic_s for s in window.since(-math.inf)] == [18.0, 20.0, 22.0, 24.0, 26.0, 28.0]

    def test_rejects_time_going_backwards(self) -> None:
        window = Window(span_s=10)
        window.push(snapshot(5.0))
        with pytest.raises(ValueError, match="time order"):
            window.push(snapshot(4.0))


class TestTrendAcrossRestarts:
    def _leak_then_restart(self, *, restart: dict[str, object]) -> Window:
        window = Window(span_s=600)
        for step in range(30):  # 60 s of a leak, counters climbing
            window.push(
                snapshot(
                    2.0 * step,
                    (engine(prompt_tokens_total=1000.0 * step, generation_tokens_total=100.0 * step),),
                    devices=(device(used=60 * GIB + step * 300 * 2**20),),
                )
            )
        for step in range(30, 50):  # a fresh vLLM: flat memory
            kwargs: dict[str, object] = {"devices": (device(used=62 * GIB),)}
            if step == 30:
                kwargs.update(restart)
            window.push(
                snapshot(
                    2.0 * step,
                    (engine(prompt_tokens_total=10.0 * step, generation_tokens_total=1.0 * step),),
                    **kwargs,  # type: ignore[arg-type]
                )
            )
        return window

    @pytest.mark.parametrize(
        "gone",
        [
            {"vllm_error": "connection refused", "unreachable": True, "healthy": False},
            {"vllm_error": "connection refused", "unreachable": True, "healthy": True},  # a 200 standing from before
            {"vllm_error": "timed out", "healthy": False},  # /health did not answer 200 either
            {"vllm_error": "HTTP 503", "health": HealthAnswer.FAILING},  # the engine died: its server exits next
            {"vllm_error": "timed out", "healthy": None},  # /health not asked
        ],
    )
    def test_a_poll_that_finds_vllm_gone_restarts_the_trend(self, gone: dict[str, object]) -> None:
        window = self._leak_then_restart(restart=gone)
        gpu = Deriver(DeriveSettings(min_trend_points=6, min_trend_span_s=30)).derive(window).gpus[0]
        assert gpu.memory_growth_bytes_per_second == pytest.approx(0.0, abs=1.0)
        assert gpu.time_to_oom_seconds is None

    @pytest.mark.parametrize("health", [None, HealthAnswer.NO_ANSWER])
    def test_a_slow_poll_keeps_the_trend_and_its_forecast(self, health: HealthAnswer | None) -> None:
        # A loaded vLLM answering /metrics past the timeout, with /health answering (a 200 standing) or too slow
        # as well, is the same process leaking: the trend goes on.
        window = Window(span_s=600)
        for step in range(40):
            slow: dict[str, object] = {"vllm_error": "no answer within 1.8 s", "health": health}
            kwargs: dict[str, object] = slow if step in (25, 31) else {}
            window.push(
                snapshot(
                    2.0 * step,
                    (engine(prompt_tokens_total=1000.0 * step),),
                    devices=(device(used=60 * GIB + step * 300 * 2**20),),
                    **kwargs,  # type: ignore[arg-type]
                )
            )
        gpu = Deriver(DeriveSettings(min_trend_points=6, min_trend_span_s=30)).derive(window).gpus[0]
        assert gpu.memory_growth_bytes_per_second == pytest.approx(150 * 2**20, rel=0.01)
        assert gpu.time_to_oom_seconds is not None

    def test_counters_going_backwards_restart_the_trend(self) -> None:
        # The restart fell between two polls: no failed poll, but vLLM's counters started again from zero.
        window = self._leak_then_restart(restart={})
        gpu = Deriver(DeriveSettings(min_trend_points=6, min_trend_span_s=30)).derive(window).gpus[0]
        assert gpu.memory_growth_bytes_per_second == pytest.approx(0.0, abs=1.0)
        assert gpu.time_to_oom_seconds is None

    def test_a_large_drop_in_memory_restarts_the_trend(self) -> None:
        window = Window(span_s=600)
        for step in range(50):
            used = 60 * GIB + step * 300 * 2**20 if step < 30 else 40 * GIB  # a tenant exited at 60 s
            window.push(snapshot(2.0 * step, devices=(device(used=used),)))
        gpu = Deriver(DeriveSettings(min_trend_points=6, min_trend_span_s=30)).derive(window).gpus[0]
        assert gpu.memory_growth_bytes_per_second == pytest.approx(0.0, abs=1.0)

    def test_without_a_restart_the_whole_window_counts(self) -> None:
        window = Window(span_s=600)
        for step in range(50):
            window.push(
                snapshot(
                    2.0 * step,
                    (engine(prompt_tokens_total=10.0 * step),),
                    devices=(device(used=40 * GIB + step * 2**20),),
                )
            )
        gpu = Deriver(DeriveSettings(min_trend_points=6, min_trend_span_s=30)).derive(window).gpus[0]
        assert gpu.memory_growth_bytes_per_second == pytest.approx(2**19)
