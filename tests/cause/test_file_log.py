"""--vllm-log FILE: the tail of a real file, and every way a file can fail to be a log."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from sidecar.actuators.file_log import FileLog, tail_text
from sidecar.actuators.log_source import LogUnreadableError, Wanted
from tests.cause.logs import oom_death


async def read(path: Path) -> str:
    result = await FileLog(path).read(until_wall_s=0.0, wanted=Wanted.DIED)
    assert result.where == f"file {path}"
    (run,) = result.runs
    return run.text


async def test_a_small_file_is_read_whole(tmp_path: Path) -> None:
    log = tmp_path / "vllm.log"
    log.write_text(oom_death())
    assert await read(log) == oom_death()


async def test_a_huge_file_gives_its_last_256_kib_from_a_whole_line(tmp_path: Path) -> None:
    log = tmp_path / "vllm.log"
    with log.open("wb") as handle:
        handle.truncate(2 * 2**30)  # 2 GiB of NUL bytes (sparse): only the tail may be read
        handle.seek(0, os.SEEK_END)
        handle.write(("padding line\n" * 30_000).encode() + oom_death().encode())
    text = await read(log)
    assert len(text.encode()) <= 256 * 2**10
    assert text.endswith(oom_death())
    assert text.startswith("padding line\n")  # the line cut by the start of the tail is dropped


def test_one_line_longer_than_the_bound_leaves_nothing_to_read(tmp_path: Path) -> None:
    log = tmp_path / "vllm.log"
    log.write_bytes(b"x" * (2 * 2**20))
    assert tail_text(log, 256 * 2**10) == ""


async def test_bytes_that_are_not_utf8_are_replaced(tmp_path: Path) -> None:
    log = tmp_path / "vllm.log"
    log.write_bytes(b"\xff\xfe\x00binary\n" + oom_death().encode())
    text = await read(log)
    assert text.startswith("\ufffd\ufffd\x00binary\n")
    assert text.endswith(oom_death())


async def test_an_empty_file_reads_as_empty(tmp_path: Path) -> None:
    log = tmp_path / "vllm.log"
    log.touch()
    assert await read(log) == ""


def _under_a_file(tmp: Path) -> Path:
    (tmp / "f").write_text("")
    return tmp / "f" / "x.log"


@pytest.mark.parametrize(
    ("make", "error"),
    [
        (lambda tmp: tmp / "missing.log", "No such file or directory"),
        (lambda tmp: tmp, "not a regular file"),
        (lambda tmp: Path("/dev/zero"), "not a regular file"),  # endless: never read
        (_under_a_file, "Not a directory"),
    ],
    ids=["missing", "directory", "device", "under-a-file"],
)
async def test_what_is_not_a_readable_file_is_one_line(
    tmp_path: Path, make: Callable[[Path], Path], error: str
) -> None:
    path = make(tmp_path)
    with pytest.raises(LogUnreadableError) as caught:
        await read(path)
    assert str(caught.value) == error


async def test_a_fifo_does_not_block_the_read(tmp_path: Path) -> None:
    """A named pipe with no writer would block open() (and the thread) forever: refused without waiting."""
    fifo = tmp_path / "vllm.log"
    os.mkfifo(fifo)
    with pytest.raises(LogUnreadableError, match="not a regular file"):
        await read(fifo)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to take away root's own permission")
def test_a_file_the_sidecars_user_may_not_read(tmp_path: Path) -> None:
    """Another user's file, mode 0600, read by a process without CAP_DAC_OVERRIDE: permission denied."""
    log = tmp_path / "vllm.log"
    log.write_text(oom_death())
    log.chmod(0o600)
    os.chown(log, 65534, 65534)
    code = (
        "import asyncio, sys; from pathlib import Path; from sidecar.actuators.file_log import FileLog; "
        "from sidecar.actuators.log_source import LogUnreadableError, Wanted\n"
        "try:\n    asyncio.run(FileLog(Path(sys.argv[1])).read(until_wall_s=0, wanted=Wanted.DIED))\n"
        "except LogUnreadableError as error:\n    print(error)"
    )
    result = subprocess.run(
        ["setpriv", "--bounding-set=-dac_override,-dac_read_search", sys.executable, "-c", code, str(log)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])},
        check=False,
    )
    assert result.stdout.strip() == "Permission denied", result.stderr
