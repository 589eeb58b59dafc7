"""Where the Kubernetes API server is and how to prove who we are, as lightkube's `KubeConfig`. Reads files.

lightkube carries the credentials: in a pod the service account (`KubeConfig.from_service_account`: the
token file, re-read after a 401 as the kubelet rotates it, the cluster CA, the namespace), outside one a
kubeconfig context whose user has a token, a `tokenFile`, a client certificate (a file or inline data), an
`exec` credential plugin (ExecCredential v1beta1 or v1alpha1, run again after a 401) or a username and
password. What stays here is ours: the files are read with a size cap first (a wrong path must not take the
daemon's memory), and what lightkube would only find at the first request (a missing token file, an
auth-provider user, an exec plugin API version it does not speak) is said at start in one line.

The own pod comes from the downward API (`POD_NAME`, `POD_NAMESPACE`), the namespace falling back to the
service account's namespace file or the kubeconfig context's namespace.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml
from lightkube.config.kubeconfig import KubeConfig, SingleConfig
from lightkube.config.models import User
from lightkube.core.exceptions import ConfigError

from sidecar.actuators.kube_names import KubeNameError, check_label, check_subdomain
from sidecar.file_cap import read_capped_file

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
POD_NAME_ENV = "POD_NAME"
POD_NAMESPACE_ENV = "POD_NAMESPACE"
# Far above real sizes (a kubeconfig with many contexts and inline certificates is tens of KiB, a CA bundle
# a few hundred), and small enough that a wrong path (a log, a disk image) cannot take the daemon's memory.
MAX_KUBECONFIG_BYTES = 16 * 2**20
MAX_CREDENTIAL_FILE_BYTES = 4 * 2**20
MAX_TOKEN_BYTES = 64 * 2**10  # a service account JWT is 1-2 KiB; OIDC tokens with many claims stay far below this
# What lightkube 0.22's ExecAuth runs; kubectl also speaks v1, whose ExecCredential carries the token the same way
EXEC_API_VERSIONS = ("client.authentication.k8s.io/v1beta1", "client.authentication.k8s.io/v1alpha1")
# kubectl 1.26 dropped its built-in gcp and azure auth-providers for these exec plugins (kubernetes#112341).
# It still builds in oidc, which refreshes the id-token with the refresh-token at the issuer: lightkube does
# not, and an id-token used as a plain bearer expires within the hour, after which every restart would fail.
_AUTH_PROVIDERS = {
    "gcp": "kubectl 1.26 removed it; use the gke-gcloud-auth-plugin exec plugin",
    "azure": "kubectl 1.26 removed it; use the kubelogin exec plugin (kubelogin get-token)",
    "oidc": "its id-token expires and lightkube does not refresh it; use the kubelogin exec plugin "
    "(kubectl oidc-login get-token)",
}


class CredentialsError(Exception):
    """Credentials could not be loaded; the message is one line saying what is missing or unsupported."""


@dataclass(frozen=True, slots=True, kw_only=True)
class KubeCredentials:
    config: SingleConfig  # lightkube's: the cluster (server, CA) and the user (how to authenticate)
    source: str  # where these came from, for messages: "in-cluster" or "kubeconfig PATH (context NAME)"
    proxy_url: str | None = None  # the cluster's proxy-url (lightkube's Cluster has no field for it)
    namespace: str | None = None  # the service account's namespace, or the kubeconfig context's

    @property
    def server(self) -> str:
        return self.config.cluster.server.rstrip("/")


@dataclass(frozen=True, slots=True, kw_only=True)
class PodRef:
    name: str
    namespace: str


def in_cluster_credentials(
    env: Mapping[str, str] | None = None, directory: Path = SERVICE_ACCOUNT_DIR
) -> KubeCredentials:
    """The pod's service account through lightkube: token (re-read as it rotates), CA, namespace, service address."""
    env = os.environ if env is None else env
    if not env.get("KUBERNETES_SERVICE_HOST") or not env.get("KUBERNETES_SERVICE_PORT"):
        raise CredentialsError(
            "not running in a Kubernetes pod: KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT are not set "
            "(give a kubeconfig instead)"
        )
    token_file = directory / "token"
    if not token_file.is_file():
        raise CredentialsError(
            f"no service account token at {token_file} (is automountServiceAccountToken false on the pod?)"
        )
    _check_file(token_file, "the service account token", MAX_TOKEN_BYTES)
    _check_file(directory / "ca.crt", "the cluster CA", MAX_CREDENTIAL_FILE_BYTES)
    namespace = _check_file(directory / "namespace", "the namespace", MAX_CREDENTIAL_FILE_BYTES).strip()
    try:  # lightkube reads the address from os.environ: the daemon's own environment, as `env` is
        config = KubeConfig.from_service_account(directory).get()
    except (ConfigError, KeyError) as error:
        raise CredentialsError(f"in-cluster credentials: {_one_line(str(error))}") from None
    assert config is not None  # noqa: S101 - from_one sets the current context
    return KubeCredentials(config=config, source="in-cluster", namespace=namespace or None)


def kubeconfig_credentials(path: Path, *, context: str | None = None) -> KubeCredentials:
    """The cluster and user of `context` (default: the kubeconfig's current-context)."""
    document = _read_kubeconfig(path)
    name = context or document.get("current-context")
    if not isinstance(name, str) or not name:
        raise CredentialsError(f"kubeconfig {path} has no current-context; name a context")
    where = f"kubeconfig {path} (context {name})"
    try:
        config = KubeConfig.from_dict(document, fname=path).get(name)
    except ConfigError as error:
        raise CredentialsError(f"kubeconfig {path}: {_one_line(str(error))}") from None
    except KeyError as error:
        raise CredentialsError(f"{where}: no entry named {error} (or a list without it)") from None
    except (TypeError, ValueError, AttributeError) as error:
        raise CredentialsError(f"kubeconfig {path} is not a valid kubeconfig: {_one_line(str(error))}") from None
    assert config is not None  # noqa: S101 - get() with a name returns a config or raises
    user = _checked_user(config, where)
    for file, what, limit in (
        (config.cluster.certificate_auth, "certificate-authority", MAX_CREDENTIAL_FILE_BYTES),
        (user.client_cert, "client-certificate", MAX_CREDENTIAL_FILE_BYTES),
        (user.client_key, "client-key", MAX_CREDENTIAL_FILE_BYTES),
        (user.token_file, "tokenFile", MAX_TOKEN_BYTES),
    ):
        if file:  # lightkube and OpenSSL read these at the first request: bound and check them now
            _check_file(Path(config.abs_file(file)).expanduser(), f"the {what} of {where}", limit)
    # Relative paths: lightkube 0.22 takes these from the working folder, kubectl from the kubeconfig's folder
    # (a plugin command only when it holds a '/', else it is looked up on PATH)
    if user.token_file:
        user = replace(user, token_file=str(config.abs_file(user.token_file)))
    if user.exec is not None and "/" in user.exec.command:
        user = replace(user, exec=replace(user.exec, command=str(config.abs_file(user.exec.command))))
    config = config._replace(user=user)
    if user.exec is not None and shutil.which(user.exec.command) is None:  # else found only at the first request
        hint = f": {_one_line(user.exec.installHint)}" if user.exec.installHint else ""
        raise CredentialsError(f"{where}: exec plugin {user.exec.command!r} is not found or not executable{hint}")
    server = config.cluster.server
    if not server.startswith(("https://", "http://")):
        raise CredentialsError(f"{where}: cluster server {server!r} is not an http(s) URL")
    proxy = _cluster_entry(document, config.context.cluster).get("proxy-url")
    return KubeCredentials(
        config=config,
        source=where,
        proxy_url=proxy if isinstance(proxy, str) and proxy else None,
        namespace=config.context.namespace or None,
    )


def _read_kubeconfig(path: Path) -> dict[str, Any]:
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
    return document


def _checked_user(config: SingleConfig, where: str) -> User:
    """The context's user, if lightkube can authenticate as it; else one line saying what to use instead."""
    user = config.user
    if user is None:
        raise CredentialsError(f"{where}: the context names no user; the API server would see an anonymous caller")
    if user.auth_provider is not None:
        provider = str(user.auth_provider.get("name", "?")) if isinstance(user.auth_provider, dict) else "?"
        instead = _AUTH_PROVIDERS.get(provider, "use the exec credential plugin your provider ships")
        raise CredentialsError(
            f"{where}: user uses the {provider!r} auth-provider, which the sidecar does not run ({instead}, "
            "client.authentication.k8s.io/v1beta1), or a service account token or a client certificate"
        )
    if user.exec is not None and user.exec.apiVersion not in EXEC_API_VERSIONS:
        raise CredentialsError(
            f"{where}: exec plugin {user.exec.command!r} is set to apiVersion {user.exec.apiVersion}; the sidecar "
            f"runs {' or '.join(EXEC_API_VERSIONS)} (set the first: every common plugin answers it)"
        )
    return user


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


def _cluster_entry(document: dict[str, Any], name: str) -> dict[str, Any]:
    for entry in document.get("clusters") or []:
        if isinstance(entry, dict) and entry.get("name") == name and isinstance(entry.get("cluster"), dict):
            cluster: dict[str, Any] = entry["cluster"]
            return cluster
    return {}


def _check_file(path: Path, what: str, limit: int) -> str:
    """The file's text, read with a cap; a one-line `CredentialsError` when it cannot be read or is too big."""
    try:
        return read_capped_file(path, limit).decode("utf-8")
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
