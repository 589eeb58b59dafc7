"""The explain step between acting and the notifier: which notifications get a cause, in order, bounded in time,
and every way reading can fail (the notification goes out as before, with one line saying why)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import pytest
import structlog
from structlog.testing import capture_logs

from sidecar.actuators.file_log import FileLog
from sidecar.actuators.log_source import LogRead, LogRun, LogUnreadableError, Wanted
from sidecar.notify.dispatcher import Notifier
from sidecar.notify.message import Notification, NotificationKind
from sidecar.notify.payload import Origin, WebhookFormat
from sidecar.notify.webhook import WebhookSink
from sidecar.shell.crash_cause import NO_SOURCE, QUEUE_SIZE, CrashCauseStep
from tests.cause.logs import OOM_CAUSE, OOM_FLAGS, STARTED, WALL_S, oom_death
from tests.notify.receiver import Receiver

FILE = "file /var/log/vllm.log"
SETTLE_TIMEOUT_S = 30.0


class FakeLog:
    """Answers each read from a script: a LogRead, an exception to raise, or "hang"; records what was asked."""

    def __init__(self, *answers: LogRead | Exception | str) -> None:
        self.answers = list(answers)
        self.asked: list[tuple[float, Wanted]] = []
        self.gate: asyncio.Event | None = None

    @property
    def where(self) -> str:
        return FILE

    async def read(self, *, until_wall_s: float, wanted: Wanted) -> LogRead:
        self.asked.append((until_wall_s, wanted))
        if self.gate is not None:
            await self.gate.wait()
        answer = self.answers.pop(0) if self.answers else self.answers_default()
        if answer == "hang":
            await asyncio.Event().wait()
        if isinstance(answer, Exception):
            raise answer
        assert isinstance(answer, LogRead)
        return answer

    @staticmethod
    def answers_default() -> LogRead:
        return read_of(STARTED)


def read_of(*texts: str) -> LogRead:
    return LogRead(where=FILE, runs=tuple(LogRun(text=text, label=f"run {i}") for i, text in enumerate(texts)))


def note(kind: NotificationKind, reason: str = "engine_dead", wall_time_s: float = WALL_S) -> Notification:
    return Notification(kind=kind, summary=f"{kind} happened", reason=reason, wall_time_s=wall_time_s)


class Step:
    def __init__(self, source: FakeLog | FileLog | None, **options: float) -> None:
        self.delivered: list[Notification] = []
        self.step = CrashCauseStep(
            source,
            deliver=self.delivered.append,
            logger=structlog.get_logger(),
            wall_clock=lambda: WALL_S + 5,
            **options,
        )

    async def settle(self) -> None:
        """Everything queued handled. Bounded generously: the parse runs in a worker thread, which a box busy
        with three test lanes and a real vLLM can starve for seconds (a cut-short read would change what the
        assertions see, not how long it took)."""
        for _ in range(200):
            await asyncio.sleep(0)
        await self.step.close(timeout_s=SETTLE_TIMEOUT_S)


async def test_a_dead_engines_restart_begin_carries_the_cause_read_until_its_decision() -> None:
    log = FakeLog(read_of(oom_death()))
    step = Step(log)
    step.step.notify(note(NotificationKind.RESTART_BEGIN, wall_time_s=WALL_S - 1))
    await step.settle()
    (sent,) = step.delivered
    assert sent.cause is not None
    assert (sent.cause.cause, tuple(c.pasted for c in sent.cause.recommendations)) == (OOM_CAUSE, OOM_FLAGS)
    assert sent.cause.read_wall_time_s == WALL_S + 5
    assert log.asked == [(WALL_S - 1, Wanted.DIED)]  # nothing the sidecar did after deciding is read
    assert step.step.last == sent.cause


async def test_vllm_recovered_carries_the_cause_of_the_start_that_died() -> None:
    log = FakeLog(read_of(oom_death(), STARTED))  # died, then brought back by its supervisor
    step = Step(log)
    step.step.notify(note(NotificationKind.VLLM_RECOVERED))
    await step.settle()
    assert step.delivered[0].cause is not None
    assert step.delivered[0].cause.cause == OOM_CAUSE
    assert log.asked[0][1] is Wanted.DIED


async def test_a_planned_restart_goes_out_at_once_and_its_end_says_what_the_log_said_before() -> None:
    """A forecast restart: the begin is not held; the log of the vLLM about to be restarted is read behind it,
    and the end carries it (after the restart, the log shows the new start)."""
    log = FakeLog(read_of(oom_death()), read_of(STARTED))
    step = Step(log)
    step.step.notify(note(NotificationKind.RESTART_BEGIN, reason="oom_forecast"))
    assert [n.kind for n in step.delivered] == [NotificationKind.RESTART_BEGIN]
    assert step.delivered[0].cause is None
    await asyncio.sleep(0.01)
    step.step.notify(note(NotificationKind.RESTART_END, reason="oom_forecast"))
    await step.settle()
    end = step.delivered[1]
    assert end.cause is not None
    assert end.cause.cause == OOM_CAUSE
    assert [wanted for _, wanted in log.asked] == [Wanted.LAST]  # the end read nothing itself


async def test_restart_end_without_a_begin_reads_the_start_that_died() -> None:
    log = FakeLog(read_of(oom_death(), STARTED))
    step = Step(log)
    step.step.notify(note(NotificationKind.RESTART_END))
    await step.settle()
    assert step.delivered[0].cause is not None
    assert step.delivered[0].cause.cause == OOM_CAUSE
    assert [wanted for _, wanted in log.asked] == [Wanted.DIED]


@pytest.mark.parametrize(
    "kind",
    [
        NotificationKind.PAUSE,
        NotificationKind.RESUME,
        NotificationKind.RESTART_FAILURE,
        NotificationKind.BUDGET_EXHAUSTED,
    ],
)
async def test_other_notifications_go_out_at_once_and_untouched(kind: NotificationKind) -> None:
    log = FakeLog()
    step = Step(log)
    notification = note(kind)
    step.step.notify(notification)
    assert step.delivered == [notification]  # synchronously: nothing was waiting
    await step.settle()
    assert log.asked == []


async def test_nothing_overtakes_a_notification_whose_log_is_being_read() -> None:
    log = FakeLog(read_of(oom_death()))
    log.gate = asyncio.Event()
    step = Step(log)
    step.step.notify(note(NotificationKind.RESTART_BEGIN))
    await asyncio.sleep(0.01)
    step.step.notify(note(NotificationKind.RESTART_FAILURE))
    step.step.notify(note(NotificationKind.PAUSE))
    assert step.delivered == []
    log.gate.set()
    await step.settle()
    assert [n.kind for n in step.delivered] == [
        NotificationKind.RESTART_BEGIN,
        NotificationKind.RESTART_FAILURE,
        NotificationKind.PAUSE,
    ]


@pytest.mark.parametrize(
    ("answer", "summary"),
    [
        (
            LogUnreadableError(
                "journalctl exited with 1: No journal files were opened due to insufficient permissions."
            ),
            f"cannot read {FILE}: journalctl exited with 1: No journal files were opened due to insufficient "
            "permissions.",
        ),
        ("hang", f"reading {FILE} took longer than 0.05 s"),
        (
            RecursionError("maximum recursion depth exceeded"),
            f"reading {FILE} failed: RecursionError: maximum recursion depth exceeded",
        ),
    ],
    ids=["unreadable", "slow", "bug"],
)
async def test_a_log_that_cannot_be_read_leaves_the_notification_with_one_line_why(
    answer: Exception | str, summary: str
) -> None:
    step = Step(FakeLog(answer, answer, answer), timeout_s=0.05)
    with capture_logs() as logs:
        for _ in range(3):
            step.step.notify(note(NotificationKind.VLLM_RECOVERED))
        await step.settle()
    assert len(step.delivered) == 3
    for sent in step.delivered:
        assert (sent.kind, sent.summary, sent.reason) == (
            NotificationKind.VLLM_RECOVERED,
            "vllm_recovered happened",
            "engine_dead",
        )
        assert sent.cause is not None
        assert (sent.cause.cause, sent.cause.summary, sent.cause.source) == (None, summary, FILE)
    said = [entry for entry in logs if entry["event"] == "crash_cause_unknown"]
    assert said == [{"event": "crash_cause_unknown", "log_level": "warning", "reason": summary}]  # once
    assert all("exc_info" not in entry and "exception" not in entry for entry in logs)


async def test_a_new_reason_is_said_again_and_a_good_read_logs_the_cause() -> None:
    step = Step(
        FakeLog(LogUnreadableError("a"), LogUnreadableError("b"), read_of(oom_death()), LogUnreadableError("b"))
    )
    with capture_logs() as logs:
        for _ in range(4):
            step.step.notify(note(NotificationKind.VLLM_RECOVERED))
        await step.settle()
    events = [(entry["event"], entry.get("reason") or entry.get("cause")) for entry in logs]
    assert events == [
        ("crash_cause_unknown", f"cannot read {FILE}: a"),
        ("crash_cause_unknown", f"cannot read {FILE}: b"),
        ("crash_cause", OOM_CAUSE),
        ("crash_cause_unknown", f"cannot read {FILE}: b"),
    ]


async def test_without_a_log_to_read_the_cause_says_how_to_give_one() -> None:
    step = Step(None)
    step.step.notify(note(NotificationKind.RESTART_BEGIN))
    await step.settle()
    cause = step.delivered[0].cause
    assert cause is not None
    assert (cause.cause, cause.summary) == (None, NO_SOURCE)


async def test_stopping_sends_what_was_waiting_without_its_cause() -> None:
    log = FakeLog("hang")
    step = Step(log)
    step.step.notify(note(NotificationKind.RESTART_BEGIN))
    step.step.notify(note(NotificationKind.PAUSE))
    await asyncio.sleep(0.01)
    await step.step.close(timeout_s=0.05)
    assert [n.kind for n in step.delivered] == [NotificationKind.RESTART_BEGIN, NotificationKind.PAUSE]
    begin = step.delivered[0]
    assert begin.cause is not None
    assert begin.cause.summary == "vLLM's log was not read: the sidecar stopped before reading it"
    assert step.delivered[1].cause is None
    step.step.notify(note(NotificationKind.VLLM_RECOVERED))  # after stop: out at once, said why
    assert step.delivered[2].cause is not None
    assert step.delivered[2].cause.summary == "vLLM's log was not read: the sidecar is stopping"


async def test_a_full_queue_sends_the_oldest_waiting_on_without_reading_it() -> None:
    log = FakeLog()
    log.gate = asyncio.Event()
    step = Step(log)
    for index in range(QUEUE_SIZE + 2):
        step.step.notify(note(NotificationKind.VLLM_RECOVERED, wall_time_s=float(index)))
        await asyncio.sleep(0)
    early = [n.wall_time_s for n in step.delivered]
    assert early == [1.0, 2.0]  # not 0.0: that one is being read
    log.gate.set()
    await step.settle()
    assert sorted(n.wall_time_s for n in step.delivered) == [float(i) for i in range(QUEUE_SIZE + 2)]
    assert len(step.delivered) == QUEUE_SIZE + 2  # each exactly once


async def test_the_cause_reaches_a_real_webhook_receiver(tmp_path: Path) -> None:
    """A real file, the notifier and its webhook sink, a loopback HTTP receiver: the body it gets."""
    log = tmp_path / "vllm.log"
    log.write_text(oom_death() + STARTED)
    async with Receiver() as receiver, httpx.AsyncClient(trust_env=False) as client:
        notifier = Notifier(
            [
                WebhookSink(
                    receiver.url + "/hook", client=client, origin=Origin(host="gpu-7"), format=WebhookFormat.JSON
                )
            ],
            logger=structlog.get_logger(),
        )
        notifier.start()
        step = CrashCauseStep(FileLog(log), deliver=notifier.notify, logger=structlog.get_logger())
        step.notify(note(NotificationKind.VLLM_RECOVERED))
        await receiver.wait_for(1)
        await step.close()
        await notifier.stop()
    document = json.loads(receiver.requests[0].body)
    assert document["kind"] == "vllm_recovered"
    cause = document["cause"]
    assert cause["cause"] == OOM_CAUSE
    assert cause["severity"] == "critical"
    assert [(r["flag"], r["value"]) for r in cause["recommendations"]] == [
        ("--gpu-memory-utilization", 0.87),
        ("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True"),
    ]
    assert cause["source"].startswith(f"file {log}, ")
    assert cause["evidence"][0].startswith("CUDA out of memory while serving")


async def test_a_missing_file_is_said_in_one_plain_line(tmp_path: Path) -> None:
    missing = tmp_path / "vllm.log"
    step = Step(FileLog(missing))
    step.step.notify(note(NotificationKind.VLLM_RECOVERED))
    await step.settle()
    cause = step.delivered[0].cause
    assert cause is not None
    assert cause.line() == f"cause unknown: cannot read file {missing}: No such file or directory"
