"""Collects what the suites measured and writes it as markdown (bench/RESULTS.md). Pure text building."""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from dataclasses import dataclass, field

from bench.machine import Machine


@dataclass(frozen=True, slots=True, kw_only=True)
class Target:
    name: str
    goal: str
    measured: str
    met: bool


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines


@dataclass(slots=True)
class Results:
    machine: Machine
    sections: list[tuple[str, list[str]]] = field(default_factory=list)
    targets: list[Target] = field(default_factory=list)
    elapsed_s: float = 0.0
    load_at_end: tuple[float, float, float] = (0.0, 0.0, 0.0)
    started: str = field(default_factory=lambda: datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"))

    def section(self, title: str, lines: list[str]) -> None:
        self.sections.append((title, lines))
        print("\n".join(lines))

    def target(self, name: str, goal: str, measured: str, *, met: bool) -> None:
        self.targets.append(Target(name=name, goal=goal, measured=measured, met=met))

    def finish(self, *, elapsed_s: float, load_at_end: tuple[float, float, float]) -> None:
        self.elapsed_s = elapsed_s
        self.load_at_end = load_at_end

    def targets_text(self) -> str:
        lines = ["targets:"]
        lines += [
            f"  [{'met' if item.met else 'NOT MET'}] {item.name}: {item.measured} (goal {item.goal})"
            for item in self.targets
        ]
        return "\n".join(lines)

    def markdown(self) -> str:
        one, five, fifteen = self.load_at_end
        lines = [
            "# Benchmark results",
            "",
            "Written by `python -m bench` (see `python -m bench --help`); numbers from one run, on:",
            "",
            f"- machine: {self.machine.line()} at the start",
            f"- run: {self.started}, {self.elapsed_s / 60:.1f} min; load average at the end {one:.2f} {five:.2f} "
            f"{fifteen:.2f}",
            "",
            "Ratios compare with a reference measured in the same run on the same bytes; milliseconds depend on "
            "the machine and on whatever else ran on it.",
        ]
        if self.targets:
            lines += ["", "## Targets", ""]
            lines += table(
                ["target", "goal", "measured", ""],
                [(t.name, t.goal, t.measured, "met" if t.met else "**not met**") for t in self.targets],
            )
        for title, body in self.sections:
            lines += ["", f"## {title}", "", *body]
        return "\n".join(lines) + "\n"
