"""disque.queues.ordered: OrderedJobs against a sorted-list model (hypothesis state machine)."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from disque.jobs.job import Job
from disque.queues import ordered
from disque.queues.ordered import OrderedJobs


def J(ctime: int, n: int) -> Job:
    """A job whose ID is its insertion number `n`: identity matters, ordering is by ctime
    only. (A real Job: a compiled OrderedJobs takes nothing else.)"""
    return Job(b"%d" % n, b"q", b"", 1, ctime, 0, 0, 0, ())


class OrderedJobsMachine(RuleBasedStateMachine):
    """The model is a list kept sorted by (ctime, insertion number)."""

    jobs = Bundle("jobs")

    def __init__(self) -> None:
        super().__init__()
        self.q = OrderedJobs()
        self.model: list[Job] = []
        self.seq = 0
        self.clock = 1000

    def _model_add(self, job: Job) -> None:
        self.model.append(job)
        self.model.sort(key=lambda j: (j.ctime, int(j.id)))

    def _new(self, ctime: int) -> Job:
        self.seq += 1
        return J(ctime, self.seq)

    @rule(target=jobs, step=st.integers(0, 3))
    def add_newer(self, step):
        # the common case: now or later than every queued job (step 0 = equal ctime)
        self.clock += step
        job = self._new(self.clock)
        self.q.add(job)
        self._model_add(job)
        return job

    @rule(target=jobs, back=st.integers(0, 1100))
    def add_older(self, back):
        job = self._new(max(0, self.clock - back))
        self.q.add(job)
        self._model_add(job)
        return job

    @precondition(lambda self: self.model)
    @rule(target=jobs, data=st.data())
    def add_equal_to_existing(self, data):
        other = data.draw(st.sampled_from(self.model))
        job = self._new(other.ctime)
        self.q.add(job)
        self._model_add(job)
        return job

    @rule(backs=st.lists(st.integers(-3, 1100), max_size=12))
    def add_oldest(self, backs):
        # jobs back from disk, sorted: in front when all are older than the queue's head,
        # else one at a time
        head = self.model[0].ctime if self.model else self.clock
        batch = [self._new(max(0, head - back)) for back in sorted(backs, reverse=True)]
        self.q.add_oldest(batch)
        for job in batch:
            self._model_add(job)

    @rule(job=consumes(jobs))
    def remove(self, job):
        present = any(j is job for j in self.model)
        assert self.q.remove(job) is present
        if present:
            self.model = [j for j in self.model if j is not job]
        assert self.q.remove(job) is False  # gone now

    @precondition(lambda self: self.model)
    @rule(data=st.data())
    def remove_lookalike_not_present(self, data):
        # same ctime as a queued job but a different object: must not remove anything
        other = data.draw(st.sampled_from(self.model))
        assert self.q.remove(J(other.ctime, -1)) is False

    @rule(ctime=st.integers(0, 3000))
    def remove_never_added(self, ctime):
        assert self.q.remove(J(ctime, -1)) is False

    @rule()
    def pop_first(self):
        got = self.q.pop_first()
        if not self.model:
            assert got is None
        else:
            assert got is self.model.pop(0)

    @rule(n=st.integers(0, 40))
    def oldest(self, n):
        assert self.q.oldest(n) == self.model[:n]

    @rule(n=st.integers(0, 40))
    def newest(self, n):
        assert self.q.newest(n) == self.model[::-1][:n]

    @rule()
    def first(self):
        assert self.q.first() is (self.model[0] if self.model else None)

    @invariant()
    def same_length_and_order(self):
        assert len(self.q) == len(self.model)
        assert bool(self.q) == bool(self.model)
        assert list(self.q) == self.model

    @invariant()
    def chunk_bookkeeping(self):
        chunks, maxes = self.q._chunks, self.q._maxes
        assert len(chunks) == len(maxes)
        assert all(chunks), "no empty chunk"
        assert all(len(c) <= 2 * ordered.LOAD for c in chunks)
        assert maxes == [c[-1].ctime for c in chunks]
        assert sum(map(len, chunks)) == len(self.q)


@pytest.mark.parametrize("load", [1, 2, 4])
def test_ordered_jobs_matches_sorted_model_with_small_chunks(monkeypatch, load):
    monkeypatch.setattr(ordered, "LOAD", load)
    run_state_machine_as_test(
        OrderedJobsMachine,
        settings=settings(max_examples=60, stateful_step_count=60, deadline=None))


def test_ordered_jobs_matches_sorted_model_default_load():
    run_state_machine_as_test(
        OrderedJobsMachine,
        settings=settings(max_examples=30, stateful_step_count=40, deadline=None))


# ---------------------------------------------------------------------------------- examples


def test_equal_ctimes_keep_insertion_order_across_chunk_splits(monkeypatch):
    monkeypatch.setattr(ordered, "LOAD", 2)
    q = OrderedJobs()
    jobs = [J(5, i) for i in range(20)]
    for j in jobs:
        q.add(j)
    late = J(5, 99)
    q.add(J(6, 50))
    q.add(late)  # equal to many, older than the last: goes after every ctime-5 job
    assert list(q) == [*jobs, late, q.newest(1)[0]]
    assert len(q._chunks) > 1


def test_many_items_split_chunks_at_default_load():
    q = OrderedJobs()
    jobs = [J(i, i) for i in range(3 * ordered.LOAD)]
    for j in reversed(jobs):  # every insert is at the front
        q.add(j)
    assert len(q._chunks) >= 2
    assert list(q) == jobs
    mid = jobs[len(jobs) // 2]
    assert q.remove(mid)
    assert not q.remove(mid)
    assert q.oldest(3) == jobs[:3]
    assert q.newest(2) == [jobs[-1], jobs[-2]]
    popped = [q.pop_first() for _ in range(len(jobs) - 1)]
    assert popped == [j for j in jobs if j is not mid]
    assert q.pop_first() is None and len(q) == 0 and not q


def test_remove_last_of_chunk_updates_chunk_max(monkeypatch):
    monkeypatch.setattr(ordered, "LOAD", 1)
    q = OrderedJobs()
    a, b, c = J(10, 1), J(20, 2), J(30, 3)
    for j in (a, b, c):
        q.add(j)
    assert q._maxes[-1] == 30
    assert q.remove(c)
    assert q._maxes[-1] == 20
    x = J(25, 4)
    q.add(x)
    assert list(q) == [a, b, x]
    assert q._maxes == [ch[-1].ctime for ch in q._chunks]


def test_clear_empties_everything():
    q = OrderedJobs()
    for i in range(10):
        q.add(J(i, i))
    q.clear()
    assert len(q) == 0 and list(q) == [] and q.first() is None and q.pop_first() is None
    q.add(J(1, 1))
    assert len(q) == 1


def test_iteration_is_a_snapshot_safe_against_removal_during_iteration():
    q = OrderedJobs()
    jobs = [J(i, i) for i in range(10)]
    for j in jobs:
        q.add(j)
    seen = []
    for j in q:
        seen.append(j)
        q.remove(j)
    assert seen == jobs and len(q) == 0
