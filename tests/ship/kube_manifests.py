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
EXISTING_DEPLOYMENT = Path(__file__).with_name("kube_existing_vllm.yaml")
SIDECAR = "vllm-sidecar"

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
