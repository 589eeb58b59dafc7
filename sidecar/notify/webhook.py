"""Posts one notification to one webhook (generic JSON or Slack-compatible). Does network I/O.

One POST per `send`, bounded by one deadline for the whole exchange (httpx's timeouts apply per phase, so a
receiver trickling bytes would never trip them) and reading at most a few KiB of the answer. The result
says delivered (2xx), retryable (429, 5xx, timeout, connection error) or permanent (any other status,
redirects included: a webhook that moved must be reconfigured). It never raises.

The URL is a secret (a Slack webhook's path is its credential; tokens travel in query strings), so it never
appears in a result, a name or a log: `redacted_url` keeps only scheme, host and port, and anything the
receiver or the transport says back is scrubbed of the path and query before it is reported.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from urllib.parse import parse_qsl, urlsplit

import httpx

from sidecar import __version__
from sidecar.notify.message import Notification
from sidecar.notify.payload import Origin, WebhookFormat, render_body, signature_headers
from sidecar.notify.sink import DeliveryResult, DeliveryStatus

_SNIPPET_BYTES = 4096  # enough for Slack's "invalid_payload" or a JSON error; a huge answer is not read
_DETAIL_CHARS = 200
_MIN_SCRUBBED_CHARS = 6  # shorter URL pieces ("v1", "hooks") are not secrets and scrubbing them garbles text
_REDACTED = "…"
INVALID_URL = "<invalid URL>"


def redacted_url(url: str) -> str:
    """`https://hooks.slack.com/…`: scheme, host and port only; path, query, user and password dropped."""
    try:
        parts = urlsplit(url.strip())
        host = parts.hostname
        port = parts.port
    except ValueError:
        return INVALID_URL
    if not parts.scheme or not host:
        return INVALID_URL
    if ":" in host:
        host = f"[{host}]"
    netloc = host if port is None else f"{host}:{port}"
    return f"{parts.scheme}://{netloc}/{_REDACTED}"


class WebhookSink:
    """One webhook receiver. `name` is safe to log; the URL and the HMAC key are kept private."""

    def __init__(
        self,
        url: str,
        *,
        client: httpx.AsyncClient,
        origin: Origin,
        format: WebhookFormat = WebhookFormat.JSON,
        hmac_key: bytes | None = None,
        timeout_s: float = 5.0,
        wall_clock: Callable[[], float] = time.time,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        redacted = redacted_url(url)
        if redacted == INVALID_URL or urlsplit(url.strip()).scheme not in ("http", "https"):
            # The message names the problem, never the URL itself.
            raise ValueError("webhook URL must be an http:// or https:// URL with a host")
        if hmac_key is not None and not hmac_key:
            raise ValueError("webhook HMAC key is empty")
        if timeout_s <= 0:
            raise ValueError("webhook timeout must be > 0 seconds")
        self._url = url.strip()
        self._client = client
        self._origin = origin
        self._format = WebhookFormat(format)
        self._hmac_key = hmac_key
        self._timeout_s = timeout_s
        self._wall_clock = wall_clock
        self._clock = clock
        self._name = f"{self._format.value} webhook {redacted}"
        self._secrets = _secret_pieces(self._url)

    @property
    def name(self) -> str:
        return self._name

    def __repr__(self) -> str:
        return f"WebhookSink({self._name!r})"  # the default repr would not leak, but a dataclass-style one would

    async def send(self, notification: Notification) -> DeliveryResult:
        started = self._clock()
        body = render_body(notification, self._origin, self._format)
        headers = {"Content-Type": "application/json", "User-Agent": f"vllm-sidecar/{__version__}"}
        if self._hmac_key is not None:
            # Signed per attempt, so a retry minutes later carries a fresh timestamp and passes replay checks.
            headers |= signature_headers(self._hmac_key, body, wall_time_s=self._wall_clock())
        try:
            async with asyncio.timeout(self._timeout_s):
                async with self._client.stream(
                    "POST", self._url, content=body, headers=headers, timeout=self._timeout_s
                ) as response:
                    snippet = await _read_snippet(response)
        except (TimeoutError, httpx.TimeoutException):
            return self._result(DeliveryStatus.RETRYABLE, f"timed out after {self._timeout_s:g} s", started)
        except (httpx.UnsupportedProtocol, httpx.InvalidURL, httpx.LocalProtocolError) as error:
            return self._result(DeliveryStatus.PERMANENT, _describe(error), started)
        except httpx.TransportError as error:
            return self._result(DeliveryStatus.RETRYABLE, _describe(error), started)
        except Exception as error:  # noqa: BLE001 - a sink reports, never raises; anything else is not transient
            return self._result(DeliveryStatus.PERMANENT, _describe(error), started)
        return self._classify(response, snippet, started)

    def _classify(self, response: httpx.Response, snippet: str, started: float) -> DeliveryResult:
        code = response.status_code
        said = f"HTTP {code}" + (f": {snippet}" if snippet else "")
        if 200 <= code < 300:
            return self._result(DeliveryStatus.DELIVERED, f"HTTP {code}", started)
        if code == 429 or code >= 500:
            retry_after = _retry_after_s(response.headers.get("Retry-After"))
            return self._result(DeliveryStatus.RETRYABLE, said, started, retry_after_s=retry_after)
        return self._result(DeliveryStatus.PERMANENT, said, started)

    def _result(
        self, status: DeliveryStatus, detail: str, started: float, *, retry_after_s: float | None = None
    ) -> DeliveryResult:
        return DeliveryResult(
            status=status,
            detail=_scrub(detail, self._secrets),
            duration_s=self._clock() - started,
            retry_after_s=retry_after_s,
        )


async def _read_snippet(response: httpx.Response) -> str:
    data = b""
    async for chunk in response.aiter_bytes():
        data += chunk
        if len(data) >= _SNIPPET_BYTES:
            break
    text = data[:_SNIPPET_BYTES].decode("utf-8", errors="replace")
    return " ".join(text.split())[:_DETAIL_CHARS]


def _retry_after_s(value: str | None) -> float | None:
    # Only the delta-seconds form; an HTTP date would need the wall clock and no webhook we know sends one.
    if value is None or not value.strip().isdigit():
        return None
    return float(value.strip())


def _describe(error: Exception) -> str:
    text = " ".join(str(error).split())
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def _secret_pieces(url: str) -> tuple[str, ...]:
    """The URL and every piece of it a receiver or the transport could echo back, longest first."""
    parts = urlsplit(url)
    pieces = {url, parts.path, parts.query, parts.fragment, parts.username or "", parts.password or ""}
    pieces.update(segment for segment in parts.path.split("/"))
    for key, value in parse_qsl(parts.query, keep_blank_values=True):
        pieces.update((key, value))
    kept = {piece for piece in pieces if len(piece) >= _MIN_SCRUBBED_CHARS}
    return tuple(sorted(kept, key=len, reverse=True))


def _scrub(text: str, secrets: tuple[str, ...]) -> str:
    for secret in secrets:
        text = text.replace(secret, _REDACTED)
    return text[:_DETAIL_CHARS]
