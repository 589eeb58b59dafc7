"""Loopback ports for tests that pick a port now and bind it later (a server started as a subprocess, a booted
container's sidecar minutes after the install).

Not a port the kernel chose (bind to port 0): those come from the ephemeral range (net.ipv4.ip_local_port_range,
32768-60999 by default), which the kernel keeps handing out for every outgoing connection and every bind to
port 0 on the machine. The suite's lanes run at once and open thousands of connections; a number picked from
that range and bound two minutes later can be in use by then, and a daemon that cannot listen exits and is
restarted into the same refusal. The picks here lie below the ephemeral range, where the kernel never assigns
a port on its own, and each test process (a lane of the suite, a pytest-xdist worker) draws from its own slice,
so two processes never pick the same number.
"""

from __future__ import annotations

import itertools
import os
import random
import socket
from collections.abc import Iterator
from pathlib import Path

LANE_ENV = "VLLM_SIDECAR_TEST_LANE"  # set by tests/suite.py for each of its runs
FIRST = 20000  # well above the registered services a test machine may run (8080, 9090, ...)
LANES = 6  # the suite's stages and lanes, with room
WORKERS = 8  # pytest-xdist workers per run
EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def ephemeral_start(text: str | None) -> int:
    """The first port of the kernel's ephemeral range, from the file's `low high`; Linux's default without it."""
    try:
        return int((text or "").split()[0])
    except (IndexError, ValueError):
        return 32768


def slice_of(lane: int, worker: int, first: int, end: int) -> range:
    """The ports of one process: `first`..`end` cut into LANES x WORKERS equal slices."""
    size = (end - first) // (LANES * WORKERS)
    start = first + ((lane % LANES) * WORKERS + worker % WORKERS) * size
    return range(start, start + size)


def _index(value: str | None) -> int:
    digits = "".join(character for character in value or "" if character.isdigit())
    return int(digits) if digits else 0


def _own_slice() -> range:
    try:
        text: str | None = EPHEMERAL_RANGE.read_text()
    except OSError:
        text = None
    lane = _index(os.environ.get(LANE_ENV))
    worker = _index(os.environ.get("PYTEST_XDIST_WORKER"))  # gw0, gw1, ...
    return slice_of(lane, worker, FIRST, ephemeral_start(text))


def _cycle(ports: range) -> Iterator[int]:
    """Every port of the slice in turn from a random one: a run does not reuse a port it freed a moment ago."""
    offset = random.randrange(len(ports)) if len(ports) else 0  # noqa: S311 - not a secret
    return itertools.cycle([*ports[offset:], *ports[:offset]])


_PICKS: Iterator[int] | None = None


def free_port() -> int:
    """A loopback port nothing is bound to now (bound once, without SO_REUSEADDR, then released), from this
    process's slice; a bind to port 0 where the slice is empty (an ephemeral range that starts below it)."""
    global _PICKS  # noqa: PLW0603 - one walk through the slice per process
    ports = _own_slice()
    if len(ports) == 0:
        return _kernel_port()
    if _PICKS is None:
        _PICKS = _cycle(ports)
    for port in itertools.islice(_PICKS, len(ports)):
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue  # in use, or a TIME_WAIT of its last use
            return port
    return _kernel_port()


def _kernel_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])
