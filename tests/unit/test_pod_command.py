"""vLLM's command line as a pod's spec declares it: used only where the spec says it exactly, since a flag assumed
at vLLM's default when it was set elsewhere could turn a lowering into a raise."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from sidecar.parse.pod_command import declared_command

SHIPPED = Path(__file__).parents[2] / "deploy" / "kubernetes" / "base" / "vllm-deployment.yaml"


def pod(**container: Any) -> dict[str, Any]:
    return {"spec": {"containers": [{"name": "sidecar", "image": "x"}, {"name": "vllm", **container}]}}


def test_the_shipped_deployments_vllm_container() -> None:
    template = yaml.safe_load(SHIPPED.read_text())["spec"]["template"]
    assert declared_command(template, "vllm") == (
        "vllm serve --model Qwen/Qwen2.5-7B-Instruct --served-model-name qwen2.5-7b-instruct --port 8000 "
        "--gpu-memory-utilization 0.90 --max-model-len 8192 --shutdown-timeout 120"
    )


@pytest.mark.parametrize(
    ("container", "expected"),
    [
        # vLLM's images run its server with the args (any registry, tag or digest; ROCm's and CPU's too).
        (
            {"image": "vllm/vllm-openai:v0.11.0", "args": ["m", "--max-num-seqs", "64"]},
            "vllm serve m --max-num-seqs 64",
        ),
        ({"image": "registry.local:5000/vllm/vllm-openai-rocm@sha256:" + "a" * 64, "args": ["m"]}, "vllm serve m"),
        ({"image": "vllm/vllm-openai", "args": ["m", "--api-key", "sk-1"]}, "vllm serve m --api-key ***"),
        # A command of its own: as the kubelet runs it.
        (
            {
                "image": "my/img",
                "command": ["python3", "-m", "vllm.entrypoints.openai.api_server"],
                "args": ["--model", "m"],
            },
            "python3 -m vllm.entrypoints.openai.api_server --model m",
        ),
        # A shell's script with no variable in it.
        (
            {"image": "my/img", "command": ["/bin/sh", "-c", "vllm serve m  --gpu-memory-utilization 0.8"]},
            "vllm serve m --gpu-memory-utilization 0.8",
        ),
        # $(NAME) from a literal env value; $$ is a $.
        (
            {
                "image": "vllm/vllm-openai:latest",
                "args": ["$(MODEL)", "--gpu-memory-utilization", "$(GMU)", "--served-model-name", "$$(x)"],
                "env": [{"name": "MODEL", "value": "m"}, {"name": "GMU", "value": "0.7"}],
            },
            "vllm serve m --gpu-memory-utilization 0.7 --served-model-name $(x)",
        ),
    ],
)
def test_a_spec_that_says_it_exactly(container: dict[str, Any], expected: str) -> None:
    assert declared_command(pod(**container), "vllm") == expected


@pytest.mark.parametrize(
    "container",
    [
        # Another image's entrypoint may add flags of its own: args alone do not say what runs.
        {"image": "ghcr.io/acme/llm-server:1.2", "args": ["--model", "m"]},
        # A variable the spec does not hold: from a Secret, a ConfigMap, envFrom, or undefined.
        {
            "image": "vllm/vllm-openai",
            "args": ["m", "--gpu-memory-utilization", "$(GMU)"],
            "env": [{"name": "GMU", "valueFrom": {"configMapKeyRef": {"name": "c", "key": "gmu"}}}],
        },
        {"image": "vllm/vllm-openai", "args": ["m", "--gpu-memory-utilization", "$(GMU)"]},
        # A shell's variables are not in the spec.
        {"image": "my/img", "command": ["bash", "-c", "vllm serve m --gpu-memory-utilization ${GMU:-0.9}"]},
        {"image": "my/img", "command": ["sh", "-c", "vllm serve m `cat /etc/flags`"]},
        # Not vLLM's server, or not the spec of one.
        {"image": "my/img", "command": ["/start.sh"], "args": ["--gpu-memory-utilization", "0.8"]},
        {"image": "vllm/vllm-openai", "args": "m --max-num-seqs 8"},
    ],
)
def test_a_spec_that_does_not_say_it_is_unknown(container: dict[str, Any]) -> None:
    assert declared_command(pod(**container), "vllm") is None


def test_no_such_container_or_no_spec() -> None:
    assert declared_command(pod(image="vllm/vllm-openai", args=["m"]), "engine") is None
    assert declared_command({"kind": "Status"}, "vllm") is None
    assert declared_command({"spec": {"containers": "vllm"}}, "vllm") is None
