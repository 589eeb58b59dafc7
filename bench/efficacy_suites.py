"""The efficacy suites of `python -m bench`: one replica (`efficacy`) and a fleet of two behind a router (`fleet`).

Does I/O through bench.efficacy and bench.fleet; the formatting is here. Each scenario's goodput is compared
with a run of the same length without failures (the healthy preset, the same seeded arrivals): runs of
different lengths hold different arrivals, so each length gets its own reference, measured in the same run.
"""

from __future__ import annotations

from collections.abc import Callable

from bench.efficacy import HEALTHY, SCENARIOS, EfficacyRun, Scenario, run_scenario
from bench.fleet import FLEET_SCENARIOS, FleetRun, run_fleet
from bench.options import Options
from bench.report import Results, table
from bench.router import sidecar_readyz_timing, vllm_health_timing

TARGET_GOODPUT_LOSS = 0.10

_LOAD = (
    "open-loop load (Poisson, 8 requests/s, 2,000 prompt + 256 output tokens, 10 s timeout, same seed) for a fixed "
    "time, with the sidecar off and on (`--interval 1`, exec adapter restarting the simulator). A supervisor stands "
    "in for systemd: a crashed simulator is started again 10 s later (Restart=on-failure, RestartSec=10s), a "
    "planned restart at once. Goodput is output tokens of successful requests per second; the percentage compares "
    "with the `healthy` run of the same length. The simulator restarts in about a second where a real vLLM takes "
    "minutes, which makes every restart, crash or planned, cheaper here than in production."
)


class _References:
    """One healthy run per length, measured when first needed."""

    def __init__(self, measure: Callable[[float], EfficacyRun]) -> None:
        self._measure = measure
        self._runs: dict[float, EfficacyRun] = {}

    def __call__(self, duration_s: float) -> EfficacyRun:
        if duration_s not in self._runs:
            self._runs[duration_s] = self._measure(duration_s)
        return self._runs[duration_s]


def _loss(run: EfficacyRun, reference: EfficacyRun) -> float:
    return 1 - run.goodput_tokens_per_s / reference.goodput_tokens_per_s


def _row(run: EfficacyRun, reference: EfficacyRun, *extra: str) -> tuple[str, ...]:
    return (
        run.scenario,
        "on" if run.sidecar else "off",
        f"{run.duration_s:.0f} s",
        str(run.crashes),
        str(run.planned_restarts),
        f"{run.failed} / {run.arrivals}",
        *extra,
        f"{run.goodput_tokens_per_s:.0f} tok/s ({-_loss(run, reference):+.0%})",
        f"{run.downtime_s:.1f} s",
    )


def _crash_target(results: Results, label: str, on: EfficacyRun) -> None:
    results.target(f"{label}: crashes with the sidecar", "0", str(on.crashes), met=on.crashes == 0)


def _loss_target(
    results: Results, label: str, on: EfficacyRun, off: EfficacyRun, reference: EfficacyRun, *, note: str = ""
) -> None:
    loss = _loss(on, reference)
    results.target(
        f"{label}: goodput loss with the sidecar",
        f"< {TARGET_GOODPUT_LOSS:.0%}",
        f"{loss:.0%} (off: {_loss(off, reference):.0%}{note})",
        met=loss < TARGET_GOODPUT_LOSS,
    )


def _hang_floor(fleet: FleetRun) -> str:
    """What no sidecar can save: the requests inside A's engine when it stopped, as a share of the arrivals."""
    if not fleet.hangs:
        return ""
    lost = fleet.lost.in_flight_at_a_hang
    hangs = f"{fleet.hangs} hang{'s' if fleet.hangs > 1 else ''}"
    return f"; {lost / fleet.run.arrivals:.0%} were inside A's engine at its {hangs}, lost to any watcher"


def _note(scenario: Scenario) -> str:
    sim = " ".join(scenario.sim_flags) or "(preset)"
    sidecar = " ".join(scenario.sidecar_flags) or "(defaults)"
    return f"- `{scenario.name}`: sim `{sim}`; sidecar `{sidecar}`" + (f"; {scenario.note}" if scenario.note else "")


def efficacy_suite(options: Options, results: Results) -> None:
    references = _References(lambda duration: run_scenario(HEALTHY, sidecar=False, duration_s=duration))
    rows: list[tuple[str, ...]] = []
    for name in options.scenarios:
        scenario = SCENARIOS[name]
        duration = scenario.duration_s * options.efficacy_scale
        reference = references(duration)
        off = run_scenario(scenario, sidecar=False, duration_s=duration)
        on = run_scenario(scenario, sidecar=True, duration_s=duration)
        rows += [_row(reference, reference, "0"), _row(off, reference, "0"), _row(on, reference, str(on.not_admitted))]
        _crash_target(results, f"efficacy {name} (one replica)", on)
        # The goodput target is the fleet's: on one replica what the pause holds back has nowhere else to go.
    results.section(
        "Efficacy, one replica",
        [
            f"One simulator, each scenario under the same {_LOAD} *Failed* counts errors, timeouts and arrivals "
            "while the server was down, out of every arrival; *held* are arrivals held back because /readyz said "
            "503: with no other replica to take them they count as lost here, which is why the targets are "
            "measured on the fleet below. At 8 requests/s one simulator runs at its capacity: over 45 s and more, "
            "bunched arrivals time out requests even in the healthy run. Downtime is /health not 200 or requests "
            "running with no token produced.",
            "",
            *table(
                ["scenario", "sidecar", "run", "crashes", "planned restarts", "failed", "held", "goodput", "downtime"],
                rows,
            ),
            "",
            *(_note(SCENARIOS[name]) for name in options.scenarios),
        ],
    )


def _fleet_row(fleet: FleetRun, reference: EfficacyRun) -> tuple[str, ...]:
    lost = fleet.lost
    return (
        *_row(fleet.run, reference, f"{fleet.sent_to_a} / {fleet.sent_to_b}", str(fleet.unrouted)),
        f"{fleet.hangs}: {lost.in_flight_at_a_hang} / {lost.sent_while_hung} / {lost.other_on_a} / {lost.on_b}",
    )


def fleet_suite(options: Options, results: Results) -> None:
    healthy: dict[float, FleetRun] = {}
    rows: list[tuple[str, ...]] = []
    for name in options.scenarios:
        scenario = FLEET_SCENARIOS[name]
        duration = scenario.duration_s * options.efficacy_scale
        if duration not in healthy:
            healthy[duration] = run_fleet(HEALTHY, sidecar=False, duration_s=duration)
        reference = healthy[duration].run
        off = run_fleet(scenario, sidecar=False, duration_s=duration)
        on = run_fleet(scenario, sidecar=True, duration_s=duration)
        rows += [_fleet_row(healthy[duration], reference), _fleet_row(off, reference), _fleet_row(on, reference)]
        label = f"efficacy {name} (fleet of 2)"
        _crash_target(results, label, on.run)
        _loss_target(results, label, on.run, off.run, reference, note=_hang_floor(on))
    health, readyz = vllm_health_timing(), sidecar_readyz_timing()
    results.section(
        "Efficacy, a fleet of two replicas",
        [
            "Two simulators behind a loopback router that honours readiness as a Kubernetes Service does, with the "
            f"probes of the shipped manifests (vLLM's /health every {health.period_s:g} s, out after "
            f"{health.failure_threshold} failures; the sidecar's /readyz every {readyz.period_s:g} s, out after "
            f"{readyz.failure_threshold}), round robin over the ready ones, 503 when none is, no retries. Replica "
            "A runs the scenario, B the healthy preset; with the sidecar on, each has its own. The fleet carries the "
            f"single-replica bench's load, so one replica alone can take it all (N+1): the same {_LOAD} *Failed* "
            "counts errors and timeouts (a request sent to a replica that died between probes included) out of "
            "every arrival; *to A / to B* where the router sent the completions; *no replica* the 503s it answered "
            "itself. Crashes and restarts are both replicas'; downtime is A's. *Hangs: lost* counts the stretches "
            "in which A's engine made no progress with requests running (a watcher polling it every 0.2 s), then "
            "the completions that got no whole answer within the client's timeout (the router's log): A's by when "
            "they were sent, still running inside A when a hang began (no sidecar can save these; a router that "
            "retries could) / sent to A after it stopped, before it progressed again (what a pause that reaches "
            "the router saves) / other on A (a restart's gap), then B's (carrying A's share on top of its own, one "
            "replica at its capacity: bunched arrivals time out). The router's view can differ from the load "
            "tester's by the requests still running when the run ends.",
            "",
            *table(
                [
                    "scenario",
                    "sidecar",
                    "run",
                    "crashes",
                    "planned restarts",
                    "failed",
                    "to A / to B",
                    "no replica",
                    "goodput",
                    "downtime",
                    "hangs: lost in flight / sent while hung / other on A / on B",
                ],
                rows,
            ),
            "",
            *(_note(FLEET_SCENARIOS[name]) for name in options.scenarios),
        ],
    )
