"""The replicated write path's shortcuts (issue 12) give what the plain steps give.

A replica handles the jobs of one REPLJOB frame together (`hold_copies`: their queue and
`delivered` list worked out once, each copy built and scheduled inline); these tests hold
it to what one REPLJOB at a time does: the same fields, timers, answers and refusals, for
a frame mixing queues, paused queues and copies already held.
"""

from __future__ import annotations

from disque.cluster.jobs import job_from_record
from disque.cluster.messages import GotJob, GotJobBatch, ReplJob, ReplJobBatch
from disque.jobs.job import ACTIVE, JOB_MEMORY, Job
from disque.queues.queue import PAUSE_IN
from tests.unit.test_cluster_jobs import ME, A, B, Rig, hdr

FIELDS = [s for s in Job.__slots__ if s not in ("awake", "qtime")]


def fields(job: Job) -> dict[str, object]:
    return {s: getattr(job, s) for s in FIELDS}


def test_a_frame_of_repljobs_holds_the_same_copies_as_one_repljob_at_a_time() -> None:
    batch, single = Rig(seed=3), Rig(seed=3)
    recs = [batch.record(queue=q, retry=r, delay=d, delivered=dv)
            for q, r, d, dv in ((b"q1", 10, 0, (A, ME)), (b"q2", 0, 0, (A, ME)),
                                (b"q1", 10, 5, (A, B)), (b"q3", 7, 0, (A, B, ME)),
                                (b"q2", 10, 0, ()))]
    batch.node.on_message(A, ReplJobBatch(hdr(A), recs, False))
    for rec in recs:
        single.node.on_message(A, ReplJob(hdr(A), rec, False))
    [(to, reply)] = batch.take()
    assert to == A and type(reply) is GotJobBatch and reply.items == [r.id for r in recs]
    assert [m.job_id for _, m in single.take()] == [r.id for r in recs]
    for rec in recs:
        b, s = batch.node.lookup_job(rec.id), single.node.lookup_job(rec.id)
        assert b is not None and s is not None
        assert fields(b) == fields(s)
        assert b.state == ACTIVE and ME in b.delivered
        # the timer: WILLQUEUE 500 ms before the requeue when another node may hold it
        if rec.retry:
            assert b.qtime - (rec.delay + rec.retry) * 1000 - batch.now in range(-250, 250)
            assert b.awake == min(b.qtime - (500 if len(b.delivered) > 1 else 0), b.etime)
        else:
            assert b.qtime == 0 and b.awake == b.etime
        assert fields(b) == fields(job_from_record(rec, batch.now, None, b.delivered))
    assert len(batch.node.jobs) == len(recs)
    assert batch.node.mem_used == single.node.mem_used
    assert sum(JOB_MEMORY + len(r.body) for r in recs) == \
        batch.node.mem_used - Rig().node.mem_used


def test_a_frame_skips_the_jobs_of_a_paused_queue_and_merges_copies_already_held() -> None:
    rig = Rig()
    rig.node.pause(b"paused", PAUSE_IN)
    held = rig.replica(queue=b"q", delivered=(A, ME))
    again = rig.record(queue=b"q", delivered=(A, B, ME), job_id=held.id)
    refused = rig.record(queue=b"paused")
    new = rig.record(queue=b"q", delivered=(A, B, ME))
    before = rig.node.mem_used
    rig.node.on_message(A, ReplJobBatch(hdr(A), [again, refused, new], False))
    [(_, reply)] = rig.take()
    assert reply.items == [held.id, new.id]  # no GOTJOB for the paused queue's job
    assert rig.node.lookup_job(refused.id) is None
    assert rig.node.lookup_job(held.id) is held and held.delivered == (A, ME, B)
    assert rig.node.mem_used == before + JOB_MEMORY + len(new.body)
    assert len(rig.node.jobs) == 2


def test_a_frame_of_one_held_job_is_answered_with_one_gotjob_and_noreply_with_none() -> None:
    rig = Rig()
    rig.node.on_message(A, ReplJobBatch(hdr(A), [rig.record(), rig.record()], True))
    assert rig.take() == [] and len(rig.node.jobs) == 2
    rig.node.pause(b"paused", PAUSE_IN)
    rec = rig.record()
    rig.node.on_message(A, ReplJobBatch(hdr(A), [rig.record(queue=b"paused"), rec], False))
    [(_, reply)] = rig.take()
    assert type(reply) is GotJob and reply.job_id == rec.id


def test_a_replica_above_75_percent_of_maxmemory_refuses_a_frame() -> None:
    rig = Rig(maxmemory=4 * 1024 * 1024)
    rig.node.mem_used = 3 * 1024 * 1024 + 1
    rig.node.on_message(A, ReplJobBatch(hdr(A), [rig.record(), rig.record()], False))
    rig.node.on_message(A, ReplJob(hdr(A), rig.record(), False))
    assert rig.take() == [] and len(rig.node.jobs) == 0
    rig.node.mem_used = 3 * 1024 * 1024
    rig.node.on_message(A, ReplJob(hdr(A), rig.record(), False))
    assert len(rig.take()) == 1
