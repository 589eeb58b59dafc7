"""The simulator and the daemon's own tick and acting, in one event loop with no socket: a scenario on virtual time.

`InProcessVllm` runs a `Simulation` on the loop's clock (looptime makes it virtual) and answers the sidecar's
`BodyFetcher` calls (/metrics, /health, /version, /sim/gpu) from it, as `sidecar sim` answers HTTP; it restarts
when the sidecar's actuator asks, and dies as the simulation does. `Story` wires the shell's real `Poller` and
`Acting` (the same classes the daemon builds, with the same settings) to it, so a 15-minute leak plays out in well
under a second of wall time. The simulator stays an independent witness: nothing of the sidecar is imported by it,
only here, by the test.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import structlog

from sidecar.actuators.base import ActuatorOutcome, OutcomeStatus
from sidecar.derive.settings import DeriveSettings
from sidecar.model.supervision import Restarter, Supervision
from sidecar.model.view import View
from sidecar.notify.message import Notification
from sidecar.policy import Policy, PolicySettings
from sidecar.policy.settings import stale_after_for_interval
from sidecar.shell.acting import Acting
from sidecar.shell.poller import Poller
from sidecar.shell.state_file import StateFile
from sidecar.sim.config import SimConfig
from sidecar.sim.load import ClosedLoopLoad
from sidecar.sim.scenarios import LoadShape
from sidecar.sim.server import VERSIONS, metrics_writer
from sidecar.sim.simulation import Simulation
from sidecar.sources.fetch import Failure, FetchFailedError
from sidecar.sources.sim_gpu import SimGpuSource
from sidecar.sources.vllm_http import VllmHttpSource

URL = "http://vllm.invalid:8000"
EPOCH_S = 1_790_000_000.0  # the virtual wall clock at loop time 0
STEP_BATCH_S = 0.5  # engine steps run between two turns of the loop: a quarter of the sidecar's poll interval


@dataclass
class Life:
    """One vLLM process of the story: when it started, and how it ended."""

    started_s: float
    died_s: float | None = None
    death: str | None = None
    restarted_s: float | None = None
    finished_requests: int = 0
    failed_requests: int = 0


@dataclass
class InProcessVllm:
    config: SimConfig
    shape: LoadShape
    lives: list[Life] = field(default_factory=list)
    # Whether a new request may be sent: a router or a Service honouring the sidecar's /readyz (Story sets it).
    admitting: Callable[[], bool] = lambda: True
    # (from, to) in loop seconds: the API server answers nothing in time, as a loaded one can, while the engine
    # steps on (its memory keeps growing)
    slow_api: tuple[tuple[float, float], ...] = ()
    _task: asyncio.Task[None] | None = None

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self.lives.append(Life(started_s=loop.time()))
        self._writer = metrics_writer(self.config)
        self._sim = Simulation(self.config, self._writer)
        self._load = ClosedLoopLoad(self.shape, start_s=loop.time())
        self._in_flight: set[str] = set()
        self._task = asyncio.create_task(self._engine())

    @property
    def alive(self) -> bool:
        return self._task is not None and not self._task.done()

    async def _engine(self) -> None:
        """The engine's steps on the loop's clock, a batch of steps per sleep: each step is a fraction of a
        second, and one loop turn per step would spend the test's time in the event loop, not the story."""
        loop = asyncio.get_running_loop()
        life = self.lives[-1]
        now = loop.time()
        while True:
            batch_end = now + STEP_BATCH_S
            while now < batch_end:
                for request in self._load.due(now, len(self._in_flight)) if self.admitting() else ():
                    self._sim.add_request(request.request_id, request.prompt_token_ids, request.max_tokens, now)
                    self._in_flight.add(request.request_id)
                outcome = self._sim.step(now)
                for event in outcome.tokens:
                    if event.finished is not None:
                        self._in_flight.discard(event.request_id)
                        life.finished_requests += 1
                if outcome.death is not None:
                    life.died_s, life.death = now, outcome.death.log_lines[-1]
                    life.failed_requests = len(self._in_flight)
                    return
                now += outcome.duration_s
            await asyncio.sleep(max(0.0, now - loop.time()))

    async def restart(self) -> None:
        """What `systemctl restart vllm` does to it: stop (the requests in flight fail), start fresh."""
        loop = asyncio.get_running_loop()
        if self._task is not None and not self._task.done():
            self._task.cancel()
            life = self.lives[-1]
            life.restarted_s, life.failed_requests = loop.time(), len(self._in_flight)
        self.start()

    # --- the sidecar's BodyFetcher ---------------------------------------------------------------------------
    async def get(self, url: str, *, max_bytes: int) -> bytes:
        del max_bytes
        if not self.alive:
            raise FetchFailedError(Failure.CONNECT, "connection refused", refused=True)
        path = url.removeprefix(URL)
        loop = asyncio.get_running_loop()
        for start_s, end_s in self.slow_api:
            if start_s <= loop.time() < end_s:
                await asyncio.sleep(end_s - loop.time())  # past the source's timeout: no answer in time
        if path == "/metrics":
            return self._writer.render(self._sim.engine_gauges())
        if path == "/health":
            return b""
        if path == "/version":
            return json.dumps({"version": VERSIONS[str(self.config.vllm_version)]}).encode()
        if path == "/sim/gpu":
            return json.dumps({"gpus": [asdict(state) for state in self._sim.gpu_states(loop.time())]}).encode()
        raise FetchFailedError(Failure.STATUS, "HTTP 404", status=404)

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()


@dataclass
class SimActuator:
    """The restart adapter for the in-process vLLM: restarts it at once, and says nobody else would."""

    vllm: InProcessVllm
    name: str = "in-process"
    restarts: list[float] = field(default_factory=list)

    async def restart(self, *, reason: str, dry_run: bool, hard: bool = False) -> ActuatorOutcome:
        del reason, hard
        if dry_run:
            return ActuatorOutcome(status=OutcomeStatus.DRY_RUN, detail="would restart", duration_s=0.0)
        self.restarts.append(asyncio.get_running_loop().time())
        await self.vllm.restart()
        return ActuatorOutcome(status=OutcomeStatus.DONE, detail="restarted", duration_s=0.0)

    async def supervision(self) -> Supervision:
        return Supervision(restarter=Restarter.SIDECAR, detail="in-process: only the sidecar restarts it")

    async def close(self) -> None:
        return None


@dataclass
class Story:
    """The daemon's tick and acting against an in-process vLLM, every `interval_s` of virtual time."""

    vllm: InProcessVllm
    policy: PolicySettings
    state_dir: Path
    interval_s: float = 2.0
    dry_run: bool = False  # True: the policy decides and says so, nothing is done
    routed: bool = True  # False: the load ignores /readyz, as a client calling vLLM directly does
    notifications: list[Notification] = field(default_factory=list)
    views: list[View] = field(default_factory=list)

    async def play(self, until_s: float) -> Acting:
        loop = asyncio.get_running_loop()
        actuator = SimActuator(self.vllm)
        logger = structlog.get_logger()
        acting = Acting(
            policy=Policy(self.policy),
            actuator=actuator,
            ledger_file=StateFile(self.state_dir / "restart-ledger.json"),
            notify=self.notifications.append,
            logger=logger,
            dry_run=self.dry_run,
            clock=loop.time,
            wall_clock=lambda: EPOCH_S + loop.time(),
        )
        if self.routed:
            self.vllm.admitting = lambda: acting.readiness().admitting
        poller = Poller(
            vllm=VllmHttpSource(fetcher=self.vllm, base_url=URL, timeout_s=1.0, max_body_bytes=16 << 20),
            gpu=SimGpuSource(fetcher=self.vllm, url=URL + "/sim/gpu", timeout_s=1.0, clock=loop.time),
            derive=DeriveSettings(),
            clock=loop.time,
            wall_clock=lambda: EPOCH_S + loop.time(),
            logger=logger,
            on_view=acting.observe,
            supervision=actuator.supervision,
        )
        self.vllm.start()
        try:
            while loop.time() < until_s:
                self.views.append(await poller.tick())
                await asyncio.sleep(self.interval_s)
        finally:
            await acting.close()
            await self.vllm.aclose()
        return acting


def policy_settings(interval_s: float = 2.0, **overrides: float) -> PolicySettings:
    return PolicySettings(stale_after_s=stale_after_for_interval(interval_s), **overrides)  # type: ignore[arg-type]
