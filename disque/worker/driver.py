"""What both drivers of the consume policy (`threads`, `aio`) share: the fetch settings, how
they stop, what they log, and the exit codes of `disque-worker`.

A driver moves the `WorkerCore`'s decisions to and from a client and nothing else; the same
two drivers run `disque-worker` and the client's `consume()` (each with its core settings
and its log). This module imports only the client's pure parts and no logging framework:
the client stays importable on Spark executors that have redis-py alone; `disque-worker`
passes its structlog logger, `consume()` an adapter onto stdlib `logging`.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol

from disque.client.nodes import Node
from disque.client.replies import Job
from disque.worker.core import ACK, NACK, Command, WorkerCore, attempt_of

# Exit codes (documented in `disque-worker --help` and the README).
EXIT_OK = 0       # stopped by a signal after finishing its jobs, or --burst found no more
EXIT_ERROR = 1    # no node reachable at start, authentication refused, a fatal error
EXIT_USAGE = 2    # bad command line, or the handler cannot be imported
EXIT_FORCED = 3   # a second signal: running jobs were left to their RETRY


class EventLog(Protocol):
    """Key-value events (structlog's bound logger has this shape; `StdlibEvents` too)."""

    def info(self, event: str, **fields: Any) -> object: ...

    def warning(self, event: str, **fields: Any) -> object: ...

    def error(self, event: str, **fields: Any) -> object: ...


class StdlibEvents:
    """`EventLog` onto a stdlib logger: `event key=value ...` lines."""

    def __init__(self, logger: logging.Logger) -> None:
        self.logger = logger

    def _log(self, level: int, event: str, fields: dict[str, Any]) -> None:
        if self.logger.isEnabledFor(level):
            exc_info = fields.pop("exc_info", None)
            text = " ".join(f"{k}={v!r}" if isinstance(v, str) and " " in v else f"{k}={v}"
                            for k, v in fields.items())
            self.logger.log(level, "%s %s", event, text, exc_info=exc_info)

    def info(self, event: str, **fields: Any) -> None:
        self._log(logging.INFO, event, fields)

    def warning(self, event: str, **fields: Any) -> None:
        self._log(logging.WARNING, event, fields)

    def error(self, event: str, **fields: Any) -> None:
        self._log(logging.ERROR, event, fields)


class Event(Protocol):
    """`threading.Event` or `asyncio.Event`: what the shared code does with them."""

    def set(self) -> None: ...

    def is_set(self) -> bool: ...


@dataclass(slots=True, frozen=True)
class Fetch:
    """What each fetch loop's GETJOB asks: `queues`, TIMEOUT `timeout_ms` (also how soon a
    stop is noticed), WITHCOUNTERS; `concurrency` loops (threads or tasks); `signals`:
    SIGINT/SIGTERM stop the driver (from the main thread only, for threads)."""

    queues: Sequence[str | bytes]
    timeout_ms: int = 1000
    with_counters: bool = True
    concurrency: int = 1
    signals: bool = True


class Driver:
    """What the threaded and the asyncio driver share: stopping, failures, the exit code.
    `lock` guards the core (a `threading.Lock`, or a null context on the event loop);
    `stopping` (set on any stop, or by the caller to stop) and `forced` are events of the
    driver's kind."""

    stopping: Event
    forced: Event

    def __init__(self, core: WorkerCore, fetch: Fetch, log: EventLog,
                 lock: AbstractContextManager[object]) -> None:
        self.core = core
        self.fetch = fetch
        self.log = log
        self.lock = lock
        self.fatal: BaseException | None = None

    def stop(self, reason: str) -> None:
        """A stop request (signal, fatal error); a second signal may force the exit."""
        with self.lock:
            forced = self.core.stop(reason)
            running, held = len(self.core.running), len(self.core.held)
        self.stopping.set()
        if forced:
            self.forced.set()
        self.log.info("worker.stopping", reason=reason, forced=forced, running=running,
                      held=held)

    def may_fetch(self) -> int:
        """How many jobs the next GETJOB may ask for; 0 ends the fetch loop. Also where a
        stop asked through `stopping` (the caller's stop event) reaches the core."""
        with self.lock:
            if self.stopping.is_set() and self.core.fetching:
                self.core.stop("stop event")
            want = self.core.fetch_count()
            done = not self.core.fetching
        if done:
            self.stopping.set()  # (max_jobs: wakes the other loops' waits)
        return want

    def _fatal(self, exc: BaseException) -> None:
        """Stop for good, but gracefully: jobs running are finished, held ones given back."""
        self.log.error("worker.fatal", error=repr(exc), exc_info=exc)
        if self.fatal is None:
            self.fatal = exc
            if self.core.fetching:
                self.stop("fatal error")

    def fetch_failed(self, exc: BaseException, asked: int) -> float:
        with self.lock:
            wait = self.core.fetch_failed(exc, asked)
        self.log.warning("worker.fetch_failed", error=str(exc), retry_in=wait)
        return wait

    def job_failed(self, job: Job, node: Node, exc: BaseException) -> Command:
        """The handler raised: the NACK to send, and the failure's log line."""
        with self.lock:
            command = self.core.failed(job, node)
        self.log.warning("job.failed", job=job.id, queue=job.queue, attempt=attempt_of(job),
                         nack_delay=command.delay, error=repr(exc), exc_info=exc)
        return command

    def not_sent(self, command: Command, exc: BaseException) -> Command | None:
        """`command` failed: the same for another node (logged: its node is gone), or None
        when given up (an ACK/NACK lost is logged: the job comes back after its RETRY)."""
        with self.lock:
            retry = self.core.not_sent(command, exc)
        if retry is not None:
            self.log.info("job.command_elsewhere", command=command.kind.upper(),
                          job=command.job_id,
                          node=command.node.addr if command.node else None, error=str(exc))
        elif command.kind in (ACK, NACK):
            self.log.warning("job.command_failed", command=command.kind.upper(),
                             job=command.job_id, error=str(exc),
                             note="the job comes back after its RETRY")
        return retry

    def exit_code(self) -> int:
        if self.forced.is_set():
            return EXIT_FORCED
        return EXIT_ERROR if self.fatal is not None else EXIT_OK
