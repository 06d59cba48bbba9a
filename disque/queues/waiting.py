"""Consumers blocked in GETJOB (the original's blocked.c): parked on their queues until a
job, their timeout, or LEAVING.

`block` parks a waiter on each of its queues (creating them) and asks the cluster for jobs
of the empty ones (`need_jobs`, federation's, given at construction); `serve_waiters` hands
the jobs queued in a queue to its waiters, oldest waiter first, one job each; `unblock`
forgets a waiter (served, timed out, or gone) and collects a queue whose last waiter left
when it is idle and empty (`queue_idle_ms`, the memory subsystem's).
"""

from __future__ import annotations

from collections.abc import Callable

from mypy_extensions import mypyc_attr

from disque.jobs.job import Job
from disque.protocol.errors import CommandError, leaving
from disque.queues.queue import PAUSE_OUT, Queue
from disque.state import NodeState
from disque.timers import Timer


def _no_callback(now: int) -> None:
    pass


# Subclassed by the command layer (and the tests), which stays interpreted.
@mypyc_attr(allow_interpreted_subclasses=True)
class Waiter:
    """A client blocked in GETJOB. The command layer subclasses it to write the replies."""

    __slots__ = ("queues", "timer", "count", "withcounters", "waiting")

    def __init__(self, queues: list[bytes], count: int, withcounters: bool) -> None:
        self.queues = queues
        self.count = count
        self.withcounters = withcounters
        self.timer: Timer | None = None
        self.waiting: Waiting | None = None  # set while the client is blocked

    def cancel(self) -> None:
        """The client went away."""
        if self.waiting is not None:
            self.waiting.unblock(self)

    def expire(self, now: int) -> None:
        """Its timeout (the timer wheel calls it)."""
        if self.waiting is not None:
            self.waiting.waiter_timeout(self)

    def on_jobs(self, jobs: list[Job]) -> None:
        raise NotImplementedError

    def on_timeout(self) -> None:
        raise NotImplementedError

    def on_error(self, error: CommandError) -> None:
        raise NotImplementedError


class Waiting:
    """The blocked GETJOB clients of a node (`node.waiting`)."""

    def __init__(self, state: NodeState, need_jobs: Callable[[Queue, int, bool], None],
                 queue_idle_ms: Callable[[], int]) -> None:
        self.state = state
        self.need_jobs = need_jobs
        self.queue_idle_ms = queue_idle_ms
        self.waiting_queues: set[Queue] = set()  # queues with blocked GETJOB clients
        self.blocked = 0  # clients blocked in GETJOB

    def block(self, waiter: Waiter, timeout_ms: int) -> None:
        """Park a GETJOB client on its queues until a job, the timeout, or LEAVING."""
        if self.state.leaving:
            raise leaving()
        waiter.waiting = self
        now = self.state.clock()
        for name in waiter.queues:
            q = self.state.create_queue(name, now)
            q.waiters[waiter] = None
            self.waiting_queues.add(q)
            if not q.jobs:
                self.need_jobs(q, now, False)
        self.blocked += 1
        if timeout_ms:
            waiter.timer = Timer(waiter.expire)
            self.state.wheel.schedule(waiter.timer, self.state.clock() + timeout_ms)

    def unblock(self, waiter: Waiter) -> None:
        """Forget a blocked client (served, timed out, or disconnected)."""
        removed = False
        for name in waiter.queues:
            q = self.state.queues.get(name)
            if q is not None and q.waiters.pop(waiter, 0) is None:
                removed = True
                if not q.waiters:
                    self.waiting_queues.discard(q)
                    # the last blocked client left: try to collect the queue now (original
                    # unblockClientBlockedForJobs -> GCQueue)
                    if q.evictable() and self.state.clock() - q.atime >= self.queue_idle_ms():
                        self.state.drop_queue(q)
        if removed:
            self.blocked -= 1
        if waiter.timer is not None:
            self.state.wheel.cancel(waiter.timer)
            waiter.timer.callback = _no_callback  # (its bound method holds the waiter: no cycle)
            waiter.timer = None

    def waiter_timeout(self, waiter: Waiter) -> None:
        self.unblock(waiter)
        waiter.on_timeout()

    def serve_waiters(self, q: Queue) -> None:
        """Hand jobs of `q` to its blocked clients, oldest client first, one job each."""
        waiters = q.waiters
        while q.jobs and waiters and not q.paused & PAUSE_OUT:
            waiter = next(iter(waiters))
            self.unblock(waiter)
            now = self.state.clock()
            waiter.on_jobs([self.state.fetch(q, now)])
            if not q.jobs and (q.needjobs_responders or waiters):
                self.need_jobs(q, now, True)  # (reached zero)

    def queues_with_waiters(self) -> list[Queue]:
        return list(self.waiting_queues)
