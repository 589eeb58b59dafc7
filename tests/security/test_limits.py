"""Size limits on what the sidecar reads: its own HTTP server's requests, every file it is pointed at, and the
simulated-GPU answer. (vLLM's /metrics, /version and /health, the Kubernetes API and the webhook's answer are
covered beside their adapters; SECURITY.md lists where.)"""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import threading
import time
import tracemalloc
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from sidecar.exporter.server import MAX_HEADER_FIELDS, HttpServer, Request, Response
from sidecar.sources.fetch import HttpxFetcher
from sidecar.sources.sim_gpu import SimGpuSource

MIB = 2**20


async def _ok(request: Request) -> Response:
    return Response.text(200, f"ok {request.path}")


@pytest.fixture
async def server() -> AsyncIterator[HttpServer]:
    served = HttpServer(host="127.0.0.1", port=0, handler=_ok, read_timeout_s=2.0, max_connections=8)
    await served.start()
    yield served
    await served.stop()


def _send_huge_head(port: int, total_bytes: int, answer: list[bytes]) -> None:
    """A client that starts a header line and keeps sending it, reading whatever comes back meanwhile."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:

        def read() -> None:
            try:
                answer.append(conn.recv(4096))
            except OSError:
                answer.append(b"")

        reader = threading.Thread(target=read)
        reader.start()
        chunk = b"a" * MIB
        try:
            conn.sendall(b"GET /x HTTP/1.1\r\nX-Huge: ")
            for _ in range(total_bytes // MIB):
                conn.sendall(chunk)
        except OSError:
            pass  # the server stopped reading and closed: exactly what is wanted
        reader.join(timeout=10)


async def test_a_100_mb_header_line_is_refused_quickly_with_bounded_memory(server: HttpServer) -> None:
    answer: list[bytes] = []
    tracemalloc.start()
    try:
        started = time.monotonic()
        await asyncio.to_thread(_send_huge_head, server.port, 100 * MIB, answer)
        elapsed_s = time.monotonic() - started
        _, peak_bytes = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert answer
    # 431, or a reset that overtook it (aiohttp answers a head it could not read as HTTP/1.0: its version is unknown)
    assert answer[0] == b"" or answer[0].startswith((b"HTTP/1.0 431 ", b"HTTP/1.1 431 "))
    assert elapsed_s < 5.0
    assert peak_bytes < 8 * MIB, f"peak {peak_bytes / MIB:.1f} MiB while refusing a 100 MiB header"
    async with httpx.AsyncClient() as client:
        assert (await client.get(f"http://127.0.0.1:{server.port}/after")).text == "ok /after\n"


async def test_the_431_is_what_a_patient_client_reads(server: HttpServer) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(b"GET /x HTTP/1.1\r\nX-Huge: " + b"a" * (64 * 1024))
    async with asyncio.timeout(5):
        answer = await reader.read()
    writer.close()
    assert answer.startswith((b"HTTP/1.0 431 ", b"HTTP/1.1 431 "))


@pytest.mark.parametrize(("fields", "status"), [(MAX_HEADER_FIELDS, b"200"), (MAX_HEADER_FIELDS + 1, b"431")])
async def test_header_fields_are_counted(server: HttpServer, fields: int, status: bytes) -> None:
    # HTTP/1.1 requires Host (aiohttp answers 400 without it), and it counts as one of the fields
    others = b"".join(b"X-%d: 1\r\n" % index for index in range(fields - 1))
    head = b"GET /x HTTP/1.1\r\nHost: x\r\n" + others + b"\r\n"
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(head)
    async with asyncio.timeout(5):
        answer = await reader.read()
    writer.close()
    assert answer.split(b" ", 2)[1] == status


async def test_connections_over_the_cap_are_dropped_at_once_and_the_server_recovers(server: HttpServer) -> None:
    idle = [await asyncio.open_connection("127.0.0.1", server.port) for _ in range(8)]
    await asyncio.sleep(0.1)  # let the server accept them all
    started = time.monotonic()
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(b"GET /x HTTP/1.1\r\nHost: x\r\n\r\n")
    try:
        async with asyncio.timeout(5):
            answer = await reader.read()
    except ConnectionResetError:  # a reset when the server's abort found the request unread, else a plain close
        answer = b""
    assert answer == b""  # not served: without the cap it would be answered at once, like any other
    assert time.monotonic() - started < 1.0  # dropped, not left to the 2 s read timeout
    for _, idle_writer in idle:
        idle_writer.close()
    await asyncio.sleep(0.2)
    async with httpx.AsyncClient() as client:
        assert (await client.get(f"http://127.0.0.1:{server.port}/again")).status_code == 200


def test_every_file_the_sidecar_reads_is_bounded_even_when_it_is_dev_zero(tmp_path: Path) -> None:
    """/dev/zero has size 0 and no end: a reader that trusts the size, or reads to the end, runs out of memory."""
    result = subprocess.run(
        [sys.executable, "-m", "tests.security.dev_zero", str(tmp_path)],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    outcomes = {entry["case"]: entry["outcome"] for entry in map(json.loads, result.stdout.splitlines())}
    expected = {
        "config file": "SettingsError: cannot read config file",
        "admin token file": "returned 'the admin API is off: cannot read the token file",
        "webhook HMAC key file": "SettingsError: --webhook-hmac-key-file",
        "vLLM API key file": "SettingsError: --vllm-api-key-file",
        "kubeconfig": "CredentialsError: cannot read kubeconfig",
        "kubernetes token file": "CredentialsError: cannot read the tokenFile of kubeconfig",
        "state file": "returned '",
        "doctor --vllm-log": "returned 'LogFacts'",
        "/proc comm and cmdline": "returned ProcessIdentity(",
        "TLS certificate": "TlsError: --tls-cert-file",
    }
    assert set(outcomes) == set(expected), result.stderr
    for case, start in expected.items():
        assert outcomes[case].startswith(start), f"{case}: {outcomes[case]}"


async def test_the_simulated_gpu_answer_is_read_only_up_to_its_cap() -> None:
    sent: list[int] = []

    async def endless() -> AsyncIterator[bytes]:
        while sum(sent) < 64 * MIB:  # ends, so a reader without a cap fails the test rather than the machine
            sent.append(MIB)
            yield b" " * MIB

    async def handler(_: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=endless())

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        source = SimGpuSource(fetcher=HttpxFetcher(client), url="http://sim/sim/gpu", timeout_s=5.0)
        result = await source.read()
    assert result.error is not None
    assert "answer over" in result.error
    assert sum(sent) <= 2 * MIB
