"""The arithmetic behind every recommended value, and the version table that gates the flags."""

from __future__ import annotations

import pytest

from sidecar.doctor import formula
from sidecar.doctor.versions import FLAGS, available, parse_version

GIB = 2**30


@pytest.mark.parametrize(
    ("prompt", "output", "expected"),
    [(1000, 200, 1280), (1812, 0, 2048), (2000, 500, 2560), (256, 0, 256), (1, 1, 256), (4000, 96, 4096)],
)
def test_max_model_len_is_p99_rounded_up_to_256(prompt: float, output: float, expected: int) -> None:
    computed = formula.max_model_len(prompt, output, 4210, "histograms")
    assert computed.value == expected
    assert f"-> {expected}" in computed.why
    assert "4,210 requests" in computed.why


@pytest.mark.parametrize(
    ("pool", "mean", "expected"), [(40960, 1128.0, 32), (51296, 1824.0, 25), (4096, 5000.0, 1), (444512, 1000.0, 400)]
)
def test_max_num_seqs_is_90_percent_of_the_pool_over_the_mean_request(pool: int, mean: float, expected: int) -> None:
    computed = formula.max_num_seqs(pool, mean, 100)
    assert computed.value == expected
    assert "x 0.9 headroom" in computed.why


@pytest.mark.parametrize(
    ("total", "others", "over", "expected"),
    [
        (80 * GIB, 6 * GIB, 0, 0.87),  # (80 - 6 - 4) / 80 = 0.875
        (80 * GIB, 0, 0, 0.95),
        (80 * GIB, 0, 5 * GIB, 0.88),  # (80 - 5 - 4) / 80 = 0.8875
        (int(22.05 * GIB), int(2.28 * GIB), 0, 0.84),
        (24 * GIB, 12 * GIB, 0, 0.45),
    ],
)
def test_utilization_leaves_other_tenants_the_overshoot_and_5_percent(
    total: int, others: int, over: int, expected: float
) -> None:
    computed = formula.utilization(total, others, over)
    assert computed.value == expected
    assert computed.why.endswith(f"-> {expected:.2f}")


def test_floor_hundredths_is_not_fooled_by_binary_floating_point() -> None:
    assert formula.floor_hundredths(0.87) == 0.87
    assert formula.floor_hundredths(0.8799999) == 0.87
    assert formula.floor_hundredths(0.29) == 0.29


def test_utilization_after_an_oom_in_graph_capture() -> None:
    computed = formula.utilization_for_transient(0.98, "logged", int(GIB), int(0.93 * GIB), int(79.19 * GIB))
    assert computed.value == 0.95  # 0.98 - 0.0117 - 0.01 = 0.9583
    assert "0.98 (logged) - 0.93 GiB the 1.00 GiB allocation lacked / 79.19 GiB - 1% margin" in computed.why


@pytest.mark.parametrize(
    ("total", "name", "expected"),
    [
        (80 * GIB, "NVIDIA H100 80GB HBM3", 8192),
        (80 * GIB, "NVIDIA A100-SXM4-80GB", 2048),
        (141 * GIB, "NVIDIA H200", 8192),
        (24 * GIB, "NVIDIA L4", 2048),
        (48 * GIB, None, 2048),
    ],
)
def test_batched_tokens_by_card_size_follow_vllms_own_defaults(total: int, name: str | None, expected: int) -> None:
    assert formula.card_batched_tokens(total, name).value == expected


@pytest.mark.parametrize(("p99", "expected"), [(2.0, 10), (5.0, 10), (10.0, 10), (15.0, 20), (120.0, 120), (None, 120)])
def test_shutdown_timeout_covers_the_p99_request_in_10_s_steps(p99: float | None, expected: int) -> None:
    timeout = formula.shutdown_timeout(p99, 80)
    assert timeout.value == expected
    assert formula.grace_period(int(timeout.value)).value == expected + 30


@pytest.mark.parametrize(
    ("text", "version"),
    [
        ("0.32.0", (0, 32, 0)),
        ("0.8.5.post1", (0, 8, 5)),
        ("0.10.2rc1", (0, 10, 2)),
        ("v0.6.6", (0, 6, 6)),
        ("0.22.1rc1.dev1133+g1392f3080.d20260604", (0, 22, 1)),
        ("1.0", (1, 0, 0)),
        ("", None),
        ("dev", None),
        (None, None),
    ],
)
def test_version_parsing(text: str | None, version: tuple[int, int, int] | None) -> None:
    assert parse_version(text) == version


@pytest.mark.parametrize(
    ("flag", "version", "expected"),
    [
        ("--shutdown-timeout", "0.17.1", False),
        ("--shutdown-timeout", "0.18.0", True),
        ("--shutdown-timeout", None, False),
        ("--max-num-queued-reqs", "0.28.0", False),
        ("--max-num-queued-reqs", "0.29.0", True),
        ("--cuda-graph-sizes", "0.12.0", True),
        ("--cuda-graph-sizes", "0.13.0", False),
        ("--cuda-graph-sizes", None, False),
        ("--max-cudagraph-capture-size", "0.11.0", False),
        ("--max-cudagraph-capture-size", "0.11.2", True),
        ("VLLM_ENGINE_ITERATION_TIMEOUT_S", "0.10.2", True),
        ("VLLM_ENGINE_ITERATION_TIMEOUT_S", "0.11.0", False),
        ("VLLM_ENGINE_ITERATION_TIMEOUT_S", None, False),
        ("VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS", "0.9.2", False),
        ("VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS", "0.10.0", True),
        ("--dtype", None, True),
        ("--kv-cache-memory-bytes", "0.10.1", False),
        ("--kv-cache-memory-bytes", "0.10.2", True),
        ("--no-enable-prefix-caching", "0.6.6", False),
        ("--no-enable-prefix-caching", "0.8.0", True),
        ("--max-model-len", None, True),
        ("--gpu-memory-utilization", "0.5.4", True),
    ],
)
def test_flags_are_gated_by_the_version_that_first_has_them(flag: str, version: str | None, expected: bool) -> None:
    assert available(flag, parse_version(version)) is expected


def test_every_flag_in_the_table_names_its_source() -> None:
    assert all(span.source for span in FLAGS.values())
    with pytest.raises(KeyError):
        available("--not-a-flag", (0, 32, 0))
