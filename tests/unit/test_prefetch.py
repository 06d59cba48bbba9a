"""Reading back the jobs on disk that bus messages name (issue 22's overflow, a 3-node
backlog draining). Node.prefetch: the job messages of one bus read name jobs on disk; the
ones their handlers would read back one at a time are read back together first. A node that
does so must answer, and end up, exactly as one whose handlers read each job alone. And a
replica's copies go to disk in the order they came, so that they come back together."""

from __future__ import annotations

import random
from pathlib import Path

import msgpack
import pytest

from disque.cluster.messages import (
    DelJob,
    EnqueueJob,
    GotAck,
    GotJob,
    Header,
    Message,
    Queued,
    ReplJob,
    SetAck,
    WillQueue,
    WorkingJob,
    YourJobs,
)
from disque.cluster.records import job_record
from disque.jobs.job import Job
from disque.overflow import store as store_module
from disque.overflow.store import CHUNK
from tests.unit.noderig import IPS, ME, A, B, NodeRig

JOB_ID_MESSAGES = (SetAck, GotAck, DelJob, EnqueueJob, Queued, WorkingJob, WillQueue, GotJob)


def rig_on_disk(path: Path, n: int) -> tuple[NodeRig, list[bytes]]:
    """A node holding n jobs of its own, the half added with ASYNC (queued) on disk, the
    others in memory, waiting for their copies."""
    r = NodeRig(IPS)
    r.node.repair.rate = 0
    ids = []
    for i in range(n):
        retry = 10 if i % 4 else 0  # (some at-most-once)
        job = r.node.add_job(b"q%d" % (i % 3), b"body%d" % i, 0, 3 if retry else 1, 3600,
                             retry, 0, None, i % 2 == 0)
        job.delivered = (A, B, ME)
        ids.append(job.id)
    r.node.out = []
    r.to_disk(str(path))
    assert r.node.on_disk == n // 2  # (the others wait for their copies: not spilled)
    store = r.node.overflow.store
    assert store is not None
    for _ in range(store_module.MERGE_SLICES // 2):
        store.merge_step()  # (ID entries in the index, the others still in `new`)
    assert 0 < store.fresh < n // 2
    return r, ids


def messages(rng: random.Random, r: NodeRig, ids: list[bytes]) -> list[tuple[bytes, Message]]:
    """A read's worth of job messages from A and B about some of the jobs (and unknown IDs),
    in any order, repeats included."""
    unknown = [b"D-" + B[:8] + b"-%024d-05a1" % i for i in range(5)]
    out: list[tuple[bytes, Message]] = []
    for _ in range(rng.randrange(1, 60)):
        sender = rng.choice((A, B))
        header = Header(sender, IPS[sender], 7711, 17711, 0)
        job_id = rng.choice(ids if rng.random() < 0.9 else unknown)
        if rng.random() < 0.1:
            copy = r.node.disk_job(job_id) or r.node.jobs.get(job_id)
            if copy is not None:
                out.append((sender, YourJobs(header, [job_record(copy, r.now)])))
                continue
        kind = rng.choice(JOB_ID_MESSAGES)
        out.append((sender, kind(header, job_id, rng.choice((0, 0, 1, 2, 3)))))
    return out


def state_of(r: NodeRig, ids: list[bytes]) -> list[object]:
    node = r.node
    jobs = []
    for job_id in ids:
        job = node.jobs.get(job_id) or node.disk_job(job_id)
        jobs.append(None if job is None else
                    (job.state, sorted(job.delivered), job.queue, job.gc_retry))
    queues = [(q.name, len(q.jobs), q.spilled)
              for q in (node.queues.get(b"q%d" % i) for i in range(3)) if q is not None]
    return [jobs, queues, node.jobs.size + node.on_disk]


@pytest.mark.parametrize("seed", range(6))
def test_a_read_s_messages_answer_the_same_with_their_jobs_read_back_together(
        tmp_path: Path, seed: int, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(store_module, "MERGE_AT", 1)
    one, ids = rig_on_disk(tmp_path / "one.db", 3 * CHUNK)
    many, ids2 = rig_on_disk(tmp_path / "many.db", 3 * CHUNK)
    assert ids == ids2
    rng = random.Random(seed)
    read_back = 0
    for _ in range(8):
        msgs = messages(rng, one, ids)
        for sender, msg in msgs:
            one.node.on_message(sender, msg)
        on_disk = many.node.on_disk
        many.node.prefetch([msg for _, msg in msgs])
        read_back += on_disk - many.node.on_disk
        for sender, msg in msgs:
            many.node.on_message(sender, msg)
        sent = [[(to, type(m).__name__, getattr(m, "job_id", None), getattr(m, "aux", None))
                 for to, m in rig.node.out] for rig in (one, many)]
        assert sent[0] == sent[1]
        one.node.out, many.node.out = [], []
        assert state_of(one, ids) == state_of(many, ids)
        assert one.node.on_disk == many.node.on_disk
        one.now += 50
        many.now += 50
    assert read_back > 20  # (the prefetch did read jobs back)


def test_a_replica_s_copies_go_to_disk_in_the_order_they_came(tmp_path: Path) -> None:
    """Active jobs move to disk oldest first (NodeState.arrivals), so that a segment holds
    copies that came together, as their SETACKs come later. Found by walking the registry
    (by shard, as before), a segment held copies from across everything in memory: a
    bus read's 65 SETACKs named jobs of 45 segments on average, each read alone."""
    r = NodeRig(IPS)
    node = r.node
    node.repair.rate = 0
    node.maxmemory = 8 << 20
    node.overflow.enable(str(tmp_path / "jobs.db"), 25, 0)  # over 2 MB: to disk
    n = 8000
    for i in range(n):
        job = Job(b"D-" + B[:8] + b"-%024d-05a1" % i, b"q", b"x" * 200, 3,
                  r.now * 1_000_000 + i, r.now + 3_600_000, 0, 300, (A, B))
        node.on_message(B, ReplJob(Header(B, IPS[B], 7711, 17711, 0), job_record(job, r.now)))
        if i % 50 == 49:
            r.cron()  # (its spills)
    store = node.overflow.store
    assert store is not None and store.chunks > 20 and node.on_disk > n // 2
    spans = []
    for (meta,) in store.db.execute("SELECT meta FROM chunks"):
        arrived = [int(job_id[11:35]) for job_id, _, _ in msgpack.unpackb(meta)]
        spans.append(max(arrived) - min(arrived))
    assert max(spans) < 2 * CHUNK, spans  # (walked by shard: spans of thousands)


def test_the_arrival_order_forgets_the_jobs_gone_while_in_memory(tmp_path: Path) -> None:
    """With overflow on and memory near the threshold but under it, nothing moves to disk,
    and copies come and go: the order of arrivals must not keep their IDs (Overflow.tick
    prunes it). Far under the threshold, it is not kept at all."""
    r = NodeRig(IPS)
    node = r.node
    node.repair.rate = 0
    node.maxmemory = 32 << 20
    node.overflow.enable(str(tmp_path / "jobs.db"), 50, 0)  # 16 MB; kept over 8 MB
    early = Job(b"D-" + B[:8] + b"-%024d-05a1" % 99_999, b"q", b"body", 3,
                r.now * 1_000_000, r.now + 3_600_000, 0, 300, (A, B))
    node.on_message(B, ReplJob(Header(B, IPS[B], 7711, 17711, 0), job_record(early, r.now)))
    assert not node.arrivals  # (memory far under the threshold)
    node.add_job(b"big", b"x" * (9 << 20), 0, 1, 3600, 0, 0, None, True)  # 10 MB in all
    header = Header(B, IPS[B], 7711, 17711, 0)
    for k in range(3):
        ids = []
        for i in range(6000):
            job = Job(b"D-" + B[:8] + b"-%024d-05a1" % (k * 6000 + i), b"q", b"body", 3,
                      r.now * 1_000_000 + i, r.now + 3_600_000, 0, 300, (A, B))
            node.on_message(B, ReplJob(header, job_record(job, r.now)))
            ids.append(job.id)
        for job_id in ids[:5000]:
            node.on_message(B, DelJob(header, job_id, 0))  # (collected: gone)
        r.cron()
        assert len(node.jobs) == 1000 * (k + 1) + 2 and node.on_disk == 0
        assert len(node.arrivals) <= len(node.jobs) * 5 // 4 + 4096
    assert set(node.arrivals) == {job.id for job in node.jobs.values()
                                  if job.queue == b"q"} - {early.id}
