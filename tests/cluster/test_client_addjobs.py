"""`add_jobs` with REPLICATE 3 on a real 3-node cluster, blocking and asyncio clients: one
ADDJOBS per batch, and every ID answered is a job that all three nodes hold (synchronous
replication: an ID is answered only once its copies exist). A cluster whose nodes do not
have ADDJOBS (`rename-command ADDJOBS ""`, as antirez's Disque) gets the same result from
pipelined ADDJOBs. The REPLICATE 3 tests share a cluster with other calm tests
(`shared_cluster`, its stats reset before each test) and use queues of their own (`q`)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from disque.client import AddJobsResult, AsyncClient, Client
from tests.cluster.conftest import Cluster

N = 120


def addrs(c: Cluster) -> list[str]:
    return [f"127.0.0.1:{p.port}" for p in c]


def calls_of(c: Cluster, i: int, command: str) -> int:
    stats = c[i].client().info("commandstats")
    return int(stats.get(f"cmdstat_{command}", {}).get("calls", 0))


def add_replicated(kind: str, addr: str, bodies: list[bytes], queue: str) -> AddJobsResult:
    kw: dict[str, Any] = dict(replicate=3, timeout_ms=10000, batch_size=50)
    if kind == "sync":
        with Client([addr], discover=False) as c:
            return c.add_jobs(queue, bodies, **kw)

    async def run() -> AddJobsResult:
        async with AsyncClient([addr], discover=False) as c:
            return await c.add_jobs(queue, bodies, **kw)

    return asyncio.run(run())


def assert_on_every_node(c: Cluster, result: AddJobsResult, bodies: list[bytes]) -> None:
    assert result.ok, result.errors[:3]
    assert len(set(result.ids)) == len(bodies)
    for addr in addrs(c):
        with Client([addr], discover=False) as node:
            for job_id, body in zip(result.ids, bodies, strict=True):
                show = node.show(job_id)  # type: ignore[arg-type]
                assert show is not None, f"{job_id} missing on {addr}"
                assert show["body"] == body and show["repl"] == 3


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_add_jobs_replicate_3_sends_addjobs_and_every_id_is_on_three_nodes(
        shared_cluster: Any, q: str, kind: str) -> None:
    c = shared_cluster(3)
    bodies = [b"%s-%d" % (kind.encode(), i) for i in range(N)]
    result = add_replicated(kind, addrs(c)[0], bodies, q)
    assert_on_every_node(c, result, bodies)
    assert (calls_of(c, 0, "addjobs"), calls_of(c, 0, "addjob")) == (3, 0)


def test_add_jobs_replicate_3_without_addjobs_falls_back_to_pipelined_addjob(
        cluster: Any) -> None:
    c = cluster(3, args=["--rename-command", "ADDJOBS", ""])
    bodies = [b"fallback-%d" % i for i in range(N)]
    result = add_replicated("sync", addrs(c)[0], bodies, "rq")
    assert_on_every_node(c, result, bodies)
    assert calls_of(c, 0, "addjob") == N
