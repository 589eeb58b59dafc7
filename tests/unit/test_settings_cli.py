"""pydantic-settings' CLI as every command declares it (`sidecar.config.settings_cli`): the library's flags with the
tunings (a bare boolean, an enum's values, a placeholder by unit, a default as a user writes it) and
command-line-only shortcuts, read back as the model's top source."""

from __future__ import annotations

import argparse
from enum import StrEnum
from typing import Any

import pytest
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from sidecar.config.settings_cli import load_flags, settings_flags


class Colour(StrEnum):
    DEEP_RED = "deep-red"
    BLUE = "blue"


class Toy(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="TOY_SETTINGS_CLI_", extra="forbid")

    loud: bool = Field(False, description="say it")
    colour: Colour = Field(Colour.BLUE, description="which")
    tint: Colour | None = Field(None, description="over it")
    request_timeout: float = Field(5.0, gt=0, description="all of it, 100 %", json_schema_extra={"unit": "seconds"})


class _RefusedError(Exception):
    """What the parser refused, raised rather than exiting."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:
        raise _RefusedError(message)


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="toy")
    settings_flags(Toy, parser, shortcuts={"request_timeout": "timeout"})
    return parser


def _load(*argv: str) -> Toy:
    return load_flags(Toy, vars(_parser().parse_args(list(argv))))


@pytest.mark.parametrize(
    ("argv", "loud"),
    [((), False), (("--loud",), True), (("--loud=false",), False), (("--loud", "no"), False), (("--loud=on",), True)],
)
def test_a_boolean_stands_alone_or_takes_a_value(argv: tuple[str, ...], loud: bool) -> None:
    assert _load(*argv).loud is loud


def test_an_enum_takes_its_values_and_refuses_its_names() -> None:
    assert _load("--colour", "deep-red", "--tint", "blue").colour is Colour.DEEP_RED
    assert _load("--tint", "blue").tint is Colour.BLUE
    with pytest.raises(_RefusedError, match="invalid choice: 'DEEP_RED'"):
        _parser().parse_args(["--colour", "DEEP_RED"])


def test_a_shortcut_is_a_second_flag_for_the_setting() -> None:
    assert _load("--timeout", "7").request_timeout == 7.0
    assert _load("--request-timeout", "8").request_timeout == 8.0


def test_only_the_flags_given_are_in_the_namespace() -> None:
    assert vars(_parser().parse_args(["--loud"])) == {"loud": "true"}


def test_the_help_lists_values_defaults_forms_and_what_is_accepted() -> None:
    text = " ".join(_parser().format_help().split())
    assert "usage: toy [OPTION ...]" in text  # the options are listed once, below
    assert "--colour {deep-red,blue} which (default blue)" in text
    assert "--loud [BOOL] say it (default off)" in text
    assert "A boolean alone means true, or takes true|false, 1|0, yes|no, on|off." in text
    assert "--request-timeout SECONDS, --timeout SECONDS all of it, 100 % (default 5)" in text
    assert "--tint {deep-red,blue} over it" in text  # unset by default: nothing to show


def test_a_flag_outranks_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOY_SETTINGS_CLI_REQUEST_TIMEOUT", "9")
    assert _load().request_timeout == 9.0
    assert _load("--timeout", "3").request_timeout == 3.0
    monkeypatch.setenv("TOY_SETTINGS_CLI_TIMEOUT", "11")  # the shortcut is the command line's only
    assert _load().request_timeout == 9.0
