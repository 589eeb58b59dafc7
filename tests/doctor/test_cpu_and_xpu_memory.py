"""The doctor on backends that are not CUDA: the CPU backend's KV space, Intel GPUs' out-of-resources errors."""

from __future__ import annotations

import pytest

from sidecar.doctor.diagnose import diagnose
from sidecar.doctor.finding import Cause, Finding
from sidecar.doctor.log_parser import parse_log
from tests.doctor.builders import evidence, live

DOWN = live(error="connection refused", version=None, max_model_len=None)
WORKER = "(Worker pid=36) INFO 08-18 02:57:12 [cpu_worker.py:235] "
ENGINE = "(EngineCore pid=25) ERROR 08-18 02:57:12 [core.py:1231] "
# vllm/v1/core/kv_cache_utils.py (0.25), with the CPU backend's aside.
NO_BLOCKS = (
    "ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when "
    "initializing the engine (this flag also controls CPU memory reservation on the CPU backend, despite its name)."
)


def _findings(text: str) -> tuple[Finding, ...]:
    return diagnose(evidence(live_evidence=DOWN, log_facts=parse_log(text))).findings


def _flags(finding: Finding) -> dict[str, object]:
    return {r.flag: r.value for r in finding.recommendations}


@pytest.mark.parametrize(
    ("space", "node", "wanted"),
    [
        ("0.0", "11.65", 4),  # nothing set aside: the CPU backend's old default of 4 GiB
        ("3.0", "62.5", 6),  # some, too little: twice it
        ("4.0", "11.65", 5),  # twice would be 8, over half the node's 11.65 GiB: 5
    ],
)
def test_an_explicit_cpu_kv_space_that_holds_nothing_grows_and_the_budget_is_not_raised(
    space: str, node: str, wanted: int
) -> None:
    text = f"{WORKER}Explicitly set ({space}/{node}) GiB for KV cache on node 0.\n{ENGINE}{NO_BLOCKS}\n"
    finding = _findings(text)[0]
    assert finding.cause is Cause.CONFIGURATION_OVERSHOOT
    assert _flags(finding) == {"VLLM_CPU_KVCACHE_SPACE": wanted}, "the budget does not size an explicit space"


def test_without_an_explicit_space_the_cpu_backends_budget_is_what_to_raise() -> None:
    text = f"{WORKER}Auto set (0.0/11.65) GiB for KV cache on node 0.\n{ENGINE}{NO_BLOCKS}\n"
    flags = _flags(_findings(text)[0])
    assert "VLLM_CPU_KVCACHE_SPACE" not in flags
    assert "--gpu-memory-utilization" in flags


@pytest.mark.parametrize(
    "line",
    [
        "RuntimeError: level_zero backend failed with error: 40 (UR_RESULT_ERROR_OUT_OF_RESOURCES)",
        "RuntimeError: Worker failed with error 'level_zero backend failed with error: 39 "
        "(UR_RESULT_ERROR_OUT_OF_DEVICE_MEMORY)', please check the stack trace above for the root cause",
        "RuntimeError: Native API failed. Native API returns: -5 (PI_ERROR_OUT_OF_RESOURCES) -5 "
        "(PI_ERROR_OUT_OF_RESOURCES)",
    ],
)
def test_intel_gpus_out_of_resources_is_an_oom_on_an_xpu_with_no_sizes(line: str) -> None:
    oom = parse_log(f"(EngineCore_DP0 pid=568) ERROR 04-16 12:49:28 [core.py:936] {line}\n").oom
    assert oom is not None
    assert (oom.device, oom.tried_bytes, oom.total_bytes) == ("XPU", None, None)


def test_a_host_out_of_resources_is_not_a_device_oom() -> None:
    assert parse_log("RuntimeError: Native API returns: -6 (PI_ERROR_OUT_OF_HOST_MEMORY)\n").oom is None


def test_a_kv_refusal_on_an_explicit_cpu_space_grows_the_space_not_the_budget() -> None:
    refusal = (
        "ValueError: To serve at least one request with the models's max seq len (32768), (3.00 GiB KV cache is "
        "needed, which is larger than the available KV cache memory (1.00 GiB). Based on the available memory, the "
        "estimated maximum model length is 10912. Try increasing `gpu_memory_utilization` or decreasing "
        "`max_model_len` when initializing the engine."
    )
    text = f"{WORKER}Explicitly set (1.0/11.65) GiB for KV cache on node 0.\n{ENGINE}{refusal}\n"
    finding = _findings(text)[0]
    assert finding.cause is Cause.KV_CACHE_BLOWOUT
    # 1 GiB x 32,768 / 10,912 = 3.003 -> 4 GiB, within half of 11.65
    assert _flags(finding) == {"--max-model-len": 10912, "VLLM_CPU_KVCACHE_SPACE": 4}
