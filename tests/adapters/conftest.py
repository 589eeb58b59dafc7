"""Fixtures shared by the adapter tests: a scriptable loopback server and an HTTP client."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import httpx
import pytest

from tests.loopback import LoopbackServer


@pytest.fixture
def server() -> Iterator[LoopbackServer]:
    served = LoopbackServer()
    yield served
    served.close()


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(timeout=5.0) as shared:
        yield shared
