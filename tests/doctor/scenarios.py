"""The labelled scenario set: each simulator scenario and configuration with the diagnosis `doctor` must give.

A value is literal where the simulator makes it deterministic (token counts, pool sizes, a tenant's fixed size).
Three depend on timing or on how a burst happened to interleave; for those the table names an oracle that the
test computes from the simulator's own /metrics or /sim/gpu, read independently of the doctor (prometheus_client
parser, plain JSON), with the formulas of docs/doctor.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

GIB = 2**30


class Oracle(Enum):
    SHUTDOWN = "ceil10(p99 bucket bound of vllm:e2e_request_latency_seconds), at least 10"
    GRACE = "the shutdown timeout + 30"
    UTILIZATION = "floor2((total - others - over budget - 5 % of total) / total) from /sim/gpu"
    SEVERITY = "critical when /sim/gpu shows less than 5 % free, else warning"


Value = int | float | str | Oracle


@dataclass(frozen=True, slots=True, kw_only=True)
class SimSpec:
    """One simulator process, the load it gets, and whether a sidecar daemon watches it."""

    key: str
    args: tuple[str, ...]  # `vllm-sidecar sim` arguments after --listen
    load: tuple[str, ...] = ()  # `vllm-sidecar loadtest` arguments; () for no load
    starts: bool = True  # False: vLLM refuses to start (the sim exits at once)
    daemon: bool = False  # a sidecar daemon watches it; doctor gets its /status as --history


@dataclass(frozen=True, slots=True, kw_only=True)
class Expected:
    cause: str
    severity: str | Oracle
    recommendations: tuple[tuple[str, Value], ...]
    evidence_contains: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class Row:
    name: str
    sim: SimSpec
    with_log: bool = False
    gpu_source: str = "sim"
    exit_code: int = 1
    reachable: bool = True
    version: str = "0.32.0"
    findings: tuple[Expected, ...] = ()
    notes_contain: tuple[str, ...] = field(default=())


# 80 requests of 600-1400 prompt tokens (512 of them a prefix shared by 90 % of requests: a 46 % hit ratio) and
# 128 output tokens: the sim's default pool (444,512 tokens) and max_model_len 4096 suit it.
HEALTHY_LOAD = (
    "--concurrency", "32", "--max-requests", "80", "--prompt-tokens", "uniform:600-1400", "--output-tokens", "128",
    "--shared-prefix-ratio", "0.9", "--shared-prefixes", "4", "--shared-prefix-tokens", "512",
)  # fmt: skip
# 48 clients of exactly 1,000 + 128 tokens against a 40,960-token pool: 36 fit, max_num_seqs 64 admits more.
SMALL_POOL_ARGS = ("--max-model-len", "32768", "--num-gpu-blocks", "2560", "--enable-prefix-caching", "false")
SMALL_POOL_LOAD = ("--concurrency", "48", "--max-requests", "64", "--prompt-tokens", "1000", "--output-tokens", "128")

HEALTHY = SimSpec(key="healthy", args=("--scenario", "healthy"), load=HEALTHY_LOAD)
HEALTHY_010 = SimSpec(key="healthy-0.10", args=("--scenario", "healthy", "--vllm-version", "0.10"), load=HEALTHY_LOAD)
# The tenant takes its whole 6 GiB at once instead of growing for 6 s.
TENANT = SimSpec(key="tenant", args=("--scenario", "tenant", "--tenant-start-s", "0", "--tenant-bytes-per-s", "1e12"))
BURST = SimSpec(
    key="burst",
    args=("--scenario", "burst", "--enable-prefix-caching", "false"),
    load=("--concurrency", "40", "--max-requests", "80", "--prompt-tokens", "2000", "--output-tokens", "256"),
)
# 128 shared 1,536-token prefixes sent round robin against a 51,296-token pool: LRU evicts each before its reuse.
PREFIX_THRASH = SimSpec(
    key="prefix-thrash",
    args=("--scenario", "prefix-thrash"),
    load=(
        "--concurrency", "16", "--max-requests", "80", "--prompt-tokens", "1792", "--output-tokens", "32",
        "--shared-prefix-ratio", "1", "--shared-prefixes", "128", "--shared-prefix-tokens", "1536",
    ),
)  # fmt: skip
SMALL_POOL = SimSpec(key="small-pool", args=("--scenario", "healthy", *SMALL_POOL_ARGS), load=SMALL_POOL_LOAD)
SMALL_POOL_010 = SimSpec(
    key="small-pool-0.10",
    args=("--scenario", "healthy", "--vllm-version", "0.10", *SMALL_POOL_ARGS),
    load=SMALL_POOL_LOAD,
)
STARTUP = SimSpec(key="startup", args=("--scenario", "startup"), starts=False)
STARTUP_06 = SimSpec(key="startup-0.6", args=("--scenario", "startup", "--vllm-version", "0.6"), starts=False)
# 75 GiB of weights on an 80 GiB card at 0.95: the budget is 0.74 GiB short before any KV cache.
DOES_NOT_FIT = SimSpec(
    key="does-not-fit",
    args=("--scenario", "healthy", "--weights-bytes", str(75 * GIB), "--gpu-memory-utilization", "0.95"),
    starts=False,
)
# Only the steady allocator drift (32 MiB/s), no load: the daemon's trend is a clean line.
LEAK = SimSpec(key="leak", args=("--scenario", "leak", "--leak-bytes-per-request", "0"), daemon=True)

SHUTDOWN = Expected(
    cause="other",
    severity="info",
    recommendations=(("--shutdown-timeout", Oracle.SHUTDOWN), ("terminationGracePeriodSeconds", Oracle.GRACE)),
)
SHUTDOWN_NO_TRAFFIC = Expected(
    cause="other",
    severity="info",
    recommendations=(("--shutdown-timeout", 120), ("terminationGracePeriodSeconds", 150)),
)
SMALL_POOL_BLOWOUT = Expected(
    cause="kv_cache_blowout",
    severity="warning",
    recommendations=(("--max-model-len", 1280),),
    evidence_contains=("max_model_len 32,768 (GET /v1/models)", "p99 prompt in (500, 1,000] tokens"),
)

ROWS: tuple[Row, ...] = (
    Row(name="healthy", sim=HEALTHY, exit_code=0),
    # 0.32 has --shutdown-timeout and the log shows it is not set: advice, not a failure.
    Row(name="healthy-with-log", sim=HEALTHY, with_log=True, exit_code=1, findings=(SHUTDOWN,)),
    # 0.10 has no --shutdown-timeout: nothing to advise.
    Row(name="healthy-0.10-with-log", sim=HEALTHY_010, with_log=True, exit_code=0, version="0.10.2"),
    Row(
        name="tenant",
        sim=TENANT,
        findings=(
            Expected(
                cause="configuration_overshoot",
                severity="critical",
                recommendations=(("--gpu-memory-utilization", 0.87),),
                evidence_contains=("pid 31337 'python train.py' holds 6.00 GiB",),
            ),
        ),
    ),
    Row(
        name="burst",
        sim=BURST,
        findings=(
            Expected(
                cause="configuration_overshoot",
                severity=Oracle.SEVERITY,
                recommendations=(
                    ("--gpu-memory-utilization", Oracle.UTILIZATION),
                    ("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True"),
                ),
                evidence_contains=("beyond its budget",),
            ),
        ),
    ),
    Row(
        name="prefix-thrash",
        sim=PREFIX_THRASH,
        with_log=True,
        findings=(
            Expected(
                cause="concurrency_misjudgement",
                severity="warning",
                recommendations=(("--max-num-seqs", 25),),
                evidence_contains=("KV pool 51,296 tokens", "max_num_seqs 64 (the arguments vLLM logged at start)"),
            ),
            Expected(
                cause="other",
                severity="info",
                recommendations=(("--no-enable-prefix-caching", ""),),
                evidence_contains=("prefix-cache hit ratio 0.0%",),
            ),
            SHUTDOWN,
        ),
    ),
    Row(
        name="small-pool",
        sim=SMALL_POOL,
        with_log=True,
        findings=(
            SMALL_POOL_BLOWOUT,
            Expected(
                cause="concurrency_misjudgement",
                severity="warning",
                recommendations=(("--max-num-seqs", 32), ("--max-num-queued-reqs", 64)),
                evidence_contains=("KV pool 40,960 tokens", "mean request 1,128.0 tokens", "vLLM preempted requests"),
            ),
            SHUTDOWN,
        ),
    ),
    # No GPU at all: the same diagnosis from vLLM's metrics alone, and a note that says what is missing.
    Row(
        name="small-pool-no-gpu",
        sim=SMALL_POOL,
        gpu_source="none",
        findings=(
            SMALL_POOL_BLOWOUT,
            Expected(
                cause="concurrency_misjudgement",
                severity="warning",
                recommendations=(("--max-num-seqs", 32), ("--max-num-queued-reqs", 64)),
                evidence_contains=("max_num_seqs unknown",),
            ),
        ),
        notes_contain=("GPU evidence missing (--gpu-source none)",),
    ),
    # 0.10 has no --max-num-queued-reqs and no --shutdown-timeout: neither is recommended.
    Row(
        name="small-pool-0.10",
        sim=SMALL_POOL_010,
        with_log=True,
        version="0.10.2",
        findings=(
            SMALL_POOL_BLOWOUT,
            Expected(cause="concurrency_misjudgement", severity="warning", recommendations=(("--max-num-seqs", 32),)),
        ),
    ),
    Row(
        name="startup-refused",
        sim=STARTUP,
        with_log=True,
        reachable=False,
        findings=(
            Expected(
                cause="kv_cache_blowout",
                severity="critical",
                recommendations=(("--max-model-len", 51296),),
                evidence_contains=("the estimated maximum model length is 51296",),
            ),
            SHUTDOWN_NO_TRAFFIC,
        ),
    ),
    Row(
        name="startup-refused-0.6",
        sim=STARTUP_06,
        with_log=True,
        reachable=False,
        version="0.6.6",
        findings=(
            Expected(
                cause="kv_cache_blowout",
                severity="critical",
                recommendations=(("--max-model-len", 51296),),
                evidence_contains=("larger than the maximum number of tokens that can be stored in KV cache (51296)",),
            ),
        ),
    ),
    Row(
        name="does-not-fit",
        sim=DOES_NOT_FIT,
        with_log=True,
        reachable=False,
        findings=(
            Expected(
                cause="does_not_fit",
                severity="critical",
                # The log states no card: at 0.95 the budget held >= 75 - 0.74 GiB, so the card has >= 78.17 GiB;
                # 75 / 2 <= 0.75 x 78.17; 75 - 0.75 x 78.17 = 16.4 -> 17 GiB offloaded (no fp8: the card is unnamed).
                recommendations=(("--tensor-parallel-size", 2), ("--cpu-offload-gb", 17)),
                evidence_contains=("the card has at least 78.17 GiB; the weights are what does not fit",),
            ),
            SHUTDOWN_NO_TRAFFIC,
        ),
    ),
    Row(
        name="leak-with-history",
        sim=LEAK,
        findings=(
            Expected(  # a steady trend is a leak (issue 14), not a budget set too high
                cause="memory_leak",
                severity="critical",
                recommendations=(("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True"),),
                evidence_contains=("memory grows", "MiB/s = ", "forecasts the card full in", "restart cadence"),
            ),
        ),
        notes_contain=("history: http://127.0.0.1:",),
    ),
)
