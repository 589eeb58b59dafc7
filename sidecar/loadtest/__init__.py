"""`vllm-sidecar loadtest`: a peak-load profile against any OpenAI-compatible server, with a verdict.

Pure: `spec` (the options, length distributions, prompts), `result` (one request's outcome), `sse` (reading
one streamed answer), `metrics` (KV peak, preemptions, signs of death), `summary` (counts, percentiles,
verdict) and `report` (text and JSON). I/O: `client` (one request), `monitor` (probes and /metrics
polling), `runner` (arrivals and bounds), `progress` (the bar on stderr) and `command` (the CLI entry
points `add_arguments` and `run`).
"""
