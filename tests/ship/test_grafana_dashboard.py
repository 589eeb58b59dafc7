"""The shipped Grafana dashboard (grafana/vllm-sidecar.json).

Offline: it is what grafana/generate.py writes; it validates against Grafana's own dashboard schema (generated from
@grafana/schema, see grafana/schema/README.md); every metric the sidecar exports has a panel; every selector honours
the template variables; units fit the metrics.

Live: a real Prometheus scrapes two real sidecar daemons and two simulated vLLM servers (new and old metric names)
under load, through a failed and a successful restart (tests/ship/dashboard_stack.py). Every panel, annotation and
variable query of the JSON file, variables substituted the way Grafana does, must return data, with everything on
"All" and with one model, engine and GPU chosen; then the dashboard is drawn and screenshotted with Chromium.
"""

from __future__ import annotations

import copy
import json
import math
import re
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from grafana import generate, queries, render
from grafana.queries import DashboardQuery, QueryKind
from sidecar.exporter import names
from tests.conftest import required_in_ci

from .dashboard_stack import NEW_MODEL, OLD_MODEL, SCRAPE_INTERVAL_S, XID, DashboardStack
from .prometheus_server import PrometheusServer, prometheus_missing

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD_PATH = ROOT / "grafana" / "vllm-sidecar.json"
SCHEMA_PATH = ROOT / "grafana" / "schema" / "dashboard.schema.json"
METRICS_DOC = ROOT / "docs" / "metrics.md"  # the metric table the README links to
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
STEP_S = 1.0
# Grafana's built-in variables as a dashboard over the last 3 hours would have them, for the offline checks.
BUILTINS = {"__rate_interval": "1m", "__range": "10800s"}

# Grafana's TypeScript type gives a data source's annotation query no place of its own (its comments: "TODO..
# this should just be a normal query target"; limit/matchAny/tags/type are "only required/valid for the grafana
# datasource"), so the generated schema rejects every Prometheus annotation. These are the fields Grafana's
# Prometheus data source reads there (target.expr/interval/refId; titleFormat, textFormat, tagKeys,
# useValueForTime beside it). Everything else is validated against the generated schema as it is.
PROMETHEUS_ANNOTATION_FIELDS: dict[str, dict[str, Any]] = {
    "AnnotationQuery": {
        "titleFormat": {"type": "string"},
        "textFormat": {"type": "string"},
        "tagKeys": {"type": "string"},
        "useValueForTime": {"type": "boolean"},
    },
    "AnnotationTarget": {
        "expr": {"type": "string"},
        "interval": {"type": "string"},
        "refId": {"type": "string"},
    },
}


def _dashboard() -> dict[str, Any]:
    document: dict[str, Any] = json.loads(DASHBOARD_PATH.read_text(encoding="utf-8"))
    return document


def _validator() -> jsonschema.Draft7Validator:
    schema = json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))
    for definition, properties in PROMETHEUS_ANNOTATION_FIELDS.items():
        schema["definitions"][definition]["properties"].update(properties)
    del schema["definitions"]["AnnotationTarget"]["required"]
    jsonschema.Draft7Validator.check_schema(schema)
    return jsonschema.Draft7Validator(schema)


def _errors(document: dict[str, Any]) -> list[str]:
    found = []
    for error in _validator().iter_errors(document):
        # A panel error is reported as "not valid under any of" Panel | RowPanel; the detail is in the context.
        details = [f"{list(sub.absolute_path)}: {sub.message}" for sub in error.context or []]
        found.append(f"{list(error.absolute_path)}: {error.message} {details}")
    return found


def _all_queries(dashboard: dict[str, Any]) -> list[DashboardQuery]:
    return queries.panel_queries(dashboard) + queries.annotation_queries(dashboard)


def _exported_series() -> set[str]:
    return {generate.series(spec) for spec in (*names.ALL, *names.POLICY)}


# --- offline ------------------------------------------------------------------------------------------------------
def test_the_committed_dashboard_is_what_the_generator_writes() -> None:
    assert DASHBOARD_PATH.read_text(encoding="utf-8") == generate.render(), "run `python grafana/generate.py`"


def test_the_dashboard_validates_against_grafanas_schema() -> None:
    assert _errors(_dashboard()) == []


def _set(document: dict[str, Any], path: tuple[str | int, ...], value: Any) -> None:
    node: Any = document
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (("panels", 1, "gridPos", "w"), "wide"),
        (("panels", 1, "gridPoss"), {"h": 4, "w": 4, "x": 0, "y": 1}),
        (("schemaVersion",), "39"),
        (("templating", "list", 1, "refresh"), 5),
        (("annotations", "list", 1, "target", "exprr"), "up"),
        (("annotations", "list", 1, "titleFormat"), 1),
    ],
    ids=["width-as-text", "misspelt-key", "version-as-text", "refresh-not-in-enum", "misspelt-target", "title-type"],
)
def test_the_schema_rejects_a_broken_dashboard(path: tuple[str | int, ...], value: Any) -> None:
    broken = copy.deepcopy(_dashboard())
    _set(broken, path, value)
    assert _errors(broken), f"setting {path} to {value!r} went unnoticed"


def test_it_imports_into_current_grafana() -> None:
    dashboard = _dashboard()
    assert 39 <= dashboard["schemaVersion"] <= 41
    assert "__inputs" not in dashboard
    assert "__requires" not in dashboard
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for name in ("instance", "model_name", "engine", "gpu"):
        assert variables[name]["type"] == "query"
        assert variables[name]["multi"], name
        assert variables[name]["includeAll"], name
        assert variables[name]["datasource"] == DATASOURCE
        assert variables[name]["query"].startswith("label_values("), name
    for panel in queries.panels(dashboard):
        assert panel["datasource"] == DATASOURCE, panel["title"]
        assert panel["fieldConfig"]["defaults"].get("unit"), f"{panel['title']}: no unit"
        for target in panel["targets"]:
            assert target["datasource"] == DATASOURCE, panel["title"]
    for annotation in dashboard["annotations"]["list"][1:]:
        assert annotation["datasource"] == DATASOURCE
    rows = [panel["title"] for panel in dashboard["panels"] if panel["type"] == "row"]
    assert rows == [
        "Overview: admission and policy",
        "KV cache",
        "GPU memory",
        "PyTorch allocator (allocator probe)",
        "vLLM engine",
        "vLLM's own admission: shedding, queue reasons, fault tolerance",
        "Remediations and incidents",
        "Sidecar self",
    ]


def test_the_preemption_threshold_drawn_is_the_policys() -> None:
    from sidecar.policy.settings import PolicySettings

    (panel,) = [p for p in queries.panels(_dashboard()) if p["title"] == "Preemptions"]
    steps = panel["fieldConfig"]["defaults"]["thresholds"]["steps"]
    assert [step["value"] for step in steps] == [None, PolicySettings().preemptions_per_s]


def test_panels_tile_the_grid_without_overlapping() -> None:
    taken: dict[tuple[int, int], str] = {}
    for panel in _dashboard()["panels"]:
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
        for x in range(grid["x"], grid["x"] + grid["w"]):
            for y in range(grid["y"], grid["y"] + grid["h"]):
                assert (x, y) not in taken, f"{panel['title']} overlaps {taken[(x, y)]}"
                taken[(x, y)] = panel["title"]


def _read_metrics(dashboard: dict[str, Any]) -> set[str]:
    values = {v.name: ".*" for v in queries.variable_queries(dashboard)} | BUILTINS
    return {
        name
        for query in queries.panel_queries(dashboard)
        for name in queries.metric_names(queries.substitute(query.expr, values))
    }


def test_every_exported_metric_has_a_panel() -> None:
    missing = _exported_series() - _read_metrics(_dashboard())
    assert not missing, f"no panel reads {sorted(missing)}: add one to grafana/generate.py"


def test_every_metric_the_docs_document_has_a_panel() -> None:
    section = METRICS_DOC.read_text(encoding="utf-8").split("\n## Metrics\n", 1)[1].split("\n## ", 1)[0]
    documented = set(re.findall(r"^\| `(vllm_sidecar_[a-z0-9_]+)", section, flags=re.MULTILINE))
    assert len(documented) >= len(names.ALL), "the metric table of docs/metrics.md was not found"
    assert documented <= _read_metrics(_dashboard())


def test_the_old_and_new_vllm_kv_usage_names_are_both_read() -> None:
    read = _read_metrics(_dashboard())
    assert {"vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"} <= read
    for histogram in ("vllm:time_to_first_token_seconds_bucket", "vllm:e2e_request_latency_seconds_bucket"):
        assert histogram in read


# Label -> the variable whose value a matcher on it must use.
_VARIABLE_OF_LABEL = {"instance": "$instance", "model_name": "$model_name", "engine": "$engine", "gpu": "$gpu"}
# Substituting each variable by itself keeps `$name` in the parsed matchers, where the check below looks for it.
_KEEP = {name.lstrip("$"): name for name in _VARIABLE_OF_LABEL.values()}


def test_every_selector_honours_the_template_variables() -> None:
    specs = {generate.series(spec): spec for spec in (*names.ALL, *names.POLICY)}
    dashboard = _dashboard()
    for query in _all_queries(dashboard):
        for selector in queries.selectors(queries.substitute(query.expr, BUILTINS | _KEEP)):
            present = queries.matchers(selector)
            name = selector.name or present.get("__name__", "")
            if name in specs:
                wanted = {"instance", *(label for label in specs[name].labels if label in _VARIABLE_OF_LABEL)}
            elif name.startswith("vllm:"):
                wanted = {"model_name", "engine"}
            elif name == "up":
                wanted = {"instance"}
            else:
                raise AssertionError(f"{query.where}: reads {name!r}, neither the sidecar's nor vLLM's")
            for label in wanted:
                assert _VARIABLE_OF_LABEL[label] in present.get(label, ""), f"{query.where}: {name} ignores ${label}"


# Metric-name suffix -> the units a panel reading it may use.
_UNITS = (
    ("_timestamp_seconds", {"s", "dateTimeFromNow"}),
    ("_bytes_per_second", {"Bps"}),
    ("_bytes", {"bytes"}),
    ("_ratio", {"percentunit"}),
    ("_perc", {"percentunit"}),
    ("_seconds_bucket", {"s"}),
    ("_seconds", {"s"}),
    ("_celsius", {"celsius"}),
)


def test_units_fit_the_metrics() -> None:
    values = {v.name: ".*" for v in queries.variable_queries(_dashboard())} | BUILTINS
    for panel in queries.panels(_dashboard()):
        unit = panel["fieldConfig"]["defaults"]["unit"]
        for target in panel["targets"]:
            for name in queries.metric_names(queries.substitute(target["expr"], values)):
                allowed = next((units for suffix, units in _UNITS if name.endswith(suffix)), None)
                assert allowed is None or unit in allowed, f"{panel['title']}: {name} shown in {unit}"


# --- live -----------------------------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Live:
    prometheus: PrometheusServer
    start: float
    end: float


def _require(missing: str | None) -> None:
    if missing is None:
        return
    if required_in_ci():
        pytest.fail(f"required in CI (CI=true): {missing}", pytrace=False)
    pytest.skip(missing)


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    _require(prometheus_missing())
    stack = DashboardStack(tmp_path_factory.mktemp("dashboard-stack"))
    try:
        prometheus = stack.start()
        stack.exercise()
        # The window ends where every state the dashboard shows was in Prometheus at once.
        yield Live(prometheus, prometheus.started_at, stack.wait_complete(timeout_s=75))
    finally:
        stack.stop()


def _run(live: Live, query: DashboardQuery, values: dict[str, str]) -> list[dict[str, Any]]:
    expr = queries.substitute(query.expr, values)
    queries.selectors(expr)  # it must parse as PromQL once substituted, as Grafana sends it
    if query.kind is QueryKind.INSTANT:
        return live.prometheus.query(expr, at=live.end)
    step = queries.duration_seconds(query.interval) if query.interval else STEP_S
    start, end = queries.aligned(live.start, live.end, step)
    return live.prometheus.query_range(expr, start, end, step)


def _numbers(result: list[dict[str, Any]]) -> list[float]:
    samples = [item["value"] for item in result if "value" in item]
    samples += [sample for item in result for sample in item.get("values", [])]
    return [float(value) for _, value in samples if math.isfinite(float(value))]


def _missing_data(live: Live, values: dict[str, str]) -> list[str]:
    missing = []
    for query in _all_queries(_dashboard()):
        numbers = _numbers(_run(live, query, values))
        # An annotation is drawn only where a sample is above 0; a panel needs one number at least.
        if not numbers or (query.kind is QueryKind.ANNOTATION and max(numbers) <= 0):
            missing.append(f"{query.where}: {queries.substitute(query.expr, values)}")
    return missing


def _everything(live: Live, dashboard: dict[str, Any]) -> dict[str, str]:
    return render.all_values(dashboard, render.rate_interval(STEP_S, SCRAPE_INTERVAL_S), (live.start, live.end))


def test_every_query_returns_data_with_everything_selected(live: Live) -> None:
    assert _missing_data(live, _everything(live, _dashboard())) == []


def _options(live: Live, variable: queries.VariableQuery, chosen: dict[str, str]) -> list[str]:
    """A variable's options as Grafana resolves them: the variables before it substituted in its selector."""
    labels = live.prometheus.series(queries.substitute(variable.selector, chosen), live.start, live.end)
    return sorted({series[variable.label] for series in labels if variable.label in series})


def test_the_variables_list_the_deployment(live: Live) -> None:
    dashboard = _dashboard()
    everything = _everything(live, dashboard)
    options = {variable.name: _options(live, variable, everything) for variable in queries.variable_queries(dashboard)}
    assert len(options["instance"]) == 2, options
    assert options["model_name"] == sorted([NEW_MODEL, OLD_MODEL])
    assert options["engine"] == ["0"]
    assert options["gpu"] == ["0"]


def test_every_query_returns_data_for_one_model_engine_and_gpu(live: Live) -> None:
    dashboard = _dashboard()
    values = _everything(live, dashboard)
    for variable in queries.variable_queries(dashboard):
        options = _options(live, variable, values)
        assert options, f"${variable.name} has no options"
        # Both sidecars (as Grafana writes a multi-value selection), the new-schema model, the first of the rest.
        chosen = {"instance": options, "model_name": [NEW_MODEL]}.get(variable.name, options[:1])
        values[variable.name] = queries.regex_value(chosen)
    assert _missing_data(live, values) == []
    for query in _all_queries(dashboard):
        for item in _run(live, query, values):
            labels = item["metric"]
            assert labels.get("model_name", NEW_MODEL) == NEW_MODEL, f"{query.where} ignores the model: {labels}"
            assert labels.get("engine", "0") == "0", f"{query.where} ignores the engine: {labels}"


def test_vllm_panels_read_old_and_new_vllm_metric_names(live: Live) -> None:
    values = _everything(live, _dashboard())
    for query in queries.panel_queries(_dashboard()):
        if "vllm:" not in query.expr:
            continue
        models = {item["metric"].get("model_name") for item in _run(live, query, values) if _numbers([item])}
        assert {NEW_MODEL, OLD_MODEL} <= models, f"{query.where}: data only for {models}"


def _panel_results(live: Live, title: str) -> list[dict[str, Any]]:
    dashboard = _dashboard()
    wanted = [q for q in queries.panel_queries(dashboard) if q.where.split(" ", 2)[2].startswith(repr(title))]
    assert wanted, f"no panel {title!r}"
    return [item for query in wanted for item in _run(live, query, _everything(live, dashboard))]


def _peak(results: list[dict[str, Any]], **labels: str) -> float:
    chosen = [item for item in results if labels.items() <= item["metric"].items()]
    return max(_numbers(chosen), default=float("nan"))


def test_the_panels_show_what_happened(live: Live) -> None:
    """Not only data, the right data: what the stack did shows where an on-call engineer looks for it."""
    assert _peak(_panel_results(live, "Restarts by reason"), reason="manual") >= 0.9
    assert _peak(_panel_results(live, "Restarts by reason"), reason="engine_hung") == 0
    assert _peak(_panel_results(live, "Actions taken and failed"), action="restart") >= 0.9
    raw = live.prometheus.query_range("vllm_sidecar_gpu_xid_errors_total", live.start, live.end, STEP_S)
    assert _peak(_panel_results(live, "Xid errors")) >= 0.9, f"the counter as scraped: {raw}"
    assert _peak(_panel_results(live, "Last Xid")) == XID
    assert _peak(_panel_results(live, "Time to OOM (soonest GPU)")) > 0
    waiting = _panel_results(live, "Waiting: for capacity or deferred")
    assert _peak(waiting, model_name=NEW_MODEL, reason="capacity") >= 1, "2 of 12 clients wait for a batch slot"
    assert _peak(waiting, model_name=NEW_MODEL, reason="deferred") == 0
    assert _peak(waiting, model_name=OLD_MODEL, reason="all") >= 0, "vLLM 0.6 does not split its queue"
    assert _peak(_panel_results(live, "Engine held unhealthy (fault tolerance)"), model_name=NEW_MODEL) == 0
    assert _peak(_panel_results(live, "Refused over the window"), model_name=NEW_MODEL) == 0
    kv = _panel_results(live, "KV-cache usage")
    assert _peak(kv, model_name=NEW_MODEL) > 0.5, "the load fills the small KV cache"
    for title in ("Time to first token", "End-to-end request latency"):
        assert 0 < _peak(_panel_results(live, title), model_name=NEW_MODEL) < 60, title
    dashboard = _dashboard()
    annotations = {
        q.where: _numbers(_run(live, q, _everything(live, dashboard))) for q in queries.annotation_queries(dashboard)
    }
    restart_times = annotations["annotation 'vLLM restarts'"]
    assert restart_times, "the restart annotation has an event"
    assert all(live.start <= t / 1000 <= live.end for t in restart_times), "at the restart, inside the window"


def _png_size(path: Path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    width, height = struct.unpack(">II", head[16:24])
    return int(width), int(height)


def test_the_dashboard_draws(live: Live, tmp_path: Path) -> None:
    _require(render.chromium_missing())
    png = tmp_path / "dashboard.png"
    page = render.render_png(
        live.prometheus.url, _dashboard(), (live.start, live.end), png, workdir=tmp_path / "render"
    )
    width, height = _png_size(png)
    assert width == render.PAGE_WIDTH
    assert height > 2000, "every row of the dashboard is on the page"
    assert png.stat().st_size > 50_000, "a page with nothing drawn compresses to a few kilobytes"
    html = page.read_text(encoding="utf-8")
    assert "No data" not in html, "a panel was drawn empty"
    assert html.count("<polyline") > 40, "time series are drawn as lines"
    for forbidden in ("<script", "http://", "https://"):
        assert forbidden not in html.replace('xmlns="http://www.w3.org/2000/svg"', ""), forbidden
