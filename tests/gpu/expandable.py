"""The fragmenting workload of tests/gpu/fragment.py with and without PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
(the doctor's and the runbook's remedy for allocator fragmentation), each in a fresh process: prints one JSON line
per setting with the allocator's numbers after every phase, as the plugin samples them. A measurement to run on a
GPU machine (`python -m tests.gpu.expandable`), not a test: what the remedy does is PyTorch's behaviour to record,
not ours to assert. The figures are in docs/gpu-runs.md.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

_CHILD = """
import json, torch
from tests.gpu.fragment import run_phases
from vllm_sidecar_probe.sample import CudaReader, take_sample
torch.empty(1, device="cuda")
reader, phases = CudaReader(), {}
def after(name):
    (device,) = take_sample(reader, interval_s=2.0)["cuda"]["devices"]
    phases[name] = {k: device[k] for k in ("reserved_bytes", "inactive_split_bytes", "num_alloc_retries", "num_ooms")}
run_phases(torch, cap_bytes=4 << 30, seed=1, after_phase=after)
print(json.dumps(phases))
"""


def main() -> int:
    for setting in (None, "expandable_segments:True"):
        env = {k: v for k, v in os.environ.items() if k != "PYTORCH_CUDA_ALLOC_CONF"}
        if setting is not None:
            env["PYTORCH_CUDA_ALLOC_CONF"] = setting
        done = subprocess.run([sys.executable, "-c", _CHILD], env=env, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            print(json.dumps({"setting": setting, "error": done.stderr[-2000:]}))
            continue
        print(json.dumps({"setting": setting, "phases": json.loads(done.stdout.strip().splitlines()[-1])}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
