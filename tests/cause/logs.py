"""vLLM logs for the crash-cause tests: a CUDA OOM death as the simulator prints vLLM 0.32's (its witness of
vLLM's formats), and the real vLLM 0.32 logs the doctor's tests keep (a refused start, a good start)."""

from __future__ import annotations

from pathlib import Path

from sidecar.sim.config import GIB, MIB, SimConfig, VllmVersion
from sidecar.sim.logs import death_lines, preamble_lines
from sidecar.sim.memory import OutOfMemory
from sidecar.sim.records import GpuProcessState

DOCTOR_LOGS = Path(__file__).parents[1] / "doctor" / "logs"
REFUSED = (DOCTOR_LOGS / "vllm-0.32-cpu-refused.log").read_text()  # max_model_len 2048 > KV cache: 992 tokens
STARTED = (DOCTOR_LOGS / "vllm-0.32-cpu-started.log").read_text()
WALL_S = 1_795_000_000.0

# 80 GiB card, vLLM at gpu_memory_utilization 0.9 holding 73 GiB, another process 6 GiB: the doctor says
# --gpu-memory-utilization 0.87 and expandable segments (3 GiB reserved but unallocated).
_OOM = OutOfMemory(
    gpu=0,
    tried_bytes=2 * GIB,
    total_bytes=80 * GIB,
    free_bytes=512 * MIB,
    process_bytes=73 * GIB,
    allocated_bytes=70 * GIB,
    reserved_unallocated_bytes=3 * GIB,
    other_processes=(GpuProcessState(pid=31337, name="python train.py", used_bytes=6 * GIB),),
)
OOM_CAUSE = "configuration_overshoot"
OOM_FLAGS = ("--gpu-memory-utilization 0.87", "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True")
REFUSED_CAUSE = "kv_cache_blowout"
REFUSED_FLAGS = ("--max-model-len 992", "--kv-cache-memory-bytes 2097152")


def oom_death(version: VllmVersion = VllmVersion.V0_32) -> str:
    """A start of vLLM that served for 100 s and died of a CUDA out-of-memory error while serving."""
    config = SimConfig(vllm_version=version)
    return "\n".join([*preamble_lines(config, WALL_S), *death_lines(config, 0, _OOM, WALL_S + 100)]) + "\n"
