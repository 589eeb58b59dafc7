"""vLLM's processes as this sidecar sees them in /proc. Reads /proc; call it off the event loop.

What is vLLM's is decided by `sidecar.parse.vllm_process` from each process's command line (vLLM's titles),
state and parent. A process that goes while the table is read is simply not in it. Where the sidecar shares no
process namespace with vLLM (another container of the pod without `shareProcessNamespace`), the table holds
none of vLLM's processes, and the caller says so.
"""

from __future__ import annotations

import os
from pathlib import Path

from sidecar.parse.vllm_process import ProcessEntry, VllmProcesses, vllm_processes
from sidecar.sources.proc import read_proc_text


def read_process_table(proc: Path = Path("/proc")) -> list[ProcessEntry]:
    """Every process /proc lists that could be read; never raises."""
    try:
        names = [entry.name for entry in proc.iterdir() if entry.name.isdigit()]
    except OSError:
        return []
    table: list[ProcessEntry] = []
    for name in names:
        stat = read_proc_text(proc / name / "stat")
        if stat is None:
            continue  # gone meanwhile
        fields = stat.rpartition(")")[2].split()
        if len(fields) < 2 or not fields[1].isdigit():
            continue
        command = (read_proc_text(proc / name / "cmdline") or "").replace("\0", " ").strip()
        table.append(ProcessEntry(pid=int(name), ppid=int(fields[1]), command=command, state=fields[0]))
    return table


def find_vllm_processes(port: int, *, proc: Path = Path("/proc"), own_pid: int | None = None) -> VllmProcesses:
    return vllm_processes(read_process_table(proc), port=port, own_pid=os.getpid() if own_pid is None else own_pid)
