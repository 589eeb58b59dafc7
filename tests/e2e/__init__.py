"""End-to-end tests against real components (a real vLLM server on CPU)."""
