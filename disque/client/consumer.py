"""`Client.consume` and `AsyncClient.consume`: GETJOB, run the handler, ACKJOB or NACK.

Both run the worker's sans-I/O consume policy (`disque.worker.core.WorkerCore`) with the
worker's own drivers (`disque.worker.threads` for `Client`, `disque.worker.aio` for
`AsyncClient`); this module only checks the arguments, sets the core up as `consume()`
promises, and turns its counters into `ConsumeStats`:

- `concurrency` worker threads (tasks) each fetch jobs (GETJOB with a short TIMEOUT, so a
  stop is noticed within `poll_ms`) and run the handler on them one by one.
- Success -> ACKJOB, exception -> NACK (the job goes back to its queue at once and its
  `nacks` counter grows), both sent to the node that delivered the job; if that node is
  unreachable or leaving, ACKJOB goes to any other node (the cluster propagates it), and so
  does a NACK that could not be sent at all; what still fails comes back by its RETRY.
- While the consumer holds a job, a heartbeat keeps it from being re-queued: after
  `heartbeat_after` seconds it asks SHOW when the job would be re-queued, then sends WORKING
  at ~80% of that time and again at ~80% of the RETRY each WORKING returns. Fast handlers
  never cost a SHOW.
- It follows the producers (the spec's "Client libraries" advice): when more than half of the
  recent jobs carry another node's ID prefix, the client moves to that node.
- It stops on `stop_event`, on SIGINT/SIGTERM (when run from the main thread), or after
  exactly `max_jobs` jobs; jobs already fetched are still handled and acknowledged.
- GETJOB errors are logged and retried after `error_backoff` (a node may come back), except
  an `AuthError`: a missing or refused password does not heal by waiting, so it stops the
  consumer like a stop event, and `run` raises it.

The stdlib `logging` is used (not structlog) so that the client stays importable on Spark
executors that only have redis-py installed.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from disque.client.base import ConsumeStats
from disque.client.replies import Job
from disque.worker.core import Heartbeats, InFlight, WorkerCore
from disque.worker.driver import Fetch, StdlibEvents
from disque.worker.threads import ThreadedWorker, stop_on_signals

if TYPE_CHECKING:
    from disque.client.sync import Client

__all__ = ["Consumer", "Heartbeats", "InFlight", "consume_core", "consume_queues",
           "consume_stats", "stop_on_signals"]

log = logging.getLogger("disque.client.consumer")
EVENTS = StdlibEvents(log)


def _positive(name: str, value: object, least: int = 1) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ValueError(f"{name} must be an integer >= {least}, not {value!r}")


def consume_queues(queues: str | bytes | Iterable[str | bytes] | None, *, concurrency: int,
                   count: int, poll_ms: int, max_jobs: int | None) -> list[str | bytes]:
    """The queues `consume` reads (one name, str or bytes, or several), after checking its
    arguments: ValueError before anything starts rather than a consumer that spins on a
    refused GETJOB, blocks in GETJOB past a stop (`poll_ms` 0 would) or does nothing.
    The blocking and the asyncio consumers both call it."""
    if isinstance(queues, (str, bytes)):
        names: list[str | bytes] = [queues]
    else:
        names = list(queues) if queues is not None else []
    if not names:
        raise ValueError("consume needs at least one queue")
    _positive("concurrency", concurrency)
    _positive("count", count)
    _positive("poll_ms", poll_ms)
    if max_jobs is not None and (isinstance(max_jobs, bool) or not isinstance(max_jobs, int)
                                 or max_jobs < 0):
        raise ValueError(f"max_jobs must be None or an integer >= 0, not {max_jobs!r}")
    return names


def consume_core(*, count: int, max_jobs: int | None, working: bool, heartbeat_after: float,
                 follow_producers: bool, follow_every: int, error_backoff: float,
                 clock: Callable[[], float] = time.monotonic) -> WorkerCore:
    """The worker core set up as `consume()` promises: a plain NACK (no backoff), jobs
    fetched before a stop are still run, no forced stop, WORKING at 80%, a constant wait
    after a failed GETJOB, up to 100 error texts kept."""
    return WorkerCore(backoff_base=0, first_check=heartbeat_after, fraction=0.8,
                      fetch_retry_first=error_backoff, fetch_retry_max=error_backoff,
                      clock=clock, count=count, max_jobs=max_jobs, give_back=False,
                      forcible=False, heartbeats=working,
                      follow_every=follow_every if follow_producers else None, max_notes=100)


def consume_stats(core: WorkerCore) -> ConsumeStats:
    s = core.stats
    return ConsumeStats(received=s.received, acked=s.acked, nacked=s.nacked,
                        working=s.working, switches=s.switches, errors=list(s.errors_seen))


class Consumer:
    """See the module docstring. Options: `count` (jobs per GETJOB, default 1), `poll_ms`
    (GETJOB TIMEOUT, default 1000), `max_jobs`, `working` (heartbeats on, default True),
    `heartbeat_after` (s, default 0.2), `follow_producers` (default True), `handle_signals`
    (default True), `with_counters` (default True), `error_backoff` (s, default 0.5)."""

    def __init__(self, client: Client, queues: str | bytes | Iterable[str | bytes] | None,
                 handler: Callable[[Job], object], *,
                 concurrency: int = 1, stop_event: threading.Event | None = None,
                 count: int = 1, poll_ms: int = 1000, max_jobs: int | None = None,
                 working: bool = True, heartbeat_after: float = 0.2,
                 follow_producers: bool = True, follow_every: int = 100,
                 handle_signals: bool = True, with_counters: bool = True,
                 error_backoff: float = 0.5, clock: Callable[[], float] = time.monotonic
                 ) -> None:
        queue_names = consume_queues(queues, concurrency=concurrency, count=count,
                                     poll_ms=poll_ms, max_jobs=max_jobs)
        self.core = consume_core(count=count, max_jobs=max_jobs, working=working,
                                 heartbeat_after=heartbeat_after,
                                 follow_producers=follow_producers, follow_every=follow_every,
                                 error_backoff=error_backoff, clock=clock)
        fetch = Fetch(queue_names, timeout_ms=poll_ms, with_counters=with_counters,
                      concurrency=concurrency, signals=handle_signals)
        self.driver = ThreadedWorker(client, handler, fetch, self.core, EVENTS, stop_event)

    @property
    def stats(self) -> ConsumeStats:
        return consume_stats(self.core)

    def run(self) -> ConsumeStats:
        self.driver.run()
        if self.driver.fatal is not None:
            raise self.driver.fatal
        return self.stats
