"""The NVML source against a strict fake of pynvml (and once the real pynvml), plus /proc ownership."""

from __future__ import annotations

import asyncio
import ctypes
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import pynvml
import pytest

from sidecar.model.gpu import GpuDevice, GpuReading, ProcessOwner
from sidecar.model.source import SourceResult
from sidecar.sources.nvml import MAX_XID_EVENTS_PER_READ, NvmlSource
from sidecar.sources.proc import DEFAULT_VLLM_PATTERN, identify_process
from tests.clock import VirtualClock as FakeClock
from tests.fakes.fake_pynvml import FakeGpu, FakeNvml, FakeProcess, Scenario
from tests.fakes.proc import fake_proc
from tests.loopback import LoopbackServer

GIB = 1024**3
VLLM_PID, XORG_PID, UNSEEN_PID, ENGINE_PID = 4242, 1717, 999_999, 4243


@pytest.fixture
def proc_root(tmp_path: Path) -> Path:
    """A /proc: vLLM told by its cmdline, vLLM's engine by its comm, and Xorg; UNSEEN_PID is absent."""
    root = tmp_path / "proc"
    entries: dict[int, tuple[str, bytes]] = {
        VLLM_PID: ("python3\n", b"/usr/bin/python3\0-m\0vllm.entrypoints.openai.api_server\0--model\0m\0"),
        ENGINE_PID: ("VLLM::EngineCor\n", b""),
        XORG_PID: ("Xorg\n", b"/usr/lib/xorg/Xorg\0:0\0"),
    }
    return fake_proc(root, entries)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def two_gpus() -> Scenario:
    return Scenario(
        gpus=[
            FakeGpu(
                uuid="GPU-aaaa",
                used_bytes=70 * GIB,
                utilization_percent=87,
                temperature_celsius=61,
                processes=[FakeProcess(VLLM_PID, 60 * GIB), FakeProcess(UNSEEN_PID, None)],
            ),
            FakeGpu(
                uuid="GPU-bbbb",
                name=b"NVIDIA A100-SXM4-40GB",  # pynvml before 11.515 handed back bytes
                total_bytes=40 * GIB,
                used_bytes=2 * GIB,
                utilization_percent=3,
                temperature_celsius=35,
                processes=[
                    FakeProcess(ENGINE_PID, GIB),
                    FakeProcess(ENGINE_PID, None, graphics=True),  # both contexts: listed twice, once without a figure
                    FakeProcess(XORG_PID, 64 * 1024**2, graphics=True),
                ],
            ),
        ]
    )


def make_source(fake: FakeNvml, proc_root: Path, clock: FakeClock, gpu_indices: list[int] | None = None) -> NvmlSource:
    return NvmlSource(gpu_indices=gpu_indices, nvml=fake, proc_root=proc_root, clock=clock, retry_init_s=60.0)


def reading_of(result: SourceResult[GpuReading]) -> GpuReading:
    assert result.error is None, result.error
    assert result.value is not None
    return result.value


def device(reading: GpuReading, index: int) -> GpuDevice:
    return next(d for d in reading.devices if d.index == index)


async def test_two_gpus_with_processes(proc_root: Path, clock: FakeClock) -> None:
    source = make_source(FakeNvml(two_gpus()), proc_root, clock)

    result = await source.read()

    assert result.source == "nvml"
    assert result.ok
    reading = reading_of(result)
    assert reading.driver_version == "550.54.15"
    assert reading.problems == ()
    gpu0, gpu1 = device(reading, 0), device(reading, 1)
    assert (gpu0.uuid, gpu0.name) == ("GPU-aaaa", "NVIDIA H100 80GB HBM3")
    assert (gpu0.memory_total_bytes, gpu0.memory_used_bytes, gpu0.memory_free_bytes) == (
        80 * GIB,
        70 * GIB,
        10 * GIB,
    )
    assert gpu0.utilization_ratio == pytest.approx(0.87)
    assert gpu0.temperature_celsius == 61.0
    assert [(p.pid, p.used_memory_bytes, p.name, p.owner) for p in gpu0.processes] == [
        (VLLM_PID, 60 * GIB, "python3", ProcessOwner.VLLM),  # matched by its cmdline, not its comm
        (UNSEEN_PID, None, None, ProcessOwner.UNKNOWN),
    ]
    assert gpu1.name == "NVIDIA A100-SXM4-40GB"
    assert [(p.pid, p.used_memory_bytes, p.name, p.owner) for p in gpu1.processes] == [
        (XORG_PID, 64 * 1024**2, "Xorg", ProcessOwner.OTHER),
        (ENGINE_PID, GIB, "VLLM::EngineCor", ProcessOwner.VLLM),  # deduplicated across compute and graphics
    ]
    assert (gpu0.xid_errors_total, gpu0.last_xid) == (0, None)


async def test_gpu_indices_selects_devices(proc_root: Path, clock: FakeClock) -> None:
    source = make_source(FakeNvml(two_gpus()), proc_root, clock, gpu_indices=[1])

    reading = reading_of(await source.read())

    assert [d.index for d in reading.devices] == [1]


async def test_not_supported_fields_are_none_not_an_error(proc_root: Path, clock: FakeClock) -> None:
    scenario = two_gpus()
    scenario.gpus[1].unsupported = {
        "nvmlDeviceGetTemperature",
        "nvmlDeviceGetUtilizationRates",
        "nvmlDeviceGetUUID",
        "nvmlDeviceGetGraphicsRunningProcesses",
    }
    scenario.gpus[1].xid_supported = False
    source = make_source(FakeNvml(scenario), proc_root, clock)

    reading = reading_of(await source.read())

    gpu1 = device(reading, 1)
    assert (gpu1.temperature_celsius, gpu1.utilization_ratio, gpu1.uuid) == (None, None, None)
    assert (gpu1.xid_errors_total, gpu1.last_xid) == (None, None)
    assert [p.pid for p in gpu1.processes] == [ENGINE_PID]  # compute processes still read
    assert device(reading, 0).temperature_celsius == 61.0
    assert reading.problems == ()  # NotSupported is a property of the GPU, not a problem to report


async def test_other_refusal_of_a_field_is_none_and_a_problem(proc_root: Path, clock: FakeClock) -> None:
    scenario = two_gpus()
    scenario.gpus[0].refusals = {"nvmlDeviceGetComputeRunningProcesses": pynvml.NVML_ERROR_NO_PERMISSION}
    source = make_source(FakeNvml(scenario), proc_root, clock)

    reading = reading_of(await source.read())

    assert device(reading, 0).processes == ()
    assert reading.problems == ("GPU 0 compute processes: Insufficient Permissions",)


async def test_memory_refused_fails_the_read_naming_the_gpu(proc_root: Path, clock: FakeClock) -> None:
    scenario = two_gpus()
    scenario.gpus[1].unsupported = {"nvmlDeviceGetMemoryInfo"}
    source = make_source(FakeNvml(scenario), proc_root, clock)

    result = await source.read()

    assert result.error == "GPU 1 memory: Not Supported"
    assert result.value is None


async def test_bad_index_is_an_error_naming_it(proc_root: Path, clock: FakeClock) -> None:
    source = make_source(FakeNvml(two_gpus()), proc_root, clock, gpu_indices=[0, 3])

    result = await source.read()

    assert result.error == "GPU 3 not found: 2 GPUs visible"
    assert not result.ok


def test_negative_index_is_refused_at_construction() -> None:
    with pytest.raises(ValueError, match="gpu_indices"):
        NvmlSource(gpu_indices=[-1], nvml=FakeNvml(Scenario()))


async def test_configured_gpu_appearing_later_is_picked_up_after_the_wait(proc_root: Path, clock: FakeClock) -> None:
    scenario = Scenario(gpus=[FakeGpu(uuid="GPU-aaaa")])
    fake = FakeNvml(scenario)
    source = make_source(fake, proc_root, clock, gpu_indices=[1])
    assert (await source.read()).error == "GPU 1 not found: 1 GPU visible"

    scenario.gpus.append(FakeGpu(uuid="GPU-bbbb"))
    clock.advance(10)
    assert (await source.read()).error == "GPU 1 not found: 1 GPU visible"  # NVML enumerates at init only
    assert fake.init_calls == 1
    clock.advance(50)
    reading = reading_of(await source.read())

    assert device(reading, 1).uuid == "GPU-bbbb"
    assert (fake.init_calls, fake.shutdown_calls) == (2, 1)  # the old session was shut down first


async def test_no_gpu_is_a_reading_with_a_problem_then_a_gpu_appears(proc_root: Path, clock: FakeClock) -> None:
    scenario = Scenario()
    source = make_source(FakeNvml(scenario), proc_root, clock)

    reading = reading_of(await source.read())
    assert reading.devices == ()
    assert reading.problems == ("NVML found no GPU",)

    scenario.gpus.append(FakeGpu(uuid="GPU-aaaa"))
    clock.advance(60)
    reading = reading_of(await source.read())

    assert [d.uuid for d in reading.devices] == ["GPU-aaaa"]
    assert reading.problems == ()


async def test_library_missing_is_an_error_and_init_is_retried_only_after_the_wait(
    proc_root: Path, clock: FakeClock
) -> None:
    scenario = Scenario(gpus=[FakeGpu(uuid="GPU-aaaa")], library_missing=True)
    fake = FakeNvml(scenario)
    source = make_source(fake, proc_root, clock)

    first = await source.read()
    clock.advance(59)
    second = await source.read()

    assert first.error == second.error == "NVML not available: NVML Shared Library Not Found"
    assert fake.init_calls == 1
    clock.advance(1)
    assert (await source.read()).error == "NVML not available: NVML Shared Library Not Found"
    assert fake.init_calls == 2

    scenario.library_missing = False  # the driver is installed: the GPU shows up at the next attempt
    clock.advance(30)
    assert not (await source.read()).ok
    clock.advance(30)
    reading = reading_of(await source.read())

    assert [d.uuid for d in reading.devices] == ["GPU-aaaa"]
    assert fake.init_calls == 3


async def test_xid_events_are_counted_cumulatively_per_gpu(proc_root: Path, clock: FakeClock) -> None:
    fake = FakeNvml(two_gpus())
    source = make_source(fake, proc_root, clock)
    await source.read()  # registers for Xid events

    fake.emit_xid(0, 79)
    fake.emit_xid(0, 48)
    first = reading_of(await source.read())
    fake.emit_xid(0, 13)
    second = reading_of(await source.read())
    third = reading_of(await source.read())

    assert (device(first, 0).xid_errors_total, device(first, 0).last_xid) == (2, 48)
    assert (device(second, 0).xid_errors_total, device(second, 0).last_xid) == (3, 13)
    assert (device(third, 0).xid_errors_total, device(third, 0).last_xid) == (3, 13)
    assert (device(third, 1).xid_errors_total, device(third, 1).last_xid) == (0, None)


async def test_xid_drain_is_bounded_per_read(proc_root: Path, clock: FakeClock) -> None:
    fake = FakeNvml(two_gpus())
    source = make_source(fake, proc_root, clock)
    await source.read()
    fake.emit_xid(1, 31, count=MAX_XID_EVENTS_PER_READ + 500)

    first = reading_of(await source.read())
    second = reading_of(await source.read())

    assert device(first, 1).xid_errors_total == MAX_XID_EVENTS_PER_READ
    assert any(p.startswith("Xid drain stopped after 1000 events") for p in first.problems)
    assert device(second, 1).xid_errors_total == MAX_XID_EVENTS_PER_READ + 500
    assert second.problems == ()


async def test_gpu_lost_mid_run_drops_the_session_then_recovers(proc_root: Path, clock: FakeClock) -> None:
    scenario = two_gpus()
    fake = FakeNvml(scenario)
    source = make_source(fake, proc_root, clock)
    await source.read()
    fake.emit_xid(0, 79)
    assert device(reading_of(await source.read()), 0).xid_errors_total == 1

    scenario.gpus[1].lost = True
    lost = await source.read()

    assert lost.error == "GPU 1: GPU is lost"
    assert not fake.initialised  # shut down so the next init enumerates afresh
    assert fake.live_event_sets == 0
    clock.advance(30)
    assert (await source.read()).error == "GPU 1: GPU is lost"
    assert fake.init_calls == 1  # not retried before the wait

    scenario.gpus[1].lost = False  # reset by the operator
    clock.advance(30)
    recovered = reading_of(await source.read())

    assert fake.init_calls == 2
    assert [d.index for d in recovered.devices] == [0, 1]
    assert device(recovered, 0).xid_errors_total == 1  # cumulative across sessions
    fake.emit_xid(0, 48)  # the new session is registered for Xid again
    assert device(reading_of(await source.read()), 0).last_xid == 48


async def test_close_is_idempotent_and_frees_everything(proc_root: Path, clock: FakeClock) -> None:
    fake = FakeNvml(two_gpus())
    source = make_source(fake, proc_root, clock)
    await source.read()
    assert fake.live_event_sets == 1

    source.close()
    source.close()

    assert not fake.initialised
    assert fake.live_event_sets == 0
    assert fake.shutdown_calls == 1
    assert (await source.read()).error == "NVML source closed"
    NvmlSource(nvml=fake).close()  # never read: nothing to free, nothing raised


async def test_nvml_calls_run_off_the_event_loop_thread(proc_root: Path, clock: FakeClock) -> None:
    fake = FakeNvml(two_gpus())
    source = make_source(fake, proc_root, clock)

    await asyncio.gather(source.read(), source.read())

    assert fake.call_threads
    assert threading.get_ident() not in fake.call_threads


async def test_an_unexpected_exception_becomes_an_error(proc_root: Path, clock: FakeClock) -> None:
    fake = FakeNvml(two_gpus())

    def broken() -> int:
        raise RuntimeError("binding broke")

    fake.nvmlDeviceGetCount = broken  # type: ignore[method-assign]
    result = await make_source(fake, proc_root, clock).read()

    assert result.error == "NVML read failed: RuntimeError: binding broke"


async def test_an_unavailable_nvml_says_what_to_do_without_it(proc_root: Path, clock: FakeClock) -> None:
    hint = "give --gpu-source none to run without GPU memory readings"
    fake = FakeNvml(Scenario(gpus=[FakeGpu(uuid="GPU-aaaa")], library_missing=True))
    source = NvmlSource(nvml=fake, proc_root=proc_root, clock=clock, unavailable_hint=hint)

    first = await source.read()
    again = await source.read()  # the remembered error, until the next nvmlInit is due

    assert first.error == again.error == f"NVML not available: NVML Shared Library Not Found; {hint}"


def test_once_without_a_driver_names_the_flag_to_run_without_nvml(server: LoopbackServer) -> None:
    """`once` and `run` build the same source (sidecar.shell.poller.build_gpu_source); `once` is the cheap one."""
    if _real_nvml_library_present():
        pytest.skip("an NVIDIA driver is installed here: NVML is available")
    environment = {key: value for key, value in os.environ.items() if not key.startswith("VLLM_SIDECAR_")}
    command = [sys.executable, "-m", "sidecar", "once", "--vllm-url", server.url]

    with_nvml = subprocess.run(command, capture_output=True, text=True, timeout=30, check=False, env=environment)
    without = subprocess.run(
        [*command, "--gpu-source", "none"], capture_output=True, text=True, timeout=30, check=False, env=environment
    )

    problem = (
        "  problem: NVML not available: NVML Shared Library Not Found; give --gpu-source none to run without GPU "
        "memory readings"
    )
    assert problem in with_nvml.stdout.splitlines(), with_nvml.stdout
    assert "NVML" not in without.stdout


def _real_nvml_library_present() -> bool:
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return False
    return True


async def test_real_pynvml_reports_its_state_and_never_raises() -> None:
    """No fake: without a driver this is the error every CPU-only host sees; with one, a real reading."""
    source = NvmlSource()
    try:
        result = await source.read()
    finally:
        source.close()

    if _real_nvml_library_present():
        assert result.ok, result.error
        assert result.value is not None
        assert all(d.memory_total_bytes > 0 for d in result.value.devices)
    else:
        assert result.error == "NVML not available: NVML Shared Library Not Found"
        assert result.value is None


# --- the fake refuses what the real library refuses ---------------------------------------------------------
def test_fake_refuses_calls_before_init_and_bad_indices() -> None:
    fake = FakeNvml(two_gpus())
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        fake.nvmlDeviceGetCount()
    fake.nvmlInit()
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        fake.nvmlDeviceGetHandleByIndex(2)
    handle = fake.nvmlDeviceGetHandleByIndex(0)
    fake.nvmlShutdown()
    fake.nvmlInit()
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        fake.nvmlDeviceGetMemoryInfo(handle)  # a handle does not outlive nvmlShutdown


def test_fake_event_set_times_out_when_empty_and_missing_library_is_not_found() -> None:
    fake = FakeNvml(two_gpus())
    fake.nvmlInit()
    event_set = fake.nvmlEventSetCreate()
    with pytest.raises(pynvml.NVMLError_Timeout):
        fake.nvmlEventSetWait(event_set, 0)
    with pytest.raises(pynvml.NVMLError_LibraryNotFound):
        FakeNvml(Scenario(library_missing=True)).nvmlInit()
    with pytest.raises(AttributeError, match="does not implement"):
        _ = fake.nvmlDeviceGetPowerUsage


def test_fake_returns_the_real_struct_shapes() -> None:
    fake = FakeNvml(two_gpus())
    fake.nvmlInit()
    handle = fake.nvmlDeviceGetHandleByIndex(0)
    assert isinstance(fake.nvmlDeviceGetMemoryInfo(handle), pynvml.c_nvmlMemory_t)
    assert isinstance(fake.nvmlDeviceGetUtilizationRates(handle), pynvml.c_nvmlUtilization_t)
    (proc, _) = fake.nvmlDeviceGetComputeRunningProcesses(handle)
    assert (proc.pid, proc.usedGpuMemory) == (VLLM_PID, 60 * GIB)


# --- /proc ownership ----------------------------------------------------------------------------------------
def test_identify_process(proc_root: Path, tmp_path: Path) -> None:
    pattern = re.compile(DEFAULT_VLLM_PATTERN)
    kthread = proc_root / "2"
    kthread.mkdir()
    (kthread / "comm").write_text("kthreadd\n")
    (kthread / "cmdline").write_bytes(b"")  # readable, empty: a kernel thread

    assert identify_process(VLLM_PID, proc_root=proc_root, pattern=pattern).owner == ProcessOwner.VLLM
    assert identify_process(ENGINE_PID, proc_root=proc_root, pattern=pattern).owner == ProcessOwner.VLLM
    other = identify_process(2, proc_root=proc_root, pattern=pattern)
    assert (other.name, other.owner) == ("kthreadd", ProcessOwner.OTHER)
    unknown = identify_process(UNSEEN_PID, proc_root=proc_root, pattern=pattern)
    assert (unknown.name, unknown.owner) == (None, ProcessOwner.UNKNOWN)


# Measured on an H200 with driver 580.159.04 (tests/gpu): v1 said total 150754820096 and counted 644939776 bytes
# the driver keeps as used; CUDA's total (vLLM's budget is a share of it) was v2's total - reserved, to the byte.
H200_TOTAL, H200_RESERVED, H200_USED = 150_754_820_096, 644_939_776, 2_699_886_592


def _h200(**overrides: bool) -> Scenario:
    gpu = FakeGpu(uuid="GPU-ff68", total_bytes=H200_TOTAL, reserved_bytes=H200_RESERVED, used_bytes=H200_USED)
    for name, value in overrides.items():
        setattr(gpu, name, value)
    return Scenario(gpus=[gpu])


async def test_memory_as_cuda_counts_it_without_the_drivers_reserve(proc_root: Path, clock: FakeClock) -> None:
    (gpu,) = reading_of(await make_source(FakeNvml(_h200()), proc_root, clock).read()).devices
    assert gpu.memory_total_bytes == 150_109_880_320  # cudaMemGetInfo's total on that card
    assert gpu.memory_used_bytes == H200_USED
    assert gpu.memory_free_bytes == gpu.memory_total_bytes - gpu.memory_used_bytes


async def test_a_driver_without_v2_gives_v1s_view_and_is_not_asked_again(proc_root: Path, clock: FakeClock) -> None:
    nvml = FakeNvml(_h200(memory_v2=False))
    source = make_source(nvml, proc_root, clock)
    for _ in range(2):
        result = await source.read()
        assert result.ok, result.error
        (gpu,) = reading_of(result).devices
        assert (gpu.memory_total_bytes, gpu.memory_used_bytes) == (H200_TOTAL, H200_USED + H200_RESERVED)
        assert reading_of(result).problems == ()
    assert source._memory_v2 is False  # the fallback is remembered, not retried every tick
