"""Reading one streamed OpenAI answer (pure)."""

from __future__ import annotations

import json

import pytest

from sidecar.loadtest.sse import (
    ServerError,
    SseLines,
    StreamError,
    StreamReader,
    Usage,
    error_message,
    read_whole_answer,
)


def event(chunk: object) -> str:
    return "data: " + json.dumps(chunk)


def test_a_completion_stream_with_usage() -> None:
    reader = StreamReader()
    firsts = [
        reader.feed(line)
        for line in [
            ": keep-alive",
            event({"choices": [{"index": 0, "text": "", "finish_reason": None}]}),
            "",
            event({"choices": [{"index": 0, "text": " Hello", "finish_reason": None}]}),
            event({"choices": [{"index": 0, "text": " world", "finish_reason": "length"}]}),
            event({"choices": [], "usage": {"prompt_tokens": 12, "completion_tokens": 2, "total_tokens": 14}}),
            "data: [DONE]",
        ]
    ]
    assert firsts == [False, False, False, True, False, False, False]
    assert reader.complete
    assert reader.done
    assert reader.finished
    assert reader.text_chunks == 2
    assert reader.usage == Usage(prompt_tokens=12, completion_tokens=2)


def test_a_chat_stream_counts_content_not_the_role_chunk() -> None:
    reader = StreamReader()
    assert not reader.feed(event({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}))
    assert reader.feed("data:" + json.dumps({"choices": [{"index": 0, "delta": {"content": "Hi"}}]}))
    assert not reader.complete


def test_a_finish_reason_without_done_is_complete() -> None:
    reader = StreamReader()
    reader.feed(event({"choices": [{"text": "x", "finish_reason": "stop"}]}))
    assert reader.complete
    assert not reader.done


def test_an_error_event_mid_stream() -> None:
    reader = StreamReader()
    reader.feed(event({"choices": [{"text": "x"}]}))
    reader.feed(event({"error": {"message": "engine dead", "code": 500}}))
    assert reader.error == ServerError(message="engine dead", status_code=500)
    assert not reader.complete


@pytest.mark.parametrize(
    "line",
    ["data: {not json", "data: [1, 2]", 'data: {"id": "x"}', 'data: {"choices": ["x"]}'],
)
def test_unreadable_events(line: str) -> None:
    with pytest.raises(StreamError):
        StreamReader().feed(line)


def test_other_fields_are_ignored() -> None:
    reader = StreamReader()
    assert not reader.feed("event: completion")
    assert not reader.feed("id: 7")
    assert reader.usage is None


def test_a_whole_answer_from_a_server_that_does_not_stream() -> None:
    body = json.dumps({"choices": [{"text": "x"}], "usage": {"prompt_tokens": 3, "completion_tokens": 1}})
    assert read_whole_answer(body.encode()) == Usage(prompt_tokens=3, completion_tokens=1)
    assert read_whole_answer(b'{"choices": []}') is None
    with pytest.raises(StreamError, match="neither an event stream nor JSON"):
        read_whole_answer(b"<html>")
    with pytest.raises(StreamError, match="no choices"):
        read_whole_answer(b'{"object": "x"}')


def test_error_messages_from_error_bodies() -> None:
    assert error_message(b'{"error": {"message": "too long", "code": 400}}') == "too long"
    assert error_message(b'{"detail": "Not Found"}') == "Not Found"
    assert error_message(b"Internal\n  Server Error") == "Internal Server Error"
    assert len(error_message(b"x" * 5000)) == 200


def test_sse_lines_end_only_at_crlf_lf_or_cr_whatever_the_pieces() -> None:
    events = 'data: {"text":"a\u2028b\u2029c\x85d\x1ce"}\r\n\r\ndata: x\ry\n\ndata: [DONE]\n\n'
    expected = ['data: {"text":"a\u2028b\u2029c\x85d\x1ce"}', "", "data: x", "y", "", "data: [DONE]", ""]
    for size in (1, 2, 3, 7, len(events)):  # every way the network may cut it, CRLF split across pieces included
        lines = SseLines()
        seen = [line for start in range(0, len(events), size) for line in lines.feed(events[start : start + size])]
        assert [*seen, *lines.close()] == expected, size
    tail = SseLines()
    assert (tail.feed("data: [DONE]"), tail.close()) == ([], ["data: [DONE]"])  # no line end before the close
