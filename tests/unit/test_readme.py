"""The README is the user's reference: it must name every setting and every exported metric."""

from __future__ import annotations

from pathlib import Path

from sidecar.exporter import names
from sidecar.exporter.names import Kind
from sidecar.shell.settings import ENV_PREFIX, Settings

README = (Path(__file__).parents[2] / "README.md").read_text()


def test_every_setting_is_documented_with_flag_and_environment_variable() -> None:
    for name in Settings.model_fields:
        assert f"`--{name.replace('_', '-')}`" in README, name
        assert f"`{ENV_PREFIX}{name.upper()}`" in README, name


def test_every_metric_is_documented() -> None:
    for spec in (*names.ALL, *names.POLICY):
        exposed = spec.name + "_total" if spec.kind is Kind.COUNTER else spec.exposed_name
        assert f"`{exposed}" in README, exposed


def test_the_test_command_is_the_one_ci_runs() -> None:
    ci = (Path(__file__).parents[2] / ".ci" / "run").read_text()
    assert "make check" in README
    assert "make check" in ci
