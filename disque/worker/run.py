"""What `disque-worker`'s command line needs around the drivers: the settings, loading the
handler, structlog set-up, and the exit codes (defined with the drivers, in `driver`)."""

from __future__ import annotations

import importlib
import inspect
import logging
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import structlog

from disque.client.replies import Job
from disque.logs import configure_structlog, renderer_for
from disque.worker.driver import EXIT_ERROR, EXIT_FORCED, EXIT_OK, EXIT_USAGE, Fetch

__all__ = ["EXIT_ERROR", "EXIT_FORCED", "EXIT_OK", "EXIT_USAGE", "LEVELS", "Settings",
           "UsageError", "configure_logging", "is_async", "load_handler", "log"]

log = structlog.get_logger("disque.worker")


class UsageError(Exception):
    """A bad option or handler: reported on stderr, exit code 2."""


@dataclass(slots=True, frozen=True)
class Settings:
    """The worker's options, as the command line gave them."""

    handler_spec: str
    queues: tuple[str, ...]
    nodes: str
    password: str | None = None
    tls: dict[str, Any] = field(default_factory=dict)  # the client's ssl_* keywords
    concurrency: int = 1
    batch: int = 1
    timeout_ms: int = 1000
    burst: bool = False
    backoff: float = 1.0
    max_backoff: float = 300.0

    def fetch(self) -> Fetch:
        """What the drivers' fetch loops send (GETJOB ... WITHCOUNTERS, signals handled)."""
        return Fetch(self.queues, timeout_ms=self.timeout_ms, with_counters=True,
                     concurrency=self.concurrency, signals=True)


def load_handler(spec: str) -> Callable[[Job], Any]:
    """`package.module:callable` (or `package.module.callable`; `:obj.attr` works too)."""
    if ":" in spec:
        module_name, _, attr = spec.partition(":")
    else:
        module_name, _, attr = spec.rpartition(".")
    if not module_name or not attr:
        raise UsageError(f"handler {spec!r} is not of the form module:callable")
    # console scripts, unlike `python -m`, do not put the working directory on the path
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        obj: object = importlib.import_module(module_name)
    except ImportError as exc:
        raise UsageError(f"cannot import {module_name!r}: {exc}") from exc
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise UsageError(f"{module_name!r} has no attribute {attr!r}") from None
    if not callable(obj):
        raise UsageError(f"{spec!r} is not callable")
    return obj


def is_async(handler: Callable[..., Any]) -> bool:
    """A coroutine function, or an object whose __call__ is one: run on asyncio tasks."""
    call = type(handler).__call__ if not inspect.isroutine(handler) else None
    return inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(call)


LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING,
          "error": logging.ERROR}


def configure_logging(level: str, fmt: str) -> None:
    """structlog key-value events on stderr, as the server logs: console text or JSON."""
    configure_structlog(LEVELS[level], renderer_for(fmt), sys.stderr)
