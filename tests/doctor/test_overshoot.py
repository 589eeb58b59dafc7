"""Configuration overshoot, live (GPUs + the daemon's trend) and from a log (start refusal, CUDA OOM)."""

from __future__ import annotations

from sidecar.doctor.diagnose import diagnose
from sidecar.doctor.finding import Cause, Finding, Severity
from sidecar.doctor.log_memory import log_memory
from sidecar.doctor.logfacts import CudaOom, OomPhase, Refusal, RefusalKind
from sidecar.doctor.overshoot import allocator_fragmentation, live_overshoot
from sidecar.doctor.setup import resolve
from tests.doctor.builders import GIB, args, evidence, gpu, gpu_status, gpus, history, live, log

TENANT = (31337, 6 * GIB, "python train.py")


def _live(*devices: object, **kwargs: object) -> Finding | None:
    ev = evidence(gpu_evidence=gpus(*devices), **kwargs)  # type: ignore[arg-type]
    return live_overshoot(ev, resolve(ev))


def _flags(finding: Finding | None) -> list[tuple[str, object]]:
    assert finding is not None
    return [(r.flag, r.value) for r in finding.recommendations]


def test_vllm_within_its_budget_alone_on_the_card_is_fine() -> None:
    assert _live(gpu(used=72 * GIB)) is None
    assert _live(gpu(used=60 * GIB)) is None


def test_another_tenant_takes_what_the_budget_needs() -> None:
    finding = _live(gpu(used=int(76.75 * GIB), others=(TENANT,)))
    assert finding is not None
    assert (finding.cause, finding.severity) == (Cause.CONFIGURATION_OVERSHOOT, Severity.CRITICAL)
    assert _flags(finding) == [("--gpu-memory-utilization", 0.87)]
    assert "another process on GPU 0: pid 31337 'python train.py' holds 6.00 GiB" in finding.evidence
    assert any("3.25 GiB free (4.1% < the 5% reserve)" in line for line in finding.evidence)


def test_a_tenant_that_still_leaves_the_reserve_free_is_a_warning() -> None:
    finding = _live(gpu(used=int(60.5 * GIB), vllm=int(54.5 * GIB), others=(TENANT,)), live_evidence=None)
    # 0.9 x 80 budget + 6 GiB tenant = 78 GiB > 76 GiB: when vLLM fills its budget the reserve is gone.
    assert finding is not None
    assert finding.severity is Severity.WARNING
    assert _flags(finding) == [("--gpu-memory-utilization", 0.87)]


def test_vllm_beyond_its_budget_gets_a_lower_budget_and_expandable_segments() -> None:
    finding = _live(gpu(used=77 * GIB))  # 5 GiB beyond 72
    assert finding is not None
    assert finding.severity is Severity.CRITICAL
    assert _flags(finding) == [
        ("--gpu-memory-utilization", 0.88),
        ("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True"),
    ]
    assert "vLLM's processes hold 77.00 GiB: 5.00 GiB beyond its budget" in finding.evidence


def test_over_budget_below_the_tolerance_is_noise() -> None:
    assert _live(gpu(used=int(73.5 * GIB))) is None  # 1.5 GiB over, under 2 % of 80 GiB (1.6 GiB)


def test_batched_tokens_are_cut_to_the_cards_default_when_set_above_it() -> None:
    finding = _live(gpu(used=77 * GIB), log_facts=log(args=args(max_num_batched_tokens=32768)))
    assert ("--max-num-batched-tokens", 8192) in _flags(finding)
    finding = _live(gpu(used=77 * GIB), log_facts=log(args=args(max_num_batched_tokens=8192)))
    assert all(flag != "--max-num-batched-tokens" for flag, _ in _flags(finding))


def test_a_growing_memory_trend_from_the_daemon_is_a_leak_not_overshoot() -> None:
    trend = gpu_status(
        0,
        memory_growth_bytes_per_second=32 * 2**20,
        memory_growth_fit_r2=0.99,
        time_to_oom_seconds=250.0,
        memory_total_bytes=80 * GIB,
        memory_used_bytes=71 * GIB,
        memory_budget_bytes=72 * GIB,
        vllm_process_memory_bytes=71 * GIB,
        other_process_memory_bytes=0,
    )
    ev = evidence(gpu_evidence=gpus(gpu(used=71 * GIB)), history_facts=history(trend, restarts=(("oom_forecast", 2),)))
    assert live_overshoot(ev, resolve(ev)) is None
    (finding,) = [f for f in diagnose(ev).findings if f.cause is not Cause.OTHER]
    assert (finding.cause, finding.severity) == (Cause.MEMORY_LEAK, Severity.CRITICAL)
    assert _flags(finding) == [("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")]
    assert any("memory grows 32.00 MiB/s = 112.50 GiB/h" in line for line in finding.evidence)
    assert any("restarted vLLM 2 times on its OOM forecast" in line for line in finding.evidence)


def test_memory_over_budget_that_keeps_growing_is_no_overshoot_and_without_a_trend_it_is() -> None:
    growing = gpu_status(
        0, memory_growth_bytes_per_second=32 * 2**20, memory_growth_fit_r2=0.9, time_to_oom_seconds=100.0
    )
    assert _live(gpu(used=77 * GIB), history_facts=history(growing)) is None
    finding = _live(gpu(used=77 * GIB))
    assert finding is not None
    assert finding.cause is Cause.CONFIGURATION_OVERSHOOT
    assert ("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True") in _flags(finding)


def test_a_noisy_trend_is_not_evidence() -> None:
    trend = gpu_status(0, memory_growth_bytes_per_second=32 * 2**20, memory_growth_fit_r2=0.2, time_to_oom_seconds=None)
    assert _live(gpu(used=71 * GIB), history_facts=history(trend)) is None


def test_unknown_utilization_still_reports_a_tenant_eating_the_reserve() -> None:
    from tests.doctor.builders import cache_config, engine, live, reading

    unknown = live(vllm=reading(engine(cache_config=cache_config(gpu_memory_utilization=None))))
    finding = _live(gpu(used=78 * GIB, others=(TENANT,)), live_evidence=unknown)
    assert finding is not None
    assert finding.recommendations == ()
    assert any("gpu_memory_utilization is unknown" in line for line in finding.evidence)


def test_no_gpu_reading_no_live_finding() -> None:
    ev = evidence()
    assert live_overshoot(ev, resolve(ev)) is None


def _from_log(**facts: object) -> Finding | None:
    """A log of a vLLM that is not running: nothing live to read."""
    ev = evidence(live_evidence=live(error="connection refused"), log_facts=log(**facts))
    return log_memory(ev, resolve(ev))


def test_start_refused_for_free_memory() -> None:
    refusal = Refusal(
        kind=RefusalKind.INSUFFICIENT_FREE_MEMORY,
        line="ValueError: Free memory on device ...",
        free_gib=18.40,
        total_gib=23.53,
        utilization=0.9,
        requested_gib=21.18,
    )
    finding = _from_log(refusal=refusal)
    assert finding is not None
    assert finding.severity is Severity.CRITICAL
    assert _flags(finding) == [("--gpu-memory-utilization", 0.73)]  # (18.40 - 1.18) / 23.53 = 0.732


def _oom(phase: OomPhase, **overrides: object) -> CudaOom:
    """PyTorch's numbers as they add up on a real card: this process + the other processes + free = the total
    (what else the card holds is another process's, listed or not)."""
    values: dict[str, object] = {
        "phase": phase,
        "tried_bytes": 2 * GIB,
        "gpu": 0,
        "total_bytes": 80 * GIB,
        "free_bytes": GIB // 2,
        "reserved_unallocated_bytes": 3 * GIB,
        "other_processes": (),
    }
    values.update(overrides)
    others = sum(size for _, size in values["other_processes"])  # type: ignore[attr-defined]
    values.setdefault("process_bytes", values["total_bytes"] - values["free_bytes"] - others)  # type: ignore[operator]
    return CudaOom(**values)  # type: ignore[arg-type]


def test_oom_while_serving_with_another_process_on_the_card() -> None:
    oom = _oom(OomPhase.SERVING, other_processes=((31337, 6 * GIB),))  # vLLM holds 73.5 GiB
    finding = _from_log(oom=oom, args=args(gpu_memory_utilization=0.9))
    assert _flags(finding) == [
        ("--gpu-memory-utilization", 0.87),
        ("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True"),  # 3 GiB reserved but unallocated
    ]


def test_oom_within_the_budget_and_no_fragmentation_lowers_the_budget_by_the_shortfall() -> None:
    # The default 0.9; the 2 GiB allocation lacked 1.5 GiB beyond the 0.5 GiB free: 0.9 - 1.5/80 - 0.01 = 0.87125.
    finding = _from_log(oom=_oom(OomPhase.SERVING, reserved_unallocated_bytes=0), args=args())
    assert _flags(finding) == [("--gpu-memory-utilization", 0.87)]


def test_oom_while_serving_beyond_the_budget_numbers() -> None:
    # However far beyond its budget vLLM's process was, the budget must give up what the allocation lacked.
    for held in (76, 78):
        oom = _oom(OomPhase.SERVING, process_bytes=held * GIB, reserved_unallocated_bytes=0)
        finding = _from_log(oom=oom, args=args())
        assert _flags(finding) == [("--gpu-memory-utilization", 0.87)]
        assert finding is not None
        assert f"at the error vLLM's process held {held}.00 GiB" in " ".join(finding.evidence)


def test_oom_with_stranded_memory_that_would_have_held_it_is_allocator_fragmentation() -> None:
    oom = _oom(OomPhase.SERVING, reserved_unallocated_bytes=3 * GIB)  # 1.5 GiB short, 3 GiB stranded
    finding = _from_log(oom=oom, args=args())
    assert finding is not None
    assert finding.cause is Cause.ALLOCATOR_FRAGMENTATION
    assert _flags(finding) == [("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")]
    small = _from_log(oom=_oom(OomPhase.SERVING, reserved_unallocated_bytes=GIB), args=args())  # 1 < 1.5 short
    assert small is not None
    assert small.cause is Cause.CONFIGURATION_OVERSHOOT


def test_the_fragmentation_rule_takes_bare_numbers() -> None:
    assert (
        allocator_fragmentation(reserved_unallocated_bytes=200 * 2**20, failed_allocation_bytes=0, total_bytes=None)
        is None
    )
    found = allocator_fragmentation(reserved_unallocated_bytes=8 * GIB, failed_allocation_bytes=0, total_bytes=80 * GIB)
    assert found is not None
    assert found.severity is Severity.WARNING


def test_oom_in_graph_capture_lowers_the_budget_by_the_shortfall_or_goes_eager() -> None:
    oom = _oom(OomPhase.GRAPH_CAPTURE, tried_bytes=int(1.5 * GIB), free_bytes=GIB // 2)
    finding = _from_log(oom=oom, args=args(gpu_memory_utilization=0.98))
    assert finding is not None
    assert "capturing CUDA graphs" in finding.summary
    assert _flags(finding) == [("--gpu-memory-utilization", 0.95), ("--enforce-eager", "")]  # 0.98-0.0125-0.01


def test_oom_in_the_profile_run_halves_the_dummy_batch() -> None:
    profiling = _oom(OomPhase.PROFILING, reserved_unallocated_bytes=0)
    finding = _from_log(oom=profiling, args=args(max_num_batched_tokens=16384))
    assert _flags(finding) == [("--max-num-batched-tokens", 8192)]
    assert finding is not None
    assert "gpu_memory_utilization does not cap the profile run" in " ".join(finding.evidence)
    # Another process holding 10 GiB: the budget must first fit beside it, (80 - 10 - 4) / 80 = 0.825.
    finding = _from_log(
        oom=_oom(OomPhase.PROFILING, other_processes=((7, 10 * GIB),), reserved_unallocated_bytes=0),
        args=args(max_num_batched_tokens=300),
    )
    assert _flags(finding) == [("--gpu-memory-utilization", 0.82)]


def test_oom_in_the_profile_run_never_lowers_the_budget() -> None:
    for facts in ({}, {"args": args(max_num_seqs=1024)}):
        finding = _from_log(oom=_oom(OomPhase.PROFILING, reserved_unallocated_bytes=0), **facts)
        assert finding is not None
        assert "--gpu-memory-utilization" not in dict(_flags(finding))
    finding = _from_log(oom=_oom(OomPhase.PROFILING, reserved_unallocated_bytes=0))
    assert finding is not None
    assert finding.recommendations == ()
    assert finding.steps
    assert "neither max_num_batched_tokens nor max_num_seqs" in finding.steps[0]


def test_nothing_in_the_log_about_memory_is_no_finding() -> None:
    assert _from_log() is None


def test_oom_in_the_profile_run_with_stranded_memory_shrinks_the_batch_first() -> None:
    """The profile run's dummy batch is the configuration's own choice: fewer batched tokens first, the allocator's
    expandable segments beside it (3 GiB stranded >= the 1.5 GiB it lacked)."""
    finding = _from_log(oom=_oom(OomPhase.PROFILING), args=args(max_num_batched_tokens=16384))
    assert finding is not None
    assert finding.cause is Cause.CONFIGURATION_OVERSHOOT
    assert _flags(finding) == [
        ("--max-num-batched-tokens", 8192),
        ("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True"),
    ]
