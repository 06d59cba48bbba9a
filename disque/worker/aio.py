"""The asyncio driver of the consume policy: the threaded driver's loops as tasks. It runs
`disque-worker` for `async def` handlers and `AsyncClient.consume`.

`concurrency` fetch tasks each loop GETJOB -> run the handler on each job in turn (awaited
when it is a coroutine function, or returns an awaitable) -> ACKJOB / NACK; one heartbeat
task sends the SHOW / WORKING the core asks for; all share one `AsyncClient`. One event
loop, so the core needs no lock. A handler that blocks the loop blocks every task: blocking
work belongs in a plain function run on threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import signal
from collections.abc import Callable
from typing import Any

from disque.client.aio import AsyncClient
from disque.client.errors import AuthError, DisqueError
from disque.client.nodes import Node
from disque.client.replies import Job
from disque.worker.core import ACK, ENQUEUE, NACK, SHOW, WORKING, Command, Reply, WorkerCore
from disque.worker.driver import Driver, EventLog, Fetch


async def send(client: AsyncClient, command: Command) -> Reply:
    """`command` sent with `client`: the node's reply."""
    kind = command.kind
    if kind == ACK:
        return await client.ack_job(command.job_id, node=command.node)
    if kind == NACK:
        return await client.nack(command.job_id, delay=command.delay or None,
                                 node=command.node)
    if kind == ENQUEUE:
        return await client.enqueue(command.job_id, node=command.node)
    if kind == WORKING:
        return await client.working(command.job_id, node=command.node)
    assert kind == SHOW
    return await client.show(command.job_id, node=command.node)


class AsyncWorker(Driver):
    def __init__(self, client: AsyncClient, handler: Callable[[Job], object], fetch: Fetch,
                 core: WorkerCore, log: EventLog,
                 stop_event: asyncio.Event | None = None) -> None:
        super().__init__(core, fetch, log, contextlib.nullcontext())
        self.client = client
        self.handler = handler
        self.stopping: asyncio.Event = stop_event or asyncio.Event()
        self.forced: asyncio.Event = asyncio.Event()

    async def run(self) -> int:
        """Until the fetch tasks end (stop, burst, max_jobs); the exit code."""
        loop = asyncio.get_running_loop()
        installed: list[signal.Signals] = []
        if self.fetch.signals:
            for sig in (signal.SIGINT, signal.SIGTERM):
                try:
                    loop.add_signal_handler(sig, self.stop, sig.name)
                    installed.append(sig)
                except (NotImplementedError, RuntimeError, ValueError):
                    pass  # not the main thread, or no signals on this platform
        fetchers = asyncio.gather(*(self._fetch_loop() for _ in range(self.fetch.concurrency)))
        beat = asyncio.create_task(self._heartbeat_loop()) if self.core.heartbeating else None
        forced = asyncio.create_task(self.forced.wait())
        try:
            waited: set[asyncio.Future[Any]] = {fetchers, forced}
            await asyncio.wait(waited, return_when=asyncio.FIRST_COMPLETED)
        finally:
            self.stopping.set()
            for sig in installed:
                loop.remove_signal_handler(sig)
            tasks = [t for t in (fetchers, beat, forced) if t is not None]
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        return self.exit_code()

    async def _fetch_loop(self) -> None:
        try:
            await self._fetch_jobs()
        except Exception as exc:  # a bug, not a job's failure: stop rather than lose a task
            self._fatal(exc)

    async def _fetch_jobs(self) -> None:
        f = self.fetch
        core = self.core
        while want := self.may_fetch():
            try:
                jobs, node = await self.client.get_job_and_node(
                    *f.queues, timeout=f.timeout_ms, count=want, with_counters=f.with_counters)
            except AuthError as exc:  # a refused password does not heal by waiting
                self._fatal(exc)
                return
            except DisqueError as exc:
                wait = self.fetch_failed(exc, want)
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self.stopping.wait(), wait)
                continue
            go_on = core.fetched(jobs, node, want)
            for job in jobs:
                await self._run_job(job, node)
            if jobs and core.follow_every:
                await self._follow()
            if not go_on:
                return

    async def _run_job(self, job: Job, node: Node) -> None:
        if not self.core.may_start(job):
            command = self.core.given_back(job, node)
        else:
            try:
                result = self.handler(job)
                if inspect.isawaitable(result):
                    await result
            except Exception as exc:  # noqa: BLE001 - any handler failure means NACK
                command = self.job_failed(job, node, exc)
            else:
                command = self.core.succeeded(job, node)
        await self._deliver(command)

    async def _deliver(self, command: Command | None) -> None:
        """Send `command`, to another node if the core says so; report the outcome."""
        while command is not None:
            try:
                reply = await send(self.client, command)
            except DisqueError as exc:
                command = self.not_sent(command, exc)
                continue
            self.core.sent(command, reply)
            return

    async def _follow(self) -> None:
        """Move the client next to the producers when the core says so."""
        prefix = self.core.producers_prefix(self.client.node)
        target = self.client.node_for_prefix(prefix) if prefix is not None else None
        if target is None:
            return
        error: BaseException | None = None
        try:
            await self.client.use_node(target)
        except (DisqueError, OSError) as exc:
            error = exc
        self.core.followed(target.addr, error)
        self.log.info("worker.follow", node=target.addr, prefix=prefix,
                      error=None if error is None else str(error))

    async def _heartbeat_loop(self) -> None:
        while True:  # cancelled by run() once the fetch tasks are done
            due = self.core.heartbeats_due()
            for command in due:
                await self._deliver(command)
            if not due:
                await asyncio.sleep(self.core.next_heartbeat_in(0.1))
