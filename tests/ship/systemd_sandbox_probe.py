"""Reports, as one JSON object on stdout, what a process may do: run inside the shipped unit's sandbox, and
outside it as a control. Run by the container's Python (the sidecar's virtual environment); stdlib and the
sidecar's own dependencies only. I/O: it tries writes, sockets and memory mappings and says what happened.

Each check is a string: "ok", or the errno name of the refusal ("EROFS", "EPERM"...), so the test compares
the sandboxed run with the unsandboxed one, and a sandbox that does nothing cannot pass.
"""

from __future__ import annotations

import ctypes
import errno
import json
import mmap
import os
import pwd
import socket
import sys
from collections.abc import Callable
from pathlib import Path

STATE_DIR = Path("/var/lib/vllm-sidecar")
UNWRITABLE_DIR = Path("/srv/sidecar-owned")  # owned by the sidecar's user; keep in step with systemd_install
HOME_DIR = Path("/home/someone")


def attempt(action: Callable[[], object]) -> str:
    try:
        action()
    except OSError as error:
        return errno.errorcode.get(error.errno or 0, str(error))
    return "ok"


def write(folder: Path) -> None:
    path = folder / f"probe-{os.getpid()}"
    path.write_text("probe\n")
    path.unlink()


def map_writable_executable() -> None:
    mmap.mmap(-1, mmap.PAGESIZE, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC).close()


def netlink_socket() -> None:
    socket.socket(socket.AF_NETLINK, socket.SOCK_RAW).close()


def ctypes_callback() -> None:
    # what NVML's Python binding relies on: libffi closures, which need W+X memory unless they use trampolines
    add_one = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int)(lambda value: value + 1)
    if add_one(41) != 42:
        raise OSError(errno.EIO, "the ctypes callback returned the wrong value")


def compiled_extensions() -> None:
    import pydantic_core  # noqa: F401 - importing the Rust extension is the check
    import pynvml  # noqa: F401
    import yaml

    if not yaml.__with_libyaml__:
        raise OSError(errno.ENOENT, "PyYAML without its C extension")


def proc_status() -> dict[str, str]:
    fields = dict(line.split(":\t", 1) for line in Path("/proc/self/status").read_text().splitlines() if ":\t" in line)
    return {key: fields[key].strip() for key in ("CapEff", "CapBnd", "NoNewPrivs", "Seccomp")}


def main() -> None:
    report: dict[str, object] = {
        "user": pwd.getpwuid(os.getuid()).pw_name,
        "status": proc_status(),
        "write_state_dir": attempt(lambda: write(STATE_DIR)),
        "write_own_dir_outside_state_dir": attempt(lambda: write(UNWRITABLE_DIR)),
        "list_home": attempt(lambda: os.listdir(HOME_DIR)),
        "map_writable_executable": attempt(map_writable_executable),
        "netlink_socket": attempt(netlink_socket),
        "ctypes_callback": attempt(ctypes_callback),
        "compiled_extensions": attempt(compiled_extensions),
        # another user's process (PID 1 is root's): the sidecar must still read it to tell vLLM's GPU memory apart
        "read_other_users_cmdline": attempt(lambda: Path("/proc/1/cmdline").read_bytes()),
    }
    json.dump(report, sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
