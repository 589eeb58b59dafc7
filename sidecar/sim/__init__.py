"""A simulated vLLM server on a simulated GPU, for demos and tests. An independent witness: it shares no
code with the sidecar's parsing, derivation or policy, only the public metric names."""
