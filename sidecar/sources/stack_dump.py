"""The Python stacks of a process, taken with py-spy (`pip install vllm-sidecar[incidents]`). Runs a process.

`py-spy dump --nonblocking --pid PID`: py-spy reads the target's memory (`process_vm_readv`) without stopping
it, so a process that is already stopped (SIGSTOP, a debugger) or wedged is read as it is; without
`--nonblocking` py-spy would try to suspend it and fail on a stopped one. Bounded: the caller's deadline
(the process group is killed at it) and `max_bytes` of output. Never raises: what went wrong is one line,
and a refused read says which permission is missing (docs/incidents.md).

py-spy is found on PATH, else beside the Python running the sidecar (a venv's bin/, where pip puts it even
when that folder is not on PATH).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from sidecar.parse.vllm_process import redacted_dump

PY_SPY = "py-spy"
MAX_STACK_BYTES = 256 * 2**10  # one process's threads: a few KiB each
NO_PY_SPY = "py-spy is not installed (pip install 'vllm-sidecar[incidents]', or put py-spy on PATH)"
NO_PERMISSION = (
    "the sidecar may not read the memory of process {pid}: it needs CAP_SYS_PTRACE (or vLLM's user, with "
    "kernel.yama.ptrace_scope 0); see docs/incidents.md"
)
_PERMISSION_SIGNS = ("permission denied", "operation not permitted", "os error 1)")


@dataclass(frozen=True, slots=True, kw_only=True)
class StackDump:
    pid: int
    text: str | None  # py-spy's dump; None when it could not be taken
    error: str | None  # one line, when text is None
    truncated: bool = False
    duration_s: float = 0.0


def find_py_spy() -> Path | None:
    found = shutil.which(PY_SPY)
    if found is not None:
        return Path(found)
    beside = Path(sys.executable).parent / PY_SPY
    return beside if beside.is_file() and os.access(beside, os.X_OK) else None


async def dump_stack(py_spy: Path, pid: int, *, timeout_s: float, max_bytes: int = MAX_STACK_BYTES) -> StackDump:
    started = time.monotonic()

    def failed(error: str) -> StackDump:
        return StackDump(pid=pid, text=None, error=error, duration_s=time.monotonic() - started)

    env = {**os.environ, "RUST_BACKTRACE": "0", "RUST_LIB_BACKTRACE": "0"}
    try:
        process = await asyncio.create_subprocess_exec(
            str(py_spy),
            "dump",
            "--nonblocking",
            "--pid",
            str(pid),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=env,
            start_new_session=True,  # its own group: the deadline kills all of it
        )
    except OSError as error:
        return failed(f"cannot run {py_spy}: {error.strerror or error}")
    try:
        async with asyncio.timeout(timeout_s):
            out, err = await asyncio.gather(_read(process.stdout, max_bytes), _read(process.stderr, 16 * 2**10))
            code = await process.wait()
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        await process.wait()
        return failed(f"py-spy did not finish within {timeout_s:g} s; killed")
    except asyncio.CancelledError:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        raise
    if code != 0:
        said = err.decode("utf-8", errors="replace") + "\n" + out.decode("utf-8", errors="replace")
        return failed(_error_line(said, pid, code))
    truncated = len(out) > max_bytes
    text = redacted_dump(out[:max_bytes].decode("utf-8", errors="replace"))
    return StackDump(pid=pid, text=text, error=None, truncated=truncated, duration_s=time.monotonic() - started)


async def _read(stream: asyncio.StreamReader | None, limit: int) -> bytes:
    """Up to `limit` + 1 bytes (one more tells the caller it was cut), then the rest is read and dropped so the
    process never blocks on a full pipe."""
    if stream is None:
        return b""
    kept = bytearray()
    while chunk := await stream.read(2**16):
        if len(kept) <= limit:
            kept += chunk[: limit + 1 - len(kept)]
    return bytes(kept)


def _error_line(said: str, pid: int, code: int) -> str:
    lowered = said.lower()
    if any(sign in lowered for sign in _PERMISSION_SIGNS):
        return NO_PERMISSION.format(pid=pid)
    lines = [line.strip() for line in said.splitlines() if line.strip()]
    errors = [line.removeprefix("Error:").strip() for line in lines if line.startswith("Error:")]
    causes = [line.split(":", 1)[1].strip() for line in lines if line[:1].isdigit() and ":" in line]
    reason = "; ".join((errors[:1] or lines[:1]) + causes[:1]) or f"exited with {code}"
    return f"py-spy failed on process {pid}: {' '.join(reason.split())[:300]}"
