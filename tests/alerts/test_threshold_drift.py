"""One source for each default: every shipped threshold that shows a default of the policy or the derivation
equals that default, as `PolicySettings` and `DeriveSettings` hold it.

Reads the shipped files themselves (the rules file, the PrometheusRule, the dashboard JSON, the runbooks, the
README's settings table), not their generators: a file edited by hand, or a default changed without regenerating,
fails here with the file, the place and both numbers.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from sidecar.derive.settings import DeriveSettings
from sidecar.policy.settings import PolicySettings
from sidecar.shell.acting_setup import policy_settings
from sidecar.shell.settings import ENV_PREFIX, Settings, core_values

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "alerts" / "vllm-sidecar.rules.yml"
PROMETHEUS_RULE = ROOT / "alerts" / "vllm-sidecar.prometheusrule.yaml"
DASHBOARD = ROOT / "grafana" / "vllm-sidecar.json"
RUNBOOKS = ROOT / "docs" / "runbooks.md"
README = ROOT / "README.md"
SETTINGS_DOC = ROOT / "docs" / "settings.md"
POLICY = PolicySettings()
DERIVE = DeriveSettings()

# The settings that set a field of the pure core, by the core's name. Written out here on purpose: a setting that
# lost its link (a literal default instead of `_policy(...)`) would otherwise drop out of the check unnoticed.
POLICY_SETTINGS = {
    "pause_kv_usage": "pause_kv_usage_ratio",
    "resume_kv_usage": "resume_kv_usage_ratio",
    "min_gpu_free": "min_gpu_free_ratio",
    "pause_alloc_retries": "pause_alloc_retries",
    "dead_after": "dead_after_s",
    "down_after": "down_after_s",
    "down_unsupervised_after": "down_unsupervised_after_s",
    "hung_after": "hung_after_s",
    "hung_without_probe_after": "hung_without_probe_after_s",
    "stall_pause_after": "stall_pause_after_s",
    "probe_after": "probe_after_s",
    "probe_timeout": "probe_timeout_s",
    "oom_forecast": "oom_forecast_s",
    "forecast_min_uptime": "min_uptime_for_forecast_restart_s",
    "max_restarts_per_hour": "max_restarts_per_hour",
    "drain_timeout": "drain_timeout_s",
    "startup_timeout": "startup_timeout_s",
    "pressure_restarts": "pressure_events_restart",
}
DERIVE_SETTINGS = {
    "window": "window_s",
    "memory_trend_window": "memory_trend_window_s",
    "min_trend_r2": "min_trend_r2",
    "gpu_memory_utilization": "gpu_memory_utilization",
}


@pytest.fixture(autouse=True)
def _no_settings_in_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Settings built here are the defaults, whatever VLLM_SIDECAR_* the shell running the tests exports."""
    for variable in [name for name in os.environ if name.upper().startswith(ENV_PREFIX)]:
        monkeypatch.delenv(variable)


def _default(name: str) -> Any:
    return Settings.model_fields[name].default


# --- the settings read their defaults from the core, and pass every value on to it ---


def test_each_setting_of_the_core_takes_the_core_default() -> None:
    settings = Settings.model_validate({})
    assert core_values(settings, "policy") == {core: getattr(POLICY, core) for core in POLICY_SETTINGS.values()}
    assert core_values(settings, "derive") == {core: getattr(DERIVE, core) for core in DERIVE_SETTINGS.values()}
    for name, core in POLICY_SETTINGS.items():
        assert _default(name) == getattr(POLICY, core), name
    for name, core in DERIVE_SETTINGS.items():
        assert _default(name) == getattr(DERIVE, core), name


def test_the_daemon_policy_of_the_defaults_is_the_policy_default() -> None:
    built = policy_settings(Settings.model_validate({}))
    assert built == PolicySettings(stale_after_s=built.stale_after_s)


@pytest.mark.parametrize("name", sorted(POLICY_SETTINGS))
def test_each_policy_setting_reaches_the_policy(name: str) -> None:
    """Each flag changes its own field of the policy and no other (the derived mapping, not a hand-written one)."""
    default = _default(name)
    changed: Any
    if isinstance(default, bool):
        changed = not default
    elif name == "resume_kv_usage":
        changed = 0.5
    elif isinstance(default, float) and default <= 1.0:
        changed = default * 0.97
    else:
        changed = default + 1
    built = policy_settings(Settings.model_validate({name: changed}))
    baseline = policy_settings(Settings.model_validate({}))
    core = POLICY_SETTINGS[name]
    assert getattr(built, core) == changed
    differing = {
        field for field in PolicySettings.__dataclass_fields__ if getattr(built, field) != getattr(baseline, field)
    }
    assert differing == {core}


# --- the alert rules ---


def _alerts(path: Path) -> dict[str, dict[str, Any]]:
    document = yaml.safe_load(path.read_text(encoding="utf-8"))
    groups = document["spec"]["groups"] if document.get("kind") == "PrometheusRule" else document["groups"]
    return {rule["alert"]: rule for group in groups for rule in group["rules"] if "alert" in rule}


def _threshold(expr: str, operator: str) -> float:
    match = re.search(rf"{re.escape(operator)}\s*([0-9.]+)\s*$", " ".join(expr.split()))
    assert match is not None, f"no '{operator} NUMBER' at the end of {expr!r}"
    return float(match.group(1))


@pytest.mark.parametrize("path", [RULES, PROMETHEUS_RULE], ids=lambda path: path.name)
def test_alert_rules_show_the_policy_thresholds(path: Path) -> None:
    alerts = _alerts(path)
    near_full = alerts["VllmKvCacheNearFull"]
    assert _threshold(near_full["expr"], ">=") == POLICY.pause_kv_usage_ratio, f"{path.name}: VllmKvCacheNearFull"
    percent = f"{POLICY.pause_kv_usage_ratio * 100:g}%"
    assert percent in near_full["annotations"]["summary"], f"{path.name}: summary does not say {percent}"
    assert percent in near_full["annotations"]["description"], f"{path.name}: description does not say {percent}"
    storm = alerts["VllmPreemptionStorm"]
    assert _threshold(storm["expr"], ">") == POLICY.preemptions_per_s, f"{path.name}: VllmPreemptionStorm"
    assert f"more than {POLICY.preemptions_per_s:g} " in storm["annotations"]["summary"]
    assert "${" not in path.read_text(encoding="utf-8"), f"{path.name}: a placeholder was left unfilled"


# --- the dashboard ---


def _panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for panel in panels:
        yield panel
        yield from _panels(panel.get("panels", []))


def _dashboard_panel(title: str) -> dict[str, Any]:
    document = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    found = [panel for panel in _panels(document["panels"]) if panel.get("title") == title]
    assert len(found) == 1, f"{DASHBOARD.name}: {len(found)} panels titled {title!r}"
    return found[0]


def _steps(title: str) -> list[float | None]:
    panel = _dashboard_panel(title)
    return [step["value"] for step in panel["fieldConfig"]["defaults"]["thresholds"]["steps"]]


def test_dashboard_draws_the_policy_thresholds() -> None:
    assert _steps("KV-cache usage") == [None, POLICY.resume_kv_usage_ratio, POLICY.pause_kv_usage_ratio]
    assert _steps("Preemptions") == [None, POLICY.preemptions_per_s]
    assert _steps("Engine stalled") == [None, POLICY.hung_after_s]
    assert _steps("Time to OOM") == [None, POLICY.oom_forecast_s]
    assert _steps("Time to OOM (soonest GPU)")[1] == POLICY.oom_forecast_s


def test_dashboard_descriptions_state_the_defaults() -> None:
    expected = {
        "KV-cache usage": (
            f"--pause-kv-usage ({POLICY.pause_kv_usage_ratio:g})",
            f"--resume-kv-usage ({POLICY.resume_kv_usage_ratio:g})",
        ),
        "Preemptions": (
            f"the policy's {POLICY.preemptions_per_s:g}/s",
            f"last {DERIVE.short_horizon_polls} polls",
        ),
        "Engine stalled": (f"--hung-after ({POLICY.hung_after_s:g} s)",),
        "Time to OOM (soonest GPU)": (
            f"--oom-forecast ({POLICY.oom_forecast_s:g} s) for {POLICY.oom_forecast_ticks} polls",
        ),
        "Memory growth": (f"{DERIVE.min_trend_points} polls over {DERIVE.min_trend_span_s:g} s",),
        "Allocator retries and OOMs": (f"at {POLICY.pause_alloc_retries} in {DERIVE.short_horizon_polls} polls",),
    }
    for title, phrases in expected.items():
        description = " ".join(_dashboard_panel(title)["description"].split())
        for phrase in phrases:
            assert phrase in description, f"{DASHBOARD.name}: panel {title!r} does not say {phrase!r}"


# --- the runbooks and the README ---


def _flag_defaults_stated(path: Path) -> list[tuple[str, float]]:
    """Each "`--flag` (default N s)", "`--flag` (N)" of a setting in a document, with the number it states."""
    text = " ".join(path.read_text(encoding="utf-8").split())
    stated = []
    for match in re.finditer(r"`--([a-z0-9-]+)`,? \((?:default:? )?([0-9]+(?:\.[0-9]+)?)(?: ?s| seconds)?[,;)]", text):
        name = match.group(1).replace("-", "_")
        if name in Settings.model_fields:
            stated.append((name, float(match.group(2))))
    return stated


def test_runbooks_state_the_defaults() -> None:
    stated = _flag_defaults_stated(RUNBOOKS)
    assert {"pause_kv_usage", "resume_kv_usage", "hung_after"} <= {name for name, _ in stated}
    for name, number in stated:
        assert number == _default(name), f"{RUNBOOKS.name} says --{name.replace('_', '-')} is {number:g}"


@pytest.mark.parametrize(
    "path",
    [*sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "deploy").glob("*/README.md")), README],
    ids=lambda path: str(path.relative_to(ROOT)),
)
def test_every_document_states_the_defaults(path: Path) -> None:
    """Any "`--flag` (default N)" or "`--flag` (N s)" of a daemon setting, in any document, is its default."""
    for name, number in _flag_defaults_stated(path):
        assert number == _default(name), f"{path.relative_to(ROOT)} says --{name.replace('_', '-')} is {number:g}"


def test_runbooks_quote_the_shipped_expressions() -> None:
    """The "**Means:** `expr`" of each alert's section is the shipped expression (or its start)."""
    alerts = _alerts(RULES)
    text = RUNBOOKS.read_text(encoding="utf-8")
    checked = 0
    for section in re.split(r"^## ", text, flags=re.MULTILINE)[1:]:
        heading = section.split("\n", 1)[0].strip()
        quoted = re.search(r"\*\*Means:\*\* `([^`]+)`", section)
        if heading not in alerts or quoted is None:
            continue
        expr = " ".join(alerts[heading]["expr"].split())
        shown = " ".join(quoted.group(1).split())
        # Followed by no digit: `>= 0.9` must not pass as the start of `>= 0.95`.
        assert re.search(re.escape(shown) + r"(?![0-9.])", expr), f"{RUNBOOKS.name} {heading}: {shown!r} vs {expr!r}"
        checked += 1
    assert checked >= 10


def _settings_table_defaults() -> dict[str, str]:
    """The default column of docs/settings.md's table of every setting, by setting."""
    rows = re.findall(
        r"^\| `--([a-z0-9-]+)` \| `VLLM_SIDECAR_[A-Z0-9_]+` \| ([^|]+) \|", SETTINGS_DOC.read_text(), re.M
    )
    return {flag.replace("-", "_"): cell.strip().strip("`") for flag, cell in rows}


def _readme_table_defaults() -> dict[str, str]:
    """The default column of the README's short table (`| `--a`, `--b` | `1`, `2` | meaning |`), by setting."""
    table: dict[str, str] = {}
    for flags, cells in re.findall(
        r"^\| (`--[a-z0-9-]+`(?:, `--[a-z0-9-]+`)*) \| ([^|]+) \|", README.read_text(), re.M
    ):
        names = re.findall(r"`--([a-z0-9-]+)`", flags)
        values = [cell.strip().strip("`") for cell in cells.split(",")]
        if len(values) == len(names):
            table.update({name.replace("-", "_"): value for name, value in zip(names, values, strict=True)})
    return table


def _check_defaults(where: str, table: dict[str, str]) -> None:
    for name, cell in table.items():
        if name not in POLICY_SETTINGS and name not in DERIVE_SETTINGS:
            continue
        default = _default(name)
        if isinstance(default, bool):
            assert cell == ("on" if default else "off"), f"{where}: --{name} default {cell!r}"
        elif isinstance(default, int | float) and re.fullmatch(r"[0-9]+(?:\.[0-9]+)?", cell):
            assert float(cell) == default, f"{where}: --{name.replace('_', '-')} default {cell}, the code's {default:g}"


def test_settings_tables_state_the_defaults() -> None:
    """docs/settings.md lists every policy and derive setting with the code's default; the README's short table,
    where it names one, states the same default."""
    full = _settings_table_defaults()
    assert set(POLICY_SETTINGS) | (set(DERIVE_SETTINGS) - {"gpu_memory_utilization"}) <= set(full)
    _check_defaults("docs/settings.md", full)
    short = _readme_table_defaults()
    assert {"pause_kv_usage", "resume_kv_usage", "min_gpu_free", "max_restarts_per_hour"} <= set(short)
    _check_defaults("README.md", short)
