"""Whether to change a flag of vLLM's next start after a crash, and whether the change helped. Pure, no I/O.

`propose` turns the doctor's reading of a crash into one change, or a refusal that says why not. A change is
made only when everything about it is known, never on a guess:
- the cause is the doctor's, with a flag it sized, whose value today the log states (the direction is then
  the sign of the difference);
- the flag is allowed (`--remediate`), and the doctor's value lies within the range allowed for it: a value
  outside is refused, not clamped (a clamped value is one the doctor did not compute);
- the flag is not held (a change to it was reverted: a person decides), no earlier step on it went the other
  way (two opposite fixes mean the doctor's reading is not enough), no other change is still proving itself,
  and the changes of the last 24 h are within the daily budget.

`judge` follows a change after vLLM's next start: confirmed once vLLM was healthy for the whole window;
reverted when vLLM is not healthy within the start timeout, or when the same cause is back with the new value
in effect. Either way the flag is then held: a person decides what comes next.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from sidecar.model.cause import CrashCause, FlagChange
from sidecar.model.remediation import REMEDIABLE, Allowance, Step, StepState, shown
from sidecar.model.text import plural

DAY_S = 86_400.0


@dataclass(frozen=True, slots=True, kw_only=True)
class Refusal:
    flag: str | None  # the flag the doctor would change, when there is one
    why: str  # one line


def parse_allowances(text: str) -> tuple[Allowance, ...]:
    """`max-model-len=1024..32768,gpu-memory-utilization=0.8..0.95`: the flags allowed and each one's range.
    Raises ValueError with one line naming what is wrong."""
    allowances: dict[str, Allowance] = {}
    for part in (piece.strip() for piece in text.split(",")):
        if not part:
            continue
        name, equals, bounds = part.partition("=")
        flag = "--" + name.strip().removeprefix("--")
        if flag not in REMEDIABLE:
            known = ", ".join(name.removeprefix("--") for name in REMEDIABLE)
            raise ValueError(f"{name.strip()!r} is not a flag the sidecar may change (one of: {known})")
        low_text, dots, high_text = bounds.partition("..")
        if not equals or not dots:
            raise ValueError(f"{part!r} gives no range: write {flag.removeprefix('--')}=LOW..HIGH")
        try:
            low, high = float(low_text), float(high_text)
        except ValueError:
            raise ValueError(f"{part!r}: LOW and HIGH must be numbers") from None
        if not (math.isfinite(low) and math.isfinite(high)) or low <= 0 or high < low:
            raise ValueError(f"{part!r}: the range must be 0 < LOW <= HIGH")
        if flag == "--gpu-memory-utilization" and high > 1:
            raise ValueError(f"{part!r}: --gpu-memory-utilization is a share of the card, at most 1")
        if flag in allowances:
            raise ValueError(f"{flag.removeprefix('--')} is given twice")
        allowances[flag] = Allowance(flag=flag, low=low, high=high)
    return tuple(allowances.values())


def flags_in_effect(steps: Iterable[Step]) -> dict[str, float]:
    """What the flags file holds after `steps` (oldest first): per flag, the newest step that stands (not
    reverted); with every step reverted, what the file held before the first (normally nothing)."""
    flags: dict[str, float] = {}
    first: dict[str, float | None] = {}
    standing: set[str] = set()
    for step in steps:
        first.setdefault(step.flag, step.file_before)
        if step.state is not StepState.REVERTED:
            flags[step.flag] = step.after
            standing.add(step.flag)
    untouched = {flag: before for flag, before in first.items() if flag not in standing and before is not None}
    return flags | untouched


def revert_by_person(steps: Sequence[Step], flag: str, now_wall_s: float) -> list[Step] | None:
    """`steps` with the newest standing step of `flag` reverted by a person (and the flag held); None when the
    sidecar sets nothing for it."""
    index = next(
        (
            i
            for i in range(len(steps) - 1, -1, -1)
            if steps[i].flag == flag and steps[i].state is not StepState.REVERTED
        ),
        None,
    )
    if index is None:
        return None
    reverted = settle(steps[index], "reverted: by a person (vllm-sidecar remediations revert)", now_wall_s)
    return [*steps[:index], reverted, *steps[index + 1 :]]


def release(steps: Sequence[Step], flag: str) -> list[Step] | None:
    """`steps` with `flag` no longer held; None when it is not."""
    if not held(steps, flag):
        return None
    index = max(i for i, step in enumerate(steps) if step.flag == flag)
    return [*steps[:index], replace(steps[index], held=False), *steps[index + 1 :]]


def pending(steps: Sequence[Step]) -> Step | None:
    return next((step for step in reversed(steps) if step.state is StepState.PENDING), None)


def held(steps: Sequence[Step], flag: str) -> bool:
    latest = next((step for step in reversed(steps) if step.flag == flag), None)
    return latest is not None and latest.held


def propose(
    cause: CrashCause,
    *,
    allowances: Sequence[Allowance],
    steps: Sequence[Step],
    now_wall_s: float,
    max_per_day: int,
) -> Step | Refusal | None:
    """The change for vLLM's next start (a PENDING step), a refusal, or None when the cause asks for no flag the
    sidecar could ever set (unknown, or only flags a person must decide: the notification carries those)."""
    if not cause.known or cause.cause is None:
        return None
    remediable = [change for change in cause.recommendations if change.flag in REMEDIABLE]
    if not remediable:
        return None
    allowed = {allowance.flag: allowance for allowance in allowances}
    change = next((change for change in remediable if change.flag in allowed), None)
    if change is None:
        wanted = ", ".join(change.pasted for change in remediable)
        return Refusal(
            flag=remediable[0].flag, why=f"the doctor's fix ({wanted}) is not among the flags --remediate allows"
        )
    numbers = _numbers(change)
    if isinstance(numbers, str):
        return Refusal(flag=change.flag, why=numbers)
    current, value = numbers
    refusal = _guard(
        change,
        up=value > current,
        allowance=allowed[change.flag],
        steps=steps,
        now_wall_s=now_wall_s,
        max_per_day=max_per_day,
    )
    if refusal is not None:
        return Refusal(flag=change.flag, why=refusal)
    return Step(
        flag=change.flag,
        before=current,
        after=value,
        file_before=flags_in_effect(steps).get(change.flag),
        cause=cause.cause,
        why=change.why,
        wall_time_s=now_wall_s,
        state=StepState.PENDING,
    )


def _numbers(change: FlagChange) -> tuple[float, float] | str:
    """(today's value, the doctor's), or why there is no change to make."""
    value, current = change.value, change.current
    if isinstance(value, str | bool):
        return f"the doctor's fix {change.pasted} is no number"
    if current is None:
        return f"vLLM's log does not say today's {change.flag}: no change on a guess ({change.pasted} recommended)"
    if value == current:
        return f"the doctor's fix {change.pasted} is today's value"
    return float(current), float(value)


def _guard(
    change: FlagChange, *, up: bool, allowance: Allowance, steps: Sequence[Step], now_wall_s: float, max_per_day: int
) -> str | None:
    """Why the guard rails refuse `change`, or None."""
    flag, direction = change.flag, 1 if up else -1
    waiting = pending(steps)
    opposite = next((step for step in steps if step.flag == flag and step.direction != direction), None)
    today = [step for step in steps if now_wall_s - step.wall_time_s < DAY_S]
    checks = (
        (
            not allowance.low <= float(change.value) <= allowance.high,
            f"the doctor's fix {change.pasted} is outside the range --remediate allows ({allowance.words()}): "
            "a person must decide",
        ),
        (waiting is not None, f"one change at a time: {waiting.diff() if waiting else ''} is still proving itself"),
        (
            held(steps, flag),
            f"{flag} is held since a change to it was reverted: `vllm-sidecar remediations release {flag}` lifts it",
        ),
        (
            opposite is not None,
            f"{change.pasted} would undo an earlier step ({opposite.diff() if opposite else ''}): the doctor's "
            "readings disagree, a person must decide",
        ),
        (
            len(today) >= max_per_day,
            f"the daily budget is spent: {plural(len(today), 'change')} in the last 24 h (--remediate-max-per-day)",
        ),
    )
    return next((why for failed, why in checks if failed), None)


@dataclass(frozen=True, slots=True, kw_only=True)
class Watch:
    """What is known of vLLM since a change was set (monotonic seconds)."""

    set_s: float  # when the change was set (the restart that applies it was asked for)
    healthy_since_s: float | None  # vLLM healthy without a break since then


def judge(step: Step, watch: Watch, *, now_s: float, start_timeout_s: float, window_s: float) -> str | None:
    """From the clock alone: "confirmed: ..." or "reverted: ..." when the change is settled, else None."""
    if watch.healthy_since_s is not None:
        if now_s - watch.healthy_since_s >= window_s:
            return f"confirmed: vLLM healthy for {plural(round(window_s), 'second')} with {step.diff()}"
        return None
    if now_s - watch.set_s >= start_timeout_s:
        return (
            f"reverted: vLLM not healthy within {plural(round(start_timeout_s), 'second')} of {step.diff()} "
            "(where its log shows the old value, its start does not read the flags file: docs/remediation.md): "
            "a person must decide"
        )
    return None


def judge_crash(step: Step, cause: CrashCause) -> str | None:
    """A crashed start read while `step` proves itself: "reverted: ..." when the same cause is back with the new
    value in effect, else None. A start that ran with another value is not judged here: it may be the start from
    before the change, still the newest in the log; one that never reads the flags file is caught by the start
    timeout (`judge`)."""
    value = cause.value_of(step.flag)
    if value is None or not math.isclose(value, step.after) or cause.cause != step.cause:
        return None
    return f"reverted: {step.cause} is back with {step.flag} {shown(step.flag, step.after)}: a person must decide"


def settle(step: Step, verdict: str, now_wall_s: float) -> Step:
    """The step confirmed or reverted by `verdict` (a line of `judge` or `judge_crash`)."""
    state = StepState.CONFIRMED if verdict.startswith("confirmed") else StepState.REVERTED
    return replace(
        step,
        state=state,
        outcome=verdict,
        resolved_wall_time_s=now_wall_s,
        held=state is StepState.REVERTED,
    )
