"""The HTTP side's census of the job registry (disque/http/view.py): exact on a small node,
and on a big one walked in the background at a bounded share of the loop while callers get
the previous census (issue 14: a dashboard polling every second must not tax a loaded node).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from types import SimpleNamespace

from disque.http import view as view_mod
from disque.http.view import CENSUS_DUTY, CENSUS_SLICE, NodeView
from disque.node import Node

MYID = b"0123abcd" + b"e" * 32
T0 = 1_700_000_000_000  # unix ms


def lone_node() -> Node:
    return Node(MYID, lambda: T0, rng=random.Random(3))


def add(node: Node, n: int, queue: bytes = b"q") -> None:
    for _ in range(n):
        node.add_job(queue, b"x", 0, replicate=None, ttl=None, retry=None, delay=0,
                     maxlen=None, async_=False)


def test_a_small_registry_is_counted_afresh_for_every_caller() -> None:
    node = lone_node()
    view = NodeView(SimpleNamespace(node=node))

    async def go() -> None:
        add(node, 3)
        first = await view.census()
        assert first.by_state["queued"] == 3
        assert first.slices == 1
        add(node, 2)
        # A walk of a handful of jobs costs under a millisecond (its 4096 shards): once 100x
        # that has passed, the next caller waits for a fresh count.
        await asyncio.sleep(first.cost * view_mod.CENSUS_REUSE + 0.001)
        second = await view.census()
        assert second is not first
        assert second.by_state["queued"] == 5
        assert view.census_age() >= 0

    asyncio.run(go())


def test_a_big_registry_is_walked_paced_in_the_background_while_callers_get_the_last(
        ) -> None:
    node = lone_node()
    view = NodeView(SimpleNamespace(node=node))
    total = CENSUS_SLICE * 3

    async def go() -> None:
        add(node, total)
        t0 = time.monotonic()
        first = await view.census()  # the first census is waited for, and not paced
        assert first.by_state["queued"] == total
        assert first.slices > 1
        unpaced_wall = time.monotonic() - t0
        add(node, 10, b"other")
        # Until the reuse age has passed, the same census is served without a walk.
        assert await view.census() is first
        assert view._census_task is not None and view._census_task.done()
        await asyncio.sleep(first.cost * view_mod.CENSUS_REUSE)
        # Now a walk starts, and the caller gets the last census at once.
        again = await view.census()
        assert again is first
        walk = view._census_task
        assert walk is not None and not walk.done()
        # Concurrent callers share that one walk.
        assert await view.census() is first
        assert view._census_task is walk
        t1 = time.monotonic()
        fresh = await walk
        paced_wall = time.monotonic() - t1
        assert fresh.by_state["queued"] == total + 10
        # Between slices it rested (1/CENSUS_DUTY - 1) times as long as the slice took: its
        # wall time is at least that many times its cost (sleeps last at least as asked).
        assert paced_wall >= fresh.cost * (1 / CENSUS_DUTY - 1) * (fresh.slices - 1) / \
            fresh.slices * 0.99
        assert paced_wall > unpaced_wall or fresh.cost == 0
        assert await view.census() is fresh
        assert view.census_age() < 5
        # The HTTP side stopping stops a walk under way.
        await asyncio.sleep(fresh.cost * view_mod.CENSUS_REUSE)
        assert await view.census() is fresh
        walk = view._census_task
        assert walk is not None and not walk.done()
        view.close()
        with contextlib.suppress(asyncio.CancelledError):
            await walk
        assert walk.cancelled()

    asyncio.run(go())
