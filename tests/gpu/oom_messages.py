"""Makes a real CUDA device run out of memory in the shapes vLLM's crash logs show, and keeps what was printed.

    python -m tests.gpu.oom_messages OUTDIR

Each case runs in a fresh process (an out-of-memory error can leave a CUDA context unusable) and lets its error go
uncaught, so OUTDIR/<case>.json holds the traceback exactly as a log would, with the figures measured just before
the failing call (CUDA's free and total memory, PyTorch's allocated and reserved bytes, the pids involved). The
doctor's tests read these texts on machines without a GPU (tests/doctor/test_real_torch_messages.py), so the
parser is held to the message of a real PyTorch, not to one written from its source.

Needs torch with CUDA and an NVIDIA GPU. Takes about a minute on an H200.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

GIB = 2**30
CASES = ("alone", "other_process", "fraction", "graph_capture", "expandable", "context_full", "cublas_handle")


def _figures(torch: Any, **extra: object) -> dict[str, object]:
    free, total = torch.cuda.mem_get_info()
    return {
        "free_bytes": free,
        "total_bytes": total,
        "allocated_bytes": torch.cuda.memory_allocated(),
        "reserved_bytes": torch.cuda.memory_reserved(),
        "pid": os.getpid(),
        "torch": torch.__version__,
        **extra,
    }


def _save(out: Path, figures: dict[str, object]) -> None:
    out.write_text(json.dumps(figures, indent=1))


def _hold(torch: Any, gib: float) -> list[Any]:
    """Memory held in 1 GiB tensors (what a model's weights look like to the allocator)."""
    whole, part = int(gib), gib - int(gib)
    held = [torch.empty(GIB, dtype=torch.uint8, device="cuda") for _ in range(whole)]
    if part:
        held.append(torch.empty(int(part * GIB), dtype=torch.uint8, device="cuda"))
    return held


def _ask_beyond_free(torch: Any, out: Path, **extra: object) -> None:
    figures = _figures(torch, **extra)
    asked = int(figures["free_bytes"]) + 2 * GIB  # type: ignore[call-overload]
    figures["asked_bytes"] = asked
    _save(out, figures)
    torch.empty(asked, dtype=torch.uint8, device="cuda")


def case(name: str, out: Path) -> None:
    import torch

    if name == "context_full":
        _save(out, {"holder_pid": int(os.environ["HOLDER_PID"]), "pid": os.getpid(), "torch": torch.__version__})
        torch.zeros(1, device="cuda")  # the first CUDA call makes this process's context on a card held full
        return
    torch.cuda.init()
    if name in ("alone", "expandable"):
        held = _hold(torch, 8)
        _ask_beyond_free(torch, out, held_gib=len(held))
    elif name == "other_process":
        held = _hold(torch, 4)
        _ask_beyond_free(torch, out, holder_pid=int(os.environ["HOLDER_PID"]), holder_gib=100)
    elif name == "fraction":
        torch.cuda.set_per_process_memory_fraction(0.25)
        held = _hold(torch, 10)
        figures = _figures(torch, fraction=0.25)
        figures["asked_bytes"] = 30 * GIB
        _save(out, figures)
        torch.empty(30 * GIB, dtype=torch.uint8, device="cuda")
    elif name == "graph_capture":
        static = torch.ones(1024, device="cuda")
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            (static * 2).sum()  # warm-up outside capture, as torch.cuda.graphs asks
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            pooled = [torch.empty(GIB, dtype=torch.uint8, device="cuda") for _ in range(2)]  # in the graph's pool
            _ask_beyond_free(torch, out, pooled_gib=len(pooled))
    elif name == "cublas_handle":
        a = torch.ones((256, 256), device="cuda")
        held = []
        for chunk in (GIB, 64 * 2**20, 2 * 2**20):
            try:
                while True:
                    held.append(torch.empty(chunk, dtype=torch.uint8, device="cuda"))
            except torch.OutOfMemoryError:
                pass  # filled to this chunk's size; cuBLAS's handle and workspace are not made yet
        _save(out, _figures(torch, held_chunks=len(held)))
        (a @ a).sum().item()
    else:
        raise SystemExit(f"unknown case {name}")


def holder_process(gib: float, *, leave_mib: int | None = None) -> subprocess.Popen[str]:
    """Another process on the card: holds `gib` GiB (or all but `leave_mib` MiB) and says when it does."""
    size = f"free - {leave_mib} * 2**20" if leave_mib is not None else f"int({gib} * 2**30)"
    code = (
        "import sys, time, torch\n"
        "free = torch.cuda.mem_get_info()[0]\n"
        f"size = {size}\n"
        "x = torch.empty(size, dtype=torch.uint8, device='cuda')\n"
        "print('holding', size, flush=True)\n"
        "time.sleep(600)\n"
    )
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None
    line = holder.stdout.readline()
    if not line.startswith("holding"):
        holder.kill()
        raise SystemExit(f"the holder did not start: {line!r}")
    return holder


def run_case(name: str, folder: Path) -> dict[str, Any]:
    env = dict(os.environ)
    holder = None
    try:
        if name == "other_process":
            holder = holder_process(100)
        elif name == "context_full":
            holder = holder_process(0, leave_mib=64)
    except SystemExit as failed:
        return {"case": name, "returncode": None, "seconds": 0, "figures": {}, "stderr": str(failed), "env": {}}
    if holder is not None:
        env["HOLDER_PID"] = str(holder.pid)
    if name == "expandable":
        env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    out = folder / f"{name}.figures.json"
    started = time.monotonic()
    try:
        done = subprocess.run(
            [sys.executable, "-m", "tests.gpu.oom_messages", "--case", name, str(out)],
            capture_output=True,
            text=True,
            env=env,
            timeout=90,
            check=False,
        )
    finally:
        if holder is not None:
            holder.kill()
            holder.wait()
    figures = json.loads(out.read_text()) if out.exists() else {}
    out.unlink(missing_ok=True)
    return {
        "case": name,
        "returncode": done.returncode,
        "seconds": round(time.monotonic() - started, 1),
        "figures": figures,
        "stderr": done.stderr[-20000:],
        "env": {key: env[key] for key in ("PYTORCH_CUDA_ALLOC_CONF",) if key in env},
    }


def main(argv: list[str]) -> int:
    if argv[:1] == ["--case"]:
        case(argv[1], Path(argv[2]))
        return 0
    folder = Path(argv[0])
    folder.mkdir(parents=True, exist_ok=True)
    for name in CASES:
        result = run_case(name, folder)
        (folder / f"{name}.json").write_text(json.dumps(result, indent=1))
        last = result["stderr"].strip().splitlines()[-1:] or ["(nothing on stderr)"]
        print(f"{name}: exit {result['returncode']} in {result['seconds']} s: {last[0][:300]}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
