"""Reads a vLLM log (a start, a refused start, or a crash) into `LogFacts`. Pure: text in, facts out.

Only the last start in the file counts (a log that holds a refused start and a later good one describes the
good one); a log with no start line (a pasted tail) is read whole. The log is first read as records
(`log_records`): each line's prefix learned from the log itself, terminal colours dropped, and a message a
paste or a terminal wrapped put back together. Lines are matched anywhere in a record, and the messages'
patterns tolerate the whitespace a wrap dropped or added.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import replace

from sidecar.doctor.host_lines import (
    CPU_KV_SPACE,
    CPU_NODE,
    KILLED,
    MAP_REFUSED,
    NODE_LOW,
    NODE_MEMORY,
    SWAP_EXHAUSTED,
    SWAP_WARNING,
    cpu_kv_space,
    cpu_node,
    killed,
    map_refused,
    node_low,
    node_memory,
    swap_exhausted,
    swap_warning,
)
from sidecar.doctor.log_records import NUMBER, Record, join_lines, loose, records
from sidecar.doctor.logfacts import (
    Facts,
    LogFacts,
    MemoryProfile,
    Refusal,
    RefusalKind,
)
from sidecar.doctor.metal_memory import METAL_KV_REFUSAL, MITIGATION_NAMES_ENV, metal_kv_refusal, metal_mitigation
from sidecar.doctor.oom_log import find_oom
from sidecar.doctor.phase import SERVING_SIGNS, cut_in_traceback, oom_phase
from sidecar.doctor.scheduler_stats import (
    CONNECTOR_IDS,
    CONNECTOR_PREEMPTED,
    LAST_FULL,
    PREEMPTED,
    PREEMPTIONS,
    STATS,
    connector_notice,
    preemption_total,
    preemption_warning,
    stats_line,
)
from sidecar.doctor.start_args import (
    ARGS_NAMESPACE,
    ARGS_NON_DEFAULT,
    COMMAND_BEFORE_START,
    COMMAND_MODEL,
    ENGINE_CONFIG,
    command_line,
    command_model,
    engine_config,
    server_args,
)
from sidecar.doctor.start_refusal import (
    AVAILABLE_AT_START,
    ESTIMATED_MAX_LEN,
    EXTERNAL_WEIGHTS,
    FREE_AT_START,
    FREE_BESIDE_EXTERNAL,
    MAX_LEN_V0,
    MAX_LEN_V1,
    NO_CACHE_MEMORY,
    PROFILE_CHECK,
    PROMPT_OVER_KV,
    SAMPLER,
    STATE_BLOCKS,
    estimated_max_len,
    external_weights,
    free_at_start,
    free_beside_external,
    max_len_v0,
    max_len_v1,
    no_cache,
    profile_check,
    prompt_over_kv,
    sampler,
    state_blocks,
)
from sidecar.doctor.tpu_memory import (
    BUDGET_BELOW_RESIDENT,
    HBM_DEVICES,
    budget_below_resident,
    hbm_devices,
)

_SERVING = re.compile(SERVING_SIGNS)
_NUM = NUMBER
_INT = r"([\d,]+)"
# The card's name where a log prints it: collect_env, nvidia-smi, rocm-smi, a launcher's banner.
_GPU_NAME = re.compile(
    r"\b((?:NVIDIA|Tesla|Quadro|AMD Instinct|AMD Radeon)[ \w-]{0,24}?\b(?:[AHLBTV]\d{1,3}[A-Z]?|GH200|GB\d00|"
    r"RTX ?\w*? ?\d{4}\w*|RTX PRO \d{4}|MI\d{3}\w*))\b"
)
# V1's model runner names what it loads (0.8 on): `Starting to load model Qwen/Qwen3-32B...`.
_LOADING_MODEL = re.compile(r"Starting to load model ([\w./@:-]+?)\.{0,3}\s*$")
_BANNER_VERSION = re.compile(r"(?:vLLM API server version|\u2588\s+version) (\d+\.\d+[\w.+-]*)")

_FREE_INFO = loose(
    r"Free memory on device(?: \S+)? \(" + _NUM + "/" + _NUM + r" GiB\) on startup\. Desired GPU memory utilization "
    r"is \(" + _NUM + ", " + _NUM + r" GiB\)\. Actual usage is " + _NUM + r" GiB for weight, " + _NUM + r" GiB for "
    r"peak activation, " + _NUM + r" GiB for non-torch memory, and " + _NUM + r" GiB for CUDAGraph memory"
)
_V0_BUDGET = loose(
    r"total_gpu_memory \(" + _NUM + r" ?GiB\) x gpu_memory_utilization \(" + _NUM + r"\) = " + _NUM + r" ?GiB"
)
_V0_PROFILE = loose(
    r"model weights take " + _NUM + r" ?GiB; non_torch_memory takes " + _NUM + r" ?GiB; PyTorch activation peak "
    r"memory takes " + _NUM + r" ?GiB;\s*the rest of the memory reserved for KV Cache is " + _NUM + r" ?GiB"
)  # `\s*`: a paste that wrapped the line at that space dropped it
_KV_TOKENS = loose(r"\b[A-Z]+(?: \+ host)? KV cache size: " + _INT + r" tokens")
_CONCURRENCY = loose(r"Maximum concurrency for " + _INT + r" tokens per request: " + _NUM + "x")
_BLOCKS = loose(r"# (?:GPU|\w+) blocks: (-?\d+)|num_gpu_blocks is: (-?\d+)")
_CPU_BLOCKS = loose(r"# CPU blocks: (\d+)")
_AVAILABLE_KV = loose(r"Available KV cache memory: " + _NUM + " GiB")
# Hardware plugins' workers (vllm-ascend's worker_v1.py) state the same in bytes, clamped at 0, with the card's
# total: "Available memory: 0, total memory: 65452113920". 0 means the budget is at or below weights + peak.
_AVAILABLE_BYTES = loose(r"Available memory: (\d+), total memory: (\d+)")
_WEIGHTS = loose(r"(?:Model loading took|Loading model weights took) " + _NUM + r" (GiB|GB)")
_GRAPHS_PROFILED = loose(r"Profiling CUDA graph memory")
# 0.21+ (gpu_worker.py): "CUDA graph memory profiling is enabled (default since v0.21.0). The current
# --gpu-memory-utilization=0.3000 is equivalent to --gpu-memory-utilization=0.0201 without CUDA graph memory
# profiling. ...": graphs are charged to the budget, and the line states the budget.
_GRAPHS_CHARGED = loose(r"The current --gpu-memory-utilization=" + _NUM + r" is equivalent to")
_GRAPHS = loose(r"Graph capturing finished in \d+ secs, took " + _NUM + " GiB")
_GRAPH_ESTIMATE = loose(r"Estimated CUDA graph memory: " + _NUM + " GiB total")
_MAX_MODEL_LEN = loose(r"Using max model len (\d+)")
# How each release says the engine died: V1's EngineDeadError and core_client's "Engine core proc X died
# unexpectedly" (0.8-0.11) or "Got fatal signal from worker processes" (0.7-0.8), the API servers' watcher's
# "Engine core process X died unexpectedly." (0.2x-0.33), a worker that died, V0's MQLLMEngine /
# AsyncEngineDeadError.
_ENGINE_DEAD = re.compile(
    r"EngineDeadError|MQLLMEngine is already dead|EngineCore encountered a fatal error"
    r"|Engine core proc(?:ess)? \S+ died"
    r"|Got fatal signal from worker processes|Worker proc \S+ died unexpectedly|RayWorkerProc rank=\S+ died"
)
# The frames of vLLM's check that the KV cache it sized holds one max_model_len request (V0 `initialize_cache` ->
# `raise_if_cache_size_invalid`, V1 `check_enough_kv_cache_memory`): a traceback through them is that refusal.
_KV_CHECK = re.compile(r"\b(?:raise_if_cache_size_invalid|_?check_enough_kv_cache_memory|initialize_cache)\b")
_TRACEBACK = re.compile(r"Traceback \(most recent call last\)|\b\w*(?:Error|Exception): ")
# V1's process names and sources (EngineCore, VllmWorker rank=, Worker_TP, vllm/v1/), else V0's (MQLLMEngine,
# VllmWorkerProcess, vllm/worker/, vllm/engine/llm_engine.py).
_ENGINE_GENERATION = re.compile(
    r"(EngineCore|VllmWorker rank=|Worker_TP\d|vllm/v1/|V1 LLM engine)"
    r"|MQLLMEngine|VllmWorkerProcess|vllm/worker/|vllm/engine/(?:async_)?llm_engine\.py|preempted by PreemptionMode"
)


def parse_log(text: str) -> LogFacts:
    return parse_records(records(text))


def parse_records(log: list[Record]) -> LogFacts:
    """The facts of the last start in `log`; `lines_read` counts its records. When the log ends while that start
    is still starting (no failure and no sign of serving: a supervisor restarting vLLM in a loop, the log cut
    as the next attempt begins), the start before it, which did fail, is read instead, and says so."""
    starts = _starts([record.text for record in log])
    last = _facts(log[starts[-1] :])
    if len(starts) < 2 or _failed(last) or shows_serving([record.text for record in log[starts[-1] :]]):
        return last
    before = _facts(log[starts[-2] : starts[-1]])
    return replace(before, later_start_unfinished=True) if _failed(before) else last


def shows_serving(lines: list[str]) -> bool:
    """Whether any of a start's records (as `log_lines` gives them) shows it serving, or done starting."""
    return any(_SERVING.search(line) for line in lines)


def _failed(facts: LogFacts) -> bool:
    return facts.refusal is not None or facts.oom is not None or facts.engine_dead or facts.host_memory is not None


def _facts(log: list[Record]) -> LogFacts:
    facts: Facts = {}
    recognised = 0
    for record in log:
        # Every handler sees every record: 0.28+ prints the KV size and the concurrency on one line.
        if [_apply(handler, record.text, facts) for handler in _HANDLERS].count(True):
            recognised += 1
        for handler in _CONTEXT:
            _apply(handler, record.payload, facts)  # not the prefix: a launcher's names say nothing of vLLM's
    oom = find_oom(log)
    if oom is not None:
        recognised += 1
    refusal = facts.get("refusal")
    if isinstance(refusal, Refusal) and refusal.kind is RefusalKind.SAMPLER_WARMUP:
        at = max(i for i, record in enumerate(log) if SAMPLER.search(record.text))
        facts["refusal"] = replace(refusal, phase=oom_phase(log, at)[0])
    if oom is None and facts.get("traceback") and not {"refusal", "host_memory"} & facts.keys():
        facts["cut_in"] = cut_in_traceback(log)
    if not recognised and (facts.get("kv_check_failed") or facts.get("cut_in")):
        recognised = 1  # a traceback through vLLM's own start, its error line cut: still vLLM's
    facts.pop(LAST_FULL, None)
    connector_ids = facts.pop(CONNECTOR_IDS, None)
    if isinstance(connector_ids, set) and connector_ids and not facts.get("preemptions"):
        facts.update(preemptions=len(connector_ids), preemption_mode="RECOMPUTE", preemptions_noticed_by="LMCache")
    ranks = [record.tp_rank for record in log if record.tp_rank is not None]
    if ranks:
        facts["ranks_seen"] = max(ranks) + 1
    facts["parallel_workers"] = any(record.parallel_worker for record in log) or len(set(ranks)) > 1
    result = LogFacts(lines_read=len(log), lines_recognised=recognised, oom=oom)
    return replace(result, **facts)  # type: ignore[arg-type]


def log_lines(text: str) -> list[str]:
    """The records `parse_log` reads, as text (colours stripped, wrapped messages joined); `lines_read` counts
    these."""
    return [record.text for record in records(text)]


def rejoin(lines: list[str]) -> list[str]:
    """Lines with each wrapped message put back together (see `log_records`)."""
    return [record.text for record in join_lines(lines)]


def _apply(handler: Callable[[str, Facts], bool], line: str, facts: Facts) -> bool:
    try:
        return handler(line, facts)
    except ValueError:  # a number vLLM never prints ("1.2.3"): the line only looks like vLLM's
        return False


def _starts(lines: list[str]) -> list[int]:
    """Where each start begins: 0, then each args line (else each engine config line) after the first line."""
    for pattern in (ARGS_NON_DEFAULT, ARGS_NAMESPACE, ENGINE_CONFIG):
        found = [index for index, line in enumerate(lines) if pattern.search(line)]
        if found:
            return sorted({0, *(_with_its_command(lines, index) for index in found)})
    return [0]


def _with_its_command(lines: list[str], start: int) -> int:
    """A start's first line, moved back to the command line pasted just before it (`$ vllm serve M --flag ...`),
    when there is one within COMMAND_BEFORE_START lines: the user's flags belong to the start they began."""
    for index in range(start - 1, max(0, start - COMMAND_BEFORE_START) - 1, -1):
        if COMMAND_MODEL.search(lines[index]):
            return index
    return start


def _number(text: str) -> float:
    return float(text.replace(",", ""))


def _simple(
    pattern: re.Pattern[str], store: Callable[[re.Match[str], Facts], None], *, needle: str = ""
) -> Callable[[str, Facts], bool]:
    """A handler for one pattern; `needle`, a word every match contains (one a wrap cannot split), skips the
    regular expression on the lines that lack it: most lines of a long log match none."""

    def handler(line: str, facts: Facts) -> bool:
        if needle not in line:
            return False
        match = pattern.search(line)
        if match is None:
            return False
        store(match, facts)
        return True

    return handler


def _free_info(match: re.Match[str], facts: Facts) -> None:
    free, total, utilization, budget, weights, activation, non_torch, graphs = (
        float(match.group(i)) for i in range(1, 9)
    )
    facts["profile"] = MemoryProfile(
        total_gib=total,
        utilization=utilization,
        budget_gib=budget,
        weights_gib=weights,
        activation_gib=activation,
        non_torch_gib=non_torch,
        cudagraph_gib=graphs,
        free_gib=free,
    )
    facts["weights_gib"] = weights


def _v0_budget(match: re.Match[str], facts: Facts) -> None:
    previous = facts.get("profile")
    base = previous if isinstance(previous, MemoryProfile) else MemoryProfile.empty()
    total, utilization, budget = (float(match.group(i)) for i in range(1, 4))
    facts["profile"] = replace(base, total_gib=total, utilization=utilization, budget_gib=budget)
    if facts.get("engine") != "v1":  # only V0's worker (vllm/worker/worker.py) words its budget so
        facts["engine"] = "v0"


def _v0_profile(match: re.Match[str], facts: Facts) -> None:
    previous = facts.get("profile")
    base = previous if isinstance(previous, MemoryProfile) else MemoryProfile.empty()
    weights, non_torch, activation, kv = (float(match.group(i)) for i in range(1, 5))
    facts["profile"] = replace(base, weights_gib=weights, non_torch_gib=non_torch, activation_gib=activation, kv_gib=kv)
    facts["weights_gib"] = weights
    facts["available_kv_gib"] = kv


def _weights(match: re.Match[str], facts: Facts) -> None:
    # vLLM <= 0.8.0 printed "GB" for a value it had divided by 2**30: both spellings are GiB.
    facts["weights_gib"] = float(match.group(1))


def _available_kv(match: re.Match[str], facts: Facts) -> None:
    # Each rank prints its own; V1's engine sizes the KV cache of every rank by the least of them, so a rank whose
    # card holds something else fails the start however much room the others have.
    kv = float(match.group(1))
    least, most = facts.get("available_kv_gib"), facts.get("available_kv_max_gib")
    facts["available_kv_gib"] = min(kv, least) if isinstance(least, float) else kv
    facts["available_kv_max_gib"] = max(kv, most) if isinstance(most, float) else kv


def _available_bytes(match: re.Match[str], facts: Facts) -> None:
    available, total = (int(match.group(i)) for i in (1, 2))
    if total <= 0:
        return
    previous = facts.get("profile")
    base = previous if isinstance(previous, MemoryProfile) else MemoryProfile.empty()
    facts["profile"] = replace(base, total_gib=base.total_gib or total / 2**30)
    facts["available_kv_gib"] = available / 2**30


def _blocks(match: re.Match[str], facts: Facts) -> None:
    # vLLM 0.1 printed a budget short of the profile's peak as a negative count ("# GPU blocks: -1") and went on to
    # fail later: no block at all, as 0 says to every reading.
    facts["num_gpu_blocks"] = max(0, int(match.group(1) or match.group(2)))


def _store(name: str, convert: Callable[[str], object]) -> Callable[[re.Match[str], Facts], None]:
    def store(match: re.Match[str], facts: Facts) -> None:
        facts[name] = convert(match.group(1))

    return store


def _concurrency(match: re.Match[str], facts: Facts) -> None:
    facts["concurrency"] = (int(_number(match.group(1))), float(match.group(2)))


def _gpu_name(match: re.Match[str], facts: Facts) -> None:
    facts.setdefault("gpu_name", match.group(1))


def _banner_version(match: re.Match[str], facts: Facts) -> None:
    facts.setdefault("version", match.group(1))  # the engine's own config line, when there is one, wins


def _dead(_: re.Match[str], facts: Facts) -> None:
    facts["engine_dead"] = True


def _traceback(_: re.Match[str], facts: Facts) -> None:
    facts["traceback"] = True


def _graphs_profiled(_: re.Match[str], facts: Facts) -> None:
    facts["graphs_profiled"] = True


def _graphs_charged(match: re.Match[str], facts: Facts) -> None:
    facts["graphs_profiled"] = True
    facts["graphs_charged_utilization"] = _number(match.group(1))


def _kv_check(_: re.Match[str], facts: Facts) -> None:
    facts["kv_check_failed"] = True


def _engine(match: re.Match[str], facts: Facts) -> None:
    if facts.get("engine") != "v1":  # a V1 log prints V0-looking paths too (shared modules); V1's names decide
        facts["engine"] = "v1" if match.group(1) else "v0"


_HANDLERS: tuple[Callable[[str, Facts], bool], ...] = (
    server_args,
    engine_config,
    _simple(_BANNER_VERSION, _banner_version, needle="version"),
    _simple(MAX_LEN_V1, max_len_v1, needle="seq"),
    _simple(ESTIMATED_MAX_LEN, estimated_max_len, needle="stimated"),
    _simple(MAX_LEN_V0, max_len_v0, needle="can be"),
    _simple(NO_CACHE_MEMORY, no_cache, needle="cache"),
    _simple(PROMPT_OVER_KV, prompt_over_kv, needle="block_manager"),
    _simple(STATE_BLOCKS, state_blocks, needle="Mamba"),
    _simple(FREE_AT_START, free_at_start, needle="desired"),
    _simple(FREE_BESIDE_EXTERNAL, free_beside_external, needle="excluding"),
    _simple(EXTERNAL_WEIGHTS, external_weights, needle="Externally"),
    _simple(AVAILABLE_AT_START, free_at_start, needle="utilization"),
    _simple(SAMPLER, sampler, needle="warming up"),
    _simple(PROFILE_CHECK, profile_check, needle="profiling"),
    _simple(CPU_NODE, cpu_node, needle="node"),
    _simple(CPU_KV_SPACE, cpu_kv_space, needle="Explicitly set"),
    _simple(STATS, stats_line, needle="Running"),
    _simple(PREEMPTED, preemption_warning, needle="preempted"),
    _simple(CONNECTOR_PREEMPTED, connector_notice, needle="<preempted>"),
    _simple(_FREE_INFO, _free_info, needle="utilization"),
    _simple(_V0_BUDGET, _v0_budget, needle="total_gpu_memory"),
    _simple(_V0_PROFILE, _v0_profile, needle="weights"),
    _simple(_KV_TOKENS, _store("kv_cache_tokens", lambda text: int(_number(text)))),
    _simple(_CONCURRENCY, _concurrency, needle="concurrency"),
    _simple(_BLOCKS, _blocks, needle="blocks"),
    _simple(_CPU_BLOCKS, _store("cpu_blocks", int), needle="CPU"),
    _simple(MAP_REFUSED, map_refused, needle="mmap"),
    _simple(KILLED, killed, needle="Kill"),
    _simple(NODE_LOW, node_low, needle="killed due to"),
    _simple(NODE_MEMORY, node_memory, needle="memory usage threshold"),
    _simple(SWAP_WARNING, swap_warning, needle="swap space"),
    _simple(SWAP_EXHAUSTED, swap_exhausted, needle="swap"),
    _simple(_AVAILABLE_KV, _available_kv),
    _simple(_AVAILABLE_BYTES, _available_bytes, needle="total"),
    _simple(HBM_DEVICES, hbm_devices, needle="hbm="),
    _simple(BUDGET_BELOW_RESIDENT, budget_below_resident, needle="total_hbm_used_gb"),
    _simple(METAL_KV_REFUSAL, metal_kv_refusal, needle="metal_limit="),
    _simple(MITIGATION_NAMES_ENV, metal_mitigation, needle="Mitigations"),
    _simple(_WEIGHTS, _weights, needle="took"),
    _simple(_GRAPHS, _store("graph_capture_gib", float), needle="Graph"),
    _simple(_GRAPH_ESTIMATE, _store("graph_estimate_gib", float), needle="Estimated"),
    _simple(_GRAPHS_PROFILED, _graphs_profiled, needle="graph"),
    _simple(_GRAPHS_CHARGED, _graphs_charged, needle="equivalent"),
    _simple(_MAX_MODEL_LEN, _store("max_seq_len", int), needle="max model len"),
    _simple(PREEMPTIONS, preemption_total, needle="total_num_cumulative_preemption"),
    _simple(_ENGINE_DEAD, _dead),
)
# Context, not a line of vLLM's own: read, but a log of nothing else is still "no vLLM line recognised".
_CONTEXT: tuple[Callable[[str, Facts], bool], ...] = (
    _simple(_TRACEBACK, _traceback),
    _simple(_KV_CHECK, _kv_check, needle="cache"),
    command_line,
    _simple(_LOADING_MODEL, command_model, needle="Starting to load model"),
    _simple(_GPU_NAME, _gpu_name),
    _simple(_ENGINE_GENERATION, _engine),
)
