"""Draw what the dashboard shows, from a real Prometheus, as a static page (inline SVG, no script, nothing fetched
from the network) laid out on the dashboard's own grid, and screenshot it with headless Chromium.

    python -m grafana.render --prometheus http://127.0.0.1:9090 --start 1763784000 --end 1763784090 --png out.png

It runs each panel's queries the way Grafana would (range queries for time series, instant ones for stats, the
annotation queries at their own step) with every variable on "All". It is a sketch of the dashboard, not Grafana:
units, thresholds, value mappings and annotations are drawn; Grafana's styling is only imitated.
`python -m tests.ship.dashboard_stack` starts a whole stack (simulators, sidecars, load, Prometheus) and calls this.
"""

from __future__ import annotations

import argparse
import html
import itertools
import json
import math
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from grafana import queries
from grafana.queries import DashboardQuery, QueryKind

DASHBOARD = Path(__file__).resolve().parent / "vllm-sidecar.json"
CHROMIUM = "chromium"
PAGE_WIDTH = 1600
CELL_HEIGHT = 30  # Grafana's grid row height in pixels
MARGIN = 8
HEADER = 44
# Grafana's classic palette, long enough that the series of one panel rarely share a colour.
PALETTE = (
    *("#7EB26D", "#EAB839", "#6ED0E0", "#EF843C", "#E24D42", "#1F78C1", "#BA43A9", "#705DA0", "#508642"),
    *("#CCA300", "#447EBC", "#C15C17", "#890F02", "#0A437C", "#6D1F62", "#584477", "#B7DBAB", "#F4D598"),
)
NAMED_COLORS = {
    "green": "#73BF69",
    "orange": "#FF9830",
    "red": "#F2495C",
    "blue": "#5794F2",
    "purple": "#B877D9",
    "yellow": "#FADE2A",
    "transparent": "transparent",
}
BACKGROUND, PANEL_BACKGROUND, BORDER, TEXT, MUTED = "#111217", "#181b1f", "#2c3235", "#ccccdc", "#8e8e9e"


@dataclass(frozen=True, slots=True)
class Series:
    name: str
    points: tuple[tuple[float, float], ...]  # (unix seconds, value); NaN and missing samples are gaps


@dataclass(frozen=True, slots=True)
class Event:
    """An annotation as Grafana draws it: a line (start == end) or a region."""

    color: str
    start: float
    end: float


def chromium_missing() -> str | None:
    return None if shutil.which(CHROMIUM) else f"{CHROMIUM} is not installed (apt-get install chromium)"


def load_dashboard(path: Path = DASHBOARD) -> dict[str, Any]:
    document: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return document


def rate_interval(step_s: float, scrape_interval_s: float) -> str:
    """Grafana's $__rate_interval: max($__interval + scrape interval, 4 x scrape interval)."""
    return f"{max(step_s + scrape_interval_s, 4 * scrape_interval_s):g}s"


def time_range(window: tuple[float, float]) -> str:
    """Grafana's $__range: the dashboard's time range in whole seconds, as its Prometheus data source writes it."""
    start, end = window
    return f"{round(end - start)}s"


def all_values(dashboard: Mapping[str, Any], rate: str, window: tuple[float, float]) -> dict[str, str]:
    """Every query variable on "All" (its allValue, `.*`), and the built-ins the queries use."""
    values = {v.name: ".*" for v in queries.variable_queries(dashboard)}
    values["__rate_interval"] = rate
    values["__range"] = time_range(window)
    return values


# --- Prometheus -------------------------------------------------------------------------------------------------
class Prometheus:
    def __init__(self, url: str) -> None:
        self._client = httpx.Client(base_url=url, timeout=15, trust_env=False)

    def _data(self, path: str, params: Mapping[str, str]) -> Any:
        document = self._client.get(path, params=params).json()
        if document.get("status") != "success":
            raise RuntimeError(f"{path} {dict(params)}: {document.get('error')}")
        return document["data"]

    def run(self, query: DashboardQuery, expr: str, start: float, end: float, step_s: float) -> list[Series]:
        if query.kind is QueryKind.INSTANT:
            result = self._data("/api/v1/query", {"query": expr, "time": f"{end:.3f}"})["result"]
            return [_series(query.legend, item["metric"], [item["value"]]) for item in result]
        step = queries.duration_seconds(query.interval) if query.interval else step_s
        first, last = queries.aligned(start, end, step)
        params = {"query": expr, "start": f"{first:.3f}", "end": f"{last:.3f}", "step": f"{step:g}"}
        result = self._data("/api/v1/query_range", params)["result"]
        return [_series(query.legend, item["metric"], item["values"]) for item in result]

    def close(self) -> None:
        self._client.close()


def _series(legend: str, labels: Mapping[str, str], values: Sequence[Sequence[Any]]) -> Series:
    points = tuple((float(t), float(v)) for t, v in values if math.isfinite(float(v)))
    return Series(queries.legend(legend, labels) or ",".join(f"{k}={v}" for k, v in sorted(labels.items())), points)


def events(series: Sequence[Series], step_s: float, color: str, value_is_time: bool = False) -> list[Event]:
    """Grafana's Prometheus annotations: samples > 0 are events (at the sample's value, in ms, with
    useValueForTime); events at most one step apart merge into a region."""
    found: list[Event] = []
    for one in series:
        times = sorted({value / 1000 if value_is_time else t for t, value in one.points if value > 0})
        current: Event | None = None
        for t in times:
            if current is not None and current.end + step_s >= t:
                current = Event(color, current.start, t)
                continue
            if current is not None:
                found.append(current)
            current = Event(color, t, t)
        if current is not None:
            found.append(current)
    return found


# --- formatting --------------------------------------------------------------------------------------------------
def _binary(value: float, suffix: str = "") -> str:
    for name, size in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if abs(value) >= size:
            return f"{value / size:.3g} {name}{suffix}"
    return f"{value:.3g} B{suffix}"


def _duration(value: float) -> str:
    if abs(value) >= 3600:
        return f"{value / 3600:.3g} h"
    if abs(value) >= 60:
        return f"{value / 60:.3g} min"
    return f"{value:.3g} s" if abs(value) >= 1 or value == 0 else f"{value * 1000:.3g} ms"


def _short(value: float) -> str:
    if float(value).is_integer():
        return f"{value:g}"
    for name, size in (("M", 1e6), ("k", 1e3)):
        if abs(value) >= size:
            return f"{value / size:.3g}{name}"
    return f"{value:.3g}"


def format_value(value: float, unit: str, now: float) -> str:
    """A value in one of the Grafana units the dashboard uses (others read as `short`)."""
    if unit == "dateTimeFromNow":
        return f"{max(0.0, now - value / 1000):.0f} s ago"
    formats: dict[str, Callable[[float], str]] = {
        "percentunit": lambda v: f"{v * 100:.3g}%",
        "bytes": _binary,
        "Bps": lambda v: _binary(v, "/s"),
        "s": _duration,
        "celsius": lambda v: f"{v:.3g} °C",
        "ops": lambda v: f"{v:.3g} ops/s",
        "none": lambda v: f"{v:g}",
    }
    return formats.get(unit, _short)(value)


def _color(name: str) -> str:
    return NAMED_COLORS.get(name, name)


def _nice_ticks(low: float, high: float, count: int = 4) -> list[float]:
    raw = (high - low) / count
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)
    first = math.ceil(low / step) * step
    return [first + i * step for i in range(count + 2) if first + i * step <= high + 1e-9 * step]


def _time_ticks(start: float, end: float, width: float) -> list[int]:
    most = max(2, int(width // 70))  # an HH:MM:SS label needs about 70 px
    step = next((s for s in (5, 10, 15, 30, 60, 120, 300, 600, 1800, 3600) if (end - start) / s <= most), 7200)
    return list(range(math.ceil(start / step) * step, int(end) + 1, step))


def _clock(t: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t))


# --- drawing -------------------------------------------------------------------------------------------------------
def _defaults(panel: Mapping[str, Any]) -> Mapping[str, Any]:
    defaults: Mapping[str, Any] = panel.get("fieldConfig", {}).get("defaults", {})
    return defaults


def _step_color(panel: Mapping[str, Any], value: float) -> str:
    color = "green"
    for step in _defaults(panel).get("thresholds", {}).get("steps", []):
        if step["value"] is None or value >= step["value"]:
            color = step["color"]
    return _color(color)


def _mapped(panel: Mapping[str, Any], value: float) -> tuple[str, str] | None:
    key = f"{value:g}"
    for mapping in _defaults(panel).get("mappings", []):
        result = mapping.get("options", {}).get(key)
        if result is not None:
            return result.get("text", key), _color(result.get("color", "green"))
    return None


def _legend_html(series: Sequence[Series]) -> str:
    items = [
        f'<span class="key"><i style="background:{PALETTE[i % len(PALETTE)]}"></i>{html.escape(s.name)}</span>'
        for i, s in enumerate(series)
    ]
    return f'<div class="legend">{"".join(items)}</div>'


def _typical_gap(points: Sequence[tuple[float, float]]) -> float:
    gaps = sorted(b[0] - a[0] for a, b in itertools.pairwise(points))
    return gaps[len(gaps) // 2] if gaps else 1.0


def _runs(points: Sequence[tuple[float, float]], max_gap: float) -> list[list[tuple[float, float]]]:
    """Consecutive samples; a missing stretch (absent series, NaN) breaks the line as Grafana does."""
    runs: list[list[tuple[float, float]]] = []
    for point in points:
        if runs and point[0] - runs[-1][-1][0] <= max_gap:
            runs[-1].append(point)
        else:
            runs.append([point])
    return runs


def _path(run: Sequence[tuple[float, float]], stepped: bool) -> list[tuple[float, float]]:
    if not stepped:
        return list(run)
    coords: list[tuple[float, float]] = []
    for point in run:
        if coords:
            coords.append((point[0], coords[-1][1]))
        coords.append(point)
    return coords


def _y_range(defaults: Mapping[str, Any], values: Sequence[float], dashed: bool) -> tuple[float, float]:
    thresholds = [s["value"] for s in defaults.get("thresholds", {}).get("steps", []) if s["value"] is not None]
    shown = list(values) + (thresholds if dashed else [])
    low = float(defaults.get("min", min(shown, default=0.0)))
    high = float(defaults.get("max", max(shown, default=1.0)))
    if high <= low:
        high = low + (abs(low) or 1.0)
    return low, high


def _timeseries_svg(
    panel: Mapping[str, Any],
    series: Sequence[Series],
    marks: Sequence[Event],
    window: tuple[float, float],
    size: tuple[int, int],
) -> str:
    (start, end), (width, height) = window, size
    defaults = _defaults(panel)
    unit = defaults.get("unit", "short")
    custom = defaults.get("custom", {})
    stepped = custom.get("lineInterpolation") == "stepAfter"
    dashed = custom.get("thresholdsStyle", {}).get("mode") == "dashed"
    low, high = _y_range(defaults, [v for s in series for _, v in s.points], dashed)
    left, right, top, bottom = 64, 8, 6, 20
    plot_w, plot_h = width - left - right, height - top - bottom

    def x(t: float) -> float:
        return left + (t - start) / (end - start) * plot_w

    def y(v: float) -> float:
        return top + (1 - (min(max(v, low), high) - low) / (high - low)) * plot_h

    parts = [f'<svg width="{width}" height="{height}" xmlns="http://www.w3.org/2000/svg">']
    for tick in _nice_ticks(low, high):
        parts.append(f'<line x1="{left}" x2="{width - right}" y1="{y(tick):.1f}" y2="{y(tick):.1f}" class="grid"/>')
        label = html.escape(format_value(tick, unit, end))
        parts.append(f'<text x="{left - 4}" y="{y(tick) + 4:.1f}" class="axis" text-anchor="end">{label}</text>')
    parts.extend(
        f'<text x="{x(tick):.1f}" y="{height - 5}" class="axis" text-anchor="middle">{_clock(tick)}</text>'
        for tick in _time_ticks(start, end, plot_w)
    )
    for mark in marks:
        if not start <= mark.start <= end:
            continue
        color = _color(mark.color)
        if mark.end > mark.start:
            region = max(1.0, x(min(mark.end, end)) - x(mark.start))
            parts.append(
                f'<rect x="{x(mark.start):.1f}" y="{top}" width="{region:.1f}" height="{plot_h}" '
                f'fill="{color}" opacity="0.08"/>'
            )
        parts.append(
            f'<line x1="{x(mark.start):.1f}" x2="{x(mark.start):.1f}" y1="{top}" y2="{top + plot_h}" '
            f'stroke="{color}" stroke-dasharray="3 3"/>'
        )
    if dashed:
        for step in defaults.get("thresholds", {}).get("steps", []):
            if step["value"] is not None and low <= step["value"] <= high:
                level = y(step["value"])
                parts.append(
                    f'<line x1="{left}" x2="{width - right}" y1="{level:.1f}" y2="{level:.1f}" '
                    f'stroke="{_color(step["color"])}" stroke-dasharray="6 4" opacity="0.7"/>'
                )
    for index, one in reversed(list(enumerate(series))):
        color = PALETTE[index % len(PALETTE)]
        for run in _runs(one.points, 1.5 * _typical_gap(one.points)):
            coords = _path(run, stepped)
            path = " ".join(f"{x(t):.1f},{y(v):.1f}" for t, v in coords)
            parts.append(f'<polyline points="{path}" fill="none" stroke="{color}" stroke-width="1.5"/>')
    parts.append("</svg>")
    return "".join(parts)


def _stat_html(panel: Mapping[str, Any], series: Sequence[Series], now: float, size: tuple[int, int]) -> str:
    defaults = _defaults(panel)
    options = panel.get("options", {})
    by_name = options.get("textMode") == "name"
    if not series:
        return f'<div class="stat"><div class="value">{html.escape(defaults.get("noValue", "No data"))}</div></div>'
    shown = []
    for one in series:
        value = one.points[-1][1]
        mapped = _mapped(panel, value)
        text, color = mapped if mapped else (format_value(value, defaults.get("unit", "short"), now), "")
        shown.append((one.name, one.name if by_name else text, color or _step_color(panel, value)))
    cell_width = (size[0] - 16) / len(shown) - 4
    longest = max(len(text) for _, text, _ in shown)
    # About 0.8 em per character of a bold sans-serif face's wide letters, plus a margin of an em.
    font = int(max(11, min(34, size[1] / 3, cell_width / (0.8 * longest + 1))))
    cells = []
    for name, text, color in shown:
        background = color if options.get("colorMode") == "background" else "transparent"
        foreground = "#ffffff" if background != "transparent" else color
        caption = "" if by_name else f'<div class="caption">{html.escape(name)}</div>'
        cells.append(
            f'<div class="cell" style="background:{background};color:{foreground}">'
            f'<div class="value" style="font-size:{font}px">{html.escape(text)}</div>{caption}</div>'
        )
    return f'<div class="stat">{"".join(cells)}</div>'


def _timeline_svg(panel: Mapping[str, Any], series: Sequence[Series], window: tuple[float, float], width: int) -> str:
    start, end = window
    label_w, row_h = 200, 15
    height = max(row_h, row_h * len(series)) + 20
    span = width - label_w - 8
    parts = [f'<svg width="{width}" height="{height}" xmlns="http://www.w3.org/2000/svg">']
    for index, one in enumerate(sorted(series, key=lambda one: one.name)):
        top = index * row_h
        name = html.escape(one.name)
        parts.append(f'<text x="{label_w - 6}" y="{top + 12}" class="axis" text-anchor="end">{name}</text>')
        for run in _runs(one.points, 1.5 * _typical_gap(one.points)):
            color = (_mapped(panel, run[0][1]) or ("", NAMED_COLORS["blue"]))[1]
            x0 = label_w + (run[0][0] - start) / (end - start) * span
            x1 = label_w + (run[-1][0] - start) / (end - start) * span
            parts.append(
                f'<rect x="{x0:.1f}" y="{top + 2}" width="{max(2.0, x1 - x0):.1f}" height="{row_h - 4}" '
                f'fill="{color}" opacity="0.85"/>'
            )
    for tick in _time_ticks(start, end, span):
        tx = label_w + (tick - start) / (end - start) * span
        parts.append(f'<text x="{tx:.1f}" y="{height - 4}" class="axis" text-anchor="middle">{_clock(tick)}</text>')
    parts.append("</svg>")
    return "".join(parts)


def _panel_body(
    panel: Mapping[str, Any],
    series: Sequence[Series],
    marks: Sequence[Event],
    window: tuple[float, float],
    size: tuple[int, int],
) -> str:
    width, height = size
    if panel["type"] == "stat":
        return _stat_html(panel, series, window[1], size)
    if panel["type"] == "state-timeline":
        return _timeline_svg(panel, series, window, width - 2)
    legend_h = 44 if series else 0
    chart = _timeseries_svg(panel, series, marks, window, (width - 2, height - 26 - legend_h))
    return chart + (_legend_html(series) if series else "")


# Unsmoothed chart lines: the committed picture stays under ~400 KB (smoothed ones made it ~500 KB) and a
# 1.5-pixel line reads the same either way.
STYLE = f"""
body {{ margin:0; background:{BACKGROUND}; color:{TEXT}; font-family: "DejaVu Sans", Arial, sans-serif; }}
.top {{ height:{HEADER - 8}px; padding:4px {MARGIN}px; display:flex; align-items:center; gap:18px; font-size:13px; }}
.top b {{ font-size:17px; white-space:nowrap; }} .top .note {{ color:{MUTED}; margin-left:auto; }}
.var {{ background:{PANEL_BACKGROUND}; border:1px solid {BORDER}; padding:3px 8px; border-radius:2px; }}
.panel {{ position:absolute; background:{PANEL_BACKGROUND}; border:1px solid {BORDER}; border-radius:2px;
  box-sizing:border-box; overflow:hidden; }}
.panel h3 {{ margin:0; padding:5px 8px 2px; font-size:12.5px; font-weight:600; white-space:nowrap; }}
.row {{ position:absolute; font-size:15px; font-weight:600; }}
.grid {{ stroke:{BORDER}; stroke-width:1; }} .axis {{ fill:{MUTED}; font-size:10px; }}
.legend {{ padding:0 8px; font-size:10.5px; color:{MUTED}; line-height:14px; max-height:42px; overflow:hidden; }}
.key {{ margin-right:10px; white-space:nowrap; }}
.key i {{ display:inline-block; width:10px; height:3px; margin-right:4px; vertical-align:middle; }}
.stat {{ display:flex; gap:4px; padding:4px 8px; height:calc(100% - 34px); box-sizing:border-box; }}
.cell {{ flex:1; display:flex; flex-direction:column; justify-content:center; align-items:center; border-radius:2px;
  min-width:0; }}
.value {{ font-weight:600; white-space:nowrap; overflow:hidden; text-overflow:ellipsis; max-width:100%; }}
.caption {{ font-size:10.5px; opacity:0.85; white-space:nowrap; overflow:hidden; max-width:100%; }}
svg * {{ shape-rendering:crispEdges; }}
"""


def page(
    dashboard: Mapping[str, Any],
    data: Mapping[int, Sequence[Series]],
    marks: Sequence[Event],
    window: tuple[float, float],
) -> tuple[str, int]:
    """The HTML page and its height in pixels."""
    column = (PAGE_WIDTH - MARGIN) / 24
    body = []
    bottom = 0
    for panel in dashboard["panels"]:
        grid = panel["gridPos"]
        left = MARGIN + grid["x"] * column
        top = HEADER + grid["y"] * (CELL_HEIGHT + MARGIN)
        width = int(grid["w"] * column - MARGIN)
        height = grid["h"] * CELL_HEIGHT + (grid["h"] - 1) * MARGIN
        bottom = max(bottom, int(top + height))
        if panel["type"] == "row":
            body.append(f'<div class="row" style="left:{left}px;top:{top + 6}px">{html.escape(panel["title"])}</div>')
            continue
        inner = _panel_body(panel, data.get(panel["id"], []), marks, window, (width, height))
        body.append(
            f'<div class="panel" style="left:{left:.1f}px;top:{top}px;width:{width}px;height:{height}px">'
            f"<h3>{html.escape(panel['title'])}</h3>{inner}</div>"
        )
    variables = "".join(
        f'<span class="var">{html.escape(v.get("label", v["name"]))}: All</span>'
        for v in dashboard["templating"]["list"]
        if v["type"] == "query"
    )
    header = (
        f'<div class="top"><b>{html.escape(dashboard["title"])}</b>{variables}'
        '<span class="note">grafana/render.py: the dashboard\'s queries on a live Prometheus, simulated vLLM. '
        "Annotations: orange paused, red restart, purple failed action</span></div>"
    )
    height = bottom + MARGIN
    document = (
        f"<!doctype html><html><head><meta charset='utf-8'><style>{STYLE}</style></head>"
        f'<body><div style="position:relative;height:{height}px">{header}{"".join(body)}</div></body></html>'
    )
    return document, height


def collect(
    prometheus_url: str, dashboard: Mapping[str, Any], window: tuple[float, float], step_s: float
) -> tuple[dict[int, list[Series]], list[Event]]:
    """Each panel's series and the annotations' events, from the dashboard's own queries."""
    start, end = window
    values = all_values(dashboard, rate_interval(step_s, 1.0), window)
    prometheus = Prometheus(prometheus_url)
    try:
        data: dict[int, list[Series]] = {}
        for query in queries.panel_queries(dashboard):
            found = prometheus.run(query, queries.substitute(query.expr, values), start, end, step_s)
            data.setdefault(query.panel_id or 0, []).extend(found)
        marks: list[Event] = []
        colors = [a["iconColor"] for a in dashboard["annotations"]["list"] if a["datasource"]["type"] == "prometheus"]
        for query, color in zip(queries.annotation_queries(dashboard), colors, strict=True):
            found = prometheus.run(query, queries.substitute(query.expr, values), start, end, step_s)
            step = queries.duration_seconds(query.interval) if query.interval else step_s
            marks.extend(events(found, step, color, query.value_is_time))
        return data, marks
    finally:
        prometheus.close()


def screenshot(html_path: Path, png_path: Path, size: tuple[int, int], profile: Path) -> None:
    command = [
        CHROMIUM,
        *("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run"),
        *("--disable-background-networking", "--disable-component-update", "--disable-sync", "--hide-scrollbars"),
        f"--user-data-dir={profile}",
        f"--window-size={size[0]},{size[1]}",
        f"--screenshot={png_path}",
        html_path.resolve().as_uri(),
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)  # noqa: S603
    if result.returncode != 0 or not png_path.exists():
        raise RuntimeError(f"chromium failed ({result.returncode}): {result.stderr[-2000:]}")


def render_png(
    prometheus_url: str,
    dashboard: Mapping[str, Any],
    window: tuple[float, float],
    png_path: Path,
    *,
    workdir: Path,
    step_s: float = 1.0,
) -> Path:
    """Query, draw, screenshot; returns the HTML page it wrote into `workdir` (beside Chromium's profile)."""
    data, marks = collect(prometheus_url, dashboard, window, step_s)
    document, height = page(dashboard, data, marks, window)
    workdir.mkdir(parents=True, exist_ok=True)
    html_path = workdir / "dashboard.html"
    html_path.write_text(document, encoding="utf-8")
    png_path.parent.mkdir(parents=True, exist_ok=True)
    screenshot(html_path, png_path, (PAGE_WIDTH, height), workdir / "chromium-profile")
    return html_path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prometheus", required=True, help="base URL of the Prometheus to query")
    parser.add_argument("--start", type=float, required=True, help="Unix time the picture starts")
    parser.add_argument("--end", type=float, default=None, help="Unix time it ends (default: now)")
    parser.add_argument("--step", type=float, default=1.0, help="range-query step in seconds")
    parser.add_argument("--png", type=Path, required=True)
    parser.add_argument("--workdir", type=Path, default=Path("grafana-render"), help="for the page and Chromium")
    args = parser.parse_args(argv)
    end = args.end if args.end is not None else time.time()
    render_png(args.prometheus, load_dashboard(), (args.start, end), args.png, workdir=args.workdir, step_s=args.step)
    print(f"wrote {args.png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
