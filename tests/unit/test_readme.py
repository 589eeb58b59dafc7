"""The user's reference: every setting and every exported metric is named in the docs the README links to
(docs/settings.md, docs/metrics.md), and the README names the test command CI runs."""

from __future__ import annotations

from pathlib import Path

from sidecar.exporter import names
from sidecar.exporter.names import Kind
from sidecar.shell.settings import ENV_PREFIX, Settings

ROOT = Path(__file__).parents[2]
README = (ROOT / "README.md").read_text()
SETTINGS_DOC = (ROOT / "docs" / "settings.md").read_text()
METRICS_DOC = (ROOT / "docs" / "metrics.md").read_text()


def test_every_setting_is_documented_with_flag_and_environment_variable() -> None:
    assert "(docs/settings.md)" in README
    for name in Settings.model_fields:
        assert f"`--{name.replace('_', '-')}`" in SETTINGS_DOC, name
        assert f"`{ENV_PREFIX}{name.upper()}`" in SETTINGS_DOC, name


def test_every_metric_is_documented() -> None:
    assert "(docs/metrics.md)" in README
    for spec in (*names.ALL, *names.POLICY):
        exposed = spec.name + "_total" if spec.kind is Kind.COUNTER else spec.exposed_name
        assert f"`{exposed}" in METRICS_DOC, exposed


def test_the_test_command_is_the_one_ci_runs() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    assert "make check" in README
    assert "make check" in ci
