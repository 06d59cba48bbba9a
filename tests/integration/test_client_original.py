"""disque.client against antirez's original Disque, as a new user tries it: no `protocol=`.

The original speaks RESP2 only and refuses redis-py's `HELLO 3` handshake ("wrong number of
arguments for 'hello' command"); it has no ADDJOBS either. The client must reach it over
RESP2 without being told (sync, asyncio, consume, add_jobs), read its HELLO node list, and
`write_jobs`' executor side (`PartitionProducer`) must fall back to pipelined ADDJOBs.
Skipped unless $DISQUE_ORIGINAL names the original's disque-server (tests/conftest.py).
"""

from __future__ import annotations

import asyncio

import pytest

from disque.client import AsyncClient, Client, DisqueError, Job
from disque.spark.producer import PartitionProducer, ProducerConfig
from tests.harness import OriginalDisqueProcess


def addr(node: OriginalDisqueProcess) -> str:
    return f"127.0.0.1:{node.port}"


def test_sync_client_reaches_the_original_over_resp2_without_being_told(
        original: OriginalDisqueProcess) -> None:
    with Client(addr(original)) as c:
        job_id = c.add_job("q", b"x")
        assert c.node_id is not None and job_id[2:10] == c.node_id[:8]
        [job] = c.get_job("q", timeout=1000)
        assert (job.id, job.body) == (job_id, b"x")
        assert c.ack_job(job_id) == 1
        hello = c.hello()  # the node list, as the original sends it over RESP2
        assert hello.node_id == c.node_id
        assert [(n.id, n.port, n.priority) for n in hello.nodes] == [(c.node_id,
                                                                        original.port, 1)]


def test_an_explicit_protocol_3_is_not_overridden(original: OriginalDisqueProcess) -> None:
    with Client(addr(original), protocol=3) as c, pytest.raises(DisqueError, match="hello"):
        c.add_job("q", b"x")


def test_sync_add_jobs_falls_back_to_pipelined_addjob(original: OriginalDisqueProcess) -> None:
    with Client(addr(original)) as c:
        result = c.add_jobs("q", [b"a", b"b", b"c"])
        assert result.ok and c.has_addjobs() is False
        assert c.qlen("q") == 3
        # the original has no DEDUP: the client does not pretend, each job gets the error
        keyed = c.add_jobs("q", [b"d", b"e"], dedup_keys=["k1", "k2"])
        assert keyed.ids == [None, None]
        assert all(isinstance(e, DisqueError) and "syntax" in str(e) for e in keyed.errors)
        assert c.qlen("q") == 3


def test_password_is_sent_with_auth_over_resp2(original: OriginalDisqueProcess) -> None:
    original.kill()  # (a second one, with a password)
    secret = OriginalDisqueProcess(original.workdir.parent / "secret", original.binary,
                                   args=["--requirepass", "s3cret"])
    try:
        secret.start()
        with Client(addr(secret), password="s3cret") as c:
            assert c.add_job("q", b"x")
            assert c.qlen("q") == 1
    finally:
        secret.kill()


def test_sync_consume_against_the_original(original: OriginalDisqueProcess) -> None:
    with Client(addr(original)) as c:
        ids = [c.add_job("q", f"j{i}", retry=30) for i in range(4)]
        seen: list[str] = []

        def handler(job: Job) -> None:
            seen.append(job.id)

        stats = c.consume("q", handler, concurrency=2, max_jobs=4, poll_ms=200,
                          handle_signals=False)
        assert (stats.received, stats.acked) == (4, 4)
        assert sorted(seen) == sorted(ids) and c.qlen("q") == 0


async def test_async_client_and_consume_against_the_original(
        original: OriginalDisqueProcess) -> None:
    async with AsyncClient(addr(original)) as c:
        job_id = await c.add_job("q", b"x")
        assert (await c.hello()).node_id == c.node_id
        res = await c.add_jobs("q", [b"y", b"z"])
        assert res.ok and c.has_addjobs() is False
        seen: list[str] = []
        stats = await asyncio.wait_for(
            c.consume("q", lambda j: seen.append(j.id), max_jobs=3, poll_ms=200,
                      handle_signals=False), 60)
        assert stats.acked == 3 and job_id in seen
        assert await c.qlen("q") == 0


def test_write_jobs_partition_producer_falls_back_to_pipelined_addjob(
        original: OriginalDisqueProcess) -> None:
    """What `write_jobs` and the `disque` data source run on each executor, without Spark:
    pipelined ADDJOBs, and no DEDUP keys (the original has none)."""
    cfg = ProducerConfig(nodes=[addr(original)], queue="wq", batch_size=50, dedup=True,
                         dedup_prefix="w1", replicate=1)
    result = PartitionProducer(cfg, 0).run((f"row{i}", None) for i in range(120))
    assert (result.added, result.failed) == (120, 0), result.errors
    with Client(addr(original)) as c:
        assert c.qlen("wq") == 120


def test_concurrent_first_connections_all_fall_back(original: OriginalDisqueProcess) -> None:
    """Commands pinned to the node open connections at once from the refused RESP3 pool:
    every one of them ends on the RESP2 pool, none fails."""
    from concurrent.futures import ThreadPoolExecutor

    with Client(addr(original)) as c, ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda i: c.add_jobs("q", [b"%d" % i], node=addr(original)),
                                range(16)))
        assert all(r.ok for r in results), [r.errors for r in results]
        assert c.qlen("q") == 16
