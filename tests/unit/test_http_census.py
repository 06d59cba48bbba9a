"""The HTTP side's census of the job registry (disque/http/view.py): exact on a small node,
and on a big one walked in the background at a bounded share of the loop while callers get
the previous census (issue 14: a dashboard polling every second must not tax a loaded node).

The view is given a fake clock and a sleep that records the rests it is asked for, so the
pacing is checked from what the census asks for, not from how long it took on this machine.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from types import SimpleNamespace

import pytest

from disque.http.view import CENSUS_DUTY, CENSUS_REUSE, CENSUS_SLICE, NodeView
from disque.node import Node

MYID = b"0123abcd" + b"e" * 32
T0 = 1_700_000_000_000  # unix ms
TICK = 0.001  # s: the fake clock moves this much at every read


class FakeClock:
    """Monotonic seconds that move TICK at every read, and by `advance`. A walk reads it
    once at the start of a slice and once at its end, so each slice is seen to take one
    TICK."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        self.now += TICK
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class Rests:
    """The census's sleep: records each rest asked for and yields to the loop once, or,
    with `hold` set, waits until cancelled (a walk caught in the middle of a rest)."""

    def __init__(self) -> None:
        self.asked: list[float] = []
        self.hold = False

    async def __call__(self, seconds: float) -> None:
        self.asked.append(seconds)
        if self.hold:
            await asyncio.Event().wait()
        await asyncio.sleep(0)


def lone_node() -> Node:
    return Node(MYID, lambda: T0, rng=random.Random(3))


def paced_view(node: Node) -> tuple[NodeView, FakeClock, Rests]:
    clock, rests = FakeClock(), Rests()
    return NodeView(SimpleNamespace(node=node), clock=clock, sleep=rests), clock, rests


def add(node: Node, n: int, queue: bytes = b"q") -> None:
    for _ in range(n):
        node.add_job(queue, b"x", 0, replicate=None, ttl=None, retry=None, delay=0,
                     maxlen=None, async_=False)


async def until(cond: Callable[[], object], rounds: int = 1000) -> None:
    """Let the loop run (no time passes) until `cond()` holds."""
    for _ in range(rounds):
        if cond():
            return
        await asyncio.sleep(0)
    raise AssertionError("the condition did not come true")


def test_a_small_registry_is_counted_afresh_for_every_caller() -> None:
    node = lone_node()
    view, clock, rests = paced_view(node)

    async def go() -> None:
        add(node, 3)
        first = await view.census()
        assert first.by_state["queued"] == 3
        assert first.slices == 1 and first.cost == pytest.approx(TICK)
        add(node, 2)
        # Within CENSUS_REUSE times its cost, the census is reused ...
        assert await view.census() is first
        # ... and once that has passed, the next caller waits for a fresh count.
        clock.advance(first.cost * CENSUS_REUSE)
        second = await view.census()
        assert second is not first
        assert second.by_state["queued"] == 5
        assert view.census_age() >= 0
        assert rests.asked == []  # a walk of one slice never rests

    asyncio.run(go())


def test_a_big_registry_is_walked_paced_in_the_background_while_callers_get_the_last(
        ) -> None:
    node = lone_node()
    view, clock, rests = paced_view(node)
    total = CENSUS_SLICE * 3

    async def go() -> None:
        add(node, total)
        first = await view.census()  # the first census is waited for, and not paced
        assert first.by_state["queued"] == total
        assert first.slices > 1
        assert rests.asked == [0.0] * (first.slices - 1)  # it only yielded between slices
        rests.asked.clear()
        add(node, 10, b"other")
        # Until the reuse age has passed, the same census is served without a walk.
        assert await view.census() is first
        assert view._census_task is not None and view._census_task.done()
        clock.advance(first.cost * CENSUS_REUSE)
        # Now a walk starts, and the caller gets the last census at once.
        again = await view.census()
        assert again is first
        walk = view._census_task
        assert walk is not None and not walk.done()
        # Concurrent callers share that one walk.
        assert await view.census() is first
        assert view._census_task is walk
        fresh = await walk
        assert fresh.by_state["queued"] == total + 10
        # After each slice but the last it rested (1/CENSUS_DUTY - 1) times as long as the
        # slice took (one TICK): the walk uses at most CENSUS_DUTY of the loop while it runs.
        assert fresh.cost == pytest.approx(TICK * fresh.slices)
        assert rests.asked == [pytest.approx(TICK * (1 / CENSUS_DUTY - 1))] * \
            (fresh.slices - 1)
        assert await view.census() is fresh
        assert view.census_age() < fresh.cost * CENSUS_REUSE
        # The HTTP side stopping stops a walk under way (here in the middle of a rest).
        clock.advance(fresh.cost * CENSUS_REUSE)
        rests.asked.clear()
        rests.hold = True
        assert await view.census() is fresh
        walk = view._census_task
        assert walk is not None
        await until(lambda: rests.asked)
        assert not walk.done()
        view.close()
        await until(walk.done)
        assert walk.cancelled()
        assert len(rests.asked) == 1

    asyncio.run(go())
