"""The asyncio driver, for `async def` handlers: the threaded driver's loops as tasks.

`concurrency` fetch tasks each loop GETJOB -> await the handler on each job in turn ->
ACKJOB / NACK; one heartbeat task sends the SHOW / WORKING the core asks for; all share one
`AsyncClient`. One event loop, so the core needs no lock. A handler that blocks the loop
blocks every task: blocking work belongs in a plain function (run on threads).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Awaitable, Callable
from typing import Any

from disque.client import AsyncClient, AuthError, DisqueError, Job
from disque.worker.core import Command, WorkerCore
from disque.worker.run import Driver, Settings, client_call, log


class AsyncWorker(Driver):
    def __init__(self, client: AsyncClient, handler: Callable[[Job], Awaitable[Any]],
                 settings: Settings, core: WorkerCore) -> None:
        super().__init__(client, handler, settings, core, contextlib.nullcontext())
        self.stopping = asyncio.Event()
        self.forced = asyncio.Event()

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self.stop, sig.name)
        fetchers = asyncio.gather(*(self._fetch_loop() for _ in range(self.settings.concurrency)))
        beat = asyncio.create_task(self._heartbeat_loop())
        forced = asyncio.create_task(self.forced.wait())
        try:
            await asyncio.wait({fetchers, forced}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)
            for task in (fetchers, beat, forced):
                task.cancel()
            for task in (fetchers, beat, forced):
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        return self.exit_code()

    async def _fetch_loop(self) -> None:
        try:
            await self._fetch_jobs()
        except Exception as exc:  # a bug, not a job's failure: stop rather than lose a task
            self._fatal(exc)

    async def _fetch_jobs(self) -> None:
        s = self.settings
        while self.core.fetching:
            try:
                jobs, node = await self.client.get_job_and_node(
                    *s.queues, timeout=s.timeout_ms, count=s.batch, with_counters=True)
            except AuthError as exc:
                self._fatal(exc)
                return
            except DisqueError as exc:
                wait = self.core.fetch_failed(exc)
                log.warning("worker.fetch_failed", error=str(exc), retry_in=wait)
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self.stopping.wait(), wait)
                continue
            go_on = self.core.fetched(jobs, node)
            for job in jobs:
                await self._run_job(job, node)
            if not go_on:
                return

    async def _run_job(self, job: Job, node: Any) -> None:
        if not self.core.may_start(job):
            command = self.core.given_back(job, node)
        else:
            try:
                await self.handler(job)
            except Exception as exc:  # noqa: BLE001 - any handler failure means NACK
                command = self.job_failed(job, node, exc)
            else:
                command = self.core.succeeded(job, node)
        await self._deliver(command)

    async def _deliver(self, command: Command | None) -> None:
        """Send `command`, to another node if the core says so; report the outcome."""
        while command is not None:
            try:
                reply = await client_call(self.client, command)
            except DisqueError as exc:
                command = self.not_sent(command, exc)
                continue
            self.core.sent(command, reply)
            return

    async def _heartbeat_loop(self) -> None:
        while True:  # cancelled by run() once the fetch tasks are done
            due = self.core.heartbeats_due()
            for command in due:
                await self._deliver(command)
            if not due:
                await asyncio.sleep(self.core.next_heartbeat_in(0.1))
