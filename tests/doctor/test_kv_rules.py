"""KV-cache blowout, concurrency misjudgement and does-not-fit, from live metrics and from logs (the log's
refusals through the memory ledger, `log_memory`)."""

from __future__ import annotations

from sidecar.doctor.blowout import live_blowout
from sidecar.doctor.concurrency import live_concurrency
from sidecar.doctor.evidence import Evidence
from sidecar.doctor.finding import Cause, Finding, Severity
from sidecar.doctor.fit import live_does_not_fit
from sidecar.doctor.log_memory import log_memory
from sidecar.doctor.logfacts import LogFacts, MemoryProfile, Refusal, RefusalKind
from sidecar.doctor.setup import resolve
from sidecar.model.vllm import EngineMetrics
from tests.doctor.builders import GIB, args, cache_config, engine, evidence, gpu, gpus, live, log, reading, traffic

REQUESTS = 100
PRESSED = (engine(cache_config=cache_config(kv_cache_size_tokens=40960), preemptions_total=3.0),)
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
    ev = _live(32768, engines=PRESSED)
    finding = live_blowout(ev, resolve(ev))
    assert finding is not None
    assert (finding.cause, finding.severity) == (Cause.KV_CACHE_BLOWOUT, Severity.WARNING)
    assert _flags(finding) == [("--max-model-len", 1280)]
    assert (
        "one max_model_len request can take 80% of the KV pool (40,960 tokens, vllm:cache_config_info)"
        in finding.evidence[-2]
    )
    assert finding.evidence[-1] == (
        "and the KV cache is under pressure: 3 preemptions since vLLM started (vllm:num_preemptions_total)"
    )
    assert "p99 prompt 1,000 + p99 output 200 = 1,200 tokens" in finding.recommendations[0].why


def test_no_blowout_on_a_healthy_server_however_long_the_limit() -> None:
    """A long max_model_len that short requests never fill costs nothing: shortening it would only refuse the
    longer prompts to come. Advice needs harm: preemptions, requests waiting, a KV cache near full."""
    healthy = (engine(cache_config=cache_config(kv_cache_size_tokens=40960), kv_cache_usage_ratio=0.3),)
    ev = _live(32768, engines=healthy)
    assert live_blowout(ev, resolve(ev)) is None
    for pressure in ({"requests_waiting": 2.0}, {"kv_cache_usage_ratio": 0.85}, {"preemptions_total": 1.0}):
        engines = (engine(cache_config=cache_config(kv_cache_size_tokens=40960), **pressure),)
        ev = _live(32768, engines=engines)
        assert _flags(live_blowout(ev, resolve(ev))) == [("--max-model-len", 1280)], pressure


def test_no_blowout_under_twice_or_with_thin_traffic() -> None:
    ev = _live(2559, engines=PRESSED)
    assert live_blowout(ev, resolve(ev)) is None
    thin = evidence(live_evidence=live(max_model_len=32768, load=traffic(PROMPTS[:49], OUTPUTS[:49])))
    assert live_blowout(thin, resolve(thin)) is None


def test_blowout_warns_when_clients_ask_for_more_max_tokens_than_the_new_limit_leaves() -> None:
    ev = _live(32768, max_tokens=[4000.0] * REQUESTS, engines=PRESSED)
    finding = live_blowout(ev, resolve(ev))
    assert finding is not None
    assert "clients ask for up to 5,000 max_tokens" in finding.recommendations[0].why


def _refused(refusal: Refusal, **facts: object) -> Evidence:
    return evidence(
        live_evidence=live(error="connection refused", version=None), log_facts=log(refusal=refusal, **facts)
    )


def _reading(ev: Evidence) -> Finding | None:
    return log_memory(ev, resolve(ev))


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
    finding = _reading(ev)
    assert finding is not None
    assert (finding.cause, finding.severity) == (Cause.KV_CACHE_BLOWOUT, Severity.CRITICAL)
    assert _flags(finding) == [("--max-model-len", 51296)]  # 51296 is a multiple of 32 too
    ev = _refused(Refusal(kind=RefusalKind.MAX_LEN_EXCEEDS_KV, line="v0", max_model_len=8192, capacity_tokens=5000))
    # fp8 halves a token's KV: 2 x 5,000 >= 8,192 fits one max_model_len request again.
    assert _flags(_reading(ev)) == [("--max-model-len", 4992), ("--kv-cache-dtype", "fp8")]


def test_refused_start_offers_more_kv_memory_only_where_the_version_has_the_flag() -> None:
    facts = {"args": args(kv_cache_memory_bytes=524288, block_size=32)}
    refusal = Refusal(
        kind=RefusalKind.MAX_LEN_EXCEEDS_KV, line="x", max_model_len=2048, needed_gib=0.0, available_gib=0.0,
        estimated_max_len=992,
    )  # fmt: skip
    for version, expected in (("0.32.0", [("--max-model-len", 992), ("--kv-cache-memory-bytes", 2097152)]),
                              ("0.10.1", [("--max-model-len", 992)])):  # fmt: skip
        ev = _refused(refusal, version=version, **facts)
        assert _flags(_reading(ev)) == expected


def test_refused_start_offers_a_larger_budget_when_the_card_can_give_it() -> None:
    ev = evidence(
        live_evidence=live(error="refused"),
        log_facts=log(refusal=V1_REFUSAL, args=args(gpu_memory_utilization=0.3)),
        gpu_evidence=gpus(gpu(used=GIB // 2, vllm=GIB // 2)),
    )
    # 0.3 + (16.00 - 6.26) GiB / 80 GiB = 0.4218 -> 0.43
    assert _flags(_reading(ev)) == [("--max-model-len", 51296), ("--gpu-memory-utilization", 0.43)]
    crowded = evidence(
        live_evidence=live(error="refused"),
        log_facts=log(refusal=V1_REFUSAL, args=args(gpu_memory_utilization=0.3)),
        gpu_evidence=gpus(gpu(used=50 * GIB, others=((7, 49 * GIB, "trainer"),))),
    )
    finding = _reading(crowded)
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


def _profile(total_gib: float, utilization: float, weights_gib: float, kv_gib: float) -> MemoryProfile:
    """V0's memory-profiling lines: the card, the budget, the weights and what is left for the KV cache."""
    return MemoryProfile(
        total_gib=total_gib,
        utilization=utilization,
        budget_gib=total_gib * utilization,
        weights_gib=weights_gib,
        activation_gib=1.0,
        non_torch_gib=0.5,
        kv_gib=kv_gib,
    )


def test_does_not_fit_when_the_weights_fill_the_card() -> None:
    profile = _profile(80.0, 0.95, 75.0, -0.74)
    ev = _refused(
        NO_CACHE, weights_gib=75.0, available_kv_gib=-0.74, profile=profile, args=args(gpu_memory_utilization=0.95)
    )
    finding = _reading(ev)
    assert finding is not None
    assert (finding.cause, finding.severity) == (Cause.DOES_NOT_FIT, Severity.CRITICAL)
    # 75 / 2 = 37.5 <= 0.75 x 80; 75 - 0.75 x 80 = 15 GiB offloaded; fp8 only on a card known to run it.
    assert _flags(finding) == [("--tensor-parallel-size", 2), ("--cpu-offload-gb", 15)]
    assert "--gpu-memory-utilization" not in dict(_flags(finding))


def test_fp8_weights_only_where_they_fit_and_the_card_runs_them() -> None:
    """Half of 16-bit weights must fit 75 % of the card, and the card must be one fp8 runs on: a T4 or a V100
    cannot, and weights already 8- or 4-bit do not halve again."""
    profile = _profile(80.0, 0.95, 75.0, -0.74)

    def fp8(card: str, **facts: object) -> object:
        values: dict[str, object] = {"weights_gib": 75.0, "available_kv_gib": -0.74, "profile": profile}
        values.update(facts)
        ev = evidence(
            live_evidence=live(error="connection refused", version=None),
            log_facts=log(refusal=NO_CACHE, args=args(gpu_memory_utilization=0.95), **values),
            gpu_evidence=gpus(gpu(name=card, used=GIB // 2, vllm=GIB // 2)),
        )
        return dict(_flags(_reading(ev))).get("--quantization")

    assert fp8("NVIDIA H100 80GB HBM3", dtype="torch.bfloat16") == "fp8"  # 37.5 <= 0.75 x 80
    assert fp8("Tesla V100-SXM2-32GB", dtype="torch.bfloat16") is None, "no fp8 on Volta"
    assert fp8("NVIDIA H100 80GB HBM3") is None, "the weights' precision is not stated"
    assert fp8("NVIDIA H100 80GB HBM3", dtype="torch.bfloat16", model="Qwen/Qwen2.5-72B-Instruct-FP8") is None


def test_weights_that_fit_with_no_kv_room_raise_the_budget_not_the_gpu_count() -> None:
    # 14 GiB of weights on a 24 GiB card at 0.5: the budget (12 GiB) is what is short, not the card.
    profile = _profile(24.0, 0.5, 14.0, -3.5)
    ev = _refused(
        NO_CACHE, weights_gib=14.0, available_kv_gib=-3.5, profile=profile, args=args(gpu_memory_utilization=0.5)
    )
    finding = _reading(ev)
    assert finding is not None
    assert finding.cause is Cause.CONFIGURATION_OVERSHOOT
    # (12 + 3.5) GiB / 24 GiB + 0.05 = 0.6958 -> 0.70
    assert _flags(finding) == [("--gpu-memory-utilization", 0.7)]
    assert not {"--tensor-parallel-size", "--quantization", "--cpu-offload-gb"} & set(dict(_flags(finding)))


def test_a_budget_that_the_activations_eat_halves_the_sequences() -> None:
    # 1024 sequences' activations take 10 GiB of a 0.9 x 80 = 72 GiB budget beside 60 GiB of weights.
    profile = MemoryProfile(
        total_gib=80.0, utilization=0.9, budget_gib=72.0, weights_gib=55.0, activation_gib=20.0, non_torch_gib=0.5,
        kv_gib=-3.5,
    )  # fmt: skip
    ev = _refused(NO_CACHE, weights_gib=55.0, available_kv_gib=-3.5, profile=profile, args=args(max_num_seqs=1024))
    flags = dict(_flags(_reading(ev)))
    assert flags["--max-num-seqs"] == 512
    assert "--tensor-parallel-size" not in flags


def test_a_kv_cache_that_still_holds_a_request_is_a_blowout_whatever_the_weights_take() -> None:
    """74 GiB of weights beside 0.26 GiB of KV cache: the cache still holds 2,128 tokens, so max_model_len 2,128
    starts vLLM; a cache under 256 tokens is the model's or the budget's problem instead."""
    sliver = Refusal(kind=RefusalKind.MAX_LEN_EXCEEDS_KV, line="x", max_model_len=4096, needed_gib=0.5,
                     available_gib=0.26, estimated_max_len=2128)  # fmt: skip
    profile = _profile(80.0, 0.95, 74.0, 0.26)
    finding = _reading(_refused(sliver, weights_gib=74.0, available_kv_gib=0.26, profile=profile))
    assert finding is not None
    assert finding.cause is Cause.KV_CACHE_BLOWOUT
    assert _flags(finding)[0] == ("--max-model-len", 2128)
    tiny = Refusal(kind=RefusalKind.MAX_LEN_EXCEEDS_KV, line="x", max_model_len=4096, needed_gib=0.5,
                   available_gib=0.01, estimated_max_len=160)  # fmt: skip
    finding = _reading(
        _refused(tiny, weights_gib=74.0, available_kv_gib=0.01, profile=_profile(80.0, 0.95, 74.0, 0.01))
    )
    assert finding is not None
    assert finding.cause is Cause.DOES_NOT_FIT, "74 of 80 GiB: the weights leave no KV cache"


def test_a_quantised_model_on_tensor_parallel_two_needs_four() -> None:
    profile = _profile(48.0, 0.9, 44.0, -1.0)
    ev = _refused(
        NO_CACHE,
        weights_gib=44.0,
        available_kv_gib=-1.0,
        profile=profile,
        args=args(quantization="fp8", tensor_parallel_size=2),
    )
    # 2 x 44 = 88 GiB over 4 GPUs = 22 <= 0.75 x 48; 44 - 36 = 8 GiB offloaded.
    assert _flags(_reading(ev)) == [("--tensor-parallel-size", 4), ("--cpu-offload-gb", 8)]


def test_a_roomy_kv_cache_is_not_does_not_fit() -> None:
    finding = _reading(_refused(V1_REFUSAL, weights_gib=16.0, available_kv_gib=6.26))
    assert finding is not None
    assert finding.cause is Cause.KV_CACHE_BLOWOUT


def test_live_does_not_fit_when_the_pool_holds_under_two_p99_requests_at_full_utilization() -> None:
    tiny = (engine(cache_config=cache_config(kv_cache_size_tokens=2000, gpu_memory_utilization=0.95)),)
    ev = _live(4096, engines=tiny)
    finding = live_does_not_fit(ev, resolve(ev))
    assert _flags(finding) == [("--tensor-parallel-size", 2), ("--kv-cache-dtype", "fp8")]
    half = (engine(cache_config=cache_config(kv_cache_size_tokens=2000, gpu_memory_utilization=0.5)),)
    ev = _live(4096, engines=half)
    assert live_does_not_fit(ev, resolve(ev)) is None, "at 0.5 the budget can still grow"
