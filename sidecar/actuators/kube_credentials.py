"""Where the Kubernetes API server is and how to prove who we are: in-cluster or a kubeconfig. Reads files.

In a pod the service account's projected volume gives the token, the cluster CA and the namespace, and
`KUBERNETES_SERVICE_HOST`/`_PORT` the address; the token file rotates (the kubelet rewrites it well before
it expires), so the client re-reads it rather than keeping one copy. Outside a cluster a kubeconfig gives
the same: its current (or a named) context's cluster and user. Only what a sidecar needs is understood:
bearer tokens (inline or `tokenFile`), client certificates, a CA file or inline CA, or
`insecure-skip-tls-verify`. Users that run a plugin (`exec`, `auth-provider`) or use a password are
refused with a one-line `CredentialsError`, never half-supported.

The own pod comes from the downward API (`POD_NAME`, `POD_NAMESPACE`), the namespace falling back to the
service account's namespace file or the kubeconfig context's namespace.
"""

from __future__ import annotations

import base64
import binascii
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from sidecar.actuators.kube_names import KubeNameError, check_label, check_subdomain
from sidecar.file_cap import read_capped_file

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
POD_NAME_ENV = "POD_NAME"
POD_NAMESPACE_ENV = "POD_NAMESPACE"
# Far above real sizes (a kubeconfig with many contexts and inline certificates is tens of KiB, a CA bundle
# a few hundred), and small enough that a wrong path (a log, a disk image) cannot take the daemon's memory.
MAX_KUBECONFIG_BYTES = 16 * 2**20
MAX_CREDENTIAL_FILE_BYTES = 4 * 2**20
_UNSUPPORTED_USER_KEYS = {
    "exec": "an exec credential plugin",
    "auth-provider": "an auth-provider plugin",
    "username": "basic authentication (username/password)",
    "password": "basic authentication (username/password)",
}


class CredentialsError(Exception):
    """Credentials could not be loaded; the message is one line saying what is missing or unsupported."""


@dataclass(frozen=True, slots=True, kw_only=True)
class KubeCredentials:
    server: str  # https://host:port, possibly with a path prefix (some proxies put the cluster under one)
    source: str  # where these came from, for messages: "in-cluster" or "kubeconfig PATH (context NAME)"
    ca_pem: str | None = None  # CA bundle (PEM); None trusts the system's store
    insecure_skip_tls_verify: bool = False
    token: str | None = None  # a fixed bearer token
    token_file: Path | None = None  # a bearer token re-read when it may have rotated
    client_cert_pem: str | None = None
    client_key_pem: str | None = None
    proxy_url: str | None = None
    namespace: str | None = None  # the service account's namespace, or the kubeconfig context's


@dataclass(frozen=True, slots=True, kw_only=True)
class PodRef:
    name: str
    namespace: str


def in_cluster_credentials(
    env: Mapping[str, str] | None = None, directory: Path = SERVICE_ACCOUNT_DIR
) -> KubeCredentials:
    """The pod's service account: token (re-read as it rotates), CA and namespace, and the service address."""
    env = os.environ if env is None else env
    host = env.get("KUBERNETES_SERVICE_HOST", "")
    port = env.get("KUBERNETES_SERVICE_PORT", "")
    if not host or not port:
        raise CredentialsError(
            "not running in a Kubernetes pod: KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT are not set "
            "(give a kubeconfig instead)"
        )
    token_file = directory / "token"
    if not token_file.is_file():
        raise CredentialsError(
            f"no service account token at {token_file} (is automountServiceAccountToken false on the pod?)"
        )
    ca_pem = _read_text(directory / "ca.crt", "the cluster CA")
    namespace_file = directory / "namespace"
    namespace = _read_text(namespace_file, "the namespace").strip() if namespace_file.is_file() else None
    host = f"[{host}]" if ":" in host else host  # an IPv6 service address
    return KubeCredentials(
        server=f"https://{host}:{port}",
        source="in-cluster",
        ca_pem=ca_pem,
        token_file=token_file,
        namespace=namespace or None,
    )


def kubeconfig_credentials(path: Path, *, context: str | None = None) -> KubeCredentials:
    """The cluster and user of `context` (default: the kubeconfig's current-context)."""
    try:
        document = yaml.safe_load(read_capped_file(path, MAX_KUBECONFIG_BYTES).decode("utf-8"))
    except OSError as error:
        raise CredentialsError(f"cannot read kubeconfig {path}: {error.strerror or error}") from None
    except UnicodeDecodeError as error:
        raise CredentialsError(f"kubeconfig {path} is not UTF-8 text (byte {error.start})") from None
    except yaml.YAMLError as error:
        raise CredentialsError(f"kubeconfig {path} is not YAML: {_yaml_problem(error)}") from None
    if not isinstance(document, dict):
        raise CredentialsError(f"kubeconfig {path} is not a mapping")
    name = context or document.get("current-context")
    if not isinstance(name, str) or not name:
        raise CredentialsError(f"kubeconfig {path} has no current-context; name a context")
    where = f"kubeconfig {path} (context {name})"
    ctx = _named(document, "contexts", "context", name, path)
    cluster = _named(document, "clusters", "cluster", _field(ctx, "cluster", where), path)
    user_name = ctx.get("user")
    user = _named(document, "users", "user", user_name, path) if isinstance(user_name, str) and user_name else {}
    for key, what in _UNSUPPORTED_USER_KEYS.items():
        if key in user:
            raise CredentialsError(
                f"{where}: user {user_name!r} uses {what}, which the sidecar does not support; "
                "use a service account token or a client certificate"
            )
    base = path.parent
    server = _field(cluster, "server", where)
    if not server.startswith(("https://", "http://")):
        raise CredentialsError(f"{where}: cluster server {server!r} is not an http(s) URL")
    token = user.get("token")
    namespace = ctx.get("namespace")
    return KubeCredentials(
        server=server.rstrip("/"),
        source=where,
        ca_pem=_pem(cluster, "certificate-authority", base, where),
        insecure_skip_tls_verify=cluster.get("insecure-skip-tls-verify") is True,
        token=token if isinstance(token, str) and token else None,
        token_file=_path(user.get("tokenFile"), base),
        client_cert_pem=_pem(user, "client-certificate", base, where),
        client_key_pem=_pem(user, "client-key", base, where),
        proxy_url=cluster.get("proxy-url") if isinstance(cluster.get("proxy-url"), str) else None,
        namespace=namespace if isinstance(namespace, str) and namespace else None,
    )


def own_pod(env: Mapping[str, str] | None = None, *, namespace_fallback: str | None = None) -> PodRef:
    """The sidecar's own pod from the downward API (`POD_NAME`, `POD_NAMESPACE`), names validated."""
    env = os.environ if env is None else env
    name = env.get(POD_NAME_ENV, "")
    namespace = env.get(POD_NAMESPACE_ENV, "") or namespace_fallback or ""
    hint = "set it from the downward API (env valueFrom.fieldRef.fieldPath: metadata.name / metadata.namespace)"
    if not name:
        raise CredentialsError(f"{POD_NAME_ENV} is not set: {hint}")
    if not namespace:
        raise CredentialsError(f"{POD_NAMESPACE_ENV} is not set and no service account namespace is known: {hint}")
    try:
        return PodRef(name=check_subdomain(name, what="pod name"), namespace=check_label(namespace, what="namespace"))
    except KubeNameError as error:
        raise CredentialsError(str(error)) from None


def _named(document: dict[str, Any], section: str, key: str, name: object, path: Path) -> dict[str, Any]:
    """The `key` mapping of the entry called `name` in the kubeconfig's `section` list."""
    entries = document.get(section)
    for entry in entries if isinstance(entries, list) else []:
        if isinstance(entry, dict) and entry.get("name") == name:
            value = entry.get(key)
            return value if isinstance(value, dict) else {}
    raise CredentialsError(f"kubeconfig {path} has no {key} named {name!r} in {section}")


def _field(mapping: dict[str, Any], key: str, where: str) -> str:
    value = mapping.get(key)
    if not isinstance(value, str) or not value:
        raise CredentialsError(f"{where}: {key} is missing")
    return value


def _path(value: object, base: Path) -> Path | None:
    """A path from the kubeconfig; relative ones are relative to the kubeconfig's folder, as kubectl reads them."""
    if not isinstance(value, str) or not value:
        return None
    return base / Path(value).expanduser()


def _pem(mapping: dict[str, Any], key: str, base: Path, where: str) -> str | None:
    """`key-data` (base64 PEM) or the file named by `key`; None when neither is given."""
    data = mapping.get(f"{key}-data")
    if isinstance(data, str) and data:
        try:
            return base64.b64decode(data, validate=True).decode("ascii")
        except (binascii.Error, UnicodeDecodeError):
            raise CredentialsError(f"{where}: {key}-data is not base64 of a PEM text") from None
    file = _path(mapping.get(key), base)
    return None if file is None else _read_text(file, key)


def _read_text(path: Path, what: str) -> str:
    try:
        return read_capped_file(path, MAX_CREDENTIAL_FILE_BYTES).decode("utf-8")
    except (OSError, UnicodeDecodeError) as error:
        reason = error.strerror if isinstance(error, OSError) and error.strerror else str(error)
        raise CredentialsError(f"cannot read {what} from {path}: {reason}") from None


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _yaml_problem(error: yaml.YAMLError) -> str:
    """What is wrong and where, without the text around it: PyYAML quotes the offending line, which in a
    kubeconfig can be a `token:` or `client-key-data:` line."""
    problem = getattr(error, "problem", None) or getattr(error, "context", None) or type(error).__name__
    mark = getattr(error, "problem_mark", None) or getattr(error, "context_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    return f"{_one_line(str(problem))}{where}"
