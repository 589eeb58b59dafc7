"""The restart ledger on disk, in --state-dir. Does file I/O (through `StateFile`, whose writes are atomic).

Three things make the hourly budget hold across the sidecar's own restarts, kill -9 included:
- read at start; unreadable, it is taken as spent (fail safe: we cannot know what the last hour saw);
- a note written before the adapter is asked to restart vLLM and removed once the outcome is in the ledger: a
  sidecar killed in between (SIGKILL, OOM, or stopped before the answer came) finds it at its next start and
  counts that restart, which the platform most likely carried out without it;
- the host's boot id beside the records' monotonic times: a process started later on the same boot ages
  those records by the monotonic clock, which a wall-clock jump while no sidecar ran cannot move.
A --state-dir that cannot hold the ledger at all (a path under a regular file, no permission, a read-only
file system) is refused at start (`state_dir_problem`): "budget spent" is for a ledger that went bad, not for
a deployment that never had one.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from structlog.typing import FilteringBoundLogger

from sidecar.policy.decision import RestartReason
from sidecar.policy.ledger import RestartLedger, RestartLedgerError, RestartRecord
from sidecar.shell.state_file import StateFile, directory_problem

LEDGER_FILE = "restart-ledger.json"
IN_FLIGHT_FILE = "restart-in-flight.json"
BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


def read_boot_id(path: Path = BOOT_ID) -> str | None:
    """This boot's id (Linux); None where there is none to read."""
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


def state_dir_problem(state_dir: Path, *, writable: bool) -> str | None:
    """Why --state-dir cannot hold the ledger, or None; checked at start so the daemon stops (exit 2) instead
    of running on with the budget assumed spent. `writable`: the daemon will write there (not a dry run, and an
    adapter that restarts); otherwise it only reads a ledger that is there, and a missing directory is fine."""
    problem = directory_problem(state_dir, create=writable)
    for name in (LEDGER_FILE, IN_FLIGHT_FILE):
        problem = problem or StateFile(state_dir / name).access_problem()
    return problem


class LedgerStore:
    def __init__(
        self,
        ledger_file: StateFile,
        *,
        logger: FilteringBoundLogger,
        dry_run: bool,
        max_restarts_per_hour: int,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        boot_id: str | None = None,  # None: trust only the wall times of a persisted ledger
    ) -> None:
        self._ledger_file = ledger_file
        self._in_flight_file = StateFile(ledger_file.path.with_name(IN_FLIGHT_FILE))
        self._log = logger
        self._dry_run = dry_run  # a dry run writes nothing
        self._max_restarts_per_hour = max_restarts_per_hour
        self._clock = clock
        self._wall_clock = wall_clock
        self._boot_id = boot_id

    def load(self) -> RestartLedger:
        return self._recover_in_flight(self._read())

    def save(self, ledger: RestartLedger) -> None:
        if self._dry_run:
            return
        try:
            self._ledger_file.save(self._document(ledger))
        except OSError as error:
            self._log.error("restart_ledger_not_saved", path=str(self._ledger_file.path), error=str(error))

    def note_in_flight(self, reason: RestartReason, why: str) -> None:
        """Before the adapter acts: from here until `clear_in_flight`, a sidecar that dies still counts it."""
        if self._dry_run:
            return
        now = RestartRecord(wall_time_s=self._wall_clock(), reason=reason, detail=why, monotonic_s=self._clock())
        try:
            self._in_flight_file.save(self._document(RestartLedger(records=(now,))))
        except OSError as error:
            self._log.error("restart_in_flight_not_saved", path=str(self._in_flight_file.path), error=str(error))

    def clear_in_flight(self) -> None:
        try:
            self._in_flight_file.path.unlink(missing_ok=True)
        except OSError as error:
            self._log.error("restart_in_flight_not_removed", path=str(self._in_flight_file.path), error=str(error))

    def _read(self) -> RestartLedger:
        loaded = self._ledger_file.load()
        problem = loaded.problem
        if loaded.document is not None:
            try:
                return RestartLedger.from_dict(loaded.document, same_boot=self._same_boot(loaded.document))
            except RestartLedgerError as error:
                problem = f"{self._ledger_file.path}: {error}"
        if problem is None:
            return RestartLedger()
        # Fail safe: without the ledger we cannot know how many restarts the last hour saw, so assume the
        # budget is spent (automatic restarts resume within the hour; a manual restart still works).
        now = self._wall_clock()
        assumed = RestartLedger(
            records=tuple(
                RestartRecord(wall_time_s=now, reason=RestartReason.MANUAL, detail="assumed: ledger unreadable")
                for _ in range(max(1, self._max_restarts_per_hour))
            )
        )
        self._log.error("restart_ledger_unreadable", problem=problem, assumed="restart budget spent for an hour")
        self.save(assumed)
        return assumed

    def _recover_in_flight(self, ledger: RestartLedger) -> RestartLedger:
        """Count the restart an earlier sidecar had asked the adapter for when it stopped. Without this, a
        sidecar that dies mid-restart again and again would restart vLLM beyond the budget."""
        loaded = self._in_flight_file.load()
        if loaded.document is None and loaded.problem is None:
            return ledger  # the usual case: no restart was in flight
        document = loaded.document
        try:
            pending = RestartLedger.from_dict(document, same_boot=self._same_boot(document)).records if document else ()
        except RestartLedgerError:
            pending = ()
        # Fail safe: an unreadable note still says a restart was in flight, just not which or when.
        record = pending[-1] if pending else RestartRecord(wall_time_s=self._wall_clock(), reason=RestartReason.MANUAL)
        record = RestartRecord(
            wall_time_s=record.wall_time_s,
            reason=record.reason,
            detail=f"assumed: the sidecar stopped while the adapter was restarting vLLM ({record.detail})",
            monotonic_s=record.monotonic_s,
        )
        # Killed after the outcome was recorded but before the note went: the ledger has it already.
        recorded = any(r.reason is record.reason and r.wall_time_s >= record.wall_time_s for r in ledger.records)
        if not recorded:
            ledger = ledger.record(record)
            self.save(ledger)
        self._log.warning(
            "restart_in_flight_at_stop", reason=str(record.reason), counted=not recorded, problem=loaded.problem
        )
        self.clear_in_flight()
        return ledger

    def _same_boot(self, document: dict[str, object]) -> bool:
        return self._boot_id is not None and document.get("boot_id") == self._boot_id

    def _document(self, ledger: RestartLedger) -> dict[str, object]:
        """The ledger as JSON, with the boot its records' monotonic times belong to."""
        document = ledger.to_dict()
        if self._boot_id is not None:
            document["boot_id"] = self._boot_id
        return document
