"""Puts the sidecar and `deploy/systemd/` into a copy of the test root file system, as the README says. I/O.

The program: a virtual environment at /opt/vllm-sidecar made with the root file system's own Python (Debian's
3.11), filled from a wheelhouse built on the host. The dependencies' wheels are downloaded once for CPython
3.11 on glibc 2.36 (whatever the host's Python) and cached, keyed by pyproject.toml; the sidecar's own wheel
is built from this checkout on every run. Then the shipped files go where deploy/systemd/README.md puts them,
by the README's own commands (`INSTALL_STEPS`), inside the not yet booted system (systemd-nspawn without
--boot: a chroot with /proc, /dev and /sys).

The test's own parts, beside what ships: /etc/vllm-sidecar/env pointing the sidecar at the simulator and a
loopback port; vllm.service made from vllm.service.example with the simulator as its ExecStart; a bystander
unit the sidecar's user must not be able to restart; and a unit that runs `systemd_sandbox_probe.py` inside
the shipped unit's sandbox.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from .nspawn import remove_leftovers

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy" / "systemd"
PROBE_SCRIPT = Path(__file__).with_name("systemd_sandbox_probe.py")
PYPROJECT = REPO / "pyproject.toml"
TARGET_PYTHON = "3.11"  # Debian 12's, in the root file system
TARGET_GLIBC_MINOR = 36  # Debian 12: glibc 2.36
VENV = "/opt/vllm-sidecar"
SIDECAR_UNIT = "vllm-sidecar.service"
VLLM_UNIT = "vllm.service"
BYSTANDER_UNIT = "bystander.service"
PROBE_UNIT = "vllm-sidecar-probe.service"
EXAMPLE_CHECK_UNIT = "vllm-example.service"  # vllm.service.example unchanged, for systemd-analyze verify
PROBE_PATH = "/usr/local/lib/vllm-sidecar-test/sandbox_probe.py"  # systemd_sandbox_probe.py, in the container
PROBE_OUTPUT = "/run/vllm-sidecar-probe.json"
UNWRITABLE_DIR = "/srv/sidecar-owned"  # owned by the sidecar's user: only the sandbox can keep it from writing
PIP_TIMEOUT_S = 600.0

# deploy/systemd/README.md's install steps, run from /deploy (the folder, bound read-only) with the program from
# the wheelhouse instead of a checkout. test_readme_installs_what_the_test_installs keeps the two in step.
INSTALL_STEPS = f"""
python3 -m venv {VENV}
{VENV}/bin/pip install --quiet --no-index --find-links /wheelhouse --find-links /sidecar-wheel vllm-sidecar
install -m 0644 vllm-sidecar.sysusers /usr/lib/sysusers.d/vllm-sidecar.conf
systemd-sysusers vllm-sidecar.conf
install -d -m 0755 /etc/vllm-sidecar
install -m 0644 config.toml /etc/vllm-sidecar/config.toml
install -m 0640 -o root -g vllm-sidecar /dev/null /etc/vllm-sidecar/admin-token
head -c 32 /dev/urandom | base64 > /etc/vllm-sidecar/admin-token
install -m 0644 50-vllm-sidecar.rules /etc/polkit-1/rules.d/50-vllm-sidecar.rules
install -m 0644 vllm-sidecar.service /etc/systemd/system/vllm-sidecar.service
systemctl enable vllm-sidecar.service
"""

# deploy/systemd/README.md's allocator probe steps for the sidecar's side (vLLM's side, installing the plugin in
# vLLM's environment, is the test's: its vLLM is the simulator, run with the plugin registered from the
# sidecar's own venv, which holds it).
ALLOCATOR_PROBE_STEPS = """
install -d -m 0755 /etc/systemd/system/vllm-sidecar.service.d
install -m 0644 allocator-probe.conf /etc/systemd/system/vllm-sidecar.service.d/allocator-probe.conf
sed -i 's|^# probe-dir = |probe-dir = |' /etc/vllm-sidecar/config.toml
"""
PROBE_DIR = "/run/vllm-probe"

# deploy/systemd/README.md's uninstall steps, as written there (test_readme_uninstalls_what_the_install_put).
UNINSTALL_STEPS = """
systemctl disable --now vllm-sidecar.service
rm -rf /etc/systemd/system/vllm-sidecar.service /etc/systemd/system/vllm-sidecar.service.d
systemctl daemon-reload
rm -f /etc/polkit-1/rules.d/50-vllm-sidecar.rules
rm -rf /etc/vllm-sidecar /var/lib/vllm-sidecar /opt/vllm-sidecar
rm -f /usr/lib/sysusers.d/vllm-sidecar.conf
userdel vllm-sidecar
"""

# vllm.service.example's user, and folders for the sandbox probe to try.
TEST_SETUP = f"""
install -d -m 0755 /etc/sysusers.d
echo 'u vllm - "vLLM (test)" -' > /etc/sysusers.d/vllm-test.conf
systemd-sysusers vllm-test.conf
install -d -m 0755 /opt/vllm/bin
printf '#!/bin/sh\\nexit 0\\n' > /opt/vllm/bin/vllm
chmod 0755 /opt/vllm/bin/vllm
install -d -m 0755 -o vllm-sidecar -g vllm-sidecar {UNWRITABLE_DIR}
install -d -m 0755 /home/someone
systemctl enable {VLLM_UNIT}
"""


@dataclass(frozen=True, slots=True, kw_only=True)
class Installed:
    root: Path
    vllm_port: int
    sidecar_port: int

    @property
    def token(self) -> str:
        return (self.root / "etc/vllm-sidecar/admin-token").read_text().strip()

    @property
    def sidecar_url(self) -> str:
        return f"http://127.0.0.1:{self.sidecar_port}"


def cache_dir() -> Path:
    return Path(os.environ.get("VLLM_SIDECAR_CACHE") or Path.home() / ".cache" / "vllm-sidecar")


def install(rootfs: Path, root: Path, *, wheels: Path, vllm_port: int, sidecar_port: int) -> Installed:
    """Copy `rootfs` to `root` (never touching `rootfs`) and install everything into the copy."""
    subprocess.run(["cp", "-a", "--reflink=auto", f"{rootfs}/.", str(root)], check=True)
    wheelhouse = dependency_wheelhouse(cache_dir())
    sidecar_wheel = build_sidecar_wheel(wheels, wheelhouse)
    _write_test_units(root, vllm_port=vllm_port)
    env = root / "etc/vllm-sidecar/env"
    env.parent.mkdir(parents=True, exist_ok=True)
    env.write_text(
        "# the test's overrides of /etc/vllm-sidecar/config.toml\n"
        f"VLLM_SIDECAR_VLLM_URL=http://127.0.0.1:{vllm_port}\n"
        f"VLLM_SIDECAR_LISTEN=127.0.0.1:{sidecar_port}\n"
        "VLLM_SIDECAR_GPU_SOURCE=sim\n"
        "VLLM_SIDECAR_INTERVAL=0.5\n"
    )
    probe = root / PROBE_PATH.lstrip("/")
    probe.parent.mkdir(parents=True)
    shutil.copyfile(PROBE_SCRIPT, probe)
    _in_root(
        root,
        "cd /deploy\n" + INSTALL_STEPS + ALLOCATOR_PROBE_STEPS + TEST_SETUP,
        binds=[(DEPLOY, "/deploy"), (wheelhouse, "/wheelhouse"), (sidecar_wheel.parent, "/sidecar-wheel")],
    )
    return Installed(root=root, vllm_port=vllm_port, sidecar_port=sidecar_port)


def dependency_wheelhouse(cache: Path) -> Path:
    """Wheels of the sidecar's dependencies for the root file system's Python; built once per pyproject.toml."""
    machine = platform.machine()
    key = hashlib.sha256(PYPROJECT.read_bytes() + f"{TARGET_PYTHON}-{machine}".encode()).hexdigest()[:16]
    target = cache / f"wheelhouse-{key}"
    if (target / ".complete").is_file():
        return target
    cache.mkdir(parents=True, exist_ok=True)
    with _locked(cache / ".wheelhouse.lock"):
        if (target / ".complete").is_file():
            return target  # another test run built it while we waited
        partial = target.with_name(target.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        requirements = tomllib.loads(PYPROJECT.read_text())["project"]["dependencies"]
        # binary wheels for the target, not the host: the host's Python may be another version
        platforms = [f"--platform=manylinux_2_{minor}_{machine}" for minor in range(17, TARGET_GLIBC_MINOR + 1)]
        _pip(
            "download", "--quiet", "--only-binary=:all:", f"--python-version={TARGET_PYTHON}",
            "--implementation=cp", f"--abi=cp{TARGET_PYTHON.replace('.', '')}", *platforms,
            f"--dest={partial}", *requirements,
            "setuptools>=68",  # the sidecar's build backend, so its wheel builds offline from here
        )  # fmt: skip
        (partial / ".complete").touch()
        partial.rename(target)
    return target


def build_sidecar_wheel(out: Path, wheelhouse: Path) -> Path:
    """The sidecar's wheel from this checkout, built in a copy (no build/ or egg-info left in the repo)."""
    source = out / "source"
    for package in ("sidecar", "vllm_sidecar_probe"):  # the distribution's two packages, as a release has them
        shutil.copytree(REPO / package, source / package, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copyfile(REPO / name, source / name)
    dist = out / "dist"
    _pip(
        "wheel", "--quiet", "--no-deps", "--no-index", f"--find-links={wheelhouse}", f"--wheel-dir={dist}", str(source)
    )
    (wheel,) = dist.glob("vllm_sidecar-*.whl")
    return wheel


def derive_unit(text: str, replace: Mapping[str, str | None], *, add: tuple[str, ...] = ()) -> str:
    """A unit file like `text` with each `Key=` in `replace` set to its value (None: removed) and `add` appended.

    Continuation lines (a trailing backslash) are joined first. A key that occurs more than once keeps only
    its first occurrence, replaced. `add` goes at the end of the [Service] section.
    """
    lines: list[str] = []
    pending = ""
    for raw in text.splitlines():
        if raw.endswith("\\"):
            pending += raw[:-1] + " "
            continue
        lines.append(pending + raw)
        pending = ""
    out: list[str] = []
    seen: set[str] = set()
    section = ""
    for line in lines:
        if line.startswith("["):
            if section == "[Service]":
                out.extend(add)
            section = line.strip()
        key = line.split("=", 1)[0].strip() if "=" in line and not line.lstrip().startswith("#") else ""
        if key in replace:
            value = replace[key]
            if value is not None and key not in seen:
                out.append(f"{key}={value}")
            seen.add(key)
            continue
        out.append(line)
    if section == "[Service]":
        out.extend(add)
    return "\n".join(out) + "\n"


def _write_test_units(root: Path, *, vllm_port: int) -> None:
    units = root / "etc/systemd/system"
    example = (DEPLOY / "vllm.service.example").read_text()
    # vLLM's stand-in loads the allocator probe's plugin as vLLM would (register(), the entry point's target)
    plugin = "import sys, vllm_sidecar_probe; vllm_sidecar_probe.register(); from sidecar.cli import main"
    sim = f'{VENV}/bin/python -c "{plugin}; sys.exit(main(sys.argv[1:]))" sim --listen 127.0.0.1:{vllm_port}'
    sim += " --scenario healthy"
    # the example as shipped, but the simulator in place of `vllm serve` (it takes no --shutdown-timeout)
    (units / VLLM_UNIT).write_text(derive_unit(example, {"ExecStart": sim}))
    (units / EXAMPLE_CHECK_UNIT).write_text(example)
    (units / BYSTANDER_UNIT).write_text(
        "[Unit]\nDescription=a unit the sidecar's user must not touch\n\n[Service]\nExecStart=/bin/sleep infinity\n"
    )
    shipped = (DEPLOY / SIDECAR_UNIT).read_text()
    probe = derive_unit(
        shipped,
        {
            "Description": "the shipped sidecar unit's sandbox, running a probe instead of the daemon",
            **dict.fromkeys(("Wants", "After", "NotifyAccess", "WatchdogSec", "Restart", "RestartSec")),
            "RestartPreventExitStatus": None,
            "Type": "oneshot",
            "ExecStart": f"{VENV}/bin/python {PROBE_PATH}",
        },
        add=(f"StandardOutput=truncate:{PROBE_OUTPUT}",),
    )
    (units / PROBE_UNIT).write_text(probe.split("[Install]")[0])


def _in_root(root: Path, script: str, *, binds: list[tuple[Path, str]]) -> None:
    """Run a shell script in `root`, not booted: a chroot with /proc, /dev and /sys, and the host's network."""
    machine = f"vllm-sidecar-setup-{os.getpid()}"
    command = [
        *("systemd-nspawn", "--quiet", f"--directory={root}", f"--machine={machine}"),
        *("--register=no", "--keep-unit", "--link-journal=no", "--resolv-conf=off", "--timezone=off"),
        *(f"--bind-ro={source}:{target}" for source, target in binds),
        *("/bin/sh", "-euc", script),
    ]
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=PIP_TIMEOUT_S, check=False)
    finally:
        remove_leftovers(machine)
    if result.returncode != 0:
        raise RuntimeError(f"installing into {root} failed ({result.returncode}):\n{result.stdout}{result.stderr}")


def _pip(*args: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "pip", *args], capture_output=True, text=True, timeout=PIP_TIMEOUT_S, check=False
    )
    if result.returncode != 0:
        raise RuntimeError(f"pip {args[0]} failed ({result.returncode}):\n{result.stdout}{result.stderr}")


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive lock on `path` (two test runs must not build the same wheelhouse at once)."""
    with path.open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
