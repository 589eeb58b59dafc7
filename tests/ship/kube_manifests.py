"""Renders deploy/kubernetes with `kubectl kustomize` and reads the rendered manifests. Runs kubectl.

The tests check what `kubectl apply -k` would send, so everything here works on kustomize's output, never on
the source files: a patch that lands somewhere unexpected shows up.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
KUBERNETES_DIR = REPO / "deploy" / "kubernetes"
BASE_DIR = KUBERNETES_DIR / "base"
COMPONENT_DIR = KUBERNETES_DIR / "add-sidecar"
PROBE_COMPONENT_DIR = KUBERNETES_DIR / "add-probe"
INCIDENTS_COMPONENT_DIR = KUBERNETES_DIR / "add-incidents"
REMEDIATION_COMPONENT_DIR = KUBERNETES_DIR / "add-remediation"
EXISTING_DEPLOYMENT = Path(__file__).with_name("kube_existing_vllm.yaml")
SIDECAR = "vllm-sidecar"
PLUGIN_INIT = "vllm-sidecar-probe-plugin"  # the init container that copies the allocator probe's plugin
PROBE_DIR_ENV = "VLLM_SIDECAR_PROBE_DIR"  # read by the plugin in vLLM and by the sidecar (--probe-dir)
PLUGIN_NAME = "vllm_sidecar_probe"  # the entry point's name, what VLLM_PLUGINS must list

Manifest = dict[str, Any]


class KubectlMissingError(Exception):
    """kubectl is not installed; the message says so."""


class RenderError(Exception):
    """kubectl kustomize refused the kustomization; the message carries its error."""


def kubectl() -> str:
    path = shutil.which("kubectl")
    if path is None:
        raise KubectlMissingError("kubectl not found on PATH (it renders the kustomizations: kubectl kustomize)")
    return path


def render(directory: Path) -> list[Manifest]:
    """What `kubectl apply -k directory` would send, as parsed documents."""
    done = subprocess.run(
        [kubectl(), "kustomize", str(directory)], capture_output=True, text=True, timeout=60, check=False
    )
    if done.returncode != 0:
        raise RenderError(f"kubectl kustomize {directory} failed: {done.stderr.strip()}")
    return [document for document in yaml.safe_load_all(done.stdout) if document]


def render_overlay(
    folder: Path, *, namespace: str, resources: Iterable[Path] = (), components: Iterable[Path] = ()
) -> list[Manifest]:
    """A user's overlay written into `folder`: files listed in `resources` are copied in (kustomize loads
    files only from inside the kustomization), folders are referred to by relative path (it refuses absolute
    ones), as are `components`."""
    listed = []
    for resource in resources:
        if resource.is_file():
            shutil.copy(resource, folder / resource.name)
            listed.append(resource.name)
        else:
            listed.append(os.path.relpath(resource, folder))
    kustomization = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "namespace": namespace,
        "resources": listed,
        "components": [os.path.relpath(component, folder) for component in components],
    }
    (folder / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
    return render(folder)


def find(documents: Iterable[Manifest], kind: str, name: str | None = None) -> Manifest:
    matches = [d for d in documents if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    assert len(matches) == 1, f"expected one {kind} {name or ''}, found {len(matches)}"
    return matches[0]


def pod_spec(deployment: Manifest) -> dict[str, Any]:
    spec: dict[str, Any] = deployment["spec"]["template"]["spec"]
    return spec


def container(deployment: Manifest, name: str) -> dict[str, Any]:
    (found,) = (c for c in pod_spec(deployment)["containers"] if c["name"] == name)
    result: dict[str, Any] = found
    return result


def vllm_container(deployment: Manifest) -> dict[str, Any]:
    """The one container that is not the sidecar (whatever the existing Deployment named it)."""
    (found,) = (c for c in pod_spec(deployment)["containers"] if c["name"] != SIDECAR)
    result: dict[str, Any] = found
    return result


def option(args: list[str], flag: str) -> str | None:
    """The value of `--flag value` or `--flag=value` in a container's arguments; None when absent."""
    for index, argument in enumerate(args):
        if argument == flag and index + 1 < len(args):
            return args[index + 1]
        if argument.startswith(flag + "="):
            return argument.split("=", 1)[1]
    return None


def literal_env(item: dict[str, Any]) -> dict[str, str]:
    """A container's environment variables that have a literal value (not valueFrom)."""
    return {e["name"]: str(e["value"]) for e in item.get("env", []) if "value" in e}


def env_source(item: dict[str, Any], name: str) -> dict[str, Any] | None:
    """The valueFrom of one environment variable; None when it has a literal value or is absent."""
    for entry in item.get("env", []):
        if entry["name"] == name:
            source: dict[str, Any] | None = entry.get("valueFrom")
            return source
    return None


def port_number(item: dict[str, Any], port: int | str) -> int:
    """A probe's port in the container it belongs to: a number, or the name of one of its own ports (the
    kubelet looks a named probe port up in that container only)."""
    if isinstance(port, int):
        return port
    (number,) = (p["containerPort"] for p in item.get("ports", []) if p.get("name") == port)
    return int(number)


def probe_budget_s(probe: dict[str, Any]) -> int:
    """The longest a probe can keep failing before the kubelet acts: delay + failureThreshold x period
    (the Kubernetes defaults are 0, 3 and 10)."""
    delay = int(probe.get("initialDelaySeconds", 0))
    return delay + int(probe.get("failureThreshold", 3)) * int(probe.get("periodSeconds", 10))


def prestop_sleep_s(item: dict[str, Any]) -> int:
    """Seconds the container's preStop hook sleeps: `exec: sleep N` or the `sleep` action (Kubernetes 1.30+)."""
    pre_stop = item.get("lifecycle", {}).get("preStop", {})
    if "sleep" in pre_stop:
        return int(pre_stop["sleep"]["seconds"])
    command = pre_stop.get("exec", {}).get("command", [])
    if len(command) != 2 or Path(command[0]).name != "sleep":
        raise AssertionError(f"preStop is not a plain sleep: {pre_stop}")
    return int(command[1])


def mount_volume(deployment: Manifest, item: dict[str, Any], path: Path) -> tuple[dict[str, Any], Path]:
    """The pod volume mounted in `item` that holds `path`, and where in the container that mount is."""
    for mount in item.get("volumeMounts", []):
        mount_path = Path(mount["mountPath"])
        if path == mount_path or mount_path in path.parents:
            (volume,) = (v for v in pod_spec(deployment)["volumes"] if v["name"] == mount["name"])
            result: dict[str, Any] = volume
            return result, mount_path
    raise AssertionError(f"nothing is mounted at {path} in container {item['name']}")


def image_version(image: str) -> tuple[int, ...]:
    """`vllm/vllm-openai:v0.32.0` -> (0, 32, 0)."""
    tag = image.rsplit(":", 1)[1].removeprefix("v")
    return tuple(int(part) for part in tag.split(".")[:3])


def init_container(deployment: Manifest, name: str) -> dict[str, Any]:
    (found,) = (c for c in pod_spec(deployment).get("initContainers", []) if c["name"] == name)
    result: dict[str, Any] = found
    return result


def _mount_of(item: dict[str, Any], path: str) -> dict[str, Any] | None:
    """The volumeMount of `item` whose mountPath is `path` exactly (None when there is none)."""
    return next((m for m in item.get("volumeMounts", []) if m["mountPath"].rstrip("/") == path.rstrip("/")), None)


def probe_wiring_problems(deployment: Manifest, *, sidecar_probe_dir: str | None, plugin_folder: str) -> list[str]:
    """What keeps the allocator probe from working in this pod, one line each; [] when it is wired.

    `sidecar_probe_dir` is the sidecar's --probe-dir as its own settings parser read it; `plugin_folder` is
    where the sidecar's image keeps the plugin (the Dockerfile's). Checked: the probe folder is one emptyDir,
    writable, at the same path in vLLM's container and the sidecar's, and both name that path; the init
    container runs the sidecar's image and copies exactly the image's plugin folder into an emptyDir that
    vLLM mounts read-only and has on its PYTHONPATH; VLLM_PLUGINS, when set, lets the plugin load (vLLM
    splits it on commas and compares the names exactly).
    """
    vllm_env = literal_env(container(deployment, "vllm"))
    problems = _probe_dir_problems(deployment, vllm_env.get(PROBE_DIR_ENV), sidecar_probe_dir)
    problems += _plugin_problems(deployment, plugin_folder)
    allowed = vllm_env.get("VLLM_PLUGINS")
    if allowed is not None and PLUGIN_NAME not in allowed.split(","):
        problems.append(f"VLLM_PLUGINS={allowed!r} does not allow {PLUGIN_NAME}")
    return problems


def _probe_dir_problems(deployment: Manifest, probe_dir: str | None, sidecar_probe_dir: str | None) -> list[str]:
    """The folder of the probe's files: one writable emptyDir at the same path, named on both sides."""
    if probe_dir is None:
        return [f"vLLM's container has no {PROBE_DIR_ENV}"]
    problems = []
    if sidecar_probe_dir != probe_dir:
        problems.append(f"the sidecar reads {sidecar_probe_dir}, vLLM writes {probe_dir}")
    mounts = {"vLLM": _mount_of(container(deployment, "vllm"), probe_dir)}
    mounts["the sidecar"] = _mount_of(container(deployment, SIDECAR), probe_dir)
    if None in mounts.values():
        return [*problems, f"{probe_dir} is not a volume mounted in both containers"]
    names = {mount["name"] for mount in mounts.values() if mount is not None}
    if len(names) != 1:
        problems.append(f"{probe_dir} is not the same volume in both containers: {sorted(names)}")
    volumes = {v["name"]: v for v in pod_spec(deployment).get("volumes", [])}
    if any("emptyDir" not in volumes.get(name, {}) for name in names):
        problems.append(f"{probe_dir} is not an emptyDir")
    for who, mount in mounts.items():
        if mount is not None and (mount.get("readOnly", False) or mount.get("subPath")):
            problems.append(f"{who} mounts {probe_dir} read-only or a subPath of it")
    return problems


def _plugin_problems(deployment: Manifest, plugin_folder: str) -> list[str]:
    """The plugin: copied by the init container from the sidecar's image onto vLLM's PYTHONPATH, read-only."""
    spec = pod_spec(deployment)
    init = next((c for c in spec.get("initContainers", []) if c["name"] == PLUGIN_INIT), None)
    if init is None:
        return [f"no init container {PLUGIN_INIT}"]
    problems = []
    sidecar_image = container(deployment, SIDECAR)["image"]
    if init["image"] != sidecar_image:
        problems.append(f"the plugin comes from {init['image']}, the sidecar runs {sidecar_image}")
    command = [*init.get("command", []), *init.get("args", [])]
    if len(command) != 4 or command[:2] != ["cp", "-R"] or not command[2].endswith("/."):
        return [*problems, f"the init container does not `cp -R FOLDER/. TARGET`: {command}"]
    source, target = command[2].removesuffix("/."), command[3]
    if source != plugin_folder:
        problems.append(f"the init container copies {source}, the image's plugin folder is {plugin_folder}")
    init_mount = _mount_of(init, target)
    if init_mount is None:
        return [*problems, f"the init container copies into {target}, which is no volume"]
    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    if "emptyDir" not in volumes.get(init_mount["name"], {}):
        problems.append(f"the plugin volume {init_mount['name']} is not an emptyDir")
    vllm = container(deployment, "vllm")
    plugin_mounts = [m for m in vllm.get("volumeMounts", []) if m["name"] == init_mount["name"]]
    if len(plugin_mounts) != 1 or plugin_mounts[0].get("subPath"):
        return [*problems, f"vLLM does not mount the plugin volume {init_mount['name']} (once, whole)"]
    (plugin_mount,) = plugin_mounts
    if not plugin_mount.get("readOnly", False):
        problems.append("vLLM mounts the plugin folder writable")
    python_path = literal_env(vllm).get("PYTHONPATH", "")
    if plugin_mount["mountPath"].rstrip("/") not in [entry.rstrip("/") for entry in python_path.split(":")]:
        problems.append(f"vLLM's PYTHONPATH {python_path!r} lacks {plugin_mount['mountPath']}")
    return problems
