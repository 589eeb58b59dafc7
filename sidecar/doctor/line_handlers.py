"""Which of vLLM's lines the log parser reads, and the fact each one stores. Pure.

Each handler matches one message (its pattern, and a word every match holds, so most lines of a long log skip the
regular expression) and stores what it says in the facts of the start being read. `HANDLERS` are vLLM's own
lines: a log with none of them is no vLLM log. `CONTEXT` is read from every record too, but says nothing by
itself (a traceback, the frames of the KV check, a pasted command, the card's name, the engine generation).
"""

from __future__ import annotations

import re
from collections.abc import Callable

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
from sidecar.doctor.log_records import loose
from sidecar.doctor.logfacts import (
    Facts,
)
from sidecar.doctor.metal_memory import METAL_KV_REFUSAL, MITIGATION_NAMES_ENV, metal_kv_refusal, metal_mitigation
from sidecar.doctor.profile_lines import (
    AVAILABLE_BYTES,
    AVAILABLE_KV,
    BLOCKS,
    CONCURRENCY,
    CPU_BLOCKS,
    FREE_INFO,
    GRAPH_ESTIMATE,
    GRAPHS,
    GRAPHS_CHARGED,
    GRAPHS_PROFILED,
    KV_TOKENS,
    V0_BUDGET,
    V0_PROFILE,
    WEIGHTS,
    available_bytes,
    available_kv,
    blocks,
    concurrency,
    free_info,
    graphs_charged,
    graphs_profiled,
    model_loading,
    number,
    v0_budget,
    v0_profile,
)
from sidecar.doctor.scheduler_stats import (
    CONNECTOR_PREEMPTED,
    PREEMPTED,
    PREEMPTIONS,
    STATS,
    connector_notice,
    preemption_total,
    preemption_warning,
    stats_line,
)
from sidecar.doctor.start_args import (
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

# The card's name where a log prints it: collect_env, nvidia-smi, rocm-smi, a launcher's banner.
_GPU_NAME = re.compile(
    r"\b((?:NVIDIA|Tesla|Quadro|AMD Instinct|AMD Radeon)[ \w-]{0,24}?\b(?:[AHLBTV]\d{1,3}[A-Z]?|GH200|GB\d00|"
    r"RTX ?\w*? ?\d{4}\w*|RTX PRO \d{4}|MI\d{3}\w*))\b"
)
# V1's model runner names what it loads (0.8 on): `Starting to load model Qwen/Qwen3-32B...`.
_LOADING_MODEL = re.compile(r"Starting to load model ([\w./@:-]+?)\.{0,3}\s*$")
_BANNER_VERSION = re.compile(r"(?:vLLM API server version|\u2588\s+version) (\d+\.\d+[\w.+-]*)")

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
# A traceback's header, its exception line, or a frame in vLLM's code (an excerpt that starts mid-traceback).
_TRACEBACK = re.compile(
    r"Traceback \(most recent call last\)|\b\w*(?:Error|Exception): |File \"[^\"]*\bvllm/[^\"]*\", line \d+"
)
# V1's process names and sources (EngineCore, VllmWorker rank=, Worker_TP, vllm/v1/), else V0's (MQLLMEngine,
# VllmWorkerProcess, vllm/worker/, vllm/engine/llm_engine.py).
_ENGINE_GENERATION = re.compile(
    r"(EngineCore|VllmWorker rank=|Worker_TP\d|vllm/v1/|V1 LLM engine)"
    r"|MQLLMEngine|VllmWorkerProcess|vllm/worker/|vllm/engine/(?:async_)?llm_engine\.py|preempted by PreemptionMode"
)


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


def _store(name: str, convert: Callable[[str], object]) -> Callable[[re.Match[str], Facts], None]:
    def store(match: re.Match[str], facts: Facts) -> None:
        facts[name] = convert(match.group(1))

    return store


def _gpu_name(match: re.Match[str], facts: Facts) -> None:
    facts.setdefault("gpu_name", match.group(1))


def _banner_version(match: re.Match[str], facts: Facts) -> None:
    facts.setdefault("version", match.group(1))  # the engine's own config line, when there is one, wins


def _dead(_: re.Match[str], facts: Facts) -> None:
    facts["engine_dead"] = True


def _traceback(_: re.Match[str], facts: Facts) -> None:
    facts["traceback"] = True


def _kv_check(_: re.Match[str], facts: Facts) -> None:
    facts["kv_check_failed"] = True


def _engine(match: re.Match[str], facts: Facts) -> None:
    if facts.get("engine") != "v1":  # a V1 log prints V0-looking paths too (shared modules); V1's names decide
        facts["engine"] = "v1" if match.group(1) else "v0"


HANDLERS: tuple[Callable[[str, Facts], bool], ...] = (
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
    _simple(FREE_INFO, free_info, needle="utilization"),
    _simple(V0_BUDGET, v0_budget, needle="total_gpu_memory"),
    _simple(V0_PROFILE, v0_profile, needle="weights"),
    _simple(KV_TOKENS, _store("kv_cache_tokens", lambda text: int(number(text)))),
    _simple(CONCURRENCY, concurrency, needle="concurrency"),
    _simple(BLOCKS, blocks, needle="blocks"),
    _simple(CPU_BLOCKS, _store("cpu_blocks", int), needle="CPU"),
    _simple(MAP_REFUSED, map_refused, needle="mmap"),
    _simple(KILLED, killed, needle="Kill"),
    _simple(NODE_LOW, node_low, needle="killed due to"),
    _simple(NODE_MEMORY, node_memory, needle="memory usage threshold"),
    _simple(SWAP_WARNING, swap_warning, needle="swap space"),
    _simple(SWAP_EXHAUSTED, swap_exhausted, needle="swap"),
    _simple(AVAILABLE_KV, available_kv),
    _simple(AVAILABLE_BYTES, available_bytes, needle="total"),
    _simple(HBM_DEVICES, hbm_devices, needle="hbm="),
    _simple(BUDGET_BELOW_RESIDENT, budget_below_resident, needle="total_hbm_used_gb"),
    _simple(METAL_KV_REFUSAL, metal_kv_refusal, needle="metal_limit="),
    _simple(MITIGATION_NAMES_ENV, metal_mitigation, needle="Mitigations"),
    _simple(WEIGHTS, model_loading, needle="took"),
    _simple(GRAPHS, _store("graph_capture_gib", float), needle="Graph"),
    _simple(GRAPH_ESTIMATE, _store("graph_estimate_gib", float), needle="Estimated"),
    _simple(GRAPHS_PROFILED, graphs_profiled, needle="graph"),
    _simple(GRAPHS_CHARGED, graphs_charged, needle="equivalent"),
    _simple(_MAX_MODEL_LEN, _store("max_seq_len", int), needle="max model len"),
    _simple(PREEMPTIONS, preemption_total, needle="total_num_cumulative_preemption"),
    _simple(_ENGINE_DEAD, _dead),
)
# Context, not a line of vLLM's own: read, but a log of nothing else is still "no vLLM line recognised".
CONTEXT: tuple[Callable[[str, Facts], bool], ...] = (
    _simple(_TRACEBACK, _traceback),
    _simple(_KV_CHECK, _kv_check, needle="cache"),
    command_line,
    _simple(_LOADING_MODEL, command_model, needle="Starting to load model"),
    _simple(_GPU_NAME, _gpu_name),
    _simple(_ENGINE_GENERATION, _engine),
)
