"""tpu-inference's memory lines (vLLM's TPU backend): the device's size and its own refusal of a short budget.

Each device's HBM is stated at start (`Init worker | ... hbm=[(used, total), ...]GiB`): the card's size, which
XLA's out-of-memory errors do not give. A budget below what is resident is refused in tpu-inference's own words
("total_hbm_used_gb=U exceeds total_hbm_limit_gb=C by D GiB. Please consider increasing --gpu-memory-utilization
from X"; later releases name C `total_hbm_limit_cap_gb`): the sums over every device, read as one device's where
the log does not say how many there are.

Not read: the `Memory statistics` line's weights and KV cache per device. tpu-inference sizes the KV cache over
every device while a model axis narrower than the mesh holds it on fewer (`Init model` shows devices with no
weights), and the doctor's GPU shares for what fits do not carry over to XLA; reading them as a GPU's points the
budget the wrong way (docs/doctor.md, known misses). Where tpu-inference refuses the budget itself, the ledger
knows the device is an XLA one: no CUDA context beside the budget, so weights fit up to a higher share and the
budget may go higher than a GPU's (ledger.py).
"""

from __future__ import annotations

import re
from dataclasses import replace

from sidecar.doctor.log_records import error_text, loose
from sidecar.doctor.logfacts import Facts, MemoryProfile, Refusal, RefusalKind

_PAIR = re.compile(r"\((-?[\d.]+), ([\d.]+)\)")
HBM_DEVICES = loose(r"Init (worker|model) \|.*?hbm=\[(\(.*?\))\]GiB")
BUDGET_BELOW_RESIDENT = loose(
    r"total_hbm_used_gb=([\d.]+)GiB exceeds total_hbm_limit(?:_cap)?_gb=([\d.]+)GiB by ([\d.]+)GiB\.? Please consider "
    r"increasing --gpu-memory-utilization from ([\d.]+)"
)


def hbm_devices(match: re.Match[str], facts: Facts) -> None:
    """Each device's HBM: the card's size, as the memory-profiling line gives it on a GPU."""
    pairs = [(float(used), float(total)) for used, total in _PAIR.findall(match.group(2))]
    if not pairs:
        return
    facts["tpu_devices"] = len(pairs)
    facts["tpu_device_gib"] = device = max(total for _, total in pairs)
    if not isinstance(facts.get("profile"), MemoryProfile):
        facts["profile"] = replace(MemoryProfile.empty("tpu-inference's per-device HBM line"), total_gib=device)


def budget_below_resident(match: re.Match[str], facts: Facts) -> None:
    used, cap, short, utilization = (float(match.group(i)) for i in range(1, 5))
    if utilization <= 0:
        return
    limit = cap / utilization
    devices = _devices(facts, limit)
    facts["refusal"] = Refusal(kind=RefusalKind.NO_CACHE_MEMORY, line=error_text(match))
    facts["xla_refusal"] = True
    facts["profile"] = MemoryProfile(
        total_gib=limit / devices,
        utilization=utilization,
        budget_gib=cap / devices,
        weights_gib=used / devices,
        activation_gib=None,
        non_torch_gib=None,
        kv_gib=-short / devices,
        source="tpu-inference's refusal" + ("" if devices > 1 else ", its sums over every device"),
    )
    facts.setdefault("weights_gib", used / devices)
    facts["available_kv_gib"] = -short / devices


def _devices(facts: Facts, limit_gib: float) -> int:
    """The devices the sums are over: the per-device lines' count, else the sums read as one device's."""
    devices = facts.get("tpu_devices")
    device_gib = facts.get("tpu_device_gib")
    # The limit is every device's HBM: trust the count only where the two agree.
    agree = (
        isinstance(devices, int)
        and isinstance(device_gib, float)
        and abs(devices * device_gib - limit_gib) <= 0.05 * limit_gib
    )
    return devices if agree and isinstance(devices, int) else 1
