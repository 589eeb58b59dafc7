"""Sends vLLM the engine probe: one bounded completion of one token for the served model. Does network I/O.

The policy decides when (see sidecar.policy.probe); this only asks and says what came back, never raising.
The served model is read from /v1/models once and again after any answer that suggests it changed. Only a
probe that gets no answer within its timeout is NO_ANSWER (a wedge, unless the engine moves meanwhile);
anything vLLM answers other than 200, or a connection that fails, is INCONCLUSIVE: it says nothing about
whether the engine steps (a missing API key, a full queue's 503, a process that is gone are other rules').
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx

from sidecar import __version__
from sidecar.body_cap import BodyTooLargeError, read_capped
from sidecar.model.text import plural
from sidecar.policy.probe import ProbeOutcome
from sidecar.sources.fetch import connection_error_reason

MAX_ANSWER_BYTES = 64 * 1024  # a 1-token completion or a model list is a few hundred bytes
MODELS_TIMEOUT_S = 10.0  # /v1/models is answered by the API server alone, engine wedged or not
# A prompt of a normal length, never a token or two: vLLM 0.32's CPU build killed its engine core on a first
# prompt of 3 tokens or fewer (issue 28). Twelve words are at least 12 tokens with any tokenizer.
PROMPT = "The engine probe of vllm-sidecar asks for one token to check that this server still answers."
# A fresh vLLM's first request, when the sidecar's is the first (the warm-up): sized like a real request.
WARM_UP_PROMPT = " ".join(
    (
        "You are a helpful assistant. Summarise the following note in one sentence.",
        "The sidecar that runs next to this inference server reads its metrics every few seconds, derives what",
        "the server does not export, pauses admission before the accelerator runs out of memory, and restarts",
        "the server when its engine stops making progress. This request warms the server up before the",
        "sidecar's short probes begin, so that its first request is of an ordinary size.",
    )
)


@dataclass(frozen=True, slots=True, kw_only=True)
class ProbeAnswer:
    outcome: ProbeOutcome
    detail: str  # one line
    duration_s: float


class _Inconclusive(Exception):  # noqa: N818 - an outcome, not an error of the sidecar's
    pass


class CompletionProbe:
    def __init__(
        self,
        *,
        client: httpx.AsyncClient,
        base_url: str,
        timeout_s: float,
        api_key: str | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._client = client
        self._base_url = base_url.rstrip("/")
        self._timeout_s = timeout_s
        self._headers = {"User-Agent": f"vllm-sidecar/{__version__} (engine probe)", "Accept-Encoding": "identity"}
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"
        self._clock = clock
        self._model: str | None = None

    async def probe(self, *, warm_up: bool = False) -> ProbeAnswer:
        """One completion of one token; with `warm_up`, its prompt sized like a real request's."""
        started = self._clock()
        try:
            model = self._model or await self._served_model()
            self._model = model
            async with asyncio.timeout(self._timeout_s):
                prompt_tokens = await self._complete(model, WARM_UP_PROMPT if warm_up else PROMPT)
        except TimeoutError:
            return self._answer(ProbeOutcome.NO_ANSWER, f"no answer within {self._timeout_s:g} s", started)
        except _Inconclusive as error:
            self._model = None  # whatever went wrong, ask which model is served next time
            return self._answer(ProbeOutcome.INCONCLUSIVE, str(error), started)
        took = self._clock() - started
        prompt = "" if prompt_tokens is None else f", prompt {plural(prompt_tokens, 'token')}"
        what = "warm-up: 1 token" if warm_up else "1 token"
        return self._answer(ProbeOutcome.ANSWERED, f"{what} of {model!r} in {took:.2f} s{prompt}", started)

    def _answer(self, outcome: ProbeOutcome, detail: str, started_s: float) -> ProbeAnswer:
        return ProbeAnswer(outcome=outcome, detail=detail, duration_s=self._clock() - started_s)

    async def _served_model(self) -> str:
        url = self._base_url + "/v1/models"
        try:
            async with asyncio.timeout(MODELS_TIMEOUT_S):
                body = await self._request("GET", url, None)
        except TimeoutError:
            raise _Inconclusive(f"{url} did not answer within {MODELS_TIMEOUT_S:g} s") from None
        try:
            document = json.loads(body)
        except (ValueError, RecursionError):
            raise _Inconclusive(f"{url} did not answer JSON") from None
        data = document.get("data") if isinstance(document, dict) else None
        first = data[0] if isinstance(data, list) and data else None
        model = first.get("id") if isinstance(first, dict) else None
        if not isinstance(model, str) or not model:
            raise _Inconclusive(f"{url} lists no model")
        return model

    async def _complete(self, model: str, prompt: str) -> int | None:
        """The prompt's length in tokens, as vLLM counted it (None when its answer does not say)."""
        # temperature 0 and one token: the least work an engine can be asked for; no stream, one answer.
        body = {"model": model, "prompt": prompt, "max_tokens": 1, "temperature": 0.0, "stream": False}
        answer = await self._request("POST", self._base_url + "/v1/completions", body)
        try:
            document = json.loads(answer)
        except (ValueError, RecursionError):
            return None  # answered 200: the engine works, whatever the body
        usage = document.get("usage") if isinstance(document, dict) else None
        tokens = usage.get("prompt_tokens") if isinstance(usage, dict) else None
        return tokens if isinstance(tokens, int) and not isinstance(tokens, bool) else None

    async def _request(self, method: str, url: str, body: dict[str, object] | None) -> bytes:
        """The answer's body when it is 200; `_Inconclusive` for anything else but time running out."""
        try:
            # The caller's deadline bounds the whole exchange; the client's own timeouts only per phase.
            timeout = httpx.Timeout(self._timeout_s)
            async with self._client.stream(method, url, json=body, headers=self._headers, timeout=timeout) as answer:
                if answer.status_code != httpx.codes.OK:
                    hint = " (the server wants an API key: --vllm-api-key-file)" if answer.status_code == 401 else ""
                    raise _Inconclusive(f"{url} answered HTTP {answer.status_code}{hint}")
                return await read_capped(answer, MAX_ANSWER_BYTES)
        except httpx.TimeoutException:
            raise TimeoutError from None  # the client's per-phase limit: the same as no answer in time
        except httpx.HTTPError as error:
            raise _Inconclusive(f"{url} failed: {connection_error_reason(error)}") from None
        except BodyTooLargeError as error:
            raise _Inconclusive(f"{url} {error}") from None
