"""`vllm-sidecar doctor`: classifies a deployment against the four OOM root causes and recommends vLLM flags.

The pure core (evidence, log parsing, version table, rules, formulas, rendering) does no I/O; `gather`
and `command` are the thin shell that reads vLLM, the GPUs, the log and the history.
"""
