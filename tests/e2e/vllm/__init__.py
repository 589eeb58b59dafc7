"""Harness for a real vLLM 0.32 server on CPU: install lock, tiny model, server control, load driver.

The package is named after what it drives; it never imports the real ``vllm`` (that lives in its own venv).
"""
