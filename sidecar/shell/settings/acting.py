"""How the sidecar acts on vLLM: the adapter that restarts it, the probe's key, and opt-in remediation. No I/O."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import ClassVar, Literal

from pydantic import BaseModel, field_validator

from sidecar.model.remediation import Allowance
from sidecar.shell.settings.declare import ADAPTER, PAUSING, RESTARTING, setting


class ActingSection(BaseModel):
    """What restarts vLLM and how, what the engine probe sends, and which of vLLM's flags a fix may change."""

    section: ClassVar[str] = "acting"  # its table in a config file

    vllm_api_key_file: Path | None = setting(
        None,
        "vLLM's --api-key, for the probe",
        group=PAUSING,
        form="a path",
        why=(
            "file with vLLM's `--api-key`, sent by the probe (`/v1/models`, `/v1/completions`); without it such a"
            " vLLM answers the probe 401, which proves nothing and leaves the hung rule to the stall alone"
        ),
    )
    remediate: str | None = setting(
        None,
        "flags it may change, with ranges (off)",
        group=RESTARTING,
        form="FLAG=LOW..HIGH[,...] of max-model-len, max-num-seqs, max-num-batched-tokens, gpu-memory-utilization",
        metavar="LIST",
        why=(
            "opt-in remediation (see [remediation.md](remediation.md)): after a crash whose cause the doctor "
            "determined, set the flag it computed for vLLM's next start, within the range given here, in "
            "`<state-dir>/vllm-flags.env` (on Kubernetes: vLLM's args in its Deployment); "
            "e.g. `max-model-len=1024..32768,gpu-memory-utilization=0.8..0.95`"
        ),
    )
    remediate_max_per_day: int = setting(
        3,
        "flag changes in any 24 h",
        group=RESTARTING,
        ge=1,
        le=100,
        why="changes `--remediate` may make in any 24 hours; past them a fix is refused and notified",
    )
    remediate_window: float = setting(
        1800.0,
        "a change must hold this long",
        group=RESTARTING,
        unit="seconds",
        ge=10,
        le=7 * 86400,
        why=(
            "seconds vLLM must stay healthy after a change before it is confirmed; the same cause back sooner, "
            "or vLLM not healthy within `--startup-timeout`, reverts it"
        ),
    )
    # --- the adapter ---
    actuator: Literal["none", "systemd", "kubernetes", "exec"] = setting(
        "none",
        "how vLLM is restarted",
        group=ADAPTER,
        why="how vLLM is restarted: `systemd`, `kubernetes`, `exec`, or `none` (observe and pause only)",
    )
    systemd_unit: str = setting(
        "vllm.service",
        "the vLLM unit (systemd)",
        group=ADAPTER,
        form="a unit name",
        metavar="UNIT",
        why="the unit the systemd adapter restarts (validated: no input can reach another unit)",
    )
    systemd_bus: Literal["system", "user"] = setting(
        "system",
        "the systemd manager's bus",
        group=ADAPTER,
        why="`system`, or `user` for a user manager",
    )
    kubernetes_mode: Literal["evict", "delete", "rollout"] = setting(
        "evict",
        "how the pod is restarted",
        why=(
            "`evict` (a policy/v1 Eviction: honours PodDisruptionBudgets), `delete`, or `rollout` (the owning "
            "Deployment's `restartedAt`)"
        ),
        group=ADAPTER,
    )
    kubeconfig: Path | None = setting(
        None,
        "kubeconfig (default: service account)",
        group=ADAPTER,
        form="a path",
        why=(
            "kubeconfig file, else the pod's service account; any user kubectl 1.26+ accepts (token, `tokenFile`,"
            " client certificate, an exec plugin such as `aws eks get-token`, `gke-gcloud-auth-plugin` or "
            "`kubelogin`, the `oidc` auth-provider, impersonation with `as`): "
            "[kubernetes-credentials.md](kubernetes-credentials.md)"
        ),
    )
    pod_name: str | None = setting(
        None,
        "this pod's name (default: POD_NAME)",
        group=ADAPTER,
        form="a pod name",
        metavar="NAME",
        why="this pod's name (the downward API's `POD_NAME` when unset)",
    )
    pod_namespace: str | None = setting(
        None,
        "this pod's namespace (default: POD_NAMESPACE)",
        group=ADAPTER,
        form="a namespace",
        metavar="NAME",
        why="this pod's namespace (else the service account's)",
    )
    vllm_container: str = setting(
        "vllm",
        "vLLM's container in this pod",
        group=ADAPTER,
        form="a container name (a DNS label)",
        metavar="NAME",
        why=(
            "the name of vLLM's container in this pod, whose log is read and whose state says whether the kubelet"
            " restarts it (a DNS label)"
        ),
    )
    exec_command: str | None = setting(
        None,
        "restarts vLLM (exec); not run by a shell",
        why="the command of the exec adapter, e.g. `docker restart vllm`; split into arguments, never given to a shell",
        group=ADAPTER,
        form="a command line, e.g. 'docker restart vllm'",
        metavar="COMMAND",
    )

    @field_validator("remediate")
    @classmethod
    def _check_remediate(cls, value: str | None) -> str | None:
        if value is None or not value.strip():
            return None
        from sidecar.policy.remediation import parse_allowances  # noqa: PLC0415 - only needed to validate

        parse_allowances(value)
        return value.strip()

    @property
    def remediation_allowances(self) -> tuple[Allowance, ...]:
        from sidecar.policy.remediation import parse_allowances  # noqa: PLC0415

        return parse_allowances(self.remediate) if self.remediate else ()

    @field_validator("vllm_container")
    @classmethod
    def _check_container(cls, value: str) -> str:
        from sidecar.actuators.kube_names import check_label  # noqa: PLC0415 - only needed to validate

        return check_label(value, what="container name")

    @field_validator("exec_command")
    @classmethod
    def _check_exec(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                argv = shlex.split(value)
            except ValueError as error:
                raise ValueError(f"cannot be split into arguments: {error}") from None
            if not argv:
                raise ValueError("is empty")
        return value
