"""The load test's options, length distributions and prompts (pure)."""

from __future__ import annotations

import statistics

import pytest

from sidecar.loadtest.spec import (
    WORDS,
    LengthKind,
    LengthSpec,
    LoadSpec,
    PromptEntry,
    SpecError,
    check_fits,
    is_shared,
    longest_request_tokens,
    parse_length,
    parse_prompts,
    plan_request,
    seeded,
)

URL = "http://127.0.0.1:8000"


def spec(**overrides: object) -> LoadSpec:
    options: dict[str, object] = {"url": URL, "concurrency": 2, "max_requests": 10, "run_tag": "rt"}
    options.update(overrides)
    return LoadSpec(**options)  # type: ignore[arg-type]


def test_fixed_length() -> None:
    length = parse_length("128", "--output-tokens")
    assert length == LengthSpec(kind=LengthKind.FIXED, low=128, high=128)
    assert {length.sample(seeded(str(seed))) for seed in range(5)} == {128}
    assert (str(length), length.upper_tokens) == ("128", 128)


def test_uniform_length_stays_in_range_and_covers_it() -> None:
    length = parse_length("uniform:10-20", "--prompt-tokens")
    rng = seeded("1")
    draws = [length.sample(rng) for _ in range(2000)]
    assert (min(draws), max(draws)) == (10, 20)
    assert (str(length), length.upper_tokens) == ("uniform:10-20", 20)


def test_normal_length_is_clamped_to_one_and_has_the_asked_mean() -> None:
    wide = parse_length("normal:3,50", "--output-tokens")
    rng = seeded("2")
    assert min(wide.sample(rng) for _ in range(2000)) == 1
    narrow = parse_length("normal:500,20", "--output-tokens")
    draws = [narrow.sample(rng) for _ in range(4000)]
    assert statistics.mean(draws) == pytest.approx(500, abs=2)
    assert statistics.stdev(draws) == pytest.approx(20, abs=2)
    assert narrow.upper_tokens == 580
    assert str(narrow) == "normal:500,20"


@pytest.mark.parametrize(
    "text", ["", "0", "-5", "abc", "uniform:5", "uniform:9-3", "uniform:0-3", "normal:0,1", "normal:5", "normal:5,-1"]
)
def test_bad_lengths_name_the_flag(text: str) -> None:
    with pytest.raises(SpecError, match="--prompt-tokens"):
        parse_length(text, "--prompt-tokens")


def test_requests_are_reproducible_and_unique_from_their_first_word() -> None:
    load = spec(prompt_tokens=parse_length("uniform:5-30", "p"), output_tokens=parse_length("uniform:1-9", "o"))
    first = [plan_request(load, index) for index in range(50)]
    assert first == [plan_request(load, index) for index in range(50)]
    words = [planned.prompt.split() for planned in first]
    assert len({prompt[0] for prompt in words}) == 50
    assert all(prompt[0] not in WORDS for prompt in words)
    assert all(
        5 <= len(prompt) <= 30 and len(prompt) == planned.prompt_words
        for prompt, planned in zip(words, first, strict=True)
    )
    assert all(1 <= planned.max_tokens <= 9 and planned.prefix_group is None for planned in first)
    other_run = spec(prompt_tokens=load.prompt_tokens, output_tokens=load.output_tokens, run_tag="other")
    assert plan_request(other_run, 0).prompt.split()[0] != words[0][0]


@pytest.mark.parametrize("ratio", [0.0, 0.1, 0.25, 0.5, 0.9, 1.0])
def test_shared_requests_are_spread_evenly(ratio: float) -> None:
    for count in (1, 7, 40, 100):
        shared = sum(is_shared(index, ratio) for index in range(count))
        assert abs(shared - count * ratio) <= 1


def test_shared_prefixes_are_shared_and_nothing_else_is() -> None:
    load = spec(
        prompt_tokens=parse_length("20", "p"), shared_prefix_ratio=0.5, shared_prefixes=3, shared_prefix_tokens=8
    )
    planned = [plan_request(load, index) for index in range(60)]
    shared = [request for request in planned if request.prefix_group is not None]
    assert len(shared) == 30
    prefixes = {tuple(request.prompt.split()[:8]) for request in shared}
    assert len(prefixes) == 3
    assert {request.prefix_group for request in shared} == {0, 1, 2}
    # After the prefix, each shared request has its own word: the rest of it is not shared.
    assert len({request.prompt.split()[8] for request in shared}) == 30
    unique_first = [request.prompt.split()[0] for request in planned if request.prefix_group is None]
    assert len(set(unique_first)) == 30
    assert not set(unique_first) & {prefix[0] for prefix in prefixes}
    assert all(len(request.prompt.split()) == 20 for request in planned)


def test_a_shared_prompt_is_at_least_the_prefix_and_one_word() -> None:
    load = spec(prompt_tokens=parse_length("4", "p"), shared_prefix_ratio=1.0, shared_prefix_tokens=10)
    assert plan_request(load, 0).prompt_words == 11
    assert longest_request_tokens(load) == (11, 128)


def test_prompts_file_entries_are_sent_in_turn() -> None:
    prompts = parse_prompts('{"prompt": "a b c", "max_tokens": 7}\n\n{"prompt": "d e"}\n', "p.jsonl")
    assert prompts == (PromptEntry(prompt="a b c", max_tokens=7), PromptEntry(prompt="d e", max_tokens=None))
    load = spec(prompts=prompts, output_tokens=parse_length("3", "o"))
    sent = [plan_request(load, index) for index in range(4)]
    assert [(request.prompt, request.max_tokens) for request in sent] == [("a b c", 7), ("d e", 3)] * 2
    assert longest_request_tokens(load) == (3, 7)


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("not json", "line 1: not JSON"),
        ('{"prompt": ""}', 'non-empty string "prompt"'),
        ('{"text": "x"}', 'non-empty string "prompt"'),
        ('{"prompt": "x", "max_tokens": 0}', '"max_tokens" must be'),
        ('{"prompt": "x", "max_tokens": true}', '"max_tokens" must be'),
        ("\n\n", "no prompts"),
    ],
)
def test_bad_prompts_files(text: str, error: str) -> None:
    with pytest.raises(SpecError, match=error):
        parse_prompts(text, "p.jsonl")


@pytest.mark.parametrize(
    ("overrides", "error"),
    [
        ({"url": "127.0.0.1:8000"}, "--url"),
        ({"rate_per_s": 5.0}, "exactly one of --rate"),
        ({"concurrency": None}, "exactly one of --rate"),
        ({"concurrency": 0}, "--concurrency"),
        ({"concurrency": None, "rate_per_s": 0.0}, "--rate"),
        ({"max_requests": None}, "--duration and/or --max-requests"),
        ({"duration_s": -1.0}, "--duration"),
        ({"timeout_s": 0.0}, "--timeout"),
        ({"max_in_flight": 0}, "--max-in-flight"),
        ({"shared_prefix_ratio": 1.5}, "--shared-prefix-ratio"),
        ({"shared_prefixes": 0}, "--shared-prefixes"),
        ({"shared_prefix_tokens": 0}, "--shared-prefix-tokens"),
        ({"max_error_rate": 2.0}, "--max-error-rate"),
        ({"prompts": (PromptEntry(prompt="x", max_tokens=None),), "shared_prefix_ratio": 0.5}, "--prompts-file"),
    ],
)
def test_bad_options(overrides: dict[str, object], error: str) -> None:
    with pytest.raises(SpecError, match=error):
        spec(**overrides)


def test_lengths_are_checked_against_max_model_len() -> None:
    load = spec(prompt_tokens=parse_length("uniform:100-1000", "p"), output_tokens=parse_length("normal:100,10", "o"))
    check_fits(load, 1140)
    with pytest.raises(SpecError, match=r"up to 1000 tokens plus an output of up to 140 tokens exceeds .* 1139"):
        check_fits(load, 1139)
