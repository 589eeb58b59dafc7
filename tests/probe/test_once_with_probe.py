"""`vllm-sidecar once --probe-dir` against the simulator and a probe file: the allocators in the JSON document
and the text, and the probe's problem lines when its directory holds nothing usable."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.probe.documents import device, document, write
from tests.scenarios.harness import SimProcess


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimProcess]:
    process = SimProcess("healthy", tmp_path_factory.mktemp("sim") / "sim.log")
    process.wait_healthy()
    yield process
    process.stop()


def _once(sim: SimProcess, probe_dir: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "sidecar", "once", "--vllm-url", sim.url, "--gpu-source", "none"]
    return subprocess.run(
        [*command, "--probe-dir", str(probe_dir), *extra],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={k: v for k, v in os.environ.items() if not k.startswith("VLLM_SIDECAR_")},
    )


@contextlib.contextmanager
def _live_probe(directory: Path) -> Iterator[None]:
    """This test's own pid samples its allocator every 0.2 s, as the probe in a live vLLM process does, so the
    file is fresh whenever `once` reads it, however long a loaded machine takes to start it."""
    stop = threading.Event()
    (directory / "next").mkdir()

    def sample() -> None:
        while True:
            content = document(os.getpid(), time_unix_s=time.time(), devices=[device(0, num_alloc_retries=3)])
            os.replace(write(directory / "next", content), directory / f"{os.getpid()}.json")  # whole, as the probe
            if stop.wait(0.2):
                return

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        yield
    finally:
        stop.set()
        sampler.join()


def test_the_allocators_in_json_and_text(sim: SimProcess, tmp_path: Path) -> None:
    with _live_probe(tmp_path):
        done = _once(sim, tmp_path, "--json")
        text = _once(sim, tmp_path).stdout
    assert done.returncode == 0, done.stderr
    output = json.loads(done.stdout)
    (allocator,) = output["allocators"]
    assert (allocator["gpu"], allocator["rank"], allocator["alloc_retries_total"]) == (0, "0", 3)
    assert allocator["fragmentation_ratio"] == 0.25
    assert allocator["alloc_retries_recent"] is None  # one poll: no horizon
    assert (
        "PyTorch allocator, GPU 0 rank 0: 6.00 GiB allocated of 8.00 GiB reserved, 2.00 GiB in split free pieces, "
        "3 retries and 0 OOMs since vLLM started"
    ) in text


def test_an_empty_probe_directory_is_a_problem_not_a_failure(sim: SimProcess, tmp_path: Path) -> None:
    done = _once(sim, tmp_path, "--json")
    assert done.returncode == 0, done.stderr  # vLLM was read: the probe is an extra
    output = json.loads(done.stdout)
    assert output["allocators"] == []
    (problem,) = [p for p in output["problems"] if p.startswith("probe:")]
    assert f"no sample in {tmp_path}" in problem
