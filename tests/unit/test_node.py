"""disque.node: a lone node driven by a fake clock and a seeded RNG. No sockets, no sleeps.

Time only moves through `Sim.advance`, which wakes the node at every instant its timer wheel
asks for (as the server's single loop timer does), then at the target instant.
"""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from disque.jobs.job import ACKED, ACTIVE, F_BCAST_QUEUED, F_DELIVERED, JOB_MEMORY, QUEUED, Job
from disque.jobs.serialize import deserialize_job, serialize_job
from disque.node import DEFAULT_TTL, Node, Waiter
from disque.protocol.errors import CommandError
from disque.queues.queue import PAUSE_IN, PAUSE_OUT
from disque.state import BASE_MEMORY, QUEUE_MEMORY, REQUEUE_JITTER
from disque.timers import RES

MYID = b"0123abcd" + b"e" * 32
T0 = 1_700_000_000_000  # unix ms


class Sim:
    """A node plus the fake clock it reads (a mutable int behind a lambda)."""

    def __init__(self, seed: int = 1, **kw) -> None:
        self.now = T0
        self.node = Node(MYID, lambda: self.now, rng=random.Random(seed), **kw)

    def advance(self, ms: int) -> None:
        target = self.now + ms
        node = self.node
        for _ in range(10_000_000):
            nd = node.next_due()
            if nd is None or nd > target:
                break
            self.now = max(self.now, nd)
            node.tick(self.now)
        else:  # pragma: no cover
            raise AssertionError("timer wheel never drains")
        self.now = target
        node.tick(target)

    def add(self, queue: bytes = b"q", body: bytes = b"body", *, timeout: int = 0,
            replicate: int | None = None, ttl: int | None = None, retry: int | None = None,
            delay: int = 0, maxlen: int | None = None, async_: bool = False) -> Job:
        return self.node.add_job(queue, body, timeout, replicate=replicate, ttl=ttl,
                                 retry=retry, delay=delay, maxlen=maxlen, async_=async_)

    def add_error(self, **kw) -> CommandError:
        with pytest.raises(CommandError) as info:
            self.add(**kw)
        return info.value

    def qlen(self, name: bytes = b"q") -> int:
        q = self.node.lookup_queue(name)
        return len(q.jobs) if q is not None else 0

    def queued(self, name: bytes = b"q") -> list[Job]:
        q = self.node.lookup_queue(name)
        return list(q.jobs) if q is not None else []


class Rec(Waiter):
    """A blocked GETJOB client that records what the node tells it."""

    def __init__(self, queues: list[bytes], count: int = 1, withcounters: bool = False):
        super().__init__(queues, count, withcounters)
        self.log: list[tuple] = []

    def on_jobs(self, jobs):
        self.log.append(("jobs", [j.id for j in jobs]))

    def on_timeout(self):
        self.log.append(("timeout",))

    def on_error(self, error):
        self.log.append(("error", error.prefix, error.message))


def getjob(sim: Sim, queues: list[bytes], count: int = 1, timeout: int = 0,
           waiter: Rec | None = None) -> list[Job] | Rec:
    """The GETJOB flow of the command layer: fetch, else block."""
    jobs = sim.node.get_jobs(queues, count)
    if jobs:
        return jobs
    w = waiter or Rec(queues, count)
    sim.node.block(w, timeout)
    return w


@pytest.fixture
def sim() -> Sim:
    return Sim()


# ---------------------------------------------------------------------------------- ADDJOB


def test_addjob_defaults_on_a_lone_node(sim):
    job = sim.add()
    assert job.repl == 1
    assert job.etime == T0 + DEFAULT_TTL * 1000
    assert job.retry == 300
    assert job.delay == 0
    assert job.state == QUEUED
    assert job.delivered == (MYID,)
    assert job.id[2:10] == MYID[:8] and job.id[36:] == b"05a1"
    assert sim.queued() == [job]
    assert sim.node.lookup_job(job.id) is job


@pytest.mark.parametrize("ttl,retry", [
    (86400, 300), (3000, 300), (2999, 299), (100, 10), (19, 1), (10, 1), (5, 1), (1, 1),
])
def test_default_retry_is_ttl_tenth_capped_at_300_and_at_least_1(sim, ttl, retry):
    assert sim.add(ttl=ttl).retry == retry


def test_explicit_retry_and_ttl_are_kept(sim):
    job = sim.add(ttl=100, retry=0, replicate=1)
    assert (job.retry, job.etime, job.id[36:]) == (0, T0 + 100_000, b"0000")


def test_ctime_is_strictly_increasing_within_one_millisecond(sim):
    a, b, c = sim.add(), sim.add(), sim.add()
    assert a.ctime == T0 * 1_000_000
    assert (b.ctime, c.ctime) == (a.ctime + 1, a.ctime + 2)
    sim.advance(1)
    assert sim.add().ctime == (T0 + 1) * 1_000_000


def test_retry_zero_with_replicate_above_one_is_refused(sim):
    e = sim.add_error(retry=0, replicate=2)
    assert e.resp() == (b"-ERR With RETRY set to 0 please explicitly set  REPLICATE to 1 "
                        b"(at-most-once delivery)\r\n")
    assert len(sim.node.jobs) == 0


def test_retry_zero_with_replicate_one_is_accepted(sim):
    assert sim.add(retry=0, replicate=1).state == QUEUED


def test_retry_zero_with_default_replicate_is_accepted_on_a_lone_node(sim):
    # default REPLICATE = min(3, cluster size) = 1 here
    assert sim.add(retry=0).retry == 0


@pytest.mark.parametrize("delay,ttl", [(10, 10), (11, 10), (86400, None)])
def test_delay_not_below_ttl_is_refused(sim, delay, ttl):
    e = sim.add_error(delay=delay, ttl=ttl)
    assert e.resp() == (b"-ERR The specified DELAY is greater than TTL. Job refused since "
                        b"would never be delivered\r\n")
    assert len(sim.node.jobs) == 0 and sim.node.lookup_queue(b"q") is None


def test_delay_just_below_ttl_is_accepted(sim):
    assert sim.add(delay=9, ttl=10).state == ACTIVE


def test_replicate_above_one_on_a_lone_node_is_norepl(sim):
    e = sim.add_error(replicate=2)
    assert e.resp() == b"-NOREPL Not enough reachable nodes for the requested replication level\r\n"
    assert sim.add_error(replicate=2, async_=True).resp() == e.resp()
    assert len(sim.node.jobs) == 0 and sim.node.lookup_queue(b"q") is None


def test_maxlen_refuses_when_queue_already_holds_n_jobs(sim):
    sim.add()
    e = sim.add_error(maxlen=1)
    assert e.resp() == b"-MAXLEN Queue is already longer than the specified MAXLEN count\r\n"
    assert sim.qlen() == 1
    sim.add(maxlen=2)
    assert sim.qlen() == 2
    assert sim.add_error(maxlen=2).prefix == "MAXLEN"


def test_maxlen_counts_only_queued_jobs(sim):
    job = sim.add()
    sim.node.get_jobs([b"q"], 1)  # now active, not queued
    assert sim.add(maxlen=1).state == QUEUED
    assert job.state == ACTIVE


def test_maxlen_on_unknown_queue_is_fine(sim):
    assert sim.add(queue=b"new", maxlen=1).state == QUEUED


def test_paused_in_queue_refuses_addjob(sim):
    sim.node.pause(b"q", PAUSE_IN)
    e = sim.add_error()
    assert e.resp() == b"-PAUSED Queue paused in input, try later\r\n"
    assert len(sim.node.jobs) == 0


def test_paused_out_queue_accepts_addjob(sim):
    sim.node.pause(b"q", PAUSE_OUT)
    assert sim.add().state == QUEUED


def test_addjob_check_order(sim):
    sim.add()
    sim.node.pause(b"q", PAUSE_IN)
    # RETRY/REPLICATE before DELAY before NOREPL before MAXLEN before PAUSED
    assert sim.add_error(retry=0, replicate=2, delay=10, ttl=10, maxlen=1).message.startswith(
        "With RETRY set to 0")
    assert sim.add_error(replicate=2, delay=10, ttl=10, maxlen=1).message.startswith(
        "The specified DELAY")
    assert sim.add_error(replicate=2, maxlen=1).prefix == "NOREPL"
    assert sim.add_error(maxlen=1).prefix == "MAXLEN"
    assert sim.add_error(maxlen=2).prefix == "PAUSED"


def test_addjob_records_loadjob_for_persistence(sim):
    calls = []

    class P:
        def loadjob(self, job):
            calls.append(("loadjob", job.id))

        addjob = loadjob  # a new job: a LOADJOB the AOF cancels the job for if unwritten

        def deljob(self, job_id):
            calls.append(("deljob", job_id))

    sim.node.persist = P()
    job = sim.add()
    sim.node.ackjob([job.id])
    assert calls == [("loadjob", job.id), ("deljob", job.id)]


# ---------------------------------------------------------------------------------- GETJOB


def test_getjob_passes_one_job_per_queue_per_pass(sim):
    a1, a2, a3 = (sim.add(queue=b"qa", body=b"a%d" % i) for i in (1, 2, 3))
    b1 = sim.add(queue=b"qb", body=b"b1")
    assert sim.node.get_jobs([b"qa", b"qb", b"qa"], 3) == [a1, b1, a2]
    assert sim.node.get_jobs([b"qa", b"qb", b"qa"], 3) == [a3]


def test_getjob_keeps_passing_until_count_or_empty_pass(sim):
    a = [sim.add(queue=b"qa") for _ in range(3)]
    b = [sim.add(queue=b"qb") for _ in range(1)]
    assert sim.node.get_jobs([b"qa", b"qb"], 10) == [a[0], b[0], a[1], a[2]]


def test_getjob_unknown_queues_give_nothing_and_create_nothing(sim):
    assert sim.node.get_jobs([b"nope"], 5) == []
    assert sim.node.lookup_queue(b"nope") is None


def test_fetched_job_becomes_active_delivered_and_counts_jobs_out(sim):
    job = sim.add()
    sim.advance(1500)
    [got] = sim.node.get_jobs([b"q"], 1)
    q = sim.node.lookup_queue(b"q")
    assert got is job
    assert job.state == ACTIVE and job.flags & F_DELIVERED
    assert (q.jobs_in, q.jobs_out, q.atime) == (1, 1, T0 + 1500)
    assert sim.qlen() == 0


def test_getjob_skips_queues_paused_out(sim):
    a = sim.add(queue=b"qa")
    b = sim.add(queue=b"qb")
    sim.node.pause(b"qa", PAUSE_OUT)
    assert sim.node.get_jobs([b"qa", b"qb"], 5) == [b]
    assert a.state == QUEUED


def test_queue_order_is_by_ctime(sim):
    jobs = [sim.add() for _ in range(5)]
    sim.node.dequeue_jobs([jobs[0].id, jobs[2].id])
    sim.node.enqueue_jobs([jobs[2].id, jobs[0].id], nack=False)
    assert sim.queued() == jobs


# ---------------------------------------------------------------------------------- requeue


def test_retry_requeues_an_active_job_and_counts_an_additional_delivery(sim):
    job = sim.add(ttl=100, retry=5)
    qtime = job.qtime
    assert T0 + 5000 - REQUEUE_JITTER <= qtime < T0 + 5000 + REQUEUE_JITTER
    sim.node.get_jobs([b"q"], 1)
    sim.advance(qtime - 1 - sim.now)
    assert job.state == ACTIVE and job.deliveries == 0
    sim.advance(RES)
    assert job.state == QUEUED and job.deliveries == 1
    assert sim.queued() == [job]
    q = sim.node.lookup_queue(b"q")
    assert q.jobs_in == 2
    # and again
    sim.node.get_jobs([b"q"], 1)
    sim.advance(job.qtime + RES - sim.now)
    assert job.state == QUEUED and job.deliveries == 2


def test_retry_timer_of_a_still_queued_job_only_renews_the_timer(sim):
    job = sim.add(ttl=100, retry=5)
    first = job.qtime
    sim.advance(first + RES - sim.now)
    assert job.state == QUEUED and job.deliveries == 0
    # processed at some t in [first, first + RES]: new qtime = t + 5 s +- jitter
    assert first + 5000 - REQUEUE_JITTER <= job.qtime < first + RES + 5000 + REQUEUE_JITTER
    assert sim.node.lookup_queue(b"q").jobs_in == 1


def test_at_most_once_job_is_never_requeued(sim):
    job = sim.add(ttl=1000, retry=0)
    assert job.qtime == 0 and job.id[36:] == b"0010"
    sim.node.get_jobs([b"q"], 1)
    sim.advance(900_000)
    assert job.state == ACTIVE and job.deliveries == 0 and sim.qlen() == 0
    assert sim.node.enqueue_jobs([job.id], nack=False) == 0
    assert sim.node.enqueue_jobs([job.id], nack=True) == 0
    assert job.nacks == 0 and job.state == ACTIVE


@pytest.mark.parametrize("setup", ["queued", "active", "delayed", "dequeued", "retry0"])
def test_ttl_expiry_deletes_the_job_in_any_state(sim, setup):
    job = sim.add(ttl=10, retry=0 if setup == "retry0" else 3,
                  delay=5 if setup == "delayed" else 0)
    if setup in ("active", "retry0"):
        sim.node.get_jobs([b"q"], 1)
    elif setup == "dequeued":
        sim.node.dequeue_jobs([job.id])
    sim.advance(10_000 - 1)
    assert sim.node.lookup_job(job.id) is job
    sim.advance(1 + RES)
    assert sim.node.lookup_job(job.id) is None
    assert sim.qlen() == 0 and job not in sim.queued()
    assert sim.node.used_memory() == BASE_MEMORY + QUEUE_MEMORY


def test_ttl_expiry_logs_deljob(sim):
    deleted = []

    class P:
        def loadjob(self, job):
            pass

        addjob = loadjob

        def deljob(self, job_id):
            deleted.append(job_id)

    sim.node.persist = P()
    job = sim.add(ttl=2)
    sim.advance(2000 + RES)
    assert deleted == [job.id]


def test_delay_queues_after_the_delay_without_counting_a_delivery(sim):
    job = sim.add(ttl=100, retry=10, delay=5)
    assert job.state == ACTIVE and sim.qlen() == 0 and job.qtime == T0 + 5000
    sim.advance(5000 - 1)
    assert job.state == ACTIVE and sim.qlen() == 0
    sim.advance(RES)
    assert job.state == QUEUED and job.deliveries == 0 and sim.queued() == [job]
    # first queueing at t in [T0 + 5 s, T0 + 5 s + RES]: requeue at t + 10 s +- jitter
    assert T0 + 15000 - REQUEUE_JITTER <= job.qtime < T0 + 15000 + RES + REQUEUE_JITTER


def test_delayed_at_most_once_job_is_queued_once(sim):
    job = sim.add(ttl=100, retry=0, delay=2)
    sim.advance(2000 + RES)
    assert job.state == QUEUED and job.qtime == 0
    sim.node.get_jobs([b"q"], 1)
    sim.advance(60_000)
    assert job.state == ACTIVE


def test_enqueue_of_a_delayed_job_before_its_delay_is_its_silent_first_queueing(sim):
    job = sim.add(ttl=100, delay=50)
    assert sim.node.enqueue_jobs([job.id], nack=False) == 1
    assert job.state == QUEUED and job.deliveries == 0 and job.flags & F_BCAST_QUEUED


def test_requeue_of_active_job_in_paused_in_queue_is_postponed(sim):
    job = sim.add(ttl=100, retry=5)
    sim.node.get_jobs([b"q"], 1)
    sim.node.pause(b"q", PAUSE_IN)
    first = job.qtime
    sim.advance(first + RES - sim.now)
    assert job.state == ACTIVE and job.deliveries == 0
    assert first + 5000 - REQUEUE_JITTER <= job.qtime < first + RES + 5000 + REQUEUE_JITTER
    sim.node.pause(b"q", 0)
    sim.advance(job.qtime + RES - sim.now)
    assert job.state == QUEUED and job.deliveries == 1


def test_delayed_at_most_once_job_is_queued_even_if_paused_in(sim):
    job = sim.add(ttl=100, retry=0, delay=2)
    sim.node.pause(b"q", PAUSE_IN)
    sim.advance(2000 + RES)
    assert job.state == QUEUED


def test_delayed_at_most_once_job_delivered_before_a_restart_is_not_queued_again():
    # Audit finding (checklist 12; docs/commands.md "Differences": only a delayed RETRY 0
    # job that was never queued may be queued again after an AOF reload). The AOF does not
    # log queueing, so Node.load_job takes this record for a never-queued job.
    sim = Sim()
    loadjobs: list[bytes] = []  # each LOADJOB payload exactly as the AOF would store it
    log = lambda job: loadjobs.append(serialize_job(job))  # noqa: E731
    sim.node.persist = SimpleNamespace(loadjob=log, addjob=log, deljob=lambda job_id: None,
                                       last_write_error=None)
    job = sim.add(body=b"once", replicate=1, ttl=600, retry=0, delay=2)  # RETRY 0 DELAY 2
    sim.advance(2100)
    assert job.state == QUEUED
    assert sim.node.get_jobs([b"q"], 1) == [job]  # delivered once
    assert len(loadjobs) == 1  # queueing is not logged: the record says "never queued"
    sim.now += 5000  # crash, restart 5 s later
    again = sim.node = Node(MYID, lambda: sim.now, rng=random.Random(9))
    assert again.load_job(deserialize_job(loadjobs[0])[0], False)
    sim.advance(60_000)
    back = again.lookup_job(job.id)
    assert back is not None and back.state == ACTIVE  # must not be delivered a second time


# ---------------------------------------------------------------------------------- WORKING


def test_working_postpones_the_requeue_and_returns_retry(sim):
    job = sim.add(ttl=100, retry=10)
    sim.node.get_jobs([b"q"], 1)
    sim.advance(8000)
    assert sim.node.working(job.id) == 10
    assert sim.now + 10000 - REQUEUE_JITTER <= job.qtime < sim.now + 10000 + REQUEUE_JITTER
    assert job.awake == job.qtime
    sim.advance(job.qtime - 1 - sim.now)
    assert job.state == ACTIVE
    sim.advance(RES + 1)
    assert job.state == QUEUED and job.deliveries == 1


def test_working_on_a_queued_job_dequeues_it(sim):
    job = sim.add(ttl=100, retry=10)
    assert sim.node.working(job.id) == 10
    assert job.state == ACTIVE and sim.qlen() == 0


def test_working_on_at_most_once_job_returns_zero_and_never_requeues(sim):
    job = sim.add(ttl=100, retry=0)
    sim.node.get_jobs([b"q"], 1)
    assert sim.node.working(job.id) == 0
    assert job.qtime == 0
    sim.advance(60_000)
    assert job.state == ACTIVE


def test_working_after_half_the_ttl_is_toolate(sim):
    job = sim.add(ttl=4, retry=1)
    sim.node.get_jobs([b"q"], 1)
    sim.advance(2000)
    assert sim.node.working(job.id) == 1  # exactly half: still allowed
    sim.advance(1)
    with pytest.raises(CommandError) as info:
        sim.node.working(job.id)
    assert info.value.resp() == (b"-TOOLATE Half of job TTL already elapsed, you are no "
                                 b"longer allowed to postpone the next delivery.\r\n")


def test_working_unknown_job_is_nojob(sim):
    with pytest.raises(CommandError) as info:
        sim.node.working(b"D-00000000-" + b"A" * 24 + b"-05a1")
    assert info.value.resp() == b"-NOJOB Job not known in the context of this node.\r\n"


# ---------------------------------------------------------------------------------- ENQUEUE/NACK


def test_nack_requeues_and_counts_a_nack(sim):
    job = sim.add()
    sim.node.get_jobs([b"q"], 1)
    assert sim.node.enqueue_jobs([job.id], nack=True) == 1
    assert (job.state, job.nacks, job.deliveries) == (QUEUED, 1, 0)
    assert sim.queued() == [job]


def test_enqueue_after_first_queueing_counts_a_delivery(sim):
    job = sim.add()
    sim.node.get_jobs([b"q"], 1)
    assert sim.node.enqueue_jobs([job.id], nack=False) == 1
    assert (job.state, job.nacks, job.deliveries) == (QUEUED, 0, 1)


def test_enqueue_then_nack_gives_one_delivery_and_one_nack(sim):
    job = sim.add()
    sim.node.get_jobs([b"q"], 1)
    sim.node.enqueue_jobs([job.id], nack=False)
    sim.node.get_jobs([b"q"], 1)
    sim.node.enqueue_jobs([job.id], nack=True)
    assert (job.deliveries, job.nacks) == (1, 1)


def test_enqueue_and_nack_ignore_queued_and_unknown_jobs(sim):
    job = sim.add()
    unknown = b"D-00000000-" + b"A" * 24 + b"-05a1"
    assert sim.node.enqueue_jobs([job.id, unknown], nack=False) == 0
    assert sim.node.enqueue_jobs([job.id, unknown], nack=True) == 0
    assert (job.deliveries, job.nacks) == (0, 0)


def test_enqueue_duplicate_ids_count_once(sim):
    job = sim.add()
    sim.node.get_jobs([b"q"], 1)
    assert sim.node.enqueue_jobs([job.id, job.id], nack=False) == 1
    assert job.deliveries == 1


def test_dequeue_moves_queued_to_active_once_and_keeps_the_timer(sim):
    job = sim.add(ttl=100, retry=5)
    awake, qtime = job.awake, job.qtime
    assert sim.node.dequeue_jobs([job.id, job.id]) == 1
    assert job.state == ACTIVE and sim.qlen() == 0
    assert (job.awake, job.qtime) == (awake, qtime)
    assert sim.node.lookup_queue(b"q").jobs_out == 0
    sim.advance(qtime + RES - sim.now)
    assert job.state == QUEUED and job.deliveries == 1


# ---------------------------------------------------------------------------------- ACK family


def test_ackjob_on_a_lone_node_deletes_and_counts_known_ids_once(sim):
    a, b = sim.add(), sim.add()
    unknown = b"D-00000000-" + b"A" * 24 + b"-05a1"
    assert sim.node.ackjob([a.id, a.id, unknown]) == 1
    assert sim.node.lookup_job(a.id) is None and sim.queued() == [b]
    assert len(sim.node.jobs) == 1  # no dummy ACK on a lone node
    assert a.state == ACKED


def test_fastack_and_deljob_delete_in_any_state(sim):
    a, b, c = sim.add(), sim.add(), sim.add(delay=10)
    sim.node.get_jobs([b"q"], 1)  # a active
    assert sim.node.fastack([a.id, b.id, a.id]) == 2
    assert sim.node.deljob([c.id, b.id]) == 1
    assert len(sim.node.jobs) == 0 and sim.qlen() == 0
    assert sim.node.used_memory() == BASE_MEMORY + QUEUE_MEMORY


# ---------------------------------------------------------------------------------- blocking


def test_blocked_waiters_are_served_in_arrival_order_one_job_each(sim):
    w1 = getjob(sim, [b"q"], count=5)
    w2 = getjob(sim, [b"q"], count=5)
    assert isinstance(w1, Rec) and isinstance(w2, Rec)
    assert sim.node.blocked == 2
    j1 = sim.add()
    assert w1.log == [("jobs", [j1.id])] and w2.log == []
    assert j1.state == ACTIVE and j1.flags & F_DELIVERED
    j2 = sim.add()
    j3 = sim.add()
    assert w2.log == [("jobs", [j2.id])]
    assert w1.log == [("jobs", [j1.id])]
    assert sim.queued() == [j3]
    assert sim.node.blocked == 0 and not sim.node.lookup_queue(b"q").waiters


def test_waiter_on_several_queues_is_served_by_the_first_job_and_leaves_all(sim):
    w = getjob(sim, [b"qa", b"qb"])
    j = sim.add(queue=b"qb")
    assert w.log == [("jobs", [j.id])]
    assert not sim.node.lookup_queue(b"qa").waiters
    assert not sim.node.lookup_queue(b"qb").waiters
    k = sim.add(queue=b"qa")
    assert k.state == QUEUED and w.log == [("jobs", [j.id])]


def test_waiter_times_out(sim):
    w = getjob(sim, [b"q"], timeout=1000)
    sim.advance(999)
    assert w.log == []
    sim.advance(RES)
    assert w.log == [("timeout",)]
    assert sim.node.blocked == 0 and not sim.node.lookup_queue(b"q").waiters
    sim.add()
    sim.advance(10_000)
    assert w.log == [("timeout",)] and sim.qlen() == 1


def test_waiter_without_timeout_waits_forever(sim):
    w = getjob(sim, [b"q"], timeout=0)
    sim.advance(3_600_000)
    assert w.log == [] and sim.node.blocked == 1


def test_unblock_on_disconnect_leaves_no_trace(sim):
    w = getjob(sim, [b"qa", b"qb"], timeout=500)
    sim.node.unblock(w)
    assert sim.node.blocked == 0 and w.timer is None
    assert not sim.node.lookup_queue(b"qa").waiters and not sim.node.lookup_queue(b"qb").waiters
    sim.advance(1000)
    j = sim.add(queue=b"qa")
    assert w.log == [] and j.state == QUEUED
    sim.node.unblock(w)  # twice is harmless
    assert sim.node.blocked == 0


def test_pause_out_blocks_and_lifting_it_serves_waiters(sim):
    sim.node.pause(b"q", PAUSE_OUT)
    j1 = sim.add()
    w = getjob(sim, [b"q"])
    assert isinstance(w, Rec) and w.log == []
    j2 = sim.add()
    assert w.log == [] and sim.queued() == [j1, j2]
    assert sim.node.pause(b"q", PAUSE_IN) == b"in"  # out lifted (in set)
    assert w.log == [("jobs", [j1.id])]
    assert sim.queued() == [j2]


def test_pause_returns_state_and_none_does_not_create_a_queue(sim):
    assert sim.node.pause(b"new", 0) == b"none"
    assert sim.node.lookup_queue(b"new") is None
    assert sim.node.pause(b"new", None) == b"none"
    assert sim.node.pause(b"new", PAUSE_IN | PAUSE_OUT) == b"all"
    assert sim.node.pause(b"new", None) == b"all"
    assert sim.node.pause(b"new", PAUSE_OUT) == b"out"
    assert sim.node.pause(b"new", 0) == b"none"
    assert sim.node.lookup_queue(b"new") is not None


def test_leaving_node_refuses_to_block_and_errors_blocked_waiters(sim):
    w = getjob(sim, [b"q"], timeout=1000)
    sim.node.set_leaving(True)
    msg = "This node is leaving the cluster, please connect to a different one"
    assert w.log == [("error", "LEAVING", msg)]
    assert sim.node.blocked == 0
    with pytest.raises(CommandError) as info:
        getjob(sim, [b"q"])
    assert info.value.prefix == "LEAVING"
    sim.advance(2000)
    assert w.log == [("error", "LEAVING", msg)]


# ---------------------------------------------------------------------------------- queue GC


def idle_queue(sim: Sim, name: bytes = b"q") -> None:
    job = sim.add(queue=name)
    sim.node.get_jobs([name], 1)
    sim.node.ackjob([job.id])


def test_empty_queue_is_evicted_after_queue_idle_timeout():
    sim = Sim(queue_idle_timeout=5)
    idle_queue(sim)
    sim.advance(5000 - 1)
    assert sim.node.lookup_queue(b"q") is not None
    sim.advance(2000)  # a full sweep of the queue table takes 16 x 100 ms
    assert sim.node.lookup_queue(b"q") is None


def test_idle_timer_restarts_on_fetch():
    sim = Sim(queue_idle_timeout=5)
    sim.add()
    sim.add()
    sim.advance(4000)
    sim.node.get_jobs([b"q"], 2)
    sim.advance(4000)
    assert sim.node.lookup_queue(b"q") is not None
    sim.advance(3000)
    assert sim.node.lookup_queue(b"q") is None


def test_non_empty_queue_is_never_evicted():
    sim = Sim(queue_idle_timeout=1)
    sim.add(ttl=1000)
    sim.advance(30_000)
    assert sim.qlen() == 1


def test_paused_queue_is_never_evicted():
    sim = Sim(queue_idle_timeout=1)
    sim.node.pause(b"q", PAUSE_IN)
    sim.advance(30_000)
    assert sim.node.lookup_queue(b"q") is not None


def test_queue_with_waiters_is_never_evicted():
    sim = Sim(queue_idle_timeout=1)
    w = getjob(sim, [b"q"])
    sim.advance(30_000)
    assert sim.node.lookup_queue(b"q") is not None
    j = sim.add()
    assert w.log == [("jobs", [j.id])]


def test_queue_idle_timeout_is_10s_at_memory_level_1():
    sim = Sim(queue_idle_timeout=300)
    idle_queue(sim)
    sim.node.maxmemory = sim.node.used_memory() * 100 // 80  # 80%: level 1
    assert sim.node.memory_level() == 1
    sim.advance(10_000 - 1)
    assert sim.node.lookup_queue(b"q") is not None
    sim.advance(2000)
    assert sim.node.lookup_queue(b"q") is None


def test_queue_idle_timeout_and_policy_set_at_run_time_reach_the_memory_subsystem():
    """CONFIG SET queue-idle-timeout / maxmemory-policy assign the node's attributes
    (disque.config_hooks): they must change what the memory subsystem does, not only what
    the node reports."""
    sim = Sim(queue_idle_timeout=300)
    idle_queue(sim)
    sim.node.queue_idle_timeout = 1
    assert sim.node.queue_idle_timeout == 1 and sim.node.memory.queue_idle_timeout == 1
    sim.advance(3000)  # (idle 1 s, and the GC's sample reaches every shard in 1.6 s)
    assert sim.node.lookup_queue(b"q") is None  # collected: 1 s, not 300
    sim.node.maxmemory_policy = "noeviction"
    assert sim.node.memory.maxmemory_policy == "noeviction"
    sim.node.add_job(b"q", b"x", 0, 1, None, None, 0, None, False)
    job = next(iter(sim.node.jobs.values()))
    sim.node.ackjob([job.id])  # (alone: deleted at once; add an acked copy to evict)
    sim.node.maxmemory = sim.node.used_memory()  # above 95%: a command must evict first
    assert not sim.node.ensure_memory()  # noeviction: refused, nothing evicted
    sim.node.maxmemory_policy = "acks"
    assert sim.node.memory.maxmemory_policy == "acks"


def test_an_idle_queue_is_collected_when_its_last_blocked_client_leaves():
    """Checklist 10 queue idle GC: "also tried when its last blocked client leaves"
    (original unblockClientBlockedForJobs -> GCQueue(q, QUEUE_MAX_IDLE_TIME)). disque-py's
    Node.unblock only drops the queue from `waiting_queues`; the queue waits for the
    sampled sweep."""
    sim = Sim()
    node = sim.node
    client = Rec([b"q"])
    node.block(client, 0)
    sim.advance(301_000)  # blocked (so not collectable) for more than 300 s
    assert node.lookup_queue(b"q") is not None
    client.cancel()  # the client disconnects: the queue is empty, idle 301 s, unblocked
    assert node.lookup_queue(b"q") is None


# ---------------------------------------------------------------------------------- memory


def test_used_memory_accounts_jobs_and_queues(sim):
    assert sim.node.used_memory() == BASE_MEMORY
    job = sim.add(body=b"x" * 100)
    assert sim.node.used_memory() == BASE_MEMORY + QUEUE_MEMORY + JOB_MEMORY + 100
    sim.node.ackjob([job.id])
    assert sim.node.used_memory() == BASE_MEMORY + QUEUE_MEMORY


@pytest.mark.parametrize("percent,level", [(50, 0), (75, 0), (76, 1), (95, 1), (96, 2),
                                           (100, 2), (101, 3)])
def test_memory_level_thresholds(sim, percent, level):
    used = sim.node.used_memory()
    # the smallest maxmemory for which used <= percent% of it
    sim.node.maxmemory = -(-used * 100 // percent)
    assert sim.node.memory_level() == level


def test_maxmemory_zero_means_unlimited(sim):
    sim.node.maxmemory = 0
    assert sim.node.memory_level() == 0
    assert sim.node.ensure_memory() is True


def test_ensure_memory_below_95_percent_allows_without_evicting(sim):
    job = sim.add(retry=0)
    sim.node.get_jobs([b"q"], 1)  # delivered at-most-once: evictable
    sim.node.maxmemory = sim.node.used_memory() * 100 // 90
    assert sim.node.ensure_memory() is True
    assert sim.node.lookup_job(job.id) is job


def fill_for_eviction(sim: Sim, n_evictable: int, n_kept: int) -> tuple[list[Job], list[Job]]:
    evictable = []
    for _ in range(n_evictable):
        evictable.append(sim.add(queue=b"amo", body=b"x" * 1000, retry=0))
    sim.node.get_jobs([b"amo"], n_evictable)
    kept = [sim.add(queue=b"alo", body=b"y" * 1000) for _ in range(n_kept)]
    kept += [sim.add(queue=b"amo2", body=b"z" * 1000, retry=0)]  # queued: not delivered
    return evictable, kept


def test_ensure_memory_evicts_delivered_at_most_once_jobs_down_to_95_percent(sim):
    evictable, kept = fill_for_eviction(sim, 20, 10)
    used = sim.node.used_memory()
    sim.node.maxmemory = used * 100 // 96  # level 2
    assert sim.node.memory_level() == 2
    assert sim.node.ensure_memory() is True
    assert sim.node.used_memory() * 100 <= sim.node.maxmemory * 95
    assert all(sim.node.lookup_job(j.id) is j for j in kept)
    gone = [j for j in evictable if sim.node.lookup_job(j.id) is None]
    assert 0 < len(gone) < len(evictable)  # only as much as needed


def test_evict_never_frees_jobs_a_consumer_may_still_need(sim):
    evictable, kept = fill_for_eviction(sim, 5, 5)
    freed = sim.node.evict(0)
    assert freed == 5
    assert all(sim.node.lookup_job(j.id) is None for j in evictable)
    assert all(sim.node.lookup_job(j.id) is j for j in kept)


def test_evict_drops_idle_empty_queues_when_jobs_are_not_enough(sim):
    idle_queue(sim, b"e1")
    sim.node.pause(b"p", PAUSE_IN)
    sim.add(queue=b"full")
    sim.advance(1000)
    idle_queue(sim, b"recent")  # used 1 s before the eviction: kept
    sim.advance(1000)
    sim.node.evict(0)
    assert sim.node.lookup_queue(b"recent") is not None
    assert sim.node.lookup_queue(b"e1") is None
    assert sim.node.lookup_queue(b"p") is not None
    assert sim.node.lookup_queue(b"full") is not None


def test_ensure_memory_refuses_above_maxmemory_when_nothing_is_evictable(sim):
    fill_for_eviction(sim, 0, 10)
    sim.node.maxmemory = sim.node.used_memory() - 1  # level 3
    assert sim.node.ensure_memory() is False


def test_ensure_memory_refuses_at_level_2_when_eviction_cannot_reach_95_percent(sim):
    # Checklist section 11 (original freeMemoryIfNeeded): at level >= 2 eviction targets
    # 95% of maxmemory and gives up with C_ERR -> -OOM for denyoom commands.
    fill_for_eviction(sim, 0, 10)
    sim.node.maxmemory = sim.node.used_memory() * 100 // 97  # level 2, nothing evictable
    assert sim.node.memory_level() == 2
    assert sim.node.ensure_memory() is False


def test_noeviction_policy_refuses_at_level_2():
    # Checklist section 11: "Policy noeviction -> -OOM immediately at level >= 2".
    sim = Sim(maxmemory_policy="noeviction")
    evictable, _ = fill_for_eviction(sim, 5, 5)
    sim.node.maxmemory = sim.node.used_memory() * 100 // 97
    assert sim.node.memory_level() == 2
    assert sim.node.ensure_memory() is False
    assert all(sim.node.lookup_job(j.id) is j for j in evictable)  # nothing evicted


def test_noeviction_policy_refuses_above_maxmemory():
    sim = Sim(maxmemory_policy="noeviction")
    evictable, _ = fill_for_eviction(sim, 5, 5)
    sim.node.maxmemory = sim.node.used_memory() - 1
    assert sim.node.ensure_memory() is False
    assert all(sim.node.lookup_job(j.id) is j for j in evictable)


def test_eviction_leaves_recently_used_empty_queues_alone():
    """Checklist 11: "With no jobs at all, idle queues are evicted instead" (original
    freeMemoryIfNeeded: evictIdleQueues() only when dictGetRandomKey(server.jobs) is NULL,
    and evictIdleQueues honours the idle time, 2 s at level 2). disque-py's Node.evict drops
    every empty unpaused queue without waiters, idle or not, whenever jobs could not free
    enough - here a queue used a moment ago (QSTAT counters, NEEDJOBS sources and import
    rate are lost). docs/commands.md "Memory limits" describes the queue step without an
    idle condition, but does not list it as a difference. Evicting queues while jobs exist
    (rather than only with no jobs) is kept: tests/unit/test_node.py asserts it."""
    node = Sim(maxmemory=1 << 30).node
    for _ in range(50):
        node.add_job(b"busy", b"x" * 1000, 0, 1, None, None, 0, None, False)  # queued
    node.add_job(b"fresh", b"y", 0, 1, None, None, 0, None, False)
    fetched = node.get_jobs([b"fresh"], 1)  # `fresh` is now empty, used just now
    assert len(fetched) == 1
    node.ackjob([fetched[0].id])  # alone: the acked job is deleted at once
    node.maxmemory = node.used_memory() + 10  # level 2: above 95%
    assert node.memory_level() >= 2
    assert not node.ensure_memory()  # nothing evictable among the jobs: -OOM
    assert node.lookup_queue(b"fresh") is not None


def test_eviction_gives_up_after_a_few_unevictable_samples():
    """Checklist 11: eviction "gives up after 10 consecutive unevictable samples or ~1 ms"
    (original freeMemoryIfNeeded: random samples, DISQUE_NOT_FREED_MAX_LEN). disque-py's
    Node.evict walks every shard of the registry before giving up, so above 95% of
    maxmemory with nothing evictable (all jobs queued / awaiting ACK) every ADDJOB, ENQUEUE
    and NACK costs a scan of all jobs before its -OOM."""
    node = Sim(maxmemory=1 << 30).node
    for _ in range(20_000):
        node.add_job(b"busy", b"x", 0, 1, None, None, 0, None, False)  # queued: unevictable
    node.maxmemory = node.used_memory() * 100 // 97  # level 2
    examined = 0
    cls = type(node.jobs)
    real_shard = cls.shard

    def counting_shard(self, i):
        nonlocal examined
        shard = real_shard(self, i)
        if self is node.jobs:
            examined += len(shard)
        return shard

    cls.shard = counting_shard  # type: ignore[method-assign]
    try:
        assert not node.ensure_memory()
    finally:
        cls.shard = real_shard  # type: ignore[method-assign]
    assert examined <= 1000, examined  # a bounded sample, not the 20,000 jobs


# ---------------------------------------------------------------------------------- flushall


def test_flushall_deletes_everything_and_times_out_waiters(sim):
    for _ in range(5):
        sim.add(queue=b"qa")
    sim.add(queue=b"qb", delay=10)
    w = getjob(sim, [b"qc"], timeout=5000)
    sim.node.flushall()
    assert len(sim.node.jobs) == 0 and len(sim.node.queues) == 0
    assert sim.node.blocked == 0
    assert sim.node.used_memory() == BASE_MEMORY
    assert w.log == [("timeout",)]
    sim.advance(20_000)  # stale timer entries are harmless
    assert w.log == [("timeout",)]
    job = sim.add()
    assert sim.queued() == [job]


# ---------------------------------------------------------------------------------- invariants


UNKNOWN_ID = b"D-00000000-" + b"A" * 24 + b"-05a1"


class NodeMachine(RuleBasedStateMachine):
    """Random client commands and time steps; the node's invariants must always hold."""

    def __init__(self) -> None:
        super().__init__()
        self.sim = Sim(seed=3, queue_idle_timeout=2)
        self.waiters: list[Rec] = []
        self.ids: list[bytes] = [UNKNOWN_ID]

    @rule(q=st.sampled_from([b"qa", b"qb"]), ttl=st.integers(1, 30),
          retry=st.one_of(st.none(), st.integers(0, 5)), delay=st.integers(0, 5))
    def add(self, q, ttl, retry, delay):
        try:
            job = self.sim.add(queue=q, ttl=ttl, retry=retry, delay=delay)
        except CommandError as e:
            assert e.prefix in ("ERR", "PAUSED")
            return
        self.ids.append(job.id)

    @rule(qs=st.lists(st.sampled_from([b"qa", b"qb"]), min_size=1, max_size=3),
          count=st.integers(1, 4), block=st.booleans(), timeout=st.integers(0, 3000))
    def getjob(self, qs, count, block, timeout):
        jobs = self.sim.node.get_jobs(qs, count)
        assert len(jobs) <= count
        for j in jobs:
            assert j.state == ACTIVE and j.flags & F_DELIVERED
        if not jobs and block:
            w = Rec(qs, count)
            self.sim.node.block(w, timeout)
            self.waiters.append(w)

    @precondition(lambda self: self.waiters)
    @rule(data=st.data())
    def disconnect(self, data):
        w = data.draw(st.sampled_from(self.waiters))
        self.sim.node.unblock(w)

    @rule(data=st.data(), op=st.sampled_from(
        ["ackjob", "fastack", "deljob", "enqueue", "nack", "dequeue", "working"]))
    def job_command(self, data, op):
        ids = data.draw(st.lists(st.sampled_from(self.ids), max_size=3))
        node = self.sim.node
        if op == "ackjob":
            node.ackjob(ids)
        elif op == "fastack":
            node.fastack(ids)
        elif op == "deljob":
            node.deljob(ids)
        elif op == "enqueue":
            node.enqueue_jobs(ids, nack=False)
        elif op == "nack":
            node.enqueue_jobs(ids, nack=True)
        elif op == "dequeue":
            node.dequeue_jobs(ids)
        else:
            for i in ids:
                try:
                    node.working(i)
                except CommandError as e:
                    assert e.prefix in ("NOJOB", "TOOLATE")

    @rule(q=st.sampled_from([b"qa", b"qb"]), flags=st.sampled_from([0, 1, 2, 3]))
    def pause(self, q, flags):
        self.sim.node.pause(q, flags)

    @rule(ms=st.integers(0, 8000))
    def advance(self, ms):
        self.sim.advance(ms)

    @invariant()
    def queued_iff_in_queue(self):
        node = self.sim.node
        in_queues = {}
        for q in node.queues.values():
            ctimes = [j.ctime for j in q.jobs]
            assert ctimes == sorted(ctimes)
            for j in q.jobs:
                assert j.queue == q.name
                in_queues[id(j)] = j
        registered = list(node.jobs.values())
        for j in registered:
            assert node.lookup_job(j.id) is j
            assert j.state in (ACTIVE, QUEUED)  # lone node: acked jobs are gone at once
            assert (j.state == QUEUED) == (id(j) in in_queues), j
            # expired jobs are gone, give or take the wheel's resolution: an entry fires at
            # most RES ms late (a job with TTL 2 added at T0+1 may still be there at T0+2001)
            assert j.etime > self.sim.now - RES
            assert j.awake, "every live job has a timer (at least its expiry)"
            if j.qtime == 0:
                assert j.retry == 0 and j.flags & F_BCAST_QUEUED
        assert len(in_queues) == sum(1 for j in registered if j.state == QUEUED)
        assert node.used_memory() == (BASE_MEMORY + len(node.queues) * QUEUE_MEMORY
                                      + sum(JOB_MEMORY + len(j.body) for j in registered))

    @invariant()
    def blocked_count_matches_waiters(self):
        node = self.sim.node
        blocked = set()
        for q in node.queues.values():
            for w in q.waiters:
                blocked.add(id(w))
                assert q.name in w.queues
            if q.waiters:
                assert not q.jobs or q.paused & PAUSE_OUT, "a job waits while a client blocks"
        assert node.blocked == len(blocked)
        for w in self.waiters:
            replies = len(w.log)
            assert replies <= 1, "a blocked client is answered once"
            if replies:
                assert id(w) not in blocked


def test_node_invariants_hold_under_random_commands_and_time():
    run_state_machine_as_test(
        NodeMachine, settings=settings(max_examples=60, stateful_step_count=40, deadline=None))


# ---------------------------------------------------------------------------- the timer wheel
# A job's wheel entry (its RETRY time, or its TTL when RETRY is 0: up to days away) must
# leave the wheel with the job: a wheel that kept deleted jobs until their time came held
# every acked job of the last RETRY seconds (5 minutes by default, a day at RETRY 0) in
# memory, unseen by used_memory and maxmemory (~450 B each: GBs on a busy node).

@pytest.mark.parametrize("retry", [None, 0])
def test_deleted_jobs_leave_the_timer_wheel(sim: Sim, retry: int | None) -> None:
    base = len(sim.node.wheel)  # the node's own timers
    for _ in range(500):
        sim.add(retry=retry)
        [job] = sim.node.get_jobs([b"q"], 1)
        sim.node.ack_job(job)  # a lone node collects an acked job a second later
        sim.advance(1)
    sim.advance(10_000)
    assert len(sim.node.jobs) == 0
    assert len(sim.node.wheel) == base
    for _ in range(200):  # and deleted while queued (DELJOB)
        sim.node.delete_job(sim.add(retry=retry))
    assert len(sim.node.wheel) == base


def test_a_served_blocked_client_leaves_no_timer_in_the_wheel(sim: Sim) -> None:
    base = len(sim.node.wheel)
    for _ in range(300):
        w = getjob(sim, [b"q"], timeout=3_600_000)  # an hour
        assert isinstance(w, Rec)
        sim.add()
        assert w.log and w.log[0][0] == "jobs"
        [jid] = w.log[0][1]
        sim.node.ack_job(sim.node.lookup_job(jid))
    sim.advance(10_000)  # the acked jobs collected; the hour-long timeouts still ahead
    assert len(sim.node.jobs) == 0
    assert len(sim.node.wheel) == base


def test_flushall_empties_the_timer_wheel_of_jobs(sim: Sim) -> None:
    base = len(sim.node.wheel)
    for _ in range(100):
        sim.add()
    sim.node.flushall()
    assert len(sim.node.wheel) == base
