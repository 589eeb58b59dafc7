"""vLLM's command line from its container in the sidecar's own pod's spec, against a real kube-apiserver with the
shipped Role (deploy/kubernetes/add-sidecar/rbac.yaml): the fallback for a death's reading where the sidecar
cannot see vLLM's processes. The pod is the shipped Deployment's (deploy/kubernetes/base/vllm-deployment.yaml)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import yaml

from sidecar.actuators.kube_client import KubeClient
from sidecar.actuators.kube_command import PodSpecCommand
from sidecar.actuators.kube_logs import PodLog
from sidecar.actuators.log_source import Wanted
from sidecar.model.server_command import ServerCommand
from sidecar.shell.log_with_command import LogWithCommand
from sidecar.sources.vllm_command import ServerCommandMemory

from .kube_apiserver import ApiServer, Workspace

SHIPPED = Path(__file__).parents[2] / "deploy" / "kubernetes" / "base" / "vllm-deployment.yaml"
WALL_S = 1_795_000_000.0


def shipped_pod_spec() -> dict[str, Any]:
    spec: dict[str, Any] = yaml.safe_load(SHIPPED.read_text())["spec"]["template"]["spec"]
    return spec


async def test_the_shipped_pods_vllm_container_declares_its_flags(apiserver: ApiServer, admin: httpx.Client) -> None:
    space = Workspace.create(apiserver, admin)
    space.apply_rbac()
    space.create_workload(shipped_pod_spec())
    kube = KubeClient(space.credentials(space.sidecar_token()))
    try:
        declared = PodSpecCommand(
            kube, pod=space.pod, namespace=space.namespace, container="vllm", wall_clock=lambda: WALL_S
        )
        memory = ServerCommandMemory(8000)  # nothing seen in /proc: another container, no shared namespace
        log = LogWithCommand(PodLog(kube, pod=space.pod, namespace=space.namespace), memory, declared=declared.read)
        read = await log.read(until_wall_s=WALL_S, wanted=Wanted.DIED)
        # What /proc showed wins over the spec.
        memory.seen = ServerCommand(where="pid 7", command="vllm serve m --max-num-seqs 8", seen_wall_s=WALL_S)
        seen = await log.read(until_wall_s=WALL_S, wanted=Wanted.DIED)
    finally:
        await kube.close()
    assert read.command == ServerCommand(
        where=f"container vllm's command in pod {space.pod}'s spec",
        command=(
            "vllm serve --model Qwen/Qwen2.5-7B-Instruct --served-model-name qwen2.5-7b-instruct --port 8000 "
            "--gpu-memory-utilization 0.90 --max-model-len 8192 --shutdown-timeout 120"
        ),
        seen_wall_s=WALL_S,
    )
    assert seen.command == memory.seen


async def test_without_get_pods_nothing_is_declared_and_the_log_is_still_read(
    apiserver: ApiServer, admin: httpx.Client
) -> None:
    space = Workspace.create(apiserver, admin)
    space.apply_rbac(without=("get", "pods", ""))
    space.create_workload(shipped_pod_spec())
    kube = KubeClient(space.credentials(space.sidecar_token()))
    try:
        declared = PodSpecCommand(kube, pod=space.pod, namespace=space.namespace, container="vllm")
        assert await declared.read() is None
        log = LogWithCommand(
            PodLog(kube, pod=space.pod, namespace=space.namespace), ServerCommandMemory(8000), declared=declared.read
        )
        read = await log.read(until_wall_s=WALL_S, wanted=Wanted.LAST)
        assert (read.command, [run.label for run in read.runs]) == (None, ["current instance"])
        gone = PodSpecCommand(kube, pod="vllm-gone", namespace=space.namespace, container="vllm")
        assert await gone.read() is None
    finally:
        await kube.close()
