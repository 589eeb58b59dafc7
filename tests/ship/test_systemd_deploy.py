"""deploy/systemd/ on a real systemd: a Debian 12 system (PID 1 systemd 252, its system bus, polkitd 122) booted
in systemd-nspawn, with the sidecar installed the way deploy/systemd/README.md says and the simulator as
vllm.service (made from vllm.service.example).

What it proves: the shipped unit starts the daemon as its own user, sandboxed, and becomes active only on the
daemon's READY=1; the sandbox refuses what it should and lets through what the daemon needs; POST
/admin/restart restarts vllm.service through polkit (the caller is not root), while the same user is refused
every other unit and verb, and a sidecar pointed at another unit is refused; the allocator probe's folder
(vllm.service's RuntimeDirectory=, the sidecar's drop-in) is read and cleaned by the sandboxed sidecar, across a
restart of vLLM; a vLLM that exits 0 (as vLLM does when its engine dies) is started again by systemd
(Restart=always) and left to it by the sidecar, while `systemctl stop` holds against both; the sidecar survives
vLLM's stops and restarts; a frozen sidecar is killed by the watchdog (WatchdogSec=3s in a drop-in, for speed)
and restarted; the README's uninstall removes every trace of the sidecar and leaves vLLM running. The root file
system comes from .ci/build-rootfs.sh (VLLM_SIDECAR_ROOTFS); without it these tests are skipped, except in CI
(CI=true), where that is a failure.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import time
import tomllib
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from sidecar.policy.settings import PolicySettings
from tests.conftest import required_in_ci
from tests.loopback import closed_port

from .nspawn import Container, boot, missing_requirements
from .systemd_install import (
    ALLOCATOR_PROBE_STEPS,
    BYSTANDER_UNIT,
    DEPLOY,
    EXAMPLE_CHECK_UNIT,
    INSTALL_STEPS,
    PROBE_DIR,
    PROBE_OUTPUT,
    PROBE_PATH,
    PROBE_UNIT,
    SIDECAR_UNIT,
    UNINSTALL_STEPS,
    VENV,
    VLLM_UNIT,
    Installed,
    install,
)

ROOTFS_ENV = "VLLM_SIDECAR_ROOTFS"
SIDECAR_USER = "vllm-sidecar"
STATE_DIR = "/var/lib/vllm-sidecar"  # the unit's StateDirectory=, made by systemd rather than by an install step
CLD_EXITED = 1  # ExecMainCode of a main process that exited (rather than was killed by a signal)
MAX_EXPOSURE = 2.0  # systemd-analyze security: 1.8 when written; a change that loosens the sandbox must say so
TEST_WATCHDOG_S = 3  # the drop-in's WatchdogSec (the shipped 30 s would make the test wait 15-30 s)
BUSCTL_MANAGER = ("busctl", "call", "org.freedesktop.systemd1", "/org/freedesktop/systemd1")
MANAGER_INTERFACE = "org.freedesktop.systemd1.Manager"
# the policy's states in which it has seen vLLM and takes a manual restart (cooldown: a restart is in the
# ledger, which survives the sidecar's own restarts)
SETTLED = ("normal", "cooldown")
REPORT_LINES = 25  # of each journal in a timeout's report


@dataclass(frozen=True, slots=True, kw_only=True)
class Deployment:
    container: Container
    installed: Installed

    def get(self, path: str) -> httpx.Response:
        return httpx.get(self.installed.sidecar_url + path, timeout=5)

    def uid(self, user: str) -> int:
        return self.container.ids(user)[0]

    def active(self, unit: str) -> bool:
        return self.container.unit_property(unit, "ActiveState") == "active"

    def sidecar_events(self) -> list[dict[str, object]]:
        """The daemon's JSON log lines, from the journal."""
        lines = self.container.journal(SIDECAR_UNIT).splitlines()
        return [json.loads(line) for line in lines if line.startswith("{")]

    def wait(self, predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
        """`_wait`, and on a timeout the units' states and journals: a red run says why, not only that."""
        try:
            _wait(predicate, timeout_s, what)
        except AssertionError as error:
            raise AssertionError(f"{error}\n{self.units_report()}") from None

    def units_report(self) -> str:
        """Each unit's state, restarts and last result, its journal's tail, then the container's console."""
        parts = []
        for unit in (VLLM_UNIT, SIDECAR_UNIT):
            states = [
                f"{name}={_or_why(read, unit, name)}"
                for read, names in (
                    (self.container.unit_property, ("ActiveState", "SubState")),
                    (self.container.service_property, ("Result", "NRestarts", "ExecMainStatus")),
                )
                for name in names
            ]
            journal = _or_why(self.container.journal, unit).splitlines()[-REPORT_LINES:]
            parts += [f"--- {unit}: {', '.join(states)}", *journal]
        parts.append(f"--- the container's console\n{self.container.log_tail(REPORT_LINES)}")
        return "\n".join(parts)

    def busctl_as(self, user: str, method: str, signature: str, *args: str) -> tuple[int, str]:
        """A call on systemd's Manager as `user`, from inside the container: (exit status, output)."""
        result = self.container.run(
            *BUSCTL_MANAGER, MANAGER_INTERFACE, method, signature, *args, user=user, check=False
        )
        return result.returncode, (result.stdout + result.stderr).strip()


def _missing() -> str | None:
    rootfs = os.environ.get(ROOTFS_ENV)
    if not rootfs:
        return f'{ROOTFS_ENV} is not set (eval "$(.ci/build-rootfs.sh)")'
    if not (Path(rootfs) / ".complete").is_file():
        return f"{ROOTFS_ENV}={rootfs} is not a finished root file system (no .complete)"
    return missing_requirements()


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    """One booted container for the module; each test leaves the sidecar and vllm.service running."""
    missing = _missing()
    if missing is not None:
        if required_in_ci():
            pytest.fail(
                f"the systemd deployment tests need a root file system in CI (CI=true): {missing}", pytrace=False
            )
        pytest.skip(f"systemd deployment tests: {missing}")
    base = tmp_path_factory.mktemp("systemd-deploy")
    root = base / "root"
    vllm_port = closed_port()
    sidecar_port = next(port for port in iter(closed_port, None) if port != vllm_port)
    try:
        installed = install(
            Path(os.environ[ROOTFS_ENV]), root, wheels=base / "wheels", vllm_port=vllm_port, sidecar_port=sidecar_port
        )
        container = boot(
            root,
            machine=f"vllm-sidecar-test-{uuid.uuid4().hex[:8]}",
            bus_dir=base / "bus",
            log_path=base / "container.log",
        )
        try:
            deployment = Deployment(container=container, installed=installed)
            deployment.wait(
                lambda: deployment.active(SIDECAR_UNIT) and deployment.active(VLLM_UNIT), 30, "both units active"
            )
            deployment.wait(
                lambda: _status_code(deployment, "/readyz") == 200, 30, "the sidecar's /readyz to answer 200"
            )
            yield deployment
        finally:
            container.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)  # 300 MB; pytest keeps the last three runs' folders


def test_unit_files_pass_systemd_analyze_verify(deployment: Deployment) -> None:
    units = [f"/etc/systemd/system/{unit}" for unit in (SIDECAR_UNIT, EXAMPLE_CHECK_UNIT, VLLM_UNIT)]
    result = deployment.container.run("systemd-analyze", "verify", *units, check=False)
    assert (result.returncode, result.stdout + result.stderr) == (0, "")


def test_security_exposure_stays_low(deployment: Deployment) -> None:
    result = deployment.container.run(
        "systemd-analyze", "security", "--offline=yes", "--no-pager", f"/etc/systemd/system/{SIDECAR_UNIT}"
    )
    match = re.search(rf"Overall exposure level for {re.escape(SIDECAR_UNIT)}: (\d+\.\d+)", result.stdout)
    assert match is not None, result.stdout
    exposure = float(match.group(1))
    # shown with -s: the score is quoted in the README and in reviews
    print(f"systemd-analyze security --offline=yes {SIDECAR_UNIT}: {exposure}")
    assert exposure <= MAX_EXPOSURE, result.stdout


def test_the_sidecar_is_ready_as_its_own_user_with_its_state_dir(deployment: Deployment) -> None:
    container = deployment.container
    # Type=notify: "active" only after READY=1; the status line came in the same message, from a process
    # that is neither root nor privileged
    assert container.service_property(SIDECAR_UNIT, "Type") == "notify"
    assert container.unit_property(SIDECAR_UNIT, "SubState") == "running"
    status_text = container.service_property(SIDECAR_UNIT, "StatusText")
    assert status_text == f"watching http://127.0.0.1:{deployment.installed.vllm_port}"
    uid = deployment.uid(SIDECAR_USER)
    assert uid != 0
    status = _proc_status(container, container.main_pid(SIDECAR_UNIT))
    assert status["Uid"].split() == [str(uid)] * 4
    assert (status["NoNewPrivs"], status["Seccomp"], int(status["CapEff"], 16)) == ("1", "2", 0)
    # MemoryMax=256M must leave the daemon room (about 60 MB when written)
    assert int(status["VmHWM"].removesuffix(" kB")) < 128 * 1024, status["VmHWM"]
    state_dir = (deployment.installed.root / "var/lib/vllm-sidecar").stat()
    assert (state_dir.st_uid, state_dir.st_mode & 0o777) == (uid, 0o750)
    assert _status_code(deployment, "/healthz") == 200
    assert _status_code(deployment, "/readyz") == 200
    started = next(event for event in deployment.sidecar_events() if event["event"] == "started")
    # from the shipped config.toml, with the test's env file on top
    assert (started["actuator"], started["gpu_source"]) == ("systemd", "sim")
    for name, expected in {
        "User": SIDECAR_USER,
        "ProtectSystem": "strict",
        "ProtectHome": "yes",
        "NoNewPrivileges": True,
        "PrivateTmp": True,
        "MemoryDenyWriteExecute": True,
        "CapabilityBoundingSet": 0,
        "DevicePolicy": "closed",
        "NotifyAccess": "main",
        "WatchdogUSec": 30_000_000,
        "MemoryMax": 256 * 2**20,
    }.items():
        assert container.service_property(SIDECAR_UNIT, name) == expected, name


def test_the_sandbox_refuses_what_it_should_and_allows_what_the_daemon_needs(deployment: Deployment) -> None:
    container = deployment.container
    container.run("systemctl", "start", PROBE_UNIT)  # Type=oneshot: returns when the probe has finished
    sandboxed = json.loads(container.run("cat", PROBE_OUTPUT).stdout)
    # the same probe as the same user, without the unit: every refusal below must come from the sandbox
    bare = json.loads(container.run(f"{VENV}/bin/python", PROBE_PATH, user=SIDECAR_USER).stdout)
    assert bare["user"] == sandboxed["user"] == SIDECAR_USER
    refused = {
        "write_own_dir_outside_state_dir": "EROFS",  # ProtectSystem=strict
        "list_home": "EACCES",  # ProtectHome=yes
        "map_writable_executable": "EPERM",  # MemoryDenyWriteExecute=yes
        "netlink_socket": "EAFNOSUPPORT",  # RestrictAddressFamilies=
    }
    assert {check: sandboxed[check] for check in refused} == refused
    assert {check: bare[check] for check in refused} == dict.fromkeys(refused, "ok")
    needed = ("write_state_dir", "ctypes_callback", "compiled_extensions", "read_other_users_cmdline")
    assert {check: sandboxed[check] for check in needed} == dict.fromkeys(needed, "ok")
    assert sandboxed["status"] == {"CapEff": "0" * 16, "CapBnd": "0" * 16, "NoNewPrivs": "1", "Seccomp": "2"}
    assert bare["status"]["NoNewPrivs"] == "0"


def test_admin_restart_restarts_vllm_through_polkit(deployment: Deployment) -> None:
    container = deployment.container
    deployment.wait(lambda: _policy_state(deployment) in SETTLED, 30, "the policy to have seen vLLM")
    sidecar_pid = container.main_pid(SIDECAR_UNIT)
    vllm_pid = container.main_pid(VLLM_UNIT)
    answer = httpx.post(
        deployment.installed.sidecar_url + "/admin/restart",
        headers={"Authorization": f"Bearer {deployment.installed.token}"},
        timeout=5,
    )
    assert answer.status_code == 200, answer.text
    deployment.wait(lambda: _restart_outcomes(deployment) != [], 30, "the sidecar to report the restart's outcome")
    outcomes = [(event["adapter"], event["status"]) for event in _restart_outcomes(deployment)]
    assert outcomes == [("systemd", "done")], deployment.container.journal(SIDECAR_UNIT)[-3000:]
    assert container.main_pid(VLLM_UNIT) not in (0, vllm_pid)
    assert deployment.active(VLLM_UNIT)
    assert container.service_property(VLLM_UNIT, "NRestarts") == 0  # a restart job, not systemd's Restart=
    # Each start of the shipped vLLM unit waited for the GPUs to be free of the old vLLM first (ExecStartPre);
    # with no NVML in the container that is nothing to wait for, and said so.
    waited = "vllm-sidecar wait-gpu: cannot read the GPUs (NVML not available: "
    deployment.wait(
        lambda: container.journal(VLLM_UNIT).count(waited) == 2, 10, "both starts' wait-gpu line in the journal"
    )
    # the caller is not root, so systemd asked polkit (polkitd is D-Bus activated by the first question)
    assert deployment.active("polkit.service")
    # wanted by the sidecar, not bound to it: vLLM's restart left the sidecar alone
    assert container.main_pid(SIDECAR_UNIT) == sidecar_pid
    ledger_path = deployment.installed.root / "var/lib/vllm-sidecar/restart-ledger.json"
    assert ledger_path.stat().st_uid == deployment.uid(SIDECAR_USER)
    assert [record["reason"] for record in json.loads(ledger_path.read_text())["restarts"]] == ["manual"]
    deployment.wait(lambda: _policy_state(deployment) in SETTLED, 30, "the policy to see vLLM back")
    # The restart's notifications say what vLLM's journal said: the shipped unit (its group, its sandbox) may
    # read it. The simulator prints vLLM's start lines and no crash: the log was read, and holds no cause.
    cause = deployment.get("/status").json()["policy"]["crash_cause"]
    assert cause["source"].startswith(f"journal of {VLLM_UNIT} (system manager), invocation "), cause
    assert cause["summary"] == "vLLM's log shows no crash (no CUDA out-of-memory error, refused start or dead engine)"


def test_the_polkit_rule_allows_restarting_and_killing_vllm_and_nothing_else(deployment: Deployment) -> None:
    container = deployment.container
    container.run("systemctl", "start", BYSTANDER_UNIT)
    vllm_pid = container.main_pid(VLLM_UNIT)
    bystander_pid = container.main_pid(BYSTANDER_UNIT)
    denied = {
        "RestartUnit bystander.service": deployment.busctl_as(
            SIDECAR_USER, "RestartUnit", "ss", BYSTANDER_UNIT, "replace"
        ),
        "StopUnit bystander.service": deployment.busctl_as(SIDECAR_USER, "StopUnit", "ss", BYSTANDER_UNIT, "replace"),
        "StopUnit vllm.service": deployment.busctl_as(SIDECAR_USER, "StopUnit", "ss", VLLM_UNIT, "replace"),
        "StartUnit vllm.service": deployment.busctl_as(SIDECAR_USER, "StartUnit", "ss", VLLM_UNIT, "replace"),
        "TryRestartUnit vllm.service": deployment.busctl_as(SIDECAR_USER, "TryRestartUnit", "ss", VLLM_UNIT, "replace"),
        "KillUnit bystander.service": deployment.busctl_as(
            SIDECAR_USER, "KillUnit", "ssi", BYSTANDER_UNIT, "all", "15"
        ),
        "Reload (the manager)": deployment.busctl_as(SIDECAR_USER, "Reload", ""),
    }
    assert {call: outcome for call, outcome in denied.items() if outcome[1] != "Call failed: Access denied"} == {}
    # nothing happened to either unit
    assert (container.main_pid(VLLM_UNIT), container.main_pid(BYSTANDER_UNIT)) == (vllm_pid, bystander_pid)
    # the rule names one user: another unprivileged user gets polkit's default (an administrator's password)
    status, output = deployment.busctl_as("nobody", "RestartUnit", "ss", VLLM_UNIT, "replace")
    assert status != 0
    assert "Interactive authentication required" in output or "Access denied" in output, output
    assert container.main_pid(VLLM_UNIT) == vllm_pid
    # vllm.service's processes may be signalled (a hard restart's SIGKILL): SIGCONT here, which changes nothing
    status, output = deployment.busctl_as(SIDECAR_USER, "KillUnit", "ssi", VLLM_UNIT, "main", str(int(signal.SIGCONT)))
    assert status == 0, output
    assert container.main_pid(VLLM_UNIT) == vllm_pid
    # the control: the same command, the one thing allowed, works (a broken busctl or polkit would fail it)
    status, output = deployment.busctl_as(SIDECAR_USER, "RestartUnit", "ss", VLLM_UNIT, "replace")
    assert (status, output.split()[0]) == (0, "o"), output
    deployment.wait(
        lambda: container.main_pid(VLLM_UNIT) not in (0, vllm_pid), 15, "the allowed restart to run a new vLLM"
    )
    deployment.wait(lambda: deployment.active(VLLM_UNIT), 15, "vllm.service active again")
    container.run("systemctl", "stop", BYSTANDER_UNIT)


def test_a_sidecar_pointed_at_another_unit_is_refused(deployment: Deployment) -> None:
    """--systemd-unit changed without the polkit rule (README: both change together): the restart is refused."""
    container = deployment.container
    env = deployment.installed.root / "etc/vllm-sidecar/env"
    original = env.read_text()
    env.write_text(original + f"VLLM_SIDECAR_SYSTEMD_UNIT={BYSTANDER_UNIT}\n")
    try:
        container.run("systemctl", "start", BYSTANDER_UNIT)
        bystander_pid = container.main_pid(BYSTANDER_UNIT)
        container.run("systemctl", "restart", SIDECAR_UNIT)
        deployment.wait(lambda: _policy_state(deployment) in SETTLED, 30, "the policy to have seen vLLM")
        before = len(_restart_outcomes(deployment))
        answer = httpx.post(
            deployment.installed.sidecar_url + "/admin/restart",
            headers={"Authorization": f"Bearer {deployment.installed.token}"},
            timeout=5,
        )
        assert answer.status_code == 200, answer.text
        deployment.wait(
            lambda: len(_restart_outcomes(deployment)) > before, 30, "the sidecar to report the restart's outcome"
        )
        (outcome,) = _restart_outcomes(deployment)[before:]
        assert (outcome["adapter"], outcome["status"]) == ("systemd", "failed")
        assert "AccessDenied" in str(outcome["detail"]), outcome
        assert container.main_pid(BYSTANDER_UNIT) == bystander_pid
    finally:
        env.write_text(original)
        container.run("systemctl", "stop", BYSTANDER_UNIT)
        container.run("systemctl", "restart", SIDECAR_UNIT)
    deployment.wait(lambda: _status_code(deployment, "/readyz") == 200, 30, "the sidecar to admit again")


# A sample as a vLLM process that died without its exit handler leaves it: an hour old, its pid long gone
# (above any pid_max), owned by vLLM's user. Written with the sidecar's venv Python, readable by everyone.
DEAD_PROCESS_SAMPLE = """
import json, pathlib, sys, time
folder = pathlib.Path(sys.argv[1])
live = json.loads(next(folder.glob("[0-9]*.json")).read_text())
live.update(pid=999999999, time_unix_s=time.time() - 3600)
(folder / "999999999.json").write_text(json.dumps(live))
"""


def test_the_allocator_probe_folder_is_shared_and_cleaned(deployment: Deployment) -> None:
    """vllm.service makes /run/vllm-probe for its user (0770) and its processes write there; the sidecar, in
    vLLM's group through the drop-in, reads the files from inside its sandbox and removes a dead process's,
    before and after a restart of vLLM (the folder kept), and after a stop (the folder removed) and a start."""
    _assert_the_probe_folder_is_read_and_cleaned(deployment)
    container = deployment.container
    old_pid = container.main_pid(VLLM_UNIT)
    container.run("systemctl", "restart", VLLM_UNIT)
    deployment.wait(lambda: container.main_pid(VLLM_UNIT) not in (0, old_pid), 15, "a new vLLM")
    _assert_the_probe_folder_is_read_and_cleaned(deployment)
    # A stop removes the folder and its files; the start after it makes a new one, which the running sidecar
    # reads and cleans too (systemd 252 leaves /run writable under ProtectSystem=strict, so the new folder is
    # writable to it even though the sandbox bound the old one).
    container.run("systemctl", "stop", VLLM_UNIT)
    assert container.run("test", "-e", PROBE_DIR, check=False).returncode == 1
    container.run("systemctl", "start", VLLM_UNIT)
    _assert_the_probe_folder_is_read_and_cleaned(deployment)
    deployment.wait(lambda: _status_code(deployment, "/readyz") == 200, 30, "the sidecar to admit again")
    # Three starts of vllm.service here on top of the earlier tests' restarts: clear systemd's start rate limit
    # (5 in 10 s by default) for the tests after this one.
    container.run("systemctl", "reset-failed", VLLM_UNIT)


def _assert_the_probe_folder_is_read_and_cleaned(deployment: Deployment) -> None:
    container = deployment.container
    # /run is the container's own tmpfs: looked at from inside
    owner = container.run("stat", "--format=%u %g %a", PROBE_DIR).stdout.split()
    assert owner == [*map(str, container.ids("vllm")), "770"]
    own = [f"{container.main_pid(VLLM_UNIT)}.json"]
    deployment.wait(lambda: _probe_files(deployment) == own, 15, f"vLLM to write {own[0]} alone")
    # ok: a fresh sample read, from inside the sandbox (the group opens the folder, the file is 0644)
    deployment.wait(lambda: _probe_source(deployment) == (True, None), 15, f"the sidecar to read {own[0]}")
    container.run(f"{VENV}/bin/python", "-c", DEAD_PROCESS_SAMPLE, PROBE_DIR, user="vllm")
    deployment.wait(lambda: _probe_files(deployment) == own, 15, "the sidecar to remove the dead process's file")
    assert _probe_source(deployment) == (True, None)


def _probe_files(deployment: Deployment) -> list[str]:
    listing = deployment.container.run("ls", "-A", PROBE_DIR).stdout.split()
    return sorted(name for name in listing if name.endswith(".json"))


def _probe_source(deployment: Deployment) -> tuple[object, object] | None:
    """The sidecar's probe source in /status: (ok, error)."""
    try:
        source = deployment.get("/status").json()["sources"]["probe"]
        return source["ok"], source["error"]
    except (httpx.HTTPError, ValueError, KeyError, TypeError):
        return None


def test_a_vllm_that_exits_0_is_started_again_by_systemd(deployment: Deployment) -> None:
    """vLLM's API server exits 0 when its engine core dies. The example's Restart=always starts it again after
    RestartSec (on-failure would leave it stopped); the sidecar sees systemd's pending auto-restart, leaves it to
    systemd (no restart of its own) and reports vLLM back."""
    container = deployment.container
    deployment.wait(lambda: _policy_state(deployment) in SETTLED, 30, "the policy to have seen vLLM")
    # The policy's state may still be its reading of the vLLM an earlier test restarted, and a SIGTERM to a
    # simulator that has not yet set its handlers kills it (ExecMainCode 2, status 15) instead of ending it.
    deployment.wait(lambda: _serving_main_pid(deployment) is not None, 30, "vLLM's main process to serve")
    old_pid = _serving_main_pid(deployment)
    assert old_pid is not None
    restarts = container.service_property(VLLM_UNIT, "NRestarts")
    assert isinstance(restarts, int)
    outcomes = len(_restart_outcomes(deployment))
    actions = len(_actions(deployment))
    # SIGTERM from outside systemd, no stop job: the simulator shuts down and exits 0 by itself, which is all
    # systemd sees of vLLM's exit after EngineDeadError.
    container.run("sh", "-c", 'kill -TERM "$0"', str(old_pid))  # the shell's kill: the rootfs has no procps
    deployment.wait(lambda: container.unit_property(VLLM_UNIT, "SubState") == "auto-restart", 10, "a scheduled restart")
    ended = {name: container.service_property(VLLM_UNIT, name) for name in ("ExecMainCode", "ExecMainStatus", "Result")}
    assert ended == {"ExecMainCode": CLD_EXITED, "ExecMainStatus": 0, "Result": "success"}
    deployment.wait(
        lambda: container.main_pid(VLLM_UNIT) not in (0, old_pid), _restart_s(deployment) + 15, "a new vLLM"
    )
    assert container.service_property(VLLM_UNIT, "NRestarts") == restarts + 1
    deployment.wait(lambda: _status_code(deployment, "/readyz") == 200, 30, "the sidecar to admit again")
    deployment.wait(lambda: len(_actions(deployment)) > actions, 15, "the sidecar to report vLLM back")
    said = [(event["action"], str(event["reason"])) for event in _actions(deployment)[actions:]]
    assert [action for action, _ in said] == ["notify_vllm_recovered"], said
    assert said[0][1].endswith("and it came back without a restart by the sidecar"), said
    assert len(_restart_outcomes(deployment)) == outcomes


def _serving_main_pid(deployment: Deployment) -> int | None:
    """vLLM's main PID, if that process answers /health: the simulator sets its signal handlers before it
    listens, and systemd starts a new main process only after the old one has gone, so the answer is its own."""
    pid = deployment.container.main_pid(VLLM_UNIT)
    try:
        healthy = httpx.get(f"http://127.0.0.1:{deployment.installed.vllm_port}/health", timeout=5).status_code == 200
    except httpx.HTTPError:
        return None
    return pid if pid and healthy and deployment.container.main_pid(VLLM_UNIT) == pid else None


def test_stopping_vllm_holds_and_leaves_the_sidecar_running(deployment: Deployment) -> None:
    """Restart=always restarts no unit stopped by a stop job, and the sidecar reads the stop as its operator's:
    vLLM stays stopped past the example's RestartSec and --down-unsupervised-after (both 10 s)."""
    container = deployment.container
    sidecar_pid = container.main_pid(SIDECAR_UNIT)
    restarts = container.service_property(VLLM_UNIT, "NRestarts")
    outcomes = len(_restart_outcomes(deployment))
    container.run("systemctl", "stop", VLLM_UNIT)
    try:
        stopped = ("inactive", "dead", restarts, outcomes)
        held_s = max(_restart_s(deployment), PolicySettings().down_unsupervised_after_s) + 3
        _stays(lambda: _vllm_stopped(deployment) == stopped, held_s, "vLLM to stay stopped")
        assert deployment.active(SIDECAR_UNIT)
        assert container.main_pid(SIDECAR_UNIT) == sidecar_pid
    finally:
        container.run("systemctl", "start", VLLM_UNIT)
    deployment.wait(lambda: _status_code(deployment, "/readyz") == 200, 30, "the sidecar to admit again")


def test_the_watchdog_kills_and_restarts_a_frozen_sidecar(deployment: Deployment) -> None:
    """With a drop-in: WatchdogSec=3s (pings every 1.5 s) and RestartSec=500ms, to keep the test short."""
    container = deployment.container
    drop_in = deployment.installed.root / f"etc/systemd/system/{SIDECAR_UNIT}.d/50-test-watchdog.conf"
    drop_in.parent.mkdir(exist_ok=True)
    # LimitCORE=0: the watchdog's SIGABRT would otherwise leave a core file wherever the host's core_pattern says
    drop_in.write_text(f"[Service]\nWatchdogSec={TEST_WATCHDOG_S}s\nRestartSec=500ms\nLimitCORE=0\n")
    try:
        container.run("systemctl", "daemon-reload")
        container.run("systemctl", "restart", SIDECAR_UNIT)  # returns on READY=1
        assert container.service_property(SIDECAR_UNIT, "WatchdogUSec") == TEST_WATCHDOG_S * 1_000_000
        restarts = container.service_property(SIDECAR_UNIT, "NRestarts")
        assert isinstance(restarts, int)
        frozen = container.main_pid(SIDECAR_UNIT)
        # the daemon pings (systemd's time of the last WATCHDOG=1 moves on), or the kill below would prove nothing
        pings = [container.service_property(SIDECAR_UNIT, "WatchdogTimestampMonotonic")]
        for _ in range(2):
            deployment.wait(
                lambda: container.service_property(SIDECAR_UNIT, "WatchdogTimestampMonotonic") != pings[-1],
                TEST_WATCHDOG_S,
                "a WATCHDOG=1 from the sidecar",
            )
            pings.append(container.service_property(SIDECAR_UNIT, "WatchdogTimestampMonotonic"))
        assert container.main_pid(SIDECAR_UNIT) == frozen
        container.call("KillUnit", "ssi", SIDECAR_UNIT, "main", int(signal.SIGSTOP))
        stopped_at = time.monotonic()
        deployment.wait(
            lambda: container.main_pid(SIDECAR_UNIT) not in (0, frozen), 20, "systemd to start a new sidecar"
        )
        elapsed_s = time.monotonic() - stopped_at
        journal = container.journal(SIDECAR_UNIT)
        assert f"Watchdog timeout (limit {TEST_WATCHDOG_S}s)!" in journal
        assert "Failed with result 'watchdog'." in journal
        assert container.service_property(SIDECAR_UNIT, "NRestarts") == restarts + 1
        # the last ping can have come at most half a WatchdogSec before the SIGSTOP
        assert elapsed_s >= TEST_WATCHDOG_S / 2
        deployment.wait(lambda: deployment.active(SIDECAR_UNIT), 15, "the new sidecar to be ready")
        deployment.wait(lambda: _status_code(deployment, "/readyz") == 200, 15, "the new sidecar to answer /readyz")
    finally:
        drop_in.unlink()
        container.run("systemctl", "daemon-reload")
        container.run("systemctl", "restart", SIDECAR_UNIT)


def test_the_uninstall_steps_leave_no_trace_of_the_sidecar(deployment: Deployment) -> None:
    """deploy/systemd/README.md's uninstall, run as written. Last of the container tests: it removes the sidecar."""
    container = deployment.container
    container.run("sh", "-euc", UNINSTALL_STEPS)
    assert container.unit_property(SIDECAR_UNIT, "LoadState") == "not-found"
    left = [
        path
        for path in [*_installed_paths(), STATE_DIR]
        if container.run("test", "-e", path, check=False).returncode == 0
    ]
    assert left == []
    for database in ("passwd", "group"):
        assert container.run("getent", database, SIDECAR_USER, check=False).returncode == 2, database
    assert deployment.active(VLLM_UNIT)  # vLLM's unit is the operator's, and left alone


# --- the files themselves, no container ---------------------------------------------------------------------


def test_readme_installs_what_the_test_installs() -> None:
    readme = {line.strip() for line in (DEPLOY / "README.md").read_text().splitlines()}
    for step in filter(None, (line.strip() for line in (INSTALL_STEPS + ALLOCATOR_PROBE_STEPS).splitlines())):
        if step.startswith(f"{VENV}/bin/pip install"):
            assert any(line.startswith(f"{VENV}/bin/pip install") for line in readme)
        elif step.startswith("systemctl enable"):  # not booted during the install: no --now
            assert f"systemctl enable --now {SIDECAR_UNIT}" in readme
        else:
            assert step in readme, step


def test_readme_uninstalls_what_the_install_put() -> None:
    readme = (DEPLOY / "README.md").read_text()
    uninstall = readme.split("## Uninstall", 1)[1].split("\n## ", 1)[0]
    steps = [line.strip() for line in UNINSTALL_STEPS.splitlines() if line.strip()]
    assert all(step in uninstall.splitlines() for step in steps), uninstall
    removed = [word for step in steps if step.startswith("rm ") for word in step.split()[2:]]
    kept = [
        path for path in _installed_paths() if not any(path == gone or path.startswith(gone + "/") for gone in removed)
    ]
    assert kept == []
    assert STATE_DIR in removed


def test_the_three_places_that_name_the_vllm_unit_agree() -> None:
    config = tomllib.loads((DEPLOY / "config.toml").read_text())
    rule = (DEPLOY / "50-vllm-sidecar.rules").read_text()
    unit = (DEPLOY / "vllm-sidecar.service").read_text()
    assert config["systemd-unit"] == VLLM_UNIT
    assert f'var UNIT = "{VLLM_UNIT}";' in rule
    assert f'var USER = "{SIDECAR_USER}";' in rule
    # RestartUnit's verb, and KillUnit's (the SIGKILL before a dead or hung engine's restart): nothing else
    assert re.search(r'var VERBS = \["restart", "kill"\];', rule)
    assert f"Wants={VLLM_UNIT}" in unit.splitlines()
    assert f"After={VLLM_UNIT}" in unit.splitlines()
    assert f"User={SIDECAR_USER}" in unit.splitlines()
    assert "StateDirectory=vllm-sidecar" in unit.splitlines()
    assert config["state-dir"] == "/var/lib/vllm-sidecar"


def test_the_allocator_probe_folder_is_the_same_everywhere() -> None:
    """vllm.service.example makes it and tells the plugin; the drop-in opens it to the sidecar with the vLLM
    unit's group; config.toml's (commented) probe-dir names it. Unit lines: the last of a key wins here."""
    example = dict(
        line.split("=", 1)
        for line in (DEPLOY / "vllm.service.example").read_text().splitlines()
        if "=" in line and not line.startswith("#") and line.split("=", 1)[0] != "Environment"
    )
    environment = [
        line.removeprefix("Environment=")
        for line in (DEPLOY / "vllm.service.example").read_text().splitlines()
        if line.startswith("Environment=")
    ]
    assert f"VLLM_SIDECAR_PROBE_DIR={PROBE_DIR}" in environment
    assert f"/run/{example['RuntimeDirectory']}" == PROBE_DIR
    # The owner writes, the group (the sidecar) reads and removes, nobody else: 0770.
    assert (example["RuntimeDirectoryMode"], example["RuntimeDirectoryPreserve"]) == ("0770", "restart")
    drop_in = (DEPLOY / "allocator-probe.conf").read_text().splitlines()
    assert f"SupplementaryGroups={example['Group']}" in drop_in
    assert f"ReadWritePaths=-{PROBE_DIR}" in drop_in
    config = (DEPLOY / "config.toml").read_text()
    assert f'\n# probe-dir = "{PROBE_DIR}"\n' in config, "commented: the probe is optional"
    enabled = re.sub(r"^# probe-dir = ", "probe-dir = ", config, flags=re.MULTILINE)
    assert tomllib.loads(enabled)["probe-dir"] == PROBE_DIR


def test_the_vllm_example_lets_the_drain_finish_before_systemd_kills() -> None:
    text = (DEPLOY / "vllm.service.example").read_text().replace("\\\n", " ")
    settings = dict(line.split("=", 1) for line in text.splitlines() if "=" in line and not line.startswith("#"))
    argv = shlex.split(settings["ExecStart"])
    shutdown_timeout_s = int(argv[argv.index("--shutdown-timeout") + 1])
    assert shutdown_timeout_s > 0
    assert settings["TimeoutStopSec"].endswith("s")
    assert int(settings["TimeoutStopSec"].removesuffix("s")) >= shutdown_timeout_s + 10
    assert (settings["KillSignal"], settings["KillMode"]) == ("SIGTERM", "mixed")
    # vLLM exits 0 when its engine core dies: on-failure would leave it stopped (booted: the test above)
    assert (settings["Restart"], settings["RestartSec"]) == ("always", "10s")


# --- helpers ---------------------------------------------------------------------------------------------------


def _wait(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.1)


def _or_why(read: Callable[..., object], *args: str) -> str:
    """What `read(*args)` gives, or why it could not: a report must not hide the timeout it explains."""
    try:
        return str(read(*args))
    except Exception as error:  # any: see above
        return f"(cannot read: {error})"


def _status_code(deployment: Deployment, path: str) -> int | None:
    try:
        return deployment.get(path).status_code
    except httpx.HTTPError:
        return None


def _installed_paths() -> list[str]:
    """Every path the README's install steps create: each `install` destination and the virtual environment."""
    paths = []
    for line in (INSTALL_STEPS + ALLOCATOR_PROBE_STEPS).splitlines():
        words = line.split()
        if words[:1] == ["install"] or words[:3] == ["python3", "-m", "venv"]:
            paths.append(words[-1])
    return paths


def _stays(predicate: Callable[[], bool], duration_s: float, what: str) -> None:
    deadline = time.monotonic() + duration_s
    while time.monotonic() < deadline:
        assert predicate(), f"{what}: changed after {duration_s - (deadline - time.monotonic()):.1f} s"
        time.sleep(0.2)


def _restart_s(deployment: Deployment) -> float:
    """vllm.service's RestartSec, as systemd read it from the example."""
    restart_usec = deployment.container.service_property(VLLM_UNIT, "RestartUSec")
    assert isinstance(restart_usec, int)
    return restart_usec / 1e6


def _vllm_stopped(deployment: Deployment) -> tuple[object, ...]:
    """vllm.service's state, systemd's restarts of it, and the sidecar's restart outcomes so far."""
    container = deployment.container
    return (
        container.unit_property(VLLM_UNIT, "ActiveState"),
        container.unit_property(VLLM_UNIT, "SubState"),
        container.service_property(VLLM_UNIT, "NRestarts"),
        len(_restart_outcomes(deployment)),
    )


def _policy_state(deployment: Deployment) -> object:
    try:
        return deployment.get("/status").json()["policy"]["state"]
    except (httpx.HTTPError, ValueError, KeyError):
        return None


def _restart_outcomes(deployment: Deployment) -> list[dict[str, object]]:
    """What the sidecar's systemd adapter reported, every restart since the container booted."""
    return [event for event in deployment.sidecar_events() if event["event"] == "restart_outcome"]


def _actions(deployment: Deployment) -> list[dict[str, object]]:
    """The policy's actions the sidecar logged (notifications included), since the container booted."""
    return [event for event in deployment.sidecar_events() if event["event"] == "action"]


def _proc_status(container: Container, pid: int) -> dict[str, str]:
    text = container.run("cat", f"/proc/{pid}/status").stdout
    return {key: value.strip() for key, value in (line.split(":", 1) for line in text.splitlines() if ":" in line)}
