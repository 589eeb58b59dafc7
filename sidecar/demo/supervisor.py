"""The demo's stand-in for systemd: runs the simulated vLLM and counts what happens to it. Does I/O (processes).

Like a unit with `Restart=on-failure`, a simulator that exits on its own (a crash) is started again after a
delay. Like `systemctl restart`, a restart asked by the sidecar's restart adapter stops the running simulator
with SIGTERM (it exits cleanly) and starts a new one on the same port. Each is counted apart: crashes are
exits nobody asked for, restarts are the sidecar's.
"""

from __future__ import annotations

import asyncio
import re
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

_ERROR = re.compile(r"\b\w*(?:Error|Exception): .*")
STOP_TIMEOUT_S = 10.0  # the simulator exits within a second of SIGTERM; past this it is killed


class ChildProcess:
    """A child process writing to a log file, stopped with SIGTERM then SIGKILL."""

    def __init__(self, argv: list[str], log_path: Path) -> None:
        self.log_path = log_path
        self.started_s = time.monotonic()
        self._log: TextIO = log_path.open("a")
        # argv is built by the demo from this interpreter and fixed words: nothing from outside reaches a shell.
        # A process group of its own: Ctrl-C in the terminal reaches the demo alone, which stops the load before
        # its children (a simulator that got the SIGINT too would answer the requests in flight as failed).
        self.process = subprocess.Popen(  # noqa: S603
            argv, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, process_group=0
        )

    @property
    def pid(self) -> int:
        return self.process.pid

    def exit_code(self) -> int | None:
        return self.process.poll()

    def cause(self) -> str:
        """The root cause a person would look for: the first `...Error: ...` line, else the last line."""
        lines = [line for line in self.log_path.read_text(errors="replace").splitlines() if line.strip()]
        for line in lines:
            found = _ERROR.search(line)
            if found is not None:
                return found.group(0)[:200]
        return lines[-1][:200] if lines else "no output"

    def stop(self) -> None:
        """Stop it, blocking (at the demo's end)."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log.close()

    async def stop_async(self) -> int:
        """Stop it without blocking the event loop (the demo keeps drawing); its exit code."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                await asyncio.to_thread(self.process.wait, STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
        code = await asyncio.to_thread(self.process.wait)
        self._log.close()
        return code


class SimSupervisor:
    def __init__(
        self,
        argv: list[str],
        workdir: Path,
        *,
        restart_delay_s: float,
        event: Callable[[str], None],
        name: str = "vLLM",
        log_prefix: str = "sim",
    ) -> None:
        self._argv = argv
        self._workdir = workdir
        self._restart_delay_s = restart_delay_s
        self._event = event
        self._name = name  # how its events call it
        self._log_prefix = log_prefix  # its logs are <prefix>-<start>.log
        self._process: ChildProcess | None = None
        self._starts = 0
        self._died_s: float | None = None
        self._restarting = False
        self._closed = False  # stopped for good: nothing starts again
        self.crashes = 0
        self.restarts_by_sidecar = 0
        self.first_crash: tuple[float, str] | None = None  # when (monotonic) and the cause of the first crash
        self.first_restart_s: float | None = None  # when the sidecar's first restart was asked

    @property
    def process(self) -> ChildProcess | None:
        return self._process

    def start(self) -> ChildProcess:
        if self._closed:
            raise RuntimeError("the demo is stopping")
        self._starts += 1
        self._process = ChildProcess(self._argv, self._workdir / f"{self._log_prefix}-{self._starts}.log")
        self._died_s = None
        return self._process

    def state(self, now_s: float) -> str:
        """One phrase for the screen: running (uptime), restarting, or dead and when it comes back."""
        process = self._process
        if self._restarting:
            return "restarting (asked by the sidecar)"
        if process is None:
            return "not started"
        code = process.exit_code()
        if code is None:
            return f"running, up {now_s - process.started_s:.0f} s"
        if self._died_s is None:
            return f"dead (exit {code})"
        back_in = max(0.0, self._died_s + self._restart_delay_s - now_s)
        return f"dead (exit {code}), started again in {back_in:.0f} s"

    def supervise(self, now_s: float) -> None:
        """Notice a simulator that exited on its own (a crash) and start it again after the delay."""
        process = self._process
        if process is None or self._restarting:
            return
        code = process.exit_code()
        if code is None:
            return
        if self._died_s is None:
            self._died_s = now_s
            self._crashed(now_s, code, process)
        elif now_s - self._died_s >= self._restart_delay_s:
            self._event(f"starting {self._name} again (the demo stands in for systemd Restart=on-failure)")
            process.stop()
            self.start()

    def _crashed(self, now_s: float, code: int, process: ChildProcess) -> None:
        self.crashes += 1
        cause = process.cause()
        if self.first_crash is None:
            self.first_crash = (now_s, cause)
        self._event(f"{self._name} CRASHED: exited with code {code}: {cause}")

    async def restart(self, reason: str) -> str:
        """A clean restart asked by the sidecar's restart adapter; the one line the adapter reports."""
        if self._restarting or self._closed:
            raise RuntimeError("the demo is stopping" if self._closed else "a restart is already in progress")
        self._restarting = True
        if self.first_restart_s is None:
            self.first_restart_s = time.monotonic()
        try:
            # The reason's first words (the restart's cause): the sidecar's lines just before gave the rest.
            cause = reason.split(":", 1)[0][:80]
            self._event(f"the sidecar's restart adapter asks the demo to restart {self._name} ({cause})")
            old = self._process
            said = ""
            if old is not None:
                already = old.exit_code()
                if already is not None and self._died_s is None:  # it died on its own before we noticed
                    self._crashed(time.monotonic(), already, old)
                code = await old.stop_async()
                said = f"pid {old.pid} had exited already ({code}); " if already is not None else ""
                said = said or f"stopped pid {old.pid} (exit {code}); "
            new = self.start()
            self.restarts_by_sidecar += 1
            self._event(f"{self._name} restarted for the sidecar: {said}started pid {new.pid}")
            return f"{said}started the simulated vLLM again as pid {new.pid}"
        finally:
            self._restarting = False

    def cause(self) -> str:
        return self._process.cause() if self._process is not None else "not started"

    def stop(self) -> None:
        self._closed = True
        if self._process is not None:
            self._process.stop()
