"""The replicated write path's shortcuts (issue 12) give what the plain steps give.

A replica handles the jobs of one REPLJOB frame together (`hold_copies`: their queue and
`delivered` list worked out once, each copy built and scheduled inline); these tests hold
it to what one REPLJOB at a time does: the same fields, timers, answers and refusals, for
a frame mixing queues, paused queues and copies already held.
"""

from __future__ import annotations

from disque.cluster.messages import (
    FrameDecoder,
    GotJob,
    GotJobBatch,
    ReplJob,
    ReplJobBatch,
    encode_many,
)
from disque.cluster.records import job_from_record
from disque.cluster.replication import REPL_RETRY_MS
from disque.jobs.job import ACTIVE, JOB_MEMORY, WAIT_REPL, Job
from disque.queues.queue import PAUSE_IN
from disque.timers import RES
from tests.unit.test_cluster_jobs import ME, A, B, C, D, Rig, hdr, targets

# (a compiled Job has no __slots__: mypyc lists its fields in __mypyc_attrs__)
FIELDS = [s for s in getattr(Job, "__slots__", None) or Job.__mypyc_attrs__  # type: ignore[attr-defined]
          if s not in ("awake", "qtime")]


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


# ---------------------------------------------------------------------------- ReplTimer
def test_sync_addjobs_of_one_retry_window_share_one_timer_entry() -> None:
    r = Rig(peers=(A, B, C, D))
    r.advance(REPL_RETRY_MS - r.now % REPL_RETRY_MS)  # the start of a window
    start = r.now
    wheel_before = len(r.node.wheel)
    jobs = [r.add_sync(replicate=3, timeout=1000) for _ in range(3)]
    r.now += REPL_RETRY_MS - 1  # later in the same window, another timeout: same timer
    other, _ = r.add_sync(replicate=3, timeout=2000)
    # one replication timer, and no expiry entries: each ADDJOB times out before its TTL
    assert len(r.node.wheel) - wheel_before == 1
    r.take()
    # one job is replicated, one client goes away, one stays short: the shared timer
    # keeps ticking for the one left (one more node every 50 ms), then times it out
    done, done_client = jobs[0]
    for n in done.delivered[1:]:
        r.node.on_message(n, GotJob(hdr(n), done.id))
    assert done_client.added == [done.id]
    jobs[1][1].cancel()
    short, short_client = jobs[2]
    r.advance(start + REPL_RETRY_MS + RES - r.now)
    assert len(short.delivered) == 4 and len(done.delivered) == 3
    assert len(other.delivered) == 3  # its first tick is 50 ms after its own start
    r.advance(start + 999 - r.now)
    assert not short_client.errors
    r.advance(1 + RES)
    assert [e.prefix for e in short_client.errors] == ["NOREPL"]
    assert done_client.added == [done.id] and not done_client.errors
    assert not jobs[1][1].errors and not jobs[1][1].added
    assert other.state == WAIT_REPL and list(r.node.replication.replicating) == [other.id]
    assert len(other.delivered) == 5  # a node more at each tick: every node by now
    r.advance(start + REPL_RETRY_MS - 1 + 2000 + RES - r.now)
    assert r.node.replication.replicating == {} and r.node.replication.repl_timer is None


def test_a_timer_with_nothing_left_to_wait_for_leaves_the_wheel() -> None:
    r = Rig()
    job, client = r.add_sync(replicate=2, timeout=0)
    (t1,) = targets(r.take(), ReplJob)
    r.node.on_message(t1, GotJob(hdr(t1), job.id))
    assert client.added == [job.id]
    r.advance(50 + RES)
    assert r.node.replication.repl_timer is None and r.take() == []
    r.advance(60_000)  # no retry tick, no timeout for an answered client
    assert r.take() == [] and client.added == [job.id] and not client.errors


def test_a_sync_addjob_without_timeout_or_timing_out_after_its_ttl_keeps_its_expiry() -> None:
    r = Rig()
    for timeout, ttl in ((0, 60), (61_000, 60), (60_000, 60)):
        job, client = r.add_sync(replicate=3, ttl=ttl, timeout=timeout)
        assert job.awake == job.etime
    job, client = r.add_sync(replicate=3, ttl=60, timeout=59_999)
    assert job.awake == 0
    r.advance(59_999 + RES)
    assert [e.prefix for e in client.errors] == ["NOREPL"]
    assert r.node.lookup_job(job.id) is None


# ---------------------------------------------------------------------------- REPLJOB out
def test_consecutive_new_jobs_to_every_node_leave_as_one_repljob_message_per_node() -> None:
    r = Rig()  # peers A and B: REPLICATE 3 goes to both
    jobs = [r.add_sync(replicate=3)[0] for _ in range(3)]
    out = r.take()
    assert [n for n, _ in out] == [A, B]
    msg = out[0][1]
    assert out[1][1] is msg and msg.n == 3
    assert [rec.id for rec in msg.items] == [j.id for j in jobs] and not msg.noreply
    # one encoding for both links; the replica decodes one frame of three REPLJOBs
    assert msg.encode() is msg.encode()
    frame = encode_many([msg])
    (decoded,) = FrameDecoder().feed(frame)
    assert type(decoded) is ReplJobBatch and [rec.id for rec in decoded.items] == \
        [j.id for j in jobs]
    replica = Rig(myself=A, peers=(ME, B))
    replica.node.on_message(ME, decoded)
    [(to, reply)] = replica.take()
    assert to == ME and reply.items == [j.id for j in jobs]


def test_repljobs_keep_their_order_with_other_messages_and_noreply_apart() -> None:
    r = Rig()
    first, client = r.add_sync(replicate=3)
    client.cancel()  # DELJOB to both between the two REPLJOBs
    second = r.add_sync(replicate=3)[0]
    third = r.add(replicate=3, async_=True)  # ASYNC: REPLJOB with NOREPLY, a message apart
    fourth = r.add(replicate=3, async_=True)
    kinds = [(type(m).__name__, n) for n, m in r.take()]
    assert kinds == [("ReplJob", A), ("ReplJob", B), ("DelJob", A), ("DelJob", B),
                     ("ReplJob", A), ("ReplJob", B), ("ReplJobsOut", A), ("ReplJobsOut", B)]
    assert first.id != second.id and third.id != fourth.id


def test_repljobs_to_nodes_drawn_at_random_stay_one_message_per_job() -> None:
    r = Rig(peers=(A, B))
    for _ in range(4):
        r.add_sync(replicate=2)
    out = r.take()
    assert len(out) == 4 and all(type(m) is ReplJob for _, m in out)


# ---------------------------------------------------------------------------- delivered
def test_jobs_listing_the_same_nodes_share_one_delivered_tuple() -> None:
    r = Rig()
    jobs = [r.add_sync(replicate=3)[0] for _ in range(2)] + [r.add(replicate=3, async_=True)]
    assert jobs[0].delivered == (ME, A, B)
    assert all(j.delivered is jobs[0].delivered for j in jobs)
    # a replica: the copies of separate frames share theirs too
    replica = Rig(myself=A, peers=(ME, B))
    for _ in range(2):
        replica.node.on_message(ME, ReplJob(hdr(ME), replica.record(delivered=(ME, B)), False))
    held = list(replica.node.jobs.values())
    assert held[0].delivered == (ME, B, A) and held[1].delivered is held[0].delivered
    # a change makes a new tuple for that job only
    r.node.on_message(C, GotJob(hdr(C), jobs[0].id))
    assert jobs[0].delivered == (ME, A, B, C) and jobs[1].delivered == (ME, A, B)


def test_the_table_of_shared_delivered_tuples_stays_small() -> None:
    node = Rig().node
    for i in range(1000):
        node.shared_delivered((ME, bytes([i % 256]) * 40, bytes([i // 256]) * 40))
    assert len(node.delivered_lists) <= 256
