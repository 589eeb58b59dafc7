"""Renders a load test's summary as readable text or as one JSON document. Pure.

In JSON, a value that is not known is null, never 0: no /metrics gives `"preemptions": null`, a run with no
streamed success gives null percentiles.
"""

from __future__ import annotations

import json
from typing import Any

from sidecar.loadtest.spec import LoadSpec
from sidecar.loadtest.summary import LATE_S, Percentiles, Summary, format_ratio, format_seconds
from sidecar.model.text import plural


def render_json(spec: LoadSpec, summary: Summary) -> str:
    return json.dumps(document(spec, summary), separators=(",", ":"))


def document(spec: LoadSpec, summary: Summary) -> dict[str, Any]:
    return {
        "target": {
            "url": spec.url,
            "api": str(spec.api),
            "model": summary.model,
            "max_model_len": summary.max_model_len,
        },
        "load": {
            "mode": "open_loop" if spec.open_loop else "closed_loop",
            "rate_per_s": spec.rate_per_s,
            "concurrency": spec.concurrency,
            "duration_s": spec.duration_s,
            "max_requests": spec.max_requests,
            "timeout_s": spec.timeout_s,
            "max_in_flight": spec.max_in_flight if spec.open_loop else None,
            "prompt_tokens": None if spec.prompts else str(spec.prompt_tokens),
            "output_tokens": str(spec.output_tokens),
            "prompts_file": spec.prompts_file,
            "shared_prefix_ratio": spec.shared_prefix_ratio,
            "shared_prefixes": spec.shared_prefixes,
            "shared_prefix_tokens": spec.shared_prefix_tokens,
            "seed": spec.seed,
            "max_error_rate": spec.max_error_rate,
        },
        "requests": {
            "total": summary.total,
            "sent": summary.sent,
            "succeeded": summary.succeeded,
            "failed": summary.failed,
            "error_ratio": summary.error_ratio,
            "stopped_early": summary.stopped_early,
            "failures": {str(kind): count for kind, count in summary.failures.items()},
            "first_errors": {str(kind): error for kind, error in summary.first_errors.items()},
            "http_status_codes": {str(code): count for code, count in summary.status_codes.items()},
        },
        "duration_s": summary.duration_s,
        "sending_s": summary.sending_s,
        "max_send_lag_s": summary.max_send_lag_s,
        "throughput": {
            "requests_per_s": summary.requests_per_s,
            "completed_per_s": summary.completed_per_s,
            "output_tokens_per_s": summary.output_tokens_per_s,
            "total_tokens_per_s": summary.total_tokens_per_s,
            "prompt_tokens": summary.prompt_tokens,
            "output_tokens": summary.output_tokens,
            "token_source": None if summary.token_source is None else str(summary.token_source),
        },
        "latency_s": {"ttft": _percentiles(summary.ttft_s), "e2e": _percentiles(summary.e2e_s)},
        "server": {
            "metrics_available": summary.metrics_available,
            "metrics_readings": summary.metrics_readings,
            "peak_kv_cache_usage_ratio": summary.peak_kv_usage_ratio,
            "preemptions": summary.preemptions,
            "died": summary.server_died,
            "died_at_s": summary.died_at_s,
            "died_reason": summary.died_reason,
        },
        "verdict": str(summary.verdict),
        "verdict_line": summary.verdict_line,
    }


def render_text(spec: LoadSpec, summary: Summary) -> str:
    context = f"model {summary.model}" + (
        f", max_model_len {summary.max_model_len}" if summary.max_model_len is not None else ""
    )
    lines = [
        f"loadtest of {spec.url} ({spec.api} API, {context})",
        f"load:         {_load(spec)}",
        f"lengths:      {_lengths(spec)}",
        f"requests:     {_requests(summary)}",
        f"duration:     {format_seconds(summary.duration_s)}; {_rate(summary.requests_per_s)} requests/s sent"
        f"{_lag(summary)}, {_rate(summary.completed_per_s)} requests/s completed",
        f"tokens:       {_tokens(summary)}",
        f"TTFT:         {_percentile_text(summary.ttft_s)}",
        f"end to end:   {_percentile_text(summary.e2e_s)}",
        f"KV cache:     peak usage {format_ratio(summary.peak_kv_usage_ratio)}{_no_metrics(summary)}",
        f"preemptions:  {_preemptions(summary)}",
        f"server:       {_server(summary)}",
        summary.verdict_line,
    ]
    return "\n".join(lines)


def _load(spec: LoadSpec) -> str:
    bounds = []
    if spec.duration_s is not None:
        bounds.append(f"{spec.duration_s:g} s")
    if spec.max_requests is not None:
        bounds.append(plural(spec.max_requests, "request"))
    if spec.rate_per_s is not None:
        shape = f"open loop, Poisson arrivals at {spec.rate_per_s:g} requests/s, at most {spec.max_in_flight} in flight"
    else:
        shape = f"closed loop, {spec.concurrency} concurrent"
    return f"{shape}; for {' or '.join(bounds)}; timeout {spec.timeout_s:g} s per request; seed {spec.seed}"


def _lengths(spec: LoadSpec) -> str:
    if spec.prompts:
        return f"prompts from {spec.prompts_file} ({len(spec.prompts)}), output {plural(spec.output_tokens, 'token')}"
    text = f"prompt {plural(spec.prompt_tokens, 'token')}, output {plural(spec.output_tokens, 'token')}"
    if spec.shared_prefix_ratio > 0:
        text += (
            f"; {spec.shared_prefix_ratio:.0%} start with one of "
            f"{plural(spec.shared_prefixes, 'shared prefix', 'shared prefixes')} "
            f"of {plural(spec.shared_prefix_tokens, 'token')}"
        )
    return text


def _requests(summary: Summary) -> str:
    text = f"{summary.total} total, {summary.sent} sent, {summary.succeeded} ok, {summary.failed} failed"
    kinds = [f"{kind} {count}" for kind, count in summary.failures.items() if count]
    if kinds:
        codes = ", ".join(f"HTTP {code} x{count}" for code, count in summary.status_codes.items())
        text += f" ({', '.join(kinds)}{'; ' + codes if codes else ''})"
    if summary.stopped_early:
        text += "; sending stopped early: the server refused connections"
    for kind, error in summary.first_errors.items():
        text += f"\n    first {kind}: {error}"
    return text


def _tokens(summary: Summary) -> str:
    if summary.token_source is None:
        return "none generated"
    source = {
        "usage": "from the server's usage",
        "requested": "as requested; the server reported no usage",
        "mixed": "from the server's usage where it reported one",
    }[str(summary.token_source)]
    return (
        f"{_rate(summary.output_tokens_per_s)} output tokens/s, {_rate(summary.total_tokens_per_s)} total tokens/s "
        f"({summary.output_tokens} output, {summary.prompt_tokens} prompt tokens, {source})"
    )


def _lag(summary: Summary) -> str:
    """An open loop's arrivals late by more than LATE_S mean the client, not the server, set the pace."""
    lag = summary.max_send_lag_s
    if lag is None or lag < LATE_S:
        return ""
    return f" (the client sent some arrivals up to {format_seconds(lag)} late: it could not keep up)"


def _no_metrics(summary: Summary) -> str:
    if not summary.metrics_available:
        return " (the server has no vLLM /metrics)"
    # A sample, not a maximum: vLLM's gauge between two reads is not seen (docs/tools.md).
    return f" (the highest of {plural(summary.metrics_readings, '/metrics reading')})"


def _preemptions(summary: Summary) -> str:
    if summary.preemptions is None:
        return f"not available{_no_metrics(summary)}"
    value = summary.preemptions
    return f"{value:.0f} during the run" if value == int(value) else f"{value:.1f} during the run"


def _server(summary: Summary) -> str:
    if summary.server_died and summary.died_at_s is not None:
        return f"DIED {summary.died_at_s:.1f} s into the run ({summary.died_reason})"
    return "up at the end"


def _percentile_text(values: Percentiles) -> str:
    if values.p50 is None:
        return "not available"
    return f"p50 {format_seconds(values.p50)}, p95 {format_seconds(values.p95)}, p99 {format_seconds(values.p99)}"


def _percentiles(values: Percentiles) -> dict[str, float | None]:
    return {"p50": values.p50, "p95": values.p95, "p99": values.p99}


def _rate(value: float | None) -> str:
    return "not available" if value is None else f"{value:.1f}" if value >= 10 else f"{value:.2f}"
