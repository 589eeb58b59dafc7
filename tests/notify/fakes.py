"""Scripted notification sinks and event sinks for the dispatcher tests. No network."""

from __future__ import annotations

import asyncio
from collections.abc import MutableMapping
from typing import Any

from sidecar.notify.message import Notification
from sidecar.notify.sink import DeliveryResult, DeliveryStatus


class FakeSink:
    """Answers from a script (then `default`); with `gate`, each send waits until the gate opens."""

    def __init__(
        self,
        script: list[DeliveryStatus | Exception] | None = None,
        *,
        name: str = "fake",
        default: DeliveryStatus = DeliveryStatus.DELIVERED,
        retry_after_s: float | None = None,
        gate: asyncio.Event | None = None,
    ) -> None:
        self._name = name
        self.script = list(script or [])
        self.default = default
        self.retry_after_s = retry_after_s
        self.gate = gate
        self.sent: list[Notification] = []
        self.delivered: list[Notification] = []
        self.started = asyncio.Event()
        self._changed = asyncio.Event()

    @property
    def name(self) -> str:
        return self._name

    async def send(self, notification: Notification) -> DeliveryResult:
        self.sent.append(notification)
        self.started.set()
        if self.gate is not None:
            await self.gate.wait()
        step = self.script.pop(0) if self.script else self.default
        if isinstance(step, Exception):
            raise step
        if step is DeliveryStatus.DELIVERED:
            self.delivered.append(notification)
            self._changed.set()
        return DeliveryResult(
            status=step, detail=f"scripted {step.value}", duration_s=0.0, retry_after_s=self.retry_after_s
        )

    async def wait_delivered(self, count: int, timeout_s: float = 2.0) -> None:
        async with asyncio.timeout(timeout_s):
            while len(self.delivered) < count:
                self._changed.clear()
                await self._changed.wait()


def named(logs: list[MutableMapping[str, Any]], event: str) -> list[MutableMapping[str, Any]]:
    """The captured log lines of one event."""
    return [line for line in logs if line["event"] == event]


class Sleeps:
    """An injected sleep: records each delay and yields once instead of waiting."""

    def __init__(self) -> None:
        self.delays: list[float] = []

    async def __call__(self, delay_s: float) -> None:
        self.delays.append(delay_s)
        await asyncio.sleep(0)


class FakeEvents:
    """An `EventSink` that records what it was asked to emit; can raise or hang."""

    def __init__(self, *, error: Exception | None = None, hang: bool = False) -> None:
        self.emitted: list[tuple[str, str, bool]] = []
        self.error = error
        self.hang = hang

    async def emit(self, *, reason: str, message: str, warning: bool) -> None:
        if self.hang:
            await asyncio.Event().wait()
        if self.error is not None:
            raise self.error
        self.emitted.append((reason, message, warning))
