"""The vLLM plugin (vllm_sidecar_probe) outside vLLM: what it writes, when it writes nothing, that it never raises,
its exit and fork behaviour (in subprocesses: the plugin is one sampler per process), and the CUDA reading
against a strict stand-in of torch (the real one is tested on a GPU in tests/gpu and inside vLLM in tests/e2e)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from vllm_sidecar_probe.sample import CudaReader, physical_index, role_of, take_sample
from vllm_sidecar_probe.writer import DEFAULT_INTERVAL_S, interval_from

REPO = Path(__file__).resolve().parents[2]


def _run(code: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_SIDECAR_PROBE")}
    full.update(env, PYTHONPATH=str(REPO))
    return subprocess.run(
        [sys.executable, "-c", code], env=full, capture_output=True, text=True, timeout=60, check=True
    )


def test_without_the_directory_it_does_nothing(tmp_path: Path) -> None:
    code = "import threading, vllm_sidecar_probe; vllm_sidecar_probe.register(); print(threading.active_count())"
    assert _run(code, {}).stdout.strip() == "1"
    assert list(tmp_path.iterdir()) == []


def test_it_writes_at_once_and_removes_its_file_at_exit(tmp_path: Path) -> None:
    folder = tmp_path / "made" / "by-the-plugin"
    code = (
        "import os, vllm_sidecar_probe\n"
        "vllm_sidecar_probe.register(); vllm_sidecar_probe.register()\n"
        "print(open(os.path.join(os.environ['VLLM_SIDECAR_PROBE_DIR'], f'{os.getpid()}.json')).read())\n"
        "import threading; print(sum(t.name == 'vllm-sidecar-probe' for t in threading.enumerate()))\n"
    )
    done = _run(code, {"VLLM_SIDECAR_PROBE_DIR": str(folder), "VLLM_SIDECAR_PROBE_INTERVAL": "0.25"})
    written, threads = done.stdout.strip().splitlines()
    document = json.loads(written)
    assert document["role"] == "other"
    assert document["rank"] is None
    assert document["interval_s"] == 0.25
    assert document["cuda"] == {"available": False, "reason": "torch is not imported in this process", "devices": []}
    assert threads == "1"  # registered twice, one sampler
    assert list(folder.iterdir()) == []  # removed at exit


def test_an_unusable_directory_never_stops_the_host_process(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    code = "import vllm_sidecar_probe; vllm_sidecar_probe.register(); print('vLLM goes on')"
    done = _run(code, {"VLLM_SIDECAR_PROBE_DIR": str(blocker / "probe")})
    assert done.stdout.strip() == "vLLM goes on"
    assert "vllm-sidecar probe not started" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_forked_child_samples_itself(tmp_path: Path) -> None:
    code = (
        "import os, time, vllm_sidecar_probe\n"
        "vllm_sidecar_probe.register()\n"
        "child = os.fork()\n"
        "if child == 0:\n"
        "    time.sleep(0.2); os._exit(0)\n"  # like multiprocessing: no exit handlers, the file stays
        "os.waitpid(child, 0); print(child)\n"
    )
    child = _run(code, {"VLLM_SIDECAR_PROBE_DIR": str(tmp_path)}).stdout.strip()
    assert [path.name for path in tmp_path.glob("*.json")] == [f"{child}.json"]
    assert json.loads((tmp_path / f"{child}.json").read_text())["pid"] == int(child)


@pytest.mark.parametrize(
    ("text", "expected"), [(None, DEFAULT_INTERVAL_S), ("", 2.0), ("0.5", 0.5), ("0", 2.0), ("nan", 2.0), ("x", 2.0)]
)
def test_interval(text: str | None, expected: float) -> None:
    assert interval_from(text) == expected


@pytest.mark.parametrize(
    ("title", "main", "role"),
    [
        ("VLLM::EngineCore", False, "engine"),
        ("VLLM::EngineCore_DP1", False, "engine"),
        ("VLLM::Worker_TP1_EP1", False, "worker"),
        ("VLLM::APIServer_0", False, "api"),
        ("VLLM::DPCoordinator", False, "other"),
        ("myprefix::Worker", False, "worker"),
        ("/usr/bin/python3 /usr/local/bin/vllm serve m --port 8000", True, "api"),
        ("python -m vllm.entrypoints.openai.api_server --model m", True, "api"),
        ("python -m vllm.entrypoints.openai.api_server --model m", False, "other"),
        ("python train.py", True, "other"),
    ],
)
def test_role_from_vllms_process_titles(title: str, main: bool, role: str) -> None:
    assert role_of(title, is_main_process=main) == role


def test_physical_index_follows_cuda_visible_devices() -> None:
    assert physical_index(1, None) == 1
    assert physical_index(1, "3,5") == 5
    assert physical_index(0, "GPU-8f2e,GPU-11aa") == 0  # UUIDs: the file's uuid names the card


class _StrictCuda:
    """torch.cuda as far as the reader may use it: asking an unused device for memory info would create a
    CUDA context there, so that fails the test."""

    def __init__(self, initialised: bool = True) -> None:
        self.initialised = initialised
        self.stats = {
            0: {"reserved_bytes.all.peak": 10, "reserved_bytes.all.current": 8, "num_alloc_retries": 2},
            1: {},
            2: {"reserved_bytes.all.peak": 0},
        }

    def is_initialized(self) -> bool:
        return self.initialised

    def current_device(self) -> int:
        return 2

    def device_count(self) -> int:
        return 3

    def memory_stats(self, device: int) -> dict[str, int]:
        return self.stats[device]

    def mem_get_info(self, device: int) -> tuple[int, int]:
        assert device in (0, 2), f"mem_get_info on device {device}, which this process never used"
        return 100 + device, 1000

    def get_device_properties(self, device: int) -> Any:
        return SimpleNamespace(uuid=f"uuid-{device}")


def _torch(cuda: _StrictCuda, built: bool = True) -> Any:
    return SimpleNamespace(cuda=cuda, backends=SimpleNamespace(cuda=SimpleNamespace(is_built=lambda: built)))


def test_the_reader_reads_only_devices_in_use(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,6,7")
    read = CudaReader().read(_torch(_StrictCuda()))
    assert read["available"] is True
    first, second = read["devices"]
    assert (first["index"], first["uuid"], first["reserved_bytes"], first["num_alloc_retries"]) == (
        4,
        "GPU-uuid-0",
        8,
        2,
    )
    assert (first["free_bytes"], first["total_bytes"], first["num_ooms"]) == (100, 1000, 0)
    assert (second["index"], second["free_bytes"]) == (7, 102)  # the current device, even before it holds memory


def test_the_reader_never_initialises_cuda() -> None:
    assert (
        CudaReader().read(_torch(_StrictCuda(initialised=False)))["reason"] == "CUDA is not initialised in this process"
    )
    cpu_build = CudaReader().read(_torch(_StrictCuda(initialised=False), built=False))
    assert cpu_build["reason"] == "this torch has no CUDA (a CPU build)"


def test_a_failing_read_is_reported_in_the_sample(monkeypatch: pytest.MonkeyPatch) -> None:
    cuda = _StrictCuda()
    cuda.stats = {}  # memory_stats raises KeyError for every device
    monkeypatch.setitem(sys.modules, "torch", _torch(cuda))
    sample = take_sample(CudaReader(), interval_s=2.0)
    assert sample["cuda"]["available"] is False
    assert sample["cuda"]["reason"].startswith("KeyError")
