"""The sampler thread: every interval, one sample of this process written atomically to ``<dir>/<pid>.json``.

Does I/O (the file, under the directory from ``VLLM_SIDECAR_PROBE_DIR``). A write goes to a temporary file
beside the target and is renamed over it, so the sidecar never reads half a document. The thread is a daemon:
it never holds up vLLM's exit, and at a normal exit it removes its own file (the sidecar removes the files of
processes that died without doing so). A process forked from one that samples starts its own thread.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import math
import os
import threading
from pathlib import Path

from vllm_sidecar_probe.sample import CudaReader, take_sample

DIR_VARIABLE = "VLLM_SIDECAR_PROBE_DIR"
INTERVAL_VARIABLE = "VLLM_SIDECAR_PROBE_INTERVAL"
DEFAULT_INTERVAL_S = 2.0
MIN_INTERVAL_S = 0.1  # a sample costs well under a millisecond; faster than this is a typo

_log = logging.getLogger("vllm.plugins.vllm_sidecar_probe")
_lock = threading.Lock()
_sampler: Sampler | None = None  # one per process: vLLM may call register more than once


def interval_from(text: str | None) -> float:
    if text is None or not text.strip():
        return DEFAULT_INTERVAL_S
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < MIN_INTERVAL_S:
        _log.warning(
            "%s=%r is not a number of seconds >= %s; sampling every %s s",
            INTERVAL_VARIABLE,
            text,
            MIN_INTERVAL_S,
            DEFAULT_INTERVAL_S,
        )
        return DEFAULT_INTERVAL_S
    return value


class Sampler:
    """Writes this process's sample every ``interval_s`` until the process ends or ``stop`` is called."""

    def __init__(self, directory: Path, interval_s: float) -> None:
        self.directory = directory
        self.interval_s = interval_s
        self.pid = os.getpid()
        self.path = directory / f"{self.pid}.json"
        self._reader = CudaReader()
        self._stopped = threading.Event()
        self._last_error: str | None = None
        self._thread = threading.Thread(target=self._run, name="vllm-sidecar-probe", daemon=True)

    def start(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        self.write_once()  # the first file is there before vLLM goes on, and a bad directory shows at once
        self._thread.start()
        atexit.register(self.stop)

    def stop(self) -> None:
        self._stopped.set()
        if os.getpid() == self.pid:
            with contextlib.suppress(OSError):
                self.path.unlink()

    def write_once(self) -> None:
        document = take_sample(self._reader, interval_s=self.interval_s)
        temporary = self.directory / f".{self.pid}.json.tmp"
        temporary.write_text(json.dumps(document, separators=(",", ":")), encoding="utf-8")
        temporary.replace(self.path)

    def _run(self) -> None:
        while not self._stopped.wait(self.interval_s):
            try:
                self.write_once()
            except Exception as error:  # noqa: BLE001 - the thread must outlive a full disk or a removed directory
                self._report(f"{type(error).__name__}: {error}")
            else:
                if self._last_error is not None:
                    _log.info("vllm-sidecar probe writing %s again", self.path)
                    self._last_error = None

    def _report(self, error: str) -> None:
        if error != self._last_error:  # once per distinct error, not every interval
            _log.warning("vllm-sidecar probe cannot write %s: %s", self.path, error)
            self._last_error = error


def start_from_environment() -> Sampler | None:
    """Starts this process's sampler when the directory is set; returns the running one."""
    global _sampler  # noqa: PLW0603 - one sampler per process is what the plugin is
    directory = os.environ.get(DIR_VARIABLE, "").strip()
    if not directory:
        return None
    with _lock:
        if _sampler is not None and _sampler.pid == os.getpid():
            return _sampler
        sampler = Sampler(Path(directory), interval_from(os.environ.get(INTERVAL_VARIABLE)))
        sampler.start()
        _sampler = sampler
    _log.info("vllm-sidecar probe writing %s every %s s", sampler.path, sampler.interval_s)
    return sampler


def _restart_in_child() -> None:
    """A forked child inherits the flag that vLLM's plugins are loaded, but not the thread: start its own."""
    global _sampler, _lock  # noqa: PLW0603 - the parent's lock may have been held by another thread at fork
    _lock = threading.Lock()
    if _sampler is not None:
        _sampler = None
        with contextlib.suppress(Exception):
            start_from_environment()


os.register_at_fork(after_in_child=_restart_in_child)
