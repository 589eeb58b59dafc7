"""A small D-Bus client session over jeepney's asyncio connection. I/O.

One connection, used by one task: method calls are answered in order, and the signals that arrive while a call
waits for its answer are kept, in order, for `next_signal`. That is all a restart needs (subscribe, call, wait
for the job's signal) and it avoids a background receiver task: a connection the bus closes shows up at once
as `BusLostError` in whoever is waiting, not as a silent hang.
"""

from __future__ import annotations

import contextlib
from collections import deque
from dataclasses import dataclass
from typing import Self

from jeepney import DBusAddress, HeaderFields, Message, MessageType, new_method_call
from jeepney.io.asyncio import DBusConnection, open_dbus_connection

from sidecar.model.text import one_line

BUS_DAEMON = DBusAddress("/org/freedesktop/DBus", bus_name="org.freedesktop.DBus", interface="org.freedesktop.DBus")
PROPERTIES_INTERFACE = "org.freedesktop.DBus.Properties"


class BusUnavailableError(Exception):
    """The bus could not be reached: no address, no socket, refused, or the handshake failed."""


class BusLostError(Exception):
    """The bus closed the connection while we were waiting on it."""


class DbusCallError(Exception):
    """The peer answered a method call with a D-Bus error."""

    def __init__(self, name: str, message: str) -> None:
        super().__init__(f"{name}: {message}")
        self.name = name
        self.message = message


@dataclass(frozen=True, slots=True, kw_only=True)
class Signal:
    path: str
    interface: str
    member: str
    body: tuple[object, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class Target:
    """Where a method call goes: a bus name, an object path and an interface."""

    bus_name: str
    path: str
    interface: str

    def address(self) -> DBusAddress:  # DBusAddress is jeepney's (untyped) class
        return DBusAddress(self.path, bus_name=self.bus_name, interface=self.interface)


class DbusSession:
    def __init__(self, connection: DBusConnection) -> None:
        self._connection = connection
        self._signals: deque[Signal] = deque()

    @classmethod
    async def open(cls, address: str) -> Self:
        """Connect to "SYSTEM", "SESSION" (as jeepney reads them from the environment) or a D-Bus address."""
        try:
            connection = await open_dbus_connection(address)
        except KeyError as error:  # jeepney reads the environment variable with os.environ[...]
            raise BusUnavailableError(f"{error.args[0]} is not set") from error
        except (OSError, EOFError, RuntimeError, ValueError) as error:
            raise BusUnavailableError(one_line(str(error)) or type(error).__name__) from error
        return cls(connection)

    async def close(self) -> None:
        with contextlib.suppress(OSError):  # the peer already dropped it: nothing left to release
            await self._connection.close()

    async def call(self, target: Target, method: str, signature: str = "", *args: object) -> tuple[object, ...]:
        """Call `method` and return its answer's body; raise DbusCallError when the answer is an error."""
        message = new_method_call(target.address(), method, signature or None, args)
        serial = next(self._connection.outgoing_serial)
        try:
            await self._connection.send(message, serial=serial)
            while True:
                answer = await self._connection.receive()
                header = answer.header
                if header.message_type is MessageType.signal:
                    self._keep(answer)
                    continue
                if header.fields.get(HeaderFields.reply_serial) != serial:
                    continue  # an answer to nothing we are waiting for
                if header.message_type is MessageType.error:
                    name = str(header.fields.get(HeaderFields.error_name, "unknown error"))
                    text = answer.body[0] if answer.body and isinstance(answer.body[0], str) else ""
                    raise DbusCallError(name, one_line(text))
                return tuple(answer.body)
        except (OSError, EOFError) as error:
            raise BusLostError(f"connection closed during {method}") from error

    async def add_match(self, rule: str) -> None:
        await self.call(
            Target(bus_name=BUS_DAEMON.bus_name, path=BUS_DAEMON.object_path, interface=BUS_DAEMON.interface),
            "AddMatch",
            "s",
            rule,
        )

    async def next_signal(self) -> Signal:
        """The oldest signal not yet taken: one kept during a call, or the next that arrives."""
        if self._signals:
            return self._signals.popleft()
        try:
            while True:
                message = await self._connection.receive()
                if message.header.message_type is MessageType.signal:
                    return _signal(message)
        except (OSError, EOFError) as error:
            raise BusLostError("connection closed while waiting for a signal") from error

    async def get_property(self, target: Target, name: str) -> object:
        """`org.freedesktop.DBus.Properties.Get` on `target`'s interface; the variant's value."""
        properties = Target(bus_name=target.bus_name, path=target.path, interface=PROPERTIES_INTERFACE)
        (variant,) = await self.call(properties, "Get", "ss", target.interface, name)
        # jeepney gives a variant as (signature, value)
        if isinstance(variant, tuple) and len(variant) == 2:
            return variant[1]
        return variant

    def _keep(self, message: Message) -> None:
        self._signals.append(_signal(message))


def _signal(message: Message) -> Signal:
    fields = message.header.fields
    return Signal(
        path=str(fields.get(HeaderFields.path, "")),
        interface=str(fields.get(HeaderFields.interface, "")),
        member=str(fields.get(HeaderFields.member, "")),
        body=tuple(message.body),
    )
