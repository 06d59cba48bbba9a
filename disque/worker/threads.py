"""The threaded driver of the consume policy, for plain (not `async def`) handlers: it runs
`disque-worker` and `Client.consume`.

`concurrency` fetch threads each loop GETJOB (COUNT from the core, WITHCOUNTERS, TIMEOUT
`timeout_ms`) -> run the handler on each job in turn -> ACKJOB / NACK; one heartbeat thread
sends the SHOW / WORKING the core asks for. All of them share one `Client` (thread-safe:
a pooled connection per command) and call the core under one lock. The main thread only
waits, so that it takes SIGINT / SIGTERM at once.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable

from disque.client.errors import AuthError, DisqueError
from disque.client.nodes import Node
from disque.client.replies import Job
from disque.client.sync import Client
from disque.worker.core import ACK, ENQUEUE, NACK, SHOW, WORKING, Command, Reply, WorkerCore
from disque.worker.driver import Driver, EventLog, Fetch


def stop_on_signals(on_stop: Callable[[str], None]) -> Callable[[], None]:
    """Call `on_stop(signal name)` on SIGINT / SIGTERM (from the main thread only, as
    Python allows); returns the function that puts the previous handlers back.

    Python runs a handler in the main thread between any two bytecodes, also inside the
    handler under way: a second signal while `on_stop` holds the driver's lock or the log's
    write lock (neither reentrant) waited for the lock its own thread held, and the worker
    hung instead of exiting forced (test_second_signal_forces_the_exit, once in CI). A
    signal that comes while `on_stop` runs is queued and taken by that call once it
    returns, in order."""
    pending: list[str] = []
    busy = False

    def on_signal(signum: int, frame: object) -> None:
        nonlocal busy
        pending.append(signal.Signals(signum).name)
        if busy:
            return  # the call under way takes it
        while pending:
            busy = True
            try:
                while pending:
                    on_stop(pending.pop(0))
            finally:
                busy = False

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}

    def restore() -> None:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return restore


def send(client: Client, command: Command) -> Reply:
    """`command` sent with `client`: the node's reply."""
    kind = command.kind
    if kind == ACK:
        return client.ack_job(command.job_id, node=command.node)
    if kind == NACK:
        return client.nack(command.job_id, delay=command.delay or None, node=command.node)
    if kind == ENQUEUE:
        return client.enqueue(command.job_id, node=command.node)
    if kind == WORKING:
        return client.working(command.job_id, node=command.node)
    assert kind == SHOW
    return client.show(command.job_id, node=command.node)


class ThreadedWorker(Driver):
    def __init__(self, client: Client, handler: Callable[[Job], object], fetch: Fetch,
                 core: WorkerCore, log: EventLog,
                 stop_event: threading.Event | None = None) -> None:
        super().__init__(core, fetch, log, threading.Lock())
        self.client = client
        self.handler = handler
        self.stopping: threading.Event = stop_event or threading.Event()
        self.forced: threading.Event = threading.Event()
        self.done = threading.Event()  # every fetch thread ended: nothing is held any more

    def run(self) -> int:
        """Until the fetch loops end (stop, burst, max_jobs); the exit code."""
        restore: Callable[[], None] | None = None
        if self.fetch.signals and threading.current_thread() is threading.main_thread():
            restore = stop_on_signals(self.stop)
        fetchers = [threading.Thread(target=self._fetch_thread, name=f"disque-worker-{i}",
                                     daemon=True)
                    for i in range(self.fetch.concurrency)]
        beat = threading.Thread(target=self._heartbeat_loop, name="disque-worker-heartbeat",
                                daemon=True)
        try:
            if self.core.heartbeating:
                beat.start()
            for t in fetchers:
                t.start()
            for t in fetchers:
                while t.is_alive() and not self.forced.is_set():
                    t.join(timeout=0.2)  # short joins: the main thread still takes signals
        finally:
            self.stopping.set()
            self.done.set()
            if restore is not None:
                restore()
        if beat.is_alive() and not self.forced.is_set():  # (forced: daemon threads die)
            beat.join(timeout=5)
        return self.exit_code()

    # -- fetching and running ----------------------------------------------------------------
    def _fetch_thread(self) -> None:
        try:
            self._fetch_loop()
        except Exception as exc:  # a bug, not a job's failure: stop rather than lose a thread
            self._fatal(exc)

    def _fetch_loop(self) -> None:
        f = self.fetch
        core = self.core
        while want := self.may_fetch():
            try:
                jobs, node = self.client.get_job_and_node(
                    *f.queues, timeout=f.timeout_ms, count=want, with_counters=f.with_counters)
            except AuthError as exc:  # a refused password does not heal by waiting
                self._fatal(exc)
                return
            except DisqueError as exc:
                self.stopping.wait(self.fetch_failed(exc, want))
                continue
            with self.lock:
                go_on = core.fetched(jobs, node, want)
            for job in jobs:
                self._run_job(job, node)
            if jobs and core.follow_every:
                self._follow()
            if not go_on:
                return

    def _run_job(self, job: Job, node: Node) -> None:
        with self.lock:
            start = self.core.may_start(job)
            if not start:
                command = self.core.given_back(job, node)
        if start:
            try:
                self.handler(job)
            except BaseException as exc:  # noqa: BLE001 - any handler failure means NACK
                command = self.job_failed(job, node, exc)
            else:
                with self.lock:
                    command = self.core.succeeded(job, node)
        self._deliver(command)

    def _deliver(self, command: Command | None) -> None:
        """Send `command`, to another node if the core says so; report the outcome."""
        while command is not None:
            try:
                reply = send(self.client, command)
            except DisqueError as exc:
                command = self.not_sent(command, exc)
                continue
            with self.lock:
                self.core.sent(command, reply)
            return

    def _follow(self) -> None:
        """Move the client next to the producers when the core says so."""
        with self.lock:
            prefix = self.core.producers_prefix(self.client.node)
        target = self.client.node_for_prefix(prefix) if prefix is not None else None
        if target is None:
            return
        error: BaseException | None = None
        try:
            self.client.use_node(target)
        except (DisqueError, OSError) as exc:
            error = exc
        with self.lock:
            self.core.followed(target.addr, error)
        self.log.info("worker.follow", node=target.addr, prefix=prefix,
                      error=None if error is None else str(error))

    # -- heartbeats ----------------------------------------------------------------------------
    def _heartbeat_loop(self) -> None:
        while not self.done.is_set():
            with self.lock:
                due = self.core.heartbeats_due()
                wait = self.core.next_heartbeat_in(0.1)
            for command in due:
                self._deliver(command)
            if not due:
                self.done.wait(wait)
