"""tpu-inference's memory lines: the device's HBM from its start lines, and its own refusal of a budget below what
is resident. Lines as tpu-inference (vLLM's TPU backend) prints them (tpu_worker.py, its ValueError); the amounts
are made up."""

from __future__ import annotations

from sidecar.doctor.diagnose import diagnose
from sidecar.doctor.finding import Cause, Finding
from sidecar.doctor.log_parser import parse_log
from tests.doctor.builders import evidence, live

DOWN = live(error="connection refused", version=None, max_model_len=None)
CORE = "(EngineCore_DP0 pid=7) "
DEVICES = ", ".join(["(0.0, 94.75)"] * 4)


def _finding(text: str) -> Finding:
    return diagnose(evidence(live_evidence=DOWN, log_facts=parse_log(text))).findings[0]


def test_the_devices_hbm_sizes_a_transients_step_below_a_stated_budget() -> None:
    log = "\n".join(
        [
            "(APIServer pid=5) INFO 11-14 16:36:46 [utils.py:253] non-default args: {'model': 'm', "
            "'gpu_memory_utilization': 0.98}",
            f"{CORE}INFO 11-14 16:36:58 [tpu_worker_jax.py:152] Init worker | rank=0 | hbm=[{DEVICES}]GiB",
            f"{CORE}ERROR 11-14 16:38:29 [core.py:855] jax.errors.JaxRuntimeError: RESOURCE_EXHAUSTED: Error "
            "allocating device buffer: Attempting to allocate 2.00G. That was not possible. There are 1.00G free.; "
            "(0x0x0_HBM0)",
        ]
    )
    assert parse_log(log).tpu_devices == 4
    finding = _finding(log)
    assert finding.cause is Cause.CONFIGURATION_OVERSHOOT
    # 0.98 - 1.00 GiB / 94.75 GiB - 0.01 = 0.9594 -> 0.95
    assert {r.flag: r.value for r in finding.recommendations} == {"--gpu-memory-utilization": 0.95}


def test_its_refusal_of_a_budget_below_the_weights_raises_the_budget_past_them() -> None:
    line = (
        f"{CORE}ValueError: total_hbm_used_gb=647.4GiB exceeds total_hbm_limit_gb=606.37GiB by 41.02GiB. Please "
        "consider increasing --gpu-memory-utilization from 0.8 to a larger value."
    )
    finding = _finding(line)
    assert finding.cause is Cause.CONFIGURATION_OVERSHOOT
    raised = {r.flag: r.value for r in finding.recommendations}["--gpu-memory-utilization"]
    # the weights alone are 647.4 / (606.37 / 0.8) = 0.854 of the HBM: above that, with room for a KV cache
    assert isinstance(raised, float)
    assert 0.86 <= raised <= 0.95


def test_its_later_wording_and_weights_near_the_devices_size_raise_the_budget_to_an_xla_devices_ceiling() -> None:
    """Later tpu-inference names the limit `total_hbm_limit_cap_gb`. Weights at 96 % of each device would not fit
    a GPU beside its CUDA context, but an XLA device has none: the budget goes past them, up to 0.98."""
    devices = ", ".join(["(91.4, 94.75)"] * 8)
    log = "\n".join(
        [
            f"{CORE}INFO 04-30 20:12:40 [tpu_jax_runner.py:498] Init model | hbm=[{devices}]GiB",
            f"{CORE}ERROR 04-30 20:12:44 [core.py:1136] ValueError: total_hbm_used_gb=731.21GiB exceeds "
            "total_hbm_limit_cap_gb=718.55GiB by 12.66GiB. Please consider increasing --gpu-memory-utilization "
            "from 0.948 to a larger value.",
        ]
    )
    finding = _finding(log)
    assert finding.cause is Cause.CONFIGURATION_OVERSHOOT
    # 731.21 / 757.97 = 0.965 of the HBM is resident; 5 % more for a KV cache is past the device's 0.98
    assert {r.flag: r.value for r in finding.recommendations} == {"--gpu-memory-utilization": 0.98}


def test_weights_past_an_xla_devices_ceiling_do_not_fit() -> None:
    devices = ", ".join(["(93.5, 94.75)"] * 8)
    log = "\n".join(
        [
            f"{CORE}INFO 04-30 20:12:40 [tpu_jax_runner.py:498] Init model | hbm=[{devices}]GiB",
            f"{CORE}ValueError: total_hbm_used_gb=748.0GiB exceeds total_hbm_limit_cap_gb=718.55GiB by 29.45GiB. "
            "Please consider increasing --gpu-memory-utilization from 0.948 to a larger value.",
        ]
    )
    finding = _finding(log)
    assert finding.cause is Cause.DOES_NOT_FIT
    assert "--gpu-memory-utilization" not in {r.flag for r in finding.recommendations}


def test_a_programs_reservation_that_fails_while_weights_load_sizes_more_devices_from_what_was_held() -> None:
    """XLA reserves a compiled program's space (RuntimeProgramAllocationFailure, its sizes on the next line). libtpu
    gives a device to one process, so what was not free was the load's own: 94.75 - 0.17 GiB held, + 1.04 asked."""
    devices = ", ".join(["(0.0, 94.75)"] * 8)
    error = f"{CORE}ERROR 05-13 18:59:36 [core.py:1136] "
    log = "\n".join(
        [
            "INFO 05-13 18:46:19 [utils.py:233] non-default args: {'model': 'm', 'tensor_parallel_size': 8, "
            "'gpu_memory_utilization': 0.978}",
            f"{CORE}INFO 05-13 18:46:27 [tpu_worker.py:305] Init worker | rank=0 | hbm=[{devices}]GiB",
            f"{error}Traceback (most recent call last):",
            f'{error}  File "/opt/tpu_inference/runner/tpu_runner.py", line 480, in load_model',
            f"{error}    self.model_fn = get_model(self.vllm_config)",
            f'{error}  File "/opt/tpu_inference/layers/quantization/moe.py", line 211, in '
            "process_weights_after_loading",
            f"{error}    w13 = shard_moe_weights(w13, mesh)",
            f"{error}jax.errors.JaxRuntimeError: RESOURCE_EXHAUSTED: E0101: RuntimeProgramAllocationFailure:",
            f"{error}Error loading program 'jit__unnamed_function': Attempting to reserve 1.04G at the bottom of "
            "memory. That was not possible. There are 176.58M free, 0B reserved, and 176.58M reservable.",
        ]
    )
    oom = parse_log(log).oom
    assert oom is not None
    assert (oom.tried_bytes, oom.free_bytes) == (int(1.04 * 2**30), int(176.58 * 2**20))
    finding = _finding(log)
    assert finding.cause is Cause.DOES_NOT_FIT
    # (94.75 - 0.17 + 1.04) GiB x 8 devices = 764.9 GiB: 16 devices hold 47.8 GiB each, under 75 % of 94.75
    assert {r.flag: r.value for r in finding.recommendations}["--tensor-parallel-size"] == 16
