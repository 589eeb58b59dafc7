"""A real Alertmanager (Debian's `prometheus-alertmanager`) on loopback, routing every alert to one webhook."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import httpx
import yaml

from tests.loopback import closed_port

BINARY = "prometheus-alertmanager"


def alertmanager_missing() -> str | None:
    return None if shutil.which(BINARY) else f"{BINARY} is not installed (apt-get install prometheus-alertmanager)"


class AlertmanagerServer:
    """One Alertmanager with a fast route (group_wait 1 s) to `webhook_url`; gossip off (no cluster port)."""

    def __init__(self, directory: Path, webhook_url: str) -> None:
        self.port = closed_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.address = f"127.0.0.1:{self.port}"
        directory.mkdir(parents=True, exist_ok=True)
        config = {
            "route": {
                "receiver": "hook",
                "group_by": ["alertname", "instance"],
                "group_wait": "1s",
                "group_interval": "1s",
                "repeat_interval": "1h",
            },
            "receivers": [{"name": "hook", "webhook_configs": [{"url": webhook_url, "send_resolved": True}]}],
        }
        config_path = directory / "alertmanager.yml"
        config_path.write_text(yaml.safe_dump(config))
        self.log_path = directory / "alertmanager.log"
        self._log = self.log_path.open("w")
        self.process = subprocess.Popen(
            [
                BINARY,
                f"--config.file={config_path}",
                f"--storage.path={directory / 'data'}",
                f"--web.listen-address={self.address}",
                "--cluster.listen-address=",
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    def wait_ready(self, timeout_s: float = 20.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"alertmanager exited {self.process.returncode}: {self.log_path.read_text()}")
            try:
                if httpx.get(self.url + "/-/ready", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"alertmanager not ready in {timeout_s} s: {self.log_path.read_text()}")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
        self._log.close()
