"""The options of one load test, the length distributions and the prompts. Pure: no I/O, no clock.

Prompts are made of words from a short list of common English words, each about one token for real
tokenizers and exactly one for the simulator (which counts whitespace-separated words). Every prompt
starts with a word unique to its request and to this run (`run_tag`), so nothing is shared by accident,
not even with an earlier run's prefix cache; a request chosen to share a prefix starts with one of the
run's common prefixes instead, followed by its unique word.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass
from enum import StrEnum

MAX_LENGTH_TOKENS = 10_000_000  # a bound, not a promise: no server takes prompts this long
MAX_DURATION_S = 7 * 86_400.0
MAX_REQUESTS = 100_000_000
MAX_WORKERS = 100_000
MAX_RATE_PER_S = 1_000_000.0
MAX_TIMEOUT_S = 86_400.0
MAX_PROMPT_ENTRIES = 10_000_000
_NORMAL_UPPER_SD = 4.0  # a normal length is checked against max_model_len up to mean + 4 SD

_WORD_TEXT = (
    "the of and to in is you that it he was for on are as with his they at be this have from or one had by "
    "word but not what all were we when your can said there use an each which she do how their if will up "
    "other about out many then them these so some her would make like him into time has look two more write "
    "go see number no way could people my than first water been call who oil its now find long down day did "
    "get come made may part over new sound take only little work know place year live me back give most very "
    "after thing our just name good sentence man think say great where help through much before line right "
    "too mean old any same tell boy follow came want show also around form three small set put end does "
    "another well large must big even such because turn here why ask went men read need land different home "
    "us move try kind hand picture again change off play spell air away animal house point page letter mother "
    "answer found study still learn should world high every near add food between own below country plant"
)
WORDS: tuple[str, ...] = tuple(_WORD_TEXT.split())


class SpecError(ValueError):
    """An option is out of range or inconsistent; the message is one line naming it."""


class Api(StrEnum):
    COMPLETIONS = "completions"  # POST /v1/completions with a prompt
    CHAT = "chat"  # POST /v1/chat/completions with one user message


class LengthKind(StrEnum):
    FIXED = "fixed"
    UNIFORM = "uniform"
    NORMAL = "normal"


@dataclass(frozen=True, slots=True, kw_only=True)
class LengthSpec:
    """A number of tokens: fixed, uniform on [low, high], or normal(mean, sd) rounded and clamped >= 1."""

    kind: LengthKind
    low: int = 1  # fixed: the value; uniform: the least
    high: int = 1  # fixed: the value; uniform: the most
    mean: float = 0.0  # normal only
    sd: float = 0.0  # normal only

    def sample(self, rng: random.Random) -> int:
        if self.kind is LengthKind.FIXED:
            return self.low
        if self.kind is LengthKind.UNIFORM:
            return rng.randint(self.low, self.high)
        return min(MAX_LENGTH_TOKENS, max(1, round(rng.gauss(self.mean, self.sd))))

    @property
    def upper_tokens(self) -> int:
        """The longest length drawn in practice (a normal: mean + 4 SD, exceeded once in 30 000 draws)."""
        if self.kind is LengthKind.NORMAL:
            return min(MAX_LENGTH_TOKENS, max(1, math.ceil(self.mean + _NORMAL_UPPER_SD * self.sd)))
        return self.high

    def __str__(self) -> str:
        if self.kind is LengthKind.FIXED:
            return str(self.low)
        if self.kind is LengthKind.UNIFORM:
            return f"uniform:{self.low}-{self.high}"
        return f"normal:{self.mean:g},{self.sd:g}"


def parse_length(text: str, flag: str) -> LengthSpec:
    """`N`, `uniform:MIN-MAX` or `normal:MEAN,SD`; raises SpecError naming `flag`."""
    accepted = f"{flag} takes N, uniform:MIN-MAX or normal:MEAN,SD (tokens, 1 to {MAX_LENGTH_TOKENS}); got {text!r}"
    kind, _, rest = text.strip().partition(":")
    try:
        if not rest and kind.isdigit():
            value = int(kind)
            _check_tokens(value, accepted)
            return LengthSpec(kind=LengthKind.FIXED, low=value, high=value)
        if kind == "uniform":
            low_text, _, high_text = rest.partition("-")
            low, high = int(low_text), int(high_text)
            _check_tokens(low, accepted)
            _check_tokens(high, accepted)
            if low > high:
                raise SpecError(f"{flag}: uniform:MIN-MAX needs MIN <= MAX; got {text!r}")
            return LengthSpec(kind=LengthKind.UNIFORM, low=low, high=high)
        if kind == "normal":
            mean_text, _, sd_text = rest.partition(",")
            mean, sd = float(mean_text), float(sd_text)
            if not (1 <= mean <= MAX_LENGTH_TOKENS and 0 <= sd <= MAX_LENGTH_TOKENS):
                raise SpecError(f"{flag}: normal:MEAN,SD needs 1 <= MEAN <= {MAX_LENGTH_TOKENS} and SD >= 0")
            return LengthSpec(kind=LengthKind.NORMAL, mean=mean, sd=sd)
    except ValueError as error:
        if isinstance(error, SpecError):
            raise
        raise SpecError(accepted) from None
    raise SpecError(accepted)


def _check_tokens(value: int, message: str) -> None:
    if not 1 <= value <= MAX_LENGTH_TOKENS:
        raise SpecError(message)


@dataclass(frozen=True, slots=True, kw_only=True)
class PromptEntry:
    """One line of --prompts-file."""

    prompt: str
    max_tokens: int | None


def parse_prompts(text: str, source: str) -> tuple[PromptEntry, ...]:
    """JSON lines of {"prompt": str, "max_tokens": int (optional)}; blank lines skipped."""
    entries: list[PromptEntry] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        if len(entries) >= MAX_PROMPT_ENTRIES:
            raise SpecError(f"{source}: more than {MAX_PROMPT_ENTRIES} prompts")
        try:
            document = json.loads(line)
        except ValueError:
            raise SpecError(f"{source} line {number}: not JSON") from None
        prompt = document.get("prompt") if isinstance(document, dict) else None
        if not isinstance(prompt, str) or not prompt:
            raise SpecError(f'{source} line {number}: needs a non-empty string "prompt"')
        max_tokens = document.get("max_tokens")
        if max_tokens is not None and (
            not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or not 1 <= max_tokens <= MAX_LENGTH_TOKENS
        ):
            raise SpecError(f'{source} line {number}: "max_tokens" must be an integer from 1 to {MAX_LENGTH_TOKENS}')
        entries.append(PromptEntry(prompt=prompt, max_tokens=max_tokens))
    if not entries:
        raise SpecError(f"{source}: no prompts")
    return tuple(entries)


@dataclass(frozen=True, slots=True, kw_only=True)
class LoadSpec:
    """Everything one run needs; constructing one validates it (SpecError)."""

    url: str
    api: Api = Api.COMPLETIONS
    model: str | None = None  # None: the first model of GET /v1/models
    api_key: str | None = None
    rate_per_s: float | None = None  # open loop (Poisson arrivals); exactly one of rate and concurrency
    concurrency: int | None = None  # closed loop: this many workers back to back
    duration_s: float | None = None  # stop sending after; at least one of duration and max_requests
    max_requests: int | None = None
    timeout_s: float = 120.0  # per request, from sending to the last byte
    max_in_flight: int = 1000  # open loop: an arrival above it is dropped by the client
    prompt_tokens: LengthSpec = LengthSpec(kind=LengthKind.FIXED, low=256, high=256)
    output_tokens: LengthSpec = LengthSpec(kind=LengthKind.FIXED, low=128, high=128)
    prompts: tuple[PromptEntry, ...] = ()  # from --prompts-file; empty: synthetic prompts
    prompts_file: str | None = None
    shared_prefix_ratio: float = 0.0
    shared_prefixes: int = 1
    shared_prefix_tokens: int = 64
    seed: int = 0
    max_error_rate: float = 0.01
    readiness_url: str | None = None  # send only while this answers 200, as a router honours readiness
    run_tag: str = "r0"  # one word, unique to the run

    def __post_init__(self) -> None:
        if not self.url.startswith(("http://", "https://")):
            raise SpecError(f"--url must start with http:// or https://; got {self.url!r}")
        if self.readiness_url is not None and not self.readiness_url.startswith(("http://", "https://")):
            raise SpecError(f"--readiness-url must start with http:// or https://; got {self.readiness_url!r}")
        if not self.run_tag or any(char.isspace() for char in self.run_tag):
            raise SpecError("the run tag must be one non-empty word")
        _check_arrivals(self)
        _check_prompts(self)
        if not 0 <= self.max_error_rate <= 1:
            raise SpecError("--max-error-rate must be from 0 to 1")

    @property
    def open_loop(self) -> bool:
        return self.rate_per_s is not None


def _check_arrivals(spec: LoadSpec) -> None:
    if (spec.rate_per_s is None) == (spec.concurrency is None):
        raise SpecError("give exactly one of --rate (open loop) and --concurrency (closed loop)")
    if spec.rate_per_s is not None and not 0 < spec.rate_per_s <= MAX_RATE_PER_S:
        raise SpecError(f"--rate must be > 0 and <= {MAX_RATE_PER_S:g} requests/s")
    if spec.concurrency is not None and not 1 <= spec.concurrency <= MAX_WORKERS:
        raise SpecError(f"--concurrency must be from 1 to {MAX_WORKERS}")
    if spec.duration_s is None and spec.max_requests is None:
        raise SpecError("give --duration and/or --max-requests: a load test must end")
    if spec.duration_s is not None and not 0 < spec.duration_s <= MAX_DURATION_S:
        raise SpecError(f"--duration must be > 0 and <= {MAX_DURATION_S:g} s")
    if spec.max_requests is not None and not 1 <= spec.max_requests <= MAX_REQUESTS:
        raise SpecError(f"--max-requests must be from 1 to {MAX_REQUESTS}")
    if not 0 < spec.timeout_s <= MAX_TIMEOUT_S:
        raise SpecError(f"--timeout must be > 0 and <= {MAX_TIMEOUT_S:g} s")
    if not 1 <= spec.max_in_flight <= MAX_WORKERS:
        raise SpecError(f"--max-in-flight must be from 1 to {MAX_WORKERS}")


def _check_prompts(spec: LoadSpec) -> None:
    if not 0 <= spec.shared_prefix_ratio <= 1:
        raise SpecError("--shared-prefix-ratio must be from 0 to 1")
    if not 1 <= spec.shared_prefixes <= MAX_WORKERS:
        raise SpecError(f"--shared-prefixes must be from 1 to {MAX_WORKERS}")
    if not 1 <= spec.shared_prefix_tokens <= MAX_LENGTH_TOKENS:
        raise SpecError(f"--shared-prefix-tokens must be from 1 to {MAX_LENGTH_TOKENS}")
    if spec.prompts and spec.shared_prefix_ratio > 0:
        raise SpecError("--shared-prefix-ratio applies to generated prompts, not to --prompts-file")


@dataclass(frozen=True, slots=True, kw_only=True)
class PlannedRequest:
    """What request number `index` of the run sends."""

    index: int
    prompt: str
    max_tokens: int
    prompt_words: int  # the requested prompt length (words, about tokens)
    prefix_group: int | None  # which shared prefix it starts with; None: unique from its first word


def seeded(key: str) -> random.Random:
    """A generator for one part of the workload: reproducible from the seed, independent of the others."""
    return random.Random(key)  # noqa: S311 - a reproducible workload, not a secret


def is_shared(index: int, ratio: float) -> bool:
    """Spread the shared requests evenly: any first n requests hold round(n * ratio) of them, give or take one."""
    return math.floor((index + 1) * ratio) > math.floor(index * ratio)


def plan_request(spec: LoadSpec, index: int) -> PlannedRequest:
    """Request `index` of the run; the same spec and index always give the same request."""
    rng = seeded(f"{spec.seed}/{index}")
    if spec.prompts:
        entry = spec.prompts[index % len(spec.prompts)]
        max_tokens = entry.max_tokens if entry.max_tokens is not None else spec.output_tokens.sample(rng)
        return PlannedRequest(
            index=index,
            prompt=entry.prompt,
            max_tokens=max_tokens,
            prompt_words=len(entry.prompt.split()),
            prefix_group=None,
        )
    length = spec.prompt_tokens.sample(rng)
    max_tokens = spec.output_tokens.sample(rng)
    unique = f"{spec.run_tag}-{index}"
    if spec.shared_prefix_ratio > 0 and is_shared(index, spec.shared_prefix_ratio):
        group = math.floor(index * spec.shared_prefix_ratio) % spec.shared_prefixes
        prefix = shared_prefix(spec, group)
        rest = rng.choices(WORDS, k=max(0, length - len(prefix) - 1))
        words = [*prefix, unique, *rest]
    else:
        group = None
        words = [unique, *rng.choices(WORDS, k=length - 1)]
    return PlannedRequest(
        index=index, prompt=" ".join(words), max_tokens=max_tokens, prompt_words=len(words), prefix_group=group
    )


def shared_prefix(spec: LoadSpec, group: int) -> list[str]:
    """The `shared_prefix_tokens` words of prefix `group`, starting with a word naming it in this run."""
    rng = seeded(f"{spec.seed}/prefix/{group}")
    return [f"{spec.run_tag}-p{group}", *rng.choices(WORDS, k=spec.shared_prefix_tokens - 1)]


def longest_request_tokens(spec: LoadSpec) -> tuple[int, int]:
    """(prompt, output) tokens of the longest request the run may send, as the lengths promise them."""
    if spec.prompts:
        prompt = max(len(entry.prompt.split()) for entry in spec.prompts)
        outputs = [entry.max_tokens for entry in spec.prompts if entry.max_tokens is not None]
        if len(outputs) < len(spec.prompts):
            outputs.append(spec.output_tokens.upper_tokens)
        return prompt, max(outputs)
    prompt = spec.prompt_tokens.upper_tokens
    if spec.shared_prefix_ratio > 0:
        prompt = max(prompt, spec.shared_prefix_tokens + 1)
    return prompt, spec.output_tokens.upper_tokens


def check_fits(spec: LoadSpec, max_model_len: int) -> None:
    """Refuse up front a run whose requests cannot fit the server's context window."""
    prompt, output = longest_request_tokens(spec)
    if prompt + output > max_model_len:
        raise SpecError(
            f"a prompt of up to {prompt} tokens plus an output of up to {output} tokens exceeds the server's "
            f"max_model_len of {max_model_len}: lower --prompt-tokens, --output-tokens or --shared-prefix-tokens"
        )
