"""Where the Kubernetes API server is and how to prove who we are, as lightkube's `KubeConfig`. Reads files.

lightkube carries the credentials: in a pod the service account (`KubeConfig.from_service_account`: the
token file, re-read after a 401 as the kubelet rotates it, the cluster CA, the namespace), outside one a
kubeconfig context whose user has a token, a `tokenFile`, a client certificate (a file or inline data) or a
username and password. An `exec` credential plugin and the `oidc` auth-provider are run by `kube_auth` as
kubectl runs them (lightkube runs older plugins only and no auth-provider), and the user's impersonation
(`as`, `as-groups`, ...) and the cluster's `tls-server-name` are read here too, as lightkube 0.22 has no
fields for them. What stays here is ours: the files are read with a size cap first (a wrong path must not
take the daemon's memory), and what would only fail at the first request (a missing token file, a plugin
not installed, an auth-provider kubectl no longer has) is said at start in one line.

The own pod comes from the downward API (`POD_NAME`, `POD_NAMESPACE`), the namespace falling back to the
service account's namespace file or the kubeconfig context's namespace.
"""

from __future__ import annotations

import base64
import binascii
import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx
import yaml
from lightkube.config.kubeconfig import KubeConfig, SingleConfig
from lightkube.config.models import UserExec
from lightkube.core.exceptions import ConfigError

from sidecar.actuators.kube_auth import EXEC_API_VERSIONS, ExecCredentialAuth, ExecPlugin, impersonation_headers
from sidecar.actuators.kube_names import KubeNameError, check_label, check_subdomain
from sidecar.actuators.kube_oidc import OidcAuth, OidcProvider
from sidecar.file_cap import read_capped_file
from sidecar.model.text import one_line

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
POD_NAME_ENV = "POD_NAME"
POD_NAMESPACE_ENV = "POD_NAMESPACE"
# Far above real sizes (a kubeconfig with many contexts and inline certificates is tens of KiB, a CA bundle
# a few hundred), and small enough that a wrong path (a log, a disk image) cannot take the daemon's memory.
MAX_KUBECONFIG_BYTES = 16 * 2**20
MAX_CREDENTIAL_FILE_BYTES = 4 * 2**20
MAX_TOKEN_BYTES = 64 * 2**10  # a service account JWT is 1-2 KiB; OIDC tokens with many claims stay far below this
# kubectl 1.26 dropped its built-in gcp and azure auth-providers for these exec plugins (kubernetes#112341);
# oidc is the one it still builds in.
_REMOVED_AUTH_PROVIDERS = {
    "gcp": "kubectl 1.26 removed it; use the gke-gcloud-auth-plugin exec plugin",
    "azure": "kubectl 1.26 removed it; use the kubelogin exec plugin (kubelogin get-token)",
}
# The cluster extension whose value client-go hands an exec plugin as spec.cluster.config
_EXEC_EXTENSION = "client.authentication.k8s.io/exec"


class CredentialsError(Exception):
    """Credentials could not be loaded; the message is one line saying what is missing or unsupported."""


@dataclass(frozen=True, slots=True, kw_only=True)
class KubeCredentials:
    config: SingleConfig  # lightkube's: the cluster (server, CA) and the user (how to authenticate)
    source: str  # where these came from, for messages: "in-cluster" or "kubeconfig PATH (context NAME)"
    proxy_url: str | None = None  # the cluster's proxy-url (lightkube's Cluster has no field for it)
    namespace: str | None = None  # the service account's namespace, or the kubeconfig context's
    auth: httpx.Auth | None = None  # an exec plugin's or oidc's, in place of lightkube's (which has none)
    impersonation: tuple[tuple[str, str], ...] = ()  # Impersonate-* headers from the user's as, as-groups, ...
    tls_server_name: str | None = None  # the name the server's certificate is checked against (and SNI)

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
        raise CredentialsError(f"in-cluster credentials: {one_line(str(error))}") from None
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
        raise CredentialsError(f"kubeconfig {path}: {one_line(str(error))}") from None
    except KeyError as error:
        raise CredentialsError(f"{where}: no entry named {error} (or a list without it)") from None
    except (TypeError, ValueError, AttributeError) as error:
        raise CredentialsError(f"kubeconfig {path} is not a valid kubeconfig: {one_line(str(error))}") from None
    assert config is not None  # noqa: S101 - get() with a name returns a config or raises
    if config.user is None:
        raise CredentialsError(f"{where}: the context names no user; the API server would see an anonymous caller")
    user = config.user
    cluster = _named_entry(document, "clusters", config.context.cluster, "cluster")
    user_entry = _named_entry(document, "users", config.context.user or "", "user")
    read: dict[str, str] = {}  # what was read, by the kubeconfig's key
    for file, what, limit in (
        (config.cluster.certificate_auth, "certificate-authority", MAX_CREDENTIAL_FILE_BYTES),
        (user.client_cert, "client-certificate", MAX_CREDENTIAL_FILE_BYTES),
        (user.client_key, "client-key", MAX_CREDENTIAL_FILE_BYTES),
        (user.token_file, "tokenFile", MAX_TOKEN_BYTES),
    ):
        if file:  # lightkube and OpenSSL read these at the first request: bound and check them now
            read[what] = _check_file(Path(config.abs_file(file)).expanduser(), f"the {what} of {where}", limit)
    # Relative paths: lightkube 0.22 takes these from the working folder, kubectl from the kubeconfig's folder
    if user.token_file:
        user = replace(user, token_file=str(config.abs_file(user.token_file)))
    config = config._replace(user=user)
    server = config.cluster.server
    if not server.startswith(("https://", "http://")):
        raise CredentialsError(f"{where}: cluster server {server!r} is not an http(s) URL")
    try:
        impersonation = impersonation_headers(user_entry, where)
    except ValueError as error:
        raise CredentialsError(str(error)) from None
    auth: httpx.Auth | None = None
    if user.exec is not None:
        ca_pem = read.get("certificate-authority")
        auth = ExecCredentialAuth(
            _exec_plugin(config, user.exec, user_entry.get("exec"), cluster, ca_pem=ca_pem, where=where)
        )
    elif user.auth_provider is not None:
        auth = OidcAuth(_oidc_provider(config, user.auth_provider, where))
    proxy, tls_server_name = cluster.get("proxy-url"), cluster.get("tls-server-name")
    return KubeCredentials(
        config=config,
        source=where,
        proxy_url=proxy if isinstance(proxy, str) and proxy else None,
        namespace=config.context.namespace or None,
        auth=auth,
        impersonation=impersonation,
        tls_server_name=tls_server_name if isinstance(tls_server_name, str) and tls_server_name else None,
    )


def _exec_plugin(
    config: SingleConfig, exec_: UserExec, entry: object, cluster: Mapping[str, Any], *, ca_pem: str | None, where: str
) -> ExecPlugin:
    """The user's exec plugin as kubectl runs it, or one line saying why it cannot run here. `entry` is the
    kubeconfig's own `exec` mapping: its interactiveMode and provideClusterInfo, which lightkube's model drops."""
    spec: Mapping[str, Any] = entry if isinstance(entry, dict) else {}
    if exec_.apiVersion not in EXEC_API_VERSIONS:
        raise CredentialsError(
            f"{where}: exec plugin {exec_.command!r} is set to apiVersion {exec_.apiVersion}; kubectl and the "
            f"sidecar run {', '.join(EXEC_API_VERSIONS)}"
        )
    if spec.get("interactiveMode") == "Always":
        raise CredentialsError(
            f"{where}: exec plugin {exec_.command!r} has interactiveMode Always, and a daemon has no terminal to "
            "prompt on; set IfAvailable or Never with a plugin that can log in without one"
        )
    # kubectl runs a command holding a '/' from the kubeconfig's folder, any other from PATH
    command = str(config.abs_file(exec_.command)) if "/" in exec_.command else exec_.command
    if shutil.which(command) is None:  # else found only at the first request
        hint = f": {one_line(exec_.installHint)}" if exec_.installHint else ""
        raise CredentialsError(f"{where}: exec plugin {exec_.command!r} is not found or not executable{hint}")
    info = _cluster_info(config, cluster, ca_pem) if spec.get("provideClusterInfo") is True else None
    return ExecPlugin(
        api_version=exec_.apiVersion,
        command=command,
        args=tuple(exec_.args or ()),
        env=tuple((variable.name, variable.value) for variable in exec_.env or ()),
        cluster=info,
    )


def _cluster_info(config: SingleConfig, cluster: Mapping[str, Any], ca_pem: str | None) -> dict[str, object]:
    """The cluster as client-go gives it to a plugin that asks (spec.cluster of KUBERNETES_EXEC_INFO); `ca_pem`
    is the certificate-authority file's text, read at the start's check."""
    info: dict[str, object] = {"server": config.cluster.server}
    ca_data = config.cluster.certificate_auth_data
    if not ca_data and ca_pem is not None:
        ca_data = base64.b64encode(ca_pem.encode()).decode()
    if ca_data:
        info["certificate-authority-data"] = ca_data
    for key in ("tls-server-name", "insecure-skip-tls-verify", "proxy-url", "disable-compression"):
        if cluster.get(key):
            info[key] = cluster[key]
    for extension in cluster.get("extensions") or []:
        if isinstance(extension, dict) and extension.get("name") == _EXEC_EXTENSION:
            info["config"] = extension.get("extension")
    return info


def _oidc_provider(config: SingleConfig, provider: Mapping[str, Any], where: str) -> OidcProvider:
    """The `oidc` auth-provider's config, or one line for a provider kubectl no longer has."""
    name = str(provider.get("name", "?"))
    if name != "oidc":
        instead = _REMOVED_AUTH_PROVIDERS.get(
            name, "kubectl builds in only oidc; use the exec plugin your provider ships"
        )
        raise CredentialsError(
            f"{where}: user uses the {name!r} auth-provider, which the sidecar does not run ({instead})"
        )
    settings = provider.get("config")
    settings = settings if isinstance(settings, dict) else {}

    def text(key: str) -> str | None:
        value = settings.get(key)
        return value if isinstance(value, str) and value else None

    ca_pem = None
    if text("idp-certificate-authority-data"):
        try:
            ca_pem = base64.b64decode(str(text("idp-certificate-authority-data")), validate=True).decode()
        except (binascii.Error, UnicodeDecodeError):
            raise CredentialsError(f"{where}: oidc idp-certificate-authority-data is not base64 PEM") from None
    elif text("idp-certificate-authority"):
        ca_file = Path(config.abs_file(str(text("idp-certificate-authority")))).expanduser()
        ca_pem = _check_file(ca_file, f"the oidc idp-certificate-authority of {where}", MAX_CREDENTIAL_FILE_BYTES)
    if not text("id-token") and not (text("refresh-token") and text("idp-issuer-url") and text("client-id")):
        raise CredentialsError(
            f"{where}: the oidc auth-provider has no id-token, and no refresh-token, idp-issuer-url and client-id "
            "to get one: log in with kubectl first"
        )
    return OidcProvider(
        issuer_url=text("idp-issuer-url"),
        client_id=text("client-id"),
        client_secret=text("client-secret"),
        id_token=text("id-token"),
        refresh_token=text("refresh-token"),
        ca_pem=ca_pem,
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


def _named_entry(document: dict[str, Any], section: str, name: str, key: str) -> dict[str, Any]:
    """The mapping under `key` of the entry called `name` in the kubeconfig's `section` (clusters, users)."""
    for entry in document.get(section) or []:
        if isinstance(entry, dict) and entry.get("name") == name and isinstance(entry.get(key), dict):
            found: dict[str, Any] = entry[key]
            return found
    return {}


def _check_file(path: Path, what: str, limit: int) -> str:
    """The file's text, read with a cap; a one-line `CredentialsError` when it cannot be read or is too big."""
    try:
        return read_capped_file(path, limit).decode("utf-8")
    except (OSError, UnicodeDecodeError) as error:
        reason = error.strerror if isinstance(error, OSError) and error.strerror else str(error)
        raise CredentialsError(f"cannot read {what} from {path}: {reason}") from None


def _yaml_problem(error: yaml.YAMLError) -> str:
    """What is wrong and where, without the text around it: PyYAML quotes the offending line, which in a
    kubeconfig can be a `token:` or `client-key-data:` line."""
    problem = getattr(error, "problem", None) or getattr(error, "context", None) or type(error).__name__
    mark = getattr(error, "problem_mark", None) or getattr(error, "context_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    return f"{one_line(str(problem))}{where}"
