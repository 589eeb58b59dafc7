"""--remediate on Kubernetes: the record and vLLM's flags in the Deployment that owns the sidecar's pod. Network I/O.

`DeploymentFlags` is a flags target (the shell's `FlagsTarget`, by shape). It finds the Deployment through the
sidecar's own pod (`kube_owner`: Pod -> ReplicaSet -> Deployment, each hop checked by uid), remembers its name
and uid, and keeps two annotations in the Deployment's own metadata, which outlive every pod (a rollout
replaces the sidecar with vLLM, and its state dir is an emptyDir) and, being outside the pod template, roll
nothing:

- `vllm-sidecar.io/remediations`: the record, `remediation_record.document_of` as JSON;
- `vllm-sidecar.io/flags`: the words the sidecar appended to vLLM's container args, a JSON list, so that the
  next write replaces them instead of adding to them.

`update` reads the Deployment, applies `edit` to its record and sends ONE strategic merge patch: both annotations
and, when they differ, the vLLM container's `args` with the sidecar's old suffix replaced by the flags the steps
set (`remediation_record.flag_words`), appended last: vLLM's argument parser keeps the last occurrence of a
flag, so they win over the same flag earlier in the args. The patch carries the resourceVersion it read: a
write in between (the other replicas' sidecars, a person, a controller) makes it a 409 and nothing is written,
so no step is lost; the remediator reads again next time.

A patch that changes the args changes the pod template, and the Deployment replaces its pods by its strategy:
that rollout IS the restart that applies the new flags (`restarts_on_change`), so the remediator asks for no
restart of its own, which would replace the new pod again. A patch that changes the record only (a step
confirmed) leaves the template, and so every pod, alone.

Refused with one line (`RecordError`), nothing written: a record that is not one; args that no longer end with
the words the sidecar appended (someone changed them: a person decides); no container named `container`, or
one whose command line comes from its image; a 409; any other refusal of the API server (a 403 names the verb
and resource the Role lacks, and `deploy/kubernetes/add-remediation/rbac.yaml`, which grants them).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path

from lightkube.core.exceptions import ConfigError

from sidecar.actuators import kube_bodies
from sidecar.actuators.kube_client import STRATEGIC_MERGE_PATCH, KubeClient, KubeTransportError
from sidecar.actuators.kube_credentials import CredentialsError, in_cluster_credentials, kubeconfig_credentials
from sidecar.actuators.kube_names import KubeNameError, check_label, check_subdomain
from sidecar.actuators.kube_owner import (
    CHAIN_PERMISSIONS,
    GET_DEPLOYMENT,
    KubeReader,
    Unowned,
    deployment_path,
    metadata,
    owning_deployment,
)
from sidecar.actuators.kube_permission import Permission, RequestFailedError
from sidecar.actuators.remediation_record import (
    RecordError,
    RecordFormatError,
    document_of,
    flag_words,
    steps_from,
    trimmed,
)
from sidecar.model.remediation import Step

RECORD_ANNOTATION = "vllm-sidecar.io/remediations"
# Kubernetes caps all of an object's annotations together at 256 KiB, and a Deployment often carries
# kubectl's last-applied-configuration beside this one: the record keeps to an eighth of the cap (about 50 steps).
RECORD_MAX_BYTES = 32 * 1024
FLAGS_ANNOTATION = "vllm-sidecar.io/flags"
RBAC_FILE = "deploy/kubernetes/add-remediation/rbac.yaml"
PATCH_DEPLOYMENT = Permission("patch", "deployments", "apps")
PERMISSIONS = (*CHAIN_PERMISSIONS, PATCH_DEPLOYMENT)
_UNOWNED = Unowned(
    missing="no Deployment whose vLLM args --remediate could change",
    other="--remediate changes vLLM's args in a Deployment only",
)


class DeploymentFlags:
    """The record and vLLM's flags in the Deployment that owns `pod`; vLLM's container is `container`."""

    restarts_on_change = True  # a change of the args rolls the Deployment out: that is the restart

    def __init__(
        self,
        *,
        client: KubeClient,
        pod: str | None,
        namespace: str,
        container: str = "vllm",
        deployment: str | None = None,
    ) -> None:
        """Found from `pod` (the sidecar's own) through its controller chain, or named as `deployment` (a person
        at `vllm-sidecar remediations`, outside the pod)."""
        if (pod is None) == (deployment is None):
            raise ValueError("give the sidecar's pod or the Deployment, one of them")
        self.pod = check_subdomain(pod, what="pod name") if pod is not None else None
        self.namespace = check_label(namespace, what="namespace")
        self.container = container
        self._client = client
        self._reader = KubeReader(client, self.namespace, rbac_file=RBAC_FILE)
        # The Deployment's name and uid, once the chain led there (a named one: no uid to hold it to).
        self._found: tuple[str, str | None] | None = None
        if deployment is not None:
            self._found = (check_subdomain(deployment, what="Deployment name"), None)

    @property
    def where(self) -> str:
        owner = f"Deployment {self._found[0]}" if self._found else f"the Deployment owning pod {self.pod}"
        return f"{owner} in namespace {self.namespace}, container {self.container}'s args"

    async def read(self) -> list[Step]:
        name, document = await self._deployment()
        return _steps(document, name)

    async def update(self, edit: Callable[[list[Step]], list[Step]]) -> list[Step]:
        name, document = await self._deployment()
        steps = _steps(document, name)
        changed = trimmed(edit(steps), max_bytes=RECORD_MAX_BYTES)
        annotations = _annotations(document)
        suffix = _suffix(annotations, name)
        args = self._args(document, name)
        kept = len(args) - len(suffix)
        if kept < 0 or args[kept:] != suffix:
            raise RecordError(
                f"the args of container {self.container} in Deployment {name} no longer end with the flags the "
                f"sidecar set ({' '.join(suffix)}): someone changed them, so nothing is written and a person "
                f"decides (put them back, or take them out with both annotations {FLAGS_ANNOTATION} and "
                f"{RECORD_ANNOTATION}: docs/remediation.md)"
            )
        words = flag_words(changed)
        new_args = args[:kept] + words
        if changed == steps and words == suffix and new_args == args:
            return changed  # nothing to write
        await self._patch(name, document, changed, words, new_args if new_args != args else None)
        return changed

    async def _deployment(self) -> tuple[str, dict[str, object]]:
        try:
            if self._found is None:
                assert self.pod is not None  # noqa: S101 - the constructor takes one of the two
                found = await owning_deployment(self._reader, self.pod, _UNOWNED)
                self._found = (found.name, found.uid)
                return found.name, found.document
            name, uid = self._found
            path = deployment_path(self.namespace, name)
            return name, await self._reader.get(path, GET_DEPLOYMENT, f"Deployment {name}", uid=uid)
        except (RequestFailedError, KubeTransportError, KubeNameError) as error:
            raise RecordError(str(error)) from None

    def _args(self, document: Mapping[str, object], name: str) -> list[str]:
        for container in _containers(document):
            if container.get("name") != self.container:
                continue
            args = container.get("args")
            if args is None and container.get("command") is None:
                raise RecordError(
                    f"container {self.container} in Deployment {name} takes its command line from its image: "
                    "give vLLM's args in the Deployment, so the sidecar can append its flags to them"
                )
            if args is None:
                return []
            if not isinstance(args, list) or not all(isinstance(word, str) for word in args):
                raise RecordError(f"container {self.container} in Deployment {name}: args is not a list of strings")
            return list(args)
        raise RecordError(
            f"Deployment {name} has no container {self.container} (--vllm-container names vLLM's): nothing written"
        )

    async def _patch(
        self, name: str, document: Mapping[str, object], steps: list[Step], words: list[str], args: list[str] | None
    ) -> None:
        version = metadata(document).get("resourceVersion")
        if not isinstance(version, str) or not version:
            raise RecordError(f"Deployment {name} came without a resourceVersion: nothing written")
        record = json.dumps(document_of(steps), separators=(",", ":"))
        patch = kube_bodies.flags_patch(
            resource_version=version,  # a write since the read makes this a 409
            annotations={RECORD_ANNOTATION: record, FLAGS_ANNOTATION: json.dumps(words)},
            container=self.container,
            args=args,  # None: the pod template stays as it is, nothing rolls
        )
        path = deployment_path(self.namespace, name)
        try:
            answer = await self._client.request("PATCH", path, body=patch, content_type=STRATEGIC_MERGE_PATCH)
            if answer.status_code == 409:
                raise RecordError(
                    f"Deployment {name} in namespace {self.namespace} changed between the sidecar's read and its "
                    "write (HTTP 409 Conflict): nothing written; it is read again next time"
                )
            self._reader.check(answer, PATCH_DEPLOYMENT, f"Deployment {name}", ok=(200,))
        except (RequestFailedError, KubeTransportError) as error:
            raise RecordError(str(error)) from None


def _annotations(document: Mapping[str, object]) -> Mapping[str, object]:
    found = metadata(document).get("annotations")
    return found if isinstance(found, dict) else {}


def _steps(document: Mapping[str, object], name: str) -> list[Step]:
    text = _annotations(document).get(RECORD_ANNOTATION)
    if text is None:
        return []
    try:
        return steps_from(json.loads(str(text)))
    except (ValueError, RecordFormatError) as error:  # json's JSONDecodeError is a ValueError
        raise RecordError(f"annotation {RECORD_ANNOTATION} of Deployment {name}: {_first_line(error)}") from None


def _suffix(annotations: Mapping[str, object], name: str) -> list[str]:
    text = annotations.get(FLAGS_ANNOTATION)
    if text is None:
        return []
    try:
        words = json.loads(str(text))
    except ValueError:
        words = None
    if not isinstance(words, list) or not all(isinstance(word, str) for word in words):
        raise RecordError(f"annotation {FLAGS_ANNOTATION} of Deployment {name} is not a JSON list of strings")
    return words


def _containers(document: Mapping[str, object]) -> list[Mapping[str, object]]:
    spec = document.get("spec")
    template = spec.get("template") if isinstance(spec, dict) else None
    pod = template.get("spec") if isinstance(template, dict) else None
    containers = pod.get("containers") if isinstance(pod, dict) else None
    return [c for c in containers if isinstance(c, dict)] if isinstance(containers, list) else []


def _first_line(error: Exception) -> str:
    return " ".join(str(error).split())[:300]


def kubectl_target(
    *, deployment: str, namespace: str | None, container: str, kubeconfig: Path | None
) -> tuple[DeploymentFlags, KubeClient]:
    """A named Deployment's record, with the credentials kubectl would use: `kubeconfig`, else $KUBECONFIG's
    first file, else ~/.kube/config, else the pod's service account. ValueError (one line) when none works or a
    name is one Kubernetes would refuse. The caller closes the client."""
    path = kubeconfig
    if path is None:
        listed = os.environ.get("KUBECONFIG", "").split(os.pathsep)[0]
        home = Path.home() / ".kube" / "config"
        path = Path(listed) if listed else home if home.is_file() else None
    try:
        credentials = kubeconfig_credentials(path) if path is not None else in_cluster_credentials()
        client = KubeClient(credentials)
    except (CredentialsError, ConfigError, OSError) as error:
        raise ValueError(f"no credentials for Kubernetes: {_first_line(error)}") from None
    chosen = namespace or credentials.namespace or "default"
    try:
        return DeploymentFlags(
            client=client, pod=None, namespace=chosen, container=container, deployment=deployment
        ), client
    except KubeNameError as error:
        raise ValueError(str(error)) from None
