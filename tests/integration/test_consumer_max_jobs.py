"""`consume(..., max_jobs=N)` promises to stop "after exactly `max_jobs` jobs". With
concurrency > 1, a worker that finds every remaining job reserved by another worker (still
blocked in its GETJOB) sets the stop event; the other worker's GETJOB then times out and the
consumer returns with fewer than max_jobs jobs, although more arrive right after."""

from __future__ import annotations

import asyncio

from disque.client import AsyncClient, Client
from tests.harness import wait_for
from tests.threads import Background


def addr(p) -> str:
    return f"127.0.0.1:{p.port}"


def test_max_jobs_with_two_workers_consumes_exactly_max_jobs(server):
    with Client([addr(server)]) as c, Client([addr(server)]) as producer:
        for i in range(2):
            producer.add_job("mj", f"j{i}", replicate=1)
        consumer = Background(c.consume, "mj", lambda job: None, concurrency=2, max_jobs=3,
                              poll_ms=300, handle_signals=False, follow_producers=False)
        wait_for(lambda: producer.qlen("mj") == 0 and not list(producer.jscan(queue="mj")),
                 timeout=10,
                 what="the first two jobs to be consumed and acked")
        # the consumer still owes one job: it must still be running a few polls later
        consumer.join(timeout=1.5)
        assert consumer.is_alive(), f"consume() returned early: {consumer.result()}"
        producer.add_job("mj", "j2", replicate=1)
        stats = consumer.result(timeout=10)  # fails if it did not stop after max_jobs
        assert stats.acked == 3, f"stopped after {stats.acked} of max_jobs=3"


async def test_async_max_jobs_with_two_workers_consumes_exactly_max_jobs(server):
    async with AsyncClient([addr(server)]) as c, AsyncClient([addr(server)]) as producer:
        for i in range(2):
            await producer.add_job("amj", f"j{i}", replicate=1)
        task = asyncio.create_task(c.consume("amj", lambda job: None, concurrency=2,
                                             max_jobs=3, poll_ms=300, handle_signals=False,
                                             follow_producers=False))
        for _ in range(200):  # poll with a deadline (10 s)
            if await producer.qlen("amj") == 0 and not [j async for j in producer.jscan(
                    queue="amj")]:
                break
            await asyncio.sleep(0.05)
        done, _ = await asyncio.wait({task}, timeout=1.5)
        assert not done, f"consume() returned early: {task.result() if done else None}"
        await producer.add_job("amj", "j2", replicate=1)
        stats = await asyncio.wait_for(task, 10)
        assert stats.acked == 3, f"stopped after {stats.acked} of max_jobs=3"
