"""Gathers the doctor's evidence: vLLM over HTTP, the GPUs, the log file and the daemon's history. Does I/O.

Every read is bounded in time and size and turns failure into a one-line problem, except a file the user
named that cannot be read at all (`InputError`: the command exits 2 with that line).
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import BinaryIO

import httpx

from sidecar.body_cap import BodyTooLargeError, read_capped
from sidecar.doctor.evidence import Evidence, GpuEvidence, HistoryFacts, LiveEvidence
from sidecar.doctor.histogram import SAMPLE_NAMES
from sidecar.doctor.history import HistoryError, from_ledger
from sidecar.doctor.log_parser import parse_log
from sidecar.doctor.logfacts import STATED_BY_INCIDENT, LogFacts, ServerArgs
from sidecar.doctor.start_args import stated_command, with_stated_command
from sidecar.doctor.traffic import read_traffic
from sidecar.doctor_cli.history_reading import status_history
from sidecar.doctor_cli.incident_reading import read_incident
from sidecar.file_cap import read_capped_file
from sidecar.model.gpu import GpuReading
from sidecar.model.incident import METRICS_FILE
from sidecar.parse.exposition import ExpositionError, parse_exposition
from sidecar.parse.vllm import KEPT_SAMPLES, read_vllm
from sidecar.sources.fetch import HttpxFetcher, connection_error_reason
from sidecar.sources.gpu import GpuSource
from sidecar.sources.sim_gpu import SimGpuSource

MAX_LOG_BYTES = 64 * 2**20  # the tail of a longer log: the last start is what counts
MAX_SMALL_BYTES = 4 * 2**20  # /version, /v1/models, /status
LEDGER_FILE = "restart-ledger.json"


class InputError(Exception):
    """A file the user named cannot be read; the message is the one line to print."""


class _FetchError(Exception):
    def __init__(self, message: str, *, answered: bool) -> None:
        super().__init__(message)
        self.answered = answered


@dataclass(frozen=True, slots=True, kw_only=True)
class Options:
    vllm_url: str
    vllm_log: Path | None
    history: str | None
    gpu_source: str  # nvml, sim or none
    gpu_indices: tuple[int, ...] | None
    vllm_process_pattern: str
    timeout_s: float
    max_body_bytes: int = 16 * 2**20
    incident: Path | None = None  # an incident folder: its log, metrics and history instead of the live reads
    command: tuple[ServerArgs, str | None] | None = None  # --vllm-command: the arguments and model it gives


STDIN = "-"


def read_log(path: Path) -> LogFacts:
    if str(path) == STDIN:
        return parse_log(_tail(sys.stdin.buffer).decode("utf-8", errors="replace"))
    try:
        with path.open("rb") as handle:
            size = handle.seek(0, 2)
            handle.seek(max(0, size - MAX_LOG_BYTES))
            raw = handle.read(MAX_LOG_BYTES)  # bounded even where the size lies (/dev/zero, a file still growing)
    except OSError as error:
        raise InputError(f"cannot read --vllm-log {path}: {error.strerror or error}") from None
    return parse_log(raw.decode("utf-8", errors="replace"))


def _tail(stream: BinaryIO) -> bytes:
    """The last MAX_LOG_BYTES of a stream that cannot seek (a pipe): older chunks are dropped as they come."""
    chunks: deque[bytes] = deque()
    size = 0
    while chunk := stream.read(2**20):
        chunks.append(chunk)
        size += len(chunk)
        while size - len(chunks[0]) >= MAX_LOG_BYTES:
            size -= len(chunks.popleft())
    return b"".join(chunks)[-MAX_LOG_BYTES:]


async def gather(options: Options) -> Evidence:
    evidence = await _gather(options)
    if options.command is None:
        return evidence
    if evidence.log is None:
        unused = "--vllm-command not used: it gives the flags of a log's start, and there is no log to read"
        return replace(evidence, problems=(*evidence.problems, unused))
    return replace(evidence, log=with_stated_command(evidence.log, *options.command))


async def _gather(options: Options) -> Evidence:
    if options.incident is not None:
        return await asyncio.to_thread(_from_incident, options.incident, options.vllm_log)
    log = read_log(options.vllm_log) if options.vllm_log is not None else None
    history_path = _history_path(options.history)
    problems: list[str] = []
    base = options.vllm_url.rstrip("/")
    async with httpx.AsyncClient(timeout=options.timeout_s, follow_redirects=False, trust_env=False) as client:
        live, gpu, history = await asyncio.gather(
            _live(client, base, options, problems),
            _gpu(client, base, options),
            _history(client, options.history, history_path, problems),
        )
    return Evidence(
        live=live,
        gpu=gpu,
        log=log,
        log_path=str(options.vllm_log) if options.vllm_log is not None else None,
        history=history,
        problems=tuple(problems),
    )


def _from_incident(folder: Path, vllm_log: Path | None) -> Evidence:
    """The evidence an incident folder kept: its log (unless --vllm-log names another), the /metrics vLLM served
    then, the daemon's /status history; no live read, which would show the vLLM started since."""
    incident = read_incident(folder)
    problems = list(incident.lines)
    log_path = vllm_log or incident.log
    source = f"incident {folder}"
    if incident.metrics is not None:
        live = metrics_evidence(
            source,
            incident.metrics,
            version=incident.version,
            max_model_len=None,
            problems=problems,
            source=str(folder / METRICS_FILE),
        )
    else:
        live = LiveEvidence(
            url=source,
            reachable=False,
            error="the incident holds no /metrics of vLLM",
            version=incident.version,
            max_model_len=None,
            reading=None,
            traffic=None,
        )
    return Evidence(
        live=live,
        gpu=GpuEvidence(source="none", reading=None, error=None),
        log=_with_incident_command(read_log(log_path), incident.command) if log_path is not None else None,
        log_path=str(log_path) if log_path is not None else None,
        history=incident.history,
        problems=tuple(problems),
    )


def _with_incident_command(log: LogFacts, command: str | None) -> LogFacts:
    """The log with the flags of the command line the incident kept (where its log has no arguments line)."""
    if command is None:
        return log
    return with_stated_command(log, *stated_command(command, stated_by=STATED_BY_INCIDENT, strict=False))


async def _fetch(client: httpx.AsyncClient, url: str, max_bytes: int, timeout_s: float) -> bytes:
    try:
        async with asyncio.timeout(timeout_s):
            async with client.stream("GET", url) as response:
                if response.status_code != httpx.codes.OK:
                    raise _FetchError(f"{url} answered HTTP {response.status_code}", answered=True)
                return await read_capped(response, max_bytes)
    except TimeoutError:
        raise _FetchError(f"{url} did not answer within {timeout_s:g} s", answered=False) from None
    except BodyTooLargeError as error:
        raise _FetchError(f"{url}: {error}", answered=True) from None
    except httpx.HTTPError as error:
        raise _FetchError(f"{url} unreachable: {connection_error_reason(error)}", answered=False) from None


async def _live(client: httpx.AsyncClient, base: str, options: Options, problems: list[str]) -> LiveEvidence:
    timeout = options.timeout_s
    metrics, version, models = await asyncio.gather(
        _fetch(client, base + "/metrics", options.max_body_bytes, timeout),
        _fetch(client, base + "/version", MAX_SMALL_BYTES, timeout),
        _fetch(client, base + "/v1/models", MAX_SMALL_BYTES, timeout),
        return_exceptions=True,
    )
    version_text = _json_field(version, lambda doc: doc.get("version") if isinstance(doc, dict) else None)
    max_model_len = _json_field(models, _model_max_len)
    if isinstance(metrics, BaseException):
        answered = isinstance(metrics, _FetchError) and metrics.answered
        return LiveEvidence(
            url=base,
            reachable=answered,
            error=str(metrics),
            version=version_text if isinstance(version_text, str) else None,
            max_model_len=max_model_len if isinstance(max_model_len, int) else None,
            reading=None,
            traffic=None,
        )
    return metrics_evidence(
        base,
        metrics,
        version=version_text if isinstance(version_text, str) else None,
        max_model_len=max_model_len if isinstance(max_model_len, int) else None,
        problems=problems,
    )


def metrics_evidence(
    base: str, metrics: bytes, *, version: str | None, max_model_len: int | None, problems: list[str], source: str = ""
) -> LiveEvidence:
    """What a /metrics body says: read live from `base`, or kept in `source` (an incident's metrics.txt)."""
    try:
        exposition = parse_exposition(metrics.decode("utf-8"), KEPT_SAMPLES | SAMPLE_NAMES)
    except (ExpositionError, UnicodeDecodeError) as error:
        return LiveEvidence(
            url=base,
            reachable=True,
            error=f"{source or base + '/metrics'} is not a Prometheus text exposition: {error}",
            version=version,
            max_model_len=max_model_len,
            reading=None,
            traffic=None,
        )
    reading = read_vllm(exposition, url=base, version=version)
    problems.extend(reading.problems)
    traffic = read_traffic(exposition, problems) if reading.engines else None
    return LiveEvidence(
        url=base,
        reachable=True,
        error=None,
        version=version,
        max_model_len=max_model_len,
        reading=reading,
        traffic=traffic,
    )


def _json_field(body: bytes | BaseException, pick: Callable[[object], object]) -> object:
    if isinstance(body, BaseException):
        return None
    try:
        document = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return None
    return pick(document)


def _model_max_len(document: object) -> int | None:
    """max_model_len of the served model (not of a LoRA adapter, which names a parent)."""
    data = document.get("data") if isinstance(document, dict) else None
    if not isinstance(data, list):
        return None
    for model in data:
        if isinstance(model, dict) and model.get("parent") is None:
            value = model.get("max_model_len")
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
    return None


async def _gpu(client: httpx.AsyncClient, base: str, options: Options) -> GpuEvidence:
    if options.gpu_source == "none":
        return GpuEvidence(source="none", reading=None, error=None)
    source: GpuSource
    if options.gpu_source == "sim":
        source = SimGpuSource(
            fetcher=HttpxFetcher(client),
            url=base + "/sim/gpu",
            timeout_s=options.timeout_s,
            gpu_indices=options.gpu_indices,
            vllm_process_pattern=options.vllm_process_pattern,
        )
    else:
        from sidecar.sources.nvml import NvmlSource  # noqa: PLC0415 - pynvml only when NVML is asked for

        source = NvmlSource(gpu_indices=options.gpu_indices, vllm_process_pattern=options.vllm_process_pattern)
    try:
        result = await source.read()
    finally:
        await asyncio.to_thread(source.close)
    reading: GpuReading | None = result.value if result.ok else None
    return GpuEvidence(source=options.gpu_source, reading=reading, error=result.error)


def _history_path(history: str | None) -> Path | None:
    if history is None or re.match(r"https?://", history):
        return None
    path = Path(history)
    if path.is_dir():
        path = path / LEDGER_FILE
    if not path.is_file():
        raise InputError(f"cannot read --history {history}: no such file (a /status JSON, a state dir or a URL)")
    return path


async def _history(
    client: httpx.AsyncClient, history: str | None, path: Path | None, problems: list[str]
) -> HistoryFacts | None:
    if history is None:
        return None
    try:
        if path is None:
            url = history.rstrip("/") + ("" if history.rstrip("/").endswith("/status") else "/status")
            raw = await _fetch(client, url, MAX_SMALL_BYTES, 10.0)
            source = url
        else:
            raw = await asyncio.to_thread(read_capped_file, path, MAX_SMALL_BYTES)
            source = str(path)
        document = json.loads(raw)
        if isinstance(document, dict) and "restarts" in document and "engines" not in document:
            return from_ledger(document, source)
        return status_history(document, source)
    except (_FetchError, OSError, ValueError, HistoryError) as error:
        problems.append(f"history {history} not used: {error}")
        return None
