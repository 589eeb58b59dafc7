"""Rate limits of the admin API: a token bucket per client address and one for all clients. No I/O.

Every request under `/admin/` takes a token, allowed or not, so a wrong-token guesser is slowed as much as
a caller that floods with a good token. The per-client bucket holds `requests` tokens and refills at
`requests / period`; the shared bucket holds `GLOBAL_FACTOR` times that, so guessing from many addresses
at once is capped too. IPv6 clients are counted per /64, the block one host usually owns, or each address
of it would get its own bucket. At most `MAX_CLIENTS` buckets are kept (least recently used dropped first),
so a scan from many addresses costs bounded memory; the shared bucket still limits it. `/metrics`,
`/healthz`, `/readyz` and `/status` never pass through here: a probe must never be refused.
"""

from __future__ import annotations

import ipaddress
import math
import re
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

GLOBAL_FACTOR = 4
MAX_CLIENTS = 4096
MAX_REQUESTS = 10_000
MAX_PERIOD_S = 86_400.0
_UNITS_S = {"s": 1.0, "sec": 1.0, "second": 1.0, "min": 60.0, "minute": 60.0, "h": 3600.0, "hour": 3600.0}
_PATTERN = re.compile(r"^\s*(\d+)\s*/\s*(\d+)?\s*([a-z]+?)s?\s*$", re.IGNORECASE)


@dataclass(frozen=True, slots=True, kw_only=True)
class RateLimit:
    requests: int
    period_s: float

    @property
    def per_s(self) -> float:
        return self.requests / self.period_s


def parse_rate_limit(text: str) -> RateLimit:
    """`10/min`, `5/s`, `100/h`, `20/30s`; a `ValueError` naming what is wrong otherwise."""
    match = _PATTERN.match(text)
    unit_s = _UNITS_S.get(match.group(3).lower()) if match else None
    if match is None or unit_s is None:
        raise ValueError("not REQUESTS/PERIOD such as 10/min, 5/s or 100/h")
    requests = int(match.group(1))
    period_s = unit_s * int(match.group(2) or 1)
    if not 1 <= requests <= MAX_REQUESTS:
        raise ValueError(f"requests must be 1 to {MAX_REQUESTS}")
    if not 1 <= period_s <= MAX_PERIOD_S:
        raise ValueError("the period must be 1 s to 24 h")
    return RateLimit(requests=requests, period_s=period_s)


@dataclass(frozen=True, slots=True, kw_only=True)
class Admission:
    allowed: bool
    retry_after_s: int  # whole seconds until a token is back (the Retry-After header); 0 when allowed
    first_refusal: bool  # the first refusal of this client since it was last allowed: log it, not every one


@dataclass(slots=True)
class _Bucket:
    tokens: float
    updated_s: float
    refusing: bool = False

    def refill(self, now_s: float, capacity: float, per_s: float) -> None:
        self.tokens = min(capacity, self.tokens + max(0.0, now_s - self.updated_s) * per_s)
        self.updated_s = now_s

    def wait_s(self, per_s: float) -> int:
        return max(1, math.ceil((1.0 - self.tokens) / per_s))


class AdminRateLimiter:
    def __init__(
        self,
        limit: RateLimit,
        *,
        global_factor: int = GLOBAL_FACTOR,
        max_clients: int = MAX_CLIENTS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.limit = limit
        self._capacity = float(limit.requests)
        self._per_s = limit.per_s
        self._global_capacity = float(limit.requests * global_factor)
        self._global_per_s = limit.per_s * global_factor
        self._max_clients = max_clients
        self._clock = clock
        self._clients: OrderedDict[str, _Bucket] = OrderedDict()
        self._global = _Bucket(tokens=self._global_capacity, updated_s=clock())

    def admit(self, peer: str) -> Admission:
        """Take a token for `peer` ("host:port") and the shared bucket, or say how long to wait."""
        now_s = self._clock()
        bucket = self._client_bucket(client_key(peer), now_s)
        bucket.refill(now_s, self._capacity, self._per_s)
        self._global.refill(now_s, self._global_capacity, self._global_per_s)
        if bucket.tokens < 1.0 or self._global.tokens < 1.0:
            wait_s = bucket.wait_s(self._per_s) if bucket.tokens < 1.0 else self._global.wait_s(self._global_per_s)
            first = not bucket.refusing
            bucket.refusing = True
            return Admission(allowed=False, retry_after_s=wait_s, first_refusal=first)
        bucket.tokens -= 1.0
        self._global.tokens -= 1.0
        bucket.refusing = False
        return Admission(allowed=True, retry_after_s=0, first_refusal=False)

    def _client_bucket(self, key: str, now_s: float) -> _Bucket:
        bucket = self._clients.get(key)
        if bucket is None:
            bucket = _Bucket(tokens=self._capacity, updated_s=now_s)
            self._clients[key] = bucket
            while len(self._clients) > self._max_clients:
                self._clients.popitem(last=False)
        else:
            self._clients.move_to_end(key)
        return bucket


def client_key(peer: str) -> str:
    """The address a client is counted by: its IPv4 address, or the /64 its IPv6 address is in."""
    host = peer.rpartition(":")[0] or peer
    try:
        address = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return host  # not an IP (a Unix socket): counted as one client
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.IPv6Network((address, 64), strict=False))
    return str(address)
