"""`write_jobs` and the `disque` data source with REPLICATE 3 on a real 3-node cluster: each
batch goes as one ADDJOBS (INFO commandstats counts no ADDJOB), every row is one job held by
all three nodes, exactly once. On nodes without ADDJOBS (`rename-command ADDJOBS ""`, as
antirez's Disque) the same write goes as pipelined ADDJOBs with the same result; and so it
does on the original itself, when $DISQUE_ORIGINAL names its disque-server."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from disque.client import Client
from disque.spark import WriteResult, register, write_jobs
from tests.cluster.conftest import Cluster, cluster  # noqa: F401 - the `cluster` fixture
from tests.harness import OriginalDisqueProcess

# (see test_spark.py: a timeout in a py4j call breaks the shared session)
pytestmark = pytest.mark.timeout(600)

N = 3000


def addrs(c: Cluster) -> list[str]:
    return [f"127.0.0.1:{p.port}" for p in c]


def calls(c: Cluster, command: str) -> list[int]:
    """INFO commandstats of every node: how many times each ran `command`."""
    out = []
    for p in c:
        stats = p.client().info("commandstats")
        out.append(int(stats.get(f"cmdstat_{command}", {}).get("calls", 0)))
    return out


def rows_df(spark: Any, n: int, prefix: str) -> Any:
    return spark.range(0, n, 1, 6).selectExpr(f"concat('{prefix}-', cast(id as string)) as body")


def assert_each_row_once_on_every_node(c: Cluster, queue: str, n: int, prefix: str) -> None:
    """With REPLICATE 3 every node holds every job: each node's jobs of `queue` are the rows,
    once each; and each job is queued on one node only."""
    want = Counter(f"{prefix}-{i}".encode() for i in range(n))
    for addr in addrs(c):
        with Client([addr], discover=False) as node:
            jobs = list(node.jscan(queue=queue, reply="all"))
            assert Counter(j["body"] for j in jobs) == want, addr
            assert all(j["repl"] == 3 for j in jobs)
    queued = 0
    for addr in addrs(c):
        with Client([addr], discover=False) as node:
            queued += node.qlen(queue)
    assert queued == n


def test_write_jobs_replicate_3_uses_addjobs_and_adds_every_row_once(
        spark: Any, disque_cluster: Cluster) -> None:
    before = calls(disque_cluster, "addjobs"), calls(disque_cluster, "addjob")
    result = write_jobs(rows_df(spark, N, "wj3"), "wj3", addrs(disque_cluster), replicate=3,
                        batch_size=100)
    assert result == WriteResult(added=N, failed=0)
    addjobs, addjob = calls(disque_cluster, "addjobs"), calls(disque_cluster, "addjob")
    assert addjob == before[1]
    # two partitions per node, 5 batches each (the first split before the client knows)
    assert all(now - then >= 10 for now, then in zip(addjobs, before[0], strict=True))
    assert_each_row_once_on_every_node(disque_cluster, "wj3", N, "wj3")


def test_data_source_replicate_3_uses_addjobs_and_adds_every_row_once(
        spark: Any, disque_cluster: Cluster) -> None:
    register(spark)
    before = calls(disque_cluster, "addjobs"), calls(disque_cluster, "addjob")
    (rows_df(spark, N, "ds3").write.format("disque")
     .option("nodes", ",".join(addrs(disque_cluster))).option("queue", "ds3")
     .option("replicate", "3").option("batchSize", "100").mode("append").save())
    assert calls(disque_cluster, "addjob") == before[1]
    assert all(now > then for now, then in zip(calls(disque_cluster, "addjobs"), before[0],
                                               strict=True))
    assert_each_row_once_on_every_node(disque_cluster, "ds3", N, "ds3")


def test_write_jobs_to_nodes_without_addjobs_falls_back_to_pipelined_addjob(
        spark: Any, cluster: Any) -> None:  # noqa: F811 - the fixture imported above
    c = cluster(3, args=["--rename-command", "ADDJOBS", ""])
    result = write_jobs(rows_df(spark, N, "fb3"), "fb3", addrs(c), replicate=3,
                        batch_size=100)
    assert result == WriteResult(added=N, failed=0)
    assert sum(calls(c, "addjob")) >= N  # (more if a transient error was retried)
    assert_each_row_once_on_every_node(c, "fb3", N, "fb3")


def test_write_jobs_and_the_data_source_reach_the_original_disque(
        spark: Any, original: OriginalDisqueProcess) -> None:
    """antirez's Disque ($DISQUE_ORIGINAL; skipped without it) refuses HELLO 3 and has
    neither ADDJOBS nor DEDUP: the executors speak RESP2 to it without being told, send
    pipelined ADDJOBs, and add every row (without keys)."""
    addr = f"127.0.0.1:{original.port}"
    result = write_jobs(rows_df(spark, 600, "orig"), "orig", [addr], batch_size=100)
    assert result == WriteResult(added=600, failed=0)
    register(spark)
    (rows_df(spark, 400, "origds").write.format("disque").option("nodes", addr)
     .option("queue", "origds").option("batchSize", "100").mode("append").save())
    with Client([addr], discover=False) as c:
        assert (c.qlen("orig"), c.qlen("origds")) == (600, 400)
        assert c.has_addjobs() is None  # (this client sent no batch)
