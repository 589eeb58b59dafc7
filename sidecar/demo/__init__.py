"""`vllm-sidecar demo`: the simulator and the daemon together on loopback, with a live terminal view."""
