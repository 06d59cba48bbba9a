"""The consumer loop behind `Client.consume`: GETJOB, run the handler, ACKJOB or NACK.

- `concurrency` worker threads each fetch jobs (GETJOB with a short TIMEOUT, so a stop is
  noticed within `poll_ms`) and run the handler on them one by one.
- Success -> ACKJOB, exception -> NACK (the job goes back to its queue at once and its
  `nacks` counter grows), both sent to the node that delivered the job.
- While a handler runs, a heartbeat thread keeps the job from being re-queued: after
  `heartbeat_after` seconds it asks SHOW when the job would be re-queued, then sends WORKING
  at ~80% of that time and again at ~80% of the RETRY each WORKING returns. Fast handlers
  never cost a SHOW. (`Heartbeats` is that schedule, clock injected, unit-tested.)
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
import signal
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from disque.client.base import ConsumeStats
from disque.client.errors import AuthError, DisqueError, NoJobError, TooLateError
from disque.client.nodes import LEAVING_PRIORITY, Node, PrefixStats
from disque.client.replies import Job

if TYPE_CHECKING:
    from disque.client.sync import Client

log = logging.getLogger("disque.client.consumer")


@dataclass(slots=True)
class InFlight:
    job_id: str
    node: Any
    due: float
    checked: bool = False  # SHOW done: `due` now comes from the node's requeue time


class Heartbeats:
    """When each in-flight job needs its next WORKING. Pure: the caller sends SHOW/WORKING
    and reports the answers."""

    def __init__(self, first_check: float = 0.2, fraction: float = 0.8) -> None:
        self.first_check = first_check
        self.fraction = fraction
        self.jobs: dict[str, InFlight] = {}

    def add(self, job_id: str, node: Any, now: float) -> None:
        self.jobs[job_id] = InFlight(job_id, node, now + self.first_check)

    def remove(self, job_id: str) -> None:
        self.jobs.pop(job_id, None)

    def due(self, now: float) -> list[InFlight]:
        return [e for e in self.jobs.values() if e.due <= now]

    def next_due(self) -> float | None:
        return min((e.due for e in self.jobs.values()), default=None)

    def on_show(self, entry: InFlight, show: dict[str, Any] | None, now: float) -> bool:
        """After SHOW: schedule the first WORKING before the node's requeue time. False (and
        the job is dropped) when there is nothing to postpone: unknown or RETRY 0 job."""
        retry = int(show.get("retry") or 0) if show else 0
        requeue_ms = show.get("next-requeue-within") if show else None
        if not retry or requeue_ms is None:
            self.remove(entry.job_id)
            return False
        entry.checked = True
        entry.due = now + self.fraction * min(int(requeue_ms) / 1000.0, float(retry))
        return True

    def on_working(self, entry: InFlight, retry: int | None, now: float) -> bool:
        """After WORKING answered `retry` seconds (None: it failed with NOJOB/TOOLATE)."""
        if not retry:
            self.remove(entry.job_id)
            return False
        entry.due = now + self.fraction * retry
        return True


def stop_on_signals(on_stop: Callable[[str], None]) -> Callable[[], None]:
    """Call `on_stop(signal name)` on SIGINT / SIGTERM (from the main thread only, as
    Python allows); returns the function that puts the previous handlers back."""
    def on_signal(signum: int, frame: object) -> None:
        on_stop(signal.Signals(signum).name)

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}

    def restore() -> None:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return restore


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


class Consumer:
    """See the module docstring. Options: `count` (jobs per GETJOB, default 1), `poll_ms`
    (GETJOB TIMEOUT, default 1000), `max_jobs`, `working` (heartbeats on, default True),
    `heartbeat_after` (s, default 0.2), `follow_producers` (default True), `handle_signals`
    (default True), `with_counters` (default True), `error_backoff` (s, default 0.5)."""

    def __init__(self, client: Client, queues: str | bytes | Iterable[str | bytes] | None,
                 handler: Callable[[Job], Any], *,
                 concurrency: int = 1, stop_event: threading.Event | None = None,
                 count: int = 1, poll_ms: int = 1000, max_jobs: int | None = None,
                 working: bool = True, heartbeat_after: float = 0.2,
                 follow_producers: bool = True, follow_every: int = 100,
                 handle_signals: bool = True, with_counters: bool = True,
                 error_backoff: float = 0.5, clock: Callable[[], float] = time.monotonic
                 ) -> None:
        self.queues = consume_queues(queues, concurrency=concurrency, count=count,
                                     poll_ms=poll_ms, max_jobs=max_jobs)
        self.client = client
        self.handler = handler
        self.concurrency = concurrency
        self.stop = stop_event or threading.Event()
        self.count = count
        self.poll_ms = poll_ms
        self.max_jobs = max_jobs
        self.working = working
        self.follow_producers = follow_producers
        self.follow_every = follow_every
        self.handle_signals = handle_signals
        self.with_counters = with_counters
        self.error_backoff = error_backoff
        self.clock = clock
        self.stats = ConsumeStats()
        self.heartbeats = Heartbeats(first_check=heartbeat_after)
        self.prefixes = PrefixStats()
        self._lock = threading.Lock()
        self._reserved = 0
        self._since_follow = 0
        self._wake = threading.Condition(self._lock)
        self.fatal: AuthError | None = None  # raised by run() once the workers are done

    # -- running ---------------------------------------------------------------------------
    def run(self) -> ConsumeStats:
        restore = self._install_signals()
        workers = [threading.Thread(target=self._worker, name=f"disque-consumer-{i}",
                                    daemon=True) for i in range(self.concurrency)]
        beat = threading.Thread(target=self._heartbeat_loop, name="disque-heartbeat",
                                daemon=True)
        try:
            for t in workers:
                t.start()
            if self.working:
                beat.start()
            for t in workers:
                while t.is_alive():
                    t.join(timeout=0.2)  # short joins: the main thread still gets signals
        finally:
            self.stop.set()
            with self._wake:
                self._wake.notify_all()
            if beat.is_alive():
                beat.join(timeout=5)
            restore()
        if self.fatal is not None:
            raise self.fatal
        return self.stats

    def _install_signals(self) -> Callable[[], None]:
        if not self.handle_signals or threading.current_thread() is not threading.main_thread():
            return lambda: None

        def on_stop(name: str) -> None:
            log.info("consumer.stop signal=%s", name)
            self.stop.set()
        return stop_on_signals(on_stop)

    # -- workers ---------------------------------------------------------------------------
    def _reserve(self) -> int:
        """How many jobs this worker may fetch now (max_jobs is never exceeded)."""
        with self._lock:
            if self.max_jobs is None:
                return self.count
            want = min(self.count, self.max_jobs - self._reserved)
            if want <= 0:
                return 0
            self._reserved += want
            return want

    def _unreserve(self, n: int) -> None:
        if n and self.max_jobs is not None:
            with self._lock:
                self._reserved -= n

    def _worker(self) -> None:
        while not self.stop.is_set():
            want = self._reserve()
            if want == 0:
                # every remaining job is reserved; stop only once they were all received,
                # else the worker holding a reservation may still get its job
                with self._lock:
                    if self.stats.received >= (self.max_jobs or 0):
                        self.stop.set()
                return
            try:
                jobs, node = self.client.get_job_and_node(
                    *self.queues, timeout=self.poll_ms, count=want,
                    with_counters=self.with_counters)
            except AuthError as exc:
                self._unreserve(want)
                with self._lock:
                    self.fatal = self.fatal or exc
                self.stop.set()
                return
            except DisqueError as exc:
                self._unreserve(want)
                self._error(f"GETJOB: {exc}")
                self.stop.wait(self.error_backoff)
                continue
            self._unreserve(want - len(jobs))
            for job in jobs:
                self._handle(job, node)
            if jobs and self.follow_producers:
                self._follow(jobs)

    def _handle(self, job: Job, node: Node) -> None:
        with self._lock:
            self.stats.received += 1
            if self.working:
                self.heartbeats.add(job.id, node, self.clock())
                self._wake.notify()
        try:
            self.handler(job)
        except Exception as exc:  # noqa: BLE001 - any handler failure means NACK
            with self._lock:
                self.heartbeats.remove(job.id)
            log.warning("consumer.nack job=%s error=%r", job.id, exc)
            if self._finish(self.client.nack, job, node):
                with self._lock:
                    self.stats.nacked += 1
        else:
            with self._lock:
                self.heartbeats.remove(job.id)
            if self._finish(self.client.ack_job, job, node):
                with self._lock:
                    self.stats.acked += 1

    def _finish(self, command: Callable[..., int], job: Job, node: Node) -> bool:
        """ACKJOB / NACK on the node that delivered the job; if it is gone, ACKJOB anywhere
        (the cluster propagates it), NACK is given up (the job comes back by RETRY)."""
        try:
            command(job.id, node=node)
            return True
        except DisqueError as exc:
            problem = exc
        if command == self.client.ack_job:
            try:
                self.client.ack_job(job.id)
                return True
            except DisqueError as exc:
                problem = exc
        self._error(f"{job.id}: {problem}")
        return False

    def _error(self, text: str) -> None:
        log.warning("consumer.error %s", text)
        with self._lock:
            if len(self.stats.errors) < 100:
                self.stats.errors.append(text)

    def _follow(self, jobs: list[Job]) -> None:
        """Move the client next to the producers when most jobs come from another node."""
        with self._lock:
            for job in jobs:
                self.prefixes.observe(job.id)
            self._since_follow += len(jobs)
            if self._since_follow < self.follow_every:
                return
            self._since_follow = 0
            prefix = self.prefixes.preferred()
        current = self.client.node
        if prefix is None or current is None or current.prefix == prefix:
            return
        target = self.client.table.by_prefix(prefix)
        if (target is None or target.priority >= LEAVING_PRIORITY
                or self.client.table.is_cooling(target.addr)):
            return
        try:
            self.client.use_node(target)
        except (DisqueError, OSError) as exc:
            self._error(f"moving to {target.addr}: {exc}")
            return
        with self._lock:
            self.stats.switches += 1
        log.info("consumer.follow node=%s prefix=%s", target.addr, prefix)

    # -- heartbeats ------------------------------------------------------------------------
    def _heartbeat_loop(self) -> None:
        while not self.stop.is_set() or self.heartbeats.jobs:
            with self._wake:
                nxt = self.heartbeats.next_due()
                wait = 0.5 if nxt is None else max(0.0, nxt - self.clock())
                if wait > 0:
                    self._wake.wait(timeout=min(wait, 0.5))
                due = self.heartbeats.due(self.clock())
            for entry in due:
                self._beat(entry)
            if self.stop.is_set() and not self.heartbeats.jobs:
                return

    def _beat(self, entry: InFlight) -> None:
        try:
            if not entry.checked:
                show = self.client.show(entry.job_id, node=entry.node)
                with self._lock:
                    if entry.job_id in self.heartbeats.jobs:
                        self.heartbeats.on_show(entry, show, self.clock())
                return
            retry: int | None = self.client.working(entry.job_id, node=entry.node)
            with self._lock:
                self.stats.working += 1
        except (NoJobError, TooLateError):
            retry = None
        except DisqueError as exc:
            self._error(f"WORKING {entry.job_id}: {exc}")
            retry = None
        with self._lock:
            if entry.job_id in self.heartbeats.jobs:
                self.heartbeats.on_working(entry, retry, self.clock())
