"""The `other` findings (prefix caching, drain on SIGTERM, block size) and how the configuration is resolved."""

from __future__ import annotations

from sidecar.doctor import hygiene
from sidecar.doctor.finding import Cause, Finding, Severity
from sidecar.doctor.logfacts import ServerArgs
from sidecar.doctor.setup import LOG_ARGS, LOG_DEFAULT, batch_defaults, resolve
from sidecar.model.vllm import MetricSchema
from tests.doctor.builders import (
    GIB,
    args,
    cache_config,
    engine,
    evidence,
    gpu,
    gpus,
    history,
    live,
    log,
    reading,
    traffic,
)

LOAD = traffic([1000.0] * 60, [100.0] * 60, latencies=[3.0] * 60)


def _flags(finding: Finding | None) -> list[tuple[str, object]]:
    assert finding is not None
    return [(r.flag, r.value) for r in finding.recommendations]


def _prefix(version: str, hits: float, queries: float, **kwargs: object) -> Finding | None:
    vllm = reading(engine(prefix_cache_hits_total=hits, prefix_cache_queries_total=queries))
    ev = evidence(live_evidence=live(version=version, vllm=vllm, load=LOAD), **kwargs)  # type: ignore[arg-type]
    return hygiene.prefix_caching(ev, resolve(ev))


def test_prefix_caching_that_does_not_pay_is_turned_off_where_the_flag_exists() -> None:
    finding = _prefix("0.32.0", 1_000.0, 60_000.0)
    assert finding is not None
    assert (finding.cause, finding.severity) == (Cause.OTHER, Severity.INFO)
    assert _flags(finding) == [("--no-enable-prefix-caching", "")]
    assert "1,000 hits / 60,000 queried tokens" in finding.evidence[1]
    old = _prefix("0.6.6", 1_000.0, 60_000.0)
    assert old is not None
    assert old.recommendations == ()
    assert "drop --enable-prefix-caching" in old.evidence[-1]


def test_prefix_caching_that_pays_or_cannot_be_judged_is_left_alone() -> None:
    assert _prefix("0.32.0", 30_000.0, 60_000.0) is None
    assert _prefix("0.32.0", 0.0, 0.0) is None
    assert _prefix("0.32.0", 30_000.0, 60_000.0, history_facts=history(hit_ratio=0.1)) is not None, "window wins"


def test_prefix_caching_off_is_not_checked() -> None:
    vllm = reading(engine(cache_config=cache_config(enable_prefix_caching=False), prefix_cache_queries_total=9.0))
    ev = evidence(live_evidence=live(vllm=vllm, load=LOAD))
    assert hygiene.prefix_caching(ev, resolve(ev)) is None


def test_v0_hit_rate_gauge() -> None:
    vllm = reading(
        engine(prefix_cache_queries_total=None, prefix_cache_hits_total=None, prefix_cache_hit_rate_gauge=0.05)
    )
    ev = evidence(live_evidence=live(version="0.6.6", vllm=vllm, load=LOAD))
    finding = hygiene.prefix_caching(ev, resolve(ev))
    assert finding is not None
    assert "vllm:gpu_prefix_cache_hit_rate" in finding.evidence[1]


def _shutdown(version: str | None, server_args: ServerArgs | None) -> Finding | None:
    ev = evidence(live_evidence=live(version=version, load=LOAD), log_facts=log(args=server_args))
    return hygiene.shutdown(ev, resolve(ev))


def test_shutdown_timeout_only_where_vllm_has_it_and_it_is_not_set() -> None:
    assert _flags(_shutdown("0.18.0", args())) == [("--shutdown-timeout", 10), ("terminationGracePeriodSeconds", 40)]
    assert _shutdown("0.17.1", args()) is None
    assert _shutdown(None, args()) is None
    assert _shutdown("0.32.0", args(shutdown_timeout=60)) is None
    assert _shutdown("0.32.0", None) is None, "without the log the setting is unknown"
    complete = ServerArgs(complete=True)  # a Namespace line without the key: unknown, not the default
    assert _shutdown("0.32.0", complete) is None


def _blocks(block_size: int, prompts: list[float], device: str | None = None) -> Finding | None:
    vllm = reading(engine(cache_config=cache_config(block_size_tokens=block_size)))
    load = traffic(prompts, [10.0] * len(prompts))
    ev = evidence(live_evidence=live(vllm=vllm, load=load), log_facts=log(device=device))
    return hygiene.block_size(ev, resolve(ev))


def test_a_coarse_block_size_with_widely_varying_lengths() -> None:
    lengths = [40.0] * 80 + [1800.0] * 20  # p50 <= 50 + 10, p99 <= 2000 + 10
    assert _flags(_blocks(128, lengths)) == [("--block-size", 16)]
    assert _blocks(16, lengths) is None
    assert _blocks(128, lengths, device="cpu") is None, "the CPU backend needs multiples of 32"
    assert _blocks(128, [1800.0] * 100) is None, "uniform lengths"


def test_resolution_prefers_metrics_then_the_log_then_known_defaults() -> None:
    ev = evidence(log_facts=log(args=args(max_num_seqs=64, gpu_memory_utilization=0.5)))
    setup = resolve(ev)
    assert setup.gpu_memory_utilization is not None
    assert setup.gpu_memory_utilization.source == "vllm:cache_config_info"
    assert setup.max_num_seqs is not None
    assert (setup.max_num_seqs.value, setup.max_num_seqs.source) == (64, LOG_ARGS)
    assert setup.max_model_len is not None
    assert setup.max_model_len.source == "GET /v1/models"
    offline = evidence(live_evidence=live(error="refused", version=None), log_facts=log(args=args(), version="0.32.0"))
    setup = resolve(offline)
    assert setup.gpu_memory_utilization is not None
    assert (setup.gpu_memory_utilization.value, setup.gpu_memory_utilization.source) == (0.9, LOG_DEFAULT)
    assert setup.shutdown_timeout is not None
    assert setup.shutdown_timeout.value == 0
    assert setup.max_num_seqs is None, "the default depends on the card, and no GPU was read"


def test_vllms_batch_defaults_by_card() -> None:
    h100 = gpu(used=GIB, name="NVIDIA H100 80GB HBM3")
    a100 = gpu(used=GIB, name="NVIDIA A100-SXM4-80GB")
    l4 = gpu(used=GIB, total=24 * GIB, name="NVIDIA L4")
    assert batch_defaults((0, 32, 0), h100) == (1024, 8192)
    assert batch_defaults((0, 32, 0), a100) == (256, 2048)
    assert batch_defaults((0, 10, 2), l4) == (256, 2048)
    assert batch_defaults((0, 6, 6), None) == (256, None)
    assert batch_defaults((0, 8, 5), h100) == (None, None), "0.8.x chose by GPU name: not modelled"
    assert batch_defaults(None, h100) == (None, None)
    ev = evidence(gpu_evidence=gpus(h100), log_facts=log(args=args(), version="0.32.0"))
    setup = resolve(ev)
    assert setup.max_num_seqs is not None
    assert setup.max_num_seqs.value == 1024


def test_pool_size_from_blocks_when_kv_cache_size_tokens_is_absent() -> None:
    v010 = reading(engine(cache_config=cache_config(num_gpu_blocks_server=2560, block_size_tokens=16,
                                                    kv_cache_size_tokens=None)), schema=MetricSchema.V1)  # fmt: skip
    setup = resolve(evidence(live_evidence=live(vllm=v010)))
    assert setup.kv_pool_tokens is not None
    assert setup.kv_pool_tokens.value == 40960
    from_log = resolve(evidence(live_evidence=live(error="x"), log_facts=log(kv_cache_tokens=4096)))
    assert from_log.kv_pool_tokens is not None
    assert from_log.kv_pool_tokens.value == 4096
