"""Restart through a configured command (docker, nomad, a script): an argv, never a shell. Runs a process.

The command's exit status is the outcome; its output's last line is the detail. Bounded by a timeout,
after which the whole process group is killed, so a hung script cannot hang the sidecar. `program_problem`
says at start whether the program can be found and run at all (it reads the filesystem).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
import shutil
import signal
import time
from collections.abc import Sequence
from pathlib import Path

from sidecar.actuators.base import ActuatorOutcome, OutcomeStatus
from sidecar.model.supervision import Restarter, Supervision

MAX_OUTPUT_BYTES = 64 * 1024


class ExecActuator:
    name = "exec"

    def __init__(self, argv: Sequence[str], *, timeout_s: float = 600.0) -> None:
        if not argv or not argv[0]:
            raise ValueError("the exec restart command is empty")
        self.argv = tuple(argv)
        self._timeout_s = timeout_s

    def _shown(self) -> str:
        return shlex.join(self.argv)

    async def restart(self, *, reason: str, dry_run: bool, hard: bool = False) -> ActuatorOutcome:
        started = time.monotonic()
        if dry_run:
            return ActuatorOutcome(status=OutcomeStatus.DRY_RUN, detail=f"would run {self._shown()}", duration_s=0.0)
        env = {**os.environ, "VLLM_SIDECAR_RESTART_REASON": reason}
        try:
            process = await asyncio.create_subprocess_exec(
                *self.argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                env=env,
                start_new_session=True,  # its own process group, so a timeout kills its children too
            )
        except OSError as error:
            return self._failed(started, f"cannot run {self._shown()}: {error.strerror or error}")
        try:
            async with asyncio.timeout(self._timeout_s):
                output = await _read_bounded(process)
                code = await process.wait()
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            await process.wait()
            return self._failed(started, f"{self._shown()} did not finish within {self._timeout_s:g} s; killed")
        last = _last_line(output)
        if code != 0:
            return self._failed(started, f"{self._shown()} exited with {code}" + (f": {last}" if last else ""))
        detail = f"{self._shown()} succeeded" + (f": {last}" if last else "")
        return ActuatorOutcome(status=OutcomeStatus.DONE, detail=detail, duration_s=time.monotonic() - started)

    def _failed(self, started: float, detail: str) -> ActuatorOutcome:
        return ActuatorOutcome(status=OutcomeStatus.FAILED, detail=detail, duration_s=time.monotonic() - started)

    async def supervision(self) -> Supervision:
        """The sidecar is vLLM's supervisor here: nobody else starts it when it is gone."""
        return Supervision(
            restarter=Restarter.SIDECAR, detail=f"the sidecar starts it (--actuator exec: {self._shown()})"
        )

    async def close(self) -> None:
        return None


async def _read_bounded(process: asyncio.subprocess.Process) -> bytes:
    """The output's tail (at most MAX_OUTPUT_BYTES kept); reads to the end so the child never blocks on a pipe."""
    assert process.stdout is not None  # noqa: S101 - requested above
    kept = b""
    while chunk := await process.stdout.read(65536):
        kept = (kept + chunk)[-MAX_OUTPUT_BYTES:]
    return kept


def _last_line(output: bytes) -> str:
    lines = [line.strip() for line in output.decode(errors="replace").splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""


def program_problem(program: str) -> str | None:
    """Why `program` (the command's first word) cannot be run, found the way the restart will find it (a bare
    name on PATH, a name with a '/' as the path it is), or None when it can."""
    if "/" not in program:
        if shutil.which(program) is not None:
            return None
        search = os.environ.get("PATH", os.defpath)
        return f"no program {program!r} on the sidecar's PATH ({search}): install it, or give its full path"
    path = Path(program)
    if not path.exists():
        return f"{program} does not exist: give the path of the program that restarts vLLM"
    if path.is_dir():
        return f"{program} is a directory, not a program"
    if not os.access(path, os.X_OK):
        return f"{program} is not executable by the sidecar's user: chmod +x {shlex.quote(program)}"
    return None
