"""An allocation pattern that fragments PyTorch's CUDA caching allocator, in phases, for the GPU tests.

Runs as a module (``python -m tests.gpu.fragment DIR``, the workload of the daemon test) or is called in
process. The allocator is capped with ``set_per_process_memory_fraction`` so the pattern reaches the cap in
seconds on any card.

1. hold: many tensors of 1-9 MiB (each carved from a 20 MiB segment: PyTorch splits large-pool segments);
2. punch: free every other one, in random order: the segments stay, with free pieces (inactive split bytes);
3. retry: tensors of 12-40 MiB until the cap; then free half of them and ask for larger ones, which fit no cached
   block: the allocator frees its cache and tries again (num_alloc_retries), and at the cap fails (num_ooms).
"""

from __future__ import annotations

import random
import sys
import time
from collections.abc import Callable
from typing import Any

MIB = 1 << 20


def hold(torch: Any, rng: random.Random, count: int = 400) -> list[Any]:
    return [
        torch.empty(rng.randint(1, 9) * MIB + rng.randint(0, MIB - 1), dtype=torch.uint8, device="cuda")
        for _ in range(count)
    ]


def punch(held: list[Any], rng: random.Random) -> None:
    order = list(range(0, len(held), 2))
    rng.shuffle(order)
    for index in order:
        held[index] = None


def fill_until_oom(torch: Any, rng: random.Random, low_mib: int, high_mib: int, into: list[Any]) -> bool:
    """Allocates until the cap; True when it ended in an OOM."""
    for _ in range(10_000):
        try:
            into.append(torch.empty(rng.randint(low_mib, high_mib) * MIB, dtype=torch.uint8, device="cuda"))
        except torch.OutOfMemoryError:
            return True
    return False


def run_phases(torch: Any, *, cap_bytes: int, seed: int, after_phase: Callable[[str], None]) -> list[Any]:
    """Runs the three phases, calling ``after_phase(name)`` after each; returns what it still holds."""
    _, total = torch.cuda.mem_get_info()
    torch.cuda.set_per_process_memory_fraction(cap_bytes / total)
    rng = random.Random(seed)  # noqa: S311 - a reproducible pattern, not a secret
    held = hold(torch, rng)
    after_phase("hold")
    punch(held, rng)
    after_phase("punch")
    big: list[Any] = []
    fill_until_oom(torch, rng, 12, 40, big)
    after_phase("fill")
    for round_number in range(3):
        del big[::2]  # their segments are free but cached: reserved, not allocated
        fill_until_oom(torch, rng, 41 + 10 * round_number, 50 + 10 * round_number, big)
        after_phase(f"retry{round_number}")
    return [held, big]


def main() -> int:
    """Workload for the daemon test (arguments: seed, seconds to wait before fragmenting): the plugin samples
    this process while it fragments, then holds."""
    import torch  # only on a GPU machine

    import vllm_sidecar_probe  # as vLLM would load it, after torch

    torch.cuda.init()
    torch.empty(1, device="cuda")
    vllm_sidecar_probe.register()
    print("sampling", flush=True)
    time.sleep(float(sys.argv[2]) if len(sys.argv) > 2 else 0.0)  # the sidecar sees the quiet allocator first
    kept = run_phases(
        torch,
        cap_bytes=4 << 30,
        seed=int(sys.argv[1]) if len(sys.argv) > 1 else 0,
        after_phase=lambda name: print(name, flush=True),
    )
    print("holding", flush=True)
    time.sleep(3600)
    return 0 if kept else 1


if __name__ == "__main__":
    raise SystemExit(main())
