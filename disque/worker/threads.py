"""The threaded driver, for plain (not `async def`) handlers.

`concurrency` fetch threads each loop GETJOB (COUNT `batch`, WITHCOUNTERS, TIMEOUT
`timeout_ms`) -> run the handler on each job in turn -> ACKJOB / NACK; one heartbeat thread
sends the SHOW / WORKING the core asks for. All of them share one `Client` (thread-safe:
a pooled connection per command) and call the core under one lock. The main thread only
waits, so that it takes SIGINT / SIGTERM at once.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from disque.client import AuthError, Client, DisqueError, Job
from disque.client.consumer import stop_on_signals
from disque.worker.core import Command, WorkerCore
from disque.worker.run import Driver, Settings, client_call, log


class ThreadedWorker(Driver):
    def __init__(self, client: Client, handler: Callable[[Job], Any], settings: Settings,
                 core: WorkerCore) -> None:
        super().__init__(client, handler, settings, core, threading.Lock())
        self.stopping = threading.Event()  # wakes the waits when a stop comes
        self.forced = threading.Event()
        self.done = threading.Event()  # every fetch thread ended: nothing is held any more

    def run(self) -> int:
        restore = stop_on_signals(self.stop)
        fetchers = [threading.Thread(target=self._fetch_thread, name=f"disque-worker-{i}",
                                     daemon=True)
                    for i in range(self.settings.concurrency)]
        beat = threading.Thread(target=self._heartbeat_loop, name="disque-worker-heartbeat",
                                daemon=True)
        try:
            beat.start()
            for t in fetchers:
                t.start()
            for t in fetchers:
                while t.is_alive() and not self.forced.is_set():
                    t.join(timeout=0.2)  # short joins: the main thread still takes signals
        finally:
            self.stopping.set()
            self.done.set()
            restore()
        if not self.forced.is_set():  # (forced: the daemon threads die with the process)
            beat.join(timeout=5)
        return self.exit_code()

    # -- fetching and running ----------------------------------------------------------------
    def _fetch_thread(self) -> None:
        try:
            self._fetch_loop()
        except Exception as exc:  # a bug, not a job's failure: stop rather than lose a thread
            self._fatal(exc)

    def _fetch_loop(self) -> None:
        s = self.settings
        while True:
            with self.lock:
                if not self.core.fetching:
                    return
            try:
                jobs, node = self.client.get_job_and_node(
                    *s.queues, timeout=s.timeout_ms, count=s.batch, with_counters=True)
            except AuthError as exc:
                self._fatal(exc)
                return
            except DisqueError as exc:
                with self.lock:
                    wait = self.core.fetch_failed(exc)
                log.warning("worker.fetch_failed", error=str(exc), retry_in=wait)
                self.stopping.wait(wait)
                continue
            with self.lock:
                go_on = self.core.fetched(jobs, node)
            for job in jobs:
                self._run_job(job, node)
            if not go_on:
                return

    def _run_job(self, job: Job, node: Any) -> None:
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
                reply = client_call(self.client, command)
            except DisqueError as exc:
                command = self.not_sent(command, exc)
                continue
            with self.lock:
                self.core.sent(command, reply)
            return

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
