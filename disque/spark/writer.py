"""`write_jobs`: a DataFrame's rows become jobs, produced from `foreachPartition` (or
`mapInArrow`) on the executors (one client per partition, partition p on node p mod N, one
ADDJOBS per batch, DEDUP keys for idempotent task retries; see `producer` for the guarantee
and its limits).
Added and failed rows are counted with Spark accumulators: Spark applies the accumulator
updates of successful task attempts only, so a retried partition is not counted twice.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from disque.client.nodes import url_password, url_tls
from disque.spark.producer import (
    PartitionProducer,
    ProducerConfig,
    arrow_records,
    normalize_nodes,
    row_records,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, Row

log = logging.getLogger("disque.spark.writer")


@dataclass(frozen=True, slots=True)
class WriteResult:
    """Rows added as jobs (including rows a retried task found already added) and rows that
    could not be added after the retries."""

    added: int
    failed: int


def _task_partition() -> int:
    from pyspark import TaskContext

    ctx = TaskContext.get()
    return ctx.partitionId() if ctx is not None else 0


def write_jobs(df: DataFrame, queue: str, nodes: str | Iterable[str], body_col: str = "body",
               replicate: int | None = None, retry: int | None = None,
               ttl: int | None = None, batch_size: int = 500, body_format: str = "raw",
               dedup: bool = True, dedup_key_col: str | None = None, *,
               delay: int | None = None, maxlen: int | None = None,
               timeout_ms: int = 5000, async_: bool = False,
               body_fn: Callable[[Any], Any] | None = None,
               dedup_prefix: str | None = None, max_attempts: int = 8, overlap: bool = True,
               connections: int | None = None, method: str = "foreachPartition",
               password: str | None = None, protocol: int | None = None,
               client_options: dict[str, Any] | None = None) -> WriteResult:
    """Add one job per row of `df` to `queue`, from the executors.

    - `nodes`: `"h:p,h:p"`, `"disque://h:p,..."` or a list; partition p goes to
      `nodes[p % len(nodes)]` (the next node only if that one is down). The password of a
      `disque://:secret@...` URL is used unless `password` is given. A `disque+tls://`
      URL connects with TLS; `client_options={"ssl_ca_certs": "ca.crt", ...}` gives the
      client's TLS files (redis-py's ssl_* keywords; `"ssl": True` without a URL).
    - `body_col` / `body_format`: `"raw"` uses that column (string or binary), `"json"` the
      whole row as a JSON object; `body_fn(row)` computes the body instead.
    - `replicate`, `retry`, `ttl`, `delay`, `maxlen`, `async_`, `timeout_ms`: ADDJOB's
      options (None: the node's defaults).
    - `dedup` (default on): every row carries a DEDUP key, `<write id>:<partition>:<row>`,
      or the value of `dedup_key_col`; a retried task does not add the rows again. The write
      id is random per call unless `dedup_prefix` is given.
    - `batch_size` rows per round trip: one ADDJOBS, which the node replicates as a whole
      (pipelined ADDJOBs on a node without ADDJOBS, such as antirez's Disque); transient
      errors retried `max_attempts` times; with `overlap` a batch is sent while the next one
      is read from Spark.
    - `connections`: per partition. Default: 1 where the node has ADDJOBS; on a node
      without it a synchronous replicated ADDJOB holds its connection until its copies are
      confirmed, so such batches are split over 8 (1 for `replicate=1` or `async_`). A
      value given is used for every batch.

    - `method`: `"foreachPartition"` (default) hands each task its rows as Python Row
      objects; `"arrow"` runs the same producer over `mapInArrow`, which gets the rows as
      Arrow batches and skips the per-row Row objects (faster; pyarrow on the workers;
      not with `body_fn`). Same nodes, keys, retries and counts either way.

    Returns `WriteResult(added, failed)`; it does not raise for failed rows. Arguments are
    checked before any Spark job runs: a missing queue, bad `nodes`, an option every node
    would refuse (`replicate` outside 1..65535, a negative `retry`, `delay` or
    `timeout_ms`, `ttl` or `maxlen` below 1, `delay` >= `ttl`), `batch_size`,
    `max_attempts` or `connections` below 1, or a name that is not a column raise
    ValueError."""
    if not isinstance(queue, (str, bytes)) or not queue:
        raise ValueError(f"write_jobs needs a queue name, not {queue!r}")
    try:
        node_list = normalize_nodes(nodes)
    except ValueError as exc:
        raise ValueError(f"nodes: {exc}") from None
    if protocol not in (None, 2, 3):
        raise ValueError(f"protocol must be 2 or 3, not {protocol!r}")
    password = password or url_password(nodes)  # normalize_nodes drops the URL's
    if url_tls(nodes):  # (and its scheme: disque+tls:// means TLS)
        client_options = dict(client_options or {}, ssl=True)
    cfg = ProducerConfig(
        nodes=node_list, queue=queue, timeout_ms=timeout_ms, replicate=replicate,
        retry=retry, ttl=ttl, delay=delay, maxlen=maxlen, async_=async_,
        batch_size=batch_size, dedup=dedup,
        dedup_prefix=(dedup_prefix or uuid.uuid4().hex[:16]) if dedup else "",
        max_attempts=max_attempts, overlap=overlap, connections=connections,
        client_options={k: v for k, v in dict(client_options or {}, password=password,
                                                 protocol=protocol).items() if v is not None})
    if body_format not in ("raw", "json"):
        raise ValueError("body_format must be 'raw' or 'json'")
    if body_fn is None and body_format == "raw" and body_col not in df.columns:
        raise ValueError(f"no column {body_col!r} in the DataFrame (columns: {df.columns})")
    if dedup_key_col is not None and dedup_key_col not in df.columns:
        raise ValueError(f"no column {dedup_key_col!r} for the dedup key")
    if method not in ("foreachPartition", "arrow"):
        raise ValueError("method must be 'foreachPartition' or 'arrow'")
    if method == "arrow" and body_fn is not None:
        raise ValueError("body_fn needs Row objects: use method='foreachPartition'")
    key_col = dedup_key_col if dedup else None
    if body_fn is None and body_format == "raw":  # ship only the columns that are used
        df = df.select(body_col, *([key_col] if key_col and key_col != body_col else []))
    sc = df.sparkSession.sparkContext
    added = sc.accumulator(0)
    failed = sc.accumulator(0)

    if method == "arrow":
        def produce_arrow(batches: Iterator[Any]) -> Iterator[Any]:
            import pyarrow as pa

            partition = _task_partition()
            result = PartitionProducer(cfg, partition).run(
                arrow_records(batches, body_col, body_format, key_col))
            added.add(result.added)
            failed.add(result.failed)
            if result.errors:
                log.warning("write_jobs.partition partition=%s added=%s failed=%s errors=%s",
                            partition, result.added, result.failed, result.errors[:3])
            yield pa.RecordBatch.from_pydict({"added": [result.added],
                                              "failed": [result.failed]})

        df.mapInArrow(produce_arrow, "added long, failed long").collect()
        return WriteResult(added.value, failed.value)

    def produce(rows: Iterator[Row]) -> None:
        partition = _task_partition()
        producer = PartitionProducer(cfg, partition)
        result = producer.run(row_records(rows, body_col, body_format, key_col, body_fn))
        added.add(result.added)
        failed.add(result.failed)
        if result.errors:
            log.warning("write_jobs.partition partition=%s added=%s failed=%s errors=%s",
                        partition, result.added, result.failed, result.errors[:3])

    df.foreachPartition(produce)
    return WriteResult(added.value, failed.value)
