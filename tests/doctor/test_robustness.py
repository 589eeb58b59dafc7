"""Bad input never crashes the doctor: arbitrary log text, and arbitrary numbers in every piece of evidence."""

from __future__ import annotations

import math

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sidecar.doctor.diagnose import diagnose
from sidecar.doctor.histogram import PROMPT_TOKENS, Histogram
from sidecar.doctor.log_parser import parse_log
from sidecar.doctor.render import render_json, render_text
from sidecar.doctor.traffic import Traffic
from tests.doctor.builders import (
    args,
    cache_config,
    engine,
    evidence,
    gpu,
    gpu_status,
    gpus,
    history,
    live,
    log,
    reading,
)

FRAGMENTS = [
    "non-default args: {'max_model_len': ",
    "args: Namespace(max_num_seqs=",
    "Initializing a V1 LLM engine (v",
    ") with config: max_seq_len=",
    "GPU KV cache size: ",
    " tokens, Maximum concurrency for ",
    " tokens per request: ",
    "Available KV cache memory: ",
    " GiB",
    "Model loading took ",
    "To serve at least one request with the model's max seq len (",
    "), (",
    " GiB KV cache is needed, which is larger than the available KV cache memory (",
    "The model's max seq len (",
    ") is larger than the maximum number of tokens that can be stored in KV cache (",
    "No available memory for the cache blocks",
    "Free memory on device (",
    "/",
    " GiB) on startup is less than desired GPU memory utilization (",
    "CUDA out of memory. Tried to allocate ",
    ". GPU 0 has a total capacity of ",
    " of which ",
    " is free. Process 7 has ",
    " memory in use. Including non-PyTorch memory, this process has ",
    "Traceback (most recent call last)",
    "capture_model",
    "profile_run",
    "# GPU blocks: ",
    "model weights take ",
    "GiB; non_torch_memory takes ",
    "\n",
]
NUMBERS = st.one_of(
    st.integers(-(10**12), 10**12).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(str),
    st.sampled_from(["1.2.3", "1,2,3", "0", "-0.0", "1e400", "None", "", "MiB", "GiB", "x"]),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.one_of(st.sampled_from(FRAGMENTS), NUMBERS, st.text(max_size=20)), max_size=60))
def test_any_log_text_parses_without_raising(pieces: list[str]) -> None:
    facts = parse_log("".join(pieces))
    assert facts.lines_recognised >= 0


def _histogram(values: list[float]) -> Histogram:
    bounds = sorted({*values[:-1], math.inf})
    cumulative = [(bound, float(index + 1)) for index, bound in enumerate(bounds)]
    return Histogram(family=PROMPT_TOKENS, count=int(values[-1]), sum=values[0], buckets=tuple(cumulative))


FINITE = st.floats(min_value=-1e15, max_value=1e15, allow_nan=False)
SIZES = st.integers(min_value=0, max_value=2**42)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    prompt=st.lists(FINITE, min_size=1, max_size=6),
    output=st.lists(FINITE, min_size=1, max_size=6),
    pool=st.one_of(st.none(), st.integers(-10, 10**7)),
    utilization=st.one_of(st.none(), st.floats(-1, 2, allow_nan=False)),
    preemptions=st.one_of(st.none(), FINITE),
    max_model_len=st.one_of(st.none(), st.integers(-10, 10**7)),
    total=SIZES,
    used=SIZES,
    other=SIZES,
    growth=st.one_of(st.none(), FINITE),
    weights=st.one_of(st.none(), FINITE),
    kv=st.one_of(st.none(), FINITE),
    seqs=st.one_of(st.none(), st.integers(-5, 10**6)),
    version=st.sampled_from([None, "0.6.6", "0.10.2", "0.32.0", "garbage"]),
)
def test_any_numbers_in_the_evidence_give_a_diagnosis_not_an_exception(
    *,
    prompt: list[float],
    output: list[float],
    pool: int | None,
    utilization: float | None,
    preemptions: float | None,
    max_model_len: int | None,
    total: int,
    used: int,
    other: int,
    growth: float | None,
    weights: float | None,
    kv: float | None,
    seqs: int | None,
    version: str | None,
) -> None:
    load = Traffic(prompt=_histogram(prompt), generation=_histogram(output), max_tokens=None, e2e_latency=None)
    config = cache_config(kv_cache_size_tokens=pool, gpu_memory_utilization=utilization)
    vllm = reading(engine(cache_config=config, preemptions_total=preemptions))
    device = gpu(used=used, total=total, others=((7, other, "trainer"),))
    trend = gpu_status(0, memory_growth_bytes_per_second=growth, memory_growth_fit_r2=0.9, time_to_oom_seconds=growth)
    ev = evidence(
        live_evidence=live(version=version, max_model_len=max_model_len, vllm=vllm, load=load),
        gpu_evidence=gpus(device),
        log_facts=log(args=args(max_num_seqs=seqs), weights_gib=weights, available_kv_gib=kv),
        history_facts=history(trend),
    )
    result = diagnose(ev)
    assert render_text(result)
    assert render_json(result)
