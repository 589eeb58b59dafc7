"""KV-cache blowout, concurrency misjudgement and does-not-fit, from live metrics and from logs."""

from __future__ import annotations

from sidecar.doctor.blowout import live_blowout, log_blowout
from sidecar.doctor.concurrency import live_concurrency
from sidecar.doctor.evidence import Evidence
from sidecar.doctor.finding import Cause, Finding, Severity
from sidecar.doctor.fit import live_does_not_fit, log_does_not_fit, weights_dominate
from sidecar.doctor.logfacts import LogFacts, Refusal, RefusalKind
from sidecar.doctor.setup import resolve
from sidecar.model.vllm import EngineMetrics
from tests.doctor.builders import GIB, args, cache_config, engine, evidence, gpu, gpus, live, log, reading, traffic

REQUESTS = 100
PROMPTS = [900.0] * REQUESTS  # bucket (500, 1000]
OUTPUTS = [150.0] * REQUESTS  # bucket (100, 200]: p99 prompt + output = 1,200 -> 1,280


def _flags(finding: Finding | None) -> list[tuple[str, object]]:
    assert finding is not None
    return [(r.flag, r.value) for r in finding.recommendations]


def _live(
    max_model_len: int = 32768,
    *,
    version: str = "0.32.0",
    max_tokens: list[float] | None = None,
    engines: tuple[EngineMetrics, ...] = (engine(cache_config=cache_config(kv_cache_size_tokens=40960)),),
    log_facts: LogFacts | None = None,
) -> Evidence:
    load = traffic(PROMPTS, OUTPUTS, max_tokens=max_tokens)
    return evidence(
        live_evidence=live(version=version, max_model_len=max_model_len, vllm=reading(*engines), load=load),
        log_facts=log_facts,
    )


def test_blowout_when_max_model_len_is_twice_what_p99_traffic_needs() -> None:
    ev = _live(32768)
    finding = live_blowout(ev, resolve(ev))
    assert finding is not None
    assert (finding.cause, finding.severity) == (Cause.KV_CACHE_BLOWOUT, Severity.WARNING)
    assert _flags(finding) == [("--max-model-len", 1280)]
    assert (
        "one max_model_len request can take 80% of the KV pool (40,960 tokens, vllm:cache_config_info)"
        in (finding.evidence[-1])
    )
    assert "p99 prompt 1,000 + p99 output 200 = 1,200 tokens" in finding.recommendations[0].why


def test_no_blowout_under_twice_or_with_thin_traffic() -> None:
    ev = _live(2559)
    assert live_blowout(ev, resolve(ev)) is None
    thin = evidence(live_evidence=live(max_model_len=32768, load=traffic(PROMPTS[:49], OUTPUTS[:49])))
    assert live_blowout(thin, resolve(thin)) is None


def test_blowout_warns_when_clients_ask_for_more_max_tokens_than_the_new_limit_leaves() -> None:
    ev = _live(32768, max_tokens=[4000.0] * REQUESTS)
    finding = live_blowout(ev, resolve(ev))
    assert finding is not None
    assert "clients ask for up to 5,000 max_tokens" in finding.recommendations[0].why


def _refused(refusal: Refusal, **facts: object) -> Evidence:
    return evidence(
        live_evidence=live(error="connection refused", version=None), log_facts=log(refusal=refusal, **facts)
    )


V1_REFUSAL = Refusal(
    kind=RefusalKind.MAX_LEN_EXCEEDS_KV,
    line="ValueError: To serve at least one request ...",
    max_model_len=131072,
    needed_gib=16.0,
    available_gib=6.26,
    estimated_max_len=51296,
)


def test_refused_start_recommends_vllms_estimate_rounded_to_the_block_size() -> None:
    ev = _refused(V1_REFUSAL, args=args(block_size=32))
    finding = log_blowout(ev, resolve(ev), weights_dominate=False)
    assert finding is not None
    assert finding.severity is Severity.CRITICAL
    assert _flags(finding) == [("--max-model-len", 51296)]  # 51296 is a multiple of 32 too
    ev = _refused(Refusal(kind=RefusalKind.MAX_LEN_EXCEEDS_KV, line="v0", max_model_len=8192, capacity_tokens=5000))
    assert _flags(log_blowout(ev, resolve(ev), weights_dominate=False)) == [("--max-model-len", 4992)]


def test_refused_start_offers_more_kv_memory_only_where_the_version_has_the_flag() -> None:
    facts = {"args": args(kv_cache_memory_bytes=524288, block_size=32)}
    refusal = Refusal(
        kind=RefusalKind.MAX_LEN_EXCEEDS_KV, line="x", max_model_len=2048, needed_gib=0.0, available_gib=0.0,
        estimated_max_len=992,
    )  # fmt: skip
    for version, expected in (("0.32.0", [("--max-model-len", 992), ("--kv-cache-memory-bytes", 2097152)]),
                              ("0.10.1", [("--max-model-len", 992)])):  # fmt: skip
        ev = _refused(refusal, version=version, **facts)
        assert _flags(log_blowout(ev, resolve(ev), weights_dominate=False)) == expected


def test_refused_start_offers_a_larger_budget_when_the_card_can_give_it() -> None:
    ev = evidence(
        live_evidence=live(error="refused"),
        log_facts=log(refusal=V1_REFUSAL, args=args(gpu_memory_utilization=0.3)),
        gpu_evidence=gpus(gpu(used=GIB // 2, vllm=GIB // 2)),
    )
    # 0.3 + (16.00 - 6.26) GiB / 80 GiB = 0.4218 -> 0.43
    assert _flags(log_blowout(ev, resolve(ev), weights_dominate=False)) == [
        ("--max-model-len", 51296),
        ("--gpu-memory-utilization", 0.43),
    ]
    crowded = evidence(
        live_evidence=live(error="refused"),
        log_facts=log(refusal=V1_REFUSAL, args=args(gpu_memory_utilization=0.3)),
        gpu_evidence=gpus(gpu(used=50 * GIB, others=((7, 49 * GIB, "trainer"),))),
    )
    finding = log_blowout(crowded, resolve(crowded), weights_dominate=False)
    assert _flags(finding) == [("--max-model-len", 51296)]
    assert finding is not None
    assert any("the card cannot give it" in line for line in finding.evidence)


def test_concurrency_from_max_num_seqs_in_the_log() -> None:
    ev = _live(4096, log_facts=log(args=args(max_num_seqs=64)))
    finding = live_concurrency(ev, resolve(ev))
    # 40,960 x 0.9 / 1,050 = 35.1
    assert _flags(finding) == [("--max-num-seqs", 35)]
    assert finding is not None
    assert "max_num_seqs 64 (the arguments vLLM logged at start)" in finding.evidence[3]


def test_concurrency_from_preemptions_alone_and_queued_requests_only_from_029() -> None:
    preempting = (engine(cache_config=cache_config(kv_cache_size_tokens=40960), preemptions_total=12.0),)
    # vLLM counts running + waiting against --max-num-queued-reqs: 35 running + 35 waiting.
    for version, flags in (("0.32.0", [("--max-num-seqs", 35), ("--max-num-queued-reqs", 70)]),
                           ("0.29.0", [("--max-num-seqs", 35), ("--max-num-queued-reqs", 70)]),
                           ("0.28.0", [("--max-num-seqs", 35)])):  # fmt: skip
        ev = _live(4096, version=version, engines=preempting)
        finding = live_concurrency(ev, resolve(ev))
        assert _flags(finding) == flags
        assert finding is not None
        assert "max_num_seqs unknown" in finding.evidence[3]


def test_no_concurrency_finding_when_max_num_seqs_fits_the_pool() -> None:
    ev = _live(4096, log_facts=log(args=args(max_num_seqs=48)))  # 48 < 1.5 x 39
    assert live_concurrency(ev, resolve(ev)) is None
    preempting = (engine(cache_config=cache_config(kv_cache_size_tokens=40960), preemptions_total=3.0),)
    ev = _live(4096, engines=preempting, log_facts=log(args=args(max_num_seqs=16)))
    assert live_concurrency(ev, resolve(ev)) is None, "preemptions with 16 <= 35 seqs: not max_num_seqs's doing"


def test_data_parallel_engines_use_the_per_engine_pool() -> None:
    engines = tuple(
        engine(engine=str(i), cache_config=cache_config(num_gpu_blocks_server=5120, engines_in_server=2,
                                                         block_size_tokens=16, kv_cache_size_tokens=None))
        for i in range(2)
    )  # fmt: skip
    ev = _live(4096, engines=engines, log_facts=log(args=args(max_num_seqs=64)))
    assert _flags(live_concurrency(ev, resolve(ev))) == [("--max-num-seqs", 35)]  # 5120 / 2 x 16 = 40,960


NO_CACHE = Refusal(kind=RefusalKind.NO_CACHE_MEMORY, line="ValueError: No available memory for the cache blocks.")


def test_does_not_fit_when_nothing_is_left_for_the_kv_cache() -> None:
    ev = _refused(NO_CACHE, weights_gib=75.0, available_kv_gib=-0.74, args=args(gpu_memory_utilization=0.95))
    finding = log_does_not_fit(ev, resolve(ev))
    assert finding is not None
    assert (finding.cause, finding.severity) == (Cause.DOES_NOT_FIT, Severity.CRITICAL)
    assert _flags(finding) == [("--quantization", "fp8"), ("--tensor-parallel-size", 2), ("--cpu-offload-gb", 20)]
    assert "weights take 75.00 GiB; the budget is 0.74 GiB short before any KV cache" in finding.evidence


def test_does_not_fit_when_the_kv_cache_is_a_sliver_and_max_len_does_not_fit() -> None:
    sliver = Refusal(kind=RefusalKind.MAX_LEN_EXCEEDS_KV, line="x", max_model_len=4096, needed_gib=0.5,
                     available_gib=0.26, estimated_max_len=2128)  # fmt: skip
    facts = {"weights_gib": 74.0, "available_kv_gib": 0.26}
    assert weights_dominate(log(refusal=sliver, **facts))
    ev = _refused(sliver, **facts)
    assert _flags(log_does_not_fit(ev, resolve(ev))) == [
        ("--quantization", "fp8"),
        ("--tensor-parallel-size", 2),
        ("--cpu-offload-gb", 19),  # 25 % of 74.26 - 0.26 = 18.3
        ("--kv-cache-dtype", "fp8"),
    ]
    assert log_blowout(ev, resolve(ev), weights_dominate=True) is None, "the model is the problem, not max_model_len"


def test_a_quantised_model_on_tensor_parallel_two_needs_four() -> None:
    ev = _refused(
        NO_CACHE, weights_gib=38.0, available_kv_gib=-1.0, args=args(quantization="fp8", tensor_parallel_size=2)
    )
    assert _flags(log_does_not_fit(ev, resolve(ev))) == [("--tensor-parallel-size", 4), ("--cpu-offload-gb", 11)]


def test_a_roomy_kv_cache_is_not_does_not_fit() -> None:
    assert not weights_dominate(log(weights_gib=16.0, available_kv_gib=6.26))
    assert not weights_dominate(LogFacts(lines_read=1, lines_recognised=0))
    ev = _refused(V1_REFUSAL, weights_gib=16.0, available_kv_gib=6.26)
    assert log_does_not_fit(ev, resolve(ev)) is None


def test_live_does_not_fit_when_the_pool_holds_under_two_p99_requests_at_full_utilization() -> None:
    tiny = (engine(cache_config=cache_config(kv_cache_size_tokens=2000, gpu_memory_utilization=0.95)),)
    ev = _live(4096, engines=tiny)
    finding = live_does_not_fit(ev, resolve(ev))
    assert _flags(finding) == [("--tensor-parallel-size", 2), ("--kv-cache-dtype", "fp8")]
    half = (engine(cache_config=cache_config(kv_cache_size_tokens=2000, gpu_memory_utilization=0.5)),)
    ev = _live(4096, engines=half)
    assert live_does_not_fit(ev, resolve(ev)) is None, "at 0.5 the budget can still grow"
