"""Generate the Grafana dashboard grafana/vllm-sidecar.json from the typed panel list below.

python grafana/generate.py           # writes grafana/vllm-sidecar.json
python grafana/generate.py --check   # exits 1 when the committed file differs from what it would write

Metric names and the HELP texts in panel descriptions come from sidecar/exporter/names.py, so a renamed metric
changes the dashboard (and `--check` fails until it is regenerated). Layout follows Grafana's 24-column grid:
each row's panels are placed left to right and wrap when the next one does not fit.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from sidecar.derive.settings import DeriveSettings
from sidecar.exporter import names
from sidecar.exporter.names import Kind, MetricSpec
from sidecar.policy.settings import PolicySettings

HERE = Path(__file__).resolve().parent
OUTPUT = HERE / "vllm-sidecar.json"

UID = "vllm-sidecar"
SCHEMA_VERSION = 39  # Grafana 10.4+; 11.x and 12.x import it unchanged
GRID_COLUMNS = 24
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
RUNBOOKS = "https://github.com/vllm-sidecar/vllm-sidecar/blob/main/docs/runbooks.md"

# The defaults of the daemon's flags, drawn as threshold lines: where the sidecar acts. Read from the policy and
# the derivation themselves, the one place each default is written (tests/alerts/test_threshold_drift.py).
POLICY = PolicySettings()
DERIVE = DeriveSettings()
PAUSE_KV_USAGE = POLICY.pause_kv_usage_ratio
RESUME_KV_USAGE = POLICY.resume_kv_usage_ratio
OOM_FORECAST_S = POLICY.oom_forecast_s
HUNG_AFTER_S = POLICY.hung_after_s
PREEMPTIONS_PER_S = POLICY.preemptions_per_s
ALLOC_RETRIES = POLICY.pause_alloc_retries
SHORT_HORIZON_POLLS = DERIVE.short_horizon_polls  # the polls the judged rates span

# The sidecar's own series carry the sidecar's scrape `instance`; vLLM's series come from another target (another
# instance label), so vLLM panels select by model and engine only. V0 vLLM has no engine label at all (the sidecar
# calls it engine "0"), hence the empty alternative: choosing engine 0 must not hide a V0 server.
SIDECAR = 'instance=~"$instance"'
ENGINE = SIDECAR + ', model_name=~"$model_name", engine=~"$engine"'
MODEL = SIDECAR + ', model_name=~"$model_name"'  # server-level series of one served model (no engine label)
GPU = SIDECAR + ', gpu=~"$gpu"'
VLLM = 'model_name=~"$model_name", engine=~"$engine|"'

LEGEND_SIDECAR = "{{instance}}"
LEGEND_ENGINE = "{{model_name}}/{{engine}} {{instance}}"
LEGEND_MODEL = "{{model_name}} {{instance}}"
LEGEND_GPU = "GPU {{gpu}} {{instance}}"

# vLLM renamed its KV-usage gauge in 0.9.2 and dropped the old name in 0.12; both exist in 0.9.2-0.11.
KV_USAGE_VLLM = "vllm:kv_cache_usage_perc|vllm:gpu_cache_usage_perc"


def series(spec: MetricSpec) -> str:
    """The name a PromQL selector uses: counters gain `_total`, info metrics `_info` on exposition."""
    if spec.kind is Kind.COUNTER:
        return spec.name + "_total"
    return spec.exposed_name


def sel(spec: MetricSpec, matchers: str) -> str:
    return f"{series(spec)}{{{matchers}}}"


def quantiles(histogram: str, by: str = "instance, model_name, engine") -> tuple[Query, ...]:
    """p50/p90/p99 of a vLLM histogram over the panel's rate window, per engine."""
    buckets = f"sum by (le, {by}) (rate({histogram}_bucket{{{VLLM}}}[$__rate_interval]))"
    return tuple(
        Query(f"histogram_quantile({q}, {buckets})", f"p{round(q * 100)} {{{{model_name}}}}/{{{{engine}}}}")
        for q in (0.5, 0.9, 0.99)
    )


class Viz(StrEnum):
    TIMESERIES = "timeseries"
    STAT = "stat"
    STATE_TIMELINE = "state-timeline"


@dataclass(frozen=True, slots=True)
class Query:
    expr: str
    legend: str
    instant: bool = False  # stat panels read the latest value only


@dataclass(frozen=True, slots=True)
class Step:
    """A threshold: from `value` upwards (None: from minus infinity) the colour is `color`."""

    value: float | None
    color: str


@dataclass(frozen=True, slots=True)
class Shown:
    """A value mapping: `value` is displayed as `text` in `color`."""

    value: str
    text: str
    color: str


GREEN_ONLY = (Step(None, "green"),)


@dataclass(frozen=True, slots=True, kw_only=True)
class Panel:
    title: str
    what: str  # what the panel answers for the on-call engineer; the metrics' HELP texts are appended
    queries: tuple[Query, ...]
    viz: Viz = Viz.TIMESERIES
    unit: str = "short"
    width: int = 12
    height: int = 8
    min: float | None = None
    max: float | None = None
    steps: tuple[Step, ...] = GREEN_ONLY
    threshold_lines: bool = False  # draw the steps as dashed lines on a time series
    mappings: tuple[Shown, ...] = ()
    stepped: bool = False  # 0/1 and counts: no interpolation between samples
    no_value: str | None = None  # stat text when the query is empty (absent means something, e.g. "not growing")
    text_mode: str = "auto"  # stat: "name" shows the legend (e.g. a version label) instead of the value
    color_by_value: bool = False  # stat: colour the background from steps/mappings
    decimals: int | None = None  # e.g. 0 for a count from increase(), which extrapolates to fractions


@dataclass(frozen=True, slots=True)
class Row:
    title: str
    panels: tuple[Panel, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class Annotation:
    name: str
    expr: str
    color: str
    title: str
    text: str
    interval: str = "30s"
    value_is_time: bool = False  # the sample's value (ms) is when it happened (Grafana's useValueForTime)


@dataclass(frozen=True, slots=True, kw_only=True)
class Variable:
    name: str
    label: str
    query: str  # label_values(metric{...}, label)
    what: str
    sort: int = 1  # alphabetical; 3 = numerical


ADMISSION = (Shown("0", "admitting", "green"), Shown("1", "PAUSED", "red"))
READINESS = (Shown("0", "NOT READY", "red"), Shown("1", "ready", "green"))
UP_DOWN = (Shown("0", "DOWN", "red"), Shown("1", "OK", "green"))

OVERVIEW = Row(
    "Overview: admission and policy",
    (
        Panel(
            title="Admission",
            what="Whether the sidecar's /readyz lets traffic in. PAUSED: the load balancer sends nothing to this "
            "vLLM; the policy state and the annotations say why.",
            queries=(Query(sel(names.ADMISSION_PAUSED, SIDECAR), LEGEND_SIDECAR, instant=True),),
            viz=Viz.STAT,
            width=3,
            height=4,
            mappings=ADMISSION,
            color_by_value=True,
        ),
        Panel(
            title="Ready (/readyz)",
            what="Whether /readyz answers 200: vLLM seen healthy within the sidecar's last 3 polls and admission "
            "not paused. NOT READY while vLLM is unreachable, loading, gone or not vLLM, as well as while paused.",
            queries=(Query(sel(names.READY, SIDECAR), LEGEND_SIDECAR, instant=True),),
            viz=Viz.STAT,
            width=3,
            height=4,
            mappings=READINESS,
            color_by_value=True,
        ),
        Panel(
            title="Policy state",
            what="The policy's current state: normal, pressure (a rule is partly met), paused, draining, "
            "restarting, cooldown, failed (automatic restarts off until a manual action).",
            queries=(Query(sel(names.POLICY_STATE, SIDECAR) + " == 1", "{{state}}", instant=True),),
            viz=Viz.STAT,
            width=4,
            height=4,
            text_mode="name",
        ),
        Panel(
            title="vLLM reachable",
            what="poll: the last read of vLLM's /metrics worked. health: vLLM's /health answered 200 (it stays 200 "
            "on a hung engine: see Engine stalled).",
            queries=(
                Query(sel(names.UP, SIDECAR), "poll " + LEGEND_SIDECAR, instant=True),
                Query(sel(names.VLLM_HEALTHY, SIDECAR), "health " + LEGEND_SIDECAR, instant=True),
            ),
            viz=Viz.STAT,
            width=4,
            height=4,
            mappings=UP_DOWN,
            color_by_value=True,
        ),
        Panel(
            title="Restart budget left",
            what="Automatic restarts still allowed this hour (--max-restarts-per-hour). At 0 a due restart is "
            "blocked and only a manual one works.",
            queries=(Query(sel(names.RESTART_BUDGET_REMAINING, SIDECAR), LEGEND_SIDECAR, instant=True),),
            viz=Viz.STAT,
            width=3,
            height=4,
            steps=(Step(None, "red"), Step(1, "orange"), Step(2, "green")),
            color_by_value=True,
        ),
        Panel(
            title="Last restart",
            what="When the sidecar last restarted vLLM, from its persisted ledger (survives sidecar restarts).",
            queries=(Query(sel(names.LAST_RESTART, SIDECAR) + " * 1000", LEGEND_SIDECAR, instant=True),),
            viz=Viz.STAT,
            unit="dateTimeFromNow",
            width=3,
            height=4,
            no_value="never",
        ),
        Panel(
            title="Time to OOM (soonest GPU)",
            what="Forecast from the trend of used GPU memory. Empty while memory is not growing. Under "
            f"--oom-forecast ({OOM_FORECAST_S:g} s) for {POLICY.oom_forecast_ticks} polls the sidecar restarts vLLM "
            "in a planned way.",
            queries=(Query(f"min by (instance) ({sel(names.GPU_TIME_TO_OOM, GPU)})", LEGEND_SIDECAR, instant=True),),
            viz=Viz.STAT,
            unit="s",
            width=4,
            height=4,
            steps=(Step(None, "red"), Step(OOM_FORECAST_S, "orange"), Step(4 * OOM_FORECAST_S, "green")),
            no_value="not growing",
            color_by_value=True,
        ),
        Panel(
            title="Policy state over time",
            what="Which state the policy was in, per sidecar. Pauses and restarts are also annotations on every "
            "time series.",
            queries=(Query(sel(names.POLICY_STATE, SIDECAR) + " == 1", "{{instance}} {{state}}"),),
            viz=Viz.STATE_TIMELINE,
            width=24,
            height=6,
            mappings=(Shown("1", "", "blue"),),
        ),
        Panel(
            title="Actions taken and failed",
            what="What the sidecar did per rate window (in --dry-run: would have done). A failed restart latches "
            "the FAILED state until a manual resume or restart.",
            queries=(
                Query(
                    f"sum by (instance, action) (increase({sel(names.ACTIONS, SIDECAR)}[$__rate_interval]))",
                    "{{action}} {{instance}}",
                ),
                Query(
                    f"sum by (instance, action) (increase({sel(names.ACTION_FAILURES, SIDECAR)}[$__rate_interval]))",
                    "failed {{action}} {{instance}}",
                ),
            ),
            stepped=True,
            min=0,
        ),
        Panel(
            title="Engine probes",
            what="The 1-token completions the sidecar sends after a while without engine progress (idle or not): "
            "answered (the engine works), no_answer (a wedge, unless the engine moved meanwhile), inconclusive "
            "(an HTTP error: no evidence), per rate window. How long the last one took: /status, last_probe.",
            queries=(
                Query(
                    f"sum by (instance, outcome) (increase({sel(names.PROBES, SIDECAR)}[$__rate_interval]))",
                    "{{outcome}} {{instance}}",
                ),
            ),
            stepped=True,
            min=0,
        ),
        Panel(
            title="Restarts by reason",
            what="Restarts of vLLM the sidecar performed per rate window: engine_dead, engine_hung, oom_forecast, "
            "pressure_events, manual.",
            queries=(
                Query(
                    f"sum by (instance, reason) (increase({sel(names.RESTARTS, SIDECAR)}[$__rate_interval]))",
                    "{{reason}} {{instance}}",
                ),
            ),
            stepped=True,
            min=0,
        ),
    ),
)

KV_CACHE = Row(
    "KV cache",
    (
        Panel(
            title="KV-cache usage",
            what=f"Share of KV blocks in use. The sidecar pauses admission at --pause-kv-usage ({PAUSE_KV_USAGE:g}) "
            f"and resumes at --resume-kv-usage ({RESUME_KV_USAGE:g}) (defaults drawn). 'vLLM' is vLLM's own gauge "
            "(kv_cache_usage_perc, gpu_cache_usage_perc before 0.9.2), shown even when the sidecar is down.",
            queries=(
                Query(sel(names.KV_USAGE, ENGINE), LEGEND_ENGINE),
                Query(
                    f'max without (pid) ({{__name__=~"{KV_USAGE_VLLM}", {VLLM}}})',
                    "vLLM {{model_name}}/{{engine}}",
                ),
            ),
            unit="percentunit",
            min=0,
            max=1,
            steps=(Step(None, "green"), Step(RESUME_KV_USAGE, "orange"), Step(PAUSE_KV_USAGE, "red")),
            threshold_lines=True,
        ),
        Panel(
            title="KV blocks: used and capacity",
            what="Blocks of this engine (num_gpu_blocks of vllm:cache_config_info shared by the data-parallel "
            "engines) and how many requests hold, counted the way this vLLM version counts its null block.",
            queries=(
                Query(sel(names.KV_USED, ENGINE), "used " + LEGEND_ENGINE),
                Query(sel(names.KV_CAPACITY, ENGINE), "capacity " + LEGEND_ENGINE),
            ),
            width=6,
            min=0,
        ),
        Panel(
            title="KV capacity",
            what="Tokens the KV cache of each engine holds: vLLM's own figure (0.24+) or blocks x block size.",
            queries=(Query(sel(names.KV_CAPACITY_TOKENS, ENGINE), LEGEND_ENGINE, instant=True),),
            viz=Viz.STAT,
            unit="short",
            width=3,
        ),
        Panel(
            title="Block size",
            what="Tokens per KV block.",
            queries=(Query(sel(names.KV_BLOCK_SIZE, ENGINE), LEGEND_ENGINE, instant=True),),
            viz=Viz.STAT,
            unit="none",
            width=3,
        ),
        Panel(
            title="Requests that still fit",
            what="Free blocks / blocks per running request: how many more requests of today's average size fit. "
            "Empty while nothing runs.",
            queries=(Query(sel(names.KV_HEADROOM, ENGINE), LEGEND_ENGINE),),
            width=6,
            height=7,
            min=0,
            steps=(Step(None, "red"), Step(1, "orange"), Step(4, "green")),
        ),
        Panel(
            title="Blocks per running request",
            what="Average KV footprint of a running request. Empty while nothing runs.",
            queries=(Query(sel(names.KV_PER_REQUEST, ENGINE), LEGEND_ENGINE),),
            width=6,
            height=7,
            min=0,
        ),
        Panel(
            title="Fragmentation (estimate)",
            what="Share of used KV slots that hold no token, assuming each request's last block is half empty.",
            queries=(Query(sel(names.KV_FRAGMENTATION, ENGINE), LEGEND_ENGINE),),
            unit="percentunit",
            width=6,
            height=7,
            min=0,
        ),
        Panel(
            title="Prefix-cache hit ratio",
            what="Hits / queries of vLLM's prefix cache over the sidecar's --window. Empty when prefix caching "
            "is off or nothing was queried.",
            queries=(Query(sel(names.PREFIX_HIT_RATIO, ENGINE), LEGEND_ENGINE),),
            unit="percentunit",
            width=6,
            height=7,
            min=0,
            max=1,
        ),
    ),
)

GPU_MEMORY = Row(
    "GPU memory",
    (
        Panel(
            title="GPU memory: used, vLLM budget, total",
            what="Budget is vLLM's --gpu-memory-utilization x total: vLLM plans to stay under it. Used above the "
            "budget is memory vLLM did not plan for (activations it never profiled, a leak, another process).",
            queries=(
                Query(sel(names.GPU_USED, GPU), "used " + LEGEND_GPU),
                Query(sel(names.GPU_BUDGET, GPU), "budget " + LEGEND_GPU),
                Query(sel(names.GPU_TOTAL, GPU), "total " + LEGEND_GPU),
            ),
            unit="bytes",
            min=0,
        ),
        Panel(
            title="GPU memory by process owner",
            what="Memory held by vLLM's processes, by another tenant, and by processes not visible from here.",
            queries=(Query(sel(names.GPU_PROCESS_MEMORY, GPU), "{{owner}} GPU {{gpu}} {{instance}}"),),
            unit="bytes",
            min=0,
        ),
        Panel(
            title="Over budget",
            what="Used - budget. Positive: memory outside vLLM's reservation; negative: room to spare.",
            queries=(Query(sel(names.GPU_OVER_BUDGET, GPU), LEGEND_GPU),),
            unit="bytes",
            width=6,
            height=7,
            steps=(Step(None, "green"), Step(0, "red")),
            threshold_lines=True,
        ),
        Panel(
            title="Memory growth",
            what="Least-squares slope of used memory over --memory-trend-window (needs "
            f"{DERIVE.min_trend_points} polls over {DERIVE.min_trend_span_s:g} s), since the slope last changed.",
            queries=(Query(sel(names.GPU_GROWTH, GPU), LEGEND_GPU),),
            unit="Bps",
            width=6,
            height=7,
        ),
        Panel(
            title="Time to OOM",
            what="(total - used) / growth; empty unless memory grows and the trend fits (R² >= --min-trend-r2).",
            queries=(Query(sel(names.GPU_TIME_TO_OOM, GPU), LEGEND_GPU),),
            unit="s",
            width=6,
            height=7,
            min=0,
            steps=(Step(None, "red"), Step(OOM_FORECAST_S, "green")),
            threshold_lines=True,
        ),
        Panel(
            title="GPU utilisation",
            what="Share of time the GPU was busy (NVML).",
            queries=(Query(sel(names.GPU_UTILIZATION, GPU), LEGEND_GPU),),
            unit="percentunit",
            width=6,
            height=7,
            min=0,
            max=1,
        ),
        Panel(
            title="GPU temperature",
            what="NVML's GPU temperature.",
            queries=(Query(sel(names.GPU_TEMPERATURE, GPU), LEGEND_GPU),),
            unit="celsius",
            width=8,
            height=6,
        ),
        Panel(
            title="Xid errors",
            what="Critical Xid events the driver reported per rate window. Any is worth a look at dmesg; 79 (fallen "
            "off the bus) and 48 (double-bit ECC) need the node drained.",
            queries=(
                Query(
                    f"sum by (instance, gpu) (increase({sel(names.GPU_XID, GPU)}[$__rate_interval]))",
                    LEGEND_GPU,
                ),
            ),
            width=8,
            height=6,
            min=0,
            stepped=True,
        ),
        Panel(
            title="Last Xid",
            what="Code of the last Xid event per GPU since the sidecar started.",
            queries=(Query(sel(names.GPU_LAST_XID, GPU), LEGEND_GPU, instant=True),),
            viz=Viz.STAT,
            unit="none",
            width=8,
            height=6,
            no_value="none seen",
            steps=(Step(None, "orange"),),
            color_by_value=True,
        ),
    ),
)

VLLM_ENGINE = Row(
    "vLLM engine",
    (
        Panel(
            title="Requests running and waiting",
            what="vLLM's own gauges. Waiting that grows while running stays flat: the KV cache or max-num-seqs "
            "is the limit.",
            queries=(
                Query(
                    f"max by (instance, model_name, engine) (vllm:num_requests_running{{{VLLM}}})",
                    "running {{model_name}}/{{engine}}",
                ),
                Query(
                    f"max by (instance, model_name, engine) (vllm:num_requests_waiting{{{VLLM}}})",
                    "waiting {{model_name}}/{{engine}}",
                ),
            ),
            width=8,
            min=0,
        ),
        Panel(
            title="Preemptions",
            what="Requests vLLM evicted from the KV cache to make room (recomputed later): the cache is too small "
            f"for the concurrency. 'judged' is the sidecar's rate over its last {SHORT_HORIZON_POLLS} polls: above "
            f"the policy's {PREEMPTIONS_PER_S:g}/s (drawn) it pauses admission, and the pause ends when the "
            "storm has left those polls. 'vLLM' is vLLM's counter over the panel's rate window.",
            queries=(
                Query(
                    "sum by (instance, model_name, engine) "
                    f"(rate(vllm:num_preemptions_total{{{VLLM}}}[$__rate_interval]))",
                    "vLLM {{model_name}}/{{engine}}",
                ),
                Query(sel(names.PREEMPTIONS_RATE, ENGINE), "judged " + LEGEND_ENGINE),
            ),
            unit="ops",
            width=8,
            min=0,
            steps=(Step(None, "green"), Step(PREEMPTIONS_PER_S, "red")),
            threshold_lines=True,
        ),
        Panel(
            title="Engine stalled",
            what="Seconds since the engine last made progress while requests were running (0 when idle or "
            f"progressing). /health stays 200 on a hung engine; past --hung-after ({HUNG_AFTER_S:g} s), once a "
            "1-token probe got no answer with nothing moving, the sidecar restarts vLLM.",
            queries=(Query(sel(names.ENGINE_STALLED, ENGINE), LEGEND_ENGINE),),
            unit="s",
            width=8,
            min=0,
            steps=(Step(None, "green"), Step(HUNG_AFTER_S, "red")),
            threshold_lines=True,
        ),
        Panel(
            title="Time to first token",
            what="Quantiles of vLLM's TTFT histogram over the rate window.",
            queries=quantiles("vllm:time_to_first_token_seconds"),
            unit="s",
            width=8,
            min=0,
        ),
        Panel(
            title="End-to-end request latency",
            what="Quantiles of vLLM's e2e latency histogram over the rate window.",
            queries=quantiles("vllm:e2e_request_latency_seconds"),
            unit="s",
            width=8,
            min=0,
        ),
        Panel(
            title="Tokens per second",
            what="Prompt and generated tokens vLLM processed.",
            queries=(
                Query(
                    "sum by (instance, model_name, engine) "
                    f"(rate(vllm:prompt_tokens_total{{{VLLM}}}[$__rate_interval]))",
                    "prompt {{model_name}}/{{engine}}",
                ),
                Query(
                    "sum by (instance, model_name, engine) "
                    f"(rate(vllm:generation_tokens_total{{{VLLM}}}[$__rate_interval]))",
                    "generated {{model_name}}/{{engine}}",
                ),
            ),
            width=8,
            min=0,
        ),
    ),
)

# vLLM's own shedding (--max-num-queued-*, 0.29+, counted from 0.32), its queue split by reason (0.20+) and its
# fault tolerance's engine health (main after 0.33.0): what the sidecar reads of vLLM's own admission control.
VLLM_ADMISSION = Row(
    "vLLM's own admission: shedding, queue reasons, fault tolerance",
    (
        Panel(
            title="vLLM refusing requests",
            what="Requests vLLM itself answered 503 because its --max-num-queued-reqs or --max-num-queued-tokens "
            "cap was full (vLLM 0.32+), per served model, over the sidecar's last "
            f"{SHORT_HORIZON_POLLS} polls. Clients should retry on "
            "another instance; a steady rate means this replica is full (alert VllmShedding).",
            queries=(Query(sel(names.VLLM_REJECTIONS_RATE, MODEL), LEGEND_MODEL),),
            unit="reqps",
            width=8,
            min=0,
        ),
        Panel(
            title="Refused over the window",
            what="vLLM's refusals over the sidecar's --window; GET /status splits them by reason.",
            queries=(Query(sel(names.VLLM_REJECTIONS_IN_WINDOW, MODEL), LEGEND_MODEL, instant=True),),
            viz=Viz.STAT,
            unit="none",
            width=4,
            steps=(Step(None, "green"), Step(1, "orange")),
            color_by_value=True,
        ),
        Panel(
            title="Waiting: for capacity or deferred",
            what="vLLM's queue by reason (0.20+): 'capacity' waits for KV blocks or a batch slot, which a pause "
            "helps free; 'deferred' waits on a LoRA slot, a KV transfer or another transient constraint. The "
            "sidecar's queue rule counts only capacity. Older vLLM does not split: its whole queue shows as 'all'.",
            queries=(
                Query(
                    "max by (instance, model_name, engine, reason) "
                    f"(vllm:num_requests_waiting_by_reason{{{VLLM}}}) or on (instance, model_name, engine) "
                    "label_replace(max by (instance, model_name, engine) (vllm:num_requests_waiting{"
                    + VLLM
                    + '}), "reason", "all", "", "")',
                    "{{reason}} {{model_name}}/{{engine}}",
                ),
            ),
            width=8,
            min=0,
        ),
        Panel(
            title="Deferred share of waiting",
            what="Share of the waiting requests vLLM defers rather than holds for capacity. Empty while nothing "
            "waits, or before vLLM 0.20.",
            queries=(Query(sel(names.WAITING_DEFERRED_RATIO, ENGINE), LEGEND_ENGINE),),
            unit="percentunit",
            width=4,
            min=0,
            max=1,
        ),
        Panel(
            title="Engine held unhealthy (fault tolerance)",
            what="Seconds vLLM's fault tolerance (--enable-fault-tolerance) has reported the engine unhealthy "
            "(vllm:engine_healthy 0): vLLM answers 503 and the sidecar pauses admission until it is healthy "
            "again. 0 while healthy; empty without fault tolerance.",
            queries=(Query(sel(names.ENGINE_UNHEALTHY, ENGINE), LEGEND_ENGINE),),
            unit="s",
            width=12,
            min=0,
            steps=(Step(None, "green"), Step(60, "red")),
            threshold_lines=True,
        ),
        Panel(
            title="Preemptions over the window",
            what="Requests vLLM preempted over the sidecar's --window (the rate it judges is on the Preemptions "
            "panel).",
            queries=(Query(sel(names.PREEMPTIONS_IN_WINDOW, ENGINE), LEGEND_ENGINE),),
            unit="none",
            width=12,
            min=0,
            stepped=True,
        ),
    ),
)

# Opt-in acting on a crash's cause (--remediate, docs/remediation.md) and the incident folders kept before a restart
# and after a crash (docs/incidents.md). A remediation is rare enough to count over the whole time range; incidents
# come with restarts, so they are drawn per rate window, in line with "Restarts by reason" and the restart marks.
PENDING = (Shown("0", "none", "green"), Shown("1", "PENDING", "orange"))
REMEDIATIONS_AND_INCIDENTS = Row(
    "Remediations and incidents",
    (
        Panel(
            title="Remediations over the time range",
            what="Changes the sidecar made to vLLM's flags for its next start after a crash whose cause the doctor "
            "determined (--remediate), counted over the dashboard's time range, by outcome and flag. reverted: the "
            "change did not help, a person must decide (alert VllmRemediationReverted); refused: the guard rails did "
            "not allow the fix (VllmRemediationRefused). `vllm-sidecar remediations list` has the history.",
            queries=(
                Query(
                    f"sum by (instance, flag, outcome) (increase({sel(names.REMEDIATIONS, SIDECAR)}[$__range])) > 0",
                    "{{outcome}} {{flag}} {{instance}}",
                    instant=True,
                ),
            ),
            viz=Viz.STAT,
            unit="none",
            width=10,
            height=6,
            no_value="none",
            decimals=0,
        ),
        Panel(
            title="Flags set for vLLM's next start",
            what="The value the sidecar writes into vLLM's flags file for each flag it changed; none: vLLM starts "
            "with its own flags.",
            queries=(Query(sel(names.REMEDIATION_FLAG_VALUE, SIDECAR), "{{flag}} {{instance}}", instant=True),),
            viz=Viz.STAT,
            unit="none",
            width=9,
            height=6,
            no_value="none",
        ),
        Panel(
            title="Remediation pending",
            what="PENDING while a change to vLLM's flags waits to prove itself; it ends confirmed or reverted.",
            queries=(Query(sel(names.REMEDIATION_PENDING, SIDECAR), LEGEND_SIDECAR, instant=True),),
            viz=Viz.STAT,
            width=5,
            height=6,
            mappings=PENDING,
            color_by_value=True,
        ),
        Panel(
            title="Incidents by trigger",
            what="Incident folders the sidecar kept per rate window (<state-dir>/incidents/): before_restart, with "
            "vLLM's stacks where it may read them, or after_crash, when vLLM died and came back on its own.",
            queries=(
                Query(
                    f"sum by (instance, trigger) (increase({sel(names.INCIDENTS, SIDECAR)}[$__rate_interval]))",
                    "{{trigger}} {{instance}}",
                ),
            ),
            unit="none",
            min=0,
            stepped=True,
        ),
        Panel(
            title="Incident parts missing",
            what="Parts an incident could not keep per rate window, by kind; each incident's manifest.json says "
            "why. stacks: install py-spy and grant ptrace (alert VllmIncidentStacksMissing, docs/incidents.md).",
            queries=(
                Query(
                    "sum by (instance, kind) "
                    f"(increase({sel(names.INCIDENT_PARTS_MISSING, SIDECAR)}[$__rate_interval]))",
                    "{{kind}} {{instance}}",
                ),
            ),
            unit="none",
            min=0,
            stepped=True,
        ),
    ),
)

SIDECAR_SELF = Row(
    "Sidecar self",
    (
        Panel(
            title="Sidecar version",
            what="The sidecar build each instance runs.",
            queries=(Query(sel(names.BUILD_INFO, SIDECAR), "{{version}}", instant=True),),
            viz=Viz.STAT,
            width=4,
            height=4,
            text_mode="name",
        ),
        Panel(
            title="vLLM version and metric schema",
            what="vLLM's version (from /version) and which metric names it exposes (v0, v1-legacy, v1).",
            queries=(Query(sel(names.VLLM_INFO, SIDECAR), "{{version}} ({{metric_schema}})", instant=True),),
            viz=Viz.STAT,
            width=6,
            height=4,
            text_mode="name",
        ),
        Panel(
            title="Problems",
            what="Things the last poll could not read or make sense of; GET /status lists them.",
            queries=(Query(sel(names.PROBLEMS, SIDECAR), LEGEND_SIDECAR, instant=True),),
            viz=Viz.STAT,
            width=4,
            height=4,
            steps=(Step(None, "green"), Step(1, "orange")),
            color_by_value=True,
        ),
        Panel(
            title="Since last poll",
            what="Age of the newest poll. Far above --interval: the sidecar's loop is stuck.",
            queries=(Query(f"time() - {sel(names.LAST_POLL, SIDECAR)}", LEGEND_SIDECAR, instant=True),),
            viz=Viz.STAT,
            unit="s",
            width=5,
            height=4,
            steps=(Step(None, "green"), Step(30, "red")),
            color_by_value=True,
        ),
        Panel(
            title="Scraped by Prometheus",
            what="Prometheus reached the sidecar's /metrics at its last scrape.",
            queries=(Query(f"up{{{SIDECAR}}}", LEGEND_SIDECAR, instant=True),),
            viz=Viz.STAT,
            width=5,
            height=4,
            mappings=UP_DOWN,
            color_by_value=True,
        ),
        Panel(
            title="Source reads",
            what="1 when the last read of a source (vllm, nvml or sim-gpu) succeeded.",
            queries=(Query(sel(names.SOURCE_SUCCESS, SIDECAR), "{{source}} {{instance}}"),),
            min=0,
            max=1,
            stepped=True,
            height=7,
        ),
        Panel(
            title="Source read duration",
            what="How long the last read of each source took; near --timeout means vLLM answers slowly.",
            queries=(Query(sel(names.SOURCE_DURATION, SIDECAR), "{{source}} {{instance}}"),),
            unit="s",
            min=0,
            height=7,
        ),
    ),
)

LEGEND_RANK = "GPU {{gpu}} rank {{rank}} {{instance}}"
ALLOCATOR = Row(
    "PyTorch allocator (allocator probe)",
    (
        Panel(
            title="Allocator memory: allocated, reserved, inactive split",
            what="From the vllm_sidecar_probe plugin inside vLLM (needs --probe-dir). Reserved is what PyTorch holds "
            "from the driver; inactive split is reserved memory in free pieces too small for a larger tensor.",
            queries=(
                Query(sel(names.TORCH_ALLOCATED, GPU), "allocated " + LEGEND_RANK),
                Query(sel(names.TORCH_RESERVED, GPU), "reserved " + LEGEND_RANK),
                Query(sel(names.TORCH_INACTIVE_SPLIT, GPU), "inactive split " + LEGEND_RANK),
            ),
            unit="bytes",
            min=0,
            width=10,
        ),
        Panel(
            title="Allocator fragmentation",
            what="Inactive split / reserved: PyTorch's own account of fragmentation (not the KV-block estimate). "
            "With retries, PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True in vLLM's environment is the remedy.",
            queries=(Query(sel(names.TORCH_FRAGMENTATION, GPU), LEGEND_RANK),),
            unit="percentunit",
            min=0,
            max=1,
            width=7,
        ),
        Panel(
            title="Allocator retries and OOMs",
            what="Allocations that made the allocator free its whole cache and retry (the step before an OOM; the "
            f"sidecar pauses admission at {ALLOC_RETRIES:g} in {SHORT_HORIZON_POLLS} polls), and allocations that "
            "failed even then.",
            queries=(
                Query(
                    f"sum by (instance, gpu, rank) (increase({sel(names.TORCH_ALLOC_RETRIES, GPU)}[$__rate_interval]))",
                    "retries " + LEGEND_RANK,
                ),
                Query(
                    f"sum by (instance, gpu, rank) (increase({sel(names.TORCH_OOMS, GPU)}[$__rate_interval]))",
                    "OOMs " + LEGEND_RANK,
                ),
            ),
            unit="none",
            min=0,
            stepped=True,
            width=7,
        ),
    ),
)

ROWS = (
    OVERVIEW,
    KV_CACHE,
    GPU_MEMORY,
    ALLOCATOR,
    VLLM_ENGINE,
    VLLM_ADMISSION,
    REMEDIATIONS_AND_INCIDENTS,
    SIDECAR_SELF,
)

ANNOTATIONS = (
    Annotation(
        name="Admission paused",
        # Any paused sample within the step counts, so a pause shorter than the step still shows.
        expr=f"max_over_time({sel(names.ADMISSION_PAUSED, SIDECAR)}[30s]) > 0",
        color="orange",
        title="Admission paused",
        text="{{instance}}",
    ),
    Annotation(
        name="vLLM restarts",
        # The ledger's timestamp puts the mark at the restart itself, not at the next step after it.
        expr=f"{sel(names.LAST_RESTART, SIDECAR)} * 1000",
        color="red",
        title="vLLM restarted",
        text="{{instance}}",
        value_is_time=True,
    ),
    Annotation(
        name="Failed actions",
        # A 1m window: with a 30 s scrape interval a shorter one could hold fewer than the two samples increase needs.
        expr=f"sum by (instance, action) (increase({sel(names.ACTION_FAILURES, SIDECAR)}[1m])) > 0",
        color="purple",
        title="{{action}} failed",
        text="{{instance}}",
    ),
)

VARIABLES = (
    Variable(
        name="instance",
        label="Sidecar",
        query=f"label_values({series(names.UP)}, instance)",
        what="The sidecar's scrape instance. vLLM's own series are selected by model and engine.",
    ),
    Variable(
        name="model_name",
        label="Model",
        query=f"label_values({series(names.KV_USAGE)}{{{SIDECAR}}}, model_name)",
        what="vLLM's --served-model-name.",
    ),
    Variable(
        name="engine",
        label="Engine",
        query=f'label_values({series(names.KV_USAGE)}{{{SIDECAR}, model_name=~"$model_name"}}, engine)',
        what="Data-parallel rank (0 when vLLM has a single engine or no engine label).",
        sort=3,
    ),
    Variable(
        name="gpu",
        label="GPU",
        query=f"label_values({series(names.GPU_TOTAL)}{{{SIDECAR}}}, gpu)",
        what="GPU index as NVML numbers it.",
        sort=3,
    ),
)

_SPECS = {series(spec): spec for spec in (*names.ALL, *names.POLICY)}
_SIDECAR_SERIES = re.compile(r"\bvllm_sidecar_[a-z0-9_]+")


def _description(panel: Panel) -> str:
    used = dict.fromkeys(
        match for query in panel.queries for match in _SIDECAR_SERIES.findall(query.expr) if match in _SPECS
    )
    helps = [f"{name}: {_SPECS[name].help}" for name in used]
    return "\n\n".join([panel.what, *helps])


def _field_config(panel: Panel) -> dict[str, Any]:
    defaults: dict[str, Any] = {
        "color": {"mode": "thresholds" if panel.viz is Viz.STAT else "palette-classic"},
        "mappings": [_mappings(panel.mappings)] if panel.mappings else [],
        "thresholds": {"mode": "absolute", "steps": [{"color": s.color, "value": s.value} for s in panel.steps]},
        "unit": panel.unit,
    }
    defaults.update({key: value for key, value in (("min", panel.min), ("max", panel.max)) if value is not None})
    if panel.no_value is not None:
        defaults["noValue"] = panel.no_value
    if panel.decimals is not None:
        defaults["decimals"] = panel.decimals
    if panel.viz is Viz.TIMESERIES:
        defaults["custom"] = {
            "drawStyle": "line",
            "lineInterpolation": "stepAfter" if panel.stepped else "linear",
            "lineWidth": 1,
            "fillOpacity": 8,
            "showPoints": "never",
            "spanNulls": False,
            "stacking": {"group": "A", "mode": "none"},
            "thresholdsStyle": {"mode": "dashed" if panel.threshold_lines else "off"},
        }
    elif panel.viz is Viz.STATE_TIMELINE:
        defaults["color"] = {"mode": "fixed", "fixedColor": "blue"}
        defaults["custom"] = {"fillOpacity": 80, "lineWidth": 0}
    return {"defaults": defaults, "overrides": []}


def _mappings(shown: tuple[Shown, ...]) -> dict[str, Any]:
    return {
        "type": "value",
        "options": {s.value: {"text": s.text, "color": s.color, "index": i} for i, s in enumerate(shown)},
    }


def _options(panel: Panel) -> dict[str, Any]:
    legend = {"calcs": [], "displayMode": "list", "placement": "bottom", "showLegend": True}
    if panel.viz is Viz.STAT:
        return {
            "colorMode": "background" if panel.color_by_value else "none",
            "graphMode": "none",
            "justifyMode": "auto",
            "orientation": "auto",
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            "textMode": panel.text_mode,
        }
    if panel.viz is Viz.STATE_TIMELINE:
        return {"mergeValues": True, "showValue": "never", "alignValue": "left", "rowHeight": 0.8, "legend": legend}
    return {"legend": legend, "tooltip": {"mode": "multi", "sort": "desc"}}


def _target(query: Query, ref: str) -> dict[str, Any]:
    return {
        "datasource": DATASOURCE,
        "editorMode": "code",
        "expr": query.expr,
        "instant": query.instant,
        "legendFormat": query.legend,
        "range": not query.instant,
        "refId": ref,
    }


def _panel(panel: Panel, panel_id: int, grid: dict[str, int]) -> dict[str, Any]:
    return {
        "datasource": DATASOURCE,
        "description": _description(panel),
        "fieldConfig": _field_config(panel),
        "gridPos": grid,
        "id": panel_id,
        "options": _options(panel),
        "targets": [_target(query, chr(ord("A") + i)) for i, query in enumerate(panel.queries)],
        "title": panel.title,
        "type": panel.viz.value,
    }


def _layout(rows: tuple[Row, ...]) -> list[dict[str, Any]]:
    placed: list[dict[str, Any]] = []
    y = 0
    for row in rows:
        placed.append(
            {
                "collapsed": False,
                "gridPos": {"h": 1, "w": GRID_COLUMNS, "x": 0, "y": y},
                "id": len(placed) + 1,
                "panels": [],
                "title": row.title,
                "type": "row",
            }
        )
        y += 1
        x, line_height = 0, 0
        for panel in row.panels:
            if panel.width > GRID_COLUMNS:
                raise ValueError(f"{panel.title}: width {panel.width} exceeds the grid")
            if x + panel.width > GRID_COLUMNS:
                x, y, line_height = 0, y + line_height, 0
            grid = {"h": panel.height, "w": panel.width, "x": x, "y": y}
            placed.append(_panel(panel, len(placed) + 1, grid))
            x += panel.width
            line_height = max(line_height, panel.height)
        y += line_height
    return placed


def _annotation(annotation: Annotation) -> dict[str, Any]:
    return {
        "datasource": DATASOURCE,
        "enable": True,
        "hide": False,
        "iconColor": annotation.color,
        "name": annotation.name,
        "tagKeys": "instance",
        "target": {"expr": annotation.expr, "interval": annotation.interval, "refId": "Anno"},
        "textFormat": annotation.text,
        "titleFormat": annotation.title,
        "useValueForTime": annotation.value_is_time,
    }


def _variable(variable: Variable) -> dict[str, Any]:
    return {
        "allValue": ".*",  # also matches a series without the label (V0 vLLM has no engine label)
        "current": {"selected": True, "text": "All", "value": "$__all"},
        "datasource": DATASOURCE,
        "description": variable.what,
        "hide": 0,
        "includeAll": True,
        "label": variable.label,
        "multi": True,
        "name": variable.name,
        "options": [],
        "query": variable.query,
        "refresh": 2,
        "regex": "",
        "skipUrlSync": False,
        "sort": variable.sort,
        "type": "query",
    }


def build() -> dict[str, Any]:
    """The dashboard as Grafana's JSON model."""
    builtin = {
        "builtIn": 1,
        "datasource": {"type": "grafana", "uid": "-- Grafana --"},
        "enable": True,
        "hide": True,
        "iconColor": "rgba(0, 211, 255, 1)",
        "name": "Annotations & Alerts",
        "type": "dashboard",
    }
    datasource = {
        "hide": 0,
        "includeAll": False,
        "label": "Prometheus",
        "multi": False,
        "name": "datasource",
        "options": [],
        "query": "prometheus",
        "refresh": 1,
        "regex": "",
        "skipUrlSync": False,
        "type": "datasource",
    }
    return {
        "annotations": {"list": [builtin, *(_annotation(a) for a in ANNOTATIONS)]},
        "description": "vLLM beside its sidecar: admission and restarts, KV cache, GPU memory, the engine's "
        "latency, remediations and incidents, and the sidecar itself. Metrics: vllm_sidecar_* (the sidecar) and "
        "vllm:* (vLLM 0.5 to 0.33).",
        "editable": True,
        "fiscalYearStartMonth": 0,
        "graphTooltip": 1,
        "links": [
            {
                "asDropdown": False,
                "icon": "doc",
                "includeVars": False,
                "keepTime": False,
                "tags": [],
                "targetBlank": True,
                "title": "Runbooks",
                "tooltip": "What each alert and state means and what to do",
                "type": "link",
                "url": RUNBOOKS,
            }
        ],
        "panels": _layout(ROWS),
        "refresh": "30s",
        "schemaVersion": SCHEMA_VERSION,
        "tags": ["vllm", "vllm-sidecar"],
        "templating": {"list": [datasource, *(_variable(v) for v in VARIABLES)]},
        "time": {"from": "now-3h", "to": "now"},
        "timepicker": {},
        "timezone": "browser",
        "title": "vLLM sidecar",
        "uid": UID,
        "version": 1,
        "weekStart": "",
    }


def render() -> str:
    return json.dumps(build(), indent=2, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="exit 1 when the generated file is out of date")
    args = parser.parse_args(argv)
    expected = render()
    if args.check:
        current = OUTPUT.read_text(encoding="utf-8") if OUTPUT.exists() else None
        if current != expected:
            sys.stderr.write(f"{OUTPUT.name} is out of date: run `python grafana/generate.py`\n")
            return 1
        return 0
    OUTPUT.write_text(expected, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
