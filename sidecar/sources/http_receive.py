"""One connection's incoming bytes, received straight into one buffer and read by position. Does network I/O.

asyncio's StreamReader copies every received block into its buffer, copies it out again on each read, and
with a limit small enough to bound a header block it pauses and resumes the socket several times for one
300 KB exposition (two epoll_ctl calls and a wake-up each time). A `Receiver` is a BufferedProtocol: the
kernel writes into the buffer (`recv_into`), a body is copied out once, and a reader that asks for N bytes is
woken once, when they are all there. The buffer is kept for the connection's life, so a poll a second
allocates nothing new once it has grown to the size of an answer.

Flow control: reading pauses once more than a reader asked for plus `HIGH_WATER_BYTES` is waiting, and
resumes when a reader asks for more, so a server that sends more than was asked for cannot fill memory.
Bytes that arrive while no request is in flight make the connection unusable (`usable`): a keep-alive
connection must be quiet between answers.
"""

from __future__ import annotations

import asyncio

from sidecar.model.text import plural

MIN_FREE_BYTES = 64 * 1024  # what each recv_into may fill at least
HIGH_WATER_BYTES = 256 * 1024


class ReceiveClosedError(Exception):
    """The connection ended (closed by the server, or reset) before what was asked for arrived."""

    def __init__(self, *, received: int, expected: int | None, cause: BaseException | None) -> None:
        super().__init__(f"closed after {plural(received, 'byte')}")
        self.received = received  # bytes of what was being read that had arrived
        self.expected = expected  # how many were asked for; None for a delimited read
        self.cause = cause  # the OS error (a reset), or None for a clean close


class ReceiveLimitError(Exception):
    """No delimiter within the limit."""


class Receiver(asyncio.BufferedProtocol):
    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self._buffer = bytearray(MIN_FREE_BYTES)
        self._start = 0  # first byte not read yet
        self._end = 0  # one past the last byte received
        self._wanted_end = 0  # a reader waits until _end reaches this
        self._waiter: asyncio.Future[None] | None = None
        self._eof = False
        self._lost: BaseException | None = None
        self._closed = False
        self._paused = False
        self.busy = False  # a request is in flight: bytes may arrive

    # --- protocol callbacks (the event loop's) --------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)  # noqa: S101 - create_connection gives a stream transport
        self.transport = transport

    def get_buffer(self, sizehint: int) -> memoryview:
        # No view of the buffer is alive here (the loop drops the previous one first), so it can move and grow.
        needed = max(MIN_FREE_BYTES, self._wanted_end - self._end)
        if len(self._buffer) - self._end < needed:
            if self._start:
                del self._buffer[: self._start]
                self._end -= self._start
                self._wanted_end = max(0, self._wanted_end - self._start)
                self._start = 0
            shortfall = needed - (len(self._buffer) - self._end)
            if shortfall > 0:
                self._buffer.extend(bytes(shortfall))
        return memoryview(self._buffer)[self._end :]

    def buffer_updated(self, nbytes: int) -> None:
        self._end += nbytes
        if not self.busy:
            self._eof = True  # unasked-for bytes: nothing can be trusted on this connection any more
            if self.transport is not None:
                self.transport.abort()
            return
        if self._end >= self._wanted_end:
            self._wake()
        if self._end - self._start > max(HIGH_WATER_BYTES, self._wanted_end - self._start) and not self._paused:
            self._paused = True
            if self.transport is not None:
                self.transport.pause_reading()

    def eof_received(self) -> bool:
        self._eof = True
        self._wake()
        return False  # let the transport close itself

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        self._lost = exc
        self._wake()

    # --- reading (the client's) -----------------------------------------------------------------------
    def usable(self) -> bool:
        """Open, quiet, with nothing left unread: fit to carry another request."""
        return (
            not (self._eof or self._closed)
            and self._start == self._end
            and self.transport is not None
            and not self.transport.is_closing()
        )

    def clear(self) -> None:
        """Forget what was read, before a new request on this connection."""
        self._start = self._end = self._wanted_end = 0

    async def read_until(self, separator: bytes, limit: int) -> bytes:
        """The bytes up to and including `separator`, which must come within `limit` bytes."""
        searched = 0  # bytes after _start already searched; relative, as the buffer may move while waiting
        while True:
            at = self._buffer.find(separator, self._start + max(0, searched - len(separator) + 1), self._end)
            if at != -1:
                stop = at + len(separator)
                if stop - self._start > limit:
                    raise ReceiveLimitError
                return self._take(stop)
            if self._end - self._start > limit:
                raise ReceiveLimitError
            searched = self._end - self._start
            await self._more(searched + 1, expected=None)

    async def read_exactly(self, count: int) -> bytes:
        await self._more(count, expected=count)
        return self._take(self._start + count)

    async def read_some(self, most: int) -> bytes:
        """Up to `most` bytes, as soon as there are any; b"" once the connection has ended."""
        if self._start == self._end:
            try:
                await self._more(1, expected=None)
            except ReceiveClosedError as closed:
                if closed.cause is not None:
                    raise
                return b""
        return self._take(min(self._end, self._start + most))

    def _take(self, stop: int) -> bytes:
        data = bytes(memoryview(self._buffer)[self._start : stop])
        self._start = stop
        return data

    async def _more(self, count: int, *, expected: int | None) -> None:
        """Wait until `count` unread bytes are there (positions, not offsets: the buffer may move meanwhile)."""
        while self._end - self._start < count:
            if self._eof or self._closed:
                raise ReceiveClosedError(received=self._end - self._start, expected=expected, cause=self._lost)
            self._wanted_end = self._start + count
            if self._paused and self.transport is not None:
                self._paused = False
                self.transport.resume_reading()
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)
