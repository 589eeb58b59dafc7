"""Runs `vllm-sidecar` as a real subprocess for tests, and reads its JSON log lines."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import httpx

from tests.loopback import closed_port


class SidecarProcess:
    def __init__(self, args: Sequence[str], log_path: Path, env: dict[str, str] | None = None) -> None:
        self.port = closed_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        self._log = log_path.open("w")
        full_env = {**os.environ, **(env or {})}
        full_env.pop("VLLM_SIDECAR_CONFIG", None)
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "sidecar",
                "run",
                "--listen",
                f"127.0.0.1:{self.port}",
                "--log-format",
                "json",
                *args,
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=full_env,
        )

    def wait_ready(self, timeout_s: float = 20.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"sidecar exited {self.process.returncode}: {self.log_path.read_text()}")
            try:
                if httpx.get(self.url + "/status", timeout=1).json().get("sources"):
                    return
            except (httpx.HTTPError, ValueError):
                pass
            time.sleep(0.1)
        raise RuntimeError(f"sidecar not polling within {timeout_s} s: {self.log_path.read_text()}")

    def get(self, path: str) -> httpx.Response:
        return httpx.get(self.url + path, timeout=5)

    def events(self) -> list[dict[str, object]]:
        lines = self.log_path.read_text().splitlines()
        return [json.loads(line) for line in lines if line.startswith("{")]

    def stop(self, signum: int = signal.SIGTERM) -> tuple[int, float]:
        started = time.monotonic()
        self.process.send_signal(signum)
        code = self.process.wait(timeout=15)
        self._log.close()
        return code, time.monotonic() - started

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self._log.close()
