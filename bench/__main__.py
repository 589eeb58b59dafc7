"""`python -m bench`: the sidecar's cost per tick, printed as ratios against references from the same run.

1. Parse + derive of one tick on a generated vLLM 0.32 exposition (4 engines, all histograms, ~300 KB)
   against prometheus_client's parser on the same bytes.
2. The real daemon polling that exposition: CPU per tick, share of one core, peak RSS against a bare
   interpreter that imports the same libraries.
"""

from __future__ import annotations

import argparse
import os
import platform

from bench.daemon_cost import measure_daemon
from bench.generate_exposition import generate_exposition
from bench.tick_cost import measure_tick_cost


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument(
        "--engines",
        default="4,6",
        help="data-parallel engines per generated exposition, comma-separated (4: ~200 KB, 6: ~300 KB, 8: ~390 KB)",
    )
    parser.add_argument("--lora-adapters", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--interval", type=float, default=1.0, help="daemon poll interval, seconds")
    parser.add_argument("--duration", type=float, default=20.0, help="seconds of steady-state daemon running")
    parser.add_argument("--skip-daemon", action="store_true")
    args = parser.parse_args()

    machine = f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
    print(f"machine: {machine}")
    text = ""
    for engines in (int(part) for part in args.engines.split(",")):
        text = generate_exposition(engines=engines, lora_adapters=args.lora_adapters)
        _report_tick(text, engines, args.repeats)
    if args.skip_daemon:
        return
    _report_daemon(text, args.interval, args.duration)


def _report_tick(text: str, engines: int, repeats: int) -> None:
    size_kib = len(text.encode()) / 1024
    print(f"\nexposition: vLLM 0.32 shape, {engines} engines, {size_kib:.0f} KiB, {text.count(chr(10))} lines")
    cost = measure_tick_cost(text, repeats=repeats)
    print(f"prometheus_client.parser (reference, full parse)   {cost.reference_ms:8.2f} ms")
    print(
        f"sidecar parser, full parse                         {cost.ours_full_ms:8.2f} ms  "
        f"{cost.reference_ms / cost.ours_full_ms:5.1f}x faster"
    )
    print(
        f"sidecar tick: filtered parse + read + derive       {cost.ours_tick_ms:8.2f} ms  "
        f"{cost.reference_ms / cost.ours_tick_ms:5.1f}x faster"
    )
    print(f"values of the samples the sidecar reads identical to the reference: {cost.values_identical}")
    if not cost.values_identical:
        raise SystemExit("the sidecar's parser disagrees with prometheus_client: the speed figures are void")


def _report_daemon(text: str, interval_s: float, duration_s: float) -> None:
    reference_ms = measure_tick_cost(text, repeats=10).reference_ms
    daemon = measure_daemon(text.encode(), interval_s=interval_s, duration_s=duration_s)
    print(f"\ndaemon polling the last exposition ({len(text.encode()) / 1024:.0f} KiB) over HTTP:")
    print(
        f"daemon at {daemon.interval_s:g} s interval over {daemon.ticks} ticks: "
        f"{daemon.cpu_ms_per_tick:.2f} ms CPU per tick ({daemon.cpu_ms_per_tick / reference_ms:.2f}x one "
        f"reference parse), {daemon.cpu_share_of_one_core:.2%} of one core"
    )
    print(
        f"daemon peak RSS {daemon.peak_rss_mb:.1f} MB; bare interpreter with the same imports "
        f"{daemon.baseline_rss_mb:.1f} MB ({daemon.peak_rss_mb / daemon.baseline_rss_mb:.2f}x)"
    )


if __name__ == "__main__":
    main()
