"""No secret in the logs, /status, /metrics, `once` or an error line: the webhook URL (a Slack hook's path is
its credential), the admin token, the HMAC key and a kubeconfig's token.

The daemon runs as a real process with every secret configured, a webhook receiver that fails and echoes the
secret path back, and wrong-token admin calls; then every byte it wrote or served is searched. Each test
also checks that the path it guards really ran (a failure logged, a refusal logged), so an empty log cannot
pass for a clean one.
"""

from __future__ import annotations

import io
import json
import logging
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from sidecar.shell.logging import configure_logging
from sidecar.shell.settings import load_settings
from tests.adapters.daemon_process import SidecarProcess
from tests.conftest import EXPOSITIONS
from tests.loopback import Behaviour, LoopbackServer, closed_port, respond

SLACK_PATH = "/services/T0SECRETAA/B0SECRETBB/xoxbSecretPathToken123"
QUERY = "token=QuerySecretValue99"
ADMIN_TOKEN = "admin-token-secret-Zq8v2Lr5Wn"  # noqa: S105 - made-up secrets the test hunts for
HMAC_KEY = "hmac-key-secret-Pk3Jd9Xf"
KUBE_TOKEN = "eyJkubeTokenSecretR7t2"  # noqa: S105
SECRETS = ("T0SECRETAA", "B0SECRETBB", "xoxbSecretPathToken123", "QuerySecretValue99", ADMIN_TOKEN, HMAC_KEY)

CAPTURE = (EXPOSITIONS / "vllm-0.32.0-cpu-under-load.prom").read_text()
USAGE_LINE = 'vllm:kv_cache_usage_perc{engine="0",model_name="tiny-llama"} 0.8188976377952756'


def _with_usage(value: float) -> bytes:
    assert USAGE_LINE in CAPTURE
    return CAPTURE.replace(USAGE_LINE, USAGE_LINE.rsplit(" ", 1)[0] + f" {value}").encode()


def _leaks(text: str) -> list[str]:
    return [secret for secret in SECRETS if secret in text]


def _clean_environment(**extra: str) -> dict[str, str]:
    environment = {name: value for name, value in os.environ.items() if not name.startswith("VLLM_SIDECAR_")}
    return environment | extra


def _echo_then_refuse(body: bytes) -> Behaviour:
    """A receiver that fails retryably (500) once, then for good (404), each time quoting the secret path
    back, as a misconfigured proxy or a chatty webhook service does."""
    calls: list[int] = []

    def send(conn: object) -> None:
        calls.append(1)
        respond(500 if len(calls) == 1 else 404, body)(conn)  # type: ignore[arg-type]

    return send


@pytest.fixture
def secret_files(tmp_path: Path) -> tuple[Path, Path]:
    token_file, key_file = tmp_path / "admin-token", tmp_path / "hmac-key"
    token_file.write_text(ADMIN_TOKEN + "\n")
    key_file.write_text(HMAC_KEY + "\n")
    return token_file, key_file


@pytest.fixture
def vllm() -> Iterator[LoopbackServer]:
    server = LoopbackServer()
    server.routes.update({"/metrics": respond(body=_with_usage(0.5)), "/health": respond(), "/version": respond(404)})
    yield server
    server.close()


def test_the_running_daemon_shows_no_secret_anywhere(
    vllm: LoopbackServer, secret_files: tuple[Path, Path], tmp_path: Path
) -> None:
    token_file, key_file = secret_files
    receiver = LoopbackServer()
    hook = f"{receiver.url}{SLACK_PATH}?{QUERY}"
    receiver.routes[f"{SLACK_PATH}?{QUERY}"] = _echo_then_refuse(f"no such hook: {hook} ({SLACK_PATH})".encode())
    sidecar = SidecarProcess(
        ["--vllm-url", vllm.url, "--interval", "0.5", "--gpu-source", "none", "--state-dir", str(tmp_path / "s"),
         "--log-level", "debug", "--webhook-url", hook, "--webhook-hmac-key-file", str(key_file),
         "--admin-token-file", str(token_file)],
        tmp_path / "log",
    )  # fmt: skip
    served: list[str] = []
    try:
        sidecar.wait_ready()
        vllm.routes["/metrics"] = respond(body=_with_usage(0.97))  # a pause: a notification to the webhook
        deadline = time.monotonic() + 20
        while "notification_failed" not in sidecar.log_path.read_text() and time.monotonic() < deadline:
            time.sleep(0.1)
        with httpx.Client(base_url=sidecar.url, timeout=5) as client:
            for authorization in ("Bearer wrong-token-0000000000", f"Bearer {ADMIN_TOKEN}x", f"Basic {ADMIN_TOKEN}"):
                assert client.post("/admin/resume", headers={"Authorization": authorization}).status_code in (401, 403)
            assert client.post(f"/admin/pause?token={ADMIN_TOKEN}").status_code == 401
            good = client.post("/admin/pause", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
            assert good.status_code == 200
            served = [client.get(path).text for path in ("/status", "/metrics", "/healthz", "/readyz")]
    finally:
        code, _ = sidecar.stop()
        receiver.close()
    log = sidecar.log_path.read_text()
    assert code == 0
    assert _leaks(log) == [], log
    for body in served:
        assert _leaks(body) == [], body
    # The paths under test ran: the delivery failed (with the receiver's echo, scrubbed), refusals were logged.
    events = sidecar.events()
    failed = [event for event in events if event["event"] == "notification_failed"]
    assert failed, log
    assert failed[0]["sink"] == f"json webhook {receiver.url}/…"
    assert "no such hook" in str(failed[0]["error"])
    assert any(event["event"] == "notification_retrying" for event in events)
    assert len([event for event in events if event["event"] == "admin_refused"]) == 4
    assert any(event["event"] == "admin_action" for event in events)
    assert len(receiver.hits) >= 2  # the retryable failure and the permanent one (a manual pause may add one)


def _run(*args: str, environment: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sidecar", *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
        env=environment if environment is not None else _clean_environment(),
    )


def test_once_json_with_every_secret_configured_prints_none_of_them(
    vllm: LoopbackServer, secret_files: tuple[Path, Path]
) -> None:
    token_file, key_file = secret_files
    environment = _clean_environment(
        VLLM_SIDECAR_WEBHOOK_URL=f"https://hooks.example.com{SLACK_PATH}?{QUERY}",
        VLLM_SIDECAR_WEBHOOK_HMAC_KEY_FILE=str(key_file),
        VLLM_SIDECAR_ADMIN_TOKEN_FILE=str(token_file),
        VLLM_SIDECAR_GPU_SOURCE="none",
    )
    good = _run("once", "--json", "--vllm-url", vllm.url, environment=environment)
    bad = _run("once", "--json", "--vllm-url", f"http://127.0.0.1:{closed_port()}", environment=environment)
    assert (good.returncode, bad.returncode) == (0, 1)
    assert '"reachable": true' in good.stdout
    assert "cannot read vLLM" in bad.stderr
    for output in (good.stdout, good.stderr, bad.stdout, bad.stderr):
        assert _leaks(output) == [], output


@pytest.mark.parametrize(
    ("case", "setting"),
    [
        ("a webhook URL of the wrong scheme", "webhook_url"),
        ("a bad interval beside a webhook URL in the environment", "interval"),
        ("a bad interval beside a webhook URL in the config file", "interval"),
        ("a config file that is not YAML on the webhook line", "config file"),
        ("a config file that is not TOML on the webhook line", "config file"),
        ("a misspelt webhook key in the config file", "unknown setting"),
        ("a password in --vllm-url", "vllm_url"),
        ("a kubeconfig that is not YAML on the token line", "kubeconfig"),
    ],
)
def test_a_settings_error_next_to_a_secret_does_not_repeat_it(case: str, setting: str, tmp_path: Path) -> None:
    hook = f"https://hooks.example.com{SLACK_PATH}?{QUERY}"
    config_yaml, config_toml, kubeconfig = tmp_path / "c.yaml", tmp_path / "c.toml", tmp_path / "kubeconfig"
    config_yaml.write_text(f"webhook-url: {hook}\ninterval: -1\n")
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\ncontexts: [{name: c, context: {cluster: k, user: u}}]\n"
        f"clusters: [{{name: k, cluster: {{server: 'https://127.0.0.1:6443'}}}}]\n"
        f"users:\n- name: u\n  user:\n    token: {KUBE_TOKEN}: oops\n"
    )
    environment = _clean_environment()
    args: list[str] = ["run", "--gpu-source", "none", "--state-dir", str(tmp_path)]
    if case == "a webhook URL of the wrong scheme":
        args += ["--webhook-url", "ftp" + hook.removeprefix("https")]
    elif case == "a bad interval beside a webhook URL in the environment":
        environment["VLLM_SIDECAR_WEBHOOK_URL"] = hook
        args += ["--interval", "-5"]
    elif case == "a bad interval beside a webhook URL in the config file":
        args += ["--config", str(config_yaml)]
    elif case == "a config file that is not YAML on the webhook line":
        config_yaml.write_text(f"webhook-url: {hook}: [\n")
        args += ["--config", str(config_yaml)]
    elif case == "a config file that is not TOML on the webhook line":
        config_toml.write_text(f"webhook-url = {hook}\n")
        args += ["--config", str(config_toml)]
    elif case == "a misspelt webhook key in the config file":
        config_yaml.write_text(f"webhok-url: {hook}\n")
        args += ["--config", str(config_yaml)]
    elif case == "a password in --vllm-url":
        args += ["--vllm-url", f"http://operator:{ADMIN_TOKEN}@127.0.0.1:8000"]
    else:
        args += ["--actuator", "kubernetes", "--kubeconfig", str(kubeconfig), "--pod-name", "p", "--pod-namespace", "n"]
    result = _run(*args, environment=environment)
    assert result.returncode == 2, result.stderr
    [line] = result.stderr.strip().splitlines()
    assert setting in line
    assert _leaks(line) == [], line
    assert KUBE_TOKEN not in line, line


def test_console_logs_never_print_local_variables_of_a_traceback() -> None:
    """With `rich` installed, structlog's console renderer would print every frame's locals by default."""
    output = _library_traceback_logged_as("console")
    assert "ValueError: the job failed" in output  # the traceback itself is kept
    assert _leaks(output) == [], output


def _raise_with_a_secret_in_a_local() -> None:
    webhook_url = f"https://hooks.example.com{SLACK_PATH}"
    raise ValueError("the job failed" if webhook_url else "")


def _library_traceback_logged_as(log_format: str) -> str:
    """What the daemon's logging prints when a library (APScheduler) logs a traceback whose frame holds a secret."""
    stream = io.StringIO()
    configure_logging(level="info", log_format=log_format, stream=stream)
    try:
        _raise_with_a_secret_in_a_local()
    except ValueError:
        logging.getLogger("apscheduler.executors.default").exception("Job raised an exception")
    finally:
        configure_logging(level="info", log_format="json", stream=sys.stderr)
    return stream.getvalue()


def test_json_logs_keep_a_library_traceback_as_text_and_no_locals() -> None:
    [line] = _library_traceback_logged_as("json").splitlines()
    event = json.loads(line)
    assert event["exception"].startswith("Traceback (most recent call last):")
    assert event["exception"].endswith("ValueError: the job failed")
    assert _leaks(line) == [], line


def test_the_settings_object_does_not_show_the_webhook_url() -> None:
    settings = load_settings({"webhook_url": f"https://hooks.example.com{SLACK_PATH}?{QUERY}"})
    assert settings.webhook_url is not None
    assert _leaks(repr(settings)) == []
    assert _leaks(str(settings)) == []
