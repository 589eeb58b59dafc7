"""What each scenario does while the simulation runs, and the load that shows its failure. Pure, no I/O.

The presets themselves (sizes, rates) are in `config.scenario_config`; this module turns them into effects at a
given time (a tenant's memory, a hang) and states the client load each preset was calibrated against.
"""

from __future__ import annotations

from dataclasses import dataclass

from sidecar.sim.config import Scenario, SimConfig


@dataclass(frozen=True, slots=True, kw_only=True)
class LoadShape:
    """A closed-loop client load: `concurrency` requests in flight, ramping linearly from `concurrency_start`,
    with an optional quiet spell (nothing new sent from `quiet_from_s` for `quiet_s`)."""

    concurrency: int
    concurrency_start: int | None = None  # None: full concurrency from the start
    ramp_s: float = 0.0
    quiet_from_s: float | None = None  # None: no quiet spell
    quiet_s: float = 0.0
    prompt_tokens: int = 1000
    prompt_jitter_tokens: int = 0  # each prompt is prompt_tokens +- up to this many
    max_tokens: int = 128
    prefix_tokens: int = 0  # leading tokens shared by every request of a prefix group
    prefix_groups: int = 0  # distinct shared prefixes (0: no sharing)

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, got {self.concurrency}")
        if self.prefix_tokens >= self.prompt_tokens - self.prompt_jitter_tokens:
            raise ValueError("prefix_tokens must leave room for a unique suffix in every prompt")
        if self.quiet_s < 0 or (self.quiet_from_s is not None and self.quiet_from_s < 0):
            raise ValueError("quiet_from_s and quiet_s must not be negative")

    def concurrency_at(self, elapsed_s: float) -> int:
        """Requests to keep in flight `elapsed_s` after the load began (0 during the quiet spell)."""
        if self.quiet_from_s is not None and self.quiet_from_s <= elapsed_s < self.quiet_from_s + self.quiet_s:
            return 0
        if self.concurrency_start is None or self.ramp_s <= 0 or elapsed_s >= self.ramp_s:
            return self.concurrency
        start = self.concurrency_start
        return start + int((self.concurrency - start) * max(0.0, elapsed_s) / self.ramp_s)


# The loads the presets were tuned against (see the tests in tests/sim/test_scenarios.py for the timings).
_LOADS: dict[Scenario, LoadShape] = {
    Scenario.HEALTHY: LoadShape(concurrency=32, prompt_tokens=1000, prompt_jitter_tokens=500, max_tokens=128),
    # Long prompts with concurrency climbing from 16 to 64 over 20 s: free < 5 % near 30 running, death near 60.
    Scenario.BURST: LoadShape(concurrency=64, concurrency_start=16, ramp_s=20.0, prompt_tokens=2000, max_tokens=256),
    Scenario.LEAK: LoadShape(concurrency=32, prompt_tokens=1000, prompt_jitter_tokens=200, max_tokens=128),
    Scenario.TENANT: LoadShape(concurrency=32, prompt_tokens=1000, prompt_jitter_tokens=500, max_tokens=128),
    # 128 system prompts of 1,536 tokens (197k tokens) against a 51k-token cache: LRU evicts before reuse.
    Scenario.PREFIX_THRASH: LoadShape(
        concurrency=16, prompt_tokens=1792, max_tokens=32, prefix_tokens=1536, prefix_groups=128
    ),
    Scenario.HANG: LoadShape(concurrency=16, prompt_tokens=1000, prompt_jitter_tokens=500, max_tokens=128),
    Scenario.HANG_QUEUE: LoadShape(concurrency=16, prompt_tokens=1000, prompt_jitter_tokens=500, max_tokens=128),
    # A lull from 20 s to 30 s: the engine runs dry, stops while idle, and the requests after the lull hang.
    Scenario.HANG_IDLE: LoadShape(
        concurrency=16, prompt_tokens=1000, prompt_jitter_tokens=500, max_tokens=128, quiet_from_s=20.0, quiet_s=10.0
    ),
    Scenario.STARTUP: LoadShape(concurrency=1, prompt_tokens=500, max_tokens=16),
}


def scenario_load(name: str) -> LoadShape:
    """The client load under which scenario `name` shows its failure quickly."""
    return _LOADS[Scenario(name)]


def tenant_wanted_bytes(config: SimConfig, elapsed_s: float) -> int:
    """What the other process on each GPU wants `elapsed_s` after the simulation's first call (0: absent).

    It starts with its own CUDA context and grows linearly up to tenant_max_bytes.
    """
    if config.tenant_start_s is None or elapsed_s < config.tenant_start_s:
        return 0
    grown = config.cuda_context_bytes + config.tenant_bytes_per_s * (elapsed_s - config.tenant_start_s)
    return int(min(float(config.tenant_max_bytes), grown))


def is_hung(config: SimConfig, first_request_s: float | None, now_s: float) -> bool:
    """Whether the engine has stopped making progress (hang_after_s after the first request)."""
    if config.hang_after_s is None or first_request_s is None:
        return False
    return now_s - first_request_s >= config.hang_after_s


def admits(config: SimConfig, elapsed_s: float) -> bool:
    """Whether the scheduler still admits waiting requests `elapsed_s` after the simulation's first call."""
    return config.hang_queue_after_s is None or elapsed_s < config.hang_queue_after_s


def stops_when_idle(config: SimConfig, elapsed_s: float) -> bool:
    """Whether the engine stops at its next idle moment, `elapsed_s` after the simulation's first call."""
    return config.hang_idle_after_s is not None and elapsed_s >= config.hang_idle_after_s
