"""The arguments a start ran with, as its log states them: vLLM's own arguments line (`non-default args: {...}`,
V0's `args: Namespace(...)`), its engine config line, and a command line pasted above the start. Pure.

Each function stores what it read in the parser's facts (`log_parser`, which also uses the patterns to find
where each start begins). vLLM's own line wins over a pasted command, which fills only what vLLM did not say.
"""

from __future__ import annotations

import re
from dataclasses import replace

from sidecar.doctor.logfacts import STATED_BY_OPTION, STATED_BY_PASTED, STATED_BY_VLLM, Facts, LogFacts, ServerArgs

ARGS_NON_DEFAULT = re.compile(r"non-default args: (\{.*\})")

ARGS_NAMESPACE = re.compile(r"\bargs: Namespace\((.*)\)")

# Releases before 0.4 print no version: `Initializing an LLM engine with config: ...`.
ENGINE_CONFIG = re.compile(r"Initializing an? (?:V1 )?LLM engine (?:\(v([^)\s]+)\) )?with config: (.*)$")

# A command line pasted with the log: `vllm serve MODEL ...`, `--model MODEL` (api_server, launchers).
COMMAND_MODEL = re.compile(r"\bvllm serve\s+(?!-)([\w./@:-]+)|--model[= ]+(?!-)([\w./@:-]+)")

COMMAND_BEFORE_START = 3  # lines between a pasted command line and vLLM's first line of the start it began

_COMMAND_FLAG = re.compile(r"(?<!\S)--([a-z][a-z0-9-]*)(?:[= ]+(?!-)(\S+))?")

# The CUDA-graph capture sizes in the engine's config line: `"cudagraph_capture_sizes":[512,504,...]` (0.7-0.10) and
# `"max_capture_size":512` (0.7-0.10) or `"max_cudagraph_capture_size":512` (0.11.2+).
_CAPTURE_SIZES = re.compile(r"[\"']cudagraph_capture_sizes[\"']: ?\[([\d, ]*)\]")

_MAX_CAPTURE = re.compile(r"[\"']max_(?:cudagraph_)?capture_size[\"']: ?(\d+)")

_ARG_TYPES: dict[str, type] = {
    "max_model_len": int,
    "max_num_seqs": int,
    "max_num_batched_tokens": int,
    "gpu_memory_utilization": float,
    "block_size": int,
    "enable_prefix_caching": bool,
    "kv_cache_memory_bytes": int,
    "tensor_parallel_size": int,
    "shutdown_timeout": int,
    "quantization": str,
    "kv_cache_dtype": str,
    "model": str,
    "dtype": str,
    "pipeline_parallel_size": int,
    "enforce_eager": bool,
    "swap_space": float,
    "cpu_offload_gb": float,
}


_KIND_WORDS = {int: "a whole number", float: "a number", str: "a value"}


def server_args(line: str, facts: Facts) -> bool:
    non_default = ARGS_NON_DEFAULT.search(line)
    namespace = None if non_default else ARGS_NAMESPACE.search(line)
    if non_default is None and namespace is None:
        return False
    body = (non_default or namespace).group(1)  # type: ignore[union-attr]
    values = {key: _arg_value(body, key, kind, quoted_keys=non_default is not None) for key, kind in _ARG_TYPES.items()}
    values["model"] = values["model"] or _arg_value(body, "model_tag", str, quoted_keys=non_default is not None)
    facts["args"] = ServerArgs(complete=namespace is not None, **values)  # type: ignore[arg-type]
    if values["model"]:
        facts.setdefault("model", values["model"])
    return True


def _arg_value(body: str, key: str, kind: type, *, quoted_keys: bool) -> object:
    """One argument from a dict repr (`'key': value`) or a Namespace repr (`key=value`); None when absent."""
    pattern = rf"'{key}': " if quoted_keys else rf"(?<![\w.]){key}="
    match = re.search(pattern + r"('([^']*)'|[^,})]+)", body)
    if match is None:
        return None
    raw = match.group(2) if match.group(2) is not None else match.group(1).strip()
    if raw == "None":
        return None
    try:
        if kind is bool:
            return {"True": True, "False": False}.get(raw)
        return kind(raw)
    except ValueError:
        return None


def engine_config(line: str, facts: Facts) -> bool:
    match = ENGINE_CONFIG.search(line)
    if match is None:
        return False
    if match.group(1):
        facts["version"] = match.group(1).rstrip(",")
    config = match.group(2)
    for key, name, kind in (
        ("max_seq_len", "max_seq_len", int),
        ("tensor_parallel_size", "tensor_parallel_size", int),
        ("quantization", "quantization", str),
        ("kv_cache_dtype", "kv_cache_dtype", str),
        ("device_config", "device", str),
        ("dtype", "dtype", str),
        ("pipeline_parallel_size", "pipeline_parallel_size", int),
    ):
        found = re.search(rf"\b{key}=([\w.]+)", config)
        if found is not None and found.group(1) != "None":
            facts[name] = kind(found.group(1))
    model = re.search(r"\bmodel='([^']+)'", config)
    if model is not None:
        facts["model"] = model.group(1)
    sizes = _CAPTURE_SIZES.search(config)
    if sizes is not None and sizes.group(1).strip():
        facts["capture_sizes"] = tuple(sorted(int(size) for size in sizes.group(1).split(",") if size.strip()))
    largest = _MAX_CAPTURE.search(config)
    if largest is not None:
        facts["max_capture_size"] = int(largest.group(1))
    return True


def command_model(match: re.Match[str], facts: Facts) -> None:
    facts.setdefault("model", match.group(1) or match.group(2))  # vLLM's own arguments line, when there is one, wins


def command_line(line: str, facts: Facts) -> bool:
    """A command line pasted with the log (`vllm serve M --gpu-memory-utilization 0.98`, `python -m
    vllm.entrypoints.openai.api_server --model M ...`): its model, and its flags as what the user changed, as
    vLLM's own non-default arguments line says it, which wins where the log has one (read after, or kept before)."""
    command = COMMAND_MODEL.search(line)
    if command is None:
        return False
    command_model(command, facts)
    if "args" in facts:
        return False
    values, _ = _command_values(line, strict=False)
    facts["args"] = ServerArgs(complete=False, stated_by=STATED_BY_PASTED, **values)  # type: ignore[arg-type]
    return False


def stated_command(
    text: str, *, stated_by: str = STATED_BY_OPTION, strict: bool = True
) -> tuple[ServerArgs, str | None]:
    """The arguments and model of the command that started vLLM, as the user gives it (`--vllm-command`) or an
    incident kept it: `vllm serve M --flag value ...`, `python -m vllm.entrypoints.openai.api_server --model M
    ...`, or the flags alone (a container's args). With `strict`, ValueError, naming the flag, for a value vLLM
    would refuse too, or for a text with neither a flag the doctor reads nor a model."""
    values, config_file = _command_values(text, strict=strict)
    command = COMMAND_MODEL.search(text)
    model = (command.group(1) or command.group(2)) if command is not None else None
    if strict and model is None and all(value is None for value in values.values()):
        raise ValueError(
            f"--vllm-command names no model and none of the flags the doctor reads (--gpu-memory-utilization, "
            f"--max-num-seqs, --max-model-len, --tensor-parallel-size, ...): got {text!r}"
        )
    values["model"] = values["model"] or model
    # Flags left out mean vLLM's defaults, unless a --config file may hold them.
    return ServerArgs(complete=config_file, stated_by=stated_by, **values), model  # type: ignore[arg-type]


def with_stated_command(log: LogFacts, args: ServerArgs, model: str | None) -> LogFacts:
    """The log's facts with the given command for the start it diagnoses: vLLM's own arguments line wins; the
    given command wins over a command line pasted in the log (and `--vllm-command` over an incident's)."""
    if log.args is not None and log.args.stated_by == STATED_BY_VLLM:
        return log
    return replace(log, args=args, model=log.model or model)


def _command_values(text: str, *, strict: bool) -> tuple[dict[str, object], bool]:
    """The flags of a command line the doctor reads (`--flag value`, `--flag=value`, switches, `--no-` switches),
    and whether it names a `--config` file. A value that does not parse is skipped, or with `strict` refused."""
    values: dict[str, object] = dict.fromkeys(_ARG_TYPES)
    config_file = False
    for flag in _COMMAND_FLAG.finditer(text):
        key = flag.group(1).replace("-", "_")
        config_file = config_file or key == "config"
        negated = key.startswith("no_") and _ARG_TYPES.get(key[3:]) is bool
        kind = bool if negated else _ARG_TYPES.get(key)
        raw = (flag.group(2) or "").strip("'\"")
        if negated:
            values[key[3:]] = False
        elif kind is bool:
            values[key] = raw.lower() not in ("false", "0")  # a switch, or `--flag=True`
        elif kind is not None and raw:
            try:
                values[key] = kind(raw)
            except ValueError:
                if strict:
                    raise ValueError(
                        f"--vllm-command: --{flag.group(1)} needs {_KIND_WORDS[kind]}, got {raw!r}"
                    ) from None
        elif kind is not None and strict:
            raise ValueError(f"--vllm-command: --{flag.group(1)} has no value")
    return values, config_file
