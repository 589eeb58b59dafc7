"""Bad input on the command line, in the environment and in the config file: exit 2 and one line that blames
what the user wrote (the flag, the variable or the file), with the closest known name for a misspelt one.

In-process through `main()`: each case stops before anything starts, so no daemon is ever run here.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from sidecar.cli import EXIT_USAGE, main
from sidecar.shell.settings import OnceSettings, load_settings

CONFIG = "{config}"  # stands for the test's config file in argv and expectations


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [name for name in os.environ if name.upper().startswith("VLLM_SIDECAR_")]:
        monkeypatch.delenv(name)


Cli = Callable[..., str]


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Cli:
    """`cli(argv, env=..., file=...)`: the one line `main(argv)` prints on stderr, after asserting exit code 2
    (returned, or argparse's exit). `file` is written to the config file that CONFIG stands for."""

    def run(argv: list[str], env: dict[str, str] | None = None, file: str | None = None) -> str:
        config = tmp_path / "vllm-sidecar.yaml"
        if file is not None:
            config.write_text(file)
        for name, value in (env or {}).items():
            monkeypatch.setenv(name, value.replace(CONFIG, str(config)))
        try:
            code = main([argument.replace(CONFIG, str(config)) for argument in argv])
        except SystemExit as exited:
            code = exited.code  # type: ignore[assignment]
        captured = capsys.readouterr()
        assert code == EXIT_USAGE, captured
        lines = captured.err.rstrip("\n").split("\n")
        assert len(lines) == 1, captured.err
        return lines[0].replace(str(config), CONFIG)

    return run


# --- a rule between two settings blames the one the user gave -------------------------------------------------

BLAME_CASES = [
    # (argv, env, file, expected start of the message after "error: ", expected origin at its end)
    (
        ["run", "--pause-kv-usage", "0.5"],
        {},
        None,
        "invalid setting pause_kv_usage='0.5': must be above --resume-kv-usage (0.8, the default)",
        "(flag --pause-kv-usage)",
    ),
    (
        ["run", "--resume-kv-usage", "0.95"],
        {},
        None,
        "invalid setting resume_kv_usage='0.95': must be below --pause-kv-usage (0.9, the default)",
        "(flag --resume-kv-usage)",
    ),
    (  # both on the command line: the rule's first (resume), with pause quoted as given
        ["run", "--pause-kv-usage", "0.5", "--resume-kv-usage", "0.6"],
        {},
        None,
        "invalid setting resume_kv_usage='0.6': must be below --pause-kv-usage (0.5)",
        "(flag --resume-kv-usage)",
    ),
    (  # the flag beats the file: blame the flag, and say where the other value lives
        ["run", "--config", CONFIG, "--resume-kv-usage", "0.9"],
        {},
        "pause-kv-usage: 0.85\n",
        "invalid setting resume_kv_usage='0.9': must be below --pause-kv-usage (0.85 in {config})",
        "(flag --resume-kv-usage)",
    ),
    (
        ["run", "--config", CONFIG],
        {},
        "pause-kv-usage: 0.5\n",
        "invalid setting pause_kv_usage='0.5': must be above --resume-kv-usage (0.8, the default)",
        "(in {config})",
    ),
    (
        ["run"],
        {"VLLM_SIDECAR_PAUSE_KV_USAGE": "0.5", "VLLM_SIDECAR_CONFIG": CONFIG},
        "resume-kv-usage: 0.6\n",
        "invalid setting pause_kv_usage='0.5': must be above --resume-kv-usage (0.6 in {config})",
        "(environment VLLM_SIDECAR_PAUSE_KV_USAGE)",
    ),
    (
        ["run", "--interval", "2", "--timeout", "5"],
        {},
        None,
        "invalid setting timeout='5': must be shorter than --interval (2)",
        "(flag --timeout)",
    ),
    (  # the interval is what was just given; the timeout sits in the environment
        ["run", "--interval", "1"],
        {"VLLM_SIDECAR_TIMEOUT": "1.5"},
        None,
        "invalid setting interval='1': must be longer than --timeout (1.5 from environment VLLM_SIDECAR_TIMEOUT)",
        "(flag --interval)",
    ),
    (
        ["run", "--tls-key-file", "/k.pem"],
        {},
        None,
        "invalid setting tls_key_file='/k.pem': is set but --tls-cert-file is not",
        "(flag --tls-key-file)",
    ),
    (
        ["run", "--config", CONFIG],
        {},
        "tls-cert-file: /c.pem\n",
        "invalid setting tls_cert_file='/c.pem': is set but --tls-key-file is not",
        "(in {config})",
    ),
    (
        ["run"],
        {"VLLM_SIDECAR_ACTUATOR": "exec"},
        None,
        "invalid setting actuator='exec': needs --exec-command too",
        "(environment VLLM_SIDECAR_ACTUATOR)",
    ),
]


@pytest.mark.parametrize(("argv", "env", "file", "start", "origin"), BLAME_CASES)
def test_a_broken_rule_between_two_settings_blames_the_one_the_user_gave(
    *,
    cli: Cli,
    argv: list[str],
    env: dict[str, str],
    file: str | None,
    start: str,
    origin: str,
) -> None:
    line = cli(argv, env, file)
    assert line.startswith("vllm-sidecar: error: " + start), line
    assert line.endswith(origin), line


# --- a bad value names where it came from ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "env", "file", "needle"),
    [
        (["run", "--interval", "0"], {}, None, "(flag --interval)"),
        (["run"], {"VLLM_SIDECAR_INTERVAL": "0"}, None, "(environment VLLM_SIDECAR_INTERVAL)"),
        (["run"], {"vllm_sidecar_interval": "0"}, None, "(environment vllm_sidecar_interval)"),  # as spelt
        (["run", "--config", CONFIG], {}, "interval: 0\n", "(in {config})"),
        (["once"], {"VLLM_SIDECAR_CONFIG": CONFIG}, "interval: -3\n", "(in {config})"),
        (["run", "--dead-after", "inf"], {}, None, "dead_after='inf': must be a finite number"),
        (["run", "--config", CONFIG], {}, "hung-after: .inf\n", "hung_after=inf: must be a finite number"),
        (["run", "--remediate", "tensor-parallel-size=1..8"], {}, None, "is not a flag the sidecar may change"),
        (["run"], {"VLLM_SIDECAR_REMEDIATE": "max-num-seqs"}, None, "gives no range: write max-num-seqs=LOW..HIGH"),
    ],
)
def test_a_bad_value_names_the_flag_the_variable_or_the_file(
    *,
    cli: Cli,
    argv: list[str],
    env: dict[str, str],
    file: str | None,
    needle: str,
) -> None:
    line = cli(argv, env, file)
    assert line.startswith("vllm-sidecar: error: invalid setting "), line
    assert needle in line, line


# --- a misspelt name gets the closest known one --------------------------------------------------------------


def test_a_misspelt_config_key_is_answered_with_the_closest_in_its_own_spelling(cli: Cli) -> None:
    line = cli(["run", "--config", CONFIG], file="pause-kv-usge: 0.5\n")
    assert line == (
        "vllm-sidecar: error: unknown setting 'pause-kv-usge' in config file {config}; did you mean 'pause-kv-usage'?"
    )
    line = cli(["run", "--config", CONFIG], file="intervall: 3\n")
    assert line.endswith("did you mean 'interval'?")
    line = cli(["run", "--config", CONFIG], file="frobnicate: 3\n")
    assert "known settings: actuator, admin_rate_limit," in line  # nothing close: the list


def test_a_misspelt_environment_variable_stops_the_start_with_the_closest_name(cli: Cli) -> None:
    env = {"VLLM_SIDECAR_PAUSE_KV_USGE": "0.5"}
    line = cli(["run"], env)
    assert line == (
        "vllm-sidecar: error: unknown environment variable VLLM_SIDECAR_PAUSE_KV_USGE: no setting has that name; "
        "did you mean VLLM_SIDECAR_PAUSE_KV_USAGE (--pause-kv-usage)?"
    )
    assert "0.5" not in line  # its value is never repeated: a misspelt VLLM_SIDECAR_WEBHOOK_ULR holds a secret
    line = cli(["loadtest"], {"VLLM_SIDECAR_RATEE": "3"})
    assert line.endswith("did you mean VLLM_SIDECAR_RATE (--rate)?")


def test_environment_variables_close_to_nothing_or_known_elsewhere_are_left_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from sidecar.cli import _check_environment, build_parser

    for name in (
        "VLLM_SIDECAR_VLLM_PYTHON",  # the test harness's own names share the prefix
        "VLLM_SIDECAR_TINY_MODEL",
        "VLLM_SIDECAR_ROOTFS",
        "VLLM_SIDECAR_REQUIRE_VLLM",
        "VLLM_SIDECAR_RESTART_REASON",  # what the exec adapter passes to its command
        "VLLM_SIDECAR_PROBE_INTERVAL",  # the allocator probe's, read inside vLLM
        "VLLM_SIDECAR_RATE",  # loadtest's: a shared environment may hold it beside run's
        "VLLM_SIDECAR_SCENARIO",
    ):
        monkeypatch.setenv(name, "x")
    parser = build_parser()
    for command in ("run", "once", "sim", "demo", "loadtest", "doctor"):
        _check_environment(parser, command)  # raises nothing


def test_a_misspelt_flag_gets_the_closest_flag_of_its_command(cli: Cli) -> None:
    line = cli(["run", "--pause-kv-usge", "0.5"])
    assert line == (
        "vllm-sidecar: error: unknown flag --pause-kv-usge; did you mean --pause-kv-usage? "
        "(see vllm-sidecar run --help)"
    )
    line = cli(["once", "--vllm-ulr=http://x:8000"])
    assert "unknown flag --vllm-ulr; did you mean --vllm-url?" in line
    line = cli(["run", "--frobnicate"])
    assert line == "vllm-sidecar: error: unknown flag --frobnicate (see vllm-sidecar run --help)"
    line = cli(["run", "stray"])
    assert "unexpected argument 'stray'" in line
    line = cli(["run", "--interval"])  # argparse's own errors: one line too
    assert line.startswith("vllm-sidecar: error: argument --interval: expected one argument")


def test_another_commands_option_is_named_as_such(cli: Cli) -> None:
    line = cli(["once", "--actuator", "systemd"])  # the daemon's: once polls and prints
    assert line == "vllm-sidecar: error: --actuator is an option of run, not of once (see vllm-sidecar once --help)"
    assert "--listen is an option of run and sim, not of doctor" in cli(["doctor", "--listen", "x"])


# --- the OpenAI API's /v1 (or a /metrics path) in --vllm-url ----------------------------------------------------


@pytest.mark.parametrize(
    ("url", "root"),
    [
        ("http://vllm:8000/v1", "http://vllm:8000"),
        ("http://vllm:8000/v1/", "http://vllm:8000"),
        ("https://gw.example/llama/v1/chat/completions", "https://gw.example/llama"),
        ("http://vllm:8000/v1/models", "http://vllm:8000"),
        ("http://vllm:8000/metrics", "http://vllm:8000"),
        ("http://vllm:8000/health", "http://vllm:8000"),
    ],
)
def test_an_api_path_in_the_vllm_url_is_refused_with_the_root_to_give_instead(*, cli: Cli, url: str, root: str) -> None:
    line = cli(["run", "--vllm-url", url])
    assert line.startswith(f"vllm-sidecar: error: invalid setting vllm_url='{url}': ends in /"), line
    assert "the sidecar reads /metrics, /health and /version at the server's root" in line
    assert f"and give {root};" in line


@pytest.mark.parametrize(
    "url",
    [
        "http://vllm:8000",
        "http://vllm:8000/",
        "https://gw.example/llama",  # a proxy's prefix is fine
        "http://127.0.0.1:8001/api/v1/namespaces/ai/services/vllm:8000/proxy",  # kubectl proxy's /api/v1/...
        "http://vllm:8000/v1beta",
    ],
)
def test_a_root_or_a_proxy_prefix_is_accepted(url: str) -> None:
    assert load_settings({"vllm_url": url}).vllm_url == url.rstrip("/")


# --- --dry-run takes the forms its help shows ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("flags", "env", "file", "expected"),
    [
        (["--dry-run"], {}, None, True),
        (["--dry-run=true"], {}, None, True),
        (["--dry-run=false"], {}, None, False),
        (["--dry-run", "yes"], {}, None, True),
        (["--dry-run=0"], {}, None, False),
        (["--dry-run=ON"], {}, None, True),
        ([], {"VLLM_SIDECAR_DRY_RUN": "1"}, None, True),
        ([], {"VLLM_SIDECAR_DRY_RUN": "true"}, None, True),
        ([], {"VLLM_SIDECAR_DRY_RUN": "yes"}, None, True),
        ([], {"VLLM_SIDECAR_DRY_RUN": "0"}, None, False),
        ([], {}, "dry-run: true\n", True),
        ([], {}, "dry-run: false\n", False),
        ([], {}, 'dry-run: "yes"\n', True),
        (["--dry-run=false"], {"VLLM_SIDECAR_DRY_RUN": "1"}, None, False),  # the flag wins
    ],
)
def test_dry_run_takes_every_form_its_help_shows(
    *,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    flags: list[str],
    env: dict[str, str],
    file: str | None,
    expected: bool,
) -> None:
    from sidecar.cli import build_parser

    for name, value in env.items():
        monkeypatch.setenv(name, value)
    argv = ["run", *flags]
    if file is not None:
        (tmp_path / "c.yaml").write_text(file)
        argv += ["--config", str(tmp_path / "c.yaml")]
    arguments = vars(build_parser().parse_args(argv))
    arguments.pop("command")
    assert load_settings(arguments).dry_run is expected


def test_the_help_shows_the_forms_dry_run_takes(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--dry-run [BOOL] act on nothing, only report (default off)" in text
    assert "A boolean alone means true, or takes true|false, 1|0, yes|no, on|off." in text


@pytest.mark.parametrize(
    ("argv", "env", "origin"),
    [
        (["run", "--dry-run=maybe"], {}, "(flag --dry-run)"),
        (["run"], {"VLLM_SIDECAR_DRY_RUN": "sure"}, "(environment VLLM_SIDECAR_DRY_RUN)"),
    ],
)
def test_a_dry_run_that_is_no_yes_or_no_is_one_line_with_the_forms(
    *,
    cli: Cli,
    argv: list[str],
    env: dict[str, str],
    origin: str,
) -> None:
    line = cli(argv, env)
    assert "invalid setting dry_run=" in line
    assert "allowed: true|false, 1|0, yes|no, on|off (a bare --dry-run means true)" in line
    assert line.endswith(origin)


# --- the other commands' options from the environment and the file --------------------------------------------


def test_a_tool_option_from_the_environment_or_the_file_names_where_it_came_from(cli: Cli) -> None:
    line = cli(["loadtest"], {"VLLM_SIDECAR_RATE": "fast"})
    assert line == (
        "vllm-sidecar: error: invalid setting rate='fast': Input should be a valid number, unable to parse string "
        "as a number (environment VLLM_SIDECAR_RATE)"
    )
    os.environ.pop("VLLM_SIDECAR_RATE")
    line = cli(["loadtest", "--config", CONFIG], file='concurrency: "many"\n')
    assert line == (
        "vllm-sidecar: error: invalid setting concurrency='many': Input should be a valid integer, unable to parse "
        "string as an integer (in {config})"
    )
    os.environ["VLLM_SIDECAR_FAIL_ON"] = "fatal"
    line = cli(["doctor"])
    assert line == (
        "vllm-sidecar: error: invalid setting fail_on='fatal': Input should be 'info', 'warning' or 'critical' "
        "(environment VLLM_SIDECAR_FAIL_ON)"
    )
    os.environ.pop("VLLM_SIDECAR_FAIL_ON")
    line = cli(["demo", "--config", CONFIG], file="keep-running: maybe\n")
    assert line.startswith("vllm-sidecar: error: invalid setting keep_running='maybe': ")
    assert line.endswith("(in {config})")


def test_a_config_file_may_group_settings_in_their_sections_tables(tmp_path: Path) -> None:
    """`[policy]` holding `pause-kv-usage` is `pause-kv-usage` at the top, in TOML and in YAML; the flags and the
    environment still name each setting alone."""
    toml = tmp_path / "sidecar.toml"
    toml.write_text(
        'vllm-url = "http://10.0.0.5:8000"\ndry-run = true\n'
        "[policy]\npause-kv-usage = 0.8\nresume_kv_usage = 0.6\n"
        '[acting]\nactuator = "systemd"\n[exporter]\nlisten = "127.0.0.1:9500"\n'
    )
    yaml = tmp_path / "sidecar.yaml"
    yaml.write_text("derive:\n  window: 120\nnotify:\n  webhook-format: slack\n")
    settings = load_settings({"config": str(toml)})
    assert (settings.vllm_url, settings.dry_run, settings.pause_kv_usage, settings.resume_kv_usage) == (
        "http://10.0.0.5:8000",
        True,
        0.8,
        0.6,
    )
    assert (settings.actuator, settings.listen, settings.origin("pause_kv_usage").describe()) == (
        "systemd",
        "127.0.0.1:9500",
        f"in {toml}",
    )
    settings = load_settings({"config": str(yaml), "window": 90.0})
    assert (settings.window, settings.webhook_format) == (90.0, "slack")  # the flag over the file


def test_a_setting_in_another_sections_table_or_given_twice_is_one_line(cli: Cli) -> None:
    line = cli(["run", "--config", CONFIG], file="exporter:\n  pause-kv-usage: 0.8\n")
    assert line == (
        "vllm-sidecar: error: unknown setting 'pause-kv-usage' in [exporter] of config file {config}; "
        "did you mean 'pause-kv-usage' (in [policy])?"
    )
    line = cli(["run", "--config", CONFIG], file="interval: 2\nreading:\n  interval: 3\n")
    assert line == (
        "vllm-sidecar: error: setting 'interval' is given twice in config file {config} (at the top and in its table)"
    )
    line = cli(["run", "--config", CONFIG], file="policy:\n  pause-kv-usage: 2\n")
    assert line.startswith("vllm-sidecar: error: invalid setting pause_kv_usage=2: ")
    assert line.endswith("(in {config})")


def test_one_file_with_tables_serves_once_too(tmp_path: Path) -> None:
    """`once` reads its settings from their tables and leaves the daemon's tables to it."""
    config = tmp_path / "sidecar.toml"
    config.write_text('[reading]\nvllm-url = "http://10.0.0.5:8000"\n[policy]\npause-kv-usage = 0.8\n')
    assert load_settings({"config": str(config)}, OnceSettings).vllm_url == "http://10.0.0.5:8000"
