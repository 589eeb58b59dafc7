"""A log read as records: the prefix each line carries, learned from the log itself, and wrapped messages put back
together (sidecar/doctor/log_records.py)."""

from __future__ import annotations

import pytest

from sidecar.doctor.log_parser import parse_log
from sidecar.doctor.log_records import loose, records
from sidecar.doctor.logfacts import RefusalKind

V1_REFUSAL = (
    "ValueError: To serve at least one request with the models's max seq len (1048576), (22.5 GiB KV cache is "
    "needed, which is larger than the available KV cache memory (14.57 GiB). Based on the available memory, the "
    "estimated maximum model length is 678112. Try increasing `gpu_memory_utilization` or decreasing "
    "`max_model_len` when initializing the engine."
)

# Each: a line of each kind an operator's tooling writes, then the payload the prefix leaves.
PREFIXED = {
    "launcher": ("2025-05-01 12:00:{n:02d} | ERROR | stderr | ", "2025-05-01 12:00:07 | ERROR | stderr | "),
    "vllm v1": ("(EngineCore_DP0 pid=43) ERROR 03-20 17:39:{n:02d} [core.py:1100] ", None),
    "vllm v0": ("ERROR 11-14 22:13:{n:02d} engine.py:135] ", None),
    "ray in v1": (
        "(APIServer pid=1) (DPEngineCoreActor pid=9, ip=10.0.0.7) ERROR 05-01 10:00:{n:02d} [core.py:9] ",
        None,
    ),
    "journald": ("Nov 26 03:41:{n:02d} gpu-node-3 vllm[1234]: ", None),
    "compose": ("vllm-1  | INFO 11-18 18:07:{n:02d} engine.py:366] ", None),
    "kubectl": ("2026-11-26T03:41:{n:02d}.084084123Z ", None),
    "lemonade": (
        "2026-05-08 11:47:{n:02d}.257 [Error] (Process) (EngineCore pid=2651) ERROR 05-08 11:47:02 [core.py:1136] ",
        None,
    ),
}


@pytest.mark.parametrize("name", sorted(PREFIXED))
def test_the_prefix_is_learned_from_the_lines_that_share_it(name: str) -> None:
    template, _ = PREFIXED[name]
    body = ["Traceback (most recent call last):", '  File "/x/vllm/v1/worker/gpu_worker.py", line 1, in load_model',
            "    self.model_runner.load_model()", "torch.OutOfMemoryError: CUDA out of memory."]  # fmt: skip
    text = "\n".join(template.format(n=n) + line for n, line in enumerate(body))
    read = records(text)
    assert [record.payload for record in read] == body
    assert all(record.prefix == template.format(n=n) for n, record in enumerate(read))


# Launchers' tags that no token shape describes, before vLLM's own prefix or none: learned from their words.
TAGGED = {
    "djl serving": "WARN  PyProcess W-252-model-stderr: ",
    "a job's stderr": "serve-job.err: ",
    "both, then vllm's": "serve-job.err: WARN  PyProcess W-7-model-stderr: (EngineCore_DP0 pid=7) ERROR 03-20 ",
}


@pytest.mark.parametrize("name", sorted(TAGGED))
def test_a_launchers_tag_that_every_line_repeats_is_learned_as_its_prefix(name: str) -> None:
    tag = TAGGED[name]
    body = [
        "Traceback (most recent call last):",
        '  File "/x/vllm/worker/worker.py", line 125, in warm_up_model',
        "    self.model_runner.capture_model(self.gpu_cache)",
        "torch.OutOfMemoryError: CUDA out of memory.",
    ]
    read = records("\n".join(tag + line for line in body))
    assert [(record.prefix, record.payload) for record in read] == [(tag, line) for line in body]


def test_a_message_that_many_lines_start_with_is_no_tag() -> None:
    """vLLM's stats lines all start `Engine 000:` after its prefix, but nothing prefix-like or a traceback follows
    it: the message keeps its words."""
    stats = "INFO 02-27 07:36:{n:02d} [loggers.py:257] "
    body = "Engine 000: Avg prompt throughput: 0.0 tokens/s, Running: 189 reqs, Waiting: 766 reqs"
    read = records("\n".join(stats.format(n=n) + body for n in range(6)))
    assert [record.payload for record in read] == [body] * 6


def test_a_progress_bar_many_lines_start_with_is_no_tag() -> None:
    bars = [f"Loading safetensors checkpoint shards:   {n}0% Completed | {n}/10 [00:0{n}<00:09]" for n in range(1, 8)]
    read = records("\n".join([*bars, "Traceback (most recent call last):", '  File "/x/vllm/y.py", line 1, in f']))
    assert [record.prefix for record in read] == [""] * 9


def test_a_short_paste_with_a_tag_on_each_line_reads_the_error_after_it() -> None:
    refusal = parse_log("serve-job.err: " + V1_REFUSAL).refusal
    assert refusal is not None
    assert (refusal.max_model_len, refusal.estimated_max_len) == (1048576, 678112)


def test_an_excerpt_cut_inside_the_next_lines_prefix_drops_that_fragment() -> None:
    tag = "Nov 26 03:41:{n:02d} gpu-node-3 vllm[1234]: WARN  PyProcess W-252-model-stderr: "
    lines = [tag.format(n=n) + f'  File "/x/vllm/worker/worker.py", line {n}, in warm_up_model' for n in range(3)]
    read = records("\n".join([*lines, "Nov 26 03:41:03 gpu-node-3 vllm[1234]: WARN  PyPro"]))
    assert [record.text for record in read] == lines


def test_a_line_that_starts_with_a_number_is_not_a_prefix_of_its_own() -> None:
    """The KV refusal a terminal wrapped after the comma: `22.5 GiB ...` continues the line before it."""
    head, tail = V1_REFUSAL.split(", (", 1)
    prefix = "(EngineCore_DP0 pid=43) ERROR 03-20 17:39:14 [core.py:1100] "
    lines = [prefix + "EngineCore failed to start.", prefix + "Traceback (most recent call last):", prefix + head + ",",
             tail[:-10], tail[-10:]]  # fmt: skip
    read = records("\n".join(lines))
    assert len(read) == 3
    refusal = parse_log("\n".join(lines)).refusal
    assert refusal is not None
    assert (refusal.kind, refusal.max_model_len, refusal.estimated_max_len) == (
        RefusalKind.MAX_LEN_EXCEEDS_KV,
        1048576,
        678112,
    )


@pytest.mark.parametrize("cut", [60, 61, 97, 150])
def test_a_bare_message_wrapped_anywhere_reads_as_one(cut: int) -> None:
    """A bare paste (no prefix at all) wrapped at a fixed width, inside a word or at a space the paste dropped."""
    wrapped = V1_REFUSAL[:cut].rstrip(" ") + "\n" + V1_REFUSAL[cut:].lstrip(" ")
    refusal = parse_log("Traceback (most recent call last):\n" + wrapped).refusal
    assert refusal is not None
    assert (refusal.max_model_len, refusal.needed_gib, refusal.estimated_max_len) == (1048576, 22.5, 678112)


def test_a_wrap_just_before_closing_punctuation_joins_without_a_space() -> None:
    """A terminal 80 columns wide cut vLLM's free-memory refusal after 'GiB': the ')' line cannot start a record."""
    wrapped = (
        "(EngineCore pid=42103) ValueError: Free memory on device cuda:0 (13.33/15.47 GiB\n"
        ") on startup is less than desired GPU memory utilization (0.9, 13.92 GiB). Decre\n"
        "ase GPU memory utilization or reduce GPU memory used by other processes.\n"
    )
    (record,) = records(wrapped)
    assert "(13.33/15.47 GiB) on startup" in record.text
    refusal = parse_log(wrapped).refusal
    assert refusal is not None
    assert refusal.kind is RefusalKind.INSUFFICIENT_FREE_MEMORY
    assert (refusal.free_gib, refusal.total_gib, refusal.utilization) == (13.33, 15.47, 0.9)


def test_a_traceback_keeps_its_lines_and_an_unprefixed_wrap_joins_the_line_before() -> None:
    text = "\n".join(
        [
            "INFO 05-01 12:00:00 [core.py:1] one",
            "INFO 05-01 12:00:01 [core.py:1] two, cut by the",
            "terminal here",
            "Traceback (most recent call last):",
            '  File "x.py", line 1, in f',
            "    g()",
            "RuntimeError: CUDA error: out of memory",
        ]
    )
    read = records(text)
    assert [record.payload for record in read] == [
        "one",
        "two, cut by theterminal here",  # a letter on each side: read as a cut word; loose patterns absorb it
        "Traceback (most recent call last):",
        '  File "x.py", line 1, in f',
        "    g()",
        "RuntimeError: CUDA error: out of memory",
    ]


def test_a_hanging_indent_continues_the_message_above_it_and_a_clock_time_starts_a_record() -> None:
    """A logger (or a note's author) that wraps a long message under itself, at the column its message starts;
    a record whose head is the log's only one of its shape still starts at its clock time."""
    at = " " * len("22:12:16  INFO [worker.py:295] ")
    text = "\n".join(
        [
            "22:12:15  INFO [worker.py:295] Memory profiling takes 257.11 seconds",
            "22:12:16  INFO [worker.py:295] model weights take 6.59GiB; non_torch_memory takes 8.29GiB;",
            at + "PyTorch activation peak memory takes 4.93GiB;",
            at + "the rest of the memory reserved for KV Cache is -7.83GiB.",
            "22:12:16.774710Z [error] vLLM model 'm' failed: No available memory",
            " " * len("22:12:16.774710Z [error] ") + "for the cache blocks. Try increasing `gpu_memory_utilization`.",
            "Traceback (most recent call last):",
            " " * 2 + 'File "x.py", line 1, in f',
        ]
    )
    read = [record.text for record in records(text)]
    assert read[1] == (
        "22:12:16  INFO [worker.py:295] model weights take 6.59GiB; non_torch_memory takes 8.29GiB; PyTorch activation"
        " peak memory takes 4.93GiB; the rest of the memory reserved for KV Cache is -7.83GiB."
    )
    assert read[2].endswith("No available memory for the cache blocks. Try increasing `gpu_memory_utilization`.")
    assert read[3:] == ["Traceback (most recent call last):", '  File "x.py", line 1, in f']
    facts = parse_log(text)
    assert facts.refusal is not None
    assert facts.refusal.kind is RefusalKind.NO_CACHE_MEMORY
    assert facts.profile is not None


def test_the_rank_and_the_process_come_from_the_prefix() -> None:
    text = "\n".join(
        f"(VllmWorker rank={rank} pid={100 + rank}) ERROR 05-10 16:00:15 [multiproc_executor.py:470] line {rank}"
        for rank in (0, 1, 1)
    )
    read = records(text)
    assert [record.rank for record in read] == [0, 1, 1]
    assert read[1].process == "(VllmWorker rank=1 pid=101)"
    assert records("[rank3]: torch.OutOfMemoryError: x\n[rank3]: y")[0].rank == 3
    assert records("plain line")[0].rank is None
    # V1's multiproc workers: the underscore before TP is a word character, so a \b there never matched.
    worker = records(
        "(Worker_TP3 pid=9) ERROR 11-05 21:25:41 [x.py:1] a\n(Worker_TP3 pid=9) ERROR 11-05 21:25:41 [x.py:1] b"
    )
    assert [(record.rank, record.tp_rank, record.parallel_worker) for record in worker] == [(3, 3, True)] * 2


def test_colours_are_dropped_real_or_pasted() -> None:
    assert records("\x1b[1;36m(EngineCore pid=1)\x1b[0;0m hi")[0].text == "(EngineCore pid=1) hi"
    assert records("^[[1;36m(EngineCore pid=1)^[[0;0m hi")[0].text == "(EngineCore pid=1) hi"


def test_a_loose_pattern_takes_any_whitespace_where_the_pattern_has_a_space() -> None:
    pattern = loose(r"KV cache is needed[ ,]")
    assert pattern.search("KV cacheis\n  needed,")
    assert pattern.search("KV cache is needed ")
    assert not pattern.search("KV cache is needed;")


def test_a_loose_pattern_takes_whitespace_a_wrap_put_inside_a_parenthesis() -> None:
    pattern = loose(r"stored in KV cache \((\d+)\)")
    found = pattern.search("stored in KV cache ( 3984 )")
    assert found is not None
    assert found.group(1) == "3984"
    assert not loose(r"cache \(x\)").search("cache (y)")


def test_a_v0_refusal_wrapped_inside_its_parenthesis_keeps_the_size() -> None:
    """A terminal wrapped the sentence right after "KV cache (": the size on the next line is still the size."""
    text = (
        "ValueError: The model's max seq len (30000) is larger than the maximum number of tokens that can be "
        "stored in KV cache (\n3984). Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when "
        "initializing the engine."
    )
    refusal = parse_log(text).refusal
    assert refusal is not None
    assert refusal.kind is RefusalKind.MAX_LEN_EXCEEDS_KV
    assert refusal.capacity_tokens == 3984


def test_a_run_of_loose_lines_is_cut_into_bounded_records() -> None:
    """A bare log of lines that each continue the one before (no prefix, lower case) is not one record of the
    whole file: a wrapped message is never 64 KiB long, and building one would be quadratic."""
    read = records("a plain line that starts in lower case\n" * 20000)
    assert len(read) > 1
    assert max(len(record.text) for record in read) <= 65536
    assert sum(len(record.text) for record in read) == 20000 * len("a plain line that starts in lower case")


def test_pytorchs_message_on_lines_of_its_own_reads_as_one() -> None:
    """A note's author broke PyTorch's message at its sentences: each starts with a capital (so no line continues
    the one before it), and the line that starts with a number is a wrap, not a prefix of its own."""
    text = "\n".join(
        [
            "torch.OutOfMemoryError: HIP out of memory. Tried to allocate 222.00 MiB.",
            "GPU 0 has a total capacity of 23.98 GiB of which 26.00 MiB is free.",
            "Of the allocated memory 23.59 GiB is allocated by PyTorch, and",
            "69.27 MiB is reserved by PyTorch but unallocated.",
        ]
    )
    assert [record.prefix for record in records(text)] == ["", "", ""]
    oom = parse_log(text).oom
    assert oom is not None
    assert (oom.device, oom.total_bytes, oom.free_bytes) == ("HIP", int(23.98 * 2**30), 26 * 2**20)
    assert oom.allocated_bytes == int(23.59 * 2**30)
    assert oom.reserved_unallocated_bytes == int(69.27 * 2**20)


def test_torchs_rank_prefixed_warning_starts_a_record_of_its_own() -> None:
    """c10's `[rank0]:[W318 13:41:30.26 ProcessGroupNCCL.cpp:1565] Warning: ...` after vLLM's last line is a record
    of its own, not a terminal's wrap of the refusal before it."""
    text = "\n".join(
        [
            "(EngineCore_DP0 pid=191) ERROR 03-18 13:41:29 [core.py:866] ValueError: No available memory for the "
            "cache blocks.",
            "(EngineCore_DP0 pid=191) ERROR 03-18 13:41:29 [core.py:866] raise",
            "[rank0]:[W318 13:41:30.265537082 ProcessGroupNCCL.cpp:1565] Warning: WARNING: destroy_process_group() "
            "was not called before program exit",
            "W0318 13:41:31.000000 191 torch/distributed/elastic/x.py:1] closing",
        ]
    )
    assert [record.payload for record in records(text)] == [
        "ValueError: No available memory for the cache blocks.",
        "raise",
        "[rank0]:[W318 13:41:30.265537082 ProcessGroupNCCL.cpp:1565] Warning: WARNING: destroy_process_group() was "
        "not called before program exit",
        "W0318 13:41:31.000000 191 torch/distributed/elastic/x.py:1] closing",
    ]


def test_a_block_indented_as_a_whole_joins_its_wrapped_sentences_and_keeps_a_tracebacks_lines() -> None:
    """Markdown's code block: every line four spaces in. A sentence wrapped inside it continues at the block's
    indent (lowercase, or after a long line no sentence's end closed); a traceback's lines, further in or
    starting a record, stay apart."""
    text = "\n".join(
        [
            "    Tried to allocate 136.00 MiB. GPU 0 has a total capacity of 22.36 GiB of",
            "    which 120.88 MiB is free. If this problem persists, try setting",
            "    VLLM_SOME_SETTING=0",
            "    Traceback (most recent call last):",
            '      File "x.py", line 1, in f',
            "        g()",
            "    RuntimeError: CUDA error: out of memory",
            "    Short line.",
            "    Another record",
        ]
    )
    assert [record.payload.strip() for record in records(text)] == [
        "Tried to allocate 136.00 MiB. GPU 0 has a total capacity of 22.36 GiB of which 120.88 MiB is free. If "
        "this problem persists, try setting VLLM_SOME_SETTING=0",
        "Traceback (most recent call last):",
        'File "x.py", line 1, in f',
        "g()",
        "RuntimeError: CUDA error: out of memory",
        "Short line.",
        "Another record",
    ]


def test_a_sentence_cut_at_its_comma_goes_on_in_the_indented_line_under_it() -> None:
    text = "\n".join(
        [
            "ValueError: To serve at least one request with the model's max seq len (16384),",
            "  5.0 GiB KV cache is needed, which is larger than the available KV cache memory (0.3 GiB).",
            "  Based on the available memory, the estimated maximum model length is 976.",
        ]
    )
    refusal = parse_log(text).refusal
    assert refusal is not None
    assert (refusal.max_model_len, refusal.needed_gib, refusal.estimated_max_len) == (16384, 5.0, 976)


@pytest.mark.parametrize("bar", ["> ", "\u258e ", "\u2502 "])
def test_a_quoted_paste_learns_its_bar_and_joins_the_lines_a_wrap_made_under_it(bar: str) -> None:
    """A quote copied from a rendered page keeps its bar on every line, the wrapped ones too."""
    text = "\n".join(
        bar + line
        for line in [
            "Available KV cache memory: 22.5 GiB",
            "ValueError: To serve at least one request with the model's max seq len (196608),",
            "23.25 GiB KV cache is needed, which is larger than the available KV cache memory (22.5 GiB).",
            "Based on the available memory, the estimated maximum model length is 190272.",
        ]
    )
    assert records(text)[0].payload == "Available KV cache memory: 22.5 GiB"
    refusal = parse_log(text).refusal
    assert refusal is not None
    assert (refusal.max_model_len, refusal.needed_gib, refusal.estimated_max_len) == (196608, 23.25, 190272)


@pytest.mark.parametrize(
    ("lines", "estimated"),
    [
        # A note's author wrapped it after a word, before a capitalised one, and elided the middle with "...".
        (
            [
                "ValueError: To serve at least one request with the model's max seq len",
                "(131072), (6.68 GiB KV cache is needed, which is larger than the available",
                "KV cache memory (2.18 GiB). ... estimated maximum model length is 42752.",
            ],
            42752,
        ),
        # A release that words the last sentence on its own, capitalised.
        (
            [
                "ValueError: To serve at least one request with the model's max seq len",
                "(1000000), 3.09 GiB KV cache is needed, which is larger than the available",
                "KV cache memory (0.24 GiB). Estimated maximum model length is 57344.",
            ],
            57344,
        ),
        # That sentence on a line of its own, capitalised, after a line the message ends cleanly.
        (
            [
                "ValueError: To serve at least one request with the model's max seq len (32768),",
                "3.01 GiB KV cache is needed, which is larger than the available KV cache memory (2.6 GiB).",
                "Estimated maximum model length is 22016.",
            ],
            22016,
        ),
        (
            [
                "ValueError: To serve at least one request with the model's max seq len (65536), 9.48 GiB KV cache",
                "is needed, which is larger than the available KV cache memory (4.42 GiB). ... the estimated",
                "maximum model length is 11656.",
            ],
            11656,
        ),
    ],
)
def test_a_refusal_wrapped_before_a_capital_or_elided_keeps_vllms_estimate(lines: list[str], estimated: int) -> None:
    """vLLM's estimate is the length to give: the KV cache need is not always proportional to the length (a
    fixed part per request), so one scaled from the two sizes can be far above it (30,496 against 11,656)."""
    refusal = parse_log("\n".join(lines)).refusal
    assert refusal is not None
    assert refusal.estimated_max_len == estimated


def test_a_short_line_ended_by_a_word_does_not_take_the_capitalised_line_after_it() -> None:
    """Only a line long enough to have been wrapped: a short one is a line of its own."""
    read = records("Loading the model now\nNCCL version 2.21.5+cuda12.4")
    assert [record.payload for record in read] == ["Loading the model now", "NCCL version 2.21.5+cuda12.4"]
