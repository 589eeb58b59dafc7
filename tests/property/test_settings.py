"""Settings under any input: flags, environment and config files (TOML and YAML) of any content.

Properties: a bad value is a `SettingsError` of one line that names a setting it was given, never another
exception and never a secret; flag > environment > file > default for any mix of sources and key spellings;
and the command line turns any bad value into exit code 2 with one line, and an unknown flag into exit 2.
Every example runs with the process's `VLLM_SIDECAR_*` environment replaced, and put back after.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, get_args

import pytest
import yaml
from hypothesis import example, given
from hypothesis import strategies as st

from sidecar.cli import EXIT_USAGE, main
from sidecar.shell.acting_setup import policy_settings
from sidecar.shell.poller import derive_settings
from sidecar.shell.settings import ENV_PREFIX, Settings, SettingsError, load_settings
from tests.property.profile import budget

FIELDS = {name: field for name, field in Settings.model_fields.items() if name != "config"}
HIDDEN = "pr0p3rty-hidden"  # stands for a password or a webhook URL's secret path


@contextlib.contextmanager
def _environment(values: Mapping[str, str]) -> Iterator[None]:
    """Exactly `values` as the `VLLM_SIDECAR_*` environment, restored afterwards."""
    saved = {key: value for key, value in os.environ.items() if key.startswith(ENV_PREFIX)}
    for key in saved:
        del os.environ[key]
    os.environ.update({ENV_PREFIX + name.upper(): value for name, value in values.items()})
    try:
        yield
    finally:
        for key in [key for key in os.environ if key.startswith(ENV_PREFIX)]:
            del os.environ[key]
        os.environ.update(saved)


_JUNK = [
    "",
    " ",
    "nan",
    "inf",
    "-inf",
    "-1",
    "0",
    "1e309",
    "0x10",
    "1_0",
    "true",
    "None",
    "null",
    "\u0661",
    "\u00b2",
    "http://",
    "https://:@/",
    "[::1]:",
    "a:b:c",
    "a\nb",
    "'",
    '"',
    "${X}",
    "1/0s",
    "9" * 5000,
    "all,",
    "0,0",
    "(",
    "-",
    "@.service",
    "../x",
]
# A value of the field's own kind (so that most of the others pass and the first bad one is reached), or junk.
_numbers = st.one_of(st.floats(0.001, 5000).map(lambda value: f"{value:g}"), st.integers(0, 70).map(str))


def _plausible(name: str) -> st.SearchStrategy[str]:
    annotation = FIELDS[name].annotation
    choices = [value for value in get_args(annotation) if isinstance(value, str)]
    if choices:
        return st.sampled_from(choices)
    if FIELDS[name].default is not None and not isinstance(FIELDS[name].default, bool):
        return st.just(str(FIELDS[name].default))
    return _numbers


def _values(name: str) -> st.SearchStrategy[str]:
    return st.one_of(_plausible(name), _numbers, st.sampled_from(_JUNK), st.text(max_size=10))


@st.composite
def _flags(draw: st.DrawFn) -> dict[str, Any]:
    names = draw(st.lists(st.sampled_from(sorted(FIELDS)), max_size=6, unique=True))
    flags: dict[str, Any] = {name: draw(_values(name)) for name in names}
    if draw(st.booleans()):  # secrets that must never be repeated, valid or not
        flags["webhook_url"] = draw(st.sampled_from([f"https://hooks.test/{HIDDEN}", f"ftp://{HIDDEN}", HIDDEN]))
    if draw(st.booleans()):
        flags["vllm_url"] = draw(
            st.sampled_from(
                [f"http://user:{HIDDEN}@vllm:8000", f"http://u:{HIDDEN}@[::1", "x", "http://v\t:1/", "http://v/ x"]
            )
        )
    return flags


def _check_error(error: SettingsError, given_names: set[str]) -> None:
    message = str(error)
    assert message
    assert "\n" not in message
    assert HIDDEN not in message
    if message.startswith("invalid setting "):
        named = message.removeprefix("invalid setting ").split("=", 1)[0].split(":", 1)[0]
        # The setting at fault was given, or, for a rule between two settings (TLS needs a certificate and a
        # key), the message names the given one's flag.
        flags = ("--" + name.replace("_", "-") for name in given_names)
        assert named in given_names or any(flag in message for flag in flags), message


@budget()
@given(_flags())
@example({"interval": "9" * 5000})
@example({"listen": "h:\u00b2"})
@example({"webhook_url": f"ftp://{HIDDEN}"})
@example({"dead_after": "inf"})  # pydantic takes it; the policy refuses it, as a SettingsError
@example({"vllm_url": "http://vllm\n:8000"})  # used to load, and then fail every poll with a two-line problem
def test_any_flags_give_settings_or_one_line_naming_a_given_setting(flags: dict[str, Any]) -> None:
    with _environment({}):
        try:
            settings = load_settings(flags)
        except SettingsError as error:
            _check_error(error, set(flags))
            return
    # A URL that loads is one URL: urlsplit() silently drops tabs and line breaks, httpx does not.
    for url in (settings.vllm_url, settings.webhook_url or ""):
        assert url.isprintable()
        assert not any(char.isspace() for char in url), url
    # What loads must also build what the daemon derives from it before starting, or fail the same way.
    try:
        policy_settings(settings)
        derive_settings(settings)
    except SettingsError as error:
        _check_error(error, set(flags))


# --- Config files of any content ------------------------------------------------------------------------------

_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(10**20), 10**20), st.floats(), st.text(max_size=8), st.sampled_from(_JUNK)
)
_keys = st.one_of(
    st.sampled_from(sorted(FIELDS)).map(lambda name: name.replace("_", "-")),
    st.sampled_from(sorted(FIELDS)),
    st.text(max_size=6),
)
_nested = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=2),
    max_leaves=5,
)
_documents = st.dictionaries(_keys, _nested, max_size=5)


def _toml_value(value: object) -> str:
    """A TOML rendering good enough to be valid for most values; an invalid one must be a SettingsError too."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(str(k))} = {_toml_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(item) for item in value) + "]"
    if value is None:
        return '""'
    return json.dumps(value) if isinstance(value, str) else str(value)  # TOML reads inf and nan as Python writes them


def _render(document: dict[str, object], suffix: str) -> str:
    if suffix == ".toml":
        return "".join(f"{json.dumps(key)} = {_toml_value(value)}\n" for key, value in document.items())
    return yaml.safe_dump(document, allow_unicode=True)


_suffixes = st.sampled_from([".toml", ".yaml", ".yml"])
_HOSTILE_FILES = [
    b"interval: " + b"[" * 3000,
    b"interval = " + b"[" * 3000,
    b"a = {b = " * 2000,
    b"interval: " + b"9" * 5000,
    b"interval = " + b"9" * 5000,
]
_files = st.one_of(
    st.builds(lambda document, suffix: (_render(document, suffix).encode(), suffix), _documents, _suffixes),
    st.tuples(st.binary(max_size=80), _suffixes),
    st.tuples(st.sampled_from(_HOSTILE_FILES), _suffixes),
)


@budget()
@given(_files)
@example((b"interval: " + b"[" * 3000, ".yaml"))  # used to raise RecursionError
@example((b"interval = " + b"9" * 5000, ".toml"))  # used to raise ValueError (int() digit limit)
@example((b"\xff\xfe", ".yaml"))
def test_any_config_file_gives_settings_or_one_line(file: tuple[bytes, str]) -> None:
    content, suffix = file
    with tempfile.TemporaryDirectory(prefix="property-settings-") as folder, _environment({}):
        path = Path(folder) / ("sidecar" + suffix)
        path.write_bytes(content)
        try:
            load_settings({"config": str(path)})
        except SettingsError as error:
            _check_error(error, set(FIELDS) | {"config"})


# --- Precedence -----------------------------------------------------------------------------------------------

# Settings whose valid values are easy to draw, each with a strategy of distinct valid values as strings.
_VALID: dict[str, st.SearchStrategy[str]] = {
    "interval": st.floats(0.5, 3600).map(repr),
    "window": st.floats(1, 86400).map(repr),
    "min_trend_r2": st.floats(0, 1).map(repr),
    "max_restarts_per_hour": st.integers(0, 60).map(str),
    "log_level": st.sampled_from(["debug", "info", "warning", "error"]),
    "gpus": st.sampled_from(["all", "0", "0,1", "3,2,7"]),
    "systemd_unit": st.sampled_from(["vllm.service", "a@b.service", "x-y.service"]),
    "webhook_format": st.sampled_from(["json", "slack"]),
    "exec_command": st.sampled_from(["docker restart vllm", "systemctl restart 'v llm'"]),
}
_SOURCES = ("flag", "env", "file")


@st.composite
def _layers(draw: st.DrawFn) -> dict[str, dict[str, str]]:
    layers: dict[str, dict[str, str]] = {source: {} for source in _SOURCES}
    for name in draw(st.lists(st.sampled_from(sorted(_VALID)), min_size=1, max_size=5, unique=True)):
        for source in draw(st.lists(st.sampled_from(_SOURCES), min_size=1, max_size=3, unique=True)):
            layers[source][name] = draw(_VALID[name])
    return layers


@budget()
@given(_layers(), st.sampled_from([".toml", ".yaml"]), st.booleans())
def test_flag_beats_environment_beats_file_beats_default(
    layers: dict[str, dict[str, str]], suffix: str, dashed_keys: bool
) -> None:
    file_values = {(name.replace("_", "-") if dashed_keys else name): value for name, value in layers["file"].items()}
    with tempfile.TemporaryDirectory(prefix="property-settings-") as folder:
        path = Path(folder) / ("sidecar" + suffix)
        path.write_text(_render(dict(file_values), suffix))
        with _environment({**layers["env"], "config": str(path)}):
            settings = load_settings(dict(layers["flag"]))
    for name in _VALID:
        chosen = next((layers[source][name] for source in _SOURCES if name in layers[source]), None)
        expected = Settings.model_fields[name].default if chosen is None else _as_field(name, chosen)
        assert getattr(settings, name) == expected, name


def _as_field(name: str, text: str) -> object:
    annotation = Settings.model_fields[name].annotation
    if annotation is float:
        return float(text)
    if annotation is int:
        return int(text)
    return text


# --- The command line ----------------------------------------------------------------------------------------

_FLAG_NAMES = ["--" + name.replace("_", "-") for name in Settings.model_fields]


@budget(scale=0.5)
@given(st.sampled_from(sorted(FIELDS)), st.one_of(st.sampled_from(_JUNK), st.text(max_size=8)))
@example("interval", "0")
@example("listen", "nowhere")
def test_a_bad_value_on_the_command_line_is_exit_2_with_one_line(name: str, value: str) -> None:
    value = value.replace("\x00", "")  # argv cannot hold NUL
    flag = "--" + name.replace("_", "-")
    with _environment({}):
        try:
            load_settings({name: value} if Settings.model_fields[name].annotation is not bool else {name: True})
        except SettingsError:
            pass
        else:
            return  # a valid value: `run` would start the daemon
        stderr = io.StringIO()
        with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
            code = main(["run", f"{flag}={value}"])
    assert code == EXIT_USAGE
    lines = stderr.getvalue().rstrip("\n").split("\n")
    assert len(lines) == 1, lines
    assert lines[0].startswith("vllm-sidecar: error: ")


@budget(scale=0.5)
@given(st.text("abcdefghijklmnopqrstuvwxyz-_", min_size=1, max_size=12), st.text(max_size=6))
@example("bogus", "1")
def test_an_unknown_flag_is_exit_2(name: str, value: str) -> None:
    flag = "--" + name
    if any(known.startswith(flag) for known in _FLAG_NAMES):
        return  # argparse takes an unambiguous prefix of a flag for the flag itself
    stderr = io.StringIO()
    with (
        _environment({}),
        contextlib.redirect_stderr(stderr),
        contextlib.redirect_stdout(io.StringIO()),
        pytest.raises(SystemExit) as exited,
    ):
        main(["run", f"{flag}={value.replace(chr(0), '')}"])
    assert exited.value.code == EXIT_USAGE
    assert flag in stderr.getvalue()


# --- A rule between two settings blames the one from the higher layer -------------------------------------------

# The pairs with a rule between them, each with values that are valid alone and break the rule in some mixes.
_PAIRS: dict[tuple[str, str], tuple[st.SearchStrategy[str], st.SearchStrategy[str]]] = {
    ("resume_kv_usage", "pause_kv_usage"): (st.sampled_from(["0.5", "0.8", "0.95"]), st.sampled_from(["0.6", "0.9"])),
    ("timeout", "interval"): (st.sampled_from(["1", "2.5", "9"]), st.sampled_from(["0.5", "2", "10"])),
}
_LAYERS = ("flag", "env", "file", None)  # None: left at its default
_RANK = {"flag": 3, "env": 2, "file": 1, None: 0}


@budget(scale=0.5)
@given(
    st.sampled_from(sorted(_PAIRS)),
    st.data(),
    st.sampled_from(_LAYERS),
    st.sampled_from(_LAYERS),
    st.sampled_from([".toml", ".yaml"]),
)
def test_a_broken_rule_blames_the_setting_from_the_higher_layer_and_says_where_it_is(
    pair: tuple[str, str], data: st.DataObject, first_layer: str | None, second_layer: str | None, suffix: str
) -> None:
    first_values, second_values = _PAIRS[pair]
    placed = {pair[0]: (first_layer, data.draw(first_values)), pair[1]: (second_layer, data.draw(second_values))}
    flags = {name: value for name, (layer, value) in placed.items() if layer == "flag"}
    env = {name: value for name, (layer, value) in placed.items() if layer == "env"}
    document = {name.replace("_", "-"): float(value) for name, (layer, value) in placed.items() if layer == "file"}
    with tempfile.TemporaryDirectory(prefix="property-settings-") as folder:
        path = Path(folder) / ("sidecar" + suffix)
        path.write_text(_render(dict(document), suffix))
        with _environment({**env, "config": str(path)}):
            try:
                load_settings(flags)
            except SettingsError as error:
                message = str(error).replace(str(path), "FILE")
            else:
                return  # the rule holds for these values
    blamed = message.removeprefix("invalid setting ").split("=", 1)[0]
    assert blamed in pair, message
    other = pair[1] if blamed == pair[0] else pair[0]
    layer_of = {name: layer for name, (layer, _) in placed.items()}
    # The higher layer is blamed; on a tie the rule's first name (the one conventionally checked against the other).
    assert _RANK[layer_of[blamed]] >= _RANK[layer_of[other]], message
    if _RANK[layer_of[blamed]] == _RANK[layer_of[other]]:
        assert blamed == pair[0], message
    flag_of_blamed = "--" + blamed.replace("_", "-")
    ending = {
        "flag": f"(flag {flag_of_blamed})",
        "env": f"(environment {ENV_PREFIX}{blamed.upper()})",
        "file": "(in FILE)",
        None: f"(the default; set it with flag {flag_of_blamed}, environment {ENV_PREFIX}{blamed.upper()})",
    }[layer_of[blamed]]
    assert message.endswith(ending), message
    # The other setting is quoted with its own origin, so the user finds both values.
    other_flag = "--" + other.replace("_", "-")
    quoted = {
        "flag": ")",
        "env": f" from environment {ENV_PREFIX}{other.upper()})",
        "file": " in FILE)",
        None: ", the default)",
    }
    assert other_flag + " (" in message, message
    assert quoted[layer_of[other]] in message.split(other_flag + " (", 1)[1], message
