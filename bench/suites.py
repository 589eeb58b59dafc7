"""The suites of `python -m bench`: each measures, prints, and adds its section and targets to the results.

Does I/O through the modules it calls (subprocesses, loopback HTTP); the formatting is here.
"""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Callable, Iterable

from bench.daemon_cost import DaemonCase, measure_daemons
from bench.efficacy_suites import efficacy_suite, fleet_suite
from bench.expositions import Exposition, simulated_server, standard_expositions
from bench.growth import measure_growth
from bench.options import Options
from bench.probe_cost import measure_probe_cost
from bench.probe_vllm import measure_probe_throughput, medians
from bench.process import baseline_rss_mb
from bench.reaction import measure_reaction
from bench.recovery import GAP_S, PAUSES_S, measure_recovery
from bench.report import Results, table
from bench.tick_cost import measure_parser
from tests.e2e.vllm.server import MAX_MODEL_LEN

TARGET_TICK_MS = 2.0
# The budgets of the current round (issue 15), "at most": 0.25 % of a core at 2 s with 300 KB, 80 MB of peak RSS.
# They replace the first round's 0.5 % and 60 MB; the 1 s tick target is the first round's, still open.
TARGET_SHARE_AT_2S = 0.0025
TARGET_RSS_MB = 80.0
TARGET_PARSER_RATIO = 10.0


@functools.cache
def _expositions() -> tuple[Exposition, ...]:
    return tuple(standard_expositions())


def _describe(exposition: Exposition) -> str:
    lora = f" + {exposition.lora_series} LoRA series" if exposition.lora_series else ""
    return f"{exposition.engines} engine{'s' if exposition.engines > 1 else ''}{lora}"


def _median_ms(run: Callable[[], object], repeats: int) -> float:
    samples = []
    for _ in range(repeats):
        started = time.perf_counter()
        run()
        samples.append((time.perf_counter() - started) * 1000)
    return statistics.median(samples)


def _parse_all(parse: Callable[[str], Iterable[object]], body: bytes) -> object:
    return list(parse(body.decode()))


def parser_suite(options: Options, results: Results) -> None:
    rows = []
    for exposition in _expositions():
        speed = measure_parser(exposition.text, repeats=options.repeats)
        if not speed.values_identical:
            raise SystemExit(f"{exposition.label}: the sidecar's parser disagrees with prometheus_client: no speed")
        mb = exposition.size_bytes / 1e6
        rows.append(
            (
                f"{exposition.label}: {_describe(exposition)}",
                f"{exposition.size_text}, {exposition.lines} lines",
                f"{speed.reference_ms:.2f} ms ({mb / speed.reference_ms * 1000:.0f} MB/s)",
                f"{speed.full_ms:.2f} ms ({speed.reference_ms / speed.full_ms:.1f}x)",
                f"{speed.filtered_ms:.2f} ms ({speed.reference_ms / speed.filtered_ms:.1f}x)",
                f"{speed.tick_ms:.2f} ms ({mb / speed.tick_ms * 1000:.0f} MB/s, "
                f"**{speed.reference_ms / speed.tick_ms:.1f}x**)",
                "yes",
            )
        )
        if exposition.label == "300 KB":
            ratio = speed.reference_ms / speed.tick_ms
            results.target(
                "parser, what the tick reads, 300 KB",
                f">= {TARGET_PARSER_RATIO:g}x prometheus_client, identical values",
                f"{ratio:.1f}x, identical",
                met=ratio >= TARGET_PARSER_RATIO,
            )
    results.section(
        "Parser throughput",
        [
            "Median of interleaved rounds in one process. *Full* keeps every sample; *filtered* keeps the samples "
            "the daemon reads (`KEPT_SAMPLES`) and checks every other line's shape (`vllm-sidecar doctor` parses "
            "so); *tick* is what the daemon runs: the same samples, picked out by one search and parsed strictly, "
            "the other lines not read (`sidecar/parse/pick.py`), by a picker kept between ticks. Values (every "
            "sample for full, the kept ones for filtered and tick, the tick's first pick included) are compared "
            "with prometheus_client's, bit for bit, before any time is shown.",
            "",
            *table(
                [
                    "exposition",
                    "size",
                    "prometheus_client.parser",
                    "sidecar, full",
                    "sidecar, filtered",
                    "sidecar, tick",
                    "identical",
                ],
                rows,
            ),
        ],
    )


# The least a vLLM 0.32 engine writes that the tick reads: what a tick costs whatever the exposition's size.
FLOOR_EXPOSITION = (
    b'vllm:num_requests_running{engine="0",model_name="m"} 4.0\n'
    b'vllm:num_requests_waiting{engine="0",model_name="m"} 0.0\n'
    b'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25\n'
    b'vllm:generation_tokens_total{engine="0",model_name="m"} 1000.0\n'
)


TARGET_CASE_SECONDS = 90.0


def _daemon_cases() -> list[DaemonCase]:
    cases = [DaemonCase(key="floor", label="floor: 4 lines, 1 engine", metrics=FLOOR_EXPOSITION, interval_s=1.0)]
    for exposition in _expositions():
        intervals = (1.0, 2.0, 5.0) if exposition.label == "300 KB" else (1.0, 5.0)
        for interval in intervals:
            label = f"{exposition.label} ({_describe(exposition)}, {exposition.size_text})"
            body = exposition.text.encode()
            cases.append(DaemonCase(key=exposition.label, label=label, metrics=body, interval_s=interval))
    server = simulated_server(8)
    label = f"simulator, 8 engines on 8 GPUs ({len(server.metrics) / 1024:.0f} KiB + /sim/gpu)"
    cases += [
        DaemonCase(
            key="sim-8", label=label, metrics=server.metrics, interval_s=interval, gpu_document=server.gpu_document
        )
        for interval in (1.0, 5.0)
    ]
    return cases


def tick_suite(options: Options, results: Results) -> None:
    from prometheus_client.parser import text_string_to_metric_families  # noqa: PLC0415 - the reference

    cases = _daemon_cases()
    # The cases the targets are about run alone; the others side by side (see bench.daemon_cost).
    alone = [case for case in cases if case.key == "300 KB" and case.interval_s in (1.0, 2.0)]
    rest = [case for case in cases if case not in alone]
    # A scrape costs the daemon as much as most of a tick: over the default 20 s, one scrape more or less in
    # the window moves the 2 s case by 7 %. Over 90 s (six scrapes) the targets are measured to about 2 %.
    measured = measure_daemons(alone, min_s=max(options.tick_seconds, TARGET_CASE_SECONDS), serial=True)
    measured += measure_daemons(rest, min_s=options.tick_seconds, serial=options.tick_serial)
    costs = sorted(measured, key=lambda cost: cases.index(cost.case))
    reference: dict[bytes, float] = {}
    rows = []
    for cost in costs:
        body = cost.case.metrics
        if body not in reference:
            reference[body] = _median_ms(functools.partial(_parse_all, text_string_to_metric_families, body), 5)
        rows.append(
            (
                cost.case.label,
                f"{cost.case.interval_s:g} s",
                str(cost.ticks),
                f"**{cost.cpu_ms_per_tick:.2f} ms**",
                "-" if cost.case.key == "floor" else f"{cost.cpu_ms_per_tick / reference[body]:.2f}",
                f"{cost.cpu_share_of_one_core:.3%}",
                f"{cost.peak_rss_mb:.1f} MB",
                f"{cost.requests_per_tick:.2f}",
            )
        )
    baseline = baseline_rss_mb()
    by_key = {(cost.case.key, cost.case.interval_s): cost for cost in costs}
    medium_1s, medium_2s = by_key.get(("300 KB", 1.0)), by_key.get(("300 KB", 2.0))
    if medium_1s is not None:
        results.target(
            "CPU per tick, 300 KB, 1 s interval",
            f"< {TARGET_TICK_MS:g} ms",
            f"{medium_1s.cpu_ms_per_tick:.2f} ms",
            met=medium_1s.cpu_ms_per_tick < TARGET_TICK_MS,
        )
    if medium_2s is not None:
        results.target(
            "share of one core, 300 KB, 2 s interval",
            f"<= {TARGET_SHARE_AT_2S:.2%}",
            f"{medium_2s.cpu_share_of_one_core:.3%}",
            met=medium_2s.cpu_share_of_one_core <= TARGET_SHARE_AT_2S,
        )
    peak = max(cost.peak_rss_mb for cost in costs)
    results.target("peak RSS, every case", f"<= {TARGET_RSS_MB:g} MB", f"{peak:.1f} MB", met=peak <= TARGET_RSS_MB)
    results.section(
        "Daemon cost per tick",
        [
            "The real daemon (`vllm-sidecar run`, `--gpu-source none` except the simulator rows, which read its 8 "
            "GPUs from `/sim/gpu`) against a loopback stand-in that answers as a real vLLM 0.32 does (HTTP/1.1 "
            "keep-alive closed after 5 s idle, /metrics uncompressed with a Content-Length), its engines at work "
            "(the progress counters move on with every scrape, so the policy sees a healthy engine). *Floor* is "
            "the least exposition the tick reads (four lines): what a tick costs whatever the size. CPU is every "
            "thread's time from `/proc/<pid>/task/*/schedstat` over whole ticks after 3 warm-up ticks, a "
            "Prometheus scrape of the daemon's /metrics every 15 s (in OpenMetrics, as Prometheus asks) "
            f"included; the 300 KB cases at 1 and 2 s (the targets) ran alone for at least "
            f"{max(options.tick_seconds, TARGET_CASE_SECONDS):g} s, the others "
            + ("one at a time too" if options.tick_serial else "side by side")
            + ". The daemons had just started, so their window of history was short: the growth section "
            "shows what a full one adds. *x ref* is CPU per tick over one prometheus_client parse of the same "
            "bytes. Peak RSS is VmHWM; an interpreter that only imports the daemon's libraries peaks at "
            f"{baseline:.1f} MB.",
            "",
            *table(
                [
                    "case",
                    "interval",
                    "ticks",
                    "CPU per tick",
                    "x ref",
                    "share of one core",
                    "peak RSS",
                    "requests per tick",
                ],
                rows,
            ),
        ],
    )


def growth_suite(options: Options, results: Results) -> None:
    rows = [
        (
            str(row.engines),
            str(row.gpus) if row.gpus else "-",
            f"{row.size_bytes / 1024:.0f} KiB",
            str(row.window_snapshots),
            f"{row.reference_ms:.2f} ms",
            f"**{row.tick_ms:.2f} ms**",
            f"{row.tick_ms / row.size_bytes * 1024 * 100:.2f} ms",
        )
        for row in measure_growth(repeats=options.repeats)
    ]
    results.section(
        "Growth",
        [
            "One tick's pure work in-process (the picker + vLLM reading + derive; GPUs as the NVML source "
            "reports them, one engine per GPU) with the window full at a 1 s interval (10 min of history), "
            "against one prometheus_client parse of the same bytes. Generated vLLM 0.32 expositions with every "
            "histogram, no LoRA. Median of interleaved rounds.",
            "",
            *table(
                ["engines", "GPUs", "exposition", "window", "prometheus_client", "tick", "tick per 100 KiB"],
                rows,
            ),
        ],
    )


def reaction_suite(options: Options, results: Results) -> None:
    rows = []
    for interval in options.reaction_intervals:
        reaction = measure_reaction(interval, trials=options.reaction_trials)
        p50, p99 = reaction.percentile_s(0.5), reaction.percentile_s(0.99)
        worst = max(reaction.reactions_s, default=float("nan"))
        rows.append(
            (
                f"{interval:g} s",
                f"{len(reaction.reactions_s)} (+{reaction.failed_trials} failed)",
                f"{p50 * 1000:.0f} ms",
                f"{p99 * 1000:.0f} ms",
                f"{worst * 1000:.0f} ms",
                f"{reaction.target_s * 1000:.0f} ms",
            )
        )
        results.target(
            f"reaction, {interval:g} s interval, p99",
            f"<= {reaction.target_s * 1000:.0f} ms",
            f"p50 {p50 * 1000:.0f} ms, p99 {p99 * 1000:.0f} ms",
            met=reaction.met,
        )
    results.section(
        "Reaction time",
        [
            "From the simulated GPU's free memory crossing the 5 % pause threshold (`sim --scenario tenant`, the "
            "tenant growing 4 GiB/s from a jittered start) to the daemon's /readyz answering 503. Fresh simulator "
            "and daemon per trial; both watchers poll every 5 ms. Percentiles interpolate between trials.",
            "",
            *table(["interval", "trials", "p50", "p99", "max", "target (interval + 100 ms)"], rows),
        ],
    )


def probe_suite(options: Options, results: Results) -> None:
    cost = measure_probe_cost(repeats=options.repeats)
    reference = f"{cost.memory_stats_us:.1f} µs" if cost.memory_stats_us is not None else "- (no CUDA here)"
    ratio = f"{cost.sample_us / cost.memory_stats_us:.2f}x" if cost.memory_stats_us else "-"
    share = cost.write_us / 2e6  # one sample and write every 2 s, the plugin's default interval
    print(f"probe: {cost.path}: sample {cost.sample_us:.1f} µs, with the write {cost.write_us:.1f} µs")
    results.section(
        "Allocator probe",
        [
            "One sample of the vllm_sidecar_probe plugin in this interpreter (median of rounds), with its atomic "
            "file write, against one torch.cuda.memory_stats() call in the same run. Without torch and a GPU "
            "this is the path of a vLLM process without CUDA; the CUDA figures come from a GPU machine "
            "(docs/gpu-runs.md).",
            "",
            *table(
                ["path", "memory_stats (reference)", "sample", "sample / reference", "sample + write", "share at 2 s"],
                [
                    (
                        cost.path,
                        reference,
                        f"**{cost.sample_us:.1f} µs**",
                        ratio,
                        f"{cost.write_us:.1f} µs",
                        f"{share * 100:.4f} %",
                    )
                ],
            ),
        ],
    )
    results.target("probe sample + write", "< 1 ms", f"{cost.write_us:.0f} µs", met=cost.write_us < 1000)


def probe_vllm_suite(options: Options, results: Results) -> None:
    del options  # a fixed load: each round starts three vLLM servers (about 40 s each on 2 cores)
    runs = measure_probe_throughput(rounds=2)
    if isinstance(runs, str):
        print(f"probe-vllm: not run: {runs}")
        results.section("vLLM with the allocator probe", [f"Not run: {runs}."])
        return
    by_interval = medians(runs)
    speed_off, cpu_off = by_interval[None]
    rows = [
        (
            f"every {run.interval} s" if run.interval else "without",
            f"{run.tokens_per_s:.1f}",
            f"{run.cpu_s_per_1k_tokens:.2f}",
            str(run.files),
        )
        for run in runs
    ]
    ratios = "; ".join(
        f"every {i} s: throughput {speed / speed_off:.3f}, CPU per token {cpu / cpu_off:.3f}"
        for i, (speed, cpu) in by_interval.items()
        if i is not None
    )
    results.section(
        "vLLM with the allocator probe",
        [
            "Real vLLM 0.32 on CPU (tiny model, a separate worker process), the same load (48 requests, 8 at a time, "
            "32 tokens each) without the plugin and with it sampling at its default interval and at 0.1 s, "
            "interleaved over rounds. CPU per token sums all of vLLM's processes (user + system) over the load. "
            f"Medians without: {speed_off:.1f} tokens/s, {cpu_off:.2f} CPU s per 1000 tokens; with / without: "
            f"{ratios}.",
            "",
            *table(["run", "output tokens/s", "CPU s / 1000 tokens", "probe files"], rows),
        ],
    )
    cpu_ratio = by_interval["2"][1] / cpu_off
    results.target("vLLM CPU per token, probe at 2 s", "<= 1.05 x without", f"{cpu_ratio:.3f} x", met=cpu_ratio <= 1.05)


def _seconds(values: list[float | None]) -> str:
    return ", ".join("not within 180 s" if value is None else f"{value:.1f} s" for value in values)


def recovery_suite(options: Options, results: Results) -> None:
    found = measure_recovery(options.recovery_trials)
    if isinstance(found, str):
        print(f"recovery: not run: {found}")
        results.section("Back fast, never falsely", [f"Not run: {found}."])
        return
    results.section(
        "Back fast, never falsely",
        [
            "Real vLLM 0.32 on CPU (tiny model; a start takes 15-20 s here), the sidecar on its default settings with "
            "`--actuator exec` (restart command `tests/e2e/vllm/exec_restart.py`). Time to serving: from the fault "
            "to the first completion answered 200. The alive run: 16 clients against 8 sequence slots, two more "
            f"sending prompts of about {MAX_MODEL_LEN - 40} tokens, and the EngineCore paused (SIGSTOP, then SIGCONT) "
            f"for {', '.join(f'{p:g}' for p in PAUSES_S)} s, {GAP_S:g} s apart.",
            "",
            *table(
                ["measure", "result"],
                [
                    ("EngineCore SIGKILL: serving again after", _seconds(found.killed_s)),
                    ("EngineCore SIGSTOP, requests running: serving again after", _seconds(found.hung_s)),
                    ("alive run: length", f"{found.alive_run_s:.0f} s"),
                    ("alive run: restarts", str(found.alive_restarts)),
                    ("alive run: /readyz 503 for", f"{found.alive_not_ready_s:.0f} s"),
                    ("alive run: requests completed", str(found.alive_completed)),
                ],
            ),
        ],
    )
    killed = [value for value in found.killed_s if value is not None]
    hung = [value for value in found.hung_s if value is not None]
    worst_killed = max(killed) if len(killed) == len(found.killed_s) and killed else None
    worst_hung = max(hung) if len(hung) == len(found.hung_s) and hung else None
    results.target(
        "recovery: killed engine serving again, worst trial",
        "<= 60 s",
        _seconds([worst_killed]),
        met=worst_killed is not None and worst_killed <= 60.0,
    )
    results.target(
        "recovery: hung engine serving again, worst trial",
        "<= 90 s",
        _seconds([worst_hung]),
        met=worst_hung is not None and worst_hung <= 90.0,
    )
    results.target(
        "recovery: restarts of a loaded-but-alive engine", "0", str(found.alive_restarts), met=found.alive_restarts == 0
    )


SUITES: dict[str, Callable[[Options, Results], None]] = {
    "parser": parser_suite,
    "tick": tick_suite,
    "growth": growth_suite,
    "reaction": reaction_suite,
    "efficacy": efficacy_suite,
    "fleet": fleet_suite,
    "probe": probe_suite,
    "probe-vllm": probe_vllm_suite,
    "recovery": recovery_suite,
}
