"""The allocator probe: a vLLM general plugin that writes PyTorch's CUDA allocator statistics to a file.

vLLM calls ``register`` in every process it starts (API server, engine core, workers) through the entry point
``vllm_sidecar_probe`` in group ``vllm.general_plugins``. It does nothing unless ``VLLM_SIDECAR_PROBE_DIR`` is
set; then a daemon thread writes ``<dir>/<pid>.json`` every ``VLLM_SIDECAR_PROBE_INTERVAL`` seconds (default 2),
which the sidecar reads with ``--probe-dir``.

This package runs inside vLLM: it imports only the standard library at load, never imports torch itself (it
reads torch only where vLLM already imported it), never initialises CUDA, and never raises into vLLM. It
imports nothing of the sidecar, so it works with none of the sidecar's dependencies installed.
"""

from __future__ import annotations

import logging

from vllm_sidecar_probe.writer import start_from_environment

# A child of vLLM's logger, so its lines carry vLLM's format and process prefix where vLLM set them up.
_log = logging.getLogger("vllm.plugins.vllm_sidecar_probe")


def register() -> None:
    """vLLM's entry point. Starts the sampler in this process when the probe directory is set; idempotent."""
    try:
        start_from_environment()
    except Exception as error:  # noqa: BLE001 - a plugin must never stop vLLM from starting
        _log.warning("vllm-sidecar probe not started: %s", error)
