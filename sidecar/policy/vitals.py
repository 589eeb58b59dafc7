"""vLLM's health as the policy follows it, tick by tick: healthy since when, failing since when, gone since when. Pure.

Two ways of not serving, told apart because they are restarted on different clocks: /health failing (the
engine died, or hangs in its API server) counts towards `dead_after_s`; nothing listening at vLLM's address (the
process is gone) is first left to whoever restarts it (`down_after_s`, or `down_unsupervised_after_s` when
nobody else will, never when its operator stopped it). Either counts only after vLLM had been healthy: a vLLM
still loading looks exactly like a dead one.
"""

from __future__ import annotations

import math

from sidecar.model.supervision import Restarter
from sidecar.policy.observation import Observation
from sidecar.policy.rules import seconds
from sidecar.policy.settings import PolicySettings


class Vitals:
    def __init__(self, settings: PolicySettings) -> None:
        self._settings = settings
        self.seen_healthy = False  # since the sidecar started or the last restart was accepted
        self.seen_polled = False
        self._failing_since_s: float | None = None  # health failing, after it had been healthy
        self._failing_seen_s: float | None = None  # the last poll that saw it failing
        self._down_since_s: float | None = None  # nothing listening at vLLM's address, after it had been healthy
        self._up_since_s: float | None = None  # vLLM healthy without a break since (as observed here)

    def track(self, obs: Observation, *, restarting: bool) -> str:
        """Follow vLLM's health; the line for a vLLM back by itself from death or absence, else ''."""
        recovered = ""
        if obs.healthy:
            if not restarting:
                recovered = self._recovery(obs.now_s)
            self.seen_healthy, self._failing_since_s, self._down_since_s = True, None, None
            self._up_since_s = obs.now_s if self._up_since_s is None else self._up_since_s
        else:
            if not obs.vllm_slow:
                # A death or absence restarts the uptime (the forecast rule errs late, not early); a slow answer
                # does not: under the load that fills memory it would put off a forecast restart past the OOM.
                self._up_since_s = None
            if obs.vllm_down:
                # A process that is gone is not an engine that died: its supervisor gets down_after_s.
                self._failing_since_s = None
                if self.seen_healthy and self._down_since_s is None:
                    self._down_since_s = obs.now_s
            else:
                self._down_since_s = None
                if self.seen_healthy and self._failing_since_s is None:
                    self._failing_since_s = obs.now_s
                self._failing_seen_s = obs.now_s
        self.seen_polled = self.seen_polled or obs.poll_ok
        return recovered

    def restart_accepted(self) -> None:
        """A new vLLM: earlier health and uptime describe the old process."""
        self.seen_healthy, self._failing_since_s, self._up_since_s, self._down_since_s = False, None, None, None

    def restart_done(self, now_s: float) -> None:
        """The restarted vLLM answered healthy: its uptime starts now, unless a tick saw it healthy already."""
        self.seen_healthy, self.seen_polled = True, True
        self._up_since_s = now_s if self._up_since_s is None else self._up_since_s

    def failing_for(self, now_s: float) -> float | None:
        return None if self._failing_since_s is None else now_s - self._failing_since_s

    def uptime(self, now_s: float) -> float:
        return 0.0 if self._up_since_s is None else now_s - self._up_since_s

    def dead(self, obs: Observation) -> str | None:
        """The line of an engine death or an absence past its limit, when one is due for a restart; else None."""
        failing = self.failing_for(obs.now_s)
        if failing is not None and failing >= self._settings.dead_after_s:
            dead_after = seconds(self._settings.dead_after_s)
            return (
                f"vLLM /health failing for {seconds(failing)} >= {dead_after} after it had been healthy (engine dead)"
            )
        down = None if self._down_since_s is None else obs.now_s - self._down_since_s
        limit = self._down_limit_s(obs)
        if down is not None and down >= limit:
            return f"nothing listens at vLLM's address for {seconds(down)} >= {seconds(limit)} ({self._who(obs)})"
        return None

    def is_down(self, now_s: float) -> bool:
        """vLLM gone (nothing listens), or its /health failing as long as an engine death takes: not serving."""
        failing = self.failing_for(now_s)
        return self._down_since_s is not None or (failing is not None and failing >= self._settings.dead_after_s)

    def down_line(self, obs: Observation) -> str | None:
        """While vLLM is gone or its /health fails, outside a restart: what the policy waits for, one line."""
        now = obs.now_s
        if self._down_since_s is not None:
            down, limit = now - self._down_since_s, self._down_limit_s(obs)
            gone = f"nothing listens at vLLM's address for {seconds(down)} ({self._who(obs)})"
            if math.isinf(limit):
                return f"down: {gone}; left stopped until someone starts it (or POST /admin/restart)"
            return f"down: {gone}; restart after {seconds(limit)}"
        failing = self.failing_for(now)
        if failing is not None:
            dead_after = seconds(self._settings.dead_after_s)
            return f"down: vLLM /health failing for {seconds(failing)}; restart after {dead_after}"
        return None

    def _recovery(self, now_s: float) -> str:
        """vLLM healthy again after it had been healthy, then gone or dead, without a restart of ours. A process
        that was gone (nothing listened) was restarted by its supervisor: always worth a line. A /health that
        failed for less than dead_after_s was a blip (a slow answer under load), not a death."""
        if self._down_since_s is not None:
            lost = f"nothing listened at its address for {seconds(now_s - self._down_since_s)}"
        elif (failed := self._failed_for()) is not None and failed >= self._settings.dead_after_s:
            lost = f"its /health failed for {seconds(failed)}"
        else:
            return ""
        return f"vLLM is healthy again: {lost}, and it came back without a restart by the sidecar"

    def _failed_for(self) -> float | None:
        """How long /health was seen failing, first to last failing poll: what came between that last poll and
        the healthy one is unknown, so a blip shorter than dead_after_s as seen is never reported as a death."""
        if self._failing_since_s is None or self._failing_seen_s is None:
            return None
        return self._failing_seen_s - self._failing_since_s

    def _down_limit_s(self, obs: Observation) -> float:
        """How long a vLLM that is gone is left to whoever restarts it: briefly when nobody else will, for ever
        when its operator stopped it on purpose."""
        if obs.restarter is Restarter.OPERATOR:
            return math.inf
        unsupervised = obs.restarter is Restarter.SIDECAR
        return self._settings.down_unsupervised_after_s if unsupervised else self._settings.down_after_s

    def _who(self, obs: Observation) -> str:
        said = f": {obs.restarter_detail}" if obs.restarter_detail else ""
        if obs.restarter is Restarter.SIDECAR:
            return f"its process is gone and nobody else will start it{said}"
        if obs.restarter is Restarter.SUPERVISOR:
            return f"its process is gone and its supervisor is bringing it back{said}"
        if obs.restarter is Restarter.OPERATOR:
            return f"it was stopped on purpose{said}"
        return f"its process is gone, not restarted{said}"
