"""The blocking client: redis-py connection pools, one per node, and the failover loop.

Every command goes through `_execute`: take a connection to the current node from its pool,
send, read, give the connection back. What happens on trouble:

- the connection cannot be made: nothing was sent, so the command moves to the next node
  whatever it is (this is also how the first node is found);
- the connection breaks after sending, or the node answers -LEAVING: a command marked safe
  (see `calls`) is sent again, first to the same node if it still accepts connections (a
  DEDUP'ed ADDJOB is only idempotent there), else to another; an unsafe one raises
  `DisqueConnectionError` / `LeavingError` so the caller decides;
- the handshake is refused: a node that refuses `HELLO 3` gets a RESP2 pool (see `base`),
  any other refusal (a password) raises its typed exception;
- any other error reply raises its typed exception and changes nothing.

Those decisions (and which node to connect to, what HELLO says) are `base`'s, shared with
`AsyncClient`; this module only moves the bytes.

A client is safe to share between threads: each command uses its own pooled connection.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

import redis
from redis.connection import Connection
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
from disque.client.errors import DisqueConnectionError, DisqueError, LeavingError, error_from_redis
from disque.client.nodes import Node
from disque.client.replies import Hello, Job

T = TypeVar("T")
NETWORK_ERRORS = (RedisConnectionError, RedisTimeoutError, OSError)


class Client(ClientBase):
    """Blocking Disque client. `Client(["127.0.0.1:7711", "127.0.0.1:7712"])` or
    `Client("disque://127.0.0.1:7711,127.0.0.1:7712")`; connects lazily (or on `connect()`)
    to a random reachable node, preferring the lowest HELLO priority.

    Keyword settings: `password`, `protocol` (2 or 3; default redis-py's), `socket_timeout`,
    `connect_timeout`, `retries` (resends of a safe command after a failure),
    `hello_interval` (seconds between HELLO refreshes), `cooldown` (seconds a failed node is
    tried last), `discover` (False: use only the given nodes, not what HELLO lists),
    `client_name`, `max_connections` (per node pool), `ssl` (TLS to every node; also
    `disque+tls://` URLs, and implied by redis-py's `ssl_ca_certs`, `ssl_certfile`,
    `ssl_keyfile`...); other keywords go to redis-py's connection class."""

    def __init__(self, nodes: NodesSpec, **kwargs: Any) -> None:
        super().__init__(nodes, **kwargs)
        self._pools: dict[str, redis.ConnectionPool] = {}
        self._lock = threading.RLock()

    @classmethod
    def from_url(cls, url: str, **kwargs: Any) -> Client:
        return cls(url, **kwargs)

    # -- connection management (the decisions are `ClientBase`'s and `Connecting`'s) --------
    def _pool(self, node: Node) -> redis.ConnectionPool:
        pool = self._pools.get(node.addr)
        if pool is None:
            with self._lock:
                pool = self._pools.get(node.addr)
                if pool is None:
                    if self.tls:
                        pool = redis.ConnectionPool(host=node.host, port=node.port,
                                                    connection_class=redis.SSLConnection,
                                                    **self.pool_options(node))
                    else:
                        pool = redis.ConnectionPool(host=node.host, port=node.port,
                                                    **self.pool_options(node))
                    self._pools[node.addr] = pool
        return pool

    def _renew_pool(self, node: Node, refused: redis.ConnectionPool) -> None:
        """`node` refused HELLO 3 on a connection of pool `refused`: its next connections
        come from a RESP2 pool (another thread may have made it already)."""
        with self._lock:
            if self._pools.get(node.addr) is refused:
                del self._pools[node.addr]
        refused.disconnect(inuse_connections=False)  # (one mid-handshake fails by itself)

    def connect(self) -> Node:
        """Connect now (if not yet) and return the node the client is on."""
        return self._current()

    def close(self) -> None:
        with self._lock:
            for pool in self._pools.values():
                pool.disconnect()
            self._pools.clear()
            self.node = None

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _connection(self, node: Node) -> tuple[redis.ConnectionPool, Connection]:
        """A connection to `node`, handshake done (over RESP2 if it refuses HELLO 3).
        Raises network errors as redis-py does, a refused handshake as `DisqueError`."""
        while True:
            pool = self._pool(node)
            try:
                return pool, pool.get_connection()
            except (ResponseError, AuthenticationError) as exc:
                if not self.resp3_refused(node, exc):
                    raise error_from_redis(exc) from None
            self._renew_pool(node, pool)

    def _hello_on(self, node: Node) -> Hello:
        pool, conn = self._connection(node)
        try:
            conn.send_command("HELLO", check_health=False)
            return replies.parse_hello(conn.read_response())
        except ResponseError as exc:
            raise error_from_redis(exc) from None
        except NETWORK_ERRORS:
            conn.disconnect()
            raise
        finally:
            pool.release(conn)

    def _connect(self) -> Node:
        """Ask the candidates for HELLO in turn until the client is on one (`Connecting`)."""
        search = Connecting(self)
        for node in search.candidates:
            try:
                hello = self._hello_on(node)
            except (*NETWORK_ERRORS, DisqueError) as exc:
                failure = search.refused(node, exc)
                if failure is not None:
                    raise failure from None
                continue
            if search.answered(node, hello):
                return node
        return search.give_up()

    def _current(self) -> Node:
        node = self.node
        if node is None:
            with self._lock:
                node = self.node or self._connect()
        elif self.hello_due():
            try:
                hello: Hello | None = self._hello_on(node)
            except (*NETWORK_ERRORS, DisqueError):
                hello = None
            if not self.refreshed(node, hello):
                with self._lock:
                    node = self.node or self._connect()
        return node

    def use_node(self, node: Node | str) -> Node:
        """Move the client to `node` (an address or a known Node) for the next commands."""
        target = self.resolve(node)
        assert target is not None
        try:
            hello = self._hello_on(target)
        except NETWORK_ERRORS as exc:
            raise self.unusable(target, exc) from exc
        self.use(target, hello)
        return target

    # -- the one place commands are sent -------------------------------------------------------
    def _checkout(self, attempts: Attempts) -> tuple[Node, redis.ConnectionPool, Connection]:
        """(node, pool, connection) for the next attempt; raises DisqueConnectionError when
        the failover policy gives up connecting (nothing was sent). (`_connection` inlined:
        this is every command's path.)"""
        while True:
            node = attempts.required() or self._current()
            pool = self._pool(node)
            try:
                return node, pool, pool.get_connection()
            except (ResponseError, AuthenticationError) as exc:  # the handshake was refused
                if not self.resp3_refused(node, exc):
                    raise error_from_redis(exc) from None
                self._renew_pool(node, pool)
            except NETWORK_ERRORS as exc:
                failure = attempts.connect_failed(node, exc)
                if failure is not None:
                    raise failure from exc

    def _execute(self, args: Sequence[Any], safe: bool, blocking_ms: int | None,
                 pinned: Node | None = None) -> tuple[Any, Node]:
        attempts = Attempts(self, safe, pinned)
        while True:
            node, pool, conn = self._checkout(attempts)
            try:
                conn.send_command(*args, check_health=False)
                reply = conn.read_response(timeout=self.read_timeout(blocking_ms))
            except ResponseError as exc:
                error = error_from_redis(exc)
                if isinstance(error, LeavingError) and attempts.leaving(node):
                    continue
                raise error from None
            except AuthenticationError as exc:
                raise error_from_redis(exc) from None
            except NETWORK_ERRORS as exc:
                conn.disconnect()
                failure = attempts.lost(node, exc)
                if failure is None:
                    continue
                raise failure from exc
            finally:
                pool.release(conn)
            return reply, node

    def _run(self, call: Call[T], node: Node | str | None = None) -> T:
        reply, _ = self._execute(call.args, call.safe, call.blocking_ms, self.resolve(node))
        return call.parse(reply)

    def execute_command(self, *args: Any, safe: bool = False, node: Node | str | None = None
                        ) -> Any:
        """Send any command; the reply as redis-py parsed it. `safe=True` lets it be resent
        after a failure."""
        return self._run(calls.raw(*args, safe=safe), node)

    # -- jobs ----------------------------------------------------------------------------------
    def add_job(self, queue: str | bytes, body: str | bytes, timeout_ms: int = 5000, *,
                replicate: int | None = None, delay: int | None = None,
                retry: int | None = None, ttl: int | None = None, maxlen: int | None = None,
                async_: bool = False, dedup: str | bytes | None = None,
                allow_retry: bool | None = None, max_deliveries: int | None = None,
                max_nacks: int | None = None, deadletter: str | bytes | None = None,
                deadttl: int | None = None, backoff: int | None = None) -> str:
        """ADDJOB; returns the job ID. TTL, RETRY and DELAY are in seconds, `timeout_ms` is
        how long the node may wait for replication. After a lost reply the ADDJOB is resent
        only if `allow_retry` (default: only when a `dedup` key makes it idempotent).
        `max_deliveries`, `max_nacks`, `deadletter`, `deadttl` (seconds): the job's
        dead-letter policy (disque-py; see `redrive`); `backoff` (seconds): a NACK without
        a delay puts the job off min(backoff, 2^(delivery-1)) s, with jitter."""
        return self._run(calls.add_job(queue, body, timeout_ms, replicate=replicate, delay=delay,
                                       retry=retry, ttl=ttl, maxlen=maxlen, async_=async_,
                                       dedup=dedup, allow_retry=allow_retry,
                                       max_deliveries=max_deliveries, max_nacks=max_nacks,
                                       deadletter=deadletter, deadttl=deadttl, backoff=backoff))

    def add_jobs(self, queue: str | bytes, bodies: Sequence[str | bytes],
                 timeout_ms: int = 5000, *, replicate: int | None = None,
                 delay: int | None = None, retry: int | None = None, ttl: int | None = None,
                 maxlen: int | None = None, async_: bool = False,
                 dedup_keys: Sequence[str | bytes] | None = None,
                 allow_retry: bool | None = None, batch_size: int = 1000,
                 node: Node | str | None = None, max_deliveries: int | None = None,
                 max_nacks: int | None = None, deadletter: str | bytes | None = None,
                 deadttl: int | None = None, backoff: int | None = None) -> AddJobsResult:
        """Many jobs with the same options, `batch_size` per round trip: one ADDJOBS per
        batch (replicated together), or pipelined ADDJOBs on a node without ADDJOBS (found
        out once per node). Never raises for one job's error: see `AddJobsResult`. With
        `dedup_keys` (one per body) a batch whose replies were lost is resent, and the node
        answers the IDs of the jobs it already added; without them only if `allow_retry`."""
        batch = AddJobsBatch(queue, bodies, timeout_ms, replicate=replicate, delay=delay,
                             retry=retry, ttl=ttl, maxlen=maxlen, async_=async_,
                             dedup_keys=dedup_keys, allow_retry=allow_retry,
                             batch_size=batch_size, support=self.addjobs_support,
                             max_deliveries=max_deliveries, max_nacks=max_nacks,
                             deadletter=deadletter, deadttl=deadttl, backoff=backoff)
        pinned = self.resolve(node)
        for todo in batch.chunks():
            self._send_batch(batch, todo, pinned)
        return batch.result()

    def _send_batch(self, batch: AddJobsBatch, todo: list[int], pinned: Node | None) -> None:
        """Add bodies `todo` of `batch`, one round trip per try (see `batch` for the policy,
        `Attempts` for where a try goes)."""
        attempts = Attempts(self, batch.safe, pinned)
        timeout = self.read_timeout(batch.blocking_ms)
        while todo:
            try:
                node, pool, conn = self._checkout(attempts)
            except DisqueConnectionError as failure:
                batch.fail(todo, failure)
                return
            sent = batch.round_trip(todo, node)
            try:
                conn.send_packed_command(pack_pipeline(conn, [c.args for c in sent]),
                                         check_health=False)
                for command in sent:
                    try:
                        reply = conn.read_response(timeout=timeout)
                    except (ResponseError, AuthenticationError) as exc:  # an error reply
                        reply = error_from_redis(exc)
                    batch.take(command, reply, node)
            except NETWORK_ERRORS as exc:
                conn.disconnect()
                lost = attempts.lost(node, exc)
                if lost is not None:
                    batch.fail(batch.pending(todo), lost)
                    return
            finally:
                pool.release(conn)
            todo = batch.pending(todo)

    def add_jobs_batch(self, queue: str | bytes, bodies: Sequence[str | bytes],
                       timeout_ms: int = 5000, *, replicate: int | None = None,
                       delay: int | None = None, retry: int | None = None,
                       ttl: int | None = None, maxlen: int | None = None,
                       async_: bool = False, dedup_keys: Sequence[str | bytes] | None = None,
                       allow_retry: bool | None = None, node: Node | str | None = None,
                       max_deliveries: int | None = None, max_nacks: int | None = None,
                       deadletter: str | bytes | None = None, deadttl: int | None = None,
                       backoff: int | None = None
                       ) -> list[str | DisqueError]:
        """One ADDJOBS: per body its job ID or its error, in order. Raises for an error of
        the command as a whole (e.g. "unknown command" on a node without ADDJOBS; `add_jobs`
        falls back to ADDJOB there)."""
        return self._run(calls.add_jobs_batch(queue, bodies, timeout_ms, replicate=replicate,
                                              delay=delay, retry=retry, ttl=ttl,
                                              maxlen=maxlen, async_=async_,
                                              dedup_keys=dedup_keys, allow_retry=allow_retry,
                                              max_deliveries=max_deliveries,
                                              max_nacks=max_nacks, deadletter=deadletter,
                                              deadttl=deadttl, backoff=backoff), node)

    def get_job(self, *queues: str | bytes, timeout: int | None = None,
                count: int | None = None, nohang: bool = False,
                with_counters: bool = False) -> list[Job]:
        """GETJOB ... FROM queues. `timeout` in ms (None: wait for a job, as the node's
        default); [] when nothing came. Always resent elsewhere after a failure."""
        return self._run(calls.get_job(queues, timeout=timeout, count=count, nohang=nohang,
                                       with_counters=with_counters))

    def get_job_and_node(self, *queues: str | bytes, timeout: int | None = None,
                         count: int | None = None, nohang: bool = False,
                         with_counters: bool = False) -> tuple[list[Job], Node]:
        """`get_job`, and the node that delivered the jobs: where their ACKJOB, NACK and
        WORKING belong (the client may have moved on to another node meanwhile)."""
        call = calls.get_job(queues, timeout=timeout, count=count, nohang=nohang,
                             with_counters=with_counters)
        reply, node = self._execute(call.args, call.safe, call.blocking_ms)
        return call.parse(reply), node

    def ack_job(self, *ids: str | bytes, node: Node | str | None = None) -> int:
        return self._run(calls.ack_job(*ids), node)

    def fast_ack(self, *ids: str | bytes, node: Node | str | None = None) -> int:
        return self._run(calls.fast_ack(*ids), node)

    def nack(self, *ids: str | bytes, delay: int | None = None,
             node: Node | str | None = None) -> int:
        """NACK the jobs: back to their queue now, or after `delay` seconds."""
        return self._run(calls.nack(*ids, delay=delay), node)

    def working(self, job_id: str | bytes, node: Node | str | None = None) -> int:
        return self._run(calls.working(job_id), node)

    def enqueue(self, *ids: str | bytes, node: Node | str | None = None) -> int:
        return self._run(calls.enqueue(*ids), node)

    def dequeue(self, *ids: str | bytes) -> int:
        return self._run(calls.dequeue(*ids))

    def del_job(self, *ids: str | bytes) -> int:
        return self._run(calls.del_job(*ids))

    def show(self, job_id: str | bytes, node: Node | str | None = None) -> dict[str, Any] | None:
        return self._run(calls.show(job_id), node)

    def redrive(self, queue: str | bytes, count: int | None = None, rate: int | None = None,
                reset: bool = False, ids: Sequence[str | bytes] | None = None,
                node: Node | str | None = None) -> int:
        """REDRIVE the dead-letter queue `queue` of the current node (or `node`): its dead
        jobs back to their source queues, `ids` at once, else `count` (default all) at
        `rate` a second; `reset` restarts their counters. Returns how many moved (`ids`) or
        how many the node's task will move. Dead jobs sit on the node that dead-lettered
        them: to drain a cluster's, call it for each node."""
        return self._run(calls.redrive(queue, count, rate, reset, ids), node)

    # -- queues --------------------------------------------------------------------------------
    def qlen(self, queue: str | bytes) -> int:
        return self._run(calls.qlen(queue))

    def qstat(self, queue: str | bytes) -> dict[str, Any] | None:
        return self._run(calls.qstat(queue))

    def qpeek(self, queue: str | bytes, count: int) -> list[Job]:
        return self._run(calls.qpeek(queue, count))

    def pause(self, queue: str | bytes, *options: str) -> str:
        return self._run(calls.pause(queue, *options))

    def qscan(self, *, count: int | None = None, minlen: int | None = None,
              maxlen: int | None = None, importrate: int | None = None) -> Iterator[str]:
        """Every queue name of the current node (QSCAN until the cursor is 0)."""
        node = self._current()  # a cursor is only meaningful on the node that gave it
        cursor = 0
        while True:
            cursor, names = self._run(calls.qscan(cursor, count=count, minlen=minlen,
                                                  maxlen=maxlen, importrate=importrate), node)
            yield from names
            if cursor == 0:
                return

    def jscan(self, *, queue: str | bytes | None = None, states: Sequence[str] = (),
              count: int | None = None, reply: str = "id") -> Iterator[Any]:
        """Every job of the current node: IDs, or SHOW dicts with `reply="all"`."""
        node = self._current()
        cursor = 0
        while True:
            cursor, items = self._run(calls.jscan(cursor, count=count, queue=queue,
                                                  states=states, reply=reply), node)
            yield from items
            if cursor == 0:
                return

    # -- server --------------------------------------------------------------------------------
    def info(self, section: str | None = None) -> dict[str, Any]:
        return self._run(calls.info(section))

    def hello(self) -> Hello:
        """HELLO on the current node; the node list is refreshed from it."""
        node = self._current()
        hello = self._run(calls.hello(), node)
        self.pick_after_hello(node, hello)
        return hello

    def ping(self) -> str:
        return self._run(calls.ping())

    # -- consumer ------------------------------------------------------------------------------
    def consume(self, queues: str | bytes | Sequence[str | bytes],
                handler: Callable[[Job], object], *, concurrency: int = 1,
                stop_event: threading.Event | None = None, **options: Any) -> ConsumeStats:
        """Run workers until `stop_event` is set, SIGINT/SIGTERM, or `max_jobs`: GETJOB,
        `handler(job)`, ACKJOB on success, NACK on exception, WORKING while a handler runs
        long. See `disque.client.consumer.Consumer` for the options; bad ones (no queue,
        `concurrency` < 1...) raise ValueError before anything starts."""
        from disque.client.consumer import Consumer

        consumer = Consumer(self, queues, handler, concurrency=concurrency,
                            stop_event=stop_event, **options)
        return consumer.run()
