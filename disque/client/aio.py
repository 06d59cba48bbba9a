"""The asyncio client: the same commands, node choice and failover rules as `Client`
(see `disque.client.sync` for them), on redis-py's asyncio connection pools. The decisions
are `base`'s, shared with `Client`; this module only moves the bytes.

    async with AsyncClient("disque://127.0.0.1:7711,127.0.0.1:7712") as c:
        job_id = await c.add_job("q", b"payload")
        [job] = await c.get_job("q", timeout=1000)
        await c.ack_job(job.id)
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, TypeVar

import redis.asyncio as aioredis
from redis.asyncio.connection import AbstractConnection as Connection
from redis.exceptions import AuthenticationError, ResponseError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from disque.client import calls, replies
from disque.client.base import (
    AddJobsResult,
    Attempts,
    ClientBase,
    Connecting,
    ConsumeStats,
    NodesSpec,
    pack_pipeline,
)
from disque.client.batch import AddJobsBatch
from disque.client.calls import Call
from disque.client.errors import (
    DisqueConnectionError,
    DisqueError,
    LeavingError,
    error_from_redis,
)
from disque.client.nodes import Node
from disque.client.replies import Hello, Job

T = TypeVar("T")
NETWORK_ERRORS = (RedisConnectionError, RedisTimeoutError, OSError, asyncio.TimeoutError)


async def _read(conn: Connection, timeout: float) -> Any:
    """One reply within `timeout` seconds (math.inf: no limit). redis-py's own
    `read_response(timeout=t)` answers None on expiry and leaves the reply due on the
    connection (a "user" timeout); here expiry raises TimeoutError and, as read_response
    drops its connection when interrupted, the late reply can never be read by another
    command."""
    if timeout == math.inf:
        return await conn.read_response(timeout=math.inf)
    async with asyncio.timeout(timeout):
        return await conn.read_response(timeout=math.inf)


class AsyncClient(ClientBase):
    """asyncio Disque client; constructor settings as `Client`."""

    def __init__(self, nodes: NodesSpec, **kwargs: Any) -> None:
        super().__init__(nodes, **kwargs)
        self._pools: dict[str, aioredis.ConnectionPool] = {}
        self._connecting: asyncio.Lock | None = None

    @classmethod
    def from_url(cls, url: str, **kwargs: Any) -> AsyncClient:
        return cls(url, **kwargs)

    def _read_timeout(self, blocking_ms: int | None) -> float:
        t = self.read_timeout(blocking_ms)
        return math.inf if t is None else t

    # -- connection management (the decisions are `ClientBase`'s and `Connecting`'s) --------
    def _pool(self, node: Node) -> aioredis.ConnectionPool:
        pool = self._pools.get(node.addr)
        if pool is None:
            if self.tls:
                pool = aioredis.ConnectionPool(host=node.host, port=node.port,
                                               connection_class=aioredis.SSLConnection,
                                               **self.pool_options(node))
            else:
                pool = aioredis.ConnectionPool(host=node.host, port=node.port,
                                               **self.pool_options(node))
            self._pools[node.addr] = pool
        return pool

    async def _renew_pool(self, node: Node, refused: aioredis.ConnectionPool) -> None:
        """`node` refused HELLO 3 on a connection of pool `refused`: its next connections
        come from a RESP2 pool (another task may have made it already)."""
        if self._pools.get(node.addr) is refused:
            del self._pools[node.addr]
        await refused.disconnect(inuse_connections=False)

    async def connect(self) -> Node:
        return await self._current()

    async def aclose(self) -> None:
        pools = list(self._pools.values())
        self._pools.clear()
        self.node = None
        for pool in pools:
            await pool.disconnect()

    close = aclose

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _connection(self, node: Node) -> tuple[aioredis.ConnectionPool, Connection]:
        """A connection to `node`, handshake done (over RESP2 if it refuses HELLO 3).
        Raises network errors as redis-py does, a refused handshake as `DisqueError`."""
        while True:
            pool = self._pool(node)
            try:
                return pool, await pool.get_connection()
            except (ResponseError, AuthenticationError) as exc:
                if not self.resp3_refused(node, exc):
                    raise error_from_redis(exc) from None
            await self._renew_pool(node, pool)

    async def _hello_on(self, node: Node) -> Hello:
        pool, conn = await self._connection(node)
        try:
            await conn.send_command("HELLO", check_health=False)
            return replies.parse_hello(await conn.read_response())
        except ResponseError as exc:
            raise error_from_redis(exc) from None
        except NETWORK_ERRORS:
            await conn.disconnect()
            raise
        finally:
            await pool.release(conn)

    async def _connect(self) -> Node:
        """Ask the candidates for HELLO in turn until the client is on one (`Connecting`)."""
        search = Connecting(self)
        for node in search.candidates:
            try:
                hello = await self._hello_on(node)
            except (*NETWORK_ERRORS, DisqueError) as exc:
                failure = search.refused(node, exc)
                if failure is not None:
                    raise failure from None
                continue
            if search.answered(node, hello):
                return node
        return search.give_up()

    async def _current(self) -> Node:
        node = self.node
        if node is None:
            if self._connecting is None:
                self._connecting = asyncio.Lock()
            async with self._connecting:
                node = self.node or await self._connect()
        elif self.hello_due():
            try:
                hello: Hello | None = await self._hello_on(node)
            except (*NETWORK_ERRORS, DisqueError):
                hello = None
            if not self.refreshed(node, hello):
                node = await self._current()
        return node

    async def use_node(self, node: Node | str) -> Node:
        target = self.resolve(node)
        assert target is not None
        try:
            hello = await self._hello_on(target)
        except NETWORK_ERRORS as exc:
            raise self.unusable(target, exc) from exc
        self.use(target, hello)
        return target

    # -- sending -------------------------------------------------------------------------------
    async def _checkout(self, attempts: Attempts
                        ) -> tuple[Node, aioredis.ConnectionPool, Connection]:
        """(node, pool, connection) for the next attempt; raises DisqueConnectionError when
        the failover policy gives up connecting (nothing was sent). (`_connection` inlined:
        this is every command's path.)"""
        while True:
            node = attempts.required() or await self._current()
            pool = self._pool(node)
            try:
                return node, pool, await pool.get_connection()
            except (ResponseError, AuthenticationError) as exc:  # the handshake was refused
                if not self.resp3_refused(node, exc):
                    raise error_from_redis(exc) from None
                await self._renew_pool(node, pool)
            except NETWORK_ERRORS as exc:
                failure = attempts.connect_failed(node, exc)
                if failure is not None:
                    raise failure from exc

    async def _execute(self, args: Sequence[Any], safe: bool, blocking_ms: int | None,
                       pinned: Node | None = None) -> tuple[Any, Node]:
        attempts = Attempts(self, safe, pinned)
        while True:
            node, pool, conn = await self._checkout(attempts)
            try:
                await conn.send_command(*args, check_health=False)
                reply = await _read(conn, self._read_timeout(blocking_ms))
            except ResponseError as exc:
                error = error_from_redis(exc)
                if isinstance(error, LeavingError) and attempts.leaving(node):
                    continue
                raise error from None
            except AuthenticationError as exc:
                raise error_from_redis(exc) from None
            except NETWORK_ERRORS as exc:
                await conn.disconnect()
                failure = attempts.lost(node, exc)
                if failure is None:
                    continue
                raise failure from exc
            finally:
                await pool.release(conn)
            return reply, node

    async def _run(self, call: Call[T], node: Node | str | None = None) -> T:
        reply, _ = await self._execute(call.args, call.safe, call.blocking_ms,
                                       self.resolve(node))
        return call.parse(reply)

    async def execute_command(self, *args: Any, safe: bool = False,
                              node: Node | str | None = None) -> Any:
        return await self._run(calls.raw(*args, safe=safe), node)

    # -- jobs ----------------------------------------------------------------------------------
    async def add_job(self, queue: str | bytes, body: str | bytes, timeout_ms: int = 5000, *,
                      replicate: int | None = None, delay: int | None = None,
                      retry: int | None = None, ttl: int | None = None,
                      maxlen: int | None = None, async_: bool = False,
                      dedup: str | bytes | None = None,
                      allow_retry: bool | None = None, max_deliveries: int | None = None,
                      max_nacks: int | None = None, deadletter: str | bytes | None = None,
                      deadttl: int | None = None, backoff: int | None = None) -> str:
        """See `Client.add_job`."""
        return await self._run(calls.add_job(queue, body, timeout_ms, replicate=replicate,
                                             delay=delay, retry=retry, ttl=ttl, maxlen=maxlen,
                                             async_=async_, dedup=dedup,
                                             allow_retry=allow_retry,
                                             max_deliveries=max_deliveries,
                                             max_nacks=max_nacks, deadletter=deadletter,
                                             deadttl=deadttl, backoff=backoff))

    async def add_jobs(self, queue: str | bytes, bodies: Sequence[str | bytes],
                       timeout_ms: int = 5000, *, replicate: int | None = None,
                       delay: int | None = None, retry: int | None = None,
                       ttl: int | None = None, maxlen: int | None = None,
                       async_: bool = False, dedup_keys: Sequence[str | bytes] | None = None,
                       allow_retry: bool | None = None, batch_size: int = 1000,
                       node: Node | str | None = None, max_deliveries: int | None = None,
                       max_nacks: int | None = None, deadletter: str | bytes | None = None,
                       deadttl: int | None = None, backoff: int | None = None) -> AddJobsResult:
        """See `Client.add_jobs`: ADDJOBS per batch, pipelined ADDJOBs without it."""
        batch = AddJobsBatch(queue, bodies, timeout_ms, replicate=replicate, delay=delay,
                             retry=retry, ttl=ttl, maxlen=maxlen, async_=async_,
                             dedup_keys=dedup_keys, allow_retry=allow_retry,
                             batch_size=batch_size, support=self.addjobs_support,
                             max_deliveries=max_deliveries, max_nacks=max_nacks,
                             deadletter=deadletter, deadttl=deadttl, backoff=backoff)
        pinned = self.resolve(node)
        for todo in batch.chunks():
            await self._send_batch(batch, todo, pinned)
        return batch.result()

    async def _send_batch(self, batch: AddJobsBatch, todo: list[int],
                          pinned: Node | None) -> None:
        attempts = Attempts(self, batch.safe, pinned)
        timeout = self._read_timeout(batch.blocking_ms)
        while todo:
            try:
                node, pool, conn = await self._checkout(attempts)
            except DisqueConnectionError as failure:
                batch.fail(todo, failure)
                return
            sent = batch.round_trip(todo, node)
            try:
                await conn.send_packed_command(pack_pipeline(conn, [c.args for c in sent]),
                                               check_health=False)
                for command in sent:
                    try:
                        reply = await _read(conn, timeout)
                    except (ResponseError, AuthenticationError) as exc:  # an error reply
                        reply = error_from_redis(exc)
                    batch.take(command, reply, node)
            except NETWORK_ERRORS as exc:
                await conn.disconnect()
                lost = attempts.lost(node, exc)
                if lost is not None:
                    batch.fail(batch.pending(todo), lost)
                    return
            finally:
                await pool.release(conn)
            todo = batch.pending(todo)

    async def add_jobs_batch(self, queue: str | bytes, bodies: Sequence[str | bytes],
                             timeout_ms: int = 5000, *, replicate: int | None = None,
                             delay: int | None = None, retry: int | None = None,
                             ttl: int | None = None, maxlen: int | None = None,
                             async_: bool = False,
                             dedup_keys: Sequence[str | bytes] | None = None,
                             allow_retry: bool | None = None,
                             node: Node | str | None = None,
                             max_deliveries: int | None = None, max_nacks: int | None = None,
                             deadletter: str | bytes | None = None, deadttl: int | None = None,
                             backoff: int | None = None
                             ) -> list[str | DisqueError]:
        """See `Client.add_jobs_batch`: one ADDJOBS, an ID or an error per body."""
        return await self._run(calls.add_jobs_batch(queue, bodies, timeout_ms,
                                                    replicate=replicate, delay=delay,
                                                    retry=retry, ttl=ttl, maxlen=maxlen,
                                                    max_deliveries=max_deliveries,
                                                    max_nacks=max_nacks,
                                                    deadletter=deadletter, deadttl=deadttl,
                                                    backoff=backoff,
                                                    async_=async_, dedup_keys=dedup_keys,
                                                    allow_retry=allow_retry), node)

    async def get_job(self, *queues: str | bytes, timeout: int | None = None,
                      count: int | None = None, nohang: bool = False,
                      with_counters: bool = False) -> list[Job]:
        return await self._run(calls.get_job(queues, timeout=timeout, count=count,
                                             nohang=nohang, with_counters=with_counters))

    async def get_job_and_node(self, *queues: str | bytes, timeout: int | None = None,
                               count: int | None = None, nohang: bool = False,
                               with_counters: bool = False) -> tuple[list[Job], Node]:
        """`get_job`, and the node that delivered the jobs (see `Client.get_job_and_node`)."""
        call = calls.get_job(queues, timeout=timeout, count=count, nohang=nohang,
                             with_counters=with_counters)
        reply, node = await self._execute(call.args, call.safe, call.blocking_ms)
        return call.parse(reply), node

    async def ack_job(self, *ids: str | bytes, node: Node | str | None = None) -> int:
        return await self._run(calls.ack_job(*ids), node)

    async def fast_ack(self, *ids: str | bytes, node: Node | str | None = None) -> int:
        return await self._run(calls.fast_ack(*ids), node)

    async def nack(self, *ids: str | bytes, delay: int | None = None,
             node: Node | str | None = None) -> int:
        """NACK the jobs: back to their queue now, or after `delay` seconds."""
        return await self._run(calls.nack(*ids, delay=delay), node)

    async def working(self, job_id: str | bytes, node: Node | str | None = None) -> int:
        return await self._run(calls.working(job_id), node)

    async def enqueue(self, *ids: str | bytes, node: Node | str | None = None) -> int:
        return await self._run(calls.enqueue(*ids), node)

    async def dequeue(self, *ids: str | bytes) -> int:
        return await self._run(calls.dequeue(*ids))

    async def del_job(self, *ids: str | bytes) -> int:
        return await self._run(calls.del_job(*ids))

    async def show(self, job_id: str | bytes, node: Node | str | None = None
                   ) -> dict[str, Any] | None:
        return await self._run(calls.show(job_id), node)

    async def redrive(self, queue: str | bytes, count: int | None = None,
                      rate: int | None = None, reset: bool = False,
                      ids: Sequence[str | bytes] | None = None,
                      node: Node | str | None = None) -> int:
        """See `Client.redrive`: the dead-letter queue of the current node (or `node`)."""
        return await self._run(calls.redrive(queue, count, rate, reset, ids), node)

    # -- queues --------------------------------------------------------------------------------
    async def qlen(self, queue: str | bytes) -> int:
        return await self._run(calls.qlen(queue))

    async def qstat(self, queue: str | bytes) -> dict[str, Any] | None:
        return await self._run(calls.qstat(queue))

    async def qpeek(self, queue: str | bytes, count: int) -> list[Job]:
        return await self._run(calls.qpeek(queue, count))

    async def pause(self, queue: str | bytes, *options: str) -> str:
        return await self._run(calls.pause(queue, *options))

    async def qscan(self, *, count: int | None = None, minlen: int | None = None,
                    maxlen: int | None = None, importrate: int | None = None
                    ) -> AsyncIterator[str]:
        node = await self._current()
        cursor = 0
        while True:
            cursor, names = await self._run(calls.qscan(cursor, count=count, minlen=minlen,
                                                        maxlen=maxlen, importrate=importrate),
                                            node)
            for name in names:
                yield name
            if cursor == 0:
                return

    async def jscan(self, *, queue: str | bytes | None = None, states: Sequence[str] = (),
                    count: int | None = None, reply: str = "id") -> AsyncIterator[Any]:
        node = await self._current()
        cursor = 0
        while True:
            cursor, items = await self._run(calls.jscan(cursor, count=count, queue=queue,
                                                        states=states, reply=reply), node)
            for item in items:
                yield item
            if cursor == 0:
                return

    # -- server --------------------------------------------------------------------------------
    async def info(self, section: str | None = None) -> dict[str, Any]:
        return await self._run(calls.info(section))

    async def hello(self) -> Hello:
        node = await self._current()
        hello = await self._run(calls.hello(), node)
        self.pick_after_hello(node, hello)
        return hello

    async def ping(self) -> str:
        return await self._run(calls.ping())

    # -- consumer ------------------------------------------------------------------------------
    async def consume(self, queues: str | bytes | Sequence[str | bytes],
                      handler: Callable[[Job], Awaitable[object] | object], *,
                      concurrency: int = 1,
                      stop_event: asyncio.Event | None = None, count: int = 1,
                      poll_ms: int = 1000, max_jobs: int | None = None, working: bool = True,
                      heartbeat_after: float = 0.2, follow_producers: bool = True,
                      follow_every: int = 100, handle_signals: bool = True,
                      with_counters: bool = True, error_backoff: float = 0.5) -> ConsumeStats:
        """The asyncio twin of `Client.consume`: `concurrency` tasks; `handler` may be a
        coroutine function or a plain function. Bad arguments raise ValueError at once.
        (The worker's asyncio driver runs the consume policy: see `disque.client.consumer`.)"""
        from disque.client.consumer import EVENTS, consume_core, consume_queues, consume_stats
        from disque.worker.aio import AsyncWorker
        from disque.worker.driver import Fetch

        names = consume_queues(queues, concurrency=concurrency, count=count, poll_ms=poll_ms,
                               max_jobs=max_jobs)
        core = consume_core(count=count, max_jobs=max_jobs, working=working,
                            heartbeat_after=heartbeat_after, follow_producers=follow_producers,
                            follow_every=follow_every, error_backoff=error_backoff)
        fetch = Fetch(names, timeout_ms=poll_ms, with_counters=with_counters,
                      concurrency=concurrency, signals=handle_signals)
        driver = AsyncWorker(self, handler, fetch, core, EVENTS, stop_event)
        await driver.run()
        if driver.fatal is not None:
            raise driver.fatal
        return consume_stats(core)
