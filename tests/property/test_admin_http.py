"""The daemon's HTTP server and admin API through a real socket, under any request.

Two properties: any bytes at all get a well-formed answer (or, only when the client stopped before the end of
what it announced, none) and never take the server down; and for well-formed requests the status, and whether
an admin action ran, are exactly what an independent model of the routes and of bearer authentication
(RFC 9110 11.1: the scheme is case-insensitive; RFC 6750: `Bearer 1*SP token`; header whitespace is SP and
HTAB only) says, for any token an operator could write in the token file.
"""

from __future__ import annotations

import asyncio
import re
import tempfile
from dataclasses import dataclass, field
from http import HTTPStatus
from pathlib import Path

from hypothesis import event, example, given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from sidecar.exporter.admin import MAX_TOKEN_BYTES, MIN_TOKEN_CHARS, AdminAuth
from sidecar.exporter.endpoints import ADMIN_PATHS, Endpoints, Liveness
from sidecar.exporter.server import MAX_BODY_BYTES, HttpServer
from tests.property.profile import budget

READ_ROUTES = ("/metrics", "/healthz", "/readyz", "/status")
# HTTP/1.0 too: aiohttp answers a request it could not parse as 1.0, its version being unknown
_STATUS_LINE = re.compile(rb"HTTP/1\.[01] ([1-5][0-9][0-9]) [^\r\n]*\r\n")


@dataclass
class FakeAdmin:
    calls: list[tuple[str, str]] = field(default_factory=list)

    def pause(self, caller: str) -> str:
        self.calls.append(("pause", caller))
        return "paused"

    def resume(self, caller: str) -> str:
        self.calls.append(("resume", caller))
        return "resumed"

    def restart(self, caller: str) -> str:
        self.calls.append(("restart", caller))
        return "restarting"


@dataclass(frozen=True, slots=True)
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes


def _parse_answer(raw: bytes, *, head: bool = False) -> Answer:
    """A well-formed HTTP/1.1 answer, or an AssertionError saying how it is not.

    `head`: the request may have been a HEAD, whose answer has the Content-Length of a GET and no body.
    """
    match = _STATUS_LINE.match(raw)
    assert match is not None, f"no status line in {raw[:80]!r}"
    head_end = raw.find(b"\r\n\r\n")
    assert head_end != -1, "the answer's head does not end"
    headers: dict[str, str] = {}
    for line in raw[match.end() : head_end].decode("latin-1").split("\r\n"):
        if line:
            name, separator, value = line.partition(": ")
            assert separator, f"malformed answer header {line!r}"
            headers[name.lower()] = value
    body = raw[head_end + 4 :]
    assert headers.get("connection") == "close"
    if head and body == b"" and "content-length" not in headers:
        pass  # a streamed answer's length is known only once written: RFC 9110 9.3.2 lets HEAD leave it out
    else:
        assert int(headers["content-length"]) == len(body) or (head and body == b"")
    return Answer(status=int(match.group(1)), headers=headers, body=body)


async def _exchange(port: int, request: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request)
        await writer.drain()
        writer.write_eof()  # the client is done (a body cut short ends at EOF; a head cut short, see _serve)
        async with asyncio.timeout(5.0):
            return await reader.read()
    except ConnectionResetError:
        return b""
    finally:
        writer.close()


async def _serve(endpoints: Endpoints, requests: list[bytes]) -> list[bytes]:
    # A head cut short and then EOF waits out the read timeout (aiohttp ignores the EOF before a whole head):
    # at 2 s those few examples were most of this file's time. 0.5 s is still far beyond a loopback exchange.
    server = HttpServer(host="127.0.0.1", port=0, handler=endpoints.handle, read_timeout_s=0.5)
    await server.start()
    try:
        return [await _exchange(server.port, request) for request in requests]
    finally:
        await server.stop()


def _endpoints(admin: FakeAdmin | None, token_file: Path | None) -> Endpoints:
    return Endpoints(
        registry=CollectorRegistry(auto_describe=False),
        latest_view=lambda: None,
        liveness=lambda: Liveness(alive=True, reason="alive"),
        vllm_url="http://vllm.test",
        version="t",
        admin=admin,
        admin_auth=AdminAuth(token_file),
    )


# --- 1. Any bytes ------------------------------------------------------------------------------------------

_pieces = st.sampled_from(
    [
        b"GET",
        b"POST",
        b"HEAD",
        b" ",
        b"/",
        b"/admin/pause",
        b"/metrics",
        b"/status",
        b"?",
        b" HTTP/1.1",
        b"HTTP/1.0",
        b"\r\n",
        b"\r\n\r\n",
        b"\n",
        b":",
        b"Content-Length: ",
        b"Transfer-Encoding: chunked",
        b"0",
        b"5",
        b"\xc2\xb2",
        b"\xb9",
        b"Authorization: Bearer ",
        b"\x00",
        b"\xff",
    ]
)
# Header fields a parser gets wrong: lengths that are digits only to str.isdigit() (the head is read as latin-1,
# where bytes b2, b3 and b9 are "²", "³" and "¹"), signs, spaces, huge ones.
_LENGTHS = [
    b"\xb2",
    b"\xb9",
    b"1\xb3",
    b"\xc2\xb2",
    b"1 2",
    b"+1",
    b"-1",
    b"0x1",
    b" 7 ",
    b"",
    b"99999999999999999999",
    b"3",
]
_headers = st.one_of(
    st.tuples(st.sampled_from([b"Content-Length", b"content-length", b"Content-Length "]), st.sampled_from(_LENGTHS)),
    st.tuples(st.sampled_from([b"Transfer-Encoding", b"Authorization", b"Host"]), st.binary(max_size=10)),
)
_raw_requests = st.one_of(
    st.binary(max_size=200),
    st.lists(st.one_of(_pieces, st.binary(max_size=4)), max_size=40).map(b"".join),
    st.builds(
        lambda method, path, headers, body: (
            method
            + b" "
            + path
            + b" HTTP/1.1\r\n"
            + b"".join(k + b": " + v + b"\r\n" for k, v in headers)
            + b"\r\n"
            + body
        ),
        st.sampled_from([b"GET", b"POST", b"HEAD", b"OPTIONS"]),
        st.sampled_from([b"/admin/pause", b"/healthz"]),
        st.lists(st.one_of(_headers, st.tuples(st.binary(max_size=10), st.binary(max_size=10))), max_size=3),
        st.binary(max_size=20),
    ),
)


def _answer_owed(request: bytes) -> bool:
    """Whether the server owes an answer: the head is complete and no Content-Length asks for unsent bytes.

    A sound under-approximation (a bad request line is answered even then); digits are ASCII, as HTTP says.
    Empty lines before the request line are no request: RFC 9112 2.2 has servers ignore them (llhttp does), so
    a client that sent only those and closed is owed nothing.
    """
    request = request.lstrip(b"\r\n")
    head_end = request.find(b"\r\n\r\n")
    if head_end == -1:
        return False
    sent_body = len(request) - head_end - 4
    for line in request[:head_end].split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        value = value.strip(b" \t")
        if name.strip().lower() == b"content-length" and value.isdigit() and sent_body < int(value) <= MAX_BODY_BYTES:
            return False
    return True


@budget()
@given(_raw_requests)
@example(b"POST /admin/pause HTTP/1.1\r\nContent-Length: \xb2\r\n\r\n")  # latin-1 "²".isdigit(): int() raised
@example(b"GET /healthz HTTP/1.1\r\nContent-Length: \xb9\r\n\r\n")  # "¹": the same
@example(b"\r\n\r\n")  # empty lines only: no request, closed without an answer (found by generation)
@example(b"\r\n\nGET /healthz HTTP/1.1\r\nHost: s\r\n\r\n")  # empty lines, then a request: answered
def test_any_bytes_get_a_well_formed_answer_and_the_server_lives_on(request: bytes) -> None:
    admin = FakeAdmin()
    answers = asyncio.run(_serve(_endpoints(admin, None), [request, b"GET /healthz HTTP/1.1\r\nHost: sidecar\r\n\r\n"]))
    raw, probe = answers
    assert admin.calls == []  # no token file: the admin API is off, whatever arrives
    event("answered" if raw else "closed without an answer")
    if raw or _answer_owed(request):
        answer = _parse_answer(raw, head=request.startswith(b"HEAD "))
        assert answer.status in {200, 400, 401, 403, 404, 405, 413, 431, 501, 503}
    assert _parse_answer(probe).status == HTTPStatus.OK


# --- 2. Well-formed requests against the model -------------------------------------------------------------

# Bytes an operator can put in a token that a client can send in a header: VCHAR, SP, HTAB and obs-text.
_token_bytes = st.binary(min_size=1, max_size=40).map(
    lambda raw: bytes(b for b in raw if b in (0x20, 0x09) or 0x21 <= b <= 0x7E or b >= 0x80)
)
# Letters whose UTF-8 ends in a byte that str.strip() takes for whitespace: "à" is c3 a0, "Å" c3 85.
_tricky_tokens = st.tuples(st.text("abcdef0123456789", min_size=16, max_size=20), st.sampled_from("àÅé\u2028")).map(
    lambda t: (t[0] + t[1]).encode()
)
_tokens = st.one_of(
    st.text("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-._~+/=", min_size=16, max_size=48).map(
        str.encode
    ),
    _token_bytes.map(lambda raw: raw.strip(b" \t")),  # may be too short: then the API is off
    # UTF-8, as an editor writes it (no line breaks or NUL: those cannot travel in a header).
    st.text(st.characters(codec="utf-8", exclude_characters="\r\n\x00"), min_size=8, max_size=20).map(
        lambda t: t.strip().encode()
    ),
    _tricky_tokens,
    _tricky_tokens,  # twice: the deepest branch needs the numbers
)
# Weighted towards what reaches the deepest branch: POST to an admin path with a token configured.
_methods = st.sampled_from(["POST"] * 6 + ["GET", "HEAD", "PUT", "DELETE", "post", "OPTIONS"])
_paths = st.one_of(
    st.sampled_from(list(ADMIN_PATHS)),
    st.sampled_from(list(ADMIN_PATHS)),
    st.sampled_from(list(ADMIN_PATHS)).map(lambda path: path + "?force=1"),
    st.sampled_from(
        [
            *READ_ROUTES,
            "/",
            "/admin/",
            "/admin/pause/",
            "/admin/PAUSE",
            "//admin/pause",
            "/admin/pause/../restart",
            "/admin/%70ause",
            "/metrics/",
            "http://h/admin/pause",
        ]
    ),
    st.text("/abcdefghijklmnopqrstuvwxyz?%.", max_size=12).map(lambda text: "/" + text),
)
_SCHEMES = (b"Bearer ", b"Bearer ", b"Bearer ", b"bearer ", b"BEARER ", b"Bearer  ", b"Bearer", b"Basic ", b"Token ")


@st.composite
def _authorizations(draw: st.DrawFn, token: bytes) -> bytes | None:
    kind = draw(
        st.sampled_from(["none", "none", "right", "right", "right", "right", "wrong", "prefix", "extended", "other"])
    )
    if kind == "none":
        return None
    credential = {
        "right": token,
        "wrong": draw(_token_bytes),
        "prefix": token[:-1],
        "extended": token + b"x",
        "other": draw(st.binary(max_size=20)).replace(b"\r", b"").replace(b"\n", b""),
    }[kind]
    padding = draw(st.sampled_from([b"", b" ", b"\t", b"  "]))
    return draw(st.sampled_from(_SCHEMES)) + credential + padding


@dataclass(frozen=True, slots=True)
class Call:
    method: str
    target: str
    header_name: bytes
    authorization: bytes | None
    token_file: bytes | None  # the file's content; None: no --admin-token-file
    body: bytes


@st.composite
def _calls(draw: st.DrawFn) -> Call:
    token = draw(_tokens)
    before, after = draw(st.sampled_from([b"", b" ", b"\n"])), draw(st.sampled_from([b"", b"\n", b" \r\n"]))
    return Call(
        method=draw(_methods),
        target=draw(_paths),
        header_name=draw(st.sampled_from([b"Authorization", b"authorization", b"AUTHORIZATION"])),
        authorization=draw(_authorizations(token)),
        token_file=draw(st.sampled_from([None, before + token + after, before + token + after])),
        body=draw(st.sampled_from([b"", b"{}", b"x" * 100])),
    )


def _expected(call: Call) -> tuple[int, str | None]:  # noqa: PLR0911 - one return per rule: the model is the list
    """The status, and the admin action that must run (None: none may)."""
    if call.authorization is not None and any((b < 0x20 and b != 0x09) or b == 0x7F for b in call.authorization):
        return HTTPStatus.BAD_REQUEST, None  # a control character in a field value (RFC 9110 5.5): aiohttp refuses it
    if call.method not in ("GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS"):
        return HTTPStatus.BAD_REQUEST, None  # aiohttp's parser refuses a method it does not know: "post" (RFC 9110 9.1)
    path = call.target.split("?", 1)[0]
    if path in ADMIN_PATHS:
        if call.method != "POST":
            return HTTPStatus.METHOD_NOT_ALLOWED, None
        token = call.token_file.strip() if call.token_file is not None else b""
        if not MIN_TOKEN_CHARS <= len(token) <= MAX_TOKEN_BYTES:
            return HTTPStatus.FORBIDDEN, None  # the API is off
        value = (call.authorization or b"").strip(b" \t")
        if call.authorization is None or value[:7].lower() != b"bearer ":
            return HTTPStatus.UNAUTHORIZED, None
        if value[7:].strip(b" \t") != token:
            return HTTPStatus.FORBIDDEN, None
        return HTTPStatus.OK, ADMIN_PATHS[path]
    if path in READ_ROUTES:
        return (HTTPStatus.OK if call.method in ("GET", "HEAD") else HTTPStatus.METHOD_NOT_ALLOWED), None
    return HTTPStatus.NOT_FOUND, None


def _request(call: Call) -> bytes:
    head = f"{call.method} {call.target} HTTP/1.1\r\nHost: sidecar\r\n".encode()
    if call.authorization is not None:
        head += call.header_name + b": " + call.authorization + b"\r\n"
    return head + f"Content-Length: {len(call.body)}\r\n\r\n".encode() + call.body


@budget(scale=2)  # a few ms each; the deepest branches (200, 401) need the numbers
@given(_calls())
@example(  # a token with a non-ASCII letter, sent as the UTF-8 it is in the file: used to be "wrong token"
    Call(
        "POST", "/admin/pause", b"Authorization", b"Bearer s\xc3\xa9same-0123456789", b"s\xc3\xa9same-0123456789\n", b""
    )
)
@example(  # ends in "à" (UTF-8 c3 a0): the server stripped the a0 byte as if it were whitespace
    Call(
        "POST", "/admin/resume", b"Authorization", b"Bearer 0123456789abcdef\xc3\xa0", b"0123456789abcdef\xc3\xa0", b""
    )
)
@example(  # RFC 9110: the auth scheme is case-insensitive
    Call("POST", "/admin/restart", b"Authorization", b"bearer 0123456789abcdef", b"0123456789abcdef", b"")
)
def test_status_and_admin_actions_follow_the_model(call: Call) -> None:
    with tempfile.TemporaryDirectory(prefix="property-admin-") as folder:
        token_file = None
        if call.token_file is not None:
            token_file = Path(folder) / "token"
            token_file.write_bytes(call.token_file)
        admin = FakeAdmin()
        (raw,) = asyncio.run(_serve(_endpoints(admin, token_file), [_request(call)]))
    answer = _parse_answer(raw, head=call.method == "HEAD")
    status, action = _expected(call)
    event(f"{int(status)} {'with' if action else 'without'} an admin action")
    assert answer.status == status, answer.body
    assert [name for name, _ in admin.calls] == ([action] if action is not None else [])
    assert all(caller.startswith("127.0.0.1:") for _, caller in admin.calls)
    if status == HTTPStatus.UNAUTHORIZED:
        assert answer.headers["www-authenticate"].startswith("Bearer")
    if status == HTTPStatus.METHOD_NOT_ALLOWED:
        assert answer.headers["allow"] in ("POST", "GET, HEAD")
    if call.method == "HEAD" and status != HTTPStatus.BAD_REQUEST:  # a head refused unread has no known method
        assert answer.body == b""
