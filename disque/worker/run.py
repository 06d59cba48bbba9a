"""What both drivers (`threads`, `aio`) share: the handler they run, the settings, how a
`Command` maps onto a client method, logging, and the exit codes."""

from __future__ import annotations

import importlib
import inspect
import logging
import os
import sys
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import structlog

from disque.client import Job
from disque.logs import configure_structlog, renderer_for
from disque.worker.core import (
    ACK,
    ENQUEUE,
    NACK,
    SHOW,
    WORKING,
    Command,
    WorkerCore,
    attempt_of,
)

log = structlog.get_logger("disque.worker")

# Exit codes (documented in `disque-worker --help` and the README).
EXIT_OK = 0       # stopped by a signal after finishing its jobs, or --burst found no more
EXIT_ERROR = 1    # no node reachable at start, authentication refused, a fatal error
EXIT_USAGE = 2    # bad command line, or the handler cannot be imported
EXIT_FORCED = 3   # a second signal: running jobs were left to their RETRY


class UsageError(Exception):
    """A bad option or handler: reported on stderr, exit code 2."""


@dataclass(slots=True, frozen=True)
class Settings:
    """The worker's options, as the command line gave them."""

    handler_spec: str
    queues: tuple[str, ...]
    nodes: str
    password: str | None = None
    concurrency: int = 1
    batch: int = 1
    timeout_ms: int = 1000
    burst: bool = False
    backoff: float = 1.0
    max_backoff: float = 300.0


class Driver:
    """What the threaded and the asyncio driver share: stopping, and the exit code. `lock`
    guards the core (a `threading.Lock`, or a null context on the event loop); `stopping`
    and `forced` are events of the driver's kind, set here."""

    stopping: Any
    forced: Any

    def __init__(self, client: Any, handler: Callable[[Job], Any], settings: Settings,
                 core: WorkerCore, lock: AbstractContextManager[Any]) -> None:
        self.client = client
        self.handler = handler
        self.settings = settings
        self.core = core
        self.lock = lock
        self.fatal: BaseException | None = None

    def stop(self, reason: str) -> None:
        """A stop request (signal, fatal error); a second signal forces the exit."""
        with self.lock:
            forced = self.core.stop(reason)
            running, held = len(self.core.running), len(self.core.held)
        self.stopping.set()
        if forced:
            self.forced.set()
        log.info("worker.stopping", reason=reason, forced=forced, running=running, held=held)

    def _fatal(self, exc: BaseException) -> None:
        """Stop for good, but gracefully: jobs running are finished, held ones given back."""
        log.error("worker.fatal", error=repr(exc), exc_info=exc)
        if self.fatal is None:
            self.fatal = exc
            if self.core.fetching:
                self.stop("fatal error")

    def job_failed(self, job: Job, node: Any, exc: BaseException) -> Command:
        """The handler raised: the NACK to send, and the failure's log line."""
        with self.lock:
            command = self.core.failed(job, node)
        log.warning("job.failed", job=job.id, queue=job.queue, attempt=attempt_of(job),
                    nack_delay=command.delay, error=repr(exc), exc_info=exc)
        return command

    def not_sent(self, command: Command, exc: BaseException) -> Command | None:
        """`command` failed: the same for another node (logged: its node is gone), or None
        when given up (an ACK/NACK lost is logged: the job comes back after its RETRY)."""
        with self.lock:
            retry = self.core.not_sent(command, exc)
        if retry is not None:
            log.info("job.command_elsewhere", command=command.kind.upper(),
                     job=command.job_id, node=getattr(command.node, "addr", None),
                     error=str(exc))
        elif command.kind in (ACK, NACK):
            log.warning("job.command_failed", command=command.kind.upper(),
                        job=command.job_id, error=str(exc),
                        note="the job comes back after its RETRY")
        return retry

    def exit_code(self) -> int:
        if self.forced.is_set():
            return EXIT_FORCED
        return EXIT_ERROR if self.fatal is not None else EXIT_OK


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
        obj: Any = importlib.import_module(module_name)
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


def client_call(client: Any, command: Command) -> Any:
    """Send `command` with `client` (a `Client`: the reply; an `AsyncClient`: an awaitable)."""
    if command.kind == ACK:
        return client.ack_job(command.job_id, node=command.node)
    if command.kind == NACK:
        return client.nack(command.job_id, delay=command.delay or None, node=command.node)
    if command.kind == ENQUEUE:
        return client.enqueue(command.job_id, node=command.node)
    if command.kind == WORKING:
        return client.working(command.job_id, node=command.node)
    assert command.kind == SHOW
    return client.show(command.job_id, node=command.node)


LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING,
          "error": logging.ERROR}


def configure_logging(level: str, fmt: str) -> None:
    """structlog key-value events on stderr, as the server logs: console text or JSON."""
    configure_structlog(LEVELS[level], renderer_for(fmt), sys.stderr)
