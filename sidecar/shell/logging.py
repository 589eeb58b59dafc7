"""structlog set-up: JSON lines for machines, console rendering on a terminal. Configures process state."""

from __future__ import annotations

import logging
import sys
from typing import TextIO

import structlog

_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
    "critical": logging.CRITICAL,
}


def configure_logging(*, level: str, log_format: str, stream: TextIO | None = None) -> None:
    """Route structlog and the standard library (APScheduler, asyncio) through one renderer on stderr."""
    out = stream if stream is not None else sys.stderr
    console = log_format == "console" or (log_format == "auto" and out.isatty())
    renderer: structlog.typing.Processor = (
        structlog.dev.ConsoleRenderer(colors=out.isatty()) if console else structlog.processors.JSONRenderer()
    )
    shared: list[structlog.typing.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    structlog.configure(
        processors=[*shared, structlog.processors.format_exc_info, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(_LEVELS[level]),
        logger_factory=structlog.PrintLoggerFactory(file=out),
        cache_logger_on_first_use=False,
    )
    handler = logging.StreamHandler(out)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=[*shared, structlog.stdlib.add_logger_name],
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer],
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(_LEVELS[level])
    # These log every job run and request at INFO; only their warnings (a skipped, overlapping tick) matter.
    for chatty in ("apscheduler", "httpx", "httpcore"):
        logging.getLogger(chatty).setLevel(max(logging.WARNING, _LEVELS[level]))
