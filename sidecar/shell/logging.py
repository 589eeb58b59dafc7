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
    # Plain tracebacks: with `rich` installed the console renderer's default prints every frame's local
    # variables, and a local can be a webhook URL, a token or a key.
    renderer: structlog.typing.Processor = (
        structlog.dev.ConsoleRenderer(colors=out.isatty(), exception_formatter=structlog.dev.plain_traceback)
        if console
        else structlog.processors.JSONRenderer()
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
            # format_exc_info turns a library's exc_info into traceback text before rendering (JSON would
            # otherwise print the reprs of the exception tuple and lose the traceback).
            processors=[
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                structlog.processors.format_exc_info,
                renderer,
            ],
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(_LEVELS[level])
    # These log every job run and request at INFO; only their warnings (a skipped, overlapping tick) matter.
    for chatty in ("apscheduler", "httpx", "httpcore"):
        logging.getLogger(chatty).setLevel(max(logging.WARNING, _LEVELS[level]))
