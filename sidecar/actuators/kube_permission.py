"""What an API answer means for the adapter: RBAC permissions and one-line failures. Pure, no I/O.

Each request the adapter makes is tied to the one `Permission` it needs, so a 403 can name exactly the
verb and resource the Role lacks instead of echoing the server's sentence.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from sidecar.actuators.base import OutcomeStatus
from sidecar.actuators.kube_client import KubeResponse

RBAC_FILE = "deploy/kubernetes/add-sidecar/rbac.yaml"
_USER = re.compile(r'User "([^"]+)"')


@dataclass(frozen=True, slots=True)
class Permission:
    verb: str
    resource: str  # plural, with a subresource after '/': "pods/eviction"
    group: str = ""  # "" is the core API group

    def __str__(self) -> str:
        """`create pods/eviction`, `patch deployments.apps`: how `kubectl auth can-i` spells it."""
        return f"{self.verb} {self.resource}{'.' + self.group if self.group else ''}"


EVENT_PERMISSIONS = (Permission("get", "pods"), Permission("create", "events"))


class RequestFailedError(Exception):
    """A request was refused or failed; carries the outcome status (FAILED or NOT_NOW) and a one-line detail."""

    def __init__(self, status: OutcomeStatus, detail: str) -> None:
        super().__init__(detail)
        self.status = status


def check_response(
    answer: KubeResponse,
    permission: Permission,
    what: str,
    *,
    namespace: str,
    source: str,
    ok: tuple[int, ...],
    rbac_file: str = RBAC_FILE,
) -> None:
    """Return when the answer is one of `ok`; otherwise raise `RequestFailedError` saying what went wrong."""
    if answer.status_code in ok:
        return
    raise RequestFailedError(
        OutcomeStatus.FAILED,
        failure(answer, permission, what, namespace=namespace, source=source, rbac_file=rbac_file),
    )


def failure(
    answer: KubeResponse, permission: Permission, what: str, *, namespace: str, source: str, rbac_file: str = RBAC_FILE
) -> str:
    """One line for an answer that is not a success; a 403 points at `rbac_file`, the manifest granting it."""
    code = answer.status_code
    if code == 403:
        return forbidden(answer, permission, namespace, rbac_file=rbac_file)
    if code == 404:
        return f"not found: {what} in namespace {namespace} (HTTP 404: {answer.message})"
    if code == 401:
        return f"unauthorized: the API server rejected the credentials from {source} (HTTP 401: {answer.message})"
    return f"{permission} for {what} in namespace {namespace}: the API server answered HTTP {code}: {answer.message}"


def forbidden(answer: KubeResponse, permission: Permission, namespace: str, *, rbac_file: str = RBAC_FILE) -> str:
    user = _USER.search(answer.message)
    who = f" as {user.group(1)}" if user else ""
    if "cannot impersonate" in answer.message:  # refused before the request itself was looked at
        impersonator = user.group(1) if user else "the kubeconfig's user"
        return (
            f"forbidden: {impersonator} may not impersonate whom the kubeconfig's `as` names; grant it verb "
            f"impersonate on that user or service account ({answer.message})"
        )
    group = permission.group or '"" (core)'
    return (
        f"forbidden: cannot {permission.verb} {permission.resource} in namespace {namespace}{who}; "
        f"the Role must grant verb {permission.verb} on resource {permission.resource} in API group {group} "
        f"(see {rbac_file})"
    )
