"""The tools' settings (loadtest, demo, doctor): one pydantic-settings model per command, with the contract's
precedence flag > VLLM_SIDECAR_<OPTION> > config file > the model's default, and the help showing that default."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from sidecar.config.tool_settings import load_tool_settings
from sidecar.demo.command import DemoSettings
from sidecar.demo.command import add_arguments as demo_arguments
from sidecar.doctor_cli.command import DoctorSettings
from sidecar.doctor_cli.command import add_arguments as doctor_arguments
from sidecar.loadtest.command import LoadtestSettings, build_spec
from sidecar.loadtest.command import add_arguments as loadtest_arguments
from sidecar.loadtest.spec import Api


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [name for name in os.environ if name.upper().startswith("VLLM_SIDECAR_")]:
        monkeypatch.delenv(name)


def _parse(add: Callable[[argparse.ArgumentParser], None], argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add(parser)  # --config among the model's flags
    return parser.parse_args(argv)


def test_loadtest_flag_beats_environment_beats_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    config = tmp_path / "loadtest.yaml"
    config.write_text("concurrency: 3\nmax-requests: 10\nprompt-tokens: 300\nseed: 1\napi: chat\n")
    monkeypatch.setenv("VLLM_SIDECAR_SEED", "2")
    monkeypatch.setenv("VLLM_SIDECAR_JSON", "yes")
    args = _parse(loadtest_arguments, ["--config", str(config), "--max-requests", "20"])
    settings = load_tool_settings(LoadtestSettings, args)
    assert (settings.concurrency, settings.max_requests, settings.seed) == (3, 20, 2)
    assert (settings.api, settings.json, settings.quiet) == (Api.CHAT, True, False)
    spec = build_spec(settings, run_tag="t")
    assert (spec.prompt_tokens.low, spec.timeout_s) == (300, 120.0)  # a number in the file is a length


def test_a_flag_left_out_takes_the_models_default() -> None:
    settings = load_tool_settings(LoadtestSettings, _parse(loadtest_arguments, []))
    assert settings == LoadtestSettings.model_validate({})
    assert (settings.url, settings.request_timeout, settings.output_tokens) == ("http://127.0.0.1:8000", 120.0, "128")


def test_the_daemons_timeout_does_not_reach_the_loadtest(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VLLM_SIDECAR_TIMEOUT", "1")  # run's --timeout, shorter than its interval
    assert load_tool_settings(LoadtestSettings, _parse(loadtest_arguments, [])).request_timeout == 120.0


def test_demo_and_doctor_layer_the_same_way(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    config = tmp_path / "demo.toml"
    config.write_text("interval = 0.5\nkeep-running = true\n")
    monkeypatch.setenv("VLLM_SIDECAR_CONFIG", str(config))
    monkeypatch.setenv("VLLM_SIDECAR_INTERVAL", "2")
    demo = load_tool_settings(DemoSettings, _parse(demo_arguments, ["--scenario", "burst"]))
    assert (demo.scenario, demo.interval, demo.keep_running, demo.vllm_version) == ("burst", 2.0, True, "0.32")
    config = tmp_path / "doctor.toml"
    config.write_text('fail-on = "warning"\nrequest-timeout = 20\n')
    monkeypatch.setenv("VLLM_SIDECAR_CONFIG", str(config))
    monkeypatch.setenv("VLLM_SIDECAR_REQUEST_TIMEOUT", "30")
    monkeypatch.setenv("VLLM_SIDECAR_TIMEOUT", "1")  # run's --timeout, shorter than its interval: not the doctor's
    doctor = load_tool_settings(DoctorSettings, _parse(doctor_arguments, []))
    assert (doctor.fail_on, doctor.request_timeout, doctor.gpu_source) == ("warning", 30.0, "nvml")
    doctor = load_tool_settings(DoctorSettings, _parse(doctor_arguments, ["--timeout", "5"]))
    assert doctor.request_timeout == 5.0


@pytest.mark.parametrize(
    ("add", "flag", "shown"),
    [
        (loadtest_arguments, "--timeout", "per request, in seconds (default 120)"),
        (loadtest_arguments, "--url", "(default http://127.0.0.1:8000)"),
        (demo_arguments, "--interval", "the sidecar's poll interval, seconds (default 1)"),
        (doctor_arguments, "--fail-on", "(info: any finding) (default info)"),
    ],
)
def test_the_help_shows_the_models_default(
    add: Callable[[argparse.ArgumentParser], None], flag: str, shown: str
) -> None:
    parser = argparse.ArgumentParser()
    add(parser)
    text = " ".join(parser.format_help().split())
    assert flag in text
    assert shown in text
