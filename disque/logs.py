"""structlog set up the one way disque-py logs: key-value events with level and UTC ISO time,
exceptions rendered, through a renderer (console text or JSON lines) to one stream. The
server (`process.configure_logging`, from disque.conf) and `disque-worker` (from its command
line) both use it."""

from __future__ import annotations

from typing import Any, TextIO

import structlog


def renderer_for(fmt: str) -> Any:
    """`json` -> one JSON object per line; anything else -> console text without colours."""
    return (structlog.processors.JSONRenderer() if fmt == "json"
            else structlog.dev.ConsoleRenderer(colors=False))


def configure_structlog(level: int, renderer: Any, stream: TextIO) -> None:
    structlog.configure(
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=structlog.PrintLoggerFactory(stream),
        cache_logger_on_first_use=False,
    )
