"""Builds what acting needs from the settings: the restart adapter, the policy's settings, the notifier's sinks.

Reads files named in the settings (the HMAC key, kubeconfig and service-account credentials) and finds the exec
adapter's program. Every problem is a `SettingsError` with one line, so the daemon stops at start (exit 2)
rather than discover it mid-incident. What only the platform can answer, over async I/O (does systemd know the
unit?), is left in `ActingParts.start_check` for the daemon to await before it starts.
"""

from __future__ import annotations

import os
import shlex
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import httpx

from sidecar.actuators.base import Actuator
from sidecar.actuators.exec import ExecActuator, program_problem
from sidecar.actuators.file_log import FileLog
from sidecar.actuators.log_source import LogSource
from sidecar.actuators.none import NoActuator
from sidecar.config.setting_origin import Layer
from sidecar.file_cap import FileTooLargeError, read_capped_file
from sidecar.model.server_command import ServerCommand
from sidecar.notify.event import EventNotificationSink, EventSink
from sidecar.notify.payload import Origin, WebhookFormat
from sidecar.notify.sink import NotificationSink
from sidecar.notify.webhook import WebhookSink
from sidecar.policy.settings import PolicySettings, PolicySettingsError, stale_after_for_interval
from sidecar.shell.remediation_store import FLAGS_FILE, FlagsTarget
from sidecar.shell.settings import Settings, SettingsError, core_values, setting_error

if TYPE_CHECKING:
    from sidecar.actuators.systemd import SystemdActuator

MAX_KEY_BYTES = 4096
# Raises SettingsError when restarts could never work; returns what it could not check (one line), or None.
StartCheck = Callable[[], Awaitable[str | None]]


@dataclass(slots=True)
class ActingParts:
    actuator: Actuator
    events: EventSink | None
    pod: str | None
    vllm_log: LogSource | None = None  # where why vLLM died is read: the journal, the pod's log, --vllm-log
    start_check: StartCheck | None = None  # the platform's answers the daemon awaits before it starts
    # Where --remediate keeps its record and vLLM's flags when the platform holds them (Kubernetes: the Deployment)
    flags_target: FlagsTarget | None = None
    # vLLM's command line as the platform declares it (Kubernetes: the pod's spec), for readings of its log
    declared_command: Callable[[], Awaitable[ServerCommand | None]] | None = None


def policy_settings(settings: Settings) -> PolicySettings:
    try:
        return PolicySettings(
            **core_values(settings, "policy"), stale_after_s=stale_after_for_interval(settings.interval)
        )
    except PolicySettingsError as error:
        raise SettingsError(f"invalid policy settings: {error}") from None


def build_acting_parts(settings: Settings) -> ActingParts:
    parts = _acting_parts(settings)
    if settings.vllm_log is not None:  # the file, when given, whatever the platform could offer
        parts.vllm_log = FileLog(settings.vllm_log)
    return parts


def _acting_parts(settings: Settings) -> ActingParts:
    events: EventSink | None = None
    pod: str | None = settings.pod_name
    if settings.actuator == "systemd":
        from sidecar.actuators.journal_log import JournalLog  # noqa: PLC0415
        from sidecar.actuators.systemd import SystemdActuator  # noqa: PLC0415 - D-Bus only when chosen

        try:
            systemd = SystemdActuator(settings.systemd_unit, bus=settings.systemd_bus)
            journal = JournalLog(settings.systemd_unit, bus=settings.systemd_bus)
        except ValueError as error:
            raise setting_error(settings, "systemd_unit", str(error)) from None
        return ActingParts(
            actuator=systemd,
            events=None,
            pod=None,
            vllm_log=journal,
            start_check=lambda: _check_systemd(settings, systemd),
        )
    if settings.actuator == "exec":
        if settings.exec_command is None:
            raise SettingsError("--actuator exec needs --exec-command")
        argv = shlex.split(settings.exec_command)
        problem = program_problem(argv[0])
        if problem is not None:
            raise setting_error(settings, "exec_command", problem, allowed=False)
        return ActingParts(actuator=ExecActuator(argv), events=None, pod=None)
    if settings.actuator == "kubernetes" or settings.kubernetes_events:
        from sidecar.actuators.kube_command import PodSpecCommand  # noqa: PLC0415
        from sidecar.actuators.kube_credentials import CredentialsError  # noqa: PLC0415
        from sidecar.actuators.kube_flags import DeploymentFlags  # noqa: PLC0415
        from sidecar.actuators.kube_logs import PodLog  # noqa: PLC0415
        from sidecar.actuators.kubernetes import KubernetesActuator, KubernetesEvents, connect  # noqa: PLC0415

        environ = _pod_environment(settings)
        try:
            client, ref = connect(settings.kubeconfig, env=environ)
            actuator: Actuator = (
                KubernetesActuator(
                    settings.kubernetes_mode,
                    pod=ref.name,
                    namespace=ref.namespace,
                    client=client,
                    vllm_container=settings.vllm_container,
                )
                if settings.actuator == "kubernetes"
                else NoActuator()
            )
        except (CredentialsError, ValueError) as error:
            raise SettingsError(f"Kubernetes: {error}") from None
        if settings.kubernetes_events:
            events = KubernetesEvents(client, pod=ref.name, namespace=ref.namespace)
        try:
            # vLLM's container is in this pod: its log is read with the same client (the Role grants get pods/log)
            log = PodLog(client, pod=ref.name, namespace=ref.namespace, container=settings.vllm_container)
            declared = PodSpecCommand(client, pod=ref.name, namespace=ref.namespace, container=settings.vllm_container)
            # --remediate's flags go into vLLM's args in the Deployment that owns this pod (built here, used only
            # with --remediate; it sends nothing until the remediator reads the record)
            flags = (
                DeploymentFlags(client=client, pod=ref.name, namespace=ref.namespace, container=settings.vllm_container)
                if settings.actuator == "kubernetes"
                else None
            )
        except ValueError as error:
            raise SettingsError(f"Kubernetes: {error}") from None
        return ActingParts(
            actuator=actuator,
            events=events,
            pod=ref.name,
            vllm_log=log,
            flags_target=flags,
            declared_command=declared.read,
        )
    return ActingParts(actuator=NoActuator(), events=None, pod=pod)


async def _check_systemd(settings: Settings, actuator: SystemdActuator) -> str | None:
    """systemd's answers about the unit, as a SettingsError naming the setting to change: --systemd-unit for the
    unit, --systemd-bus where the user chose the bus, else --actuator (systemd is not where the sidecar runs)."""
    from sidecar.actuators.systemd_check import (  # noqa: PLC0415 - with systemd
        StartCheckError,
        check_flags_wiring,
        check_systemd,
    )

    try:
        unknown = await check_systemd(actuator, uid=os.geteuid())
    except StartCheckError as error:
        name = "systemd_unit"
        if error.bus:
            chosen = settings.origin("systemd_bus").layer not in (None, Layer.DEFAULT)
            name = "systemd_bus" if chosen else "actuator"
        raise setting_error(settings, name, str(error), allowed=False) from None
    if settings.remediate:
        try:
            await check_flags_wiring(actuator, settings.state_dir / FLAGS_FILE)
        except StartCheckError as error:
            raise setting_error(settings, "remediate", str(error), allowed=False) from None
    return unknown


def _pod_environment(settings: Settings) -> dict[str, str]:
    environ = dict(os.environ)
    if settings.pod_name is not None:
        environ["POD_NAME"] = settings.pod_name
    if settings.pod_namespace is not None:
        environ["POD_NAMESPACE"] = settings.pod_namespace
    return environ


def build_sinks(settings: Settings, parts: ActingParts, client: httpx.AsyncClient) -> list[NotificationSink]:
    sinks: list[NotificationSink] = []
    if settings.webhook_url is not None:
        path = settings.webhook_hmac_key_file
        key = read_secret_file(path, "--webhook-hmac-key-file") if path is not None else None
        try:
            sinks.append(
                WebhookSink(
                    settings.webhook_url,
                    client=client,
                    origin=Origin(host=socket.gethostname(), pod=parts.pod),
                    format=WebhookFormat(settings.webhook_format),
                    hmac_key=key,
                )
            )
        except ValueError as error:
            raise setting_error(settings, "webhook_url", str(error), allowed=False) from None  # the URL never shown
    if parts.events is not None:
        sinks.append(EventNotificationSink(parts.events))
    return sinks


def read_secret_file(path: Path, flag: str) -> bytes:
    """A key or token from a file (surrounding whitespace dropped); `SettingsError` naming `flag` and the limits,
    never any of its content, when it cannot be read or is empty or too long."""
    try:
        key = read_capped_file(path, 2 * MAX_KEY_BYTES).strip()  # room for a trailing newline or indentation
    except FileTooLargeError:
        key = b""  # reported below with the limits, never with any of its content
    except OSError as error:
        raise SettingsError(f"cannot read {flag} {path}: {error.strerror or error}") from None
    if not key or len(key) > MAX_KEY_BYTES:
        raise SettingsError(f"{flag} {path} must hold a key of 1 to {MAX_KEY_BYTES} bytes")
    return key


def read_api_key(path: Path | None) -> str | None:
    """vLLM's --api-key from --vllm-api-key-file, for the probe's requests; None without the file."""
    if path is None:
        return None
    key = read_secret_file(path, "--vllm-api-key-file")
    if not all(0x21 <= byte < 0x7F for byte in key):  # it goes into an Authorization header as it is
        raise SettingsError(f"--vllm-api-key-file {path} must hold one printable ASCII word (an HTTP header value)")
    return key.decode("ascii")
