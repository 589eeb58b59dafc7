"""The GPU memory model: vLLM's KV sizing, used-memory composition, tenants, leaks, OOM numbers and log lines."""

from __future__ import annotations

import re
from dataclasses import replace
from datetime import UTC, datetime

import pytest

from sidecar.sim.config import GIB, MIB, SimConfig, VllmVersion
from sidecar.sim.logs import death_lines, format_size, oom_text
from sidecar.sim.memory import GpuMemory

CONFIG = SimConfig()
WALL = datetime(2025, 11, 22, 4, 2, 11, tzinfo=UTC).timestamp()


def memory(config: SimConfig = CONFIG) -> GpuMemory:
    return GpuMemory(config=config, index=0, kv_pool_bytes=config.derived_num_gpu_blocks * config.block_bytes)


def test_kv_blocks_are_derived_the_way_vllm_profiles() -> None:
    profiled = 256 * MIB + 128 * 1024 * 8192  # base + per-token activation of a max_num_batched_tokens batch
    assert CONFIG.profiled_activation_bytes == profiled
    available = int(80 * GIB * 0.9) - 16 * GIB - 500 * MIB - profiled
    assert CONFIG.derived_num_gpu_blocks == available // (128 * 1024 * 16) == 27782
    assert replace(CONFIG, num_gpu_blocks=1000).derived_num_gpu_blocks == 1000
    assert replace(CONFIG, gpu_memory_utilization=0.2).derived_num_gpu_blocks == 0


def test_used_is_context_weights_kv_pool_activations_leak_and_tenants() -> None:
    gpu = memory()
    kv = CONFIG.derived_num_gpu_blocks * CONFIG.block_bytes
    assert gpu.used_bytes == CONFIG.cuda_context_bytes + CONFIG.weights_bytes + kv
    full_batch = gpu.activation_bytes(scheduled_tokens=8192, context_tokens=8192)
    assert full_batch == CONFIG.profiled_activation_bytes
    assert gpu.advance(0.0, activation_bytes=full_batch, finished_requests=0, busy_tokens=8192) is None
    # The budget is exactly what the profile planned for, minus the unused remainder of the last block.
    assert 0 <= CONFIG.budget_bytes - gpu.used_bytes < CONFIG.block_bytes
    state = gpu.state()
    assert state.used_bytes == gpu.used_bytes
    assert [(p.pid, p.name) for p in state.processes] == [(4242, "VLLM::EngineCore")]
    assert state.processes[0].used_bytes == gpu.used_bytes


def test_the_caching_allocator_keeps_its_high_water_mark() -> None:
    gpu = memory()
    gpu.advance(0.0, activation_bytes=2 * GIB, finished_requests=0, busy_tokens=8000)
    peak = gpu.used_bytes
    gpu.advance(1.0, activation_bytes=0, finished_requests=0, busy_tokens=0)
    assert gpu.used_bytes == peak
    assert gpu.state().utilization_ratio == 0.0


def test_utilization_rises_with_batched_tokens_and_temperature_follows() -> None:
    gpu = memory()
    gpu.advance(0.0, activation_bytes=0, finished_requests=0, busy_tokens=8)
    light = gpu.utilization_ratio
    gpu.advance(1.0, activation_bytes=0, finished_requests=0, busy_tokens=4096)
    assert light < gpu.utilization_ratio <= 1.0
    for second in range(2, 200):
        gpu.advance(float(second), activation_bytes=0, finished_requests=0, busy_tokens=4096)
    assert 60.0 < gpu.state().temperature_celsius < 80.0


def test_leak_grows_per_request_and_per_second() -> None:
    gpu = memory(replace(CONFIG, leak_bytes_per_request=10 * MIB, leak_bytes_per_s=1.0 * MIB))
    start = gpu.used_bytes
    gpu.advance(0.0, activation_bytes=0, finished_requests=0, busy_tokens=0)
    gpu.advance(4.0, activation_bytes=0, finished_requests=3, busy_tokens=0)
    assert gpu.used_bytes - start == 34 * MIB


def test_a_tenant_only_gets_free_memory_and_is_listed() -> None:
    gpu = memory()
    gpu.set_tenant(3 * GIB)
    state = gpu.state()
    assert [p.name for p in state.processes] == ["VLLM::EngineCore", "python train.py"]
    assert state.processes[1].used_bytes == 3 * GIB
    gpu.set_tenant(200 * GIB)
    assert gpu.used_bytes == gpu.total_bytes


def test_an_allocation_beyond_free_memory_is_a_cuda_oom_with_consistent_numbers() -> None:
    gpu = memory()
    gpu.set_tenant(6 * GIB)
    free = gpu.free_bytes
    oom = gpu.advance(0.0, activation_bytes=free + 5 * MIB, finished_requests=0, busy_tokens=8192)
    assert oom is not None
    assert oom.tried_bytes == free + 5 * MIB
    assert oom.free_bytes == free
    assert oom.process_bytes == gpu.vllm_bytes
    assert oom.allocated_bytes + oom.reserved_unallocated_bytes + CONFIG.cuda_context_bytes == oom.process_bytes
    assert gpu.activation_reserved_bytes == 0, "a failed step allocates nothing"
    text = oom_text(oom)
    assert text.startswith(f"CUDA out of memory. Tried to allocate {format_size(free + 5 * MIB)}. GPU 0 has a total")
    assert "GPU 0 has a total capacity of 80.00 GiB of which " in text
    assert "Process 31337 has 6.00 GiB memory in use. Including non-PyTorch memory, this process has " in text
    assert text.endswith(
        "is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting "
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for Memory "
        "Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)"
    )
    numbers = re.findall(r"(\d+\.\d\d) (GiB|MiB)", text)
    assert len(numbers) == 6


@pytest.mark.parametrize(
    ("size", "text"),
    [
        (512, "512 bytes"),
        (1024, "1024 bytes"),
        (1536, "1.50 KiB"),
        (MIB, "1024.00 KiB"),
        (512 * MIB, "512.00 MiB"),
        (int(1.15 * GIB), "1.15 GiB"),
        (int(79.19 * GIB), "79.19 GiB"),
    ],
)
def test_sizes_print_like_pytorch(size: int, text: str) -> None:
    assert format_size(size) == text


def oom_for(config: SimConfig) -> tuple[str, ...]:
    gpu = memory(config)
    oom = gpu.advance(0.0, activation_bytes=gpu.free_bytes + GIB, finished_requests=0, busy_tokens=1)
    assert oom is not None
    return death_lines(config, 0, oom, WALL)


def test_v1_death_lines() -> None:
    lines = oom_for(CONFIG)
    assert (
        lines[0]
        == "(EngineCore_DP0 pid=4242) ERROR 11-22 04:02:11 [core.py:1346] EngineCore encountered a fatal error."
    )
    oom_line = next(line for line in lines if "torch.OutOfMemoryError" in line)
    assert oom_line.startswith(
        "(EngineCore_DP0 pid=4242) ERROR 11-22 04:02:11 [core.py:1346] torch.OutOfMemoryError: CUDA out of memory. "
    )
    assert any(line.endswith("[async_llm.py:704] AsyncLLM output_handler failed.") for line in lines)
    assert lines[-1] == (
        "(APIServer pid=4100) ERROR 11-22 04:02:11 [async_llm.py:704] vllm.v1.engine.exceptions.EngineDeadError: "
        "EngineCore encountered an issue. See stack trace (above) for the root cause."
    )
    assert lines.index(oom_line) < next(i for i, line in enumerate(lines) if "APIServer" in line)


def test_v010_and_v06_death_lines() -> None:
    v010 = oom_for(replace(CONFIG, vllm_version=VllmVersion.V0_10))
    assert v010[0].startswith("(EngineCore_0 pid=4242) ERROR 11-22 04:02:11 [core.py:702] EngineCore encountered")
    v06 = oom_for(replace(CONFIG, vllm_version=VllmVersion.V0_6))
    assert v06[0].startswith("ERROR 11-22 04:02:11 engine.py:135] OutOfMemoryError('CUDA out of memory. Tried to")
    assert any(line.startswith("ERROR 11-22 04:02:11 engine.py:135] torch.OutOfMemoryError: CUDA") for line in v06)
    assert v06[-1] == "CRITICAL 11-22 04:02:11 launcher.py:99] MQLLMEngine is already dead, terminating server process"


def test_v06_engine_process_has_no_title() -> None:
    gpu = memory(replace(CONFIG, vllm_version=VllmVersion.V0_6))
    assert "vllm" in gpu.state().processes[0].name
