"""The daemon: builds the object graph, runs one tick per interval, serves HTTP, stops on SIGTERM/SIGINT.

Owns the event loop, the scheduler, signals and both clocks. A tick never raises out of here: a bug in
one tick is logged and the next tick runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import signal
import time
from collections import deque
from urllib.parse import urlsplit

import structlog
from prometheus_client import CollectorRegistry, ProcessCollector
from structlog.typing import FilteringBoundLogger

from sidecar import __version__
from sidecar.exporter.admin import AdminAuth
from sidecar.exporter.collector import SidecarCollector
from sidecar.exporter.endpoints import Endpoints, Liveness
from sidecar.exporter.rate_limit import AdminRateLimiter
from sidecar.exporter.server import DAEMON_MAX_CONNECTIONS, HttpServer
from sidecar.exporter.tls import ReloadingServerTls, TlsError
from sidecar.model.acting import ActingView
from sidecar.model.view import View
from sidecar.notify.dispatcher import Notifier
from sidecar.policy.machine import Policy
from sidecar.report.document import policy_document, status_document
from sidecar.shell.acting import Acting, AdminBridge
from sidecar.shell.acting_setup import build_acting_parts, build_sinks, policy_settings, read_api_key
from sidecar.shell.crash_cause import CrashCauseStep
from sidecar.shell.incident_setup import build_recorder
from sidecar.shell.ledger_store import LEDGER_FILE, read_boot_id, state_dir_problem
from sidecar.shell.log_with_command import LogWithCommand
from sidecar.shell.poller import (
    Poller,
    build_allocator_source,
    build_gpu_source,
    build_http_client,
    build_vllm_fetcher,
    build_vllm_source,
    derive_settings,
)
from sidecar.shell.remediation_setup import build_remediator, load_record
from sidecar.shell.schedule import OnTime, add_tick_job, tick_scheduler
from sidecar.shell.sdnotify import Notifier as SdNotifier
from sidecar.shell.sdnotify import run_watchdog, watchdog_interval_s
from sidecar.shell.settings import Settings, SettingsError, setting_error
from sidecar.shell.state_file import StateFile
from sidecar.sources.probe import CompletionProbe
from sidecar.sources.vllm_command import ServerCommandMemory
from sidecar.sources.vllm_start import VllmStartWatch

SHUTDOWN_GRACE_S = 2.0
STATUS_HISTORY_VIEWS = 30  # the /status history an incident keeps: a minute at the default interval


def _default_port(url: str) -> int:
    return 443 if urlsplit(url).scheme == "https" else 80


def build_tls(settings: Settings, logger: FilteringBoundLogger) -> ReloadingServerTls | None:
    """The listener's TLS from --tls-cert-file/--tls-key-file, loaded now so a bad pair stops the start (exit 2)."""
    if settings.tls_cert_file is None or settings.tls_key_file is None:
        return None
    try:
        return ReloadingServerTls(settings.tls_cert_file, settings.tls_key_file, logger=logger)
    except TlsError as error:
        raise SettingsError(str(error)) from None


def check_state_dir(settings: Settings) -> None:
    """An unusable --state-dir stops the start (exit 2) rather than run with the restart budget assumed spent.
    Written to only when the sidecar may restart vLLM: a dry run, or --actuator none, just reads a ledger there."""
    writable = not settings.dry_run and settings.actuator != "none"
    problem = state_dir_problem(settings.state_dir, writable=writable)
    if problem is not None:
        raise setting_error(settings, "state_dir", problem)


class Daemon:
    def __init__(self, settings: Settings, *, logger: FilteringBoundLogger | None = None) -> None:
        self._settings = settings
        self._log = logger if logger is not None else structlog.get_logger()
        self.tls = build_tls(settings, self._log)  # first: a bad certificate stops the start before anything opens
        check_state_dir(settings)
        self._client = build_http_client(settings)
        self._vllm_fetcher = build_vllm_fetcher(settings, self._client)
        self._gpu = build_gpu_source(settings, self._vllm_fetcher)  # the simulator's GPUs live at --vllm-url
        parts = build_acting_parts(settings)
        self._start_check = parts.start_check
        vllm_port = urlsplit(settings.vllm_url).port or _default_port(settings.vllm_url)
        # vLLM's flags from its server's command line, for readings of a log tail that no longer states them
        self.server_command = ServerCommandMemory(vllm_port)
        vllm_log = (
            LogWithCommand(parts.vllm_log, self.server_command, declared=parts.declared_command)
            if parts.vllm_log is not None
            else None
        )
        self.notifier = Notifier(build_sinks(settings, parts, self._client), logger=self._log)
        # Between acting and the notifier: reads why vLLM died from its log before a restart's notification goes
        self.crash_cause = CrashCauseStep(vllm_log, deliver=self.notifier.notify, logger=self._log)
        self._views: deque[View] = deque(maxlen=STATUS_HISTORY_VIEWS)  # for an incident's /status history
        vllm_source = build_vllm_source(settings, self._vllm_fetcher)
        self.incidents = build_recorder(
            settings, logger=self._log, log_source=vllm_log, vllm=vllm_source, status_history=self._status_history
        )
        self.acting = Acting(
            policy=Policy(policy_settings(settings)),
            actuator=parts.actuator,
            ledger_file=StateFile(settings.state_dir / LEDGER_FILE),
            notify=self.crash_cause.notify,
            logger=self._log,
            dry_run=settings.dry_run,
            boot_id=read_boot_id(),  # a ledger written since this boot is aged by the monotonic clock
            prober=CompletionProbe(
                client=self._client,
                base_url=settings.vllm_url,
                timeout_s=settings.probe_timeout,
                api_key=read_api_key(settings.vllm_api_key_file),
            ),
            incidents=self.incidents,
        )
        self.remediator = build_remediator(
            settings,
            logger=self._log,
            log_source=vllm_log,
            notify=self.crash_cause.notify,
            flags_target=parts.flags_target,
        )
        if self.remediator is not None:
            self.acting.before_restart = self.remediator.before_restart
            self.remediator.restart = self.acting.restart_for_flags
            self.remediator.busy = lambda: self.acting.restart_in_flight
        self.poller = Poller(
            vllm=vllm_source,
            gpu=self._gpu,
            allocator=build_allocator_source(settings),
            derive=derive_settings(settings),
            logger=self._log,
            on_view=self._on_view,
            supervision=parts.actuator.supervision,
            supervision_timeout_s=settings.poll_timeout_s,
            start_watch=VllmStartWatch(vllm_port),
            command_memory=self.server_command,
        )
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(
            SidecarCollector(version=__version__, latest_view=lambda: self.poller.view, acting_view=self.acting_view)
        )
        ProcessCollector(registry=self.registry)  # the sidecar's own process_* (CPU, memory, descriptors, start)
        host, port = settings.listen_address
        endpoints = Endpoints(
            registry=self.registry,
            latest_view=lambda: self.poller.view,
            liveness=self.liveness,
            vllm_url=settings.vllm_url,
            version=__version__,
            readiness=self.acting.readiness,
            acting_view=self.acting_view,
            admin=AdminBridge(self.acting),
            admin_auth=AdminAuth(settings.admin_token_file),
            admin_rate_limiter=AdminRateLimiter(settings.admin_rate),
            logger=self._log,
        )
        self.server = HttpServer(
            host=host,
            port=port,
            handler=endpoints.handle,
            max_connections=DAEMON_MAX_CONNECTIONS,
            tls=self.tls.listener if self.tls is not None else None,
            logger=self._log,
        )
        self._started_s = time.monotonic()
        self._stop = asyncio.Event()
        self._current_tick: asyncio.Task[None] | None = None
        self._on_time: OnTime | None = None

    async def check_start(self) -> None:
        """Ask the platform what only it can answer before the daemon starts (does systemd know the unit?): on a
        `SettingsError` what the constructor opened is closed and the error goes on to the command line (exit 2);
        what could not be checked is logged once."""
        unknown = None
        try:
            if self._start_check is not None:
                unknown = await self._start_check()
            if self.remediator is not None:
                await load_record(self._settings, self.remediator)
        except SettingsError:
            await self._close()
            raise
        if unknown is not None:
            self._log.info("restart_right_unknown", actuator=self._settings.actuator, detail=unknown)

    def _on_view(self, view: View) -> None:
        self._views.append(view)
        self.acting.observe(view)  # the policy decides on the view just published
        if self.remediator is not None:
            snapshot = view.snapshot  # alive as the policy reads it: /health, else (not asked) a readable /metrics
            healthy = snapshot.vllm.ok if snapshot.vllm_healthy is None else snapshot.vllm_healthy
            self.remediator.observe(healthy=healthy, now_s=snapshot.monotonic_s)

    def _status_history(self) -> list[object]:
        """The /status documents of the last polls, oldest first; the newest with the policy's part."""
        url, version = self._settings.vllm_url, __version__
        documents = [status_document(view.snapshot, view.derived, url, version=version) for view in self._views]
        if documents:
            documents[-1]["policy"] = policy_document(self.acting_view())
        return list(documents)

    def acting_view(self) -> ActingView:
        """Acting's view, with the last cause of a death read from vLLM's log."""
        remediation = self.remediator.view() if self.remediator is not None else None
        return dataclasses.replace(self.acting.view(), crash_cause=self.crash_cause.last, remediation=remediation)

    def liveness(self) -> Liveness:
        """Alive while ticks keep completing; a wedged loop or scheduler turns /healthz to 503."""
        limit_s = 3 * self._settings.interval + self._settings.poll_timeout_s + 5.0
        last = self.poller.last_tick_completed_s
        age_s = time.monotonic() - (last if last is not None else self._started_s)
        if age_s > limit_s:
            what = "last tick completed" if last is not None else "started with no completed tick"
            return Liveness(alive=False, reason=f"loop stalled: {what} {age_s:.0f} s ago (limit {limit_s:.0f} s)")
        return Liveness(alive=True, reason="ok")

    async def _tick_job(self) -> None:
        self._current_tick = asyncio.current_task()
        try:
            await self.poller.tick()
        except asyncio.CancelledError:
            # Only the stop cancels a tick, once its grace is over (`_finish_tick`): the job ends here, as
            # APScheduler would otherwise report the cancellation as a failed job with a traceback.
            return
        except Exception:  # noqa: BLE001 - a bug in one tick must not stop the daemon; the next tick runs
            self._log.exception("tick_failed")
        finally:
            self._current_tick = None

    def request_stop(self) -> None:
        self._stop.set()

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, self.request_stop)
        try:
            await self.server.start()
        except OSError as error:
            self._log.error("listen_failed", listen=self._settings.listen, error=str(error))
            await self._close()
            return 1
        scheduler = tick_scheduler(loop)
        add_tick_job(scheduler, self._tick_job, self._settings.interval)
        scheduler.start()
        self._on_time = OnTime(scheduler, self._settings.interval, self._log, loop=loop)
        self._on_time.start()
        self.notifier.start()
        systemd = SdNotifier.from_environment()
        watchdog = asyncio.create_task(self._watchdog(systemd))
        self._sd_send(systemd.ready(status=f"watching {self._settings.vllm_url}"))
        self._log.info(
            "started",
            version=__version__,
            vllm_url=self._settings.vllm_url,
            listen=f"{self._settings.listen_address[0]}:{self.server.port}",
            scheme=self.server.scheme,
            admin_rate_limit=self._settings.admin_rate_limit,
            interval_s=self._settings.interval,
            gpu_source=self._settings.gpu_source,
            probe_dir=str(self._settings.probe_dir) if self._settings.probe_dir is not None else None,
            actuator=self.acting.actuator.name,
            dry_run=self._settings.dry_run,
            incidents=self.incidents.files.root.as_posix() if self.incidents is not None else None,
            py_spy=self.incidents is not None and self.incidents.has_py_spy,
        )
        await self._stop.wait()
        self._log.info("stopping")
        self._sd_send(systemd.stopping())
        watchdog.cancel()
        self._on_time.stop()
        # Paused first and shut down after the tick in progress had its grace: APScheduler's asyncio executor
        # cancels the jobs still running when it shuts down.
        scheduler.pause()
        await self._finish_tick()
        scheduler.shutdown(wait=False)
        await self.server.stop()
        await self._close()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)
        self._log.info("stopped")
        return 0

    async def _finish_tick(self) -> None:
        task = self._current_tick
        if task is None or task.done():
            return
        with contextlib.suppress(TimeoutError, asyncio.CancelledError):
            async with asyncio.timeout(SHUTDOWN_GRACE_S):
                await asyncio.shield(task)
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _watchdog(self, systemd: SdNotifier) -> None:
        interval_s = watchdog_interval_s()
        if interval_s is not None:
            await run_watchdog(systemd, interval_s=interval_s, is_alive=lambda: self.liveness().alive)

    def _sd_send(self, problem: str | None) -> None:
        if problem is not None:
            self._log.warning("sd_notify_failed", problem=problem)

    async def _close(self) -> None:
        if self.remediator is not None:
            await self.remediator.close()
        await self.acting.close()
        await self.crash_cause.close()  # what it holds goes to the notifier, which then gets its 2 s
        await self.notifier.stop(timeout_s=2.0)
        await self._client.aclose()
        await self._vllm_fetcher.aclose()
        if self._gpu is not None:
            await asyncio.to_thread(self._gpu.close)
