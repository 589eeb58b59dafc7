"""The log parser on real vLLM logs: two captured here from vLLM 0.32 on CPU, lines instantiated from the format
strings of every release line (reference: vllm-metrics.md section 8), and the simulator's own lines."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from sidecar.doctor.log_parser import parse_log
from sidecar.doctor.logfacts import OomPhase, RefusalKind
from sidecar.doctor.phase import SERVING_SIGNS
from sidecar.sim.config import GIB, MIB, SimConfig, VllmVersion
from sidecar.sim.logs import death_lines, preamble_lines, refusal_lines, refusal_message
from sidecar.sim.memory import OutOfMemory
from sidecar.sim.records import GpuProcessState

LOGS = Path(__file__).parent / "logs"
V1 = "(EngineCore_DP0 pid=392) INFO 09-26 08:09:41 [kv_cache_utils.py:1291] "
V1_ERROR = "(EngineCore_DP0 pid=392) ERROR 09-26 08:09:41 [core.py:1338] "
V0 = "INFO 12-16 21:40:10 gpu_executor.py:122] "


def test_real_refused_start_of_vllm_032_on_cpu() -> None:
    facts = parse_log((LOGS / "vllm-0.32-cpu-refused.log").read_text())
    assert facts.version == "0.32.0"
    assert facts.device == "cpu"
    assert facts.args is not None
    assert not facts.args.complete
    assert (facts.args.max_model_len, facts.args.max_num_seqs, facts.args.block_size) == (2048, 8, 32)
    assert facts.args.kv_cache_memory_bytes == 524288
    assert facts.args.gpu_memory_utilization is None, "not among the non-default args"
    refusal = facts.refusal
    assert refusal is not None
    assert refusal.kind is RefusalKind.MAX_LEN_EXCEEDS_KV
    assert (refusal.max_model_len, refusal.estimated_max_len) == (2048, 992)
    assert (refusal.needed_gib, refusal.available_gib) == (0.0, 0.0)
    assert refusal.line.startswith("ValueError: To serve at least one request with the model's max seq len (2048)")


def test_real_start_of_vllm_032_on_cpu() -> None:
    facts = parse_log((LOGS / "vllm-0.32-cpu-started.log").read_text())
    assert facts.refusal is None
    assert facts.oom is None
    assert facts.kv_cache_tokens == 4096, "the 0.30+ line names the device: CPU KV cache size"
    assert facts.concurrency == (2048, 2.0)
    assert facts.max_seq_len == 2048
    assert facts.args is not None
    assert facts.args.max_num_seqs == 64


@pytest.mark.parametrize(
    ("lines", "tokens", "concurrency"),
    [
        # V1 0.8-0.26: two comma-formatted lines.
        ([V1 + "GPU KV cache size: 1,544,414 tokens", V1 + "Maximum concurrency for 40,000 tokens per request: 38.61x"],
         1_544_414, (40_000, 38.61)),
        # 0.28: one line (the reference's real example).
        ([V1 + "GPU KV cache size: 215,112 tokens, Maximum concurrency for 131,072 tokens per request: 1.64x"],
         215_112, (131_072, 1.64)),
        # 0.30+: the device's name, "+ host" with hisparse.
        ([V1 + "GPU + host KV cache size: 90,000 tokens, Maximum concurrency for 4,096 tokens per request: 21.97x"],
         90_000, (4_096, 21.97)),
        # V0 0.6: raw numbers, blocks instead of tokens.
        ([V0 + "# GPU blocks: 27782, # CPU blocks: 2048",
          V0 + "Maximum concurrency for 4096 tokens per request: 108.52x"], None, (4096, 108.52)),
    ],
)  # fmt: skip
def test_kv_capacity_lines_of_every_release_line(
    lines: list[str], tokens: int | None, concurrency: tuple[int, float]
) -> None:
    facts = parse_log("\n".join(lines))
    assert facts.kv_cache_tokens == tokens
    assert facts.concurrency == concurrency


def test_block_counts_v0_and_v1() -> None:
    assert parse_log(V0 + "# cuda blocks: 7281, # CPU blocks: 2048").num_gpu_blocks == 7281
    v1 = "(APIServer pid=9) INFO 08-19 14:58:41 [loggers.py:142] Engine 000: vllm cache_config_info with "
    assert parse_log(v1 + "initialization after num_gpu_blocks is: 57656").num_gpu_blocks == 57656


def test_v0_memory_profiling_lines() -> None:
    text = "\n".join(
        [
            "INFO 03-27 10:29:01 worker.py:267] Memory profiling takes 4.26 seconds",
            "the current vLLM instance can use total_gpu_memory (79.19GiB) x gpu_memory_utilization (0.90) = 71.27GiB",
            "model weights take 14.99GiB; non_torch_memory takes 0.56GiB; PyTorch activation peak memory takes "
            "1.21GiB; the rest of the memory reserved for KV Cache is 54.51GiB.",
        ]
    )
    facts = parse_log(text)
    profile = facts.profile
    assert profile is not None
    assert (profile.total_gib, profile.utilization, profile.budget_gib) == (79.19, 0.9, 71.27)
    assert (profile.weights_gib, profile.non_torch_gib, profile.activation_gib, profile.kv_gib) == (
        14.99, 0.56, 1.21, 54.51,
    )  # fmt: skip
    assert (facts.weights_gib, facts.available_kv_gib) == (14.99, 54.51)


def test_v1_free_memory_line_and_weights_and_graphs() -> None:
    text = "\n".join(
        [
            V1 + "Model loading took 14.9889 GiB and 5.512345 seconds",
            V1 + "Available KV cache memory: 54.06 GiB",
            V1 + "Free memory on device (78.84/79.19 GiB) on startup. Desired GPU memory utilization is (0.9, 71.27 "
            "GiB). Actual usage is 14.99 GiB for weight, 1.21 GiB for peak activation, 0.56 GiB for non-torch memory, "
            "and 0.45 GiB for CUDAGraph memory. Replace gpu_memory_utilization config with `--kv-cache-memory="
            "58046117888` (54.06 GiB) to fit into requested memory, or `--kv-cache-memory=66565869568` (61.99 GiB) to "
            "fully utilize gpu memory. Current kv cache memory in use is 54.06 GiB.",
            V1 + "Graph capturing finished in 12 secs, took 0.45 GiB",
        ]
    )
    facts = parse_log(text)
    assert facts.available_kv_gib == 54.06
    assert facts.graph_capture_gib == 0.45
    assert facts.profile is not None
    assert (facts.profile.free_gib, facts.profile.total_gib, facts.profile.cudagraph_gib) == (78.84, 79.19, 0.45)
    assert facts.weights_gib == 14.99


def test_v0_weights_line_says_gb_but_means_gib() -> None:
    assert parse_log("INFO 10-23 19:55:16 model_runner.py:1067] Loading model weights took 19.8557 GB").weights_gib == (
        19.8557
    )


@pytest.mark.parametrize(
    ("line", "kind", "numbers"),
    [
        ("ValueError: The model's max seq len (131072) is larger than the maximum number of tokens that can be "
         "stored in KV cache (51296). Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when "
         "initializing the engine.", RefusalKind.MAX_LEN_EXCEEDS_KV,
         {"max_model_len": 131072, "capacity_tokens": 51296}),
        # an excerpt cut before the size, mid-word: still the refusal, its capacity unknown
        ("ValueError: The model's max seq len (32768) is larger than the maximum number of tokens that can be s",
         RefusalKind.MAX_LEN_EXCEEDS_KV, {"max_model_len": 32768, "capacity_tokens": None}),
        (V1_ERROR + "ValueError: To serve at least one request with the models's max seq len (131072), (16.00 GiB KV "
         "cache is needed, which is larger than the available KV cache memory (6.26 GiB). Based on the available "
         "memory, the estimated maximum model length is 51296. Try increasing `gpu_memory_utilization` or decreasing "
         "`max_model_len` when initializing the engine.", RefusalKind.MAX_LEN_EXCEEDS_KV,
         {"max_model_len": 131072, "needed_gib": 16.0, "available_gib": 6.26, "estimated_max_len": 51296}),
        (V1_ERROR + "ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization` "
         "when initializing the engine.", RefusalKind.NO_CACHE_MEMORY, {}),
        ("(EngineCore_DP0 pid=6940) ValueError: Free memory on device cuda:0 (18.40/23.53 GiB) on startup is less "
         "than desired GPU memory utilization (0.9, 21.18 GiB). Decrease GPU memory utilization or reduce GPU memory "
         "used by other processes.", RefusalKind.INSUFFICIENT_FREE_MEMORY,
         {"free_gib": 18.4, "total_gib": 23.53, "utilization": 0.9, "requested_gib": 21.18}),
    ],
)  # fmt: skip
def test_refusals_v0_and_v1_wording(line: str, kind: RefusalKind, numbers: dict[str, object]) -> None:
    refusal = parse_log(line).refusal
    assert refusal is not None
    assert refusal.kind is kind
    for name, value in numbers.items():
        assert getattr(refusal, name) == value
    assert refusal.line.startswith("ValueError:")


def _oom(**overrides: object) -> OutOfMemory:
    values: dict[str, object] = {
        "gpu": 0,
        "tried_bytes": 2 * GIB,
        "total_bytes": 80 * GIB,
        "free_bytes": 512 * MIB,
        "process_bytes": 73 * GIB,
        "allocated_bytes": 70 * GIB,
        "reserved_unallocated_bytes": 3 * GIB,
        "other_processes": (GpuProcessState(pid=31337, name="python train.py", used_bytes=6 * GIB),),
    }
    values.update(overrides)
    return OutOfMemory(**values)  # type: ignore[arg-type]


@pytest.mark.parametrize("version", list(VllmVersion))
def test_cuda_oom_while_serving_as_the_simulator_prints_it(version: VllmVersion) -> None:
    lines = death_lines(SimConfig(vllm_version=version), 0, _oom(), 1.7e9)
    oom = parse_log("\n".join(lines)).oom
    assert oom is not None
    assert oom.phase is OomPhase.SERVING
    assert (oom.tried_bytes, oom.total_bytes, oom.free_bytes) == (2 * GIB, 80 * GIB, 512 * MIB)
    assert (oom.process_bytes, oom.reserved_unallocated_bytes) == (73 * GIB, 3 * GIB)
    assert oom.other_processes == ((31337, 6 * GIB),)
    assert parse_log("\n".join(lines)).engine_dead


def _traceback(frames: list[str], message: str) -> str:
    head = [V1_ERROR + "EngineCore failed to start.", V1_ERROR + "Traceback (most recent call last):"]
    body = [V1_ERROR + f'  File "/usr/lib/python3/vllm/v1/worker/gpu_worker.py", line 1, in {name}' for name in frames]
    body = [*head, *body]
    return "\n".join([*body, V1_ERROR + f"torch.OutOfMemoryError: {message}"])


OOM_TEXT = (
    "CUDA out of memory. Tried to allocate 1.95 GiB. GPU 0 has a total capacity of 79.19 GiB of which 1.02 GiB is "
    "free. Including non-PyTorch memory, this process has 78.16 GiB memory in use. Of the allocated memory 75.91 GiB "
    "is allocated by PyTorch, and 1.43 GiB is reserved by PyTorch but unallocated."
)


@pytest.mark.parametrize(
    ("frames", "phase"),
    [
        (["run_engine_core", "_initialize_kv_caches", "determine_available_memory", "profile_run"], OomPhase.PROFILING),
        (["run_engine_core", "_initialize_kv_caches", "compile_or_warm_up_model", "capture_model"],
         OomPhase.GRAPH_CAPTURE),
        (["run_engine_core", "run_busy_loop", "execute_model"], OomPhase.SERVING),
        (["somewhere_else"], OomPhase.UNKNOWN),
    ],
)  # fmt: skip
def test_cuda_oom_phase_from_the_traceback(frames: list[str], phase: OomPhase) -> None:
    oom = parse_log(_traceback(frames, OOM_TEXT)).oom
    assert oom is not None
    assert oom.phase is phase
    assert oom.tried_bytes == int(1.95 * GIB)
    assert oom.other_processes == ()


def test_cuda_oom_phase_from_the_info_lines_without_a_traceback() -> None:
    text = "\n".join(
        [
            "INFO 03-27 10:29:03 model_runner.py:1442] Capturing cudagraphs for decoding. This may lead to unexpected "
            "consequences if the model is not static.",
            "ERROR 03-27 10:29:13 worker_base.py:620] torch.OutOfMemoryError: " + OOM_TEXT,
        ]
    )
    oom = parse_log(text).oom
    assert oom is not None
    assert oom.phase is OomPhase.GRAPH_CAPTURE


def test_cuda_oom_message_of_older_pytorch() -> None:
    line = (
        "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 15.78 GiB total "
        "capacity; 14.56 GiB already allocated; 3.12 MiB free; 14.66 GiB reserved in total by PyTorch)"
    )
    oom = parse_log(line).oom
    assert oom is not None
    assert (oom.tried_bytes, oom.gpu, oom.total_bytes) == (20 * MIB, 0, int(15.78 * GIB))
    assert oom.reserved_unallocated_bytes == int(14.66 * GIB) - int(14.56 * GIB)


@pytest.mark.parametrize("version", list(VllmVersion))
def test_the_simulators_start_and_refusal_lines(version: VllmVersion) -> None:
    config = SimConfig(vllm_version=version, gpu_memory_utilization=0.3, max_model_len=131072, max_num_seqs=48)
    message = refusal_message(config, config.derived_num_gpu_blocks)
    assert message is not None
    lines = [*preamble_lines(config, 1.7e9), *refusal_lines(config, message, config.derived_num_gpu_blocks, 1.7e9)]
    facts = parse_log("\n".join(lines))
    assert facts.version == {"0.6": "0.6.6", "0.10": "0.10.2", "0.32": "0.32.0"}[str(version)]
    assert facts.args is not None
    assert facts.args.complete is (version == VllmVersion.V0_6), "V0 logs a whole Namespace, V1 non-default args"
    assert (facts.args.max_num_seqs, facts.args.gpu_memory_utilization, facts.args.max_model_len) == (48, 0.3, 131072)
    assert facts.weights_gib == 16.0
    assert facts.refusal is not None
    assert facts.refusal.kind is RefusalKind.MAX_LEN_EXCEEDS_KV
    assert (facts.refusal.estimated_max_len or facts.refusal.capacity_tokens) == 51296


def test_only_the_last_start_counts() -> None:
    refused = (LOGS / "vllm-0.32-cpu-refused.log").read_text()
    started = (LOGS / "vllm-0.32-cpu-started.log").read_text()
    assert parse_log(refused + "\n" + started).refusal is None
    assert parse_log(started + "\n" + refused).refusal is not None


def test_a_start_cut_short_by_the_end_of_the_log_defers_to_the_failed_one_before_it() -> None:
    """A supervisor restarting vLLM in a loop: the log ends as the next attempt begins, before it fails or
    serves. That attempt says nothing yet; the one before it failed, and is read (saying so)."""
    refused = (LOGS / "vllm-0.32-cpu-refused.log").read_text()
    started = (LOGS / "vllm-0.32-cpu-started.log").read_text().splitlines()
    args_at = next(index for index, line in enumerate(started) if "non-default args" in line)
    beginning = "\n".join(started[: args_at + 3])
    assert not re.search(SERVING_SIGNS, beginning)
    facts = parse_log(refused + "\n" + beginning)
    assert facts.refusal is not None
    assert facts.later_start_unfinished
    served = parse_log(refused + "\n" + "\n".join(started))  # the later start served: it is the one that counts
    assert (served.refusal, served.later_start_unfinished) == (None, False)
    twice = parse_log(refused + "\n" + refused)  # the later start failed too: its own failure is read
    assert twice.refusal is not None
    assert not twice.later_start_unfinished


def test_namespace_arguments_of_old_releases() -> None:
    line = (
        "INFO 06-15 12:17:55 api_server.py:585] args: Namespace(host=None, port=8000, model='m', max_model_len=None, "
        "max_num_seqs=256, gpu_memory_utilization=0.95, block_size=16, enable_prefix_caching=False, "
        "speculative_max_model_len=None, quantization='fp8', kv_cache_dtype='auto')"
    )
    facts = parse_log(line)
    assert facts.args is not None
    assert facts.args.complete
    assert facts.args.max_model_len is None, "speculative_max_model_len must not be read as max_model_len"
    assert (facts.args.max_num_seqs, facts.args.gpu_memory_utilization, facts.args.block_size) == (256, 0.95, 16)
    assert (facts.args.enable_prefix_caching, facts.args.quantization) == (False, "fp8")


@pytest.mark.parametrize("text", ["", "\x00\x01garbage\n" * 50, "ValueError: something else entirely", "{" * 10000])
def test_garbage_is_nothing_recognised(text: str) -> None:
    facts = parse_log(text)
    assert facts.lines_recognised == 0
    assert facts.refusal is None
    assert facts.oom is None
    assert facts.args is None


def test_a_hardware_plugins_available_memory_in_bytes_is_the_kv_cache_and_the_card() -> None:
    # vllm-ascend's worker_v1.py: `logger.info(f"Available memory: {available_kv_cache_memory}, total memory:
    # {total_npu_memory}")`, both in bytes, the first clamped at 0.
    worker = "(Worker_TP0 pid=552) INFO 10-28 21:14:49 [worker_v1.py:259] "
    zero = parse_log(worker + "Available memory: 0, total memory: 65452113920\n" + V1_ERROR + "EngineCore failed")
    assert zero.available_kv_gib == 0.0
    assert zero.profile is not None
    assert zero.profile.total_gib == pytest.approx(60.96, abs=0.01)
    some = parse_log(worker + "Available memory: 2147483648, total memory: 65452113920")
    assert some.available_kv_gib == 2.0


# A command line pasted above vLLM's first line (issue threads often start so): V0 0.2's engine line states no
# budget, so the command is the only place the user's --gpu-memory-utilization is written.
COMMAND_THEN_V0_START = """\
$ python -m vllm.entrypoints.openai.api_server --model lmsys/vicuna-7b-v1.3 --gpu-memory-utilization 0.98 --dtype half \
--enforce-eager --max-num-seqs 64
INFO 10-14 21:32:44 llm_engine.py:72] Initializing an LLM engine with config: model='lmsys/vicuna-7b-v1.3', \
tokenizer='lmsys/vicuna-7b-v1.3', dtype=torch.float16, max_seq_len=2048, tensor_parallel_size=1, seed=0)
INFO 10-14 21:40:24 llm_engine.py:205] # GPU blocks: 0, # CPU blocks: 512
"""


def test_a_command_line_pasted_before_the_start_gives_its_flags_to_that_start() -> None:
    facts = parse_log(COMMAND_THEN_V0_START)
    assert facts.args is not None
    assert facts.args.gpu_memory_utilization == 0.98
    assert facts.args.enforce_eager is True
    assert facts.args.max_num_seqs == 64
    assert facts.args.dtype == "half"
    assert facts.model == "lmsys/vicuna-7b-v1.3"


def test_vllms_own_arguments_line_wins_over_a_pasted_command() -> None:
    own = "INFO 10-14 21:32:45 api_server.py:1] non-default args: {'model': 'm', 'gpu_memory_utilization': 0.7}\n"
    lines = COMMAND_THEN_V0_START.splitlines(keepends=True)
    facts = parse_log(lines[0] + own + "".join(lines[1:]))
    assert facts.args is not None
    assert facts.args.gpu_memory_utilization == 0.7


def test_a_command_of_an_earlier_start_is_not_the_last_starts() -> None:
    earlier = COMMAND_THEN_V0_START + "INFO 10-14 21:41:00 api_server.py:1] shutting down\n"
    later = COMMAND_THEN_V0_START.split("\n", 1)[1]  # the second start without a command of its own
    facts = parse_log(earlier + "\n" * 5 + later)
    assert facts.args is None


def test_only_v0s_worker_words_its_budget_as_the_current_instance_can_use() -> None:
    line = (
        "INFO 01-15 11:06:48 worker.py:240] the current vLLM instance can use total_gpu_memory (8.00GiB) x "
        "gpu_memory_utilization (0.90) = 7.20GiB\n"
    )
    assert parse_log(line).engine == "v0"
    v1 = (
        "(EngineCore_DP0 pid=1) INFO 01-15 11:06:40 [core.py:1] Initializing a V1 LLM engine (v0.10.0) with config: x\n"
    )
    assert parse_log(v1 + line).engine == "v1"
