"""The alerting rules in alerts/: promtool accepts and passes them, and they stay consistent with the docs."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
ALERTS = ROOT / "alerts"
RULES = ALERTS / "vllm-sidecar.rules.yml"
TESTS = ALERTS / "tests" / "vllm-sidecar.rules.test.yml"
RUNBOOKS = ROOT / "docs" / "runbooks.md"
METRICS_DOC = ROOT / "docs" / "metrics.md"  # the metric table the README links to
RUNBOOK_PREFIX = "https://github.com/vllm-sidecar/vllm-sidecar/blob/main/docs/runbooks.md#"
SIDECAR_METRIC = re.compile(r"\bvllm_sidecar_[a-z0-9_]+")
SEVERITIES = {"critical", "warning", "info"}


def _promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail("promtool is required in CI (apt-get install prometheus)")
        pytest.skip("promtool not installed")
    return path


def _alerts() -> list[dict[str, Any]]:
    doc = yaml.safe_load(RULES.read_text(encoding="utf-8"))
    return [rule for group in doc["groups"] for rule in group["rules"] if "alert" in rule]


def _anchor(heading: str) -> str:
    """GitHub's anchor for a Markdown heading."""
    text = heading.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _runbook_anchors() -> set[str]:
    headings = re.findall(r"^#{1,6}\s+(.+)$", RUNBOOKS.read_text(encoding="utf-8"), flags=re.MULTILINE)
    return {_anchor(h) for h in headings}


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)


def test_promtool_check_rules() -> None:
    result = _run(_promtool(), "check", "rules", str(RULES))
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_users_glob_loads_only_rule_files() -> None:
    """`promtool check rules alerts/*.yml` and Prometheus' `rule_files: [alerts/*.yml]` load every file the glob
    matches: a template or a promtool test file there fails them. Run through the shell, as a user types it."""
    assert sorted(ALERTS.glob("*.yml")) == [RULES]
    result = _run("sh", "-c", '"$0" check rules alerts/*.yml', _promtool())
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout + result.stderr


def test_promtool_unit_tests() -> None:
    result = _run(_promtool(), "test", "rules", str(TESTS))
    assert result.returncode == 0, result.stdout + result.stderr


def test_prometheusrule_is_up_to_date() -> None:
    result = _run(sys.executable, str(ALERTS / "generate.py"), "--check")
    assert result.returncode == 0, result.stdout + result.stderr


def test_prometheusrule_carries_the_plain_groups() -> None:
    plain = yaml.safe_load(RULES.read_text(encoding="utf-8"))
    rule = yaml.safe_load((ALERTS / "vllm-sidecar.prometheusrule.yaml").read_text(encoding="utf-8"))
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["kind"] == "PrometheusRule"
    assert rule["metadata"]["name"]
    assert rule["spec"]["groups"] == plain["groups"]


def test_every_alert_is_documented() -> None:
    anchors = _runbook_anchors()
    alerts = _alerts()
    assert alerts
    for alert in alerts:
        name = alert["alert"]
        assert alert.get("labels", {}).get("severity") in SEVERITIES, name
        annotations = alert.get("annotations", {})
        assert annotations.get("summary"), name
        assert annotations.get("description"), name
        url = annotations.get("runbook_url", "")
        assert url.startswith(RUNBOOK_PREFIX), f"{name}: {url!r}"
        anchor = url.removeprefix(RUNBOOK_PREFIX)
        assert anchor == _anchor(name), f"{name}: anchor {anchor!r}"
        assert anchor in anchors, f"{name}: no heading for #{anchor} in docs/runbooks.md"


def test_alert_names_are_unique() -> None:
    names = [alert["alert"] for alert in _alerts()]
    assert len(names) == len(set(names))


def test_sidecar_metric_names_exist_in_the_metrics_doc() -> None:
    doc = METRICS_DOC.read_text(encoding="utf-8")
    documented = set(re.findall(r"`(vllm_sidecar_[a-z0-9_]+)", doc))
    used = {name for alert in _alerts() for name in SIDECAR_METRIC.findall(alert["expr"])}
    assert used
    unknown = sorted(used - documented)
    assert not unknown, f"metric names not in docs/metrics.md's Metrics table: {unknown}"


def test_every_alert_has_a_firing_and_a_silent_test() -> None:
    doc = yaml.safe_load(TESTS.read_text(encoding="utf-8"))
    assert [(TESTS.parent / name).resolve() for name in doc["rule_files"]] == [RULES]
    firing: set[str] = set()
    silent: set[str] = set()
    for case in doc["tests"]:
        for check in case.get("alert_rule_test", []):
            if check.get("exp_alerts"):
                firing.add(check["alertname"])
                for expected in check["exp_alerts"]:
                    assert expected.get("exp_labels"), check["alertname"]
                    assert expected.get("exp_annotations", {}).get("summary"), check["alertname"]
            else:
                silent.add(check["alertname"])
    names = {alert["alert"] for alert in _alerts()}
    assert not names - firing, f"alerts without a firing test: {sorted(names - firing)}"
    assert not names - silent, f"alerts without a non-firing test: {sorted(names - silent)}"
