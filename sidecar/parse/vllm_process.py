"""Which processes are vLLM's, from a process table (as /proc shows it): their titles and parentage. Pure.

vLLM's API server keeps its command line (`vllm serve ...`, `python -m vllm.entrypoints.openai.api_server
...`); the processes it starts retitle themselves with setproctitle (`VLLM::EngineCore`, `VLLM::EngineCore_DP0`,
`VLLM::Worker_TP0`, `VLLM::APIServer_0`, `VLLM::DPCoordinator`; the prefix is `VLLM_PROCESS_NAME_PREFIX`).
vLLM's processes for one server are the API server for the sidecar's port and its descendants that carry such
a title (not the `multiprocessing` resource tracker, which holds nothing of vLLM's). Where no server for the
port is seen (its API server died and left its engines, or it was started another way), every titled process
is taken, and the caller is told so.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum

VLLM_DEFAULT_PORT = 8000
TITLE_PREFIX = "VLLM::"
_SERVER = re.compile(r"(?:^|[/\s])vllm\s+serve(?:\s|$)|vllm\.entrypoints\.openai\.api_server")
_PORT = re.compile(r"(?:^|\s)--port(?:=|\s+)(\d+)(?:\s|$)")
_GONE = frozenset({"Z", "X"})  # zombie, dead: nothing left to read


class ProcessRole(StrEnum):
    API_SERVER = "api_server"
    ENGINE_CORE = "engine_core"
    WORKER = "worker"
    COORDINATOR = "coordinator"
    OTHER = "other"  # another VLLM:: title


# The order stacks are listed in: the engine first, where a hang shows.
ROLE_ORDER = (ProcessRole.ENGINE_CORE, ProcessRole.WORKER, ProcessRole.API_SERVER, ProcessRole.COORDINATOR)
_TITLED_ROLES = (
    ("EngineCore", ProcessRole.ENGINE_CORE),
    ("Worker", ProcessRole.WORKER),
    ("APIServer", ProcessRole.API_SERVER),
    ("DPCoordinator", ProcessRole.COORDINATOR),
)


@dataclass(frozen=True, slots=True, kw_only=True)
class ProcessEntry:
    """One process as /proc shows it."""

    pid: int
    ppid: int
    command: str  # /proc/PID/cmdline, arguments joined by spaces; "" when unreadable
    state: str  # the state letter of /proc/PID/stat (R, S, T: stopped, Z: zombie...)


@dataclass(frozen=True, slots=True, kw_only=True)
class VllmProcess:
    pid: int
    role: ProcessRole
    title: str  # its command line, shortened for a manifest line
    command: str  # its whole command line, secrets redacted
    state: str


@dataclass(frozen=True, slots=True, kw_only=True)
class VllmProcesses:
    processes: tuple[VllmProcess, ...]  # in ROLE_ORDER, then by pid
    note: str | None  # how they were found when not by the server for the port; None otherwise


def serves_port(command: str, port: int) -> bool:
    """Whether `command` is a vLLM OpenAI server for `port`."""
    if not _SERVER.search(command):
        return False
    given = _PORT.search(command)
    return (int(given.group(1)) if given else VLLM_DEFAULT_PORT) == port


def role_of(command: str) -> ProcessRole | None:
    """The role a vLLM process's title or command line says; None for a process that is not vLLM's."""
    if command.startswith(TITLE_PREFIX):
        name = command[len(TITLE_PREFIX) :]
        return next((role for prefix, role in _TITLED_ROLES if name.startswith(prefix)), ProcessRole.OTHER)
    return ProcessRole.API_SERVER if _SERVER.search(command) else None


def vllm_processes(table: Iterable[ProcessEntry], *, port: int, own_pid: int) -> VllmProcesses:
    """vLLM's processes for the server at `port`: its API server and the titled processes below it."""
    alive = {entry.pid: entry for entry in table if entry.state not in _GONE and entry.pid != own_pid}
    children: dict[int, list[int]] = {}
    for entry in alive.values():
        children.setdefault(entry.ppid, []).append(entry.pid)
    roots = [pid for pid, entry in alive.items() if serves_port(entry.command, port)]
    note = None
    if roots:
        found = set(roots)
        stack = list(roots)
        while stack:
            for child in children.get(stack.pop(), ()):
                if child not in found and alive[child].command.startswith(TITLE_PREFIX):
                    found.add(child)
                    stack.append(child)
    else:
        found = {pid for pid, entry in alive.items() if entry.command.startswith(TITLE_PREFIX)}
        if found:
            note = f"no vLLM server for port {port} seen; took every process titled {TITLE_PREFIX}*"
    processes = [_process(alive[pid]) for pid in found]
    rank = {role: index for index, role in enumerate(ROLE_ORDER)}
    processes.sort(key=lambda process: (rank.get(process.role, len(rank)), process.pid))
    return VllmProcesses(processes=tuple(processes), note=note)


def _process(entry: ProcessEntry) -> VllmProcess:
    command = redacted(" ".join(entry.command.split()))
    return VllmProcess(
        pid=entry.pid,
        role=role_of(entry.command) or ProcessRole.OTHER,
        title=_short(command),
        command=command,
        state=entry.state,
    )


def _short(flat: str, limit: int = 160) -> str:
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


# vLLM's flags that take a secret (`--api-key`, `--hf-token`, `--s3-secret-access-key`, ...), and any flag named so.
_SECRET_FLAG = re.compile(r"^--?[a-z0-9-]*(?:api-key|token|secret|password|passwd|credential|access-key)[a-z0-9-]*$")
_NOT_SECRET = re.compile(r"tokens|tokenizer|token-(?:threshold|budget|prob)|-tokens?-")
REDACTED = "***"


def redacted(command: str) -> str:
    """`command` with the values of its secret flags replaced by ***: a command line reaches logs, incident
    folders and /status, and `vllm serve --api-key KEY` must not take its key there. Every word after such a
    flag is its value until the next flag, as argparse reads `--api-key K1 K2`."""
    words: list[str] = []
    hiding = False
    for word in command.split(" "):
        name, equals, _ = word.partition("=")
        if word.startswith("-"):
            hiding = bool(_SECRET_FLAG.match(name)) and not _NOT_SECRET.search(name)
            words.append(f"{name}={REDACTED}" if hiding and equals else word)
            hiding = hiding and not equals
        else:
            words.append(REDACTED if hiding and word else word)
    return " ".join(words)


# py-spy's header: `Process PID: <argv joined by spaces>`, then `Python vX.Y.Z (...)`. An argument may hold newlines
# (`python -c CODE`), so the command line runs to the Python line, or to the end of its own line without one.
_DUMP_HEADER = re.compile(r"^(Process \d+: )(.*?)(?=\nPython v)|^(Process \d+: )(.*)$", re.MULTILINE | re.DOTALL)


def redacted_dump(text: str) -> str:
    """py-spy's dump with the command line of its `Process PID:` header redacted as `redacted` does."""

    def redact(match: re.Match[str]) -> str:
        if match.group(1) is not None:
            return match.group(1) + redacted(match.group(2))
        head, _, rest = match.group(4).partition("\n")
        return match.group(3) + redacted(head) + (_ + rest if _ else "")

    return _DUMP_HEADER.sub(redact, text, count=1)
