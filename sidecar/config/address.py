"""HOST:PORT of a listening socket, for the daemon's --listen and the simulator's. Pure; no I/O.

Apart from the settings so the simulator, an independent witness, can read its --listen without importing the
daemon's settings (which import the pure core's defaults).
"""

from __future__ import annotations


def split_listen(value: str) -> tuple[str, int]:
    host, separator, port_text = value.rpartition(":")
    if not separator or not port_text.isdigit() or int(port_text) > 65535:
        raise ValueError("not HOST:PORT")
    host = host.removeprefix("[").removesuffix("]")
    return host, int(port_text)
