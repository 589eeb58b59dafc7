"""The demo's screen, fitted to the terminal: the newest events, the policy's decision and both vLLMs' outcomes
always; detail (the story, the tables) as the size allows. Pure: data in, one renderable out, measured with
the console (which measures and writes nothing).

Each refresh tries the layouts from the richest to the plainest and takes the first that leaves MIN_EVENT_ROWS
rows for what happened; the events fill what is left, newest last, so nothing is cut at the bottom.
"""

from __future__ import annotations

import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from rich.console import Console, Group, RenderableType
from rich.rule import Rule
from rich.text import Text

from sidecar.demo import compact
from sidecar.demo.view import Header, engines_table, gpus_table, policy_panel

MIN_EVENT_ROWS = 8  # fewer, and the story and tables give way
EVENT_INDENT = 8  # "  43 s  ": a wrapped event's next lines start under its text
MAX_EVENT_ROWS = 3  # one event's rows at most; demo.log has it whole
TABLE_WIDTH = 100  # narrower, the tables' nine columns crowd each other: one line per engine and GPU instead


@dataclass(frozen=True, slots=True, kw_only=True)
class Frame:
    header: Header
    status: Mapping[str, object] | None
    sides: Sequence[str]  # each vLLM's outcome so far (outcome.side_lines)
    events: Sequence[str]  # every event line, oldest first
    footer: str  # when the demo stops, or at the end its exit line


def title(header: Header, width: int) -> Text:
    """The scenario and the time; the two loopback addresses too when the line has room."""
    text = Text(f"vllm-sidecar demo · scenario {header.scenario} · {header.elapsed_s:.0f} s", style="bold")
    urls = f" · vLLM (simulated) {header.sim_url} · sidecar {header.sidecar_url}"
    if len(text) + len(urls) <= width:
        text.append(urls, style="")
    return text


def _mappings(status: Mapping[str, object] | None, key: str) -> list[Mapping[str, object]]:
    values = status.get(key) if status is not None else None
    return [value for value in values if isinstance(value, Mapping)] if isinstance(values, list) else []


def _layouts(frame: Frame, width: int) -> list[list[RenderableType]]:
    """The candidate screens above the events, richest first."""
    status = frame.status
    policy = status.get("policy") if status is not None else None
    policy = policy if isinstance(policy, Mapping) else None
    engines, gpus = _mappings(status, "engines"), _mappings(status, "gpus")
    head = title(frame.header, width)
    story = [Text(f"scenario: {frame.header.story}", style="cyan")] if frame.header.story else []
    settings = [Text(frame.header.settings, style="dim")] if frame.header.settings else []
    problems = compact.problems(status)
    sides = Text("\n".join(frame.sides))
    decision = compact.decision(policy)
    tables: list[RenderableType] = [engines_table(engines), gpus_table(gpus)] if status is not None else []
    gpu_lines = [compact.gpu_line(gpu) for gpu in gpus]
    lines: list[RenderableType] = [*gpu_lines, *(compact.engine_line(engine) for engine in engines)]
    layouts: list[list[RenderableType]] = []
    if width >= TABLE_WIDTH:
        panel = policy_panel(policy)
        layouts += [
            [head, *story, *settings, panel, *tables, problems, sides],
            [head, *story, panel, *tables, problems, sides],
            [head, panel, *tables, problems, sides],
            [head, decision, *tables, problems, sides],
        ]
    layouts += [
        [head, *story, decision, problems, *lines, sides],
        [head, decision, problems, *lines, sides],
        [head, decision, problems, *gpu_lines, sides],
        [head, decision, problems, sides],
        [decision, sides],
    ]
    return layouts


def event_rows(events: Sequence[str], width: int, rows: int) -> list[str]:
    """The newest events that fit in `rows` rows of `width`, oldest first, each wrapped under its text."""
    shown: list[str] = []
    for line in reversed(events):
        wrapped = textwrap.wrap(
            line, width, subsequent_indent=" " * EVENT_INDENT, drop_whitespace=True, break_on_hyphens=False
        ) or [""]
        if len(wrapped) > MAX_EVENT_ROWS:
            wrapped = [*wrapped[: MAX_EVENT_ROWS - 1], wrapped[MAX_EVENT_ROWS - 1][: width - 1] + "…"]
        if len(shown) + len(wrapped) > rows:
            break
        shown[:0] = [row.rstrip() if index else row for index, row in enumerate(wrapped)]
    return shown


def screen(frame: Frame, console: Console, width: int, height: int) -> RenderableType:
    """The whole screen for one refresh, at most `height` rows of at most `width` columns."""
    options = console.options.update(width=width, height=None)

    def rows(parts: Sequence[RenderableType]) -> int:
        return sum(len(console.render_lines(part, options, pad=False)) for part in parts)

    footer = Text(frame.footer, style="dim")
    fixed = 1 + rows([footer])  # the rule above the events, the footer below them
    layouts = _layouts(frame, width)
    chosen = next((layout for layout in layouts if rows(layout) + fixed + MIN_EVENT_ROWS <= height), layouts[-1])
    left = height - rows(chosen) - fixed
    if left < 1:  # a terminal too small for any event: the decision and the outcomes, as much as fits
        return Group(*chosen, footer)
    events = event_rows(frame.events, width, left)
    body = Text("\n".join(events) or "none yet", no_wrap=True, overflow="ellipsis")
    return Group(*chosen, Rule("what happened (whole lines in demo.log)", style="dim"), body, footer)
