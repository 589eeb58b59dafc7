"""Reads one streamed OpenAI answer, line by line (Server-Sent Events). Pure: no I/O, no clock.

An answer is `data: {json}` events ending with `data: [DONE]`; vLLM sends `usage` in a last chunk with no
choices when asked with `stream_options.include_usage`. The first chunk that carries text is the first
token (vLLM's chat answers open with a role-only chunk, which is not one). A server may also send an
error object mid-stream, which ends the answer as a failure.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

MAX_ERROR_CHARS = 200
_LINE_END = re.compile(r"\r\n|\n|\r")


class SseLines:
    """Splits a stream's text into lines as Server-Sent Events define them: at CRLF, LF or CR only. httpx's
    `aiter_lines` splits where `str.splitlines` does, which also cuts at U+2028, U+2029, U+0085 and the
    separator controls: characters a JSON string may hold unescaped, so a token with one cut its event in two
    (seen against vLLM on CPU, whose tiny test model emits arbitrary tokens: "an event is not JSON")."""

    def __init__(self) -> None:
        self._pending = ""

    def feed(self, text: str) -> list[str]:
        """The lines `text` completes; what follows the last line end waits for the next piece (a CR at the
        end waits too: the LF of its CRLF may come next)."""
        text = self._pending + text
        lines = _LINE_END.split(text)
        self._pending = lines.pop()
        if self._pending == "" and text.endswith("\r"):
            # "...\r" split as [..., ""]: hold the CR back, so a following "\n" is not read as a second line end.
            lines_text = text[:-1]
            lines = _LINE_END.split(lines_text)
            self._pending = lines.pop() + "\r"
        return lines

    def close(self) -> list[str]:
        """The last line, when the stream ended without a line end."""
        rest, self._pending = self._pending.removesuffix("\r"), ""
        return [rest] if rest else []


class StreamError(ValueError):
    """The answer cannot be read as an OpenAI stream; the message is one line."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerError:
    """An error object the server sent instead of (or in the middle of) an answer."""

    message: str
    status_code: int | None  # the error's own code, when it is an HTTP status


@dataclass(frozen=True, slots=True, kw_only=True)
class Usage:
    prompt_tokens: int | None
    completion_tokens: int | None


@dataclass(slots=True)
class StreamReader:
    """Feed it the answer's lines; it says when the first token came and when the answer is complete."""

    done: bool = False  # `data: [DONE]` seen
    finished: bool = False  # a choice came with a finish_reason
    text_chunks: int = 0
    usage: Usage | None = None
    error: ServerError | None = None

    def feed(self, line: str) -> bool:
        """Read one line; True when it is the first to carry generated text. Raises StreamError."""
        if not line or line.startswith(":"):
            return False  # the blank line between events, or an SSE comment (a keep-alive)
        name, _, value = line.partition(":")
        if name != "data":
            return False  # event:, id:, retry: carry nothing an OpenAI answer needs
        payload = value.removeprefix(" ")
        if payload == "[DONE]":
            self.done = True
            return False
        if self.done:
            raise StreamError("data after data: [DONE]")
        try:
            chunk = json.loads(payload)
        except ValueError:
            raise StreamError(f"an event is not JSON: {_excerpt(payload)!r}") from None
        if not isinstance(chunk, dict):
            raise StreamError(f"an event is not a JSON object: {_excerpt(payload)!r}")
        return self._read_chunk(chunk)

    def _read_chunk(self, chunk: dict[str, Any]) -> bool:
        error = server_error(chunk)
        if error is not None:
            self.error = error
            return False
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            self.usage = _usage(usage)
        choices = chunk.get("choices")
        if not isinstance(choices, list):
            if usage is None:
                raise StreamError("an event has neither choices nor usage")
            return False
        first = False
        for choice in choices:
            if not isinstance(choice, dict):
                raise StreamError("a choice is not a JSON object")
            if choice.get("finish_reason") is not None:
                self.finished = True
            if _choice_text(choice):
                first = self.text_chunks == 0
                self.text_chunks += 1
        return first

    @property
    def complete(self) -> bool:
        """The answer ended properly: [DONE], or (servers that omit it) a finish_reason."""
        return self.error is None and (self.done or self.finished)


def read_whole_answer(body: bytes) -> Usage | None:
    """A server that ignored `"stream": true` answers one JSON document; its usage, if any. Raises StreamError."""
    try:
        document = json.loads(body)
    except ValueError:
        raise StreamError(
            f"the answer is neither an event stream nor JSON: {_excerpt(body.decode(errors='replace'))!r}"
        ) from None
    if not isinstance(document, dict) or not isinstance(document.get("choices"), list):
        raise StreamError("the answer has no choices")
    usage = document.get("usage")
    if not isinstance(usage, dict):
        return None
    return _usage(usage)


def server_error(document: object) -> ServerError | None:
    """The error of an OpenAI-style error answer (`{"error": {...}}`, `{"detail": ...}`, `{"message": ...}`)."""
    if not isinstance(document, dict):
        return None
    error = document.get("error")
    if isinstance(error, dict):
        code = error.get("code")
        status = code if isinstance(code, int) and not isinstance(code, bool) and 100 <= code <= 599 else None
        return ServerError(message=_excerpt(str(error.get("message", error))), status_code=status)
    if isinstance(error, str):
        return ServerError(message=_excerpt(error), status_code=None)
    for key in ("detail", "message"):
        if key in document and "choices" not in document:
            return ServerError(message=_excerpt(str(document[key])), status_code=None)
    return None


def error_message(body: bytes) -> str:
    """One line from an error answer's body: its error message, else the body's start."""
    try:
        error = server_error(json.loads(body))
    except ValueError:
        error = None
    return error.message if error is not None else _excerpt(body.decode(errors="replace"))


def _choice_text(choice: dict[str, Any]) -> bool:
    text = choice.get("text")
    if isinstance(text, str) and text:
        return True
    delta = choice.get("delta")
    if isinstance(delta, dict):
        content = delta.get("content")
        reasoning = delta.get("reasoning_content")  # reasoning models stream thinking first: still tokens
        return bool((isinstance(content, str) and content) or (isinstance(reasoning, str) and reasoning))
    return False


def _usage(usage: dict[str, Any]) -> Usage:
    return Usage(
        prompt_tokens=_count(usage.get("prompt_tokens")), completion_tokens=_count(usage.get("completion_tokens"))
    )


def _count(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _excerpt(text: str) -> str:
    line = " ".join(text.split())
    return line if len(line) <= MAX_ERROR_CHARS else line[: MAX_ERROR_CHARS - 3] + "..."
