"""`vllm-sidecar doctor`, the tool: its options and the evidence it gathers (vLLM, NVML, a log, history); the
reading of that evidence is sidecar.doctor, the pure core the daemon shares."""
