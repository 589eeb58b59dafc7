"""The PromQL a Grafana dashboard JSON runs, and the variable substitution Grafana does before running it. Pure.

Used by the dashboard test (every query against a real Prometheus) and by render.py (the picture): both must
run exactly what Grafana would, so both read the queries from the JSON file, never from the generator.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import promql_parser


class QueryKind(StrEnum):
    RANGE = "range"  # a time-series panel's target: a range query over the dashboard's time range
    INSTANT = "instant"  # a stat panel's target: the latest value only
    ANNOTATION = "annotation"  # a range query at the annotation's own interval; each sample > 0 is an event


@dataclass(frozen=True, slots=True, kw_only=True)
class DashboardQuery:
    where: str  # for messages: "panel 12 'KV-cache usage' A"
    kind: QueryKind
    expr: str  # as written in the dashboard, variables not yet substituted
    legend: str
    panel_id: int | None = None
    ref: str = ""
    interval: str | None = None  # an annotation's step
    value_is_time: bool = False  # an annotation whose sample values are the events' times in ms


@dataclass(frozen=True, slots=True, kw_only=True)
class VariableQuery:
    """A query variable `label_values(<selector>, <label>)`: the label's values among the selected series."""

    name: str
    selector: str
    label: str


_LABEL_VALUES = re.compile(r"^\s*label_values\(\s*(?P<selector>.+?)\s*,\s*(?P<label>[a-zA-Z_]\w*)\s*\)\s*$")
_VARIABLE = re.compile(r"\$(?:\{(?P<braced>\w+)\}|(?P<plain>\w+))")
_LEGEND_LABEL = re.compile(r"\{\{\s*(\w+)\s*\}\}")


def panels(dashboard: Mapping[str, Any]) -> Iterator[Mapping[str, Any]]:
    """Every panel that is not a row, including those inside collapsed rows."""
    for panel in dashboard.get("panels", []):
        if panel.get("type") == "row":
            yield from panel.get("panels", [])
        else:
            yield panel


def panel_queries(dashboard: Mapping[str, Any]) -> list[DashboardQuery]:
    found = []
    for panel in panels(dashboard):
        for target in panel.get("targets", []):
            kind = QueryKind.INSTANT if target.get("instant") and not target.get("range") else QueryKind.RANGE
            found.append(
                DashboardQuery(
                    where=f"panel {panel['id']} {panel['title']!r} {target['refId']}",
                    kind=kind,
                    expr=target["expr"],
                    legend=target.get("legendFormat", ""),
                    panel_id=panel["id"],
                    ref=target["refId"],
                )
            )
    return found


def annotation_queries(dashboard: Mapping[str, Any]) -> list[DashboardQuery]:
    """The Prometheus annotations (the built-in Grafana one has no query)."""
    found = []
    for annotation in dashboard.get("annotations", {}).get("list", []):
        if annotation.get("datasource", {}).get("type") != "prometheus":
            continue
        target = annotation["target"]
        found.append(
            DashboardQuery(
                where=f"annotation {annotation['name']!r}",
                kind=QueryKind.ANNOTATION,
                expr=target["expr"],
                legend=annotation.get("titleFormat", ""),
                interval=target.get("interval") or None,
                value_is_time=bool(annotation.get("useValueForTime")),
            )
        )
    return found


def variable_queries(dashboard: Mapping[str, Any]) -> list[VariableQuery]:
    found = []
    for variable in dashboard.get("templating", {}).get("list", []):
        if variable.get("type") != "query":
            continue
        query = variable["query"]
        text = query if isinstance(query, str) else query.get("query", "")
        match = _LABEL_VALUES.match(text)
        if match is None:
            raise ValueError(f"variable {variable['name']}: not a label_values(selector, label) query: {text!r}")
        found.append(VariableQuery(name=variable["name"], selector=match["selector"], label=match["label"]))
    return found


def aligned(start: float, end: float, step_s: float) -> tuple[float, float]:
    """The range Grafana's Prometheus data source asks for: start and end rounded out to multiples of the step,
    so a query's samples fall on the same instants on every refresh."""
    return math.floor(start / step_s) * step_s, math.ceil(end / step_s) * step_s


def duration_seconds(duration: str) -> float:
    """A Prometheus duration such as `30s`, `1m` or `1h30m` in seconds."""
    return promql_parser.parse_duration(duration).total_seconds()


_REGEX_SPECIAL = re.compile(r"[$^*{}\[\]'+?.()|]")


def regex_value(values: Sequence[str]) -> str:
    r"""A variable's value(s) as Grafana's Prometheus data source writes them into a regex matcher: regex
    characters escaped with a backslash that is itself escaped for the PromQL string (`.` becomes `\\.`),
    several values as `(a|b)`."""
    escaped = [_REGEX_SPECIAL.sub(lambda m: "\\\\" + m[0], value.replace("\\", "\\\\\\\\")) for value in values]
    return escaped[0] if len(escaped) == 1 else "(" + "|".join(escaped) + ")"


def substitute(expr: str, values: Mapping[str, str]) -> str:
    """`$name` and `${name}` replaced from `values` (which must include the built-ins the query uses, e.g.
    `__rate_interval`); an unknown variable is an error, as an unresolved one would be a broken panel."""

    def replace(match: re.Match[str]) -> str:
        name = match["braced"] or match["plain"]
        if name not in values:
            raise KeyError(f"no value for variable ${name} in {expr!r}")
        return values[name]

    return _VARIABLE.sub(replace, expr)


def legend(template: str, labels: Mapping[str, str]) -> str:
    """A series name from a legendFormat such as `{{model_name}}/{{engine}}` (a missing label reads empty)."""
    return _LEGEND_LABEL.sub(lambda match: labels.get(match[1], ""), template).strip()


def selectors(expr: str) -> list[promql_parser.VectorSelector]:
    """Every vector selector of a (substituted) query, including those inside range selectors (the walk
    descends into a matrix selector's vector selector)."""
    found: list[promql_parser.VectorSelector] = []

    def visit(node: promql_parser.Expr) -> bool:
        if isinstance(node, promql_parser.VectorSelector):
            found.append(node)
        return True

    promql_parser.walk(promql_parser.parse(expr), visit)
    return found


def metric_names(expr: str) -> set[str]:
    """The metric names a query reads: selector names, and the alternatives of a `__name__=~"a|b"` matcher."""
    names: set[str] = set()
    for selector in selectors(expr):
        if selector.name:
            names.add(selector.name)
        for matcher in selector.matchers.matchers:
            if matcher.name == "__name__":
                names.update(matcher.value.split("|"))
    return names


def matchers(selector: promql_parser.VectorSelector) -> dict[str, str]:
    """Label name -> the value a selector's matcher compares with (operator aside)."""
    return {matcher.name: matcher.value for matcher in selector.matchers.matchers}
