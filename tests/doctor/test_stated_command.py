"""`doctor --vllm-command`: the flags a log does not state, given by the user; vLLM's own lines still win.

Parsing and precedence are pure; the command's part runs `sidecar.cli.main` in process against a closed port.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from sidecar.cli import main
from sidecar.doctor.log_parser import parse_log
from sidecar.doctor.logfacts import STATED_BY_OPTION, STATED_BY_PASTED, STATED_BY_VLLM
from sidecar.doctor.start_args import stated_command, with_stated_command
from tests.loopback import closed_port

# One PyTorch OOM line with no frame, no budget and no arguments line: the transient's lowering needs the budget.
BARE_OOM = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 23.69 GiB "
    "of which 979.69 MiB is free. Including non-PyTorch memory, this process has 22.73 GiB memory in use. Of the "
    "allocated memory 22.29 GiB is allocated by PyTorch, and 129.54 MiB is reserved by PyTorch but unallocated.\n"
)

OWN_ARGS = "INFO 10-14 21:32:45 api_server.py:1] non-default args: {'model': 'm', 'gpu_memory_utilization': 0.7}\n"


@pytest.fixture(autouse=True)
def _no_settings_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [name for name in os.environ if name.startswith("VLLM_SIDECAR_")]:
        monkeypatch.delenv(name)


def test_a_serve_command_gives_its_model_flags_switches_and_negations() -> None:
    args, model = stated_command(
        "vllm serve Qwen/Qwen2.5-7B-Instruct --gpu-memory-utilization=0.85 --max-num-seqs 32 --enforce-eager "
        "--no-enable-prefix-caching --tensor-parallel-size 2 --trust-remote-code"
    )
    assert model == "Qwen/Qwen2.5-7B-Instruct"
    assert (args.model, args.gpu_memory_utilization, args.max_num_seqs) == ("Qwen/Qwen2.5-7B-Instruct", 0.85, 32)
    assert (args.enforce_eager, args.enable_prefix_caching, args.tensor_parallel_size) == (True, False, 2)
    assert args.max_model_len is None
    assert args.stated_by == STATED_BY_OPTION
    assert not args.complete  # a flag left out of the command is vLLM's default


def test_a_containers_flags_alone_are_enough_and_a_config_file_leaves_the_rest_unknown() -> None:
    args, model = stated_command("--max-model-len 8192 --kv-cache-dtype fp8")
    assert (model, args.max_model_len, args.kv_cache_dtype) == (None, 8192, "fp8")
    with_file, _ = stated_command("vllm serve m --config /etc/vllm.yaml --max-num-seqs 8")
    assert with_file.complete  # the file may set the budget: a missing flag is not known to be the default


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("vllm serve m --gpu-memory-utilization high", "--vllm-command: --gpu-memory-utilization needs a number"),
        ("--max-num-seqs 1.5", "--vllm-command: --max-num-seqs needs a whole number, got '1.5'"),
        ("--quantization --enforce-eager", "--vllm-command: --quantization has no value"),
        ("--port 8001 --host 0.0.0.0", "--vllm-command names no model and none of the flags the doctor reads"),
    ],
)
def test_a_command_vllm_would_refuse_or_that_says_nothing_is_a_clear_error(text: str, says: str) -> None:
    with pytest.raises(ValueError, match="^" + says.replace("(", r"\(")):
        stated_command(text)


def test_vllms_own_arguments_line_wins_and_the_option_wins_over_a_pasted_command() -> None:
    option = stated_command("vllm serve m --gpu-memory-utilization 0.8")
    own = with_stated_command(parse_log(OWN_ARGS + BARE_OOM), *option)
    assert own.args is not None
    assert (own.args.gpu_memory_utilization, own.args.stated_by) == (0.7, STATED_BY_VLLM)
    pasted = parse_log("$ vllm serve m --gpu-memory-utilization 0.95\n" + BARE_OOM)
    assert pasted.args is not None
    assert pasted.args.stated_by == STATED_BY_PASTED
    given = with_stated_command(pasted, *option)
    assert given.args is not None
    assert (given.args.gpu_memory_utilization, given.args.stated_by) == (0.8, STATED_BY_OPTION)


def _doctor(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    url = f"http://127.0.0.1:{closed_port()}"
    code = main(["doctor", "--gpu-source", "none", "--vllm-url", url, *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_the_budget_the_user_gives_turns_a_step_into_a_value(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    log = tmp_path / "vllm.log"
    log.write_text(BARE_OOM)
    code, out, _ = _doctor(capsys, "--vllm-log", str(log), "--json")
    alone = json.loads(out)["findings"][0]
    assert code == 1
    assert alone["recommendations"] == []  # the budget is unknown: a step below what was set, no value
    assert any("below what you set" in step for step in alone["steps"])
    assert any(
        note.startswith("flags: not in the log") and "--vllm-command" in note for note in json.loads(out)["notes"]
    )

    code, out, _ = _doctor(
        capsys, "--vllm-log", str(log), "--json", "--vllm-command", "vllm serve m --gpu-memory-utilization 0.85"
    )
    given = json.loads(out)
    budget = [r for r in given["findings"][0]["recommendations"] if r["flag"] == "--gpu-memory-utilization"]
    # 0.85 - (2.00 GiB asked - 0.96 GiB free) / 23.69 GiB - 1 % margin = 0.796, rounded down
    assert [r["value"] for r in budget] == [0.79]
    assert "0.85 (--vllm-command)" in budget[0]["why"]
    assert "flags: --vllm-command (gpu_memory_utilization 0.85)" in given["notes"]


def test_a_budget_vllm_printed_wins_over_the_one_the_user_gives(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    log = tmp_path / "vllm.log"
    log.write_text(OWN_ARGS + BARE_OOM)
    code, out, _ = _doctor(capsys, "--vllm-log", str(log), "--json", "--vllm-command", "--gpu-memory-utilization 0.85")
    budget = [r for r in json.loads(out)["findings"][0]["recommendations"] if r["flag"] == "--gpu-memory-utilization"]
    assert code == 1
    assert budget
    assert "0.7 (the arguments vLLM logged at start)" in budget[0]["why"]


def test_the_option_without_a_log_or_with_a_bad_value_is_exit_2_in_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, out, err = _doctor(capsys, "--vllm-command", "vllm serve m --max-num-seqs 8")
    assert (code, out) == (2, "")
    assert (
        err
        == "vllm-sidecar: error: --vllm-command gives the flags of a log's start: give --vllm-log or --incident too\n"
    )
    log = tmp_path / "vllm.log"
    log.write_text(BARE_OOM)
    code, out, err = _doctor(capsys, "--vllm-log", str(log), "--vllm-command", "--max-num-seqs lots")
    assert (code, out) == (2, "")
    assert err == "vllm-sidecar: error: --vllm-command: --max-num-seqs needs a whole number, got 'lots'\n"
