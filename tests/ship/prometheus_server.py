"""A real Prometheus server (Debian's `prometheus`, 2.42 here) on loopback, for tests that need PromQL evaluated
by the real engine: dashboard queries, alerting rules, recording rules.

    prometheus = PrometheusServer(
        tmp_path / "prometheus",
        targets={"vllm-sidecar": ["127.0.0.1:9468"], "vllm": ["127.0.0.1:8000"]},
        rule_files=[RULES],                 # optional: loaded and evaluated every `evaluation_interval`
        alertmanager="127.0.0.1:9093",      # optional: where firing alerts are sent
    )
    try:
        prometheus.wait_ready()             # /-/ready answers 200
        prometheus.wait_targets_up()        # every configured target scraped successfully at least once
        prometheus.query("up")              # -> [{"metric": {...}, "value": [ts, "1"]}, ...]
        prometheus.alerts()                 # -> [{"labels": {...}, "state": "firing", ...}, ...]
    finally:
        prometheus.stop()

The constructor writes `prometheus.yml` into its own folder (with the TSDB beside it), picks a free port and
starts the process; nothing is shared with another instance. Started with `--web.enable-lifecycle`, so
`reload()` re-reads a config or rules file a test rewrote. Every API call raises `PrometheusError` with
Prometheus's own error text rather than returning a half-empty answer, so a bad query fails the test loudly.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx
import yaml

from tests.loopback import closed_port

BINARY = "prometheus"


def prometheus_missing() -> str | None:
    """Why a real Prometheus cannot run here, or None when it can."""
    return None if shutil.which(BINARY) else f"{BINARY} is not installed (apt-get install prometheus)"


class PrometheusError(RuntimeError):
    """The Prometheus HTTP API answered an error (bad query, bad request) or not at all."""


class PrometheusServer:
    """One Prometheus scraping `targets` (job name -> list of HOST:PORT) every `scrape_interval`."""

    def __init__(
        self,
        directory: Path,
        targets: Mapping[str, Sequence[str]],
        *,
        rule_files: Sequence[Path] = (),
        alertmanager: str | None = None,
        scrape_interval: str = "1s",
        evaluation_interval: str = "1s",
        extra_args: Sequence[str] = (),
    ) -> None:
        if not targets:
            raise ValueError("a Prometheus without targets has nothing to show")
        self.port = closed_port()
        self.address = f"127.0.0.1:{self.port}"
        self.url = f"http://{self.address}"
        self.directory = directory
        self.targets = {job: list(addresses) for job, addresses in targets.items()}
        directory.mkdir(parents=True, exist_ok=True)
        self.config_path = directory / "prometheus.yml"
        self.config_path.write_text(
            yaml.safe_dump(
                _config(self.targets, rule_files, alertmanager, scrape_interval, evaluation_interval),
                sort_keys=False,
            )
        )
        self.log_path = directory / "prometheus.log"
        self._log = self.log_path.open("w")
        self._client = httpx.Client(base_url=self.url, timeout=10, trust_env=False)
        self.started_at = time.time()
        self.process = subprocess.Popen(
            [
                BINARY,
                f"--config.file={self.config_path}",
                f"--storage.tsdb.path={directory / 'data'}",
                f"--web.listen-address={self.address}",
                "--web.enable-lifecycle",
                *extra_args,
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    # --- lifecycle ----------------------------------------------------------------------------------------
    def wait_ready(self, timeout_s: float = 30.0) -> None:
        """Until /-/ready answers 200 (config loaded, TSDB open)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self._check_alive()
            try:
                if self._client.get("/-/ready", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise PrometheusError(f"prometheus not ready in {timeout_s} s: {self.log()}")

    def wait_targets_up(self, timeout_s: float = 30.0) -> None:
        """Until every configured target has been scraped successfully at least once.

        Prometheus 2.x hands static targets to the scrape manager on a 5 s discovery tick, so the first scrape
        comes some seconds after /-/ready: a test that queries before this sees no series at all.
        """
        wanted = {(job, address) for job, addresses in self.targets.items() for address in addresses}
        deadline = time.monotonic() + timeout_s
        up: set[tuple[str, str]] = set()
        while time.monotonic() < deadline:
            self._check_alive()
            up = {
                (target["labels"]["job"], target["labels"]["instance"])
                for target in self.active_targets()
                if target["health"] == "up"
            }
            if wanted <= up:
                return
            time.sleep(0.2)
        raise PrometheusError(f"targets not up in {timeout_s} s: {sorted(wanted - up)}; {self.active_targets()}")

    def reload(self) -> None:
        """Re-read the config and rule files (POST /-/reload)."""
        response = self._client.post("/-/reload")
        if response.status_code != 200:
            raise PrometheusError(f"reload answered {response.status_code}: {response.text}")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._client.close()
        self._log.close()

    def __enter__(self) -> PrometheusServer:
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()

    def log(self) -> str:
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text()

    # --- the HTTP API ---------------------------------------------------------------------------------------
    def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        """Instant query: the result vector (or [scalar/string] for those types); [] when nothing matched."""
        params: dict[str, str] = {"query": expr}
        if at is not None:
            params["time"] = _seconds(at)
        data = self._api("/api/v1/query", params)
        if data["resultType"] in ("scalar", "string"):
            return [{"metric": {}, "value": data["result"]}]
        result: list[dict[str, Any]] = data["result"]
        return result

    def query_range(self, expr: str, start: float, end: float, step_s: float) -> list[dict[str, Any]]:
        """Range query, as Grafana runs a time-series panel: [{"metric": {...}, "values": [[ts, "v"], ...]}]."""
        params = {"query": expr, "start": _seconds(start), "end": _seconds(end), "step": _seconds(step_s)}
        result: list[dict[str, Any]] = self._api("/api/v1/query_range", params)["result"]
        return result

    def series(self, match: str, start: float | None = None, end: float | None = None) -> list[dict[str, str]]:
        """The label sets of the series `match` selects (what Grafana's label_values(metric, label) reads)."""
        params: dict[str, str] = {"match[]": match}
        if start is not None:
            params["start"] = _seconds(start)
        if end is not None:
            params["end"] = _seconds(end)
        result: list[dict[str, str]] = self._api("/api/v1/series", params)
        return result

    def label_values(self, label: str, match: str | None = None) -> list[str]:
        params = {"match[]": match} if match is not None else {}
        result: list[str] = self._api(f"/api/v1/label/{label}/values", params)
        return result

    def active_targets(self) -> list[dict[str, Any]]:
        targets: list[dict[str, Any]] = self._api("/api/v1/targets", {"state": "active"})["activeTargets"]
        return targets

    def alerts(self) -> list[dict[str, Any]]:
        """Pending and firing alerts of the loaded rules, with labels, annotations and state."""
        alerts: list[dict[str, Any]] = self._api("/api/v1/alerts", {})["alerts"]
        return alerts

    def rules(self) -> list[dict[str, Any]]:
        """The loaded rule groups with each rule's health and last error (a rule file with a bad query loads)."""
        groups: list[dict[str, Any]] = self._api("/api/v1/rules", {})["groups"]
        return groups

    def _api(self, path: str, params: Mapping[str, str]) -> Any:
        try:
            response = self._client.get(path, params=params)
        except httpx.HTTPError as error:
            raise PrometheusError(f"GET {path}: {type(error).__name__}: {error}") from error
        try:
            document = response.json()
        except ValueError:
            raise PrometheusError(f"GET {path} answered {response.status_code}: {response.text[:300]}") from None
        if document.get("status") != "success":
            raise PrometheusError(f"GET {path} {dict(params)}: {document.get('errorType')}: {document.get('error')}")
        return document["data"]

    def _check_alive(self) -> None:
        if self.process.poll() is not None:
            raise PrometheusError(f"prometheus exited {self.process.returncode}: {self.log()}")


def _config(
    targets: Mapping[str, Sequence[str]],
    rule_files: Sequence[Path],
    alertmanager: str | None,
    scrape_interval: str,
    evaluation_interval: str,
) -> dict[str, Any]:
    config: dict[str, Any] = {
        "global": {
            "scrape_interval": scrape_interval,
            "evaluation_interval": evaluation_interval,
            # A scrape must end before the next one starts; Prometheus refuses a timeout above the interval.
            "scrape_timeout": scrape_interval,
        },
        "scrape_configs": [
            {"job_name": job, "static_configs": [{"targets": list(addresses)}]} for job, addresses in targets.items()
        ],
    }
    if rule_files:
        config["rule_files"] = [str(path.resolve()) for path in rule_files]
    if alertmanager is not None:
        config["alerting"] = {"alertmanagers": [{"static_configs": [{"targets": [alertmanager]}]}]}
    return config


def _seconds(value: float) -> str:
    return f"{value:.3f}"
