"""disque.spark on a real local Spark session against a real 3-node cluster: `write_jobs`
and the `disque` data source put every row in the queues exactly once, a task that fails
half-way through its partition and is retried adds no duplicate with DEDUP on (and does
without it), and the streaming reader delivers every job and ACKs only the committed
micro-batches."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from disque.client import Client
from disque.spark import WriteResult, register, write_jobs
from tests.cluster.conftest import Cluster
from tests.harness import wait_for

# (a Spark job on a loaded 2-core machine can outlast the suite's 120 s; a timeout in the
# middle of a py4j call breaks the shared session for every Spark test after it)
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

N = 100_000


def addrs(cluster: Cluster) -> list[str]:
    return [f"127.0.0.1:{p.port}" for p in cluster]


@pytest.fixture(scope="module")
def clients(disque_cluster: Cluster) -> Iterator[list[Client]]:
    """One client pinned to each node (QLEN, SHOW and GETJOB are per node)."""
    cs = [Client([a], discover=False) for a in addrs(disque_cluster)]
    try:
        yield cs
    finally:
        for c in cs:
            c.close()


def qlen_sum(clients: list[Client], queue: str) -> int:
    return sum(c.qlen(queue) for c in clients)


def drain(clients: list[Client], queue: str) -> list[bytes]:
    """Take every queued job of `queue` from every node (and delete it); the bodies.

    A GETJOB that finds a node's queue empty asks the others for jobs (NEEDJOBS, as the
    original), so jobs move towards the node drained last while we go: passes repeat until
    three in a row find nothing and nothing is queued anywhere."""
    bodies: list[bytes] = []
    quiet = 0
    deadline = time.monotonic() + 120
    while quiet < 3:
        assert time.monotonic() < deadline, f"draining {queue} did not settle"
        got = False
        for c in clients:
            while jobs := c.get_job(queue, nohang=True, count=2000):
                bodies.extend(j.body for j in jobs)
                c.fast_ack(*[j.id for j in jobs])
                got = True
        quiet = 0 if got or qlen_sum(clients, queue) else quiet + 1
        time.sleep(0.05)  # poll interval: jobs NEEDJOBS moved are landing
    return bodies


def rows_df(spark: Any, n: int, partitions: int = 6, prefix: str = "row") -> Any:
    return spark.range(0, n, 1, partitions).selectExpr(
        f"concat('{prefix}-', cast(id as string)) as body", "id")


def expected(n: int, prefix: str = "row") -> Counter[bytes]:
    return Counter(f"{prefix}-{i}".encode() for i in range(n))


def test_write_jobs_puts_every_row_in_the_queues_exactly_once(spark, disque_cluster, clients):
    result = write_jobs(rows_df(spark, N), "wj", addrs(disque_cluster), replicate=1,
                        batch_size=500)
    assert result == WriteResult(added=N, failed=0)
    # six partitions over three nodes: partitions k and k + 3 went to node k
    assert all(abs(c.qlen("wj") - N / 3) <= 2 for c in clients)
    assert qlen_sum(clients, "wj") == N
    assert Counter(drain(clients, "wj")) == expected(N)


def test_write_jobs_arrow_method_puts_every_row_in_the_queues_exactly_once(
        spark, disque_cluster, clients):
    n = 30_000
    result = write_jobs(rows_df(spark, n, prefix="ar"), "wja", ",".join(addrs(disque_cluster)),
                        replicate=1, method="arrow")
    assert result == WriteResult(added=n, failed=0)
    assert qlen_sum(clients, "wja") == n
    assert Counter(drain(clients, "wja")) == expected(n, "ar")


def test_data_source_batch_write_puts_every_row_in_the_queues_exactly_once(
        spark, disque_cluster, clients):
    register(spark)
    (rows_df(spark, N).select("body").write.format("disque")
     .option("nodes", ",".join(addrs(disque_cluster))).option("queue", "ds")
     .option("replicate", "2").mode("append").save())
    assert qlen_sum(clients, "ds") == N
    [probe] = clients[0].qpeek("ds", 1) or clients[1].qpeek("ds", 1) or clients[2].qpeek("ds", 1)
    shown = next(c for c in clients if c.show(probe.id)).show(probe.id)
    # the writer's REPLICATE 2 reached the node (3 would be the default on 3 nodes); the
    # copies listed can be 3 all the same: a sync ADDJOB whose GOTJOB is slower than the
    # 50 ms retry tick takes one more node, as the original does (a CI run with Spark's
    # JVM on the 2 CPUs listed 3)
    assert shown["repl"] == 2  # type: ignore[index]
    assert len(shown["nodes-delivered"]) >= 2  # type: ignore[index]
    assert Counter(drain(clients, "ds")) == expected(N)


def test_data_source_json_bodies_and_user_dedup_keys(spark, disque_cluster, clients):
    register(spark)
    df = spark.createDataFrame([(i, f"name{i}", i % 7) for i in range(50)] * 2,
                               "id long, name string, shard int")
    (df.write.format("disque").option("nodes", ",".join(addrs(disque_cluster)))
     .option("queue", "dsj").option("bodyFormat", "json").option("dedupKeyColumn", "id")
     .option("replicate", "1").mode("append").save())
    # every row is there twice, but a key is added once per node: at most 3 copies of a key,
    # and a single partition (one node) never added a key twice
    bodies = [json.loads(b) for b in drain(clients, "dsj")]
    assert {b["id"] for b in bodies} == set(range(50))
    assert all(set(b) == {"id", "name", "shard"} and b["name"] == f"name{b['id']}"
               for b in bodies)
    assert len(bodies) <= 100


def _failing_body(marker: str, fail_at: int) -> Any:
    """A body function that raises once, in the first attempt of partition 0, after
    `fail_at` rows: the task dies mid-partition with earlier batches already sent."""
    counter = {"n": 0}

    def body(row: Any) -> str:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        if ctx is not None and ctx.partitionId() == 0 and ctx.attemptNumber() == 0:
            counter["n"] += 1
            if counter["n"] > fail_at:
                Path(marker).write_text("failed once")
                raise RuntimeError("injected failure in the first attempt")
        return row["body"]

    return body


def test_a_task_retried_mid_partition_adds_no_duplicate_with_dedup(
        spark, disque_cluster, clients, tmp_path):
    n = 30_000  # 5,000 rows per partition; partition 0 dies after 3,000 (6 batches sent)
    marker = tmp_path / "failed"
    result = write_jobs(rows_df(spark, n, prefix="rt"), "retry-dedup", addrs(disque_cluster),
                        replicate=1, batch_size=500, body_fn=_failing_body(str(marker), 3000))
    assert marker.exists(), "the failure was not injected"
    assert result == WriteResult(added=n, failed=0)
    assert qlen_sum(clients, "retry-dedup") == n
    assert Counter(drain(clients, "retry-dedup")) == expected(n, "rt")


def test_without_dedup_the_same_failure_duplicates_rows(spark, disque_cluster, clients,
                                                        tmp_path):
    n = 30_000
    marker = tmp_path / "failed"
    result = write_jobs(rows_df(spark, n, prefix="nd"), "retry-nodedup", addrs(disque_cluster),
                        replicate=1, batch_size=500, dedup=False,
                        body_fn=_failing_body(str(marker), 3000))
    assert marker.exists()
    assert result.added == n  # the accumulators count the successful attempt only...
    bodies = Counter(drain(clients, "retry-nodedup"))
    assert set(bodies) == set(expected(n, "nd"))
    assert sum(bodies.values()) == n + 3000  # ...but the failed attempt's rows stayed


# ---------------------------------------------------------------------------- streaming
def _add_everywhere(clients: list[Client], queue: str, n: int, retry: int
                    ) -> dict[str, bytes]:
    """n jobs spread over the nodes; id -> body."""
    out: dict[str, bytes] = {}
    for k, c in enumerate(clients):
        bodies = [f"s{k}-{i}".encode() for i in range(k, n, len(clients))]
        res = c.add_jobs(queue, bodies, replicate=1, retry=retry)
        assert res.ok
        out.update(zip(res.ids, bodies, strict=True))  # type: ignore[arg-type]
    return out


def _gone(clients: list[Client], job_id: str) -> bool:
    """Acknowledged: no node holds it any more except as an `acked` record."""
    for c in clients:
        show = c.show(job_id)
        if show is not None and show["state"] != "acked":
            return False
    return True


def test_streaming_reader_delivers_every_job_and_acks_only_committed_batches(
        spark, disque_cluster, clients, tmp_path):
    register(spark)
    queue = "stream"
    # RETRY: long enough for the committed batches to be ACKed before it fires (and for a
    # batch of the second run to be processed and committed before its jobs' RETRY: a job
    # is delivered once only if so; with 15 s, a CI run on a busy machine saw one twice),
    # short enough to wait for the failed batch's jobs to come back by it
    jobs = _add_everywhere(clients, queue, 3000, retry=30)
    checkpoint = str(tmp_path / "checkpoint")
    seen: dict[int, list[tuple[str, bytes]]] = {}
    lock = threading.Lock()

    def reader() -> Any:
        return (spark.readStream.format("disque")
                .option("nodes", ",".join(addrs(disque_cluster))).option("queues", queue)
                .option("maxJobsPerBatch", "1000").option("fetchCount", "400").load())

    def sink(fail_batch: int | None) -> Any:
        def on_batch(df: Any, batch_id: int) -> None:
            rows = [(r["id"], bytes(r["body"])) for r in df.collect()]
            with lock:
                seen.setdefault(batch_id, []).extend(rows)
            if batch_id == fail_batch:
                raise RuntimeError("the sink fails this batch")
        return on_batch

    # run 1: batches 0 and 1 are committed, the sink fails batch 2
    q1 = reader().writeStream.foreachBatch(sink(fail_batch=2)) \
        .option("checkpointLocation", checkpoint).start()
    with pytest.raises(Exception, match="the sink fails this batch"):
        q1.awaitTermination(timeout=120)
    committed = [jid for b in (0, 1) for jid, _ in seen[b]]
    failed = [jid for jid, _ in seen[2]]
    # a batch can come up a few jobs short: jobs that the reader's GETJOB on an empty node
    # pulled over (NEEDJOBS) are in flight between nodes; they come in a later batch
    assert len(committed) == 2000 and 900 <= len(failed) <= 1000
    assert set(committed).isdisjoint(failed)
    wait_for(lambda: all(_gone(clients, jid) for jid in committed), timeout=30,
             what="the committed batches' jobs to be acked")
    for jid in failed:  # never acked: still held, waiting for their RETRY
        assert any(s is not None and s["state"] in ("queued", "active")
                   for s in (c.show(jid) for c in clients)), jid
    run1 = {b: list(v) for b, v in seen.items()}

    # run 2, same checkpoint: the failed batch's jobs come back by RETRY and are delivered
    q2 = reader().writeStream.foreachBatch(sink(fail_batch=None)) \
        .option("checkpointLocation", checkpoint).start()

    def again() -> Counter[str]:
        """Deliveries of the second run (it replays batch 2 first: that one has no jobs, the
        reader that had fetched them is gone)."""
        with lock:
            return Counter(jid for b, rows in seen.items() if b > 2 for jid, _ in rows)

    # the failed batch's jobs, and any that were in flight between nodes during run 1
    uncommitted = set(jobs) - set(committed)
    try:
        wait_for(lambda: set(again()) >= uncommitted, timeout=120,
                 what="the failed batch's jobs to come back by RETRY")
        q2.processAllAvailable()
    finally:
        q2.stop()
    assert q2.exception() is None
    assert seen[2] == run1[2]  # the replayed batch 2 added nothing
    bodies = {jid: body for rows in seen.values() for jid, body in rows}
    assert bodies == jobs
    assert set(again()) == uncommitted  # only the uncommitted jobs came back...
    assert max(again().values()) == 1  # ...once
    wait_for(lambda: all(_gone(clients, jid) for jid in jobs), timeout=30,
             what="every job acked")
    assert qlen_sum(clients, queue) == 0


# ---------------------------------------------------------------------------- bad options
# An option that every node would refuse, or that names nothing, fails the write or the
# stream at once with a ValueError naming it: on the driver for write_jobs (before any Spark
# job), in Spark's planning of the data source for the data source (AnalysisException at
# save() / load(), StreamingQueryException at start() for what is checked then). Never
# rows counted as failed one by one on the executors, a task failing four times, or a value
# silently replaced by a default.
WRITE_JOBS_BAD = [  # (queue, nodes: None = the cluster's, keywords, the message)
    (None, None, {}, "write_jobs needs a queue name"),
    ("", None, {}, "write_jobs needs a queue name"),
    ("q", "", {}, "nodes: no node address given"),
    ("q", "127.0.0.1:notaport", {}, "nodes: bad port in node address '127.0.0.1:notaport'"),
    ("q", "127.0.0.1:70000", {}, "nodes: port out of range in node address"),
    ("q", "http://127.0.0.1:7711", {}, "nodes: unsupported URL scheme 'http'"),
    ("q", None, {"replicate": 0}, "replicate must be an integer from 1 to 65535, not 0"),
    ("q", None, {"replicate": "2"}, "replicate must be an integer from 1 to 65535, not '2'"),
    ("q", None, {"retry": -1}, "retry must be an integer >= 0, not -1"),
    ("q", None, {"ttl": 0}, "ttl must be an integer >= 1, not 0"),
    ("q", None, {"delay": -1}, "delay must be an integer >= 0, not -1"),
    ("q", None, {"maxlen": 0}, "maxlen must be an integer >= 1, not 0"),
    ("q", None, {"timeout_ms": -1}, "timeout_ms must be an integer >= 0, not -1"),
    ("q", None, {"timeout_ms": 1.5}, "timeout_ms must be an integer >= 0, not 1.5"),
    ("q", None, {"batch_size": 0}, "batch_size must be an integer >= 1, not 0"),
    ("q", None, {"max_attempts": 0}, "max_attempts must be an integer >= 1, not 0"),
    ("q", None, {"connections": 0}, "connections must be an integer >= 1, not 0"),
    ("q", None, {"protocol": 4}, "protocol must be 2 or 3, not 4"),
    ("q", None, {"body_format": "xml"}, "body_format must be 'raw' or 'json'"),
    ("q", None, {"body_col": "nope"}, "no column 'nope' in the DataFrame"),
    ("q", None, {"dedup_key_col": "nope"}, "no column 'nope' for the dedup key"),
    ("q", None, {"method": "pandas"}, "method must be 'foreachPartition' or 'arrow'"),
    ("q", None, {"method": "arrow", "body_fn": str}, "body_fn needs Row objects"),
]


@pytest.mark.parametrize(("queue", "nodes", "kw", "message"), WRITE_JOBS_BAD,
                         ids=[m.split(" ")[0] + f"-{i}" for i, (_, _, _, m)
                              in enumerate(WRITE_JOBS_BAD)])
def test_write_jobs_refuses_bad_arguments_before_any_spark_job(
        spark, disque_cluster, clients, queue, nodes, kw, message):
    sc = spark.sparkContext
    group = f"bad-write-jobs-{uuid.uuid4().hex}"
    queue = group if queue == "q" else queue  # (a queue of its own)
    sc.setJobGroup(group, "write_jobs with a bad argument")
    try:
        with pytest.raises(ValueError) as info:
            write_jobs(rows_df(spark, 10, partitions=2), queue,
                       addrs(disque_cluster) if nodes is None else nodes, **kw)
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)
    assert message in str(info.value), str(info.value)
    assert sc.statusTracker().getJobIdsForGroup(group) == []  # no Spark job ran
    if queue:
        assert qlen_sum(clients, queue) == 0


DS_WRITE_BAD = [  # (options, the message)
    ({"nodes": None}, "the disque data source needs .option('nodes', ...)"),
    ({"queue": None}, "the disque data source needs .option('queue', ...)"),
    ({"nodes": "127.0.0.1:x"}, "option 'nodes': bad port in node address '127.0.0.1:x'"),
    ({"replicate": "two"}, "option 'replicate' must be an integer from 1 to 65535, not 'two'"),
    ({"replicate": "0"}, "option 'replicate' must be an integer from 1 to 65535, not '0'"),
    ({"timeoutMs": "-1"}, "option 'timeoutMs' must be an integer >= 0, not '-1'"),
    ({"retry": "-5"}, "option 'retry' must be an integer >= 0, not '-5'"),
    ({"ttl": "0"}, "option 'ttl' must be an integer >= 1, not '0'"),
    ({"delay": "1.5"}, "option 'delay' must be an integer >= 0, not '1.5'"),
    ({"maxlen": "0"}, "option 'maxlen' must be an integer >= 1, not '0'"),
    ({"batchSize": "0"}, "option 'batchSize' must be an integer >= 1, not '0'"),
    ({"maxAttempts": "0"}, "option 'maxAttempts' must be an integer >= 1, not '0'"),
    ({"connections": "0"}, "option 'connections' must be an integer >= 1, not '0'"),
    ({"dedup": "maybe"}, "option 'dedup' must be true or false, not 'maybe'"),
    ({"async": "sometimes"}, "option 'async' must be true or false, not 'sometimes'"),
    ({"failOnError": "2"}, "option 'failOnError' must be true or false, not '2'"),
    ({"bodyFormat": "xml"}, "option 'bodyFormat' must be raw or json, not 'xml'"),
    ({"bodyColumn": "nope"}, "no column 'nope' to use as the job body"),
    ({"dedupKeyColumn": "nope"}, "no column 'nope' for dedupKeyColumn"),
    ({"replicat": "2"}, "unknown option 'replicat' for the disque data source writer"),
    ({"queues": "q"}, "unknown option 'queues' for the disque data source writer"),
]


@pytest.mark.parametrize(("options", "message"), DS_WRITE_BAD,
                         ids=[next(iter(o)) + f"-{i}" for i, (o, _) in enumerate(DS_WRITE_BAD)])
def test_data_source_writer_refuses_bad_options_when_spark_plans_the_write(
        spark, disque_cluster, clients, options, message):
    from pyspark.errors import AnalysisException

    register(spark)
    opts = {"nodes": ",".join(addrs(disque_cluster)), "queue": "ds-bad", **options}
    writer = rows_df(spark, 10, partitions=2).select("body").write.format("disque")
    for key, value in opts.items():
        if value is not None:
            writer = writer.option(key, value)
    with pytest.raises(AnalysisException) as info:
        writer.mode("append").save()
    assert "PYTHON_DATA_SOURCE_ERROR" in str(info.value)
    assert f"ValueError: {message}" in str(info.value), str(info.value)
    assert qlen_sum(clients, "ds-bad") == 0


def test_data_source_writer_refuses_overwrite_and_a_path(spark, disque_cluster):
    from pyspark.errors import AnalysisException

    register(spark)
    writer = (rows_df(spark, 10, partitions=2).select("body").write.format("disque")
              .option("nodes", ",".join(addrs(disque_cluster))).option("queue", "ds-bad"))
    with pytest.raises(AnalysisException, match="only appends: use .mode..append.."):
        writer.mode("overwrite").save()
    with pytest.raises(AnalysisException, match="unknown option 'path'"):
        writer.mode("append").save("somewhere")


DS_READ_BAD_AT_LOAD = [  # (options, the message): refused by load()
    ({"nodes": None}, "the disque data source needs .option('nodes', ...)"),
    ({"nodes": "127.0.0.1:0"}, "option 'nodes': port out of range in node address"),
    ({"maxJobsPerBatch": "0"}, "option 'maxJobsPerBatch' must be an integer >= 1, not '0'"),
    ({"fetchCount": "many"}, "option 'fetchCount' must be an integer >= 1, not 'many'"),
    ({"numPartitions": "0"}, "option 'numPartitions' must be an integer >= 1, not '0'"),
    ({"bodyType": "text"}, "option 'bodyType' must be binary or string, not 'text'"),
    ({"ack": "nack"}, "option 'ack' must be ack or fastack, not 'nack'"),
    ({"requeueOnStop": "perhaps"}, "option 'requeueOnStop' must be true or false"),
    ({"maxJobs": "5"}, "unknown option 'maxjobs' for the disque data source"),
]
DS_READ_BAD_AT_START = [  # (options, the message): refused when the query starts
    ({"queues": None}, "the disque data source needs .option('queues', ...)"),
    ({"queues": " , "}, "option 'queues' names no queue"),
    ({"queue": "q"}, "unknown option 'queue' for the disque data source stream reader"),
]


@pytest.mark.parametrize(("options", "message"), DS_READ_BAD_AT_LOAD,
                         ids=[next(iter(o)) + f"-{i}"
                              for i, (o, _) in enumerate(DS_READ_BAD_AT_LOAD)])
def test_stream_reader_refuses_bad_options_at_load(spark, disque_cluster, options, message):
    from pyspark.errors import AnalysisException

    register(spark)
    opts = {"nodes": ",".join(addrs(disque_cluster)), "queues": "rd-bad", **options}
    reader = spark.readStream.format("disque")
    for key, value in opts.items():
        if value is not None:
            reader = reader.option(key, value)
    with pytest.raises(AnalysisException) as info:
        reader.load()
    assert f"ValueError: {message}" in str(info.value), str(info.value)


@pytest.mark.parametrize(("options", "message"), DS_READ_BAD_AT_START,
                         ids=[next(iter(o)) + f"-{i}"
                              for i, (o, _) in enumerate(DS_READ_BAD_AT_START)])
def test_stream_reader_refuses_bad_options_when_the_query_starts(
        spark, disque_cluster, tmp_path, options, message):
    from pyspark.errors import StreamingQueryException

    register(spark)
    opts = {"nodes": ",".join(addrs(disque_cluster)), "queues": "rd-bad", **options}
    reader = spark.readStream.format("disque")
    for key, value in opts.items():
        if value is not None:
            reader = reader.option(key, value)
    query = reader.load().writeStream.foreachBatch(lambda df, batch_id: None) \
        .option("checkpointLocation", str(tmp_path / "checkpoint")).start()
    try:
        with pytest.raises(StreamingQueryException) as info:
            query.awaitTermination(120)  # (a hang guard: the query fails as it starts)
    finally:
        query.stop()
    assert f"ValueError: {message}" in str(info.value), str(info.value)


def test_a_password_in_a_disque_url_is_used_by_write_jobs_and_the_data_source(
        spark, tmp_path):
    """`disque://:secret@host:port` is a documented form of `nodes`: its password reaches
    the executors' clients (it was dropped with the URL, and every row failed to
    authenticate)."""
    from tests.harness import DisqueProcess
    from tests.integration.resp import Conn

    proc = DisqueProcess(tmp_path / "secured", args=["--requirepass", "sp4rk"])
    proc.start(wait=False)
    try:
        def up() -> bool:
            with Conn(proc.port, timeout=2) as c:
                return c.cmd("AUTH", "sp4rk") == "OK"
        wait_for(up, timeout=30, what="the password-protected node")
        url = f"disque://:sp4rk@127.0.0.1:{proc.port}"
        result = write_jobs(rows_df(spark, 100, partitions=2, prefix="pw"), "pwq", url,
                            replicate=1)
        assert result == WriteResult(added=100, failed=0)
        register(spark)
        (rows_df(spark, 50, partitions=2, prefix="pd").select("body").write.format("disque")
         .option("nodes", url).option("queue", "pwq").option("replicate", "1")
         .mode("append").save())
        with Client([f"127.0.0.1:{proc.port}"], password="sp4rk") as c:
            assert c.qlen("pwq") == 150
    finally:
        proc.kill()
