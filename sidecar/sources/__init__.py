"""Adapters that read the outside world (vLLM over HTTP, NVML) into model values; they do I/O."""
