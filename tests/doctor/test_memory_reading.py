"""The memory ledger and the reading of a crash it drives (issue 25): any OOM, whatever printed it; the phase from
the frames; the direction of every recommendation from which amount overflowed. Lines are built from the format
strings of vLLM and PyTorch (the release and file beside each); the corpus holds the real logs."""

from __future__ import annotations

import math

import pytest

from sidecar.doctor.diagnose import diagnose
from sidecar.doctor.finding import Cause, Finding
from sidecar.doctor.ledger_entries import build_ledger
from sidecar.doctor.log_parser import parse_log
from sidecar.doctor.logfacts import OomPhase
from sidecar.doctor.model_size import estimate
from sidecar.doctor.setup import resolve
from tests.doctor.builders import GIB, evidence, live

DOWN = live(error="connection refused", version=None, max_model_len=None)
V1 = "(EngineCore_DP0 pid=43) ERROR 03-20 17:39:14 [core.py:1100] "
WORKER = "(VllmWorker rank=1 pid=2445) ERROR 05-10 16:00:15 [multiproc_executor.py:470] "


def _finding(text: str) -> Finding:
    return diagnose(evidence(live_evidence=DOWN, log_facts=parse_log(text))).findings[0]


def _flags(finding: Finding) -> dict[str, object]:
    return {r.flag: r.value for r in finding.recommendations}


def _traceback(prefix: str, frames: list[str], error: str) -> str:
    lines = ["Traceback (most recent call last):"]
    for name in frames:
        lines += [f'  File "/usr/lib/python3/dist-packages/vllm/v1/worker/gpu_worker.py", line 1, in {name}', "    x()"]
    return "\n".join(prefix + line for line in [*lines, error]) + "\n"


# torch/csrc/cuda (2.1+): "CUDA out of memory. Tried to allocate %s. GPU %d has a total capacity of %s of which %s
# is free. ..."; ROCm builds print HIP where CUDA builds print CUDA.
def _oom(device: str = "CUDA", *, tried: str = "2.00 GiB", total: str = "23.65 GiB", free: str = "1.06 GiB",
         process: str = "22.59 GiB", allocated: str = "21.90 GiB", stranded: str = "20.00 MiB",
         others: str = "") -> str:  # fmt: skip
    """PyTorch's message; the defaults add up as PyTorch's do (this process + others + free = the card)."""
    return (
        f"torch.OutOfMemoryError: {device} out of memory. Tried to allocate {tried}. GPU 0 has a total capacity of "
        f"{total} of which {free} is free. {others}Including non-PyTorch memory, this process has {process} memory "
        f"in use. Of the allocated memory {allocated} is allocated by PyTorch, and {stranded} is reserved by PyTorch "
        "but unallocated."
    )


@pytest.mark.parametrize(
    ("frames", "phase"),
    [
        (["run_engine_core", "__init__", "load_model", "load_weights"], OomPhase.WEIGHT_LOADING),
        (["_initialize_kv_caches", "determine_available_memory", "profile_run", "_dummy_run"], OomPhase.PROFILING),
        (["initialize_from_config", "initialize_kv_cache", "_allocate_kv_cache_tensors"], OomPhase.KV_ALLOCATION),
        (["compile_or_warm_up_model", "capture_model", "_capture_cudagraphs", "_dummy_run"], OomPhase.GRAPH_CAPTURE),
        # vLLM 0.20+: the graphs' memory profiled inside the memory profile, a minimal KV cache first
        (
            [
                "determine_available_memory",
                "profile_cudagraph_memory",
                "_init_minimal_kv_cache_for_profiling",
                "initialize_kv_cache",
                "_allocate_kv_cache_tensors",
            ],
            OomPhase.GRAPH_PROFILING,
        ),
        (
            ["determine_available_memory", "profile_cudagraph_memory", "_warmup_and_capture", "_dummy_run"],
            OomPhase.GRAPH_PROFILING,
        ),
        (["compile_or_warm_up_model", "_dummy_sampler_run"], OomPhase.WARMUP),
        (["run_busy_loop", "step", "execute_model"], OomPhase.SERVING),
        (["wake_up", "create_and_map"], OomPhase.WAKE_UP),
        (["run_engine_core", "somewhere"], OomPhase.UNKNOWN),
    ],
)
def test_the_phase_is_read_from_the_frames(frames: list[str], phase: OomPhase) -> None:
    oom = parse_log(_traceback(V1, frames, _oom())).oom
    assert oom is not None
    assert oom.phase is phase, oom.phase_evidence


def test_a_traceback_joined_into_one_line_is_placed_by_the_call_in_its_code() -> None:
    """A page that flattened the traceback: one frame, its code calling the graph-memory profile, then the error."""
    line = (
        'File "/usr/lib/python3/dist-packages/vllm/v1/worker/gpu_worker.py", line 381, in determine_available_memory '
        "estimate = self.model_runner.profile_cudagraph_memory() ... " + _oom()
    )
    oom = parse_log(line).oom
    assert oom is not None
    assert oom.phase is OomPhase.GRAPH_PROFILING, oom.phase_evidence
    assert oom.phase_evidence == "the call profile_cudagraph_memory() in a frame's code"


def test_an_oom_profiling_graphs_memory_is_not_the_budgets() -> None:
    """vLLM 0.20's minimal KV cache for the graph-memory profile (gpu_model_runner.profile_cudagraph_memory) runs
    before the budget sizes the KV cache: a lower budget frees nothing for it, fewer graphs or none do."""
    budget = "INFO 04-29 13:20:00 [utils.py:1] non-default args: {'model': 'm', 'gpu_memory_utilization': 0.85}\n"
    loaded = "INFO 04-29 13:20:10 [gpu_model_runner.py:4820] Model loading took 17.55 GiB memory and 53.5 seconds\n"
    frames = ["determine_available_memory", "profile_cudagraph_memory", "_init_minimal_kv_cache_for_profiling",
              "initialize_kv_cache", "_allocate_kv_cache_tensors"]  # fmt: skip
    error = _oom(tried="1.53 GiB", total="23.52 GiB", free="75.75 MiB", process="23.43 GiB", allocated="22.35 GiB")
    finding = _finding(budget + loaded + _traceback(V1, frames, error))
    assert finding.cause is Cause.CONFIGURATION_OVERSHOOT
    assert "profiling CUDA graphs' memory" in finding.summary
    assert "--gpu-memory-utilization" not in _flags(finding)
    assert not any("--gpu-memory-utilization" in step for step in finding.steps)
    assert _flags(finding)["--enforce-eager"] == ""
    assert any("does not cap this step" in line for line in finding.evidence)
    # Without a traceback, vLLM's own line about it places the error there too.
    profiling = (
        "INFO 04-29 13:20:30 [gpu_model_runner.py:5970] Profiling CUDA graph memory: PIECEWISE=51 (largest=512)\n"
    )
    bare = f"ERROR 04-29 13:20:40 [core.py:1136] {error}\n"
    assert parse_log(budget + loaded + profiling + bare).oom.phase is OomPhase.GRAPH_PROFILING  # type: ignore[union-attr]


def test_without_a_traceback_the_last_progress_line_places_it() -> None:
    loaded = "INFO 08-20 03:10:00 [model_runner.py:1112] Model loading took 16.5557 GiB and 2.803817 seconds\n"
    blocks = "INFO 08-20 03:10:05 [executor_base.py:112] # cuda blocks: 1000, # CPU blocks: 2048\n"
    error = f"ERROR 08-20 03:10:09 [engine.py:467] {_oom()}\n"
    assert parse_log(loaded + error).oom.phase is OomPhase.PROFILING  # type: ignore[union-attr]
    # V0 logs the block counts, then allocates the blocks (its capture, if any, logs a line of its own).
    assert parse_log(loaded + blocks + error).oom.phase is OomPhase.KV_ALLOCATION  # type: ignore[union-attr]


def test_the_last_progress_line_counts_even_among_blank_and_indented_lines_before_the_error() -> None:
    """Graph capture, then uvicorn's indented "INFO:     Application startup complete.", then C++'s OOM with its
    frames dump: the walk back to the error's start steps over those lines, and they still say it was serving."""
    text = "".join(
        [
            "(Worker_TP0 pid=7) Loading safetensors checkpoint shards: 100% Completed | 8/8\n",
            "(Worker_TP0 pid=7) \n",
            "\rCapturing CUDA graphs (decode, FULL): 100%|##########| 1/1 [00:00<00:00,  2.84it/s]\n",
            "(Worker_TP0 pid=7) \n",
            "(APIServer pid=1) INFO:     Started server process [1]\n",
            "(APIServer pid=1) INFO:     Application startup complete.\n",
            f"[rank0]:[E716 19:47:26.324569367 shim_common.cpp:523] Exception in aoti_torch: {_oom()[24:]}\n",
            "Exception raised from malloc at /pytorch/c10/cuda/CUDACachingAllocator.cpp:1574 (most recent first)\n",
            "\n",
        ]
    )
    oom = parse_log(text).oom
    assert oom is not None
    assert oom.phase is OomPhase.SERVING


def test_another_processes_frames_do_not_place_it() -> None:
    other = "(VllmWorker rank=0 pid=2444) ERROR 05-10 16:00:15 [multiproc_executor.py:470] "
    text = "".join(
        [
            other + "Traceback (most recent call last):\n",
            other + '  File "/x/vllm/v1/worker/gpu_model_runner.py", line 1, in capture_model\n',
            _traceback(WORKER, ["run_busy_loop", "execute_model"], _oom()),
        ]
    )
    oom = parse_log(text).oom
    assert oom is not None
    assert (oom.phase, oom.rank) == (OomPhase.SERVING, 1)


def test_a_hip_oom_on_rocm_is_read_like_cudas() -> None:
    oom = parse_log(_traceback(V1, ["run_busy_loop", "execute_model"], _oom("HIP"))).oom
    assert oom is not None
    assert (oom.device, oom.tried_bytes, oom.total_bytes) == ("HIP", 2 * GIB, int(23.65 * GIB))


def test_a_bare_cuda_error_in_graph_capture_has_no_numbers_and_is_still_read() -> None:
    # torch/cuda/graphs.py capture_end -> "RuntimeError: CUDA error: out of memory" (no sizes from the driver).
    text = _traceback(V1, ["compile_or_warm_up_model", "capture_model", "__exit__", "capture_end"],
                      "RuntimeError: CUDA error: out of memory")  # fmt: skip
    finding = _finding(text)
    assert finding.cause is Cause.CONFIGURATION_OVERSHOOT
    assert "capturing CUDA graphs" in finding.summary
    assert _flags(finding) == {"--enforce-eager": ""}, "no budget is sized from a message without sizes"


def test_the_caching_allocators_nvml_assert_on_mig_is_an_oom_with_no_numbers() -> None:
    # PyTorch's OOM path asks NVML for the card's memory; on a MIG slice in a container NVML may not answer, and
    # its assert replaces the OOM message (pytorch/pytorch#112377). After graph capture: the graphs' transient.
    progress = (
        "(EngineCore_0 pid=72) INFO 08-25 09:42:24 [gpu_model_runner.py:2708] Graph capturing finished in 4 secs\n"
    )
    error = (
        'RuntimeError: NVML_SUCCESS == r INTERNAL ASSERT FAILED at "/pytorch/c10/cuda/CUDACachingAllocator.cpp":1016, '
        "please report a bug to PyTorch."
    )
    oom = parse_log(progress + V1 + error + "\n").oom
    assert oom is not None
    assert (oom.tried_bytes, oom.total_bytes) == (None, None)
    finding = _finding(progress + V1 + error + "\n")
    assert finding.cause is Cause.CONFIGURATION_OVERSHOOT
    assert _flags(finding) == {"--enforce-eager": ""}


def test_a_kernel_warm_up_oom_is_not_told_to_drop_graphs_that_do_not_exist_yet() -> None:
    # vLLM 0.32's compile_or_warm_up_model runs kernel_warmup (DeepGEMM, FlashInfer) before capture_model.
    warmup = _traceback(V1, ["compile_or_warm_up_model", "kernel_warmup", "deep_gemm_warmup", "_warmup"], _oom())
    warmup = warmup.replace("gpu_worker.py", "deep_gemm_warmup.py")
    assert "--enforce-eager" not in _flags(_finding(warmup))
    sampler = _traceback(V1, ["compile_or_warm_up_model", "_dummy_sampler_run"], _oom())
    assert "--enforce-eager" in _flags(_finding(sampler))  # the sampler's warm-up comes after the graphs


def test_a_launchers_prefix_does_not_hide_the_oom() -> None:
    prefix = "2025-05-01 12:00:00 | ERROR | stderr | "
    args = prefix + "INFO 05-01 12:00:00 [utils.py:1] non-default args: {'model': 'm'}\n"
    finding = _finding(args + _traceback(prefix, ["run_busy_loop", "execute_model"], _oom()))
    assert finding.cause is Cause.CONFIGURATION_OVERSHOOT
    # 0.9 (vLLM's default: not among the non-default args) - (2.00 - 1.06) GiB / 23.65 GiB - 0.01 = 0.8502 -> 0.85
    assert _flags(finding) == {"--gpu-memory-utilization": 0.85}


def test_a_lower_budget_from_a_budget_the_log_does_not_state_is_a_step_not_a_value() -> None:
    """Whoever lowered the budget to 0.8 after a first OOM and pasted only the traceback must not be told 0.85."""
    finding = _finding(_traceback(V1, ["run_busy_loop", "execute_model"], _oom()))
    assert finding.recommendations == ()
    # (2.00 - 1.06) GiB / 23.65 GiB + 0.01 = 0.0497
    assert finding.steps[0].startswith("lower --gpu-memory-utilization by 0.050 below what you set")
    assert "from vLLM's default 0.9 that is 0.85" in finding.steps[0]


def test_a_request_a_hair_over_what_is_free_says_the_card_was_full_not_no_shortage() -> None:
    finding = _finding(_traceback(V1, ["run_busy_loop", "execute_model"], _oom(tried="448.00 MiB", free="447.94 MiB")))
    assert "the 23.65 GiB card was full: the transient asked for 0.44 GiB with 0.44 GiB free" in finding.steps[0]
    assert "lacked 0.00 GiB" not in finding.steps[0]


def test_weights_that_do_not_fit_never_lower_the_budget() -> None:
    text = _traceback(V1, ["load_model", "load_weights", "weight_loader"], _oom(tried="112.00 MiB", free="40.00 MiB"))
    finding = _finding(text)
    assert finding.cause is Cause.DOES_NOT_FIT
    assert "--gpu-memory-utilization" not in _flags(finding)
    assert _flags(finding)["--tensor-parallel-size"] == 2  # 22.59 + 0.11 GiB / 2 = 11.4 <= 0.75 x 23.65


def test_vllms_own_words_for_an_oom_creating_weights_place_it_in_loading_with_no_sizes_invented() -> None:
    """vLLM's linear layers re-raise an OOM in create_weights as two sentences of their own, no PyTorch numbers."""
    finding = _finding(
        "RuntimeError: Failed to create unquantized linear weights.\n"
        "This may be caused by insufficient memory to allocate the weight."
    )
    assert finding.cause is Cause.DOES_NOT_FIT
    assert finding.recommendations == ()  # nothing sizes them: a step says what would
    assert not any("0.00 GiB" in line for line in finding.evidence)
    assert any("--tensor-parallel-size" in step and "--cpu-offload-gb" in step for step in finding.steps)


def test_v0s_worker_names_the_method_it_ran_on_the_error_line() -> None:
    """ "Exception in worker VllmWorkerProcess while processing method load_model: CUDA out of memory...": the
    method places it as a frame would."""
    line = (
        f"{WORKER}Exception in worker VllmWorkerProcess while processing method load_model: " + _oom().split(": ", 1)[1]
    )
    assert parse_log(line).oom.phase is OomPhase.WEIGHT_LOADING  # type: ignore[union-attr]


def test_a_full_card_with_no_step_on_a_model_split_over_gpus_bets_on_neither_reading() -> None:
    """PyTorch holding nearly the whole card, no phase: on one GPU most often weights that do not fit (more GPUs
    are recommended); on a model the log shows split over four GPUs (two workers' prefixes on one line), a budget
    set that high is as likely: both readings are steps, and no flag is given a value."""
    full = _oom(tried="256.00 MiB", total="44.39 GiB", free="151.31 MiB", process="44.24 GiB", allocated="43.37 GiB")
    alone = _finding(full)
    assert alone.cause is Cause.DOES_NOT_FIT
    assert "--tensor-parallel-size" in _flags(alone)
    split = _finding(
        "(Worker_TP1 pid=510) (Worker_TP3 pid=512) ERROR 06-10 13:01:40 [multiproc_executor.py:932] " + full
    )
    assert split.cause is Cause.CONFIGURATION_OVERSHOOT
    assert split.recommendations == ()
    assert "split over 4 GPUs" in split.evidence[-1]
    assert any("--gpu-memory-utilization" in step for step in split.steps)
    assert any("--tensor-parallel-size" in step for step in split.steps)


def test_a_full_card_a_worker_returned_to_an_rpc_is_not_read_as_weights() -> None:
    """vLLM V1's workers load their weights as they start; "Worker failed with error" wraps what a worker returned
    to an RPC after that (the profile run, the KV cache, warm-up, a step): the full card is then no weight load."""
    full = _oom(tried="256.00 MiB", total="44.39 GiB", free="151.31 MiB", process="44.24 GiB", allocated="43.37 GiB")
    wrapped = parse_log(f"RuntimeError: Worker failed with error '{full}', please check the stack trace above").oom
    assert wrapped is not None
    assert (wrapped.phase, wrapped.after_load) == (OomPhase.UNKNOWN, True)
    assert parse_log(full).oom.after_load is False  # type: ignore[union-attr]
    finding = _finding(f"RuntimeError: Worker failed with error '{full}', please check the stack trace above")
    assert finding.cause is Cause.CONFIGURATION_OVERSHOOT
    assert "--tensor-parallel-size" not in _flags(finding)
    assert (
        "a worker returned it to an RPC ('Worker failed with error'): after the weights loaded" in finding.evidence[1]
    )
    # The worker's own line above a traceback whose frames are torch's only says the same; a constructor's does not
    worker = "(Worker_TP0 pid=7) ERROR 11-30 10:00:00 [multiproc_executor.py:1189] "
    torch_frames = [
        "Traceback (most recent call last):",
        '  File "/usr/lib/python3/dist-packages/torch/nn/modules/module.py", line 1, in _call_impl',
        "    return forward_call(*args, **kwargs)",
        full,
    ]
    for header, after_load in (("WorkerProc hit an exception.", True), ("WorkerProc failed to start.", False)):
        oom = parse_log("\n".join(worker + line for line in [header, *torch_frames]) + "\n").oom
        assert oom is not None
        assert (oom.phase, oom.after_load) == (OomPhase.UNKNOWN, after_load), header


@pytest.mark.parametrize(
    ("text", "free", "device"),
    [
        # torch_npu's older message, cut by the poster after "already allocated)" or after "free)".
        ("torch.OutOfMemoryError: NPU out of memory. Tried to allocate 74.00 MiB\n"
         "(NPU 2; 29.50 GiB total capacity; 28.21 GiB already allocated)", None, "NPU"),
        ("torch.OutOfMemoryError: NPU out of memory.\n  Tried to allocate 5.25 GiB (NPU 1; 60.96 GiB total capacity;\n"
         "  59.24 GiB already allocated; 790.43 MiB free)", int(790.43 * 2**20), "NPU"),
    ],
)  # fmt: skip
def test_the_older_message_cut_short_still_gives_its_numbers(text: str, free: int | None, device: str) -> None:
    oom = parse_log(text).oom
    assert oom is not None
    assert (oom.device, oom.free_bytes, oom.process_bytes) == (device, free, None)
    assert oom.allocated_bytes is not None
    assert oom.total_bytes is not None


@pytest.mark.parametrize(
    "line",
    [
        "RuntimeError: [Rank:0] FATAL ERROR :: MODULE:PT_DEVMEM Allocation failed for size::939524096 (896)MB",
        "RuntimeError: [Rank:0] FATAL ERROR :: MODULE:PT_DEVMEM OOM: No enough memory for defragment.",
    ],
)
def test_gaudis_device_memory_failures_are_ooms_on_an_hpu(line: str) -> None:
    oom = parse_log(line).oom
    assert oom is not None
    assert oom.device == "HPU"


def test_a_v0_refusal_retyped_by_hand_is_still_read() -> None:
    """A user who retyped vLLM's refusal ("sew len", typographic quotes): the rest of the sentence is vLLM's."""
    refusal = parse_log(
        "The model\u2019s max sew len (32768) is larger than the maximum number of tokens that can be stored in KV "
        "cache (18896). Try increasing \u2018gpu_memory_utilization\u2019 or decreasing \u2018max_model_len\u2019"
    ).refusal
    assert refusal is not None
    assert (refusal.max_model_len, refusal.capacity_tokens) == (32768, 18896)


@pytest.mark.parametrize(
    ("line", "asked", "blocks"),
    [
        ("ValueError: max_num_seqs (1024) exceeds available Mamba cache blocks (854)", 1024, 854),
        ("ValueError: max_num_seqs (256) exceeds available Mamba cache blocks (196).\nEach decode sequence requires "
         "one Mamba cache block...", 256, 196),
    ],
)  # fmt: skip
def test_a_hybrid_models_state_blocks_cap_the_sequences(line: str, asked: int, blocks: int) -> None:
    """A hybrid model (Mamba, linear attention) keeps one state block per running sequence: vLLM refuses a
    max_num_seqs above the blocks its budget gave, and the sequences are what to cut."""
    finding = _finding(line)
    assert finding.cause is Cause.CONCURRENCY_MISJUDGEMENT
    assert _flags(finding) == {"--max-num-seqs": blocks}
    assert f"max_num_seqs {asked}" in finding.summary


def test_the_one_listed_process_holding_all_the_used_memory_is_this_one() -> None:
    """In a container PyTorch lists vLLM itself as "Process 1"; under sleep mode its allocated figure (24.29 GiB) is
    more than the card, so no figure matches the listed one: a process that holds all the memory in use, while this
    one had allocated gigabytes, is this one, not another tenant."""
    line = (
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.72 GiB. GPU 0 has a total capacity of "
        "22.06 GiB of which 947.44 MiB is free. Process 1 has 21.12 GiB memory in use. Of the allocated memory "
        "24.29 GiB is allocated by PyTorch, with 3.80 GiB allocated in private pools (e.g., CUDA Graphs)"
    )
    oom = parse_log(line).oom
    assert oom is not None
    assert (oom.process_bytes, oom.other_processes) == (int(21.12 * 2**30), ())


def test_v0s_block_count_comes_before_it_allocates_them() -> None:
    """V0 logs "# GPU blocks: N" and then allocates those blocks: an OOM right after is the KV cache's."""
    text = "INFO 10-26 12:39:51 llm_engine.py:207] # GPU blocks: 793, # CPU blocks: 512\n" + _oom(tried="100.00 MiB")
    assert parse_log(text).oom.phase is OomPhase.KV_ALLOCATION  # type: ignore[union-attr]


def test_a_free_memory_refusal_quoted_up_to_less_than_desired_still_says_what_is_left() -> None:
    finding = _finding("`ValueError: Free memory on device cuda:1 (1.73/23.55 GiB) on startup is less than desired`")
    assert finding.cause is Cause.CONFIGURATION_OVERSHOOT
    assert "--gpu-memory-utilization" not in _flags(finding)  # 0.02 of the card is left: free the GPU first
    assert any("free the GPU first" in line for line in finding.evidence)


@pytest.mark.parametrize("on_startup", [" on startup", ""])
def test_the_free_memory_refusal_is_read_with_or_without_on_startup(on_startup: str) -> None:
    """Later releases dropped "on startup" from the start check's sentence; a wrap may fall anywhere in it."""
    refusal = parse_log(
        f"ValueError: Free memory on device cuda:0 (6.87/8.0 GiB){on_startup} is less than\n"
        "desired GPU memory utilization (0.9, 7.2 GiB).\n"
    ).refusal
    assert refusal is not None
    assert (refusal.free_gib, refusal.total_gib, refusal.utilization) == (6.87, 8.0, 0.9)


def test_weights_another_process_holds_for_vllm_count_inside_its_budget() -> None:
    """0.32+ (v1/worker/utils.py, the IPC weight cache): the start check compares free memory with the budget less
    the externally held weights. Those weights are vLLM's, so the budget that fits holds them and what is free."""
    refusal = (
        "ValueError: Free memory on device cuda:0 (30.00/79.19 GiB) on startup is less than the engine's budget after "
        "excluding external process's weights (0.9, 41.27 GiB). Decrease GPU memory utilization or reduce GPU memory "
        "used by other processes.\n"
    )
    finding = _finding(refusal)
    assert finding.cause is Cause.CONFIGURATION_OVERSHOOT
    held = 0.9 * 79.19 - 41.27  # 30.0 GiB of weights held outside the engine
    value = _flags(finding)["--gpu-memory-utilization"]
    assert isinstance(value, float)
    assert 0.65 <= value <= 0.71  # (30.00 free + 30.00 held) / 79.19 = 0.758, less the 5 % reserve
    assert value * 79.19 - held <= 30.00  # the engine's share then fits in what is free
    over = _finding(
        "ValueError: Externally held weights on device cuda:0 (70.00/79.19 GiB) exceed the desired GPU memory "
        "utilization (0.8, 63.35 GiB). Increase GPU memory utilization or reduce GPU memory used by other processes.\n"
    )
    assert over.cause is Cause.CONFIGURATION_OVERSHOOT
    assert not over.recommendations  # the engine's own need is not in the line: a step, not a guess
    assert "above 0.88" in over.steps[0]


def test_an_exception_message_wrapped_under_itself_is_read_whole() -> None:
    """An author's abridged block: the message's second half indented under its first, and vLLM's refusal
    broken across unprefixed lines inside a prefixed log."""
    refusal = parse_log(
        "  ValueError: Free memory on device cuda:5 (54.9/63.98 GiB) on startup is less than\n"
        "              desired GPU memory utilization (0.97, 62.06 GiB)."
    ).refusal
    assert refusal is not None
    assert (refusal.free_gib, refusal.utilization) == (54.9, 0.97)
    kv = parse_log(
        "(EngineCore pid=81) ERROR 04-19 10:59:54 [core.py:1108] EngineCore failed to start.\n"
        "(EngineCore pid=81) ValueError: To serve at least one request with the models's max seq len\n"
        "  (16384), (3.0 GiB KV cache is needed, which is larger than the available KV cache memory\n"
        "  (0.18 GiB). Based on the available memory, the estimated maximum model length is 976.\n"
    ).refusal
    assert kv is not None
    assert (kv.max_model_len, kv.estimated_max_len) == (16384, 976)


def test_a_kv_refusal_with_its_middle_elided_keeps_vllms_estimate() -> None:
    refusal = parse_log(
        "Available KV cache memory: 0.45 GiB\n"
        "ValueError: To serve at least one request with the model's max seq len (8192),\n"
        "2.0 GiB KV cache is needed ... estimated maximum model length is 1856."
    ).refusal
    assert refusal is not None
    assert (refusal.max_model_len, refusal.needed_gib, refusal.available_gib, refusal.estimated_max_len) == (
        8192,
        2.0,
        None,
        1856,
    )


def test_the_cuda_drivers_own_out_of_memory_is_an_oom() -> None:
    """The driver API's error, as a Marlin repack raises it: "RuntimeError: CUDA driver error: out of memory"."""
    assert parse_log("RuntimeError: CUDA driver error: out of memory").oom is not None


def test_pytorchs_message_from_its_third_sentence_on_is_still_an_oom() -> None:
    """A panel that shows a log's tail can start inside PyTorch's message (a Hugging Face Space's error)."""
    tail = (
        "Exit code: 1. Reason: ess has 0 bytes memory in use. Of the allocated memory 21.48 GiB is allocated by "
        "PyTorch, and 10.95 MiB is reserved by PyTorch but unallocated."
    )
    assert parse_log(tail).oom is not None


def test_another_process_holding_most_of_the_card_caps_the_budget_at_what_it_leaves() -> None:
    # 80 GiB card, another process holds 25 GiB: (80 - 25 - 4) / 80 = 0.6375 -> 0.63, whatever the budget was.
    text = _traceback(
        V1,
        ["run_busy_loop", "execute_model"],
        _oom(total="80.00 GiB", free="0.50 GiB", process="54.50 GiB", allocated="53.00 GiB",
             others="Process 4242 has 25.00 GiB memory in use. "),
    )  # fmt: skip
    finding = _finding(text)
    assert finding.cause is Cause.CONFIGURATION_OVERSHOOT
    assert _flags(finding) == {"--gpu-memory-utilization": 0.63}
    assert "another process" in finding.summary


def test_a_process_holding_far_more_than_the_default_budget_is_not_stepped_down_from_the_default() -> None:
    """Stepping down from 0.9 would be 0.09 below a budget set near 0.99, where the transient lacked 0.19 GiB."""
    serving = ["run_busy_loop", "execute_model"]
    # A worker's error that quotes PyTorch's message up to the processes, as vLLM 0.20's offload worker does
    over = _oom(tried="0.31 GiB", total="94.97 GiB", free="0.13 GiB", process="94.12 GiB").split(" Of the")[0]
    step = _finding(_traceback(V1, serving, over)).steps[0]
    # 94.12 GiB > 0.9 x 94.97 GiB + max(0.05 x 94.97, 3) GiB = 90.22 GiB; 94.12 / 94.97 = 0.991
    assert "more than vLLM's default 0.9 gives it: it was set higher, at most about 0.99" in step, step
    assert "that is 0.88" not in step
    # 86.00 GiB is within what a process holds beyond a 0.9 budget: the default stays the example
    near = _oom(tried="9.00 GiB", total="94.97 GiB", free="8.97 GiB", process="86.00 GiB").split(" Of the")[0]
    assert "from vLLM's default 0.9 that is 0.88" in _finding(_traceback(V1, serving, near)).steps[0]


def test_an_oom_in_the_profile_run_shrinks_the_dummy_batch_and_not_the_budget() -> None:
    args = "INFO 05-01 12:00:00 [utils.py:1] non-default args: {'model': 'm', 'max_num_seqs': 1024}\n"
    finding = _finding(args + _traceback(V1, ["determine_available_memory", "profile_run"], _oom()))
    assert _flags(finding) == {"--max-num-seqs": 512}


def test_a_sampler_warm_up_in_the_profile_run_does_not_lower_the_budget() -> None:
    # vllm/v1/worker/gpu_model_runner.py 0.11.0 `_dummy_sampler_run`, called from profile_run.
    message = (
        "RuntimeError: CUDA out of memory occurred when warming up sampler with 1024 dummy requests. Please try "
        "lowering `max_num_seqs` or `gpu_memory_utilization` when initializing the engine."
    )
    in_profile = _finding(_traceback(V1, ["profile_run", "_dummy_sampler_run"], message))
    assert _flags(in_profile) == {"--max-num-seqs": 512}
    after_kv = _traceback(V1, ["compile_or_warm_up_model", "_dummy_sampler_run"], message)
    budget = "INFO 03-20 17:30:00 [utils.py:1] non-default args: {'model': 'm', 'gpu_memory_utilization': 0.85}\n"
    assert _flags(_finding(budget + after_kv)) == {"--max-num-seqs": 512, "--gpu-memory-utilization": 0.83}
    # The budget not in the log: its lowering is a step, from vLLM's default only as an example.
    unstated = _finding(after_kv)
    assert _flags(unstated) == {"--max-num-seqs": 512}
    assert "below what you set" in unstated.steps[0]
    assert "0.88" in unstated.steps[0]
    # No frame: the warm-up runs in both places, so the budget is a step that says how to tell them apart.
    bare = _finding(message + "\n")
    assert _flags(bare) == {"--max-num-seqs": 512}
    assert "compile_or_warm_up_model" in bare.steps[0]


def test_a_pooling_models_pooler_warm_up_is_read_as_the_samplers() -> None:
    # vllm/v1/worker/gpu_model_runner.py 0.10-0.33 `_dummy_pooler_run`: the same max_num_seqs dummy requests.
    message = (
        "RuntimeError: CUDA out of memory occurred when warming up pooler (task='embed') with 256 dummy requests. "
        "Please try lowering `max_num_seqs` or `gpu_memory_utilization` when initializing the engine."
    )
    finding = _finding(_traceback(V1, ["profile_run", "_dummy_pooler_run"], message))
    assert _flags(finding) == {"--max-num-seqs": 128}
    assert "pooler" in finding.summary


def test_graphs_that_took_the_budgets_margin_before_the_sampler_warm_up_offer_eager_mode() -> None:
    """Before 0.21, graphs are captured after the KV cache filled the budget, outside it. Here they took 0.66 GiB
    of the 0.64 GiB a 0.98 budget leaves a 31.86 GiB card, and the warm-up after them found nothing free."""
    args = "INFO 12-13 10:00:00 [utils.py:1] non-default args: {'model': 'm', 'gpu_memory_utilization': 0.98}\n"
    graphs = "INFO 12-13 10:01:00 [gpu_model_runner.py:1] Graph capturing finished in 7 secs, took 0.66 GiB\n"
    oom = _oom("HIP", tried="76.00 MiB", total="31.86 GiB", free="0 bytes", process="31.00 GiB", allocated="30.75 GiB",
               stranded="169.00 MiB")  # fmt: skip
    warm_up = (
        "RuntimeError: CUDA out of memory occurred when warming up sampler with 64 dummy requests. Please try "
        "lowering `max_num_seqs` or `gpu_memory_utilization` when initializing the engine."
    )
    frames = ["compile_or_warm_up_model", "_dummy_sampler_run"]
    text = args + graphs + _traceback(V1, frames, oom) + _traceback(V1, frames, warm_up)
    assert _flags(_finding(text)) == {"--max-num-seqs": 32, "--gpu-memory-utilization": 0.96, "--enforce-eager": ""}
    # Graphs that took a small part of the margin are not what left the warm-up short.
    small = text.replace("took 0.66 GiB", "took 0.20 GiB")
    assert "--enforce-eager" not in _flags(_finding(small))
    # Nor where the budget, and so what it leaves the card, is not in the log.
    assert "--enforce-eager" not in _flags(_finding(text.replace(args, "")))


def test_a_preemption_storm_without_a_stats_line_halves_max_num_seqs_as_a_first_step() -> None:
    args = "INFO 05-01 12:00:00 arg_utils.py:1] args: Namespace(model='m', max_num_seqs=256, block_size=16)\n"
    warning = (
        "WARNING 05-01 12:05:00 scheduler.py:1089] Sequence group 7 is preempted by PreemptionMode.RECOMPUTE mode "
        "because there is not enough KV cache space. This can affect the end-to-end performance. Increase "
        "gpu_memory_utilization or tensor_parallel_size to provide more KV cache memory. "
        "total_num_cumulative_preemption=151\n"
    )
    finding = _finding(args + warning)
    assert finding.cause is Cause.CONCURRENCY_MISJUDGEMENT
    assert _flags(finding)["--max-num-seqs"] == 128


def test_the_ledger_says_where_each_amount_came_from_and_what_is_assumed() -> None:
    text = (
        "INFO 01-01 00:00:00 llm_engine.py:1] Initializing an LLM engine (v0.6.3) with config: "
        "model='Qwen/Qwen2.5-72B-Instruct', dtype=torch.bfloat16, max_seq_len=32768, tensor_parallel_size=2, "
        "quantization=None\n" + _traceback(V1, ["load_model"], _oom(total="79.15 GiB", process="78.09 GiB"))
    )
    facts = parse_log(text)
    ev = evidence(live_evidence=DOWN, log_facts=facts)
    ledger = build_ledger(facts, resolve(ev))
    assert ledger.total is not None
    assert ledger.total.value_bytes == int(79.15 * GIB)
    assert ledger.utilization_assumed
    assert ledger.weights is not None
    assert ledger.weights.assumed  # 72e9 x 2 bytes / 2 GPUs = 67.1 GiB: from the name, not a loading line
    assert ledger.weights.value_bytes == pytest.approx(72e9 * 2 / 2)
    assert ledger.weights_fit() is None, "67 of 79 GiB: neither clearly in nor clearly out"
    assert any("(estimated" in line for line in ledger.lines())


@pytest.mark.parametrize(
    ("name", "low_gib", "high_gib"),
    [
        ("meta-llama/Llama-3.1-8B-Instruct", 14.9, 16.4),  # 8e9 x 2 B; names round down: up to 8.8e9
        ("Qwen/Qwen2.5-VL-7B-Instruct-AWQ", 3.3, 4.7),
        ("mistralai/Mixtral-8x7B-Instruct-v0.1", 78.2, 104.3),  # 0.75-1 x 8 x 7e9 x 2 B: experts share attention
        ("Qwen/Qwen3-30B-A3B-FP8", 27.9, 33.8),
        ("/data/models/qwen1.5-4b-chat", 7.5, 8.2),
    ],
)
def test_the_weights_a_models_name_implies(name: str, low_gib: float, high_gib: float) -> None:
    found = estimate(name)
    assert found is not None
    assert (round(found.low_bytes / GIB, 1), round(found.high_bytes / GIB, 1)) == (low_gib, high_gib)


def test_a_name_without_a_size_estimates_nothing() -> None:
    assert estimate("microsoft/phi-4") is None
    assert estimate("deepseek-ai/DeepSeek-V3") is None


def test_memory_held_outside_this_process_is_another_process_even_unlisted() -> None:
    """Older PyTorch lists no other process: what the card holds besides this process and what is free is still
    someone else's. 80 GiB, 0.5 free, this process 18.5: 61 GiB elsewhere, (80 - 61 - 4) / 80 -> 0.18."""
    oom = _oom(total="80.00 GiB", free="0.50 GiB", process="18.50 GiB", allocated="17.90 GiB")  # PyTorch's within it
    finding = _finding(_traceback(V1, ["execute_model"], oom))
    assert finding.cause is Cause.CONFIGURATION_OVERSHOOT
    assert _flags(finding) == {"--gpu-memory-utilization": 0.18}
    assert any(
        "this process held, in the OOM message: the rest is other processes'" in line for line in finding.evidence
    )


def test_an_allocation_with_the_memory_free_is_no_shortage() -> None:
    text = _traceback(V1, ["wake_up_weights", "execute_model"], _oom(tried="186.00 MiB", free="188.69 GiB",
                      total="191.45 GiB", process="2.76 GiB"))  # fmt: skip
    finding = _finding(text)
    assert (finding.cause, finding.recommendations) == (Cause.OTHER, ())


def test_one_allocation_larger_than_the_card_is_no_budgets_business() -> None:
    text = _traceback(V1, ["profile_run", "vit_attention"], _oom("HIP", tried="192.00 GiB", total="15.98 GiB",
                      free="11.56 GiB", process="4.42 GiB"))  # fmt: skip
    finding = _finding(text)
    assert finding.cause is Cause.CONFIGURATION_OVERSHOOT
    assert "--gpu-memory-utilization" not in _flags(finding)
    assert "no gpu_memory_utilization makes room" in " ".join(finding.evidence)


def test_weights_that_fill_the_card_are_the_reading_whatever_the_phase() -> None:
    """14.25 GiB of weights on a 14.56 GiB card at 0.85: a capture OOM after them is not the budget's transient
    (the budget is already below the weights)."""
    start = (
        "INFO 04-26 12:03:17 [utils.py:233] non-default args: {'model': 'Qwen/Qwen2.5-7B-Instruct', "
        "'gpu_memory_utilization': 0.85}\n"
        "INFO 04-26 12:04:51 [gpu_model_runner.py:4820] Model loading took 14.25 GiB memory and 53.5 seconds\n"
    )
    oom = _oom(tried="1.02 GiB", total="14.56 GiB", free="0.11 GiB", process="14.45 GiB")
    finding = _finding(start + _traceback(V1, ["compile_or_warm_up_model", "capture_model"], oom))
    assert finding.cause is Cause.DOES_NOT_FIT
    assert "--gpu-memory-utilization" not in _flags(finding)


def test_nearly_the_whole_card_with_no_phase_is_read_as_weights_with_the_other_reading_as_a_step() -> None:
    line = _oom(tried="24.00 MiB", total="23.69 GiB", free="24.56 MiB", process="23.66 GiB", allocated="23.19 GiB")
    finding = _finding(line + "\n")
    assert finding.cause is Cause.DOES_NOT_FIT
    assert "--gpu-memory-utilization" not in _flags(finding)
    assert "lower --gpu-memory-utilization by" in finding.steps[-1]


def test_expandable_segments_own_mapping_failure_is_an_oom_with_its_numbers() -> None:
    # c10/cuda/CUDACachingAllocator.cpp with expandable_segments:True, when the driver cannot map more memory.
    line = (
        "[rank4]:[W827 22:16:08.199727429 CUDACachingAllocator.cpp:508] expandable_segments: memory mapping failed "
        "with OOM on device 4 while trying to map 20971520 bytes (free: 17235968, total: 25295323136)."
    )
    oom = parse_log(line).oom
    assert oom is not None
    assert (oom.gpu, oom.tried_bytes, oom.free_bytes, oom.total_bytes) == (4, 20971520, 17235968, 25295323136)


def test_an_npu_oom_in_torch_npus_format_recommends_its_own_allocator_setting() -> None:
    line = (
        "RuntimeError: NPU out of memory. Tried to allocate 2.00 GiB (NPU 0; 60.96 GiB total capacity; 55.91 GiB "
        "already allocated; 55.91 GiB current active; 1.80 GiB free; 58.73 GiB reserved in total by PyTorch)"
    )
    oom = parse_log(line).oom
    assert oom is not None
    assert (oom.device, oom.free_bytes, oom.reserved_unallocated_bytes) == (
        "NPU",
        int(1.80 * GIB),
        int(58.73 * GIB) - int(55.91 * GIB),
    )
    assert _flags(_finding(line)) == {"PYTORCH_NPU_ALLOC_CONF": "expandable_segments:True"}


def test_a_small_shortfall_that_stranded_memory_holds_many_times_over_is_fragmentation() -> None:
    """318 MiB asked, 315 MiB free: 3 MiB short, 231 MiB stranded (under 256 MiB, but 70 times the shortfall)."""
    oom = _oom(tried="318.00 MiB", total="23.53 GiB", free="315.44 MiB", process="23.20 GiB", stranded="231.26 MiB")
    finding = _finding(_traceback(V1, ["execute_model"], oom))
    assert finding.cause is Cause.ALLOCATOR_FRAGMENTATION
    slack = _oom(tried="318.00 MiB", total="23.53 GiB", free="315.44 MiB", process="23.20 GiB", stranded="40.00 MiB")
    assert _finding(_traceback(V1, ["execute_model"], slack)).cause is Cause.CONFIGURATION_OVERSHOOT


def test_a_stats_line_a_terminal_wrapped_is_still_read() -> None:
    text = "\n".join(
        [
            "INFO 01-21 05:05:14 metrics.py:467] Avg prompt throughput: 0.0",
            "tokens/s, Avg generation throughput: 1529.6 tokens/s,",
            "Running: 155 reqs, Swapped: 0 reqs, Pending: 101 reqs, GPU KV cache",
            "usage: 99.5%, CPU KV cache usage: 0.0%.",
        ]
    )
    busiest = parse_log(text).busiest
    assert busiest is not None
    assert (busiest.running, busiest.waiting, busiest.kv_usage) == (155, 101, 0.995)


def test_the_cpu_backends_refusal_fits_the_kv_space_in_the_node() -> None:
    # vllm/v1/worker/cpu_worker.py (0.32.0): the KV cache asked for more than the NUMA node had available.
    line = (
        "(Worker pid=1671) ERROR 06-09 16:29:44 [multiproc_executor.py:987] ValueError: Available memory on node 0 "
        "(149.11/692.65 GiB) on kv cache allocation is less than requested memory for kv (206.54/207.8 GiB). Reduce "
        "CPU memory used by other processes."
    )
    finding = _finding(line)
    assert finding.cause is Cause.CONFIGURATION_OVERSHOOT
    # 149.11 x 0.95 = 141.7 -> 141 GiB; (149.11 + 1.26) / 692.65 - 0.01 = 0.207 -> 0.2
    assert _flags(finding) == {"VLLM_CPU_KVCACHE_SPACE": 141, "--gpu-memory-utilization": 0.2}


def test_the_ranks_a_log_names_are_the_gpus_weights_are_already_split_over() -> None:
    """Rank 5 failing to load weights: at least 8 GPUs held the model, so 'more GPUs' starts from 16."""
    prefix = "(VllmWorker rank=5 pid=3073) "
    text = prefix + "INFO 01-01 00:00:00 [loader.py:1] loading\n" + _traceback(
        prefix, ["load_model", "create_weights"], _oom(total="79.14 GiB", free="0.07 GiB", process="79.07 GiB",
                                                       tried="896.00 MiB", allocated="78.43 GiB"))  # fmt: skip
    finding = _finding(text)
    assert finding.cause is Cause.DOES_NOT_FIT
    assert _flags(finding)["--tensor-parallel-size"] == 16  # 79.9 GiB x 8 / 16 = 40 <= 0.75 x 79.14


def test_no_tensor_parallel_size_when_none_up_to_64_gpus_fits() -> None:
    text = _traceback(
        "[rank63]: ",
        ["load_model"],
        _oom(total="15.00 GiB", free="0.10 GiB", process="14.90 GiB", tried="2.00 GiB", allocated="14.50 GiB"),
    )
    flags = _flags(_finding(text))
    assert "--tensor-parallel-size" not in flags, "64 ranks already: more GPUs is no longer a flag to paste"


def test_a_bare_cuda_error_in_any_case_is_an_out_of_memory_error() -> None:
    assert parse_log("Runtime Error: Cuda error: out of memory at /workspace/csrc/cumem_allocator.cpp: 62").oom
    assert parse_log("RuntimeError: CUDA Error: out of memory at /workspace/csrc/cumem_allocator.cpp:62").oom
    assert parse_log("an error in the kernel's memory accounting").oom is None


def test_a_tpu_kernels_on_chip_scratch_is_not_the_devices_memory() -> None:
    """XLA names the memory space it ran out of: `hbm` is the device's memory, which vLLM's budget shares out;
    `vmem` is a TensorCore's own scratch, a compiled kernel's need that no budget or length changes."""
    error = (
        "jax.errors.JaxRuntimeError: RESOURCE_EXHAUSTED: XLA:TPU compile permanent error. Ran out of memory in "
        "memory space vmem. Used 80.00M of 64.00M vmem. Exceeded vmem capacity by 16.00M."
    )
    start = "ERROR 06-03 07:41:11 [core.py:1184] EngineCore failed to start.\n"
    finding = _finding(f"{start}{error}\n")
    assert finding.cause is Cause.OTHER
    assert "VMEM" in finding.summary
    assert not finding.recommendations
    hbm = error.replace("memory space vmem", "memory space hbm").replace("vmem", "hbm")
    assert _finding(f"{start}{hbm}\n").cause is not Cause.OTHER


@pytest.mark.parametrize(
    ("line", "moved"),
    [
        (  # 0.7+: GiB, the same number twice (a GPU-sharing layer's fixed count)
            "AssertionError: Error in memory profiling. Initial free memory 23.4375 GiB, current free memory "
            "23.4375 GiB. This happens when other processes sharing the same container release GPU memory while "
            "vLLM is profiling during initialization.",
            "did not move",
        ),
        (  # 0.6: bytes, free memory rose (another process released some)
            "AssertionError: Error in memory profiling. Initial free memory 20401094656, current free memory "
            "22548578304. This happens when the GPU memory was not properly cleaned up before initializing the "
            "vLLM instance.",
            "rose by 2.00 GiB",
        ),
        (  # 0.5: no numbers
            "AssertionError: Error in memory profiling. This happens when the GPU memory was not properly cleaned "
            "up before initializing the vLLM instance.",
            None,
        ),
    ],
)
def test_the_memory_profiles_own_check_is_no_budget_problem(line: str, moved: str | None) -> None:
    """vLLM sizes its KV cache from how far free memory fell while it loaded and profiled; its assertion that it
    fell is about the card's count, not the configuration: cause other, no flag."""
    finding = _finding(f"ERROR 06-03 07:41:11 [core.py:1184] EngineCore failed to start.\n{line}\n")
    assert finding.cause is Cause.OTHER
    assert not finding.recommendations
    assert finding.steps
    if moved is not None:
        assert any(moved in text for text in finding.evidence), finding.evidence
    assert parse_log("INFO 06-03 07:41:11 [gpu_worker.py:1] Memory profiling takes 3.20 seconds\n").refusal is None


V0_BLOCKS = (
    "INFO 01-23 07:32:42 model_runner.py:1071] Loading model weights took 4.3752 GB\n"
    "INFO 01-23 07:34:26 gpu_executor.py:122] # GPU blocks: 11836, # CPU blocks: 4681\n"
)


def test_a_process_the_oom_killer_ended_is_the_hosts_memory() -> None:
    """A shell's `Killed` (or Kubernetes' OOMKilled): host memory, which no GPU flag changes; right after V0 sized
    its CPU blocks, the --swap-space it pins in host memory is the one vLLM flag that gives some back."""
    after_blocks = _finding(V0_BLOCKS + "Killed\n")
    assert after_blocks.cause is Cause.CONFIGURATION_OVERSHOOT
    assert _flags(after_blocks) == {"--swap-space": 1}
    assert "4,681 CPU blocks" in " ".join(after_blocks.evidence)
    bare = _finding("INFO 01-23 07:32:42 model_runner.py:1071] Loading model weights took 4.3752 GB\nKilled\n")
    assert bare.cause is Cause.OTHER
    assert not bare.recommendations
    assert any("dmesg" in step for step in bare.steps)
    assert parse_log("  Last State:  Terminated\n    Reason:  OOMKilled\n").host_memory is not None
    assert parse_log("INFO 01-23 07:32:42 engine.py:1] the request was Killed by the user? no\n").host_memory is None
    assert parse_log("INFO 01-23 07:32:42 engine.py:1] Skilled workers\n").host_memory is None


def test_rays_memory_monitor_killing_a_worker_is_the_hosts_memory_not_the_gpus() -> None:
    """Ray's `OutOfMemoryError` is its memory monitor killing a task for the node's memory: no GPU reading, no
    budget step. vLLM's own warning that the swap space takes a large share of the host, in a V0 log (V1 never
    allocates it), gives --swap-space 1."""
    ray = (
        "ray.exceptions.OutOfMemoryError: Task was killed due to the node running low on memory.\n"
        "Memory on the node (IP: 10.0.0.1, ID: ab12) where the task (task ID: ff, name=Worker.__init__, pid=26332, "
        "memory used=4.54GB) was running was 31.27GB / 32.00GB (0.977), which exceeds the memory usage threshold "
        "of 0.95.\n"
    )
    bare = _finding(ray)
    assert bare.cause is Cause.OTHER
    assert not bare.recommendations
    assert "Ray" in bare.summary
    assert "31.27 / 32.00 GB" in " ".join(bare.evidence)
    assert parse_log(ray).oom is None, "not the accelerator's OOM"
    alone = _finding(ray.split("\n", 1)[1])  # an excerpt that starts after the exception: the line is the kill
    assert (alone.cause, alone.recommendations) == (Cause.OTHER, ())
    assert "threshold of 0.95)" in " ".join(alone.evidence)
    swap = (
        "INFO 06-30 09:24:54 llm_engine.py:59] Initializing an LLM engine with config: model='m'\n"
        '  File "/opt/app/vllm/engine/llm_engine.py", line 114, in _init_cache\n'
        "WARNING 06-30 09:24:54 config.py:131] Possibly too large swap space. 16.00 GiB out of the 32.00 GiB total "
        "CPU memory is allocated for the swap space.\n"
    )
    warned = _finding(swap + ray)
    assert warned.cause is Cause.CONFIGURATION_OVERSHOOT
    assert _flags(warned) == {"--swap-space": 1}
    assert "16 GiB of the host's 32 GiB" in " ".join(warned.evidence)


V0_PROFILE_START = (
    "INFO 09-27 11:18:22 model_runner.py:1025] Loading model weights took 19.9073 GB\n"
    "INFO 09-27 11:18:35 enc_dec_model_runner.py:297] Starting profile run for multi-modal models.\n"
)


def test_a_log_cut_inside_the_profile_runs_traceback_says_what_to_look_for_and_no_value() -> None:
    frames = ["__init__", "_initialize_kv_caches", "determine_num_available_blocks", "decorate"]
    cut = V0_PROFILE_START + _traceback("[rank0]: ", frames, "").rsplit("\n", 2)[0]  # no error line, no newline
    finding = _finding(cut)
    assert finding.cause is Cause.CONFIGURATION_OVERSHOOT
    assert finding.recommendations == ()
    assert "error itself is cut" in finding.summary
    assert "--max-num-seqs" in finding.steps[0]
    # the same traceback with its error line is an OOM, read as such
    whole = cut + "\n[rank0]: " + _oom()
    assert "cut" not in _finding(whole).summary


def test_a_log_cut_inside_the_graph_capture_recommends_eager_mode_and_the_budget_only_as_a_step() -> None:
    """An excerpt that starts mid-traceback (no header, no error line) through V0's warm-up into capture_model:
    eager mode skips the capture whatever the cut error was; a lower budget helps only an OOM."""
    tag = "WARN  PyProcess W-252-model-stderr: "
    cut = (
        f'{tag}  File "/usr/local/lib/python3.10/dist-packages/vllm/engine/ray_utils.py", line 30, in execute_method\n'
        f"{tag}    return executor(*args, **kwargs)\n"
        f'{tag}  File "/usr/local/lib/python3.10/dist-packages/vllm/worker/worker.py", line 125, in warm_up_model\n'
        f"{tag}    self.model_runner.capture_model(self.gpu_cache)\n"
        f'{tag}  File "/usr/local/lib/python3.10/dist-packages/torch/utils/_contextlib.py", line 115, in decorate\n'
        "WARN  PyPro"
    )
    assert parse_log(cut).cut_in is OomPhase.GRAPH_CAPTURE
    finding = _finding(cut)
    assert finding.cause is Cause.CONFIGURATION_OVERSHOOT
    assert _flags(finding) == {"--enforce-eager": ""}
    assert "error itself is cut" in finding.summary
    assert "--gpu-memory-utilization a few hundredths below what you set" in finding.steps[0]
    assert _flags(_finding("$ vllm serve m --enforce-eager\n" + cut)) == {}  # eager already: nothing to skip


def test_tenstorrents_dram_allocator_failure_is_an_oom() -> None:
    line = (
        "[SERVER] ERROR 10-27 19:32:31 [engine.py:187] Out of Memory: Not enough space to allocate 427819008 B DRAM "
        "buffer across 12 banks, where each bank needs to store 35651584 B, but bank size is only 1046181792 B\n"
    )
    assert parse_log(line).oom is not None
    assert _finding(line).cause is Cause.CONFIGURATION_OVERSHOOT


def test_an_nccl_out_of_memory_without_quotes_is_an_oom() -> None:
    oom = parse_log("enqueue.cc:1556 NCCL WARN Cuda failure 2 out of memory\n").oom
    assert oom is not None
    assert oom.tried_bytes is None


def test_a_traceback_cut_inside_the_kv_check_is_its_refusal_with_no_size_made_up() -> None:
    """V0's `raise_if_cache_size_invalid` raises one of two refusals; cut before either, the log is still vLLM's
    refusal at the check, and nothing sizes a flag."""
    prefix = "ERROR 04-28 15:55:45 worker_base.py:157] "
    text = (
        f"{prefix}Error executing method initialize_cache. This might cause deadlock in distributed execution.\n"
        f"{prefix}Traceback (most recent call last):\n"
        f'{prefix}  File "/x/vllm/worker/worker.py", line 171, in initialize_cache\n'
        f"{prefix}    raise_if_cache_size_invalid(num_gpu_blocks,\n"
        f'{prefix}  File "/x/vllm/worker/worker.py", line 335, in raise'
    )
    finding = _finding(text)
    assert finding.cause is Cause.KV_CACHE_BLOWOUT
    assert finding.recommendations == ()
    assert "No available memory for the cache blocks" in finding.steps[0]


def test_the_lines_before_a_traceback_header_place_it_not_the_ones_before_them() -> None:
    """A blank line between the progress lines and the header is no part of the traceback: the last progress line
    before the header places it (the profile run), not an earlier one (loading)."""
    text = (
        "Loading safetensors checkpoint shards: 100% Completed | 5/5 [00:03<00:00,  1.36it/s]\n\n"
        + V0_PROFILE_START
        + "[rank0]: Traceback (most recent call last):\n"
        + '[rank0]:   File "/x/runpy.py", line 196, in _run_module_as_main\n'
        + "[rank0]:     return _run_code(code, main_globals, None,\n[rank0]:   Fil\n"
    )
    assert parse_log(text).cut_in is OomPhase.PROFILING


@pytest.mark.parametrize(("estimate", "read"), [(-35.69, True), (-0.2, False), (2.55, False)])
def test_a_negative_cuda_graph_estimate_oversized_the_kv_cache(estimate: float, read: bool) -> None:
    """0.18+ takes its graph estimate out of the KV cache's share: a negative one gave the cache more than the
    budget holds. Rounding noise and a positive estimate say nothing."""
    text = (
        "(EngineCore pid=257) INFO 06-06 16:17:06 [gpu_model_runner.py:6283] Profiling CUDA graph memory: "
        "PIECEWISE=51 (largest=512)\n"
        f"(EngineCore pid=257) INFO 06-06 16:17:13 [gpu_model_runner.py:6369] Estimated CUDA graph memory: {estimate} "
        "GiB total\n"
        "(EngineCore pid=257) INFO 06-06 16:17:14 [gpu_worker.py:469] Available KV cache memory: 72.44 GiB\n"
    )
    findings = diagnose(evidence(live_evidence=DOWN, log_facts=parse_log(text))).findings
    oversized = [f for f in findings if "beyond the budget" in f.summary]
    assert bool(oversized) is read
    if read:
        assert oversized[0].cause is Cause.CONFIGURATION_OVERSHOOT
        assert _flags(oversized[0]) == {"--enforce-eager": ""}
        assert "VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0" in oversized[0].steps[0]


def test_vllm_01s_negative_block_count_is_no_kv_cache_at_all() -> None:
    """0.1.x printed a budget short of the profile's peak as '# GPU blocks: -1' and failed later."""
    facts = parse_log("INFO 06-21 10:00:18 llm_engine.py:128] # GPU blocks: -1, # CPU blocks: 512\n")
    assert facts.num_gpu_blocks == 0
    finding = _finding("INFO 06-21 10:00:18 llm_engine.py:128] # GPU blocks: -1, # CPU blocks: 512\n")
    assert finding.cause is Cause.CONFIGURATION_OVERSHOOT
    assert "--max-model-len" not in _flags(finding)


def test_a_kv_refusal_cut_before_its_count_is_a_blowout_with_no_length_made_up() -> None:
    line = (
        "ValueError: The model's max seq len (32768) is larger than the maximum number of tokens that can be stored "
        "in KV cache ("
    )
    finding = _finding(line + "\n")
    assert finding.cause is Cause.KV_CACHE_BLOWOUT
    assert finding.recommendations == ()
    assert "32,768" in finding.summary
    assert any("--max-model-len at most that" in step for step in finding.steps)
    whole = parse_log(line + "8528)\n").refusal
    assert whole is not None
    assert whole.capacity_tokens == 8528


def test_a_weights_file_the_host_would_not_map_is_the_hosts_memory() -> None:
    line = (
        "ERROR 06-02 09:39:03 [core.py:396] RuntimeError: unable to mmap 16933256392 bytes from file "
        "</root/.cache/model.safetensors>: Cannot allocate memory (12)\n"
    )
    finding = _finding(line)
    assert finding.cause is Cause.OTHER
    assert not finding.recommendations
    assert "15.77 GiB" in finding.summary


def test_swap_space_is_said_only_to_a_release_that_has_it() -> None:
    from sidecar.doctor.versions import available

    assert available("--swap-space", (0, 6, 3))
    assert not available("--swap-space", (0, 18, 0))
    assert not available("--swap-space", None), "an unknown version may be one without it"
    assert available("--swap-space", None, v0_log=True), "a V0 log is a release before 0.11.0"


def test_non_torch_memory_beyond_vllms_own_is_named_as_another_processes() -> None:
    """V0 counts any memory that grew on the card during its profile run, less PyTorch's, as its non-torch
    memory: several GiB of it is another process's, and the reading says so beside its recommendation."""
    profile = (
        "INFO 01-01 00:00:00 worker.py:295] model weights take 6.59GiB; non_torch_memory takes {}GiB; PyTorch "
        "activation peak memory takes 4.93GiB; the rest of the memory reserved for KV Cache is -7.83GiB.\n"
        "ERROR 01-01 00:00:01 engine.py:1] ValueError: No available memory for the cache blocks. Try increasing "
        "`gpu_memory_utilization` when initializing the engine.\n"
    )
    foreign = _finding(profile.format("8.29"))
    assert any("another process took on the card" in line for line in foreign.evidence), foreign.evidence
    own = _finding(profile.format("0.29"))
    assert not any("another process took on the card" in line for line in own.evidence)


def test_apples_metal_out_of_memory_is_of_the_family() -> None:
    text = (
        "(APIServer pid=1) INFO 04-15 07:20:01 [loggers.py:259] Engine 000: Running: 1 reqs, Waiting: 0 reqs, "
        "GPU KV cache usage: 0.2%\n"
        "libc++abi: terminating due to uncaught exception of type std::runtime_error: [METAL] Command buffer "
        "execution failed: Insufficient Memory (00000008:kIOGPUCommandBufferCallbackErrorOutOfMemory)\n"
    )
    oom = parse_log(text).oom
    assert oom is not None
    assert oom.device == "METAL"
    assert _finding(text).cause is Cause.CONFIGURATION_OVERSHOOT


def test_graphs_profiled_before_the_kv_cache_can_give_it_their_memory() -> None:
    """vLLM 0.2x keeps the CUDA graphs' profiled memory out of the KV budget: --enforce-eager returns it."""
    refusal = (
        "Profiling CUDA graph memory: PIECEWISE=6 (largest=32), FULL=4 (largest=16)\n"
        "Available KV cache memory: 0.24 GiB\n"
        "ValueError: To serve at least one request with the model's max seq len (1000000), 3.09 GiB KV cache is "
        "needed, which is larger than the available KV cache memory (0.24 GiB). Estimated maximum model length is "
        "57344.\n"
    )
    assert "--enforce-eager" in _flags(_finding(refusal))
    assert "--enforce-eager" not in _flags(_finding(refusal.split("\n", 1)[1]))


def test_the_budget_0_21s_graph_profiling_line_states_is_todays_budget() -> None:
    """vLLM 0.21+ charges the graphs' estimate to the budget and says so with today's budget in the line: the
    raise starts from it (not from vLLM's default), and --enforce-eager gives the graphs' share back."""
    refusal = (
        "Available KV cache memory: -1.21 GiB\n"
        "CUDA graph memory profiling is enabled (default since v0.21.0). The current --gpu-memory-utilization=0.3000 "
        "is equivalent to --gpu-memory-utilization=0.0201 without CUDA graph memory profiling. To maintain the same "
        "effective KV cache size as before, increase --gpu-memory-utilization to 0.5799. To disable, set "
        "VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0.\n"
        "ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when "
        "initializing the engine.\n"
    )
    facts = parse_log(refusal)
    assert facts.graphs_profiled
    assert facts.graphs_charged_utilization == 0.3
    flags = _flags(_finding(refusal))
    assert "--enforce-eager" in flags
    assert 0.3 < float(str(flags["--gpu-memory-utilization"])) < 0.9


def test_a_wrapped_count_of_the_processes_memory_is_no_measurement() -> None:
    """WSL printed "this process has 17179869184.00 GiB memory in use" (2^64 bytes): sized from it, the weights
    needed 16 EiB and the CPU offload as much. It is dropped; the rest of PyTorch's message still reads."""
    oom = _oom(total="6.00 GiB", free="0 bytes", process="17179869184.00 GiB", allocated="12.43 GiB")
    facts = parse_log(f"{oom}\n").oom
    assert facts is not None
    assert facts.process_bytes is None
    assert facts.allocated_bytes == pytest.approx(12.43 * GIB, rel=1e-3)
    assert facts.total_bytes == 6 * GIB


def test_a_negative_kv_cache_sizes_the_raise_without_the_cards_size() -> None:
    """Today's 0.15 held 15.22 GiB of weights and a KV cache of -1.30 GiB, so 13.92 GiB or more: it must grow
    by 15.22 / 13.92, plus the KV margin (0.15 x 1.093 + 0.05 = 0.214), not jump to vLLM's default 0.9."""
    text = (
        "INFO 03-18 13:41:20 [default_loader.py:291] Loading weights took 20.51 seconds\n"
        "INFO 03-18 13:41:21 [gpu_model_runner.py:3950] Model loading took 15.22 GiB memory and 21.4 seconds\n"
        "INFO 03-18 13:41:28 [gpu_worker.py:375] Available KV cache memory: -1.30 GiB\n"
        "ERROR 03-18 13:41:29 [core.py:866] ValueError: No available memory for the cache blocks. Try increasing "
        "`gpu_memory_utilization` when initializing the engine.\n"
    )
    args = "INFO 03-18 13:41:00 [utils.py:1] non-default args: {'model': 'm', 'gpu_memory_utilization': 0.15}\n"
    finding = _finding(args + text)
    assert finding.cause is Cause.CONFIGURATION_OVERSHOOT
    assert _flags(finding)["--gpu-memory-utilization"] == 0.22
    unstated = _flags(_finding(text))["--gpu-memory-utilization"]  # today's not in the log: the default, then a step
    assert unstated == 0.95


def test_a_budget_set_far_below_the_default_is_doubled_not_raised_to_the_default() -> None:
    """0.1 with no KV room and no sizes in the log: a budget set that low says the card is shared, so the step is
    0.2, clear of what the other tenant may hold; 0.55 still goes to vLLM's default."""
    refusal = (
        "ERROR 04-06 18:44:22 [core.py:390] ValueError: No available memory for the cache blocks. Try increasing "
        "`gpu_memory_utilization` when initializing the engine.\n"
    )
    weights = "INFO 04-06 18:44:08 [gpu_model_runner.py:1273] Model loading took 0.4315 GiB and 0.8 seconds\n"

    def budget(utilization: float) -> object:
        args = f"INFO 04-06 18:43:50 [api_server.py:1035] args: Namespace(gpu_memory_utilization={utilization})\n"
        return _flags(_finding(args + weights + refusal))["--gpu-memory-utilization"]

    assert budget(0.1) == 0.2
    assert budget(0.3) == 0.6
    assert budget(0.55) == 0.9


def test_a_tpu_kernels_scalar_memory_holds_the_block_tables_which_sequences_and_length_size() -> None:
    """SMEM holds what the attention kernel prefetches as scalars, the block tables: max_num_seqs x max_model_len
    / block_size entries. Fewer sequences or a shorter length shrink them; the HBM budget does not."""
    error = (
        "RuntimeError: Bad StatusOr access: RESOURCE_EXHAUSTED: XLA:TPU compile permanent error. Ran out of memory "
        "in memory space smem. Used 1.00M of 1.00M smem. Exceeded smem capacity by 1.7K.\n"
    )
    bare = _finding(error)
    assert bare.cause is Cause.CONFIGURATION_OVERSHOOT
    assert not bare.recommendations
    assert "max_num_seqs" in bare.steps[0]
    args = "INFO 09-09 10:00:00 api_server.py:1] args: Namespace(max_model_len=16384, max_num_seqs=256)\n"
    sized = _flags(_finding(args + error))
    assert sized == {"--max-num-seqs": 128, "--max-model-len": 8192}


def test_a_tpu_kernels_vector_memory_is_no_budget_even_without_xlas_prefix() -> None:
    """VMEM, a TensorCore's own scratch, named without RESOURCE_EXHAUSTED: still the TPU's on-chip memory, no
    memory flag (not a budget or a GPU count)."""
    finding = _finding(
        "ERROR 06-11 13:57:14 [core.py:515] ValueError: Ran out of memory in memory space vmem while allocating on "
        'stack for %name.32 = bf16[16,32,128] custom-call(%p16.165), custom_call_target="tpu_custom_call"\n'
    )
    assert finding.cause is Cause.OTHER
    assert not finding.recommendations
    assert "VMEM" in finding.summary


@pytest.mark.parametrize(
    ("line", "device"),
    [
        (
            "ERROR 04-09 21:56:46 [diffusion_engine.py:82] [PID: 210907] 2026-04-09-21:56:40.384.694 "
            "Memory_Allocation_Failure(EL0004): Failed to allocate memory requested by GE module.",
            "NPU",
        ),
        (
            "(EngineCore_DP0 pid=3132) ERROR 10-15 16:32:16 [core.py:708]         alloc device memory failed, runtime "
            "result = 207001[FUNC:ReportCallError][FILE:log_inner.cpp][LINE:161]",
            "NPU",
        ),
        (
            "(EngineCore pid=2007724) ERROR 06-26 20:05:15 [core.py:1231] jax.errors.JaxRuntimeError: "
            "RESOURCE_EXHAUSTED: E0100: RuntimeBufferAllocationFailure:",
            "TPU",
        ),
    ],
)
def test_the_npus_and_jaxs_own_allocation_failures_are_out_of_memory(line: str, device: str) -> None:
    """Ascend's CANN runtime (EL0004, 207001) and JAX's buffer allocation failure word an OOM their own way: each
    is one of the family, on its device, with no numbers."""
    oom = parse_log(line + "\n").oom
    assert oom is not None
    assert oom.device == device
    assert oom.tried_bytes is None


def test_torch_npus_failed_capture_is_an_out_of_memory_in_graph_capture() -> None:
    """torch_npu reports a failed ACL call as an exception naming the call, its log line, then "[Error]: Failed to
    apply for memory.": an NPU OOM with no numbers, placed by the call the exception names two records before."""
    text = (
        "(EngineCore pid=1) RuntimeError: capture_begin:build/CMakeFiles/torch_npu.dir/compiler_depend.ts:214 NPU "
        "function error: c10_npu::acl::AclmdlRICaptureBegin(capture_stream_, capture_mode), error code is 207005\n"
        "(EngineCore pid=1) [ERROR] 2026-04-17-09:16:39 (PID:2, Device:0, RankID:-1) ERR00100 PTA call acl api failed\n"
        "(EngineCore pid=1) [Error]: Failed to apply for memory.\n"
        "(EngineCore pid=1)         Check the remaining storage space in the hardware environment.\n"
    )
    oom = parse_log(text).oom
    assert oom is not None
    assert (oom.device, oom.phase, oom.tried_bytes) == ("NPU", OomPhase.GRAPH_CAPTURE, None)
    finding = _finding(text)
    assert finding.cause is Cause.CONFIGURATION_OVERSHOOT
    assert "--enforce-eager" in _flags(finding)


def test_xlas_sizes_on_a_line_of_their_own_are_read() -> None:
    """XLA's program-load failure states its sizes on the next line, in its own units (1.13G, 528.72M)."""
    oom = parse_log(
        "RuntimeProgramAllocationFailure: Error loading program 'jit__forward':\n"
        "Attempting to allocate 1.13G. That was not possible. There are 528.72M free.\n"
    ).oom
    assert oom is not None
    assert oom.device == "TPU"
    assert (oom.tried_bytes, oom.free_bytes) == (int(1.13 * 2**30), int(528.72 * 2**20))


def test_neurons_kv_cache_is_sized_by_sequences_and_length_not_a_budget() -> None:
    """AWS Neuron allocates the KV cache at load for max_num_seqs x max_model_len: an allocation failure there
    halves either, and never names gpu_memory_utilization."""
    text = (
        "INFO 01-26 10:27:16 api_server.py:769] args: Namespace(model_tag='m', max_model_len=2048, "
        "max_num_seqs=None, device='neuron')\n"
        "INFO 01-26 10:27:17 llm_engine.py:1] Initializing an LLM engine (v0.6.6) with config: model='m'\n"
        "2025-Jan-26 10:27:42.291398  2998:2998  ERROR  TDRV:log_dev_mem   Failed to allocate 512.000MB (usage: "
        "tensors) on ND 0:NC 0, current utilization:\n"
        "ERROR 01-26 10:27:42 engine.py:381] Traceback (most recent call last):\n"
        'ERROR 01-26 10:27:42 engine.py:381]   File "/venv/vllm/worker/neuron_worker.py", line 66, in load_model\n'
        "ERROR 01-26 10:27:42 engine.py:381]     self.model_runner.load_model()\n"
        'ERROR 01-26 10:27:42 engine.py:381]   File "/venv/transformers_neuronx/decoder.py", line 1816, in '
        "init_caches\n"
        "ERROR 01-26 10:27:42 engine.py:381]     cache = manipulator.duplicate(cpu_cache)\n"
        'ERROR 01-26 10:27:42 engine.py:381] RuntimeError: nrt_tensor_allocate status=4 message="Allocation '
        'Failure"\n'
    )
    finding = _finding(text)
    assert finding.cause is Cause.CONCURRENCY_MISJUDGEMENT
    flags = _flags(finding)
    assert flags["--max-model-len"] == 1024
    assert "--gpu-memory-utilization" not in flags
    oom = parse_log(text).oom
    assert oom is not None
    assert oom.device == "NEURON"
    assert oom.phase is OomPhase.KV_ALLOCATION


def test_v0s_ignored_prompt_longer_than_the_kv_cache_is_a_blowout() -> None:
    """Before 0.2.7, V0 started with a max_model_len its KV cache could not hold and ignored each prompt longer
    than the whole cache: the length it holds, from '# GPU blocks', or how to find it."""
    warning = (
        "WARNING 12-19 10:21:05 scheduler.py:161] Input prompt (1217 tokens) is too long and exceeds the capacity "
        "of block_manager\n"
        "INFO 12-19 10:21:05 async_llm_engine.py:111] Finished request cmpl-b8c7.\n"
    )
    bare = _finding(warning)
    assert bare.cause is Cause.KV_CACHE_BLOWOUT
    assert "1,217" in bare.summary
    assert not bare.recommendations
    assert "# GPU blocks" in bare.steps[0]
    blocks = "INFO 12-19 10:20:00 llm_engine.py:222] # GPU blocks: 70, # CPU blocks: 2048\n"
    assert _flags(_finding(blocks + warning)) == {"--max-model-len": 1120}


def test_a_kv_refusal_broken_over_lines_keeps_its_estimate_and_a_ratio_errs_short() -> None:
    """A paste put V1's refusal on three lines, its estimate ("Based on ...") capitalised on the last: it is
    still vLLM's estimate. Without one, the ratio of the printed GiB is taken at the ends of their rounding that
    fit fewer tokens (1.1 may be 1.05), never above what fits: 20,592 from the bare ratio was above vLLM's 20,512.
    The scaled length is still an upper bound (sliding-window layers or a draft model's cache do not grow with
    the length), so 95 % of it is recommended."""
    refusal = (
        "ValueError: To serve at least one request with the model's max seq len (32768),\n"
        "(1.75 GiB KV cache is needed, which is larger than the available KV cache memory (1.1 GiB).\n"
    )
    estimate = "Based on the available memory, the estimated maximum model length is 20512.\n"
    assert _flags(_finding(refusal + estimate))["--max-model-len"] == 20512
    from_ratio = _flags(_finding(refusal))["--max-model-len"]
    # 19,114 at most; 95 % of it (a part of the KV cache may not grow with the length), rounded down to 16.
    assert from_ratio == math.floor(32768 * (1.1 - 0.05) / (1.75 + 0.05)) * 0.95 // 16 * 16


def test_typographic_quotes_a_paste_made_are_read_as_the_logs_own() -> None:
    line = (
        "ValueError: The model\u2019s max seq len (32768) is larger than the maximum number of tokens that can be "
        "stored in KV cache (1152). Try increasing gpu_memory_utilization or decreasing max_model_len.\n"
    )
    assert _flags(_finding(line)) == {"--max-model-len": 1152}


def test_workers_spanning_gpus_of_unstated_count_get_a_pipeline_stage_not_a_smaller_tensor_parallel_size() -> None:
    """`(Worker_TP0 pid=..)` says several GPUs hold the model, not how many (it was 16): a tensor parallel size
    computed as if today's were 1 said 2, fewer GPUs than the run had. A second pipeline stage halves what each
    GPU holds whatever today's size is."""
    worker = "(Worker_TP0 pid=248987) ERROR 11-05 21:25:41 [multiproc_executor.py:597] "
    oom = _oom("NPU", tried="898.00 MiB", total="60.97 GiB", free="850.00 MiB", process="58.31 GiB",
               allocated="58.21 GiB", stranded="100.00 MiB")  # fmt: skip
    text = _traceback(worker, ["run_engine_core", "load_model", "create_weights"], oom.replace("torch.", ""))
    facts = parse_log(text)
    assert facts.parallel_workers
    flags = _flags(_finding(text))
    assert flags.get("--pipeline-parallel-size") == 2
    assert "--tensor-parallel-size" not in flags
    single = _flags(_finding(_traceback("", ["run_engine_core", "load_model", "create_weights"], oom)))
    assert single["--tensor-parallel-size"] == 2  # one GPU stated by nothing else: 1 -> 2
    assert "--pipeline-parallel-size" not in single


def test_the_model_v1_starts_loading_names_its_weights() -> None:
    """`Starting to load model Qwen/Qwen3-32B...` names the model: its 61 GiB of bf16 weights size the GPUs,
    where the 22.9 GiB PyTorch held when the load failed on a 24 GB card said only 2."""
    prefix = "[vllm]                 | "
    text = (
        f"{prefix}INFO 05-29 04:44:25 [gpu_model_runner.py:1276] Starting to load model Qwen/Qwen3-32B...\n"
        f"{prefix}ERROR 05-29 04:44:26 [core.py:387] "
        + _oom(tried="100.00 MiB", total="23.64 GiB", free="58.81 MiB", process="22.82 GiB", allocated="22.37 GiB")
        + "\n"
    )
    assert parse_log(text).model == "Qwen/Qwen3-32B"
    assert _flags(_finding(text))["--tensor-parallel-size"] == 4  # 65.6 GiB / 4 <= 0.75 x 23.64


def test_v1s_refusal_read_without_the_apostrophe_some_releases_dropped() -> None:
    line = (
        "ValueError: To serve at least one request with the model max seq len (250000), 3.19 GiB KV cache is "
        "needed, which is larger than the available KV cache memory (0.01 GiB). Based on the available memory, the "
        "estimated maximum model length is 256.\n"
    )
    assert _flags(_finding(line)) == {"--max-model-len": 256}


def test_pytorchs_message_wrapped_inside_a_sentence_keeps_its_stranded_memory() -> None:
    """A paste broke "744.36 MiB is reserved by / PyTorch but unallocated." at a capital: the fragment is still
    PyTorch's message, and the 744 MiB it strands (8.7x the 85 MiB short) make it fragmentation."""
    text = (
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 304.00 MiB.\n"
        "GPU 0 has a total capacity of 94.97 GiB of which 218.81 MiB is free.\n"
        "Including non-PyTorch memory, this process has 93.84 GiB memory in use.\n"
        "Of the allocated memory 91.19 GiB is allocated by PyTorch, with 118.00 MiB\n"
        "allocated in private pools (e.g., CUDA Graphs), and 744.36 MiB is reserved by\n"
        "PyTorch but unallocated.\n"
    )
    finding = _finding(text)
    assert finding.cause is Cause.ALLOCATOR_FRAGMENTATION
    assert _flags(finding) == {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}


def test_vllms_hint_on_the_graph_estimate_places_an_oom_in_graph_capture() -> None:
    # A quote that starts at "Tried to allocate" (no "CUDA out of memory."), with vLLM's hint naming the switch of
    # its CUDA-graph memory estimate: the graphs' phase, whose first remedy is no graphs.
    text = (
        "Tried to allocate 136.00 MiB. GPU 0 has a total capacity of 22.36 GiB of which 120.88 MiB is free. If this "
        "problem persists, try setting VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0\n"
    )
    oom = parse_log(text).oom
    assert oom is not None
    assert (oom.phase, oom.total_bytes) == (OomPhase.GRAPH_CAPTURE, int(22.36 * GIB))
    assert "--enforce-eager" in _flags(_finding(text))


def test_a_kv_refusal_pasted_without_its_closing_period_is_read() -> None:
    text = (
        "ValueError: To serve at least one request with the models's max seq len (40960),\n"
        "4.38 GiB KV cache is needed, which is larger than the available KV cache memory (0.85 GiB)\n"
    )
    refusal = parse_log(text).refusal
    assert refusal is not None
    assert (refusal.max_model_len, refusal.needed_gib, refusal.available_gib) == (40960, 4.38, 0.85)


@pytest.mark.parametrize("order", [(3.6, 3.74), (3.74, 3.6)])
def test_of_two_refusals_of_one_length_the_one_with_less_room_is_read(order: tuple[float, float]) -> None:
    """Two runs (or ranks) refusing the same length with different room: the length must fit the tighter."""
    estimate = {3.6: 33664, 3.74: 34944}
    text = "".join(
        "ValueError: To serve at least one request with the model's max seq len (40960), (4.38 GiB KV cache is "
        f"needed, which is larger than the available KV cache memory ({room} GiB). Based on the available memory, "
        f"the estimated maximum model length is {estimate[room]}.\n"
        for room in order
    )
    refusal = parse_log(text).refusal
    assert refusal is not None
    assert (refusal.available_gib, refusal.estimated_max_len) == (3.6, 33664)


def test_a_tpu_runtimes_refused_device_buffer_is_an_oom_of_the_tpu() -> None:
    # PJRT's own line when XLA cannot place a buffer in HBM (no "memory" word in it).
    text = (
        "E0118 22:42:45.737331   20084 tpu_pjrt_client.cc:1889] TpuClient::AllocateBuffer returning error after 1 "
        "attempt(s): RESOURCE_EXHAUSTED: Error allocating device buffer: Attempting to allocate 1.96G.\n"
    )
    oom = parse_log(text).oom
    assert oom is not None
    assert oom.device == "TPU"


@pytest.mark.parametrize(
    ("own", "allocated", "other", "cause"),
    [
        ("70.13", "69.53", "8.96", Cause.DOES_NOT_FIT),  # the load holds most of the card: more GPUs, no budget
        ("6.65", "6.38", "72.40", Cause.CONFIGURATION_OVERSHOOT),  # a leftover process holds it: free the card
    ],
)
def test_a_load_beside_another_process_is_read_by_who_holds_more(
    own: str, allocated: str, other: str, cause: Cause
) -> None:
    text = (
        "ERROR 01-05 22:46:36 [gpu_model_runner.py:3797] Failed to load model - not enough GPU memory. (original "
        "error: CUDA out of memory. Tried to allocate 384.00 MiB. GPU 0 has a total capacity of 79.25 GiB of which "
        f"157.38 MiB is free. Process 1952521 has {other} GiB memory in use. Process 1956684 has {own} GiB memory "
        f"in use. Of the allocated memory {allocated} GiB is allocated by PyTorch, and 100.00 MiB is reserved by "
        "PyTorch but unallocated.)\n"
    )
    finding = _finding(text)
    assert finding.cause is cause
    assert "the card's size is not in the message" not in finding.evidence[0]  # it is: 79.25 GiB
    flags = {r.flag: r.value for r in finding.recommendations}
    if cause is Cause.DOES_NOT_FIT:
        assert flags.get("--tensor-parallel-size") == 2
        assert "--gpu-memory-utilization" not in flags  # no budget caps the load
        assert any("freeing the card first" in line for line in finding.evidence)


def test_a_tpu_runtimes_sizes_give_the_shortfall_and_a_step_sized_on_a_small_card() -> None:
    # PJRT states the allocation and what was free in one-letter binary units, never the chip's memory.
    text = (
        "jax.errors.JaxRuntimeError: RESOURCE_EXHAUSTED: Error allocating device buffer: Attempting to allocate "
        "1002.00M. That was not possible. There are 897.41M free.; (0x0x0_HBM0)\n"
    )
    oom = parse_log(text).oom
    assert oom is not None
    assert (oom.device, oom.tried_bytes, oom.free_bytes) == ("TPU", 1002 * 2**20, int(897.41 * 2**20))
    finding = _finding(text)
    assert finding.recommendations == ()  # the budget set is not in the log: a step, not a value
    assert any("lacked 0.10 GiB" in step and "0.016 on a 16 GiB card" in step for step in finding.steps)
    assert "0.88 GiB free (the card's size is not in the message)" in finding.evidence[0]


@pytest.mark.parametrize(
    ("free", "total", "expected"),
    [
        ("4.04", "119.63", 0.02),  # 2.39 GiB left once 1 % of the card is kept: a small model serves from it
        ("7.34", "139.72", 0.04),
        ("1.54", "22.05", None),  # 1.10 GiB: nothing but the smallest models, so free the GPU
    ],
)
def test_a_card_other_processes_nearly_fill_gets_what_is_left_only_when_it_can_serve(
    free: str, total: str, expected: float | None
) -> None:
    # vLLM 0.13's start check (gpu_worker.py: init_snapshot.free_memory < requested_memory).
    line = (
        f"ValueError: Free memory on device cuda:0 ({free}/{total} GiB) on startup is less than desired GPU memory "
        "utilization (0.9, 99.00 GiB). Decrease GPU memory utilization or reduce GPU memory used by other processes.\n"
    )
    finding = _finding(V1 + line)
    assert finding.cause is Cause.CONFIGURATION_OVERSHOOT
    assert _flags(finding).get("--gpu-memory-utilization") == expected
    assert any("free the GPU first" in line for line in finding.evidence)


def test_tritons_own_out_of_memory_error_is_in_the_family() -> None:
    oom = parse_log("RuntimeError: Triton Error [CUDA]: out of memory\n").oom
    assert oom is not None
    assert oom.tried_bytes is None


def test_pytorchs_message_trimmed_to_the_card_and_the_process_is_read() -> None:
    text = (
        "ERROR: Failed to load model - not enough GPU memory.\n"
        "GPU 0 has a total capacity of 22.03 GiB of which 17.06 MiB is free.\n"
        "Process has 22.01 GiB memory in use.\n"
    )
    oom = parse_log(text).oom
    assert oom is not None
    assert (oom.phase, oom.tried_bytes) == (OomPhase.WEIGHT_LOADING, None)
    assert (oom.total_bytes, oom.process_bytes) == (int(22.03 * GIB), int(22.01 * GIB))
    assert _finding(text).cause is Cause.DOES_NOT_FIT


def test_the_caching_allocators_own_oom_warning_is_read_with_its_numbers() -> None:
    # c10/cuda/CUCachingAllocator.cpp warns before it raises, with the driver's free and total in bytes.
    text = (
        "[rank0]:[W830 12:05:56.439466645 CUDACachingAllocator.cpp:3933] memory allocation failed with OOM on "
        "device 0 while trying to allocate 272629760 bytes (free: 125304832, total: 85017624576).\n"
    )
    oom = parse_log(text).oom
    assert oom is not None
    assert (oom.tried_bytes, oom.free_bytes, oom.total_bytes) == (272629760, 125304832, 85017624576)


def test_zero_bytes_for_a_process_that_allocated_gibs_is_no_measurement() -> None:
    # NVML cannot see the process (a container, a vGPU): PyTorch prints "0 bytes" beside what it allocated itself.
    oom = parse_log(_oom(process="0 bytes", allocated="34.94 GiB") + "\n").oom
    assert oom is not None
    assert oom.process_bytes is None
    assert oom.allocated_bytes == int(34.94 * GIB)


def test_a_full_kv_cache_with_a_queue_behind_it_is_a_finding_without_a_number() -> None:
    stats = (
        "INFO 07-24 12:06:25 [metrics.py:481] Avg prompt throughput: 613.2 tokens/s, Avg generation throughput: 6.3 "
        "tokens/s, Running: 4 reqs, Swapped: 0 reqs, Pending: 36 reqs, GPU KV cache usage: 100.0%, CPU KV cache "
        "usage: 0.0%.\n"
    )
    finding = _finding(stats)
    assert finding.cause is Cause.CONCURRENCY_MISJUDGEMENT
    assert not finding.recommendations
    calm = stats.replace("Pending: 36", "Pending: 2")
    assert not diagnose(evidence(live_evidence=DOWN, log_facts=parse_log(calm))).findings


def _v0_profile(weights: float, utilization: float) -> str:
    budget = 23.64 * utilization
    return (
        "INFO 01-02 10:00:00 [worker.py:1] Memory profiling takes 3.1 seconds\n"
        f"the current vLLM instance can use total_gpu_memory (23.64GiB) x gpu_memory_utilization ({utilization:.2f}) "
        f"= {budget:.2f}GiB\n"
        f"model weights take {weights:.2f}GiB; non_torch_memory takes 0.40GiB; PyTorch activation peak memory takes "
        f"1.50GiB; the rest of the memory reserved for KV Cache is {budget - weights - 1.90:.2f}GiB.\n"
        "ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when "
        "initializing the engine.\n"
    )


def test_weights_that_leave_the_highest_budget_a_sliver_do_not_fit_where_the_budget_would_be_raised() -> None:
    """20.50 GiB of weights on a 23.64 GiB card is 87 %, under the share that decides it alone; but 0.95 x 23.64 -
    (20.50 + 0.40 + 1.50) = 0.06 GiB of KV cache at the highest budget: a sliver, so the weights do not fit. With
    18.50 GiB the same start leaves 2.06 GiB at 0.95: the budget is raised, to (20.40 + 5 % of 23.64) / 23.64."""
    finding = _finding(_v0_profile(20.50, 0.90))
    assert finding.cause is Cause.DOES_NOT_FIT
    assert "--gpu-memory-utilization" not in _flags(finding)
    roomy = _finding(_v0_profile(18.50, 0.80))
    assert roomy.cause is Cause.CONFIGURATION_OVERSHOOT
    assert _flags(roomy)["--gpu-memory-utilization"] == 0.92


def test_weights_larger_than_any_device_do_not_fit_whatever_card_the_log_leaves_unnamed() -> None:
    """V0's profiling line of a 671B model held in unified memory (negative non-torch memory): 339.70 GiB of
    weights per GPU, which no GPU holds. The budget held the line's four parts, 92.61 GiB: the remedies are sized
    against that floor of what the card gives vLLM, so they ask for more, never less."""
    line = (
        "INFO 01-25 07:47:34 worker.py:266] model weights take 339.70GiB; non_torch_memory takes -247.98GiB; "
        "PyTorch activation peak memory takes 1.23GiB; the rest of the memory reserved for KV Cache is -0.34GiB.\n"
    )
    finding = _finding(line)
    assert finding.cause is Cause.DOES_NOT_FIT
    # 339.70 / 8 = 42.46 <= 75 % of 92.61 = 69.46 (4 would be 84.93); 339.70 - 69.46 = 270.24 -> 271.
    assert _flags(finding) == {"--tensor-parallel-size": 8, "--cpu-offload-gb": 271}
    assert "--gpu-memory-utilization" not in _flags(finding)


def test_weights_a_large_card_holds_still_leave_the_budget_to_decide() -> None:
    """The same line with 70 GiB of weights: one 80 GB card or a larger one may hold them, so the card's size
    decides, and the doctor does not call them too large."""
    line = (
        "INFO 01-25 07:47:34 worker.py:266] model weights take 70.00GiB; non_torch_memory takes 0.50GiB; "
        "PyTorch activation peak memory takes 1.23GiB; the rest of the memory reserved for KV Cache is -0.34GiB.\n"
    )
    assert _finding(line).cause is not Cause.DOES_NOT_FIT
