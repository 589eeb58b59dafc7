"""TLS on the daemon's own listener: real handshakes against certificates made by openssl in the test.

The daemon is run as a real process (settings, start-up errors, the listener), the rotation and the
slow-client cases against the in-process server, where a check interval of 0 and a short timeout keep them fast.
"""

from __future__ import annotations

import asyncio
import os
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
import structlog
import yaml
from prometheus_client.parser import text_string_to_metric_families

from sidecar.exporter.server import HttpServer, Request, Response
from sidecar.exporter.tls import ReloadingServerTls, TlsError, server_context
from tests.adapters.daemon_process import SidecarProcess
from tests.conftest import EXPOSITIONS, required_in_ci
from tests.loopback import LoopbackServer, respond
from tests.security.certs import Pair, client_context, issue, make_ca, openssl_missing, served_common_name
from tests.ship.prometheus_server import PrometheusServer, prometheus_missing

VLLM_METRICS = (EXPOSITIONS / "vllm-0.32.0-cpu-under-load.prom").read_bytes()
UP_WITHIN_S = 30.0  # scrapes of the sidecar over TLS before its reading of the stand-in must show vLLM up


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> tuple[Pair, Pair]:
    missing = openssl_missing()
    if missing is not None:
        if required_in_ci():
            pytest.fail(f"openssl is required in CI (CI=true): {missing}", pytrace=False)
        pytest.skip(missing)
    folder = tmp_path_factory.mktemp("pki")
    ca = make_ca(folder / "ca")
    return ca, issue(ca, folder / "server", "sidecar-a")


@pytest.fixture(scope="module")
def tls_daemon(pki: tuple[Pair, Pair], tmp_path_factory: pytest.TempPathFactory) -> Iterator[SidecarProcess]:
    _, pair = pki
    vllm = LoopbackServer()
    vllm.routes.update({"/metrics": respond(body=VLLM_METRICS), "/health": respond(), "/version": respond(404)})
    folder = tmp_path_factory.mktemp("daemon")
    args = ["--vllm-url", vllm.url, "--interval", "0.5", "--gpu-source", "none", "--state-dir", str(folder)]
    sidecar = SidecarProcess(
        [*args, "--tls-cert-file", str(pair.cert), "--tls-key-file", str(pair.key)], folder / "log"
    )
    sidecar.url = f"https://127.0.0.1:{sidecar.port}"
    try:
        _wait_polling(sidecar.url, client_context(pki[0]), sidecar)
        yield sidecar
    finally:
        sidecar.kill()
        vllm.close()


def _image_healthcheck() -> list[str]:
    """The Dockerfile's HEALTHCHECK command (exec form), to run here with the test's Python."""
    text = (Path(__file__).resolve().parents[2] / "Dockerfile").read_text()
    line = next(line for line in text.splitlines() if line.strip().startswith('CMD ["/opt/vllm-sidecar/bin/python"'))
    command: list[str] = yaml.safe_load(line.strip().removeprefix("CMD "))
    return [sys.executable, *command[1:]]


def test_the_images_healthcheck_speaks_https_when_tls_is_on(tls_daemon: SidecarProcess) -> None:
    listen = f"127.0.0.1:{tls_daemon.port}"
    with_tls = {**os.environ, "VLLM_SIDECAR_LISTEN": listen, "VLLM_SIDECAR_TLS_CERT_FILE": "/any/cert.pem"}
    assert subprocess.run(_image_healthcheck(), env=with_tls, timeout=10, check=False).returncode == 0
    # Without the variable it speaks plain HTTP, which a TLS listener refuses: the check fails, as it must.
    plain = {key: value for key, value in with_tls.items() if key != "VLLM_SIDECAR_TLS_CERT_FILE"}
    assert subprocess.run(_image_healthcheck(), env=plain, timeout=10, check=False).returncode != 0


def _wait_polling(url: str, verify: ssl.SSLContext, sidecar: SidecarProcess, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if sidecar.process.poll() is not None:
            raise AssertionError(f"sidecar exited {sidecar.process.returncode}: {sidecar.log_path.read_text()}")
        try:
            if httpx.get(url + "/status", verify=verify, timeout=1).json().get("sources"):
                return
        except (httpx.HTTPError, ValueError):
            pass
        time.sleep(0.1)
    raise AssertionError(f"sidecar not serving HTTPS within {timeout_s} s: {sidecar.log_path.read_text()}")


def test_the_daemon_serves_every_endpoint_over_https_with_the_given_certificate(
    tls_daemon: SidecarProcess, pki: tuple[Pair, Pair]
) -> None:
    ca, _ = pki
    with httpx.Client(base_url=tls_daemon.url, verify=client_context(ca), timeout=5) as client:
        assert client.get("/healthz").status_code == 200
        # One poll of the stand-in may fail on a loaded box (seen in CI): what the endpoints say of vLLM must
        # agree that it is up within UP_WITHIN_S, not at the first look.
        deadline, seen = time.monotonic() + UP_WITHIN_S, None
        while time.monotonic() < deadline:
            ready = client.get("/readyz").status_code
            reachable = client.get("/status").json()["vllm"]["reachable"]
            up = _unlabelled_samples(client.get("/metrics").text).get("vllm_sidecar_up")
            seen = (ready, reachable, up)
            if seen == (200, True, 1.0):
                break
            time.sleep(0.25)
        assert seen == (200, True, 1.0), f"(/readyz, reachable, vllm_sidecar_up) stayed {seen} for {UP_WITHIN_S} s"
    started = next(event for event in tls_daemon.events() if event.get("event") == "started")
    assert started["scheme"] == "https"
    # The certificate served is the one given, and the negotiated protocol is TLS 1.2 or later.
    with (
        socket.create_connection(("127.0.0.1", tls_daemon.port), timeout=5) as raw,
        client_context(ca).wrap_socket(raw, server_hostname="127.0.0.1") as tls,
    ):
        assert served_common_name(tls.getpeercert()) == "sidecar-a"
        assert tls.version() in ("TLSv1.2", "TLSv1.3")


def _unlabelled_samples(exposition: str) -> dict[str, float]:
    """What a Prometheus client library makes of the exposition read over TLS."""
    return {
        sample.name: sample.value
        for family in text_string_to_metric_families(exposition)
        for sample in family.samples
        if not sample.labels
    }


def test_a_client_that_does_not_trust_the_ca_is_refused_by_its_own_verification(tls_daemon: SidecarProcess) -> None:
    with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
        httpx.get(tls_daemon.url + "/healthz", verify=ssl.create_default_context(), timeout=5)


def test_plain_http_to_the_tls_port_is_closed_quickly_and_https_keeps_working(
    tls_daemon: SidecarProcess, pki: tuple[Pair, Pair]
) -> None:
    started = time.monotonic()
    for _ in range(5):
        with pytest.raises(httpx.HTTPError):
            httpx.get(f"http://127.0.0.1:{tls_daemon.port}/metrics", timeout=5)
    with socket.create_connection(("127.0.0.1", tls_daemon.port), timeout=5) as raw:
        raw.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert raw.recv(4096) == b""  # closed; OpenSSL's TLS alert is not an HTTP answer either way
    assert time.monotonic() - started < 5.0
    assert httpx.get(tls_daemon.url + "/healthz", verify=client_context(pki[0]), timeout=5).status_code == 200
    assert tls_daemon.process.poll() is None
    # A confused client is not the daemon's error. Its scrapes of vLLM are another matter: on a busy box one can
    # miss its 0.4 s deadline (CI 2026-11-30) and say so, which is right and not about this port.
    errors = [
        event
        for event in tls_daemon.events()
        if event.get("level") in ("error", "critical") and event.get("event") != "source_failed"
    ]
    assert errors == [], errors


def test_the_context_has_tls_1_2_or_later_aead_forward_secret_ciphers_and_no_compression(server_pair: Pair) -> None:
    context = server_context(server_pair.cert, server_pair.key)
    assert context.minimum_version >= ssl.TLSVersion.TLSv1_2
    assert context.options & ssl.OP_NO_COMPRESSION
    assert context.options & ssl.OP_NO_RENEGOTIATION
    ciphers = context.get_ciphers()
    assert ciphers
    for cipher in ciphers:  # forward secrecy and authenticated encryption only
        assert cipher["aead"], cipher["name"]
        assert cipher["kea"] in ("kx-ecdhe", "kx-dhe", "kx-any"), cipher["name"]  # kx-any: TLS 1.3's own


async def _serve(tls: ReloadingServerTls, read_timeout_s: float = 5.0) -> HttpServer:
    async def handler(request: Request) -> Response:
        return Response.text(200, f"ok {request.path}")

    server = HttpServer(host="127.0.0.1", port=0, handler=handler, tls=tls.listener, read_timeout_s=read_timeout_s)
    await server.start()
    return server


async def _served_name(port: int, ca: Pair) -> str:
    reader, writer = await asyncio.open_connection(
        "127.0.0.1", port, ssl=client_context(ca), server_hostname="127.0.0.1"
    )
    try:
        writer.write(b"GET /x HTTP/1.1\r\nHost: x\r\n\r\n")
        answer = await reader.read()
        assert answer.startswith(b"HTTP/1.1 200")
        return served_common_name(writer.get_extra_info("peercert"))
    finally:
        writer.close()


def _kubelet_secret(folder: Path, generation: str, pair: Pair) -> None:
    """Write `pair` as the kubelet updates a Secret volume: a new timestamped folder, then one atomic rename
    of the `..data` symlink, which `tls.crt` and `tls.key` point through."""
    data = folder / f"..{generation}"
    data.mkdir()
    (data / "tls.crt").write_bytes(pair.cert.read_bytes())
    (data / "tls.key").write_bytes(pair.key.read_bytes())
    (folder / "..data_tmp").symlink_to(data.name)
    os.replace(folder / "..data_tmp", folder / "..data")
    for name in ("tls.crt", "tls.key"):
        if not (folder / name).is_symlink():
            (folder / name).symlink_to(f"..data/{name}")


@pytest.fixture
async def rotating(tmp_path: Path, ca: Pair) -> AsyncIterator[tuple[Path, ReloadingServerTls, HttpServer]]:
    secret = tmp_path / "secret"
    secret.mkdir()
    _kubelet_secret(secret, "1", issue(ca, tmp_path / "a", "sidecar-a"))
    tls = ReloadingServerTls(secret / "tls.crt", secret / "tls.key", logger=structlog.get_logger(), check_interval_s=0)
    server = await _serve(tls)
    yield secret, tls, server
    await server.stop()


async def test_a_rotated_secret_is_served_to_new_connections_and_a_broken_one_keeps_the_old(
    rotating: tuple[Path, ReloadingServerTls, HttpServer], ca: Pair, tmp_path: Path
) -> None:
    secret, tls, server = rotating
    assert await _served_name(server.port, ca) == "sidecar-a"
    _kubelet_secret(secret, "2", issue(ca, tmp_path / "b", "sidecar-b"))
    assert await _served_name(server.port, ca) == "sidecar-b"
    # A rotation caught half-way: the certificate of one pair with the key of another.
    c, d = issue(ca, tmp_path / "c", "sidecar-c"), issue(ca, tmp_path / "d", "sidecar-d")
    with structlog.testing.capture_logs() as logs:
        _kubelet_secret(secret, "3", Pair(cert=c.cert, key=d.key))
        assert await _served_name(server.port, ca) == "sidecar-b"
        assert await _served_name(server.port, ca) == "sidecar-b"
    failures = [entry for entry in logs if entry["event"] == "tls_reload_failed"]
    assert len(failures) == 1  # reported once, not per handshake
    assert "key values mismatch" in failures[0]["error"]
    _kubelet_secret(secret, "4", c)
    assert await _served_name(server.port, ca) == "sidecar-c"
    assert tls.reloads_total == 2


async def test_a_client_that_never_starts_the_handshake_is_dropped_after_the_read_timeout(
    server_pair: Pair,
) -> None:
    tls = ReloadingServerTls(server_pair.cert, server_pair.key)
    server = await _serve(tls, read_timeout_s=0.5)
    try:
        started = time.monotonic()
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        async with asyncio.timeout(5):
            assert await reader.read() == b""
        writer.close()
        assert time.monotonic() - started < 2.0  # asyncio's own default would hold it for 60 s
    finally:
        await server.stop()


def _encrypted_pair(folder: Path) -> Pair:
    folder.mkdir()
    pair = Pair(cert=folder / "enc.crt", key=folder / "enc.key")
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-passout",
         "pass:secret", "-keyout", str(pair.key), "-out", str(pair.cert), "-days", "1", "-subj", "/CN=enc"],
        check=True, capture_output=True, timeout=30,
    )  # fmt: skip
    return pair


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("missing key file", "cannot read --tls-key-file"),
        ("key of another certificate", "key values mismatch"),
        ("a key where the certificate goes", "holds no PEM certificate"),
        ("encrypted key", "encrypted key"),
        ("certificate without key", "is set but --tls-key-file is not"),  # blames the file given: the certificate
        ("key without certificate", "is set but --tls-cert-file is not"),
    ],
)
def test_a_bad_certificate_or_key_stops_the_start_with_one_line(
    case: str, expected: str, ca: Pair, server_pair: Pair, tmp_path: Path
) -> None:
    other = issue(ca, tmp_path / "other", "other")
    flags = {
        "missing key file": ["--tls-cert-file", str(server_pair.cert), "--tls-key-file", str(tmp_path / "nope.key")],
        "key of another certificate": ["--tls-cert-file", str(server_pair.cert), "--tls-key-file", str(other.key)],
        "a key where the certificate goes": ["--tls-cert-file", str(other.key), "--tls-key-file", str(other.key)],
        "certificate without key": ["--tls-cert-file", str(server_pair.cert)],
        "key without certificate": ["--tls-key-file", str(server_pair.key)],
    }
    if case == "encrypted key":
        encrypted = _encrypted_pair(tmp_path / "enc")
        flags[case] = ["--tls-cert-file", str(encrypted.cert), "--tls-key-file", str(encrypted.key)]
    result = subprocess.run(
        [sys.executable, "-m", "sidecar", "run", "--listen", "127.0.0.1:0", "--gpu-source", "none",
         "--state-dir", str(tmp_path), *flags[case]],
        check=False, capture_output=True, text=True, timeout=60, env=_clean_environment(),
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("vllm-sidecar: error: ")
    assert expected in lines[0]
    if case.endswith("without key"):
        assert lines[0].startswith("vllm-sidecar: error: invalid setting tls_cert_file=")
        assert lines[0].endswith("(flag --tls-cert-file)")
    if case.endswith("without certificate"):
        assert lines[0].startswith("vllm-sidecar: error: invalid setting tls_key_file=")
        assert lines[0].endswith("(flag --tls-key-file)")


def test_server_context_names_the_file_that_is_wrong(server_pair: Pair) -> None:
    with pytest.raises(TlsError, match="holds no PEM certificate") as raised:
        server_context(server_pair.key, server_pair.key)
    assert str(server_pair.key) in str(raised.value)


def _clean_environment() -> dict[str, str]:
    """This process's environment without any VLLM_SIDECAR_* setting that could change the command's answer."""
    return {name: value for name, value in os.environ.items() if not name.startswith("VLLM_SIDECAR_")}


def test_a_real_prometheus_scrapes_the_metrics_over_tls_in_openmetrics_with_the_process_metrics(
    tls_daemon: SidecarProcess, pki: tuple[Pair, Pair], tmp_path: Path
) -> None:
    missing = prometheus_missing()
    if missing is not None:
        if required_in_ci():
            pytest.fail(f"a real Prometheus is required in CI (CI=true): {missing}", pytrace=False)
        pytest.skip(missing)
    ca, _ = pki
    address = f"127.0.0.1:{tls_daemon.port}"
    prometheus = PrometheusServer(tmp_path / "prometheus", targets={"vllm-sidecar": [address]})
    try:
        prometheus.wait_ready()
        # The harness writes plain-HTTP scrape configs; this one is what a user of --tls-cert-file writes.
        config = yaml.safe_load(prometheus.config_path.read_text())
        config["scrape_configs"][0] |= {"scheme": "https", "tls_config": {"ca_file": str(ca.cert)}}
        prometheus.config_path.write_text(yaml.safe_dump(config))
        prometheus.reload()
        prometheus.wait_targets_up()
        # The sidecar's own reading of its vLLM stand-in, as Prometheus got it over TLS. One poll of the stand-in
        # may fail on a loaded box (seen in CI): the value must reach 1 within the scrapes of 30 s, not the first.
        deadline, up = time.monotonic() + UP_WITHIN_S, None
        while time.monotonic() < deadline:
            [sample] = prometheus.query('vllm_sidecar_up{job="vllm-sidecar"}')
            up = sample["value"][1]
            if up == "1":
                break
            time.sleep(0.5)
        assert up == "1", f"vllm_sidecar_up over TLS stayed {up} for {UP_WITHIN_S} s"
        # The sidecar's own process, from prometheus_client's process collector in its registry.
        [memory] = prometheus.query('process_resident_memory_bytes{job="vllm-sidecar"}')
        assert float(memory["value"][1]) > 0
        # Prometheus asks for OpenMetrics first, and the metadata it keeps shows it got it: families named
        # without their sample suffixes, and `info` as a type (the text format has neither).
        metadata = httpx.get(
            prometheus.url + "/api/v1/targets/metadata", params={"match_target": '{job="vllm-sidecar"}'}, timeout=10
        ).json()["data"]
        types = {entry["metric"]: entry["type"] for entry in metadata}
        assert types.get("vllm_sidecar_build") == "info", types
        assert types.get("process_cpu_seconds") == "counter", types
        assert "vllm_sidecar_build_info" not in types
    finally:
        prometheus.stop()
