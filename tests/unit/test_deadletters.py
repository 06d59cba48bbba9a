"""Dead-letter queues and redrive (disque.jobs.deadletter, disque.cluster.deadletters),
sans-I/O: one Node on a fake clock (the `Rig` of test_cluster_jobs.py), bus messages of its
peers fed straight into the handlers, the messages it sends read from its outbox.

What is checked, in the order of the module's doc: the limit arithmetic, dead-lettering by
the RETRY timer and by NACK (with and without DELAY), a dead job's own requeues, the epoch
exchange (adopt a newer state, answer a stale sender, tie-break equal ones), REDRIVE (task
rate, COUNT, RESET, by ID), DEADTTL, and the job's persistence form (AOF record)."""

from __future__ import annotations

import struct
from typing import Any

import msgpack
import pytest

from disque.cluster.deadletters import REDRIVE_TICK_MS, state_bits
from disque.cluster.messages import (
    QUEUED_INCR_DELIV,
    QUEUED_INCR_NACKS,
    QUEUED_RESET,
    QUEUED_STATE_ONLY,
    STATE_EPOCH_SHIFT,
    STATE_REASON_SHIFT,
    EnqueueJob,
    Queued,
    ReplJob,
    WillQueue,
    WorkingJob,
)
from disque.jobs.deadletter import (
    REASON_EXPIRED,
    REASON_MAX_DELIVERIES,
    REASON_MAX_NACKS,
    REASON_NONE,
    DeadLetter,
)
from disque.jobs.job import ACTIVE, QUEUED, Job
from disque.jobs.serialize import SerializeError, deserialize_job, serialize_job
from disque.timers import RES
from tests.unit.test_cluster_jobs import A, B, Rig, hdr, near, of, queued_pair, targets

DEAD = b"dead"


def policy(max_deliveries: int = 0, max_nacks: int = 0, *, deadttl: int = 0,
           epoch: int = 0, reason: int = REASON_NONE) -> DeadLetter:
    return DeadLetter(max_deliveries, max_nacks, DEAD, b"q", deadttl, epoch, reason)


def bits(epoch: int, reason: int = REASON_NONE) -> int:
    """A dead-letter state as QUEUED / WILLQUEUE carry it in aux."""
    return (epoch << STATE_EPOCH_SHIFT) | (reason << STATE_REASON_SHIFT)


def replica(r: Rig, dl: DeadLetter, *, queued: bool = False, **kw: Any) -> Job:
    """A copy held here after a REPLJOB from A carrying the policy `dl`."""
    rec = r.record(**kw)._replace(dl=dl)
    if dl.dead:
        rec = rec._replace(queue=DEAD)
    r.node.on_message(A, ReplJob(hdr(A), rec, False))
    job = r.node.lookup_job(rec.id)
    assert job is not None and job.dl == dl
    if queued:
        r.node.on_message(A, EnqueueJob(hdr(A), job.id, 0))
        assert job.state == QUEUED
    r.take()
    return job


def consumed(r: Rig, dl: DeadLetter, **kw: Any) -> Job:
    """A copy a consumer of this node took (active, requeue timer running)."""
    job = replica(r, dl, queued=True, **kw)
    (got,) = r.node.get_jobs([job.queue], 1)
    assert got is job and job.state == ACTIVE
    return job


def dead_here(r: Rig, **kw: Any) -> Job:
    """A job this node dead-lettered by a NACK (MAXNACKS 1), queued in DEAD."""
    job = consumed(r, policy(max_nacks=1), **kw)
    assert r.node.enqueue_jobs([job.id], nack=True) == 1
    assert job.state == QUEUED and job.queue == DEAD and job.dl.dead
    assert state_bits(job) == bits(1, REASON_MAX_NACKS)
    r.take()
    return job


# ---------------------------------------------------------------------------- the limit
@pytest.mark.parametrize(("max_deliveries", "max_nacks", "nacks", "deliveries", "nack", "want"), [
    (3, 0, 0, 1, False, REASON_NONE),  # delivered twice: a third delivery is allowed
    (3, 0, 0, 2, False, REASON_MAX_DELIVERIES),  # 1 + 0 + 2 = 3 deliveries done
    (3, 0, 1, 1, False, REASON_MAX_DELIVERIES),  # nacks count as deliveries
    (3, 0, 1, 1, True, REASON_MAX_DELIVERIES),  # ...also on a NACK without MAXNACKS
    (1, 0, 0, 0, False, REASON_MAX_DELIVERIES),  # MAXDELIVERIES 1: never redelivered
    (0, 2, 0, 0, True, REASON_NONE),  # the first NACK of MAXNACKS 2
    (0, 2, 1, 0, True, REASON_MAX_NACKS),  # the second one
    (0, 2, 5, 9, False, REASON_NONE),  # a timer requeue never counts against MAXNACKS
    (3, 2, 1, 5, True, REASON_MAX_NACKS),  # both reached on a NACK: MAXNACKS names it
    (0, 0, 100, 100, True, REASON_NONE),  # no limit
])
def test_over_limit_counts_1_plus_nacks_plus_deliveries_and_the_nth_nack(
        max_deliveries: int, max_nacks: int, nacks: int, deliveries: int, nack: bool,
        want: int) -> None:
    assert policy(max_deliveries, max_nacks).over_limit(nacks, deliveries, nack) == want


def test_a_dead_job_is_never_over_its_limit() -> None:
    dead = policy(1, 1).moved(1, REASON_MAX_NACKS, 5)
    assert dead.dead and dead.current_queue() == DEAD
    assert dead.over_limit(100, 100, True) == REASON_NONE
    alive = dead.moved(2, REASON_NONE, 6)
    assert not alive.dead and alive.current_queue() == b"q"
    assert (alive.reason, alive.dead_at) == (REASON_NONE, 0)


# ---------------------------------------------------------------------------- dead-lettering
def test_the_retry_timer_of_a_job_at_its_limit_dead_letters_it_and_tells_the_holders() -> None:
    r = Rig(peers=(A, B))
    job = replica(r, policy(max_deliveries=2), retry=5, delivered=(A, B, r.node.myself))
    job.deliveries = 1  # delivered twice already: 1 + 0 + 1
    r.advance(job.qtime - r.now + RES)
    assert job.state == QUEUED and job.queue == DEAD
    assert r.qlen(b"q") == 0 and r.qlen(DEAD) == 1
    assert job.deliveries == 1  # going to the dead-letter queue is no delivery
    dl = job.dl
    assert (dl.epoch, dl.reason, dl.source) == (1, REASON_MAX_DELIVERIES, b"q")
    assert near(dl.dead_at, r.now, RES + 1)
    out = of(r.take(), Queued)
    assert sorted(n for n, _ in out) == [A, B]
    assert all(m.aux == bits(1, REASON_MAX_DELIVERIES) for _, m in out)
    assert r.node.deadletters.deadlettered == 1
    assert r.node.deadletters.by_queue == {b"q": 1}


def test_the_retry_timer_of_a_job_under_its_limit_requeues_it_as_usual() -> None:
    r = Rig(peers=(A, B))
    job = replica(r, policy(max_deliveries=3), retry=5)
    job.deliveries = 1
    r.advance(job.qtime - r.now + RES)
    assert job.state == QUEUED and job.queue == b"q" and job.deliveries == 2
    assert not job.dl.dead and r.node.deadletters.deadlettered == 0
    assert [m.aux for _, m in of(r.take(), Queued)] == [QUEUED_INCR_DELIV]


def test_the_nth_nack_dead_letters_the_job_counting_the_nack() -> None:
    r = Rig(peers=(A, B))
    job = consumed(r, policy(max_nacks=2), delivered=(A, B, r.node.myself))
    assert r.node.enqueue_jobs([job.id], nack=True) == 1  # the first: back to q
    assert (job.queue, job.nacks, job.dl.epoch) == (b"q", 1, 0)
    r.take()
    r.node.get_jobs([b"q"], 1)
    assert r.node.enqueue_jobs([job.id], nack=True) == 1
    assert (job.state, job.queue, job.nacks) == (QUEUED, DEAD, 2)
    assert (job.dl.epoch, job.dl.reason) == (1, REASON_MAX_NACKS)
    assert r.qlen(b"q") == 0 and r.qlen(DEAD) == 1
    out = of(r.take(), Queued)
    assert targets(out, Queued) == [A, B]
    assert all(m.aux == QUEUED_INCR_NACKS | bits(1, REASON_MAX_NACKS) for _, m in out)


def test_a_nack_delay_over_the_limit_dead_letters_at_once_not_after_the_delay() -> None:
    r = Rig(peers=(A, B))
    job = consumed(r, policy(max_nacks=1), delivered=(A, B, r.node.myself))
    assert r.node.nack_jobs([job.id], delay=30) == 1
    assert (job.state, job.queue, job.nacks) == (QUEUED, DEAD, 1)
    out = r.take()
    assert of(out, WorkingJob) == []  # no delay announced: the job is dead, queued now
    assert all(m.aux == QUEUED_INCR_NACKS | bits(1, REASON_MAX_NACKS)
               for _, m in of(out, Queued))


def test_a_nack_delay_under_the_limit_waits_the_delay_in_the_source_queue() -> None:
    r = Rig(peers=(A, B))
    job = consumed(r, policy(max_nacks=2), delivered=(A, B, r.node.myself))
    assert r.node.nack_jobs([job.id], delay=30) == 1
    assert (job.state, job.queue, job.nacks) == (ACTIVE, b"q", 1)
    assert [m.aux for _, m in of(r.take(), WorkingJob)] == [30, 30]
    r.advance(30_000)
    assert (job.state, job.queue) == (QUEUED, b"q") and not job.dl.dead


def test_a_dead_job_s_retry_requeues_it_into_the_dead_letter_queue_without_dying_again() -> None:
    r = Rig(peers=(A, B))
    job = dead_here(r, retry=5)
    (got,) = r.node.get_jobs([DEAD], 1)
    assert got is job
    r.advance(job.qtime - r.now + RES)
    assert (job.state, job.queue, job.dl.epoch) == (QUEUED, DEAD, 1)
    assert job.deliveries == 1 and r.node.deadletters.deadlettered == 1
    assert all(m.aux == QUEUED_INCR_DELIV | bits(1, REASON_MAX_NACKS)
               for _, m in of(r.take(), Queued))
    # a NACK of the dead job also puts it back where it is, whatever MAXNACKS says
    r.node.get_jobs([DEAD], 1)
    assert r.node.enqueue_jobs([job.id], nack=True) == 1
    assert (job.state, job.queue, job.dl.epoch, job.nacks) == (QUEUED, DEAD, 1, 2)
    assert r.qlen(b"q") == 0 and r.node.deadletters.deadlettered == 1


@pytest.mark.parametrize(("ttl", "deadttl", "extended"), [
    (60, 3600, True), (7200, 3600, False), (60, 0, False)])
def test_deadttl_extends_the_life_of_a_dead_job_only_if_longer(ttl: int, deadttl: int,
                                                              extended: bool) -> None:
    r = Rig()
    job = consumed(r, policy(max_nacks=1, deadttl=deadttl), ttl=ttl, retry=5)
    etime = job.etime
    r.now += 1000
    r.node.enqueue_jobs([job.id], nack=True)
    assert job.queue == DEAD
    assert job.etime == (r.now + deadttl * 1000 if extended else etime)
    r.advance(ttl * 1000)  # the TTL it was added with ends
    assert (r.node.lookup_job(job.id) is not None) == extended


# ---------------------------------------------------------------------------- the exchange
def test_queued_with_a_newer_epoch_is_adopted_the_copy_kept_as_a_backup() -> None:
    r = Rig(peers=(A, B))
    job = replica(r, policy(max_nacks=2, deadttl=7200), queued=True, retry=20, ttl=600)
    r.now += 3000
    r.node.on_message(B, Queued(hdr(B), job.id, QUEUED_INCR_NACKS | bits(1, REASON_MAX_NACKS)))
    # out of the source queue, renamed, active; its timer requeues it into the new queue
    assert (job.state, job.queue) == (ACTIVE, DEAD) and r.qlen(b"q") == 0
    assert (job.dl.epoch, job.dl.reason, job.dl.dead_at) == (1, REASON_MAX_NACKS, r.now)
    assert job.nacks == 1 and near(job.qtime, r.now + 20_000)
    assert job.etime == r.now + 7200_000  # DEADTTL applies on every holder
    assert r.take() == [] and r.node.deadletters.deadlettered == 0  # B counted it
    r.advance(job.qtime - r.now + RES)
    assert (job.state, job.queue) == (QUEUED, DEAD) and r.qlen(b"q") == 0


def test_willqueue_with_a_newer_epoch_is_adopted_and_not_answered() -> None:
    r = Rig(peers=(A, B))
    job = replica(r, policy(max_deliveries=2), queued=True)
    r.node.on_message(B, WillQueue(hdr(B), job.id, bits(1, REASON_MAX_DELIVERIES)))
    assert (job.state, job.queue, job.dl.epoch) == (ACTIVE, DEAD, 1)
    assert r.take() == []  # the usual QUEUED answer would tell B an older state


def test_a_stale_sender_is_answered_with_our_state_only_and_then_adopts_it() -> None:
    dl = policy(max_nacks=1)
    fresh, stale = Rig(peers=(A, B)), Rig(peers=(A, B), myself=B)
    job = dead_here(fresh, retry=30, delivered=(A, B, fresh.node.myself))
    # the stale holder still has the job alive in q (it missed the QUEUED), and queues it
    rec = fresh.record(job_id=job.id, retry=30, delivered=(A, B, fresh.node.myself))
    stale.node.on_message(A, ReplJob(hdr(A), rec._replace(dl=dl), False))
    copy = stale.node.lookup_job(job.id)
    stale.node.on_message(A, EnqueueJob(hdr(A), job.id, 0))
    stale.take()
    fresh.node.on_message(B, Queued(hdr(B), job.id, QUEUED_INCR_DELIV))
    # the fresh side keeps its dead copy queued, counts nothing, tells B its state
    assert (job.state, job.queue, job.deliveries) == (QUEUED, DEAD, 0)
    ((to, answer),) = fresh.take()
    assert to == B and type(answer) is Queued
    assert answer.aux == QUEUED_STATE_ONLY | bits(1, REASON_MAX_NACKS)
    # the stale side adopts it: out of q, no tie-break (STATE_ONLY: nobody queued it there)
    stale.node.on_message(fresh.node.myself, answer)
    assert (copy.state, copy.queue, copy.dl.epoch) == (ACTIVE, DEAD, 1)
    assert stale.qlen(b"q") == 0 and stale.qlen(DEAD) == 0 and stale.take() == []
    # a WILLQUEUE of a stale holder gets the same answer
    fresh.node.on_message(B, WillQueue(hdr(B), job.id, bits(0)))
    assert [m.aux for _, m in fresh.take()] == [QUEUED_STATE_ONLY | bits(1, REASON_MAX_NACKS)]


def test_two_holders_dead_lettering_at_once_keep_one_queued_copy_by_the_tie_break() -> None:
    rec = Rig().record(retry=30)
    winner, loser = queued_pair(rec.id)
    rigs: dict[bytes, tuple[Rig, Job]] = {}
    for me, other in ((winner, loser), (loser, winner)):
        r = Rig(peers=(A, other), myself=me)
        r.node.on_message(A, ReplJob(hdr(A), rec._replace(delivered=(A, winner, loser),
                                                          dl=policy(max_deliveries=1)), True))
        job = r.node.lookup_job(rec.id)
        r.advance(job.qtime - r.now + RES)  # both RETRY timers end: both dead-letter it
        assert (job.state, job.queue, job.dl.epoch) == (QUEUED, DEAD, 1)
        rigs[me] = (r, job)
    for me, other in ((winner, loser), (loser, winner)):
        r, job = rigs[me]
        r.node.on_message(other, Queued(hdr(other), job.id, bits(1, REASON_MAX_DELIVERIES)))
    r, job = rigs[winner]
    assert job.state == QUEUED and r.qlen(DEAD) == 1
    r, job = rigs[loser]
    assert (job.state, job.queue) == (ACTIVE, DEAD) and r.qlen(DEAD) == 0


def test_a_dead_job_queued_here_asks_its_holders_again_at_each_requeue_time() -> None:
    """Nobody need consume a dead-letter queue: without a consumer, copies both sides of a
    partition dead-lettered would stay queued on both. At each requeue time the queued dead
    copy sends WILLQUEUE with its state, so a queued holder answers QUEUED (tie-break)."""
    r = Rig(peers=(A, B))
    job = dead_here(r, retry=5, delivered=(A, B, r.node.myself))
    for _ in range(2):
        r.advance(job.qtime - r.now + RES)
        assert job.state == QUEUED
        out = r.take()
        assert targets(out, WillQueue) == [A, B] and len(out) == 2
        assert all(m.aux == bits(1, REASON_MAX_NACKS) for _, m in out)
    # an alive job queued here stays silent, as in the original
    alive = replica(r, policy(max_nacks=5), queued=True, retry=5)
    r.advance(alive.qtime - r.now + RES)
    assert [m for _, m in r.take() if m.job_id == alive.id] == []


def test_a_holder_telling_its_state_is_added_to_the_job_s_holders() -> None:
    """A QUEUED from a node the job's list lacks (a copy sent by NEEDJOBS, re-replicated):
    our own WILLQUEUE / QUEUED must reach it too, or its duplicate never learns it lost."""
    r = Rig(peers=(A, B))
    job = dead_here(r, retry=5, delivered=(A, r.node.myself))
    r.node.on_message(B, Queued(hdr(B), job.id, bits(1, REASON_MAX_NACKS)))
    assert B in job.delivered


def test_a_job_without_a_policy_ignores_a_state_it_cannot_adopt() -> None:
    r = Rig(peers=(A, B))
    job = r.queued_replica()
    r.node.on_message(B, Queued(hdr(B), job.id, bits(1, REASON_MAX_NACKS)))
    assert job.dl is None and job.queue == b"q" and r.take() == []


# ---------------------------------------------------------------------------- REDRIVE
def dead_jobs(r: Rig, n: int) -> list[Job]:
    return [dead_here(r, retry=60) for _ in range(n)]


def test_the_redrive_task_moves_rate_jobs_a_second_in_100_ms_steps_oldest_first() -> None:
    r = Rig(peers=(A, B))
    jobs = dead_jobs(r, 25)
    plain = r.node.add_job(DEAD, b"added directly", 0, 1, None, None, 0, None, False)
    dl = r.node.deadletters
    assert dl.redrive(DEAD, None, 50, False) == 26  # at most what is queued there now
    moved = []
    for _ in range(5):
        r.advance(REDRIVE_TICK_MS)
        moved.append(r.qlen(b"q"))
    assert moved == [5, 10, 15, 20, 25]  # 50/s: 5 jobs a tick
    assert [j.id for j in r.node.lookup_queue(b"q").jobs] == [j.id for j in jobs]
    assert all((j.queue, j.dl.epoch, j.nacks) == (b"q", 2, 1) for j in jobs)
    r.advance(REDRIVE_TICK_MS)
    assert dl.tasks == {} and dl.pending() == 0 and dl.redriven == 25
    assert plain.state == QUEUED and r.qlen(DEAD) == 1  # never dead: left where it is
    out = of(r.take(), Queued)
    assert out and all(m.aux == bits(2) for _, m in out)


def test_redrive_count_reset_and_a_replacing_task() -> None:
    r = Rig()
    jobs = dead_jobs(r, 6)
    dl = r.node.deadletters
    assert dl.redrive(DEAD, 2, 1000, True) == 2
    assert dl.pending() == 2
    assert dl.redrive(DEAD, 4, 10, True) == 4  # a new REDRIVE of the queue replaces it
    assert dl.pending() == 4
    r.advance(REDRIVE_TICK_MS)
    assert r.qlen(b"q") == 1 and dl.pending() == 3
    r.advance(3 * REDRIVE_TICK_MS)
    assert r.qlen(b"q") == 4 and r.qlen(DEAD) == 2 and dl.tasks == {}
    assert [(j.nacks, j.deliveries) for j in jobs[:4]] == [(0, 0)] * 4
    assert dl.redrive(b"no-such-queue", None, 10, False) == 0 and dl.tasks == {}


def test_redrive_ids_moves_dead_jobs_of_that_queue_only_and_resets_everywhere() -> None:
    r = Rig(peers=(A, B))
    job, other = dead_jobs(r, 2)
    alive = r.queued_replica()
    dl = r.node.deadletters
    unknown = r.ids.new_id(60, 1)
    assert dl.redrive_ids(b"q", [job.id], True) == 0  # not a job of that queue
    assert dl.redrive_ids(DEAD, [job.id, alive.id, unknown], True) == 1
    assert (job.state, job.queue, job.nacks, job.dl.epoch) == (QUEUED, b"q", 0, 2)
    assert job.dl.reason == REASON_NONE and job.dl.dead_at == 0
    assert other.queue == DEAD and alive.queue == b"q"
    (aux,) = {m.aux for _, m in of(r.take(), Queued)}
    assert aux == QUEUED_RESET | bits(2)
    # a holder adopting a redrive that reset the counters resets its own
    r2 = Rig(peers=(A, B), myself=B)
    copy = replica(r2, policy(max_nacks=1, epoch=1, reason=REASON_MAX_NACKS), queued=True)
    copy.nacks = 1
    r2.node.on_message(A, Queued(hdr(A), copy.id, aux))
    assert (copy.state, copy.queue, copy.nacks, copy.dl.epoch) == (ACTIVE, b"q", 0, 2)


def test_a_redriven_job_can_be_dead_lettered_again_in_a_new_epoch() -> None:
    r = Rig()
    (job,) = dead_jobs(r, 1)
    assert r.node.deadletters.redrive_ids(DEAD, [job.id], False) == 1
    r.node.get_jobs([b"q"], 1)
    r.node.enqueue_jobs([job.id], nack=True)  # counters kept: straight back
    assert (job.queue, job.dl.epoch, job.dl.epoch // 2) == (DEAD, 3, 1)


# ---------------------------------------------------------------------------- persistence
def test_a_job_with_a_policy_round_trips_through_its_aof_record() -> None:
    r = Rig()
    (job,) = dead_jobs(r, 1)
    data = serialize_job(job)
    back, end = deserialize_job(data)
    assert end == len(data)
    assert back.dl == job.dl and back.dl is not job.dl
    assert (back.id, back.queue, back.body, back.nacks) == (job.id, DEAD, job.body, 1)
    # a job without one is laid out as the original's: no extra field
    plain = r.queued_replica()
    assert deserialize_job(serialize_job(plain))[0].dl is None
    plain.dl = job.dl
    assert len(serialize_job(plain)) > len(serialize_job(r.queued_replica()))


def test_a_bad_dead_letter_field_in_an_aof_record_is_a_serialize_error() -> None:
    r = Rig()
    (job,) = dead_jobs(r, 1)
    dl, job.dl = job.dl, None
    plain = serialize_job(job)[4:]  # the record without its length and without the field

    def with_field(field: bytes) -> bytes:
        rest = plain + struct.pack("<I", len(field)) + field
        return struct.pack("<I", len(rest)) + rest

    assert deserialize_job(with_field(msgpack.packb(dl.to_wire())))[0].dl == dl
    for bad in ([1, 2], [0, 0, b"", b"q", 0, 0, 0, 0], [0, 0, DEAD, b"q", -1, 0, 0, 0],
                [0, 0, DEAD, b"q", 0, 1 << 40, 0, 0], [0, 0, DEAD, b"q", 0, 1, 9, 0],
                [0, 0, DEAD, "q", 0, 1, 1, 0]):
        with pytest.raises(SerializeError, match="dead-letter"):
            deserialize_job(with_field(msgpack.packb(bad)))
    with pytest.raises(SerializeError, match="dead-letter"):
        deserialize_job(with_field(b"\xc1"))  # not msgpack
    rest = plain + struct.pack("<I", 99) + b"\x90"  # a length saying more than there is
    with pytest.raises(SerializeError, match="inconsistent"):
        deserialize_job(struct.pack("<I", len(rest)) + rest)


@pytest.mark.parametrize(("backoff", "delivery", "random", "seconds"), [
    (0, 5, 0.9, 0),  # no BACKOFF: a NACK requeues at once
    (300, 1, 0.0, 1), (300, 1, 0.999, 1),  # ceil(1 x [0.5, 1))
    (300, 2, 0.0, 1), (300, 2, 0.999, 2),
    (300, 4, 0.0, 4), (300, 4, 0.5, 6), (300, 4, 0.999, 8),
    (10, 9, 0.0, 5), (10, 9, 0.999, 10),  # capped at BACKOFF before the jitter
    (10, 10_000, 0.5, 8),  # huge delivery counts do not overflow
    (300, 0, 0.0, 1),  # a count of 0 (cannot happen) is the first delivery
])
def test_backoff_delay_doubles_per_delivery_up_to_the_cap_with_jitter(
        backoff: int, delivery: int, random: float, seconds: int) -> None:
    dl = DeadLetter(0, 0, DEAD, b"q", backoff=backoff)
    assert dl.backoff_delay(delivery, random) == seconds


def test_backoff_travels_as_a_9th_field_only_when_set() -> None:
    plain = DeadLetter(1, 2, DEAD, b"q", 60)
    assert len(plain.to_wire()) == 8 and DeadLetter.from_wire(plain.to_wire()) == plain
    with_backoff = DeadLetter(1, 2, DEAD, b"q", 60, backoff=30)
    assert with_backoff.to_wire()[8:] == [30]
    assert DeadLetter.from_wire(with_backoff.to_wire()).backoff == 30
    moved = with_backoff.moved(1, REASON_MAX_NACKS, 5)
    assert moved.backoff == 30 and moved.moved(2, REASON_NONE, 6).backoff == 30
    for bad in (-1, 315360001, "1"):
        with pytest.raises(ValueError, match="backoff"):
            DeadLetter.from_wire([1, 2, DEAD, b"q", 60, 0, 0, 0, bad])


def test_a_nack_without_delay_of_a_backoff_job_is_a_nack_delay_of_its_backoff() -> None:
    r = Rig()
    job = r.queued_replica()
    job.dl = DeadLetter(0, 0, DEAD, b"q", backoff=300)
    job.nacks, job.deliveries = 2, 1  # this is its 4th delivery: 2^3 s x [0.5, 1)
    r.node.dequeue(job)
    now = r.now
    assert r.node.nack_jobs([job.id]) == 1
    assert job.state == ACTIVE and job.nacks == 3
    assert now + 4000 <= job.qtime <= now + 8000
    # DELAY 0 given: at once, whatever the backoff
    r.node.enqueue(job)
    r.node.dequeue(job)
    assert r.node.nack_jobs([job.id], delay=0) == 1 and job.state == QUEUED


# ---------------------------------------------------------------------------- expiry (#95)
def test_a_queued_job_whose_ttl_ends_is_dead_lettered_with_a_deadttl() -> None:
    r = Rig(peers=(A, B))
    job = replica(r, policy(deadttl=600), queued=True, retry=20, ttl=60)
    r.advance(job.etime - r.now + RES)
    assert (job.state, job.queue) == (QUEUED, DEAD) and r.qlen(b"q") == 0
    assert (job.dl.epoch, job.dl.reason) == (1, REASON_EXPIRED)
    assert near(job.etime, r.now + 600_000, 2 * RES)
    assert r.node.deadletters.deadlettered == 1
    # the other holders are told, with the new state
    assert {to for to, m in r.take() if type(m) is Queued and m.aux & bits(1)} >= {A}


def test_an_active_copy_whose_ttl_ends_moves_as_a_backup_and_requeues_into_the_dlq() -> None:
    r = Rig(peers=(A, B))
    # a backup copy, not queued (its RETRY would end after its TTL)
    job = replica(r, policy(deadttl=600), retry=100, ttl=60)
    r.advance(job.etime - r.now + RES)
    assert (job.state, job.queue, job.dl.reason) == (ACTIVE, DEAD, REASON_EXPIRED)
    assert r.qlen(DEAD) == 0 and r.node.deadletters.deadlettered == 0
    assert near(job.qtime, r.now + 100_000, 250 + RES)
    r.advance(job.qtime - r.now + RES)  # nobody queued it meanwhile: into the DLQ here
    assert (job.state, job.queue) == (QUEUED, DEAD) and r.qlen(b"q") == 0


@pytest.mark.parametrize("case", ["no-deadttl", "dead", "at-most-once-delivered"])
def test_other_jobs_whose_ttl_ends_expire(case: str) -> None:
    r = Rig()
    if case == "no-deadttl":
        job = replica(r, policy(max_nacks=3), queued=True, retry=20, ttl=60)
    elif case == "dead":
        job = dead_here(r, ttl=60, retry=20)
        job.dl = job.dl.moved(1, REASON_MAX_NACKS, r.now)
    else:  # RETRY 0 delivered: queueing it again could deliver it twice
        job = consumed(r, policy(deadttl=600), retry=0, ttl=60)
    r.advance(job.etime - r.now + RES)
    assert r.node.lookup_job(job.id) is None and r.qlen(DEAD) == 0
