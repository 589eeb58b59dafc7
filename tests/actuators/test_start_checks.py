"""Every restart adapter is checked at start: a sidecar that could never restart vLLM stops with exit 2 and one
line naming the flag to change, dry run or not, instead of failing its first restart. systemd's answers come from
a real user manager (user_systemd.py); the command line runs as a real subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from sidecar.actuators.exec import program_problem
from sidecar.actuators.systemd import SystemdActuator
from sidecar.actuators.systemd_check import StartCheckError, check_flags_wiring, check_systemd
from sidecar.shell.acting_setup import build_acting_parts
from sidecar.shell.settings import SettingsError, load_settings
from tests.adapters.daemon_process import SidecarProcess
from tests.loopback import closed_port

from .units import service
from .user_systemd import UserSystemd


def _run(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """`vllm-sidecar run` that is expected to stop at start; nothing listens at its vLLM URL."""
    environment = {key: value for key, value in os.environ.items() if not key.startswith("VLLM_SIDECAR_")}
    environment.update(env)
    port = closed_port()
    return subprocess.run(
        [sys.executable, "-m", "sidecar", "run", "--listen", f"127.0.0.1:{port}", "--gpu-source", "none", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=environment,
    )


def _one_line(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 2, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr  # one line, never a traceback
    assert lines[0].startswith("vllm-sidecar: error: "), lines
    return lines[0]


def _unit_name(what: str) -> str:
    return f"{what}-{uuid.uuid4().hex[:8]}.service"


# --- systemd ------------------------------------------------------------------------------------------------


def test_a_unit_systemd_does_not_know_stops_even_a_dry_run(user_systemd: UserSystemd, tmp_path: Path) -> None:
    unit = _unit_name("ghost")
    result = _run(
        *("--actuator", "systemd", "--systemd-bus", "user", "--systemd-unit", unit, "--dry-run"),
        *("--state-dir", str(tmp_path)),
        env={"DBUS_SESSION_BUS_ADDRESS": user_systemd.bus_address},
    )
    assert _one_line(result) == (
        f"vllm-sidecar: error: invalid setting systemd_unit={unit!r}: systemd on the user bus knows no unit "
        f"{unit} (LoadState not-found): install its unit file and run `systemctl --user daemon-reload`, or name "
        "the unit that runs vLLM (flag --systemd-unit)"
    )


def test_a_known_unit_starts_the_daemon(user_systemd: UserSystemd, tmp_path: Path) -> None:
    unit = _unit_name("known")
    user_systemd.write_unit(unit, service("Type=exec", "ExecStart=/bin/sleep 1000", description="vLLM stand-in"))
    sidecar = SidecarProcess(
        [
            *("--actuator", "systemd", "--systemd-bus", "user", "--systemd-unit", unit),
            *("--vllm-url", f"http://127.0.0.1:{closed_port()}", "--gpu-source", "none", "--state-dir", str(tmp_path)),
        ],
        tmp_path / "sidecar.log",
        env={"DBUS_SESSION_BUS_ADDRESS": user_systemd.bus_address},
    )
    try:
        sidecar.wait_ready()
    finally:
        code, _ = sidecar.stop()
    assert code == 0
    events = [event["event"] for event in sidecar.events()]
    assert "started" in events
    assert "restart_right_unknown" not in events  # a user manager obeys its own user: nothing left unknown


@pytest.mark.parametrize(
    ("flags", "variable", "start", "flag"),
    [
        (
            ("--systemd-bus", "user"),
            "DBUS_SESSION_BUS_ADDRESS",
            "systemd_bus='user': cannot reach the user bus",
            "--systemd-bus",
        ),
        ((), "DBUS_SYSTEM_BUS_ADDRESS", "actuator='systemd': cannot reach the system bus", "--actuator"),
    ],
)
def test_a_bus_that_cannot_be_reached_stops_the_start(
    tmp_path: Path, flags: tuple[str, ...], variable: str, start: str, flag: str
) -> None:
    """The flag named is the one the user gave: --systemd-bus when chosen, else --actuator (systemd is not here)."""
    address = f"unix:path={tmp_path / 'no-bus'}"
    result = _run("--actuator", "systemd", *flags, "--state-dir", str(tmp_path), env={variable: address})
    line = _one_line(result)
    assert line.startswith(f"vllm-sidecar: error: invalid setting {start} at {address} ([Errno 2] "), line
    assert line.endswith(f"(flag {flag})"), line


def test_remediate_without_a_restart_adapter_stops_the_start(tmp_path: Path) -> None:
    """A subprocess: the daemon configures its logging before it builds the adapters, which an in-process run
    would leave pointing at a closed capture for every later test."""
    line = _one_line(_run("--remediate", "max-num-seqs=8..64", "--state-dir", str(tmp_path), env={}))
    assert "needs --actuator systemd, exec or kubernetes" in line
    assert line.endswith("(flag --remediate)"), line


async def test_with_remediate_the_unit_must_start_vllm_with_the_flags_file(
    user_systemd: UserSystemd, tmp_path: Path
) -> None:
    """--remediate writes the flags for vLLM's next start into a file: the unit must read it and put its
    variable, unbraced (split into words), on vLLM's command line. Asked of systemd's own view of the unit."""
    flags = tmp_path / "vllm-flags.env"
    wired, bare, braced = _unit_name("wired"), _unit_name("bare"), _unit_name("braced")
    user_systemd.write_unit(
        wired,
        service(f"EnvironmentFile=-{flags}", "ExecStart=/bin/sleep 1000 $VLLM_SIDECAR_FLAGS", description="x"),
    )
    user_systemd.write_unit(bare, service("ExecStart=/bin/sleep 1000", description="x"))
    user_systemd.write_unit(
        braced,
        service(f"EnvironmentFile=-{flags}", "ExecStart=/bin/sleep 1000 ${VLLM_SIDECAR_FLAGS}", description="x"),
    )
    user_systemd.call("Reload")

    await check_flags_wiring(_actuator(user_systemd, wired), flags)
    with pytest.raises(StartCheckError) as missing:
        await check_flags_wiring(_actuator(user_systemd, bare), flags)
    with pytest.raises(StartCheckError) as one_word:
        await check_flags_wiring(_actuator(user_systemd, braced), flags)

    assert str(missing.value) == (
        f"{bare} does not start vLLM with the flags the sidecar sets: add EnvironmentFile=-{flags} and "
        "$VLLM_SIDECAR_FLAGS (unbraced) at the end of ExecStart= (deploy/systemd/vllm.service.example; "
        "docs/remediation.md)"
    )
    assert "add $VLLM_SIDECAR_FLAGS (unbraced) at the end of ExecStart=" in str(one_word.value)
    # From the command line: one line naming --remediate.
    line = _one_line(
        _run(
            *("--actuator", "systemd", "--systemd-bus", "user", "--systemd-unit", bare),
            *("--state-dir", str(tmp_path), "--remediate", "max-model-len=256..4096"),
            env={"DBUS_SESSION_BUS_ADDRESS": user_systemd.bus_address},
        )
    )
    assert "does not start vLLM with the flags the sidecar sets" in line
    assert line.endswith("(flag --remediate)"), line


async def test_a_unit_file_systemd_cannot_load_or_a_masked_unit_is_said(user_systemd: UserSystemd) -> None:
    broken = _unit_name("no-exec-start")
    user_systemd.write_unit(broken, service("Type=exec", description="a service with nothing to run"))
    masked = _unit_name("masked")
    (user_systemd.unit_dir / masked).symlink_to("/dev/null")  # what `systemctl --user mask` writes
    user_systemd.call("Reload")

    with pytest.raises(StartCheckError) as unloadable:
        await check_systemd(_actuator(user_systemd, broken), uid=0)
    with pytest.raises(StartCheckError) as refused:
        await check_systemd(_actuator(user_systemd, masked), uid=0)

    assert not unloadable.value.bus
    assert str(unloadable.value).startswith(f"systemd cannot load {broken} (LoadState bad-setting: "), unloadable.value
    assert str(unloadable.value).endswith(f"`systemctl --user status {broken}` names the line")
    assert str(refused.value) == f"{masked} is masked: systemd will not start it; `systemctl --user unmask {masked}`"


async def test_the_right_to_restart_is_unknown_only_for_a_non_root_caller_on_the_system_bus(
    user_systemd: UserSystemd,
) -> None:
    """polkit tells only root beforehand (see systemd_check.py); the user manager stands in for the system one."""
    unit = _unit_name("right")
    user_systemd.write_unit(unit, service("Type=exec", "ExecStart=/bin/sleep 1000", description="x"))
    system = SystemdActuator(unit, bus="system", bus_address=user_systemd.bus_address)

    assert await check_systemd(system, uid=0) is None
    assert await check_systemd(_actuator(user_systemd, unit), uid=1000) is None
    unknown = await check_systemd(system, uid=1000)
    assert unknown is not None
    assert unknown.startswith(f"whether uid 1000 may restart {unit} is polkit's to say"), unknown


def test_a_unit_name_systemd_would_refuse_names_where_it_was_set() -> None:
    with pytest.raises(SettingsError) as refused:
        build_acting_parts(load_settings({"actuator": "systemd", "systemd_unit": "vllm.socket"}))
    assert str(refused.value) == (
        "invalid setting systemd_unit='vllm.socket': systemd unit name 'vllm.socket' does not end in '.service'; "
        "only a service can be restarted; allowed: a unit name (flag --systemd-unit)"
    )


def _actuator(manager: UserSystemd, unit: str) -> SystemdActuator:
    return SystemdActuator(unit, bus="user", bus_address=manager.bus_address)


# --- exec ---------------------------------------------------------------------------------------------------


def test_a_program_that_is_not_there_stops_the_start(tmp_path: Path) -> None:
    result = _run(
        *("--actuator", "exec", "--exec-command", "restart-vllm-nowhere --now", "--state-dir", str(tmp_path)),
        env={"PATH": "/usr/bin:/bin"},
    )
    assert _one_line(result) == (
        "vllm-sidecar: error: invalid setting exec_command='restart-vllm-nowhere --now': no program "
        "'restart-vllm-nowhere' on the sidecar's PATH (/usr/bin:/bin): install it, or give its full path "
        "(flag --exec-command)"
    )


def test_a_program_is_found_the_way_the_restart_finds_it(tmp_path: Path) -> None:
    script = tmp_path / "restart.sh"
    script.write_text("#!/bin/sh\n")
    script.chmod(0o644)

    assert program_problem("true") is None  # a bare name, on PATH
    assert program_problem(sys.executable) is None
    assert program_problem(str(script)) == f"{script} is not executable by the sidecar's user: chmod +x {script}"
    assert program_problem(str(tmp_path)) == f"{tmp_path} is a directory, not a program"
    missing = tmp_path / "gone.sh"
    assert program_problem(str(missing)) == (
        f"{missing} does not exist: give the path of the program that restarts vLLM"
    )
    script.chmod(0o755)
    assert program_problem(str(script)) is None
