"""Chaos tests (issue 7, "Prove it"): one fault at a time, injected on loopback into a real sidecar process.

Each test bounds its own time and asserts three things: what the sidecar did (its /status, /readyz, /metrics,
JSON log events and notifications), that the daemon survived (never exited, never logged a traceback), and
what was lost once the fault cleared: nothing (its values equal vLLM's own again, parsed with prometheus_client,
its `_total` series never went backwards, no restart beyond the budget, the ledger intact).

The real vLLM on CPU is only in `test_real_vllm_chaos.py` (one start for the whole module); everything else
uses the simulator or a scripted loopback vLLM.
"""
