"""Producing one Spark partition into the cluster: the part of `write_jobs` and of the data
source writer that runs on the executors. It imports nothing from Spark, so it is tested
with plain iterators.

Idempotent production across task retries
-----------------------------------------
Spark runs a failed task again from the start of its partition. Every row gets a DEDUP key
that is the same in every attempt: `<write id>:<partition>:<row index>` (the write id is
drawn once on the driver for one `write_jobs` call / one data source write), or the value of
a user column (`dedup_key_col`) for keys that must also hold across separate writes. And
every attempt of partition p sends to the same node: `nodes[p % len(nodes)]`. A node keeps
the keys it saw for the job's TTL, so the rows an earlier attempt had added are answered
with their first job's ID instead of being added again (still counted as added).

What this does NOT cover, honestly:
- The DEDUP memory is per node. If partition p's node is down, the partition falls back to
  the next node of the list; rows the dead node had already taken are then added again there
  (the copies on the dead node exist if it comes back or replicated them), so a node failure
  during a write can duplicate.
- Row-index keys assume the partition yields the same rows in the same order in every
  attempt (true for files, `range`, deterministic transformations; not for `rand()`, or for
  a shuffle whose order differs when recomputed). Use `dedup_key_col` with a stable key then.
- Keys are remembered for the job's TTL only (default one day).
- antirez's Disque has no DEDUP (nor ADDJOBS): a node without ADDJOBS that answers the
  pipelined `ADDJOB ... DEDUP key` with a syntax error gets the rows without keys, with a
  warning logged once per partition; a retried task may add rows there again.

Batches: a batch goes to the node as one ADDJOBS (`ADDJOBS ... WITHDEDUP JOBS key body
...`), which the node replicates in one bus round trip, so one connection per partition is
enough. A node without ADDJOBS (antirez's Disque) gets pipelined ADDJOBs instead (the
client finds out once per node); there a synchronous replicated ADDJOB holds the
connection until its copies are confirmed, so such batches are split over `connections`
connections (8 by default).

Retries: NOREPL, LEAVING, PAUSED, OOM and connection errors are retried with exponential
backoff (`max_attempts` times); other errors (MAXLEN, a bad option) count the row as failed
at once. Without DEDUP a batch whose replies were lost is sent again (at-least-once,
duplicates possible).
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

from disque.client.base import AddJobsResult
from disque.client.errors import (
    DisqueConnectionError,
    DisqueError,
    LeavingError,
    NoReplicationError,
    OutOfMemoryError,
    PausedError,
)
from disque.client.nodes import Node, parse_nodes
from disque.client.sync import Client

log = logging.getLogger("disque.spark.producer")

RETRYABLE = (NoReplicationError, LeavingError, PausedError, OutOfMemoryError,
             DisqueConnectionError)


class BatchClient(Protocol):
    """What a partition needs of its client (a `Client`; a fake in the unit tests)."""

    def has_addjobs(self, node: Node | str | None = None) -> bool | None: ...

    def add_jobs(self, queue: str | bytes, bodies: Sequence[str | bytes],
                 timeout_ms: int = 5000, *, replicate: int | None = None,
                 delay: int | None = None, retry: int | None = None, ttl: int | None = None,
                 maxlen: int | None = None, async_: bool = False,
                 dedup_keys: Sequence[str | bytes] | None = None,
                 allow_retry: bool | None = None, batch_size: int = 1000) -> AddJobsResult: ...

    def close(self) -> None: ...


def normalize_nodes(nodes: str | Iterable[str]) -> list[str]:
    """`"h:p,h:p"`, `"disque://h:p,h:p"` or a list -> `["h:p", ...]` in the given order."""
    out = []
    for host, port in parse_nodes(nodes):
        out.append(f"[{host}]:{port}" if ":" in host else f"{host}:{port}")
    return out


def node_order(nodes: Sequence[str], partition: int) -> list[str]:
    """The nodes partition `partition` tries, in order: its own first, then the next ones."""
    k = partition % len(nodes)
    return list(nodes[k:]) + list(nodes[:k])


def dedup_key(prefix: str, partition: int, index: int) -> str:
    return f"{prefix}:{partition}:{index}"


def to_body(value: Any) -> bytes | str:
    """A column value as a job body: bytes as is, str as UTF-8, None as empty, others str()."""
    if isinstance(value, (bytes, str)):
        return value
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    if value is None:
        return b""
    return str(value)


def _json_default(value: Any) -> Any:
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", "replace")
    if hasattr(value, "asDict"):
        return value.asDict(recursive=True)
    if hasattr(value, "isoformat"):
        return value.isoformat()
    return str(value)


def json_body(record: dict[str, Any]) -> str:
    """A row as a compact JSON object (dates as ISO strings, Decimals as strings)."""
    return json.dumps(record, default=_json_default, separators=(",", ":"),
                      ensure_ascii=False)


# Integer settings of a write, as every node checks ADDJOB's options (docs/commands.md,
# "ADDJOB") and as the producer needs its own: (least, most). They are checked on the driver
# (ProducerConfig, and the data source's options with their own names) so that a bad value
# fails the write at once, rather than every row on the executors.
LIMITS: dict[str, tuple[int, int | None]] = {
    "timeout_ms": (0, None), "replicate": (1, 65535), "retry": (0, None), "ttl": (1, None),
    "delay": (0, None), "maxlen": (1, None), "batch_size": (1, None),
    "max_attempts": (1, None), "connections": (1, None),
}
OPTIONAL = ("replicate", "retry", "ttl", "delay", "maxlen", "connections")  # None: default


def integer_range(least: int, most: int | None) -> str:
    return f"an integer >= {least}" if most is None else f"an integer from {least} to {most}"


def check_setting(name: str, value: Any) -> None:
    """ValueError unless `value` is an int within LIMITS[name]."""
    least, most = LIMITS[name]
    if (isinstance(value, bool) or not isinstance(value, int) or value < least
            or (most is not None and value > most)):
        raise ValueError(f"{name} must be {integer_range(least, most)}, not {value!r}")


@dataclass(slots=True)
class ProducerConfig:
    """Everything a partition needs; built on the driver and shipped (pickled) to tasks."""

    nodes: list[str]
    queue: str
    timeout_ms: int = 5000
    replicate: int | None = None
    retry: int | None = None
    ttl: int | None = None
    delay: int | None = None
    maxlen: int | None = None
    async_: bool = False
    batch_size: int = 500
    dedup: bool = True
    dedup_prefix: str = ""
    max_attempts: int = 8
    backoff: float = 0.05
    backoff_max: float = 2.0
    overlap: bool = True
    # None: 1, or 8 for synchronous replicated batches to a node without ADDJOBS
    connections: int | None = None
    client_options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.nodes:
            raise ValueError("at least one node is needed")
        if not isinstance(self.queue, (str, bytes)) or not self.queue:
            raise ValueError(f"a queue name is needed, not {self.queue!r}")
        for name in LIMITS:
            value = getattr(self, name)
            if value is not None or name not in OPTIONAL:
                check_setting(name, value)
        if self.delay is not None and self.ttl is not None and self.delay >= self.ttl:
            raise ValueError(f"delay ({self.delay}) must be smaller than ttl ({self.ttl}): "
                             "the node would refuse every job")
        if self.dedup and not self.dedup_prefix:
            raise ValueError("dedup needs a dedup_prefix (drawn once on the driver)")


@dataclass(slots=True)
class PartitionResult:
    partition: int
    added: int = 0
    failed: int = 0
    node_switches: int = 0
    errors: list[str] = field(default_factory=list)


class PartitionProducer:
    """Sends one partition's (body, key) pairs in batches (ADDJOBS) to its node."""

    def __init__(self, cfg: ProducerConfig, partition: int,
                 client_factory: Callable[[str], BatchClient] | None = None,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.cfg = cfg
        self.partition = partition
        self.order = node_order(cfg.nodes, partition)
        self.node_index = 0
        self.client_factory = client_factory or self._make_client
        self.sleep = sleep
        self.client: BatchClient | None = None
        self.result = PartitionResult(partition)
        self._pool: ThreadPoolExecutor | None = None
        self.dedup_refused = False  # the node has no DEDUP (antirez's Disque): keys dropped
        # connections per batch where the node has no ADDJOBS (see `_connections`)
        if cfg.connections is not None:
            self.connections = cfg.connections
        else:  # only a synchronous replicated ADDJOB waits for other nodes
            self.connections = 1 if cfg.async_ or cfg.replicate == 1 else 8

    def _make_client(self, addr: str) -> Client:
        opts = dict(retries=1, discover=False)
        opts.update(self.cfg.client_options)
        return Client([addr], **opts)

    @property
    def node(self) -> str:
        return self.order[self.node_index % len(self.order)]

    def _client(self) -> BatchClient:
        if self.client is None:
            self.client = self.client_factory(self.node)
        return self.client

    def _next_node(self, why: str) -> None:
        """The partition's node is unreachable: fall back to the next one of the list."""
        if len(self.order) == 1:
            return
        old = self.node
        self.close()
        self.node_index += 1
        self.result.node_switches += 1
        log.warning("producer.fallback partition=%s from=%s to=%s reason=%s",
                    self.partition, old, self.node, why)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        if self.client is not None:
            try:
                self.client.close()
            finally:
                self.client = None

    def _error(self, text: str) -> None:
        if len(self.result.errors) < 20:
            self.result.errors.append(text)

    def send_batch(self, bodies: Sequence[bytes | str], keys: Sequence[str] | None) -> None:
        """Add every body (with its DEDUP key) in one round trip, retrying what failed
        transiently. Updates `result.added` / `result.failed`."""
        cfg = self.cfg
        todo = list(range(len(bodies)))
        attempt = 0
        if self.dedup_refused:
            keys = None
        while todo:
            client = self._client()
            errors = self._add(client, todo, bodies, keys)
            if keys is not None and self._refuses_dedup(client, errors):
                keys = None
                continue
            retry_later = []
            unreachable = False
            for pos, err in zip(todo, errors, strict=True):
                if err is None:
                    self.result.added += 1
                elif isinstance(err, RETRYABLE):
                    retry_later.append(pos)
                    if isinstance(err, LeavingError) or (
                            isinstance(err, DisqueConnectionError) and err.unreachable):
                        unreachable = True
                else:
                    self.result.failed += 1
                    self._error(f"{type(err).__name__}: {err}")
            todo = retry_later
            if not todo:
                return
            attempt += 1
            if attempt >= cfg.max_attempts:
                self.result.failed += len(todo)
                self._error(f"gave up after {attempt} attempts: {errors[0]}")
                return
            if unreachable:
                self._next_node(str(next(e for e in errors if e is not None)))
            self.sleep(min(cfg.backoff * (2 ** (attempt - 1)), cfg.backoff_max))

    def _refuses_dedup(self, client: BatchClient, errors: Sequence[DisqueError | None]) -> bool:
        """Whether every ADDJOB of a batch with DEDUP keys got a syntax error from a node
        without ADDJOBS: antirez's Disque, which has no DEDUP either. Then the rows go
        without keys (nothing was added: the whole command was refused)."""
        if client.has_addjobs() is not False or not errors or not all(
                e is not None and e.prefix == "ERR" and e.message.lower().startswith("syntax")
                for e in errors):
            return False
        self.dedup_refused = True
        log.warning("producer.no_dedup partition=%s node=%s: the node has no ADDJOB DEDUP "
                    "(antirez's Disque); rows are added without keys, a retried task may "
                    "add them again", self.partition, self.node)
        return True

    def _connections(self, client: BatchClient) -> int:
        """How many connections the next batch goes over. An ADDJOBS batch is replicated in
        one round trip: one is enough. Pipelined synchronous replicated ADDJOBs (a node
        without ADDJOBS) each hold the connection until their copies are confirmed (the
        original runs the next command of a pipeline only then): `connections` of them. Until
        the client knows which the node is, the first batch is split as for the original
        (on a node with ADDJOBS that is a few smaller ADDJOBS)."""
        if self.cfg.connections is None and client.has_addjobs():
            return 1
        return self.connections

    def _add(self, client: BatchClient, todo: list[int], bodies: Sequence[bytes | str],
             keys: Sequence[str] | None) -> list[DisqueError | None]:
        """Add bodies[todo]; one error (or None) per position, over `_connections` at once."""
        n = self._connections(client)
        if n <= 1 or len(todo) < 2 * n:
            return self._add_one(client, todo, bodies, keys)
        if self._pool is None:
            self._pool = ThreadPoolExecutor(n, thread_name_prefix="disque-addjob")
        size = -(-len(todo) // n)
        parts = [todo[i:i + size] for i in range(0, len(todo), size)]
        results = self._pool.map(lambda part: self._add_one(client, part, bodies, keys), parts)
        return [err for part_errors in results for err in part_errors]

    def _add_one(self, client: BatchClient, todo: list[int], bodies: Sequence[bytes | str],
                 keys: Sequence[str] | None) -> list[DisqueError | None]:
        cfg = self.cfg
        try:
            res = client.add_jobs(
                cfg.queue, [bodies[i] for i in todo], cfg.timeout_ms,
                replicate=cfg.replicate, delay=cfg.delay, retry=cfg.retry, ttl=cfg.ttl,
                maxlen=cfg.maxlen, async_=cfg.async_,
                dedup_keys=None if keys is None else [keys[i] for i in todo],
                allow_retry=True, batch_size=len(todo))
            return list(res.errors)
        except DisqueError as exc:  # e.g. authentication: nothing was added
            return [exc] * len(todo)

    def run(self, records: Iterable[tuple[bytes | str, str | None]]) -> PartitionResult:
        """Produce `(body, key)` pairs (key None: derive `<prefix>:<partition>:<index>`).

        With `overlap` (the default) a sender thread sends batch k while this thread reads
        the rows of batch k+1 from Spark: the node's work and the task's overlap. Batches
        are still sent one at a time and in order."""
        cfg = self.cfg
        size = cfg.batch_size
        prefix = f"{cfg.dedup_prefix}:{self.partition}:"
        sender = _Sender(self.send_batch) if cfg.overlap else None
        send = sender.put if sender is not None else self.send_batch
        bodies: list[bytes | str] = []
        keys: list[str] | None = [] if cfg.dedup else None
        try:
            for index, (body, key) in enumerate(records):
                bodies.append(body)
                if keys is not None:
                    keys.append(key if key is not None else prefix + str(index))
                if len(bodies) >= size:
                    send(bodies, keys)
                    bodies = []
                    keys = [] if cfg.dedup else None
            if bodies:
                send(bodies, keys)
            if sender is not None:
                sender.finish()
        finally:
            if sender is not None:
                sender.abandon()
            self.close()
        return self.result


class _Sender:
    """One thread sending batches handed over through a 1-slot queue; its exception is
    raised again in the producing thread."""

    def __init__(self, send: Callable[[Sequence[bytes | str], Sequence[str] | None], None]
                 ) -> None:
        self.send = send
        self.slots: queue.Queue[Any] = queue.Queue(maxsize=1)
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._loop, name="disque-producer", daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while True:
            item = self.slots.get()
            if item is None:
                return
            if self.error is None:
                try:
                    self.send(*item)
                except BaseException as exc:  # noqa: BLE001 - handed to the producing thread
                    self.error = exc

    def put(self, bodies: Sequence[bytes | str], keys: Sequence[str] | None) -> None:
        if self.error is not None:
            raise self.error
        self.slots.put((bodies, keys))

    def finish(self) -> None:
        self.slots.put(None)
        self.thread.join()
        if self.error is not None:
            raise self.error

    def abandon(self) -> None:
        """After an exception in the producing thread: let the sender finish what it has."""
        if self.thread.is_alive():
            self.slots.put(None)
            self.thread.join()


def row_records(rows: Iterable[Any], body_col: str = "body", body_format: str = "raw",
                dedup_key_col: str | None = None,
                body_fn: Callable[[Any], Any] | None = None
                ) -> Iterator[tuple[bytes | str, str | None]]:
    """Spark `Row`s (or dicts) -> `(body, key)` pairs for `PartitionProducer.run`.

    `body_format="raw"`: the `body_col` value (str / bytes); `"json"`: the whole row as a
    JSON object. `body_fn(row)`, if given, computes the body instead."""
    if body_format not in ("raw", "json"):
        raise ValueError("body_format must be 'raw' or 'json'")
    if body_fn is None and body_format == "raw":
        yield from _raw_rows(iter(rows), body_col, dedup_key_col)
        return
    for row in rows:
        if body_fn is not None:
            body = to_body(body_fn(row))
        elif body_format == "json":
            record = row.asDict(recursive=True) if hasattr(row, "asDict") else dict(row)
            body = json_body(record)
        else:
            body = to_body(row[body_col])
        key = None
        if dedup_key_col is not None:
            value = row[dedup_key_col]
            if value is None:
                raise ValueError(f"dedup key column {dedup_key_col!r} is null")
            key = str(value)
        yield body, key


def _raw_rows(rows: Iterator[Any], body_col: str, key_col: str | None
              ) -> Iterator[tuple[bytes | str, str | None]]:
    """The common case on the hot path: one column as the body. Spark Rows are tuples with
    `__fields__`; their own `__getitem__` is Python code, so the column positions are looked
    up once and the values read with the C-level tuple indexing."""
    first = next(rows, None)
    if first is None:
        return
    fields = getattr(first, "__fields__", None)
    if not isinstance(first, tuple) or fields is None:  # dicts, plain tuples: by name
        for row in _chain(first, rows):
            body = to_body(row[body_col])
            key = None
            if key_col is not None:
                value = row[key_col]
                if value is None:
                    raise ValueError(f"dedup key column {key_col!r} is null")
                key = str(value)
            yield body, key
        return
    get = tuple.__getitem__
    b = list(fields).index(body_col)
    k = list(fields).index(key_col) if key_col is not None else -1
    for row in _chain(first, rows):
        body = get(row, b)
        cls = body.__class__
        if cls is not str and cls is not bytes:
            body = to_body(body)
        if k < 0:
            yield body, None
        else:
            value = get(row, k)
            if value is None:
                raise ValueError(f"dedup key column {key_col!r} is null")
            yield body, str(value)


def _chain(first: Any, rest: Iterator[Any]) -> Iterator[Any]:
    yield first
    yield from rest


def arrow_records(batches: Iterable[Any], body_col: str = "body", body_format: str = "raw",
                  dedup_key_col: str | None = None
                  ) -> Iterator[tuple[bytes | str, str | None]]:
    """PyArrow RecordBatches (the data source writer's input) -> `(body, key)` pairs."""
    if body_format not in ("raw", "json"):
        raise ValueError("body_format must be 'raw' or 'json'")
    for batch in batches:
        if body_format == "json":
            bodies: list[Any] = [json_body(r) for r in batch.to_pylist()]
        else:
            bodies = [to_body(v) for v in batch.column(body_col).to_pylist()]
        if dedup_key_col is not None:
            keys: list[Any] = batch.column(dedup_key_col).to_pylist()
            for body, key in zip(bodies, keys, strict=True):
                if key is None:
                    raise ValueError(f"dedup key column {dedup_key_col!r} is null")
                yield body, str(key)
        else:
            for body in bodies:
                yield body, None
