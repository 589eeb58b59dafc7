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

from sidecar.doctor.line_handlers import CONTEXT, HANDLERS
from sidecar.doctor.log_records import Record, join_lines, records, undo_the_paste
from sidecar.doctor.logfacts import Facts, LogFacts, Refusal, RefusalKind
from sidecar.doctor.oom_log import find_oom
from sidecar.doctor.phase import SERVING_SIGNS, cut_in_traceback, oom_phase
from sidecar.doctor.scheduler_stats import CONNECTOR_IDS, LAST_FULL
from sidecar.doctor.start_args import (
    ARGS_NAMESPACE,
    ARGS_NON_DEFAULT,
    COMMAND_BEFORE_START,
    COMMAND_MODEL,
    ENGINE_CONFIG,
)
from sidecar.doctor.start_refusal import SAMPLER

_SERVING = re.compile(SERVING_SIGNS)


def parse_log(text: str) -> LogFacts:
    return parse_records(records(text))


def parse_records(log: list[Record]) -> LogFacts:
    """The facts of the last start in `log`; `lines_read` counts its records. When the log ends while that start
    is still starting (no failure and no sign of serving: a supervisor restarting vLLM in a loop, the log cut
    as the next attempt begins), the start before it, which did fail, is read instead, and says so."""
    starts = _starts([record.text for record in log])
    last = _facts(log[starts[-1] :])
    if len(starts) < 2:
        return last
    earlier = log[starts[-2] : starts[-1]]
    if _failed(last) or shows_serving([record.text for record in log[starts[-1] :]]):
        return _with_earlier_weights(last, earlier)
    before = _facts(earlier)
    return replace(before, later_start_unfinished=True) if _failed(before) else last


def _with_earlier_weights(last: LogFacts, earlier: list[Record]) -> LogFacts:
    """The weights the start before measured, where it loaded the same model no smaller per GPU (the same
    parallelism and dtype, and unquantized or quantized alike) and this one measured none. The earlier start
    is read only when this one could use it."""
    if last.weights_gib is not None or not last.model:
        return last
    before = _facts(earlier)
    if before.weights_gib is None or before.model != last.model:
        return last
    same_split = (before.tensor_parallel_size, before.pipeline_parallel_size) == (
        last.tensor_parallel_size,
        last.pipeline_parallel_size,
    )
    same_dtype = before.dtype is None or last.dtype is None or before.dtype == last.dtype
    no_larger = before.quantization is None or before.quantization == last.quantization
    if not (same_split and same_dtype and no_larger):
        return last
    return replace(last, earlier_weights_gib=before.weights_gib)


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
        if [_apply(handler, record.text, facts) for handler in HANDLERS].count(True):
            recognised += 1
        for handler in CONTEXT:
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
    """Lines with each wrapped message put back together, colours dropped, as `parse_log` reads them (see
    `log_records`)."""
    return [record.text for record in join_lines(undo_the_paste("\n".join(lines)).splitlines())]


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
