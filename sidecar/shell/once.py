"""`vllm-sidecar once`: one poll of vLLM and the GPUs, printed as the contract's JSON document or as text."""

from __future__ import annotations

import asyncio
import json

import structlog

from sidecar.model.status import OnceDocument
from sidecar.model.view import View
from sidecar.report.document import finite, once_document
from sidecar.shell.poller import (
    Poller,
    build_allocator_source,
    build_gpu_source,
    build_http_client,
    build_vllm_fetcher,
    build_vllm_source,
    derive_settings,
)
from sidecar.shell.settings import ScrapeSettings


async def poll_once(settings: ScrapeSettings) -> View:
    client = build_http_client(settings)
    fetcher = build_vllm_fetcher(settings, client)  # the daemon's, so `once` reads exactly what it reads
    gpu = build_gpu_source(settings, fetcher)
    try:
        poller = Poller(
            vllm=build_vllm_source(settings, fetcher),
            gpu=gpu,
            allocator=build_allocator_source(settings),
            derive=derive_settings(settings),
            logger=structlog.get_logger().bind(command="once"),
        )
        return await poller.tick()
    finally:
        await client.aclose()
        await fetcher.aclose()
        if gpu is not None:
            await asyncio.to_thread(gpu.close)


def render_json(document: OnceDocument) -> str:
    return json.dumps(finite(document), indent=2, allow_nan=False)


def render_text(document: OnceDocument, *, shows_vllm: bool = True) -> str:
    """A short human reading of the same document. `shows_vllm` False: something answers at the URL, but it is
    not vLLM (its problem line says what it answered); said as such, not as "NOT reachable"."""
    lines: list[str] = []
    vllm = document["vllm"]
    if not shows_vllm:
        lines.append(f"{vllm['url']} answers, but is not vLLM")
    else:
        state = "reachable" if vllm["reachable"] else "NOT reachable"
        lines.append(
            f"vLLM {vllm['url']}: {state}, version {vllm['version'] or '?'}, schema {vllm['metric_schema'] or '?'}"
        )
    engines, gpus = document["engines"], document["gpus"]
    lines.extend(
        (
            "  engine {engine} ({model_name}): KV {kv} of {cap} blocks x {bs} tokens, running {running}, "
            "waiting {waiting}, blocks/request {bpr}, headroom {headroom} requests, prefix hit ratio {hit}".format(
                engine=engine["engine"],
                model_name=engine["model_name"],
                kv=_fmt(engine["kv_cache_usage_ratio"], "{:.1%}"),
                cap=_fmt(engine["kv_cache_capacity_blocks"]),
                bs=_fmt(engine["kv_cache_block_size_tokens"]),
                running=_fmt(engine["requests_running"]),
                waiting=_fmt(engine["requests_waiting"]),
                bpr=_fmt(engine["kv_cache_blocks_per_request"], "{:.1f}"),
                headroom=_fmt(engine["kv_cache_request_headroom"], "{:.1f}"),
                hit=_fmt(engine["prefix_cache_hit_ratio_lifetime"], "{:.1%}"),
            )
        )
        for engine in engines
    )
    lines.extend(
        f"  GPU {gpu['gpu']}: {_gib(gpu['memory_used_bytes'])} of {_gib(gpu['memory_total_bytes'])} GiB used, "
        f"vLLM budget {_gib(gpu['memory_budget_bytes'])} GiB"
        for gpu in gpus
    )
    allocators = document["allocators"]
    lines.extend(
        f"  PyTorch allocator, GPU {a['gpu']} rank {a['rank']}: {_gib(a['allocated_bytes'])} GiB allocated of "
        f"{_gib(a['reserved_bytes'])} GiB reserved, {_gib(a['inactive_split_bytes'])} GiB in split free pieces, "
        f"{a['alloc_retries_total']} retries and {a['ooms_total']} OOMs since vLLM started"
        for a in allocators
    )
    lines.extend(f"  problem: {problem}" for problem in document["problems"])
    return "\n".join(lines)


def shows_vllm(view: View) -> bool:
    """False when what answers at the URL is not vLLM: /metrics missing or not an exposition, or one with no
    vllm: series from a server that names no vLLM version."""
    result = view.snapshot.vllm
    if result.wrong_server:
        return False
    return result.value is None or result.value.shows_vllm


def _fmt(value: object, pattern: str = "{}") -> str:
    return "?" if value is None else pattern.format(value)


def _gib(value: object) -> str:
    return f"{value / 2**30:.2f}" if isinstance(value, int | float) else "?"


def run_once(settings: ScrapeSettings, *, as_json: bool) -> tuple[int, str, str | None]:
    """Return (exit code, text for stdout, one-line error for stderr or None)."""
    view = asyncio.run(poll_once(settings))
    document = once_document(view.snapshot, view.derived, settings.vllm_url)
    output = render_json(document) if as_json else render_text(document, shows_vllm=shows_vllm(view))
    if view.snapshot.vllm.error is not None:
        return 1, output, f"vllm-sidecar: error: cannot read vLLM: {view.snapshot.vllm.error}"
    return 0, output, None
