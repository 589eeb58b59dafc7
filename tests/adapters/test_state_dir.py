"""An unusable --state-dir stops `vllm-sidecar run` at start: exit 2, one line naming the setting, the path, why,
and where the value came from. Written to only when the sidecar may restart vLLM (not a dry run, an adapter
other than none); otherwise a ledger there is only read, and a missing or read-only directory is fine.

The kernel's own refusals stand in for an unwritable directory, so the tests hold for root too: sysfs takes no
new file (EACCES) and no new directory (EPERM) from anyone.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sidecar.shell.daemon import check_state_dir
from sidecar.shell.ledger_store import IN_FLIGHT_FILE, LEDGER_FILE, state_dir_problem
from sidecar.shell.settings import SettingsError, load_settings
from sidecar.shell.state_file import StateFile, directory_problem
from tests.loopback import closed_port

UNWRITABLE = Path("/sys/fs")  # exists, a directory, and refuses a new file even to root
UNCREATABLE = Path("/sys/fs/vllm-sidecar-state")  # sysfs refuses mkdir


def _needs_sysfs() -> None:
    if not UNWRITABLE.is_dir():
        pytest.skip("no sysfs at /sys here")


def _run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    environment = {key: value for key, value in os.environ.items() if not key.startswith("VLLM_SIDECAR_")}
    environment.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "sidecar", "run", "--listen", f"127.0.0.1:{closed_port()}", *args],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
        env=environment,
    )


ACTING = ("--actuator", "exec", "--exec-command", "true")


def test_a_path_under_a_regular_file_stops_the_daemon_at_start_with_exit_2_and_one_line(tmp_path: Path) -> None:
    regular = tmp_path / "not-a-dir"
    regular.write_text("x")
    result = _run("--state-dir", str(regular / "state"), *ACTING)
    assert result.returncode == 2, result.stderr
    assert result.stderr.splitlines() == [
        f"vllm-sidecar: error: invalid setting state_dir='{regular}/state': {regular} is a file, not a directory; "
        "allowed: a directory path (flag --state-dir)"
    ]


def _refused(flags: dict[str, str]) -> str:
    """The one line `run` would print, in-process: check_state_dir is what the daemon calls first."""
    with pytest.raises(SettingsError) as raised:
        check_state_dir(load_settings(flags))
    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith("invalid setting state_dir="), message
    return message


def test_even_a_dry_run_stops_on_a_path_that_cannot_be_a_directory(tmp_path: Path) -> None:
    regular = tmp_path / "file"
    regular.write_text("x")
    assert "it is a file, not a directory" in _refused({"state_dir": str(regular), "dry_run": "true"})
    assert "is a file, not a directory" in _refused({"state_dir": str(regular / "s"), "actuator": "none"})


def test_where_the_path_came_from_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [name for name in os.environ if name.startswith("VLLM_SIDECAR_")]:
        monkeypatch.delenv(name)
    regular = tmp_path / "file"
    regular.write_text("x")
    acting = {"actuator": "exec", "exec_command": "true"}
    monkeypatch.setenv("VLLM_SIDECAR_STATE_DIR", str(regular / "s"))
    assert _refused(acting).endswith("(environment VLLM_SIDECAR_STATE_DIR)")
    monkeypatch.delenv("VLLM_SIDECAR_STATE_DIR")
    config = tmp_path / "sidecar.toml"
    config.write_text(f'state-dir = "{regular / "s"}"\n')
    assert _refused({"config": str(config), **acting}).endswith(f"(in {config})")


def test_a_directory_that_cannot_be_written_or_created_stops_a_sidecar_that_restarts() -> None:
    _needs_sysfs()
    acting = {"actuator": "exec", "exec_command": "true"}
    assert f"state_dir='{UNWRITABLE}': cannot write in it: " in _refused({"state_dir": str(UNWRITABLE), **acting})
    assert f"state_dir='{UNCREATABLE}': cannot create it: " in _refused({"state_dir": str(UNCREATABLE), **acting})
    assert not UNCREATABLE.exists()


def test_the_default_path_is_named_as_the_default_with_how_to_change_it() -> None:
    _needs_sysfs()
    settings = load_settings({"actuator": "exec", "exec_command": "true"})
    unusable = settings.model_copy(update={"state_dir": UNWRITABLE})  # keeps the origins load_settings found
    with pytest.raises(SettingsError) as raised:
        check_state_dir(unusable)
    assert str(raised.value).endswith(
        "(the default; set it with flag --state-dir, environment VLLM_SIDECAR_STATE_DIR)"
    ), raised.value


def test_a_missing_directory_is_created_when_the_sidecar_will_write_there(tmp_path: Path) -> None:
    state = tmp_path / "a" / "b" / "state"
    check_state_dir(load_settings({"state_dir": str(state), "actuator": "exec", "exec_command": "true"}))
    assert state.is_dir()
    assert list(state.iterdir()) == []  # the write check leaves nothing behind


@pytest.mark.parametrize(
    "flags",
    [{"dry_run": "true", "actuator": "exec", "exec_command": "true"}, {"actuator": "none"}],
    ids=["dry-run", "actuator-none"],
)
def test_a_sidecar_that_writes_nothing_needs_no_writable_or_existing_directory(
    flags: dict[str, str], tmp_path: Path
) -> None:
    _needs_sysfs()
    for path in (UNWRITABLE, UNCREATABLE, tmp_path / "missing"):
        check_state_dir(load_settings({"state_dir": str(path), **flags}))  # raises nothing
    assert not (tmp_path / "missing").exists()  # and creates nothing


@pytest.mark.parametrize("name", [LEDGER_FILE, IN_FLIGHT_FILE])
def test_a_ledger_that_cannot_be_read_stops_the_start_even_for_a_dry_run(name: str, tmp_path: Path) -> None:
    (tmp_path / name).mkdir()  # something that is not a file where the ledger goes
    for writable in (True, False):
        assert state_dir_problem(tmp_path, writable=writable) == f"{tmp_path / name} is not a regular file"
    os.mkfifo(tmp_path / "fifo")  # opening a FIFO to read it would block the start: refused without opening
    assert StateFile(tmp_path / "fifo").access_problem() == f"{tmp_path / 'fifo'} is not a regular file"


def test_a_corrupt_ledger_is_no_reason_to_stop(tmp_path: Path) -> None:
    (tmp_path / LEDGER_FILE).write_text("{not json")  # moved aside at load, the budget assumed spent: fail safe
    assert state_dir_problem(tmp_path, writable=True) is None


def test_directory_problems_are_one_line_for_every_shape(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    (tmp_path / "dir").mkdir()
    os.symlink(tmp_path / "file", tmp_path / "link-to-file")
    os.symlink(tmp_path / "dir", tmp_path / "link-to-dir")
    cases = {
        tmp_path / "file": "it is a file, not a directory",
        tmp_path / "file" / "x" / "y": f"{tmp_path / 'file'} is a file, not a directory",
        tmp_path / "link-to-file" / "x": f"{tmp_path / 'link-to-file'} is a file, not a directory",
        tmp_path / "link-to-dir": None,
        tmp_path / "dir": None,
        tmp_path / "new": None,
    }
    for path, expected in cases.items():
        assert directory_problem(path, create=True) == expected, path
    assert (tmp_path / "new").is_dir()


def test_a_missing_state_dir_is_created_and_the_daemon_starts(tmp_path: Path) -> None:
    state = tmp_path / "state"
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "sidecar",
            "run",
            "--listen",
            f"127.0.0.1:{closed_port()}",
            "--vllm-url",
            f"http://127.0.0.1:{closed_port()}",
            "--gpu-source",
            "none",
            "--log-format",
            "json",
            "--state-dir",
            str(state),
            *ACTING,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={key: value for key, value in os.environ.items() if not key.startswith("VLLM_SIDECAR_")},
    )
    try:
        assert process.stdout is not None
        first = process.stdout.readline()
        assert '"event": "started"' in first, first
        assert state.is_dir()
    finally:
        process.terminate()
        process.wait(timeout=15)


def _read_only_mount_missing() -> str | None:
    """Why a read-only file system cannot be mounted in a private mount namespace here, or None."""
    if shutil.which("unshare") is None:
        return "no unshare command"
    probe = subprocess.run(
        ["unshare", "-m", "--propagation", "private", "sh", "-c", "mount -t tmpfs -o ro none /mnt"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    return None if probe.returncode == 0 else f"cannot mount in a new mount namespace: {probe.stderr.strip()}"


def test_a_read_only_file_system_stops_a_sidecar_that_restarts_and_not_a_dry_run(tmp_path: Path) -> None:
    # What `docker run --read-only` without a volume on the state dir gives: EROFS, for root too.
    missing = _read_only_mount_missing()
    if missing is not None:
        pytest.skip(missing)
    mount = tmp_path / "ro"
    mount.mkdir()
    command = [sys.executable, "-m", "sidecar", "run", "--listen", f"127.0.0.1:{closed_port()}"]
    command += ["--vllm-url", f"http://127.0.0.1:{closed_port()}", "--gpu-source", "none", "--state-dir", str(mount)]
    # In the namespace: mount a read-only tmpfs, run the sidecar that would write there (exit 2 expected), then
    # a dry run on the same directory, sent SIGTERM once it logged that it started (a start slowed by a busy
    # machine is waited for, up to 60 s), its exit code kept.
    dry_run = shlex.join([*command, "--dry-run", "--log-format", "json"])
    dry_log = shlex.quote(str(tmp_path / "dry-run.log"))
    script = (
        f"mount -t tmpfs -o ro none {shlex.quote(str(mount))} && "
        f"{shlex.join([*command, *ACTING])}; echo exit=$?; "
        f"{dry_run} 2>{dry_log} & pid=$!; "
        f'for _ in $(seq 600); do grep -q \'"event": "started"\' {dry_log} && break; sleep 0.1; done; '
        f"kill -TERM $pid; wait $pid; echo exit=$?"
    )
    environment = {key: value for key, value in os.environ.items() if not key.startswith("VLLM_SIDECAR_")}
    result = subprocess.run(
        ["unshare", "-m", "--propagation", "private", "sh", "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=environment,
    )
    assert result.stdout.splitlines()[0] == "exit=2", result
    assert (
        f"vllm-sidecar: error: invalid setting state_dir='{mount}': cannot write in it: Read-only file system; "
        in result.stderr
    ), result.stderr
    assert result.stdout.splitlines()[1] == "exit=0", result  # the dry run ran, and stopped cleanly on SIGTERM
    dry_run_log = (tmp_path / "dry-run.log").read_text()
    assert '"event": "started"' in dry_run_log
    assert '"dry_run": true' in dry_run_log
    assert dry_run_log.rstrip("\n").splitlines()[-1].startswith('{"event": "stopped"')
