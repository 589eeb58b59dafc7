"""The engine probe's sender against real loopback servers (and httpx's mock transport for what a raw server
cannot show, the headers it sends): answered, no answer, and every kind of answer that proves nothing."""

from __future__ import annotations

import json

import httpx

from sidecar.policy.probe import ProbeOutcome
from sidecar.sources.probe import PROMPT, WARM_UP_PROMPT, CompletionProbe
from tests.loopback import LoopbackServer, closed_port, respond, slow

MODELS = respond(
    body=b'{"object":"list","data":[{"id":"tiny-llama","object":"model"}]}', content_type="application/json"
)
COMPLETION = respond(body=b'{"choices":[{"text":"x"}]}', content_type="application/json")


def probe(client: httpx.AsyncClient, url: str, timeout_s: float = 2.0, api_key: str | None = None) -> CompletionProbe:
    return CompletionProbe(client=client, base_url=url, timeout_s=timeout_s, api_key=api_key)


async def test_an_engine_that_answers(server: LoopbackServer, client: httpx.AsyncClient) -> None:
    server.routes.update({"/v1/models": MODELS, "/v1/completions": COMPLETION})
    sender = probe(client, server.url)
    answer = await sender.probe()
    assert answer.outcome is ProbeOutcome.ANSWERED
    assert answer.detail.startswith("1 token of 'tiny-llama' in ")
    await sender.probe()
    assert server.hits.count("/v1/models") == 1  # the served model is remembered
    assert server.hits.count("/v1/completions") == 2


async def test_a_wedged_engine_gives_no_answer_within_the_timeout(
    server: LoopbackServer, client: httpx.AsyncClient
) -> None:
    server.routes.update({"/v1/models": MODELS, "/v1/completions": slow(5.0, COMPLETION)})
    answer = await probe(client, server.url, timeout_s=0.3).probe()
    assert answer.outcome is ProbeOutcome.NO_ANSWER
    assert answer.detail == "no answer within 0.3 s"
    assert 0.25 < answer.duration_s < 3.0


async def test_answers_that_prove_nothing_are_inconclusive_and_say_what_came_back(
    server: LoopbackServer, client: httpx.AsyncClient
) -> None:
    sender = probe(client, server.url)
    answer = await sender.probe()  # nothing routed: 404 on /v1/models, as from a server that is not vLLM
    assert (answer.outcome, answer.detail) == (ProbeOutcome.INCONCLUSIVE, f"{server.url}/v1/models answered HTTP 404")
    server.routes["/v1/models"] = respond(body=b'{"data": []}')
    assert (await sender.probe()).detail == f"{server.url}/v1/models lists no model"
    server.routes["/v1/models"] = respond(body=b"<html>")
    assert (await sender.probe()).detail == f"{server.url}/v1/models did not answer JSON"
    server.routes.update({"/v1/models": MODELS, "/v1/completions": respond(401, b'{"error":"Unauthorized"}')})
    answer = await sender.probe()
    assert answer.outcome is ProbeOutcome.INCONCLUSIVE
    assert (
        answer.detail
        == f"{server.url}/v1/completions answered HTTP 401 (the server wants an API key: --vllm-api-key-file)"
    )
    server.routes["/v1/completions"] = respond(503, b'{"error":"queue full"}')  # vLLM shedding: busy, not wedged
    assert (await sender.probe()).outcome is ProbeOutcome.INCONCLUSIVE
    # After each of those the served model is asked again (it may have changed with a restart).
    assert server.hits.count("/v1/models") == 5


async def test_nothing_listening_is_inconclusive_not_a_wedge(client: httpx.AsyncClient) -> None:
    url = f"http://127.0.0.1:{closed_port()}"
    answer = await probe(client, url).probe()
    assert answer.outcome is ProbeOutcome.INCONCLUSIVE
    assert answer.detail == f"{url}/v1/models failed: connection refused"


async def test_it_sends_one_token_for_the_served_model_with_the_api_key() -> None:
    seen: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "llama"}]})
        return httpx.Response(200, json={"choices": [{"text": "x"}]})

    async with httpx.AsyncClient(transport=httpx.MockTransport(answer)) as client:
        result = await probe(client, "http://vllm:8000", api_key="sk-test-123").probe()
    assert result.outcome is ProbeOutcome.ANSWERED
    models, completion = seen
    assert all(request.headers["authorization"] == "Bearer sk-test-123" for request in seen)
    assert models.method == "GET"
    assert completion.method == "POST"
    assert json.loads(completion.content) == {
        "model": "llama",
        "prompt": PROMPT,
        "max_tokens": 1,
        "temperature": 0.0,
        "stream": False,
    }
    assert completion.headers["user-agent"].startswith("vllm-sidecar/")


async def test_the_probe_is_never_a_prompt_of_a_token_or_two_and_the_warm_up_is_sized_like_a_request() -> None:
    # vLLM 0.32's CPU build killed its engine core on a first prompt of 3 tokens or fewer (issue 28).
    sent: list[str] = []

    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "llama"}]})
        prompt = json.loads(request.content)["prompt"]
        sent.append(prompt)
        return httpx.Response(200, json={"choices": [{"text": "x"}], "usage": {"prompt_tokens": len(prompt.split())}})

    async with httpx.AsyncClient(transport=httpx.MockTransport(answer)) as client:
        sender = probe(client, "http://vllm:8000")
        warm_up = await sender.probe(warm_up=True)
        short = await sender.probe()
    assert sent == [WARM_UP_PROMPT, PROMPT]
    assert len(PROMPT.split()) >= 12
    assert len(WARM_UP_PROMPT.split()) >= 64
    # What vLLM counted is in the line, so a log shows the prompt's real length.
    assert warm_up.detail.startswith("warm-up: 1 token of 'llama' in ")
    assert warm_up.detail.endswith(f", prompt {len(WARM_UP_PROMPT.split())} tokens")
    assert short.detail.endswith(f", prompt {len(PROMPT.split())} tokens")


async def test_the_answer_counts_the_prompt_in_words_that_agree(
    server: LoopbackServer, client: httpx.AsyncClient
) -> None:
    for prompt_tokens, said in ((1, "prompt 1 token"), (12, "prompt 12 tokens")):
        usage = {"choices": [{"text": "x"}], "usage": {"prompt_tokens": prompt_tokens}}
        server.routes.update(
            {
                "/v1/models": MODELS,
                "/v1/completions": respond(body=json.dumps(usage).encode(), content_type="application/json"),
            }
        )
        answer = await probe(client, server.url).probe()
        assert answer.outcome is ProbeOutcome.ANSWERED
        assert answer.detail.endswith(f", {said}"), answer.detail
