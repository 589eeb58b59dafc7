"""The simulator's settings: flag > environment > config file > the scenario's preset, each value parsed for its
field's type by pydantic-settings, and a bad one stopped with one line naming where it came from."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sidecar.cli import EXIT_USAGE, main
from sidecar.config.config_file import SettingsError
from sidecar.sim.config import Scenario, VllmVersion, scenario_config
from sidecar.sim.settings import load_sim_settings


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [name for name in os.environ if name.upper().startswith("VLLM_SIDECAR_")]:
        monkeypatch.delenv(name)


def test_nothing_given_is_the_healthy_preset_on_the_default_address() -> None:
    settings = load_sim_settings({})
    assert (settings.sim_listen, settings.scenario, settings.overrides()) == ("127.0.0.1:8000", Scenario.HEALTHY, {})


def test_flag_beats_environment_beats_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    config = tmp_path / "sim.toml"
    config.write_text('max-num-seqs = 8\nseed = 3\nscenario = "leak"\nvllm_version = "0.10"\n')
    monkeypatch.setenv("VLLM_SIDECAR_CONFIG", str(config))
    monkeypatch.setenv("VLLM_SIDECAR_SEED", "5")
    monkeypatch.setenv("VLLM_SIDECAR_MAX_NUM_SEQS", "16")
    settings = load_sim_settings({"max_num_seqs": "32"})
    assert settings.overrides() == {"max_num_seqs": 32, "seed": 5, "vllm_version": VllmVersion.V0_10}
    assert settings.scenario is Scenario.LEAK
    config_of_run = scenario_config(settings.scenario, **settings.overrides())
    assert (config_of_run.max_num_seqs, config_of_run.leak_bytes_per_request > 0) == (32, True)  # preset kept


@pytest.mark.parametrize(("text", "expected"), [("true", True), ("off", False), ("1", True), ("no", False)])
def test_booleans_take_the_daemons_forms(text: str, expected: bool) -> None:
    assert load_sim_settings({"enable_prefix_caching": text}).overrides() == {"enable_prefix_caching": expected}


def test_an_optional_field_left_unset_keeps_the_presets_value() -> None:
    settings = load_sim_settings({"scenario": "hang"})
    assert "hang_after_s" not in settings.overrides()
    assert scenario_config(settings.scenario, **settings.overrides()).hang_after_s == 10.0


def test_a_bad_value_names_where_it_came_from(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match=r"^invalid setting seed='x': .*integer.* \(flag --seed\)$"):
        load_sim_settings({"seed": "x"})
    monkeypatch.setenv("VLLM_SIDECAR_ENABLE_PREFIX_CACHING", "maybe")
    with pytest.raises(
        SettingsError, match=r"enable_prefix_caching='maybe'.*\(environment VLLM_SIDECAR_ENABLE_PREFIX_CACHING\)$"
    ):
        load_sim_settings({})
    monkeypatch.delenv("VLLM_SIDECAR_ENABLE_PREFIX_CACHING")
    config = tmp_path / "sim.yaml"
    config.write_text("vllm-version: '0.7'\n")
    with pytest.raises(SettingsError, match=rf"vllm_version='0.7'.*\(in {config}\)$"):
        load_sim_settings({"config": str(config)})
    config.write_text("max-num-seq: 4\n")
    with pytest.raises(
        SettingsError, match=r"unknown setting 'max-num-seq' in config file .*did you mean 'max-num-seqs'"
    ):
        load_sim_settings({"config": str(config)})


def test_the_command_stops_with_one_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sim", "--decode-step-s", "soon"]) == EXIT_USAGE
    assert capsys.readouterr().err.startswith("vllm-sidecar: error: invalid setting decode_step_s='soon': ")
    assert main(["sim", "--listen", "nohost"]) == EXIT_USAGE
    assert (
        capsys.readouterr().err
        == "vllm-sidecar: error: invalid setting sim_listen='nohost': not HOST:PORT (flag --listen)\n"
    )
    assert main(["sim", "--vllm-version", "0.6", "--data-parallel", "2"]) == EXIT_USAGE  # SimConfig's own rule
    assert "no data parallelism" in capsys.readouterr().err
