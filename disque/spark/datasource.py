"""The `disque` PySpark Python Data Source (pyspark.sql.datasource, Spark >= 4.0).

    disque.spark.register(spark)
    df.write.format("disque").option("nodes", "h1:7711,h2:7711").option("queue", "q") \\
        .mode("append").save()
    stream = spark.readStream.format("disque").option("nodes", "h1:7711") \\
        .option("queues", "q1,q2").load()

Batch writer
------------
An Arrow writer: each task gets its partition as Arrow record batches and produces them with
the same `PartitionProducer` as `write_jobs` (node p mod N, one ADDJOBS per batch, DEDUP
keys derived from a write id drawn on the driver, so a retried task does not add its rows
twice). A
partition that still has failed rows after the retries fails its task (`failOnError`,
default true), so Spark retries it and the DEDUP keys make that retry safe; the totals are
logged by `commit`. Options: `nodes`, `queue` (required); `bodyColumn` (default `body`, or
the only column), `bodyFormat` (`raw` | `json`), `replicate`, `retry`, `ttl`, `delay`,
`maxlen`, `async`, `timeoutMs`, `batchSize` (500), `dedup` (true), `dedupKeyColumn`,
`dedupPrefix`, `maxAttempts`, `connections` (per partition; default 1, or 8 for synchronous
replicated batches to a node without ADDJOBS, which gets pipelined ADDJOBs), `password`
(else the one of a `disque://:secret@...` nodes URL), `failOnError`; TLS: `tls` (true, or
a `disque+tls://` nodes URL), `tlsCaCertFile`, `tlsCertFile`, `tlsKeyFile` (both ways).

Streaming reader (at-least-once)
--------------------------------
The jobs of a micro-batch are fetched on the driver when Spark asks for the latest offset:
`GETJOB NOHANG COUNT n WITHCOUNTERS` on every node in turn (so no node's queue is left to
federation), up to `maxJobsPerBatch`. They are kept in memory under the batch's offset and
shipped to the tasks inside the input partitions, so a retried task reads the same jobs.
They are ACKed, on the node that delivered each one, only once Spark has committed the
batch's output: when Spark calls `commit(end)`, or earlier when it asks for the offset after
`end` (Spark plans a batch only after the previous one is committed, but calls `commit` for
it only when the next batch has data, which would leave the last batch before an idle
period unacknowledged). Jobs of a batch that fails, or is never committed because the query
or the driver stops, are not ACKed: they come back after their RETRY time (`stop()` NACKs
the ones it still holds so they come back at once, when Spark calls it; Spark 4.3 does not
always do so). So every job is delivered at least once. The RETRY timer of a job runs from
when it was queued, not from the fetch: a job whose RETRY expires before its batch is
committed is delivered twice, so give stream-consumed jobs a RETRY longer than a batch
takes. Offsets are `{"seq": n}`, increasing across restarts (a millisecond clock); a batch
Spark replays after a driver restart has no jobs (they come back by RETRY).
Options: `nodes`, `queues` (required); `maxJobsPerBatch` (10000), `fetchCount` (1000),
`numPartitions` (2), `bodyType` (`binary` | `string`), `ack` (`ack` | `fastack`),
`requeueOnStop` (true), `password`.

Schema of the stream: `queue STRING, id STRING, body BINARY (or STRING),
nacks BIGINT, additional_deliveries BIGINT`.

Options are checked when Spark plans the write or the read, before any task: an unknown
option (a typo would otherwise be ignored), a missing `nodes` / `queue` / `queues`, a bad
address, a number that is not an integer in its range (ADDJOB's, as every node checks
them: `producer.LIMITS`), a boolean that is not true/false, or a choice outside its values
raise ValueError, which Spark reports as an AnalysisException at `save()` / `load()` (or,
for what only the stream reader checks, a StreamingQueryException when the query starts).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceStreamReader,
    InputPartition,
    WriterCommitMessage,
)

from disque.client.errors import DisqueError
from disque.client.nodes import url_password, url_tls
from disque.client.replies import Job
from disque.client.sync import Client
from disque.spark.producer import (
    LIMITS,
    PartitionProducer,
    ProducerConfig,
    arrow_records,
    integer_range,
    normalize_nodes,
)

try:  # Spark >= 4.2: admission control
    from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows
except ImportError:  # pragma: no cover - older PySpark
    ReadAllAvailable = ReadMaxRows = None  # type: ignore[assignment,misc]

if TYPE_CHECKING:
    from pyspark.sql.streaming.datasource import ReadLimit
    from pyspark.sql.types import StructType

log = logging.getLogger("disque.spark.datasource")

NAME = "disque"


class DisqueWriteError(RuntimeError):
    """Rows of a partition could not be added after the retries."""


TLS_OPTIONS = ("tls", "tlsCaCertFile", "tlsCertFile", "tlsKeyFile")
WRITE_OPTIONS = ("nodes", "queue", "bodyColumn", "bodyFormat", "replicate", "retry", "ttl",
                 "delay", "maxlen", "async", "timeoutMs", "batchSize", "dedup",
                 "dedupKeyColumn", "dedupPrefix", "maxAttempts", "connections", "password",
                 "failOnError", *TLS_OPTIONS)
READ_OPTIONS = ("nodes", "queues", "maxJobsPerBatch", "fetchCount", "numPartitions",
                "bodyType", "ack", "requeueOnStop", "password", *TLS_OPTIONS)
# the writer's integer options -> the ProducerConfig setting (and its LIMITS)
WRITE_INTS = {"timeoutMs": "timeout_ms", "replicate": "replicate", "retry": "retry",
              "ttl": "ttl", "delay": "delay", "maxlen": "maxlen", "batchSize": "batch_size",
              "maxAttempts": "max_attempts", "connections": "connections"}
TRUE = ("true", "yes", "on", "1")
FALSE = ("false", "no", "off", "0")


def _known(options: Mapping[str, str], names: Sequence[str], what: str) -> None:
    """Spark hands over any option given (lower-cased): refuse what this side does not
    take, rather than ignore a typo."""
    allowed = {n.lower() for n in names}
    for key in options:
        if str(key).lower() not in allowed:
            raise ValueError(f"unknown option {key!r} for the disque data source{what}; "
                             f"its options: {', '.join(names)}")


def _bool(options: Mapping[str, str], key: str, default: bool) -> bool:
    value = options.get(key)
    if value is None:
        return default
    low = str(value).strip().lower()
    if low in TRUE or low in FALSE:
        return low in TRUE
    raise ValueError(f"option {key!r} must be true or false, not {value!r}")


def _int(options: Mapping[str, str], key: str, least: int, most: int | None = None,
         default: int | None = None) -> int | None:
    value = options.get(key)
    if value is None or str(value).strip() == "":
        return default
    try:
        n = int(str(value).strip())
    except ValueError:
        n = None
    if n is None or n < least or (most is not None and n > most):
        raise ValueError(f"option {key!r} must be {integer_range(least, most)}, "
                         f"not {value!r}")
    return n


def _write_int(options: Mapping[str, str], key: str, default: int | None = None) -> int | None:
    return _int(options, key, *LIMITS[WRITE_INTS[key]], default=default)


def _choice(options: Mapping[str, str], key: str, *choices: str) -> str:
    """One of `choices` (the first is the default), case-insensitive."""
    value = options.get(key)
    if value is None:
        return choices[0]
    low = str(value).strip().lower()
    if low not in choices:
        raise ValueError(f"option {key!r} must be {' or '.join(choices)}, not {value!r}")
    return low


def _required(options: Mapping[str, str], key: str) -> str:
    value = options.get(key)
    if not value:
        raise ValueError(f"the disque data source needs .option({key!r}, ...)")
    return str(value)


def _nodes(options: Mapping[str, str]) -> list[str]:
    spec = _required(options, "nodes")
    try:
        return normalize_nodes(spec)
    except ValueError as exc:
        raise ValueError(f"option 'nodes': {exc}") from None


def _client_options(options: Mapping[str, str]) -> dict[str, Any]:
    """The password option, else the one of a `disque://:secret@...` nodes URL; TLS when
    `tls` is true, the nodes URL is `disque+tls://` or a `tls*File` option is given (with
    redis-py's ssl_* keywords for the files)."""
    out: dict[str, Any] = {}
    nodes = str(options.get("nodes") or "")
    password = options.get("password") or url_password(nodes)
    if password:
        out["password"] = password
    if str(options.get("tls", "")).lower() in TRUE or url_tls(nodes):
        out["ssl"] = True
    for option, keyword in (("tlsCaCertFile", "ssl_ca_certs"), ("tlsCertFile", "ssl_certfile"),
                            ("tlsKeyFile", "ssl_keyfile")):
        if options.get(option):
            out[keyword] = str(options[option])
    return out


class ReadSettings:
    """The stream reader's options but `queues`: what `load()` checks already (Spark calls
    `schema()` then) and the reader uses."""

    def __init__(self, options: Mapping[str, str]) -> None:
        self.nodes = _nodes(options)
        self.max_jobs = _int(options, "maxJobsPerBatch", 1, default=10000) or 10000
        self.fetch_count = _int(options, "fetchCount", 1, default=1000) or 1000
        self.num_partitions = _int(options, "numPartitions", 1, default=2) or 2
        self.body_string = _choice(options, "bodyType", "binary", "string") == "string"
        self.fast_ack = _choice(options, "ack", "ack", "fastack") == "fastack"
        self.requeue_on_stop = _bool(options, "requeueOnStop", True)
        self.client_options = _client_options(options)


class DisqueDataSource(DataSource):
    """`format("disque")`: batch writes and streaming reads of Disque jobs."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> str:
        # Spark asks for it at load() (not for writes): the reader's checks that need no
        # `queues` fail the read there, before the query starts; `queue` and the writer's
        # other options are left to the stream reader, which refuses them
        _known(self.options, tuple(dict.fromkeys(READ_OPTIONS + WRITE_OPTIONS)), "")
        body = "string" if ReadSettings(self.options).body_string else "binary"
        return (f"queue string, id string, body {body}, nacks bigint, "
                "additional_deliveries bigint")

    def writer(self, schema: StructType, overwrite: bool) -> DisqueWriter:
        if overwrite:
            raise ValueError("the disque data source only appends: use .mode('append')")
        return DisqueWriter(self.options, schema)

    def streamReader(self, schema: StructType) -> DisqueStreamReader:
        return DisqueStreamReader(self.options, schema)


# ------------------------------------------------------------------------------ batch writer
@dataclass
class DisqueCommitMessage(WriterCommitMessage):
    partition: int
    added: int
    failed: int


class DisqueWriter(DataSourceArrowWriter):
    """Built on the driver (where the write id is drawn), pickled to the tasks."""

    def __init__(self, options: Mapping[str, str], schema: StructType) -> None:
        _known(options, WRITE_OPTIONS, " writer")
        nodes = _nodes(options)
        queue = _required(options, "queue")
        names = [f.name for f in schema.fields]
        body_col = options.get("bodyColumn") or ("body" if "body" in names or len(names) != 1
                                                  else names[0])
        self.body_format = _choice(options, "bodyFormat", "raw", "json")
        if self.body_format == "raw" and body_col not in names:
            raise ValueError(f"no column {body_col!r} to use as the job body (columns: {names});"
                             " set .option('bodyColumn', ...) or bodyFormat=json")
        self.body_col = body_col
        dedup = _bool(options, "dedup", True)
        self.dedup_key_col = options.get("dedupKeyColumn") if dedup else None
        if self.dedup_key_col is not None and self.dedup_key_col not in names:
            raise ValueError(f"no column {self.dedup_key_col!r} for dedupKeyColumn")
        self.fail_on_error = _bool(options, "failOnError", True)
        self.cfg = ProducerConfig(
            nodes=nodes, queue=queue,
            timeout_ms=_write_int(options, "timeoutMs", 5000) or 0,
            replicate=_write_int(options, "replicate"), retry=_write_int(options, "retry"),
            ttl=_write_int(options, "ttl"), delay=_write_int(options, "delay"),
            maxlen=_write_int(options, "maxlen"), async_=_bool(options, "async", False),
            batch_size=_write_int(options, "batchSize", 500) or 500, dedup=dedup,
            dedup_prefix=(options.get("dedupPrefix") or uuid.uuid4().hex[:16]) if dedup else "",
            max_attempts=_write_int(options, "maxAttempts", 8) or 8,
            connections=_write_int(options, "connections"),
            client_options=_client_options(options))

    def write(self, iterator: Iterator[Any]) -> DisqueCommitMessage:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        partition = ctx.partitionId() if ctx is not None else 0
        producer = PartitionProducer(self.cfg, partition)
        result = producer.run(arrow_records(iterator, self.body_col, self.body_format,
                                            self.dedup_key_col))
        if result.failed and self.fail_on_error:
            raise DisqueWriteError(f"partition {partition}: {result.failed} row(s) not added "
                                   f"({result.added} added): {result.errors[:3]}")
        return DisqueCommitMessage(partition, result.added, result.failed)

    def commit(self, messages: list[Any]) -> None:
        added = sum(m.added for m in messages if m is not None)
        failed = sum(m.failed for m in messages if m is not None)
        log.info("disque.write.commit queue=%s added=%s failed=%s", self.cfg.queue, added,
                 failed)

    def abort(self, messages: list[Any]) -> None:
        added = sum(m.added for m in messages if m is not None)
        log.warning("disque.write.abort queue=%s added_before_abort=%s (jobs already added "
                    "stay queued)", self.cfg.queue, added)


# ------------------------------------------------------------------------------ stream reader
class JobsPartition(InputPartition):
    """A slice of one micro-batch's jobs, carried to the task that outputs them."""

    def __init__(self, rows: list[tuple[Any, ...]]) -> None:
        super().__init__(len(rows))
        self.rows = rows


class DisqueStreamReader(DataSourceStreamReader):
    """See the module docstring. State (the fetched, not yet committed jobs) lives in the
    driver's Python process that Spark keeps for the query."""

    def __init__(self, options: Mapping[str, str], schema: StructType) -> None:
        _known(options, READ_OPTIONS, " stream reader")
        settings = ReadSettings(options)
        self.nodes = settings.nodes
        self.queues = [q.strip() for q in _required(options, "queues").split(",") if q.strip()]
        if not self.queues:
            raise ValueError(f"option 'queues' names no queue: {options.get('queues')!r}")
        self.max_jobs = settings.max_jobs
        self.fetch_count = settings.fetch_count
        self.num_partitions = settings.num_partitions
        self.body_string = settings.body_string
        self.fast_ack = settings.fast_ack
        self.requeue_on_stop = settings.requeue_on_stop
        self.client_options = settings.client_options
        self._clients: dict[str, Client] = {}
        # seq -> [(node address, job)], fetched and not committed yet
        self._pending: dict[int, list[tuple[str, Job]]] = {}
        self._seq = 0

    # the reader object is also pickled to the tasks (for read()): no clients, no jobs
    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_clients"] = {}
        state["_pending"] = {}
        return state

    def _client(self, addr: str) -> Client:
        client = self._clients.get(addr)
        if client is None:
            client = Client([addr], discover=False, retries=1, **self.client_options)
            self._clients[addr] = client
        return client

    def _next_seq(self, start: int) -> int:
        self._seq = max(self._seq + 1, start + 1, int(time.time() * 1000))
        return self._seq

    def initialOffset(self) -> dict[str, int]:
        return {"seq": 0}

    def getDefaultReadLimit(self) -> ReadLimit:
        if ReadMaxRows is None:  # pragma: no cover
            return super().getDefaultReadLimit()
        return ReadMaxRows(self.max_jobs)

    def _fetch(self, limit: int | None) -> list[tuple[str, Job]]:
        """GETJOB NOHANG on every node, round after round, until `limit` jobs or all empty."""
        got: list[tuple[str, Job]] = []
        active = list(self.nodes)
        while active and (limit is None or len(got) < limit):
            still = []
            for addr in active:
                want = self.fetch_count if limit is None else min(self.fetch_count,
                                                                    limit - len(got))
                if want <= 0:
                    break
                try:
                    jobs = self._client(addr).get_job(*self.queues, nohang=True, count=want,
                                                      with_counters=True)
                except DisqueError as exc:
                    log.warning("disque.stream.fetch node=%s error=%s", addr, exc)
                    continue
                got.extend((addr, job) for job in jobs)
                if len(jobs) == want:
                    still.append(addr)  # may have more
            active = still
        return got

    def latestOffset(self, start: dict[str, Any] | None = None, limit: Any = None
                     ) -> dict[str, int]:
        begin = int((start or {}).get("seq", self._seq))
        if start is not None:
            # Spark plans batch N+1 only once batch N's output is committed (its commit-log
            # entry is written), but calls commit(N) only when batch N+1 has data: ACK now,
            # or the last batch before an idle period would wait, and come back by RETRY.
            self._ack_upto(begin)
        if ReadAllAvailable is not None and isinstance(limit, ReadAllAvailable):
            cap: int | None = None
        elif ReadMaxRows is not None and isinstance(limit, ReadMaxRows):
            cap = limit.max_rows
        else:
            cap = self.max_jobs
        jobs = self._fetch(cap)
        if not jobs:
            return {"seq": begin}
        seq = self._next_seq(begin)
        self._pending[seq] = jobs
        return {"seq": seq}

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[JobsPartition]:
        jobs = [job for seq, batch in sorted(self._pending.items())
                if int(start.get("seq", 0)) < seq <= int(end["seq"]) for _, job in batch]
        if not jobs:
            return []
        rows = [(j.queue, j.id, j.body.decode("utf-8", "replace") if self.body_string
                 else j.body, j.nacks or 0, j.additional_deliveries or 0) for j in jobs]
        n = min(self.num_partitions, len(rows))
        size = -(-len(rows) // n)
        return [JobsPartition(rows[i:i + size]) for i in range(0, len(rows), size)]

    def read(self, partition: JobsPartition) -> Iterator[tuple[Any, ...]]:  # type: ignore[override]
        yield from partition.rows

    def commit(self, end: dict[str, Any]) -> None:
        """The batches up to `end` are committed: ACK their jobs (if not done yet)."""
        self._ack_upto(int(end["seq"]))

    def _ack_upto(self, upto: int) -> None:
        done = [seq for seq in self._pending if seq <= upto]
        by_node: dict[str, list[str]] = {}
        for seq in done:
            for addr, job in self._pending.pop(seq):
                by_node.setdefault(addr, []).append(job.id)
        for addr, ids in by_node.items():
            self._finish(addr, ids, "fastack" if self.fast_ack else "ack")

    def _finish(self, addr: str, ids: list[str], how: str) -> None:
        for i in range(0, len(ids), 1000):
            chunk = ids[i:i + 1000]
            try:
                client = self._client(addr)
                if how == "nack":
                    client.nack(*chunk)
                elif how == "fastack":
                    client.fast_ack(*chunk)
                else:
                    client.ack_job(*chunk)
            except DisqueError as exc:
                if how == "nack":  # they come back by RETRY anyway
                    log.warning("disque.stream.nack node=%s error=%s", addr, exc)
                    continue
                # the delivering node is gone: any node spreads the ACK in the cluster
                self._ack_elsewhere(addr, chunk, exc)

    def _ack_elsewhere(self, failed: str, ids: list[str], exc: Exception) -> None:
        for addr in self.nodes:
            if addr == failed:
                continue
            try:
                self._client(addr).ack_job(*ids)
                return
            except DisqueError:
                continue
        log.warning("disque.stream.ack_lost node=%s jobs=%s error=%s (they will be "
                    "delivered again)", failed, len(ids), exc)

    def stop(self) -> None:
        if self.requeue_on_stop and self._pending:
            by_node: dict[str, list[str]] = {}
            for batch in self._pending.values():
                for addr, job in batch:
                    by_node.setdefault(addr, []).append(job.id)
            for addr, ids in by_node.items():
                self._finish(addr, ids, "nack")
        self._pending.clear()
        for client in self._clients.values():
            client.close()
        self._clients.clear()
