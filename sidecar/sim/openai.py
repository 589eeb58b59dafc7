"""The OpenAI-compatible request and response shapes vLLM serves, for the simulator. Pure.

Tokens are whitespace-separated words (a load generator can then size prompts exactly); a word's token
id is a stable hash, so equal prefixes hash to equal KV blocks and really hit the prefix cache.
"""

from __future__ import annotations

import json
import zlib
from dataclasses import dataclass
from enum import StrEnum

_OUTPUT_WORDS = ("the", "cache", "holds", "every", "token", "a", "request", "needs", "and", "more")


class Api(StrEnum):
    COMPLETIONS = "completions"
    CHAT = "chat"


class BadRequestError(ValueError):
    """The request is malformed; the message is what vLLM would answer with HTTP 400."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CompletionRequest:
    api: Api
    model: str
    prompt_token_ids: tuple[int, ...]
    max_tokens: int
    stream: bool
    include_usage: bool


def token_ids(text: str) -> tuple[int, ...]:
    return tuple(zlib.crc32(word.encode()) for word in text.split())


def parse_request(body: bytes, api: Api, *, served_model: str, default_max_tokens: int) -> CompletionRequest:
    try:
        document = json.loads(body)
    except (ValueError, UnicodeDecodeError) as error:
        raise BadRequestError(f"Invalid JSON body: {error}") from None
    if not isinstance(document, dict):
        raise BadRequestError("The request body must be a JSON object")
    model = document.get("model", served_model)
    if model != served_model:
        raise BadRequestError(f"The model `{model}` does not exist.")
    if api is Api.CHAT:
        messages = document.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequestError("messages must be a non-empty list")
        text = " ".join(f"{m.get('role', 'user')}: {m.get('content', '')}" for m in messages if isinstance(m, dict))
        text += " assistant:"
    else:
        prompt = document.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if not isinstance(prompt, str):
            raise BadRequestError("prompt must be a string (batched prompts are not simulated)")
        text = prompt
    max_tokens = document.get("max_completion_tokens", document.get("max_tokens", default_max_tokens))
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
        raise BadRequestError("max_tokens must be at least 1")
    ids = token_ids(text)
    if not ids:
        raise BadRequestError("The prompt is empty")
    options = document.get("stream_options")
    return CompletionRequest(
        api=api,
        model=served_model,
        prompt_token_ids=ids,
        max_tokens=max_tokens,
        stream=bool(document.get("stream", False)),
        include_usage=isinstance(options, dict) and bool(options.get("include_usage", False)),
    )


def output_text(start: int, count: int) -> str:
    return "".join(" " + _OUTPUT_WORDS[(start + i) % len(_OUTPUT_WORDS)] for i in range(count))


def error_document(message: str, status: int) -> bytes:
    # vLLM names a GracefulHTTPError (its queue caps' 503) by the status's phrase.
    kinds = {400: "BadRequestError", 404: "NotFoundError", 503: "Service Unavailable"}
    kind = kinds.get(status, "InternalServerError")
    return json.dumps({"object": "error", "message": message, "type": kind, "param": None, "code": status}).encode()


def completion_document(
    request: CompletionRequest, *, request_id: str, created: int, text: str, finish_reason: str, completion_tokens: int
) -> bytes:
    usage = _usage(request, completion_tokens)
    if request.api is Api.CHAT:
        choice: dict[str, object] = {
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "logprobs": None,
            "finish_reason": finish_reason,
        }
        kind = "chat.completion"
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
        kind = "text_completion"
    return json.dumps(
        {
            "id": request_id,
            "object": kind,
            "created": created,
            "model": request.model,
            "choices": [choice],
            "usage": usage,
        }
    ).encode()


def stream_event(
    request: CompletionRequest, request_id: str, created: int, text: str, finish_reason: str | None
) -> bytes:
    if request.api is Api.CHAT:
        choice: dict[str, object] = {
            "index": 0,
            "delta": {"content": text},
            "logprobs": None,
            "finish_reason": finish_reason,
        }
        kind = "chat.completion.chunk"
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
        kind = "text_completion"
    return _sse({"id": request_id, "object": kind, "created": created, "model": request.model, "choices": [choice]})


def usage_event(request: CompletionRequest, request_id: str, created: int, completion_tokens: int) -> bytes:
    kind = "chat.completion.chunk" if request.api is Api.CHAT else "text_completion"
    return _sse(
        {
            "id": request_id,
            "object": kind,
            "created": created,
            "model": request.model,
            "choices": [],
            "usage": _usage(request, completion_tokens),
        }
    )


def stream_error_event(message: str) -> bytes:
    return _sse({"error": {"object": "error", "message": message, "type": "InternalServerError", "code": 500}})


DONE = b"data: [DONE]\n\n"


def _sse(document: dict[str, object]) -> bytes:
    return b"data: " + json.dumps(document).encode() + b"\n\n"


def _usage(request: CompletionRequest, completion_tokens: int) -> dict[str, int]:
    prompt = len(request.prompt_token_ids)
    return {"prompt_tokens": prompt, "completion_tokens": completion_tokens, "total_tokens": prompt + completion_tokens}


def models_document(model: str, max_model_len: int, created: int) -> bytes:
    return json.dumps(
        {
            "object": "list",
            "data": [
                {
                    "id": model,
                    "object": "model",
                    "created": created,
                    "owned_by": "vllm",
                    "root": model,
                    "parent": None,
                    "max_model_len": max_model_len,
                }
            ],
        }
    ).encode()
