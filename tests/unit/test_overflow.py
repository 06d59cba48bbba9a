"""disque.overflow: jobs past the memory threshold go to a real SQLite file and come back in
queue order; a lone node on a fake clock (tests/unit/test_node.py's Sim), no sockets."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from disque.cluster.messages import Header, Queued, WillQueue
from disque.jobs.deadletter import DeadLetter
from disque.jobs.job import ACKED, ACTIVE, QUEUED, Job
from disque.overflow import store as store_module
from disque.overflow.record import FIXED, pack_job, unpack_job
from disque.overflow.spill import KEEP
from disque.overflow.store import (
    CHUNK,
    SWEEP_SLICES,
    OverflowFull,
    OverflowStore,
    Row,
    fingerprint,
)
from tests.unit.noderig import ME, NodeRig
from tests.unit.test_node import Sim

BODY = b"x" * 1000


def overflowing(tmp_path: Path, maxmemory: int = 4 << 20, threshold: int = 50,
                max_bytes: int = 0) -> Sim:
    sim = Sim(maxmemory=maxmemory)
    sim.node.overflow.enable(str(tmp_path / "ov" / "jobs.db"), threshold, max_bytes)
    return sim


def fill(sim: Sim, n: int, queue: bytes = b"q", **kw: object) -> list[Job]:
    jobs = []
    for i in range(n):
        jobs.append(sim.add(queue, b"%06d" % i + BODY, **kw))  # type: ignore[arg-type]
        if i % 200 == 0:
            sim.advance(1)
    sim.advance(50)
    return jobs


def drain(sim: Sim, queue: bytes = b"q") -> list[bytes]:
    bodies = []
    while True:
        got = sim.node.get_jobs([queue], 7)
        if not got:
            return bodies
        bodies += [j.body[:6] for j in got]  # type: ignore[index]
        sim.node.ackjob([j.id for j in got])
        sim.advance(1)


def test_the_record_keeps_every_field() -> None:
    job = Job(b"D-01234567-" + b"a" * 24 + b"-0001", b"q", b"body", 3, 123456789, 99000, 5,
              60, (b"n" * 40, b"m" * 40))
    job.state, job.flags, job.nacks, job.deliveries = QUEUED, 0x25, 4, 7
    job.confirmed, job.qtime, job.gc_retry = (b"m" * 40,), 55555, 2
    job.dl = DeadLetter(3, 2, b"dead", b"q", 100, 0, 0, 0)
    back = unpack_job(pack_job(job))
    fields = ("id", "queue", "body", "state", "flags", "repl", "ctime", "etime", "delay", "retry",
              "nacks", "deliveries", "delivered", "confirmed", "qtime", "gc_retry", "dl")
    for f in fields:
        assert getattr(back, f) == getattr(job, f), f


def test_the_store_takes_by_id_by_queue_order_and_by_wake_time(tmp_path: Path) -> None:
    store = OverflowStore(str(tmp_path / "s.db"))
    rows = [(b"id%d" % i, b"q" if i % 2 else b"r", 1000 - i, 500 + i,
             b"A" * 40 + (b"B" * 40 if i % 3 == 0 else b""), int(i % 5 != 4),
             pack_job(_job(b"id%d" % i)), 0) for i in range(10)]
    store.put(rows)
    assert store.jobs == 10 and store.bytes == sum(len(r[6]) for r in rows)
    assert store.chunks == 2  # one segment per queue
    # by ID: that job's bytes only, once
    assert store.take(b"id3") == rows[3][6] and store.take(b"id3") is None
    assert store.take(b"nope") is None
    # the walks: copyable jobs listing a node, segment after segment (id3, back in memory,
    # is still named: the walk looks it up there)
    found = store.scan_listing(0, 100, [b"B" * 40], 2)[1]
    assert sorted(found) == [(b"id%d" % i, b"A" * 40 + b"B" * 40) for i in (0, 3, 6)]
    assert store.scan_listing(0, 1, [b"A" * 40], 2)[0] == 1  # one segment, then go on
    found = store.scan_listing(0, 100, [b"B" * 40], 1)[1]
    assert sorted(j for j, _ in found) == [b"id0", b"id6"]  # to `end`
    # queue order: a whole segment, oldest first (q: ids 9,7,5,1 by ctime; 3 was taken)
    got, nxt = store.take_oldest(b"q", 2)
    assert got == [rows[i][6] for i in (9, 7, 5, 1)] and nxt == 0
    assert store.take(b"id7") is None  # (its segment came back: the entry is stale)
    assert store.peek(b"r", 5) == [rows[i][6] for i in (8, 6, 4, 2, 0)]
    # wake times: the segment holding a due job comes back whole
    assert store.take_due(499, 100) == [] and len(store.take_due(500, 100)) == 5
    assert store.jobs == 0 and store.read == 10 and store.chunks == 0
    store.close()
    assert not (tmp_path / "s.db").exists()


def test_a_job_taken_by_id_does_not_come_back_with_its_segment(tmp_path: Path) -> None:
    store = OverflowStore(str(tmp_path / "s.db"))
    n = 2 * CHUNK + CHUNK // 2  # three segments
    rows = [(b"j%d" % i, b"q", i, 10**9, b"", 1, pack_job(_job(b"j%d" % i)), 0)
            for i in range(n)]
    store.put(rows)
    assert store.chunks == 3
    assert store.take(b"j5") == rows[5][6]
    nxt, first = store.scan(0, 10)
    assert nxt == 1 and len(first) == CHUNK - 1  # the first segment but j5
    _, rest = store.scan(nxt, 10_000)
    assert len(rest) == n - CHUNK
    back = store.take_oldest(b"q", CHUNK + 1)[0]
    assert len(back) == 2 * CHUNK - 1 and rows[5][6] not in back
    assert store.jobs == n - 2 * CHUNK


def test_the_store_reads_a_job_in_place_and_knows_its_listed_nodes(tmp_path: Path) -> None:
    # re-replication sends a job from disk (`get`); a copy received again that lists the
    # same nodes is known held without a read (`holds`)
    store = OverflowStore(str(tmp_path / "s.db"))
    a, b = b"A" * 40, b"B" * 40
    rows = [(b"j%d" % i, b"q", i, 10**9, a + b, 1, pack_job(_job(b"j%d" % i)),
             fingerprint((a, b)) if i else 0) for i in range(600)]  # two segments
    store.put(rows)
    assert store.get(b"j7") == rows[7][6] and store.get(b"j7") == rows[7][6]  # left there
    assert store.jobs == 600 and store.get(b"nope") is None
    assert store.holds(b"j7", fingerprint((b, a)))  # the same set, in any order
    assert not store.holds(b"j7", fingerprint((a,))) and not store.holds(b"nope", 1)
    assert not store.holds(b"j0", fingerprint((a, b)))  # 0: read to merge (not copyable)
    store.take(b"j7")
    assert not store.holds(b"j7", fingerprint((a, b))) and store.get(b"j7") is None
    store.take_oldest(b"q", 10)  # the first segment back whole: its entries are stale
    assert not store.holds(b"j8", fingerprint((a, b))) and store.get(b"j8") is None
    assert store.holds(b"j599", fingerprint((a, b)))


def test_new_id_entries_move_to_the_index_in_slices_and_stay_found(tmp_path: Path,
                                                                   monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # (each random insert into an index larger than SQLite's cache wrote a page per job)
    monkeypatch.setattr(store_module, "MERGE_AT", 100)
    store = OverflowStore(str(tmp_path / "s.db"))
    a = b"A" * 40
    rows = [(b"j%d" % i, b"q", i, 10**9, a, 1, pack_job(_job(b"j%d" % i)), 7)
            for i in range(300)]
    store.put(rows[:50])
    store.merge_step()
    assert store.fresh == 50  # under MERGE_AT: nothing moves
    store.put(rows[50:])
    assert store.take(b"j3") == rows[3][6] and store.fresh == 299
    for step in range(store_module.MERGE_SLICES):
        store.merge_step()
        if step == 7:  # half way: every job found in one table or the other
            assert all(store.get(b"j%d" % i) == rows[i][6] for i in range(4, 300, 7))
            assert store.holds(b"j10", 7) and not store.holds(b"j3", 7)
    assert store.fresh == 0
    count = store.db.execute("SELECT count(*) FROM ids").fetchone()[0]
    assert count == 299 and store.take(b"j299") == rows[299][6]
    assert store.holds(b"j298", 7) and store.get(b"j3") is None


def test_a_sweep_covers_the_whole_hash_space(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # (the last slice's end was 2**63, no SQLite integer: OverflowError out of the timer)
    monkeypatch.setattr(store_module, "MERGE_AT", 1)
    monkeypatch.setattr(store_module, "SWEEP_SLACK", 0)  # (each pass to its last slice)
    store = OverflowStore(str(tmp_path / "s.db"))
    n = 40_000
    store.put([(b"j%d" % i, b"q", i, 10**9, b"", 1, pack_job(_job(b"j%d" % i)), 0)
               for i in range(n)] + [(b"keep", b"r", 0, 10**9, b"", 1, b"x", 0)])
    for _ in range(store_module.MERGE_SLICES):
        store.merge_step()
    assert len(store.take_oldest(b"q", n)[0]) == n and store.stale == n
    for _ in range(SWEEP_SLICES):
        store.sweep()
    assert store.stale == 0
    assert store.db.execute("SELECT count(*) FROM ids").fetchone()[0] == 1


def _job(job_id: bytes) -> Job:
    return Job(job_id, b"q", b"body", 1, 1, 2, 0, 1, ())


def test_a_full_store_refuses_the_whole_batch(tmp_path: Path) -> None:
    store = OverflowStore(str(tmp_path / "s.db"), max_bytes=256 * 1024)
    big = [(b"id%d" % i, b"q", i, i, b"", 1, b"z" * 4000, 0) for i in range(200)]
    with pytest.raises(OverflowFull):
        store.put(big)
    assert store.jobs == 0 and store.take_oldest(b"q", 10) == ([], 0)
    assert store.take(b"id1") is None and store.fresh == 0  # no ID entry either
    store.put(big[:10])  # what fits still goes in
    assert store.jobs == 10


def test_jobs_taken_one_by_one_leave_holes_until_their_segment_goes(tmp_path: Path,
                                                                    monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(store_module, "MERGE_AT", 1)
    store = OverflowStore(str(tmp_path / "s.db"))
    store.put([_row(i) for i in range(CHUNK)])
    for _ in range(store_module.MERGE_SLICES // 2):
        store.merge_step()  # about half of the entries in ids, the others still new
    assert 0 < store.fresh < CHUNK
    for i in range(0, CHUNK - 1):
        assert store.take(b"j%d" % i) == _row(i)[6]
        assert store.get(b"j%d" % i) is None and store.take(b"j%d" % i) is None
    assert store.chunks == 1 and store.holes and store.jobs == 1
    assert store.scan(0, 100)[1] == [_row(CHUNK - 1)[6]]  # the holes skipped
    store.put([_row(3)])  # a job taken, then back to disk: found at its new place
    assert store.get(b"j3") == _row(3)[6] and store.chunks == 2
    assert store.take(b"j%d" % (CHUNK - 1)) == _row(CHUNK - 1)[6]  # the last one
    assert store.chunks == 1 and not store.holes and store.take(b"j3") == _row(3)[6]
    assert store.jobs == 0 and store.chunks == 0


def test_a_merge_refused_by_a_full_store_keeps_the_entries_found(tmp_path: Path,
                                                                 monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(store_module, "MERGE_AT", 1)
    store = OverflowStore(str(tmp_path / "s.db"), max_bytes=256 * 1024)
    put = 0
    with pytest.raises(OverflowFull):  # fill it up with segments
        for k in range(10_000):
            store.put([_row(i) for i in range(k * CHUNK, (k + 1) * CHUNK)])
            put += CHUNK
    with pytest.raises(OverflowFull):  # and the last pages with one job at a time
        for i in range(put, put + 10_000):
            store.put([_row(i)])
            put += 1
    assert put and store.fresh == put
    for _ in range(store_module.MERGE_SLICES):
        store.merge_step()  # (no page left for the index)
    in_index = store.db.execute("SELECT count(*) FROM ids").fetchone()[0]
    assert in_index < put and store.fresh + in_index == put
    assert all(store.get(b"j%d" % i) == _row(i)[6] for i in range(0, put, 13))


def test_the_segment_read_last_serves_the_next_reads_and_goes_with_the_segment(
        tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Jobs read by ID in the order they were written come from the segment kept in memory
    (`cached`); its jobs taken, its deletion and a segment too large to keep change nothing
    of what the reads answer."""
    monkeypatch.setattr(store_module, "MERGE_AT", 1)
    store = OverflowStore(str(tmp_path / "s.db"))
    store.put([_row(i) for i in range(3 * CHUNK)])
    for _ in range(store_module.MERGE_SLICES):
        store.merge_step()  # (every entry in ids: the lookup that reads the segment too)
    assert store.fresh == 0
    for i in range(CHUNK // 2):
        assert store.take(b"j%d" % i) == _row(i)[6]
    seg = store.cached.get(store.last_chunk - 2)
    assert seg is not None and seg.data
    assert store.get(b"j3") is None and store.get(b"j40") == _row(40)[6]
    assert store.holds(b"j41", 0) and not store.holds(b"j2", 0)  # (fingerprint 0 in _row)
    # the segment comes back whole: what was kept of it goes, its entries are stale
    assert len(store.take_oldest(b"q", 1)[0]) == CHUNK - CHUNK // 2
    assert seg.id not in store.cached
    assert store.get(b"j40") is None and store.take(b"j41") is None
    # a job back in memory, then written again: found at its new place, not the kept one
    assert store.take(b"j%d" % CHUNK) == _row(CHUNK)[6] and store.cached
    store.put([_row(CHUNK)])
    assert store.take(b"j%d" % CHUNK) == _row(CHUNK)[6] and store.take(b"j%d" % CHUNK) is None
    # a segment larger than CACHED_BYTES: its jobs are read alone, its data never kept
    big = [(b"b%d" % i, b"q", 10**6 + i, 10**9, b"", 1,
            pack_job(Job(b"b%d" % i, b"q", b"x" * (store_module.CACHED_BYTES // 8), 1, 1, 2,
                         0, 1, ())), 0) for i in range(CHUNK)]
    store.put(big)
    big_id = store.last_chunk
    for i in range(CHUNK):
        assert store.take(b"b%d" % i) == big[i][6]
        assert big_id not in store.cached or not store.cached[big_id].data
    assert store.jobs == 2 * CHUNK - 1
    # reads going round more segments than are kept: each answers its own job
    n = (store_module.CACHED_SEGMENTS + 2) * CHUNK
    rows = [_row(i) for i in range(10_000, 10_000 + n)]
    store.put(rows)
    for k in range(CHUNK):
        for i in range(k, n, CHUNK):
            assert store.get(rows[i][0]) == rows[i][6]
    assert len(store.cached) == store_module.CACHED_SEGMENTS


def test_jobs_taken_together_are_taken_as_one_by_one(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """take_many answers what `take` for each ID would, and leaves the same store: IDs in
    `new` and in ids, in several segments, taken already, never there, repeated, and the
    last jobs of a segment (it goes)."""
    monkeypatch.setattr(store_module, "MERGE_AT", 1)
    rng = random.Random(7)
    one = OverflowStore(str(tmp_path / "one.db"))
    many = OverflowStore(str(tmp_path / "many.db"))
    n = 5 * CHUNK
    for store in (one, many):
        store.put([_row(i) for i in range(3 * CHUNK)])
        for _ in range(store_module.MERGE_SLICES // 2):
            store.merge_step()  # (some entries in ids, the others in new)
        store.put([_row(i) for i in range(3 * CHUNK, n)])
        store.take(b"j5")
    assert 0 < one.fresh < n
    for _ in range(12):
        ids = [b"j%d" % rng.randrange(n + 20) for _ in range(rng.randrange(1, 90))]
        expected = [d for d in (one.take(i) for i in dict.fromkeys(ids)) if d is not None]
        assert sorted(many.take_many(ids)) == sorted(expected)
        for attr in ("jobs", "bytes", "chunks", "fresh", "stale", "read"):
            assert getattr(many, attr) == getattr(one, attr), attr
        assert many.holes == one.holes
    left = [b"j%d" % i for i in range(n)]
    assert sorted(many.take_many(left)) == sorted(d for d in map(one.take, left) if d)
    assert many.jobs == one.jobs == 0 and many.chunks == one.chunks == 0


def _row(i: int) -> Row:
    job_id = b"j%d" % i
    return (job_id, b"q", i, 10**9, b"", 1, pack_job(_job(job_id)), 0)


def test_the_store_file_is_deleted_when_it_opens(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    path.write_bytes(b"a torn file from a killed node")
    store = OverflowStore(str(path))
    data = pack_job(_job(b"a"))
    store.put([(b"a", b"q", 1, 1, b"", 1, data, 0)])
    assert store.take(b"a") == data


def test_queue_order_holds_across_the_boundary(tmp_path: Path) -> None:
    sim = overflowing(tmp_path)
    node = sim.node
    fill(sim, 3000)
    q = node.lookup_queue(b"q")
    assert q is not None and q.spilled > 1000 and len(q) == 3000
    assert node.mem_used <= node.spill_at
    assert len(q.jobs) >= KEEP
    fill(sim, 0)
    more = [sim.add(b"q", b"%06d" % (3000 + i) + BODY) for i in range(500)]
    assert len(more) == 500
    bodies = drain(sim)
    assert bodies == [b"%06d" % i for i in range(3500)]
    assert node.on_disk == 0 and len(node.jobs) == 0 and q.spilled == 0


def test_a_job_on_disk_answers_by_id_as_if_in_memory(tmp_path: Path) -> None:
    sim = overflowing(tmp_path)
    node = sim.node
    jobs = fill(sim, 3000)
    last = jobs[-1]
    assert node.jobs.get(last.id) is None  # on disk
    back = node.lookup_job(last.id)
    assert back is not None and back is not last and back.state == QUEUED
    assert back.body == last.body and back.qtime == last.qtime
    q = node.lookup_queue(b"q")
    assert q is not None and len(q) == 3000
    # DEQUEUE / ACK / DELJOB of jobs still on disk
    on_disk = [j.id for j in jobs[-400:-1] if node.jobs.get(j.id) is None][:3]
    assert len(on_disk) == 3
    assert node.dequeue_jobs([on_disk[0]]) == 1 and len(q) == 2999
    assert node.lookup_job(on_disk[0]).state == ACTIVE  # type: ignore[union-attr]
    assert node.ackjob([on_disk[1]]) == 1
    acked = node.lookup_job(on_disk[1])  # (a lone node forgets an acked job at once)
    assert acked is None or acked.state == ACKED
    assert node.deljob([on_disk[2]]) == 1 and node.lookup_job(on_disk[2]) is None
    assert len(q) == 2997
    served = {j.id for j in jobs} - set(on_disk)
    got = []
    while True:
        batch = node.get_jobs([b"q"], 100)
        if not batch:
            break
        got += [j.id for j in batch]
    assert len(got) == len(set(got)) == 2997 and set(got) == served


def test_new_jobs_behind_jobs_on_disk_go_straight_there(tmp_path: Path) -> None:
    """Past the spill's target, a new job of a queue with jobs on disk never enters memory
    (`Overflow.add_fresh`): it is counted on disk at once, found by ID, peeked, served in
    order, and written with the next tick."""
    sim = overflowing(tmp_path)
    node = sim.node
    fill(sim, 3000)
    q = node.lookup_queue(b"q")
    assert q is not None and q.spilled > 1000
    registered, mem, spilled = len(node.jobs), node.mem_used, q.spilled
    fresh = [sim.add(b"q", b"%06d" % (3000 + i) + BODY) for i in range(300)]
    assert node.overflow.fresh == fresh  # not written yet: same loop iteration
    assert len(node.jobs) == registered and node.mem_used == mem  # never in memory
    assert q.spilled == spilled + 300 and len(q) == 3300
    assert all(node.jobs.get(j.id) is None for j in fresh)
    # a lookup by ID writes them first and finds the job on disk
    back = node.lookup_job(fresh[10].id)
    assert back is not None and back is not fresh[10] and back.state == QUEUED
    assert back.body == fresh[10].body and back.qtime == fresh[10].qtime
    assert back.etime == fresh[10].etime and node.overflow.fresh == []
    more = [sim.add(b"q", b"%06d" % (3300 + i) + BODY) for i in range(200)]
    assert len(node.overflow.fresh) == 200
    assert [j.body for j in node.overflow.peek(q, 1, True)] == [more[-1].body]  # QPEEK -1
    sim.advance(20)  # the overflow tick writes them
    assert node.overflow.fresh == [] and node.on_disk == node.overflow.store.jobs  # type: ignore[union-attr]
    assert drain(sim) == [b"%06d" % i for i in range(3500)]
    assert node.on_disk == 0 and len(node.jobs) == 0 and q.spilled == 0


def test_new_jobs_refused_by_a_full_disk_stay_in_memory(tmp_path: Path) -> None:
    """A write of jobs on their way straight to disk that the store refuses puts them in
    memory, in order, as if overflow were off; none is lost."""
    sim = overflowing(tmp_path)
    node = sim.node
    fill(sim, 3000)
    q = node.lookup_queue(b"q")
    assert q is not None and q.spilled > 1000
    fresh = [sim.add(b"q", b"%06d" % (3000 + i) + BODY) for i in range(300)]
    assert node.overflow.fresh == fresh
    store = node.overflow.store
    assert store is not None
    store.set_max_bytes(store.file_bytes())  # the disk is full now
    sim.advance(20)
    assert node.overflow.full_error is not None and node.overflow.fresh == []
    assert all(node.jobs.get(j.id) is j for j in fresh)  # in memory, as they were
    assert len(q) == 3300 and not node.overflow.takes_fresh(sim.now)
    store.set_max_bytes(0)
    assert drain(sim) == [b"%06d" % i for i in range(3300)]


@pytest.mark.parametrize("seed", range(12))
def test_random_commands_across_the_boundary_match_a_model(tmp_path: Path, seed: int) -> None:
    """Random ADDJOB, GETJOB, ACKJOB, NACK, DEQUEUE, lookups by ID and time steps on a node
    that overflows early (a few jobs kept per queue, so jobs cross to disk and back, and new
    ones go straight there): every queue serves its jobs oldest first, and every job is
    found by ID exactly while the model holds it, whichever side it is on."""
    rng = random.Random(seed)
    sim = overflowing(tmp_path / str(seed), maxmemory=1 << 20, threshold=20)
    node = sim.node
    node.overflow.keep = 8
    names = [b"qa", b"qb"]
    queued: dict[bytes, dict[bytes, int]] = {n: {} for n in names}  # queue -> id -> ctime
    active: dict[bytes, bytes] = {}  # id -> queue
    known: list[bytes] = []
    seq = 0
    for _ in range(1500):
        op = rng.random()
        if op < 0.45:
            name = rng.choice(names)
            job = sim.add(name, b"%06d" % seq + BODY)
            seq += 1
            queued[name][job.id] = job.ctime
            known.append(job.id)
        elif op < 0.6:
            qs = rng.sample(names, rng.randint(1, 2))
            got = node.get_jobs(qs, rng.randint(1, 6))
            for job in got:
                assert job.queue is not None
                expect = min(queued[job.queue].items(), key=lambda kv: kv[1])[0]
                assert job.id == expect
                del queued[job.queue][job.id]
                active[job.id] = job.queue
        elif op < 0.72 and active:
            job_id = rng.choice(list(active))
            if rng.random() < 0.5:
                assert node.ackjob([job_id]) == 1
                del active[job_id]
            else:  # NACK: back in its queue, at its place by ctime
                assert node.enqueue_jobs([job_id], nack=True) == 1
                back = node.lookup_job(job_id)
                assert back is not None and back.queue is not None
                queued[back.queue][job_id] = back.ctime
                del active[job_id]
        elif op < 0.76:
            name = rng.choice(names)
            if queued[name]:
                job_id = rng.choice(list(queued[name]))
                assert node.dequeue_jobs([job_id]) == 1
                del queued[name][job_id]
                active[job_id] = name
        elif op < 0.88 and known:
            job_id = rng.choice(known)
            found = node.lookup_job(job_id)
            held = job_id in active or any(job_id in queued[n] for n in names)
            assert (found is not None) == held
            if found is not None:
                assert found.state == (ACTIVE if job_id in active else QUEUED)
        else:
            sim.advance(rng.randint(0, 25))
        for name in names:
            q = node.lookup_queue(name)
            assert (len(q) if q is not None else 0) == len(queued[name])
    store = node.overflow.store
    assert store is not None and store.written and store.read  # jobs crossed both ways
    for name in names:  # the rest comes out in order
        while queued[name]:
            [job] = node.get_jobs([name], 1)
            expect = min(queued[name].items(), key=lambda kv: kv[1])[0]
            assert job.id == expect
            del queued[name][job.id]
        assert node.get_jobs([name], 1) == []


def test_jobs_on_disk_expire(tmp_path: Path) -> None:
    sim = overflowing(tmp_path)
    node = sim.node
    fill(sim, 3000, ttl=5)
    assert node.on_disk > 0
    sim.advance(6000)
    q = node.lookup_queue(b"q")
    assert node.on_disk == 0 and len(node.jobs) == 0
    assert q is None or len(q) == 0


def test_active_jobs_go_to_disk_and_come_back_for_their_requeue(tmp_path: Path) -> None:
    sim = overflowing(tmp_path)
    node = sim.node
    jobs = fill(sim, 3000, retry=30)
    got = node.get_jobs([b"q"], 3000)  # all delivered: active, waiting for their ACK
    assert len(got) == 3000
    sim.advance(50)
    assert node.on_disk > 1000  # active jobs on disk now
    sim.advance(31_000)  # their requeue: back from disk, queued again (and spilled again)
    q = node.lookup_queue(b"q")
    assert q is not None and len(q) == 3000
    assert drain(sim) == [b"%06d" % i for i in range(3000)]
    assert all(node.lookup_job(j.id) is None for j in jobs)


def test_a_registry_of_few_shards_spills_each_active_job_once(tmp_path: Path) -> None:
    # The walk of active jobs looks at up to ACTIVE_SHARDS shards: in a registry of fewer
    # (the simulation's 16) it went round and wrote a job once per lap, counting it on disk
    # that often; the registry's size and the memory estimate then drifted
    sim = Sim(maxmemory=4 << 20, registry_bits=4)
    node = sim.node
    node.overflow.enable(str(tmp_path / "ov" / "jobs.db"), 50, 0)
    node.overflow.keep = 1 << 30  # queued jobs stay: memory is freed from active jobs only
    jobs = fill(sim, 3000, retry=30)
    active = node.get_jobs([b"q"], 20)  # a few active jobs among many queued ones
    sim.advance(50)
    assert all(node.jobs.get(j.id) is None for j in active)  # on disk
    assert len(node.jobs) == sum(len(shard) for shard in node.jobs.shards)
    assert node.on_disk + len(node.jobs) == 3000
    node.overflow.keep = KEEP
    sim.advance(31_000)
    assert drain(sim) == [b"%06d" % i for i in range(3000)]
    assert node.on_disk == 0 and len(node.jobs) == 0
    assert all(node.lookup_job(j.id) is None for j in jobs)


def test_active_jobs_due_back_soon_stay_in_memory(tmp_path: Path) -> None:
    # (with RETRY 2, a chaos run wrote each job to disk ~5 times: each came back for its
    # requeue, or the WILLQUEUE before it, within two seconds of going)
    sim = overflowing(tmp_path)
    node = sim.node
    fill(sim, 3000, retry=2)
    assert len(node.get_jobs([b"q"], 3000)) == 3000  # all active, requeue in 2 s
    written = node.overflow.store.written  # type: ignore[union-attr]
    sim.advance(50)
    assert node.overflow.store.written == written  # type: ignore[union-attr]
    assert node.on_disk == 0
    sim.advance(2_500)  # requeued: queued jobs go to disk as before
    assert node.on_disk > 1000
    assert drain(sim) == [b"%06d" % i for i in range(3000)]


def test_a_full_disk_stops_overflow_and_nothing_is_lost(tmp_path: Path) -> None:
    sim = overflowing(tmp_path, max_bytes=512 * 1024)
    node = sim.node
    fill(sim, 3000)
    assert node.overflow.full_error is not None
    assert node.mem_used > node.spill_at  # held in memory instead
    assert drain(sim) == [b"%06d" % i for i in range(3000)]


def test_flushall_forgets_the_disk_too(tmp_path: Path) -> None:
    sim = overflowing(tmp_path)
    jobs = fill(sim, 3000)
    sim.node.flushall()
    assert sim.node.on_disk == 0 and sim.node.lookup_job(jobs[-1].id) is None


def test_an_emptied_store_starts_a_new_file_and_segment_ids_go_on(tmp_path: Path) -> None:
    # (deleting millions of stale ID entries in one transaction held their pages in the
    # in-memory journal: RSS 1.7x maxmemory at the end of a 5-million-job drain)
    store = OverflowStore(str(tmp_path / "s.db"))
    rows = [(b"j%d" % i, b"q", i, 10**9, b"", 1, pack_job(_job(b"j%d" % i)), 0)
            for i in range(3000)]
    store.put(rows)
    big = store.file_bytes()
    assert len(store.take_oldest(b"q", 3000)[0]) == 3000
    assert store.jobs == 0 and store.file_bytes() < big // 4
    store.put(rows[:10])
    assert store.scan(0, 100)[1] == [r[6] for r in rows[:10]]
    segments = -(-3000 // CHUNK)
    assert store.db.execute("SELECT id FROM chunks").fetchone()[0] == segments + 1
    assert store.take(b"j3") == rows[3][6] and store.take(b"j2999") is None


def test_a_willqueue_for_a_job_queued_on_disk_is_answered_without_reading_it_back(
        tmp_path: Path) -> None:
    # (chaos random-kill with overflow, RETRY 2: every job queued on disk came back to
    # memory for its other holders' WILLQUEUEs every two seconds and went out again)
    A, B, C = b"a" * 40, b"b" * 40, b"c" * 40
    r = NodeRig({A: b"10.0.0.2", B: b"10.0.0.3", C: b"10.0.0.4"})
    node = r.node
    jobs = [node.add_job(b"q", b"%06d" % i, 0, 3, 3600, 2, 0, None, True) for i in range(40)]
    for job in jobs:
        assert job.state == QUEUED
        job.delivered = (A, B, ME)
    r.to_disk(str(tmp_path / "jobs.db"))
    assert node.on_disk == 40 and all(node.jobs.get(j.id) is None for j in jobs)
    job = jobs[0]
    node.out = []
    node.on_message(A, WillQueue(Header(A, b"", 7711, 17711, 0), job.id))
    assert sorted((to, type(m), m.aux) for to, m in node.out) == [(A, Queued, 0), (B, Queued, 0)]
    assert node.jobs.get(job.id) is None and node.on_disk == 40  # left on disk
    node.out = []
    # a sender the job does not list: read back, listed from now on, QUEUED to all
    node.on_message(C, WillQueue(Header(C, b"", 7711, 17711, 0), job.id))
    back = node.jobs.get(job.id)
    assert back is not None and C in back.delivered and back.state == QUEUED
    assert sorted(to for to, m in node.out if type(m) is Queued) == [A, B, C]
    assert node.on_disk == 39


@settings(max_examples=300, deadline=None)
@given(numbers=st.lists(st.integers(0, 2**15) | st.integers(-2**63, 2**64 - 1),
                        min_size=8, max_size=8),
       small=st.lists(st.integers(0, 255) | st.integers(256, 2**40), min_size=2,
                      max_size=2),
       state=st.sampled_from([ACTIVE, QUEUED]),
       queue=st.none() | st.binary(max_size=300) | st.just(b"q" * 0xFFFF),
       body=st.none() | st.binary(max_size=3000),
       delivered=st.lists(st.binary(min_size=40, max_size=40) | st.binary(max_size=60),
                          max_size=5),
       confirmed=st.lists(st.binary(min_size=40, max_size=40), max_size=3),
       job_id=st.binary(min_size=1, max_size=60) | st.just(b"i" * 300),
       dead=st.booleans())
def test_the_record_keeps_every_field_in_either_layout(numbers, small, state, queue, body,
                                                       delivered, confirmed, job_id,
                                                       dead) -> None:
    # Nearly every job takes the fixed layout; a dead-letter policy, a node ID that is not
    # 40 bytes, a queue name of 65,535 bytes or more (its length would read as no queue) or
    # a number out of its header field's range takes the msgpack one: either way the job
    # comes back as it went.
    ctime, etime, delay, retry, nacks, deliveries, qtime, gc_retry = numbers
    flags, repl = small
    job = Job(job_id, queue, body, repl, ctime, etime, delay, retry, tuple(delivered))
    job.state, job.flags, job.nacks, job.deliveries = state, flags, nacks, deliveries
    job.confirmed, job.qtime, job.gc_retry = tuple(confirmed), qtime, gc_retry
    if dead:
        job.dl = DeadLetter(3, 2, b"dead", b"q", 100, 0, 0, 0)
    data = pack_job(job)
    back = unpack_job(data)
    for f in ("id", "queue", "body", "state", "flags", "repl", "ctime", "etime", "delay",
              "retry", "nacks", "deliveries", "delivered", "confirmed", "qtime", "gc_retry",
              "dl"):
        assert getattr(back, f) == getattr(job, f), f
    fixed = (not dead and all(len(n) == 40 for n in delivered + confirmed)
             and len(delivered) < 256 and len(confirmed) < 256
             and all(-2**63 <= x < 2**63 for x in (ctime, etime, qtime))
             and all(0 <= x < 2**32 for x in (delay, retry))
             and all(0 <= x < 2**16 for x in (nacks, deliveries, gc_retry))
             and state < 256 and flags < 256 and repl < 256 and len(job_id) < 256
             and (queue is None or len(queue) < 0xFFFF))
    assert (data[0] == FIXED) == fixed
