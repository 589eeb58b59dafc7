"""The allocator probe plugin inside a real vLLM 0.32 on CPU, installed as users install it (this distribution
in vLLM's environment): vLLM loads it in the API server, the engine core and the worker, each writes its file,
and the sidecar reads them; once vLLM stops, the files of processes that exited without their exit handler
(multiprocessing children end with os._exit) are removed by the sidecar. On CPU every file says CUDA is not
available; the CUDA numbers are tested on a GPU (tests/gpu)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sidecar.model.allocator import ProcessRole
from sidecar.sources.allocator_probe import AllocatorProbeSource
from tests.adapters.daemon_process import SidecarProcess

from .conftest import _installed_paths
from .vllm.server import server_env, start_vllm

pytestmark = pytest.mark.e2e
REPO = Path(__file__).resolve().parents[2]
INTERVAL_S = 0.5
SEEN_WITHIN_S = 30.0  # for a poll of the probe folder to show in the metrics


@pytest.fixture(scope="module")
def plugin_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """This distribution installed into a folder, as `pip install vllm-sidecar` puts it in vLLM's image: the entry
    point comes from the packaging, not from the test."""
    site = tmp_path_factory.mktemp("plugin-site")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--no-compile",
            "--target",
            str(site),
            str(REPO),
        ],
        check=True,
        capture_output=True,
    )
    return site


def _wait_for_files(folder: Path, count: int, timeout_s: float) -> list[dict[str, object]]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        documents = [json.loads(path.read_text()) for path in sorted(folder.glob("*.json"))]
        if len(documents) >= count:
            return documents
        time.sleep(0.2)
    raise AssertionError(f"{count} probe files not written within {timeout_s} s: {sorted(folder.iterdir())}")


def test_vllm_loads_the_plugin_in_every_process_and_the_sidecar_reads_them(plugin_site: Path, tmp_path: Path) -> None:
    python, model = _installed_paths()
    probe_dir = tmp_path / "probe"
    server = start_vllm(
        python,
        model,
        tmp_path / "vllm.log",
        # A worker process of its own, as with tensor parallelism on GPUs (on CPU it would run in the engine core).
        extra_args=("--distributed-executor-backend", "mp"),
        extra_env={
            "PYTHONPATH": str(plugin_site),
            "VLLM_SIDECAR_PROBE_DIR": str(probe_dir),
            "VLLM_SIDECAR_PROBE_INTERVAL": str(INTERVAL_S),
            "VLLM_ENABLE_V1_MULTIPROCESSING": "1",
        },
    )
    sidecar = None
    try:
        documents = _wait_for_files(probe_dir, 3, timeout_s=30)
        by_role = {str(document["role"]): document for document in documents}
        assert sorted(by_role) == ["api", "engine", "worker"]
        assert by_role["api"]["pid"] == server.pid
        assert by_role["worker"]["rank"] == 0
        assert by_role["api"]["rank"] is None
        for document in documents:
            assert document["cuda"] == {
                "available": False,
                "reason": "this torch has no CUDA (a CPU build)",
                "devices": [],
            }

        reading = AllocatorProbeSource(directory=probe_dir, timeout_s=5).scan()
        assert reading.problems == ()
        assert {process.role for process in reading.processes} == {
            ProcessRole.API,
            ProcessRole.ENGINE,
            ProcessRole.WORKER,
        }

        sidecar = SidecarProcess(
            [
                f"--vllm-url={server.base_url}",
                "--gpu-source=none",
                f"--probe-dir={probe_dir}",
                "--interval=0.5",
                "--dry-run",
            ],
            tmp_path / "sidecar.log",
        )
        sidecar.wait_ready(timeout_s=30)
        metrics = _metrics_with(sidecar, 'vllm_sidecar_source_success{source="probe"} 1.0')
        assert "vllm_sidecar_torch_reserved_bytes{" not in metrics  # no CUDA: no value, never a made-up 0
        status = sidecar.get("/status").json()
        assert status["sources"]["probe"]["ok"] is True

        pids = sorted(path.name for path in probe_dir.glob("*.json"))
        server.stop()
        # The API server removes its own file at exit; the others go once stale (3 intervals) with their pid gone.
        deadline = time.monotonic() + 10 * INTERVAL_S + 5
        while list(probe_dir.glob("*.json")) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert list(probe_dir.glob("*.json")) == [], f"left behind of {pids}"
        _metrics_with(sidecar, 'vllm_sidecar_source_success{source="probe"} 0.0')  # by its next poll of the folder
    finally:
        server.stop()
        if sidecar is not None:
            sidecar.kill()


def test_vllm_plugins_allow_list_decides_whether_the_probe_loads(plugin_site: Path, tmp_path: Path) -> None:
    """VLLM_PLUGINS, when set, is an allow-list of plugin names: the probe loads only when it is named."""
    python, _ = _installed_paths()
    load = (
        "import os; from vllm.plugins import load_general_plugins; load_general_plugins(); "
        "print(os.path.exists(f\"{os.environ['VLLM_SIDECAR_PROBE_DIR']}/{os.getpid()}.json\"))"
    )
    written = {}
    for allowed in ("some_other_plugin", "some_other_plugin,vllm_sidecar_probe"):
        probe_dir = tmp_path / allowed.replace(",", "+")
        env = {
            **server_env(),
            "PYTHONPATH": str(plugin_site),
            "VLLM_SIDECAR_PROBE_DIR": str(probe_dir),
            "VLLM_PLUGINS": allowed,
        }
        done = subprocess.run([python, "-c", load], env=env, capture_output=True, text=True, timeout=120, check=True)
        written[allowed] = done.stdout.strip().splitlines()[-1]
        assert not list(probe_dir.glob("*.json")) if probe_dir.exists() else True  # removed at a normal exit
    assert written == {"some_other_plugin": "False", "some_other_plugin,vllm_sidecar_probe": "True"}


def _metrics_with(sidecar: SidecarProcess, line: str, timeout_s: float = SEEN_WITHIN_S) -> str:
    """The sidecar's exposition once it holds `line`: a poll (every 0.5 s) may come late on a loaded box."""
    deadline = time.monotonic() + timeout_s
    metrics = ""
    while time.monotonic() < deadline:
        metrics = sidecar.get("/metrics").text
        if line in metrics:
            return metrics
        time.sleep(0.25)
    raise AssertionError(f"{line!r} not in the sidecar's metrics within {timeout_s} s:\n{metrics[-2000:]}")
