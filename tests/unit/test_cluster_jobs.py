"""disque.cluster (replication, requeue, acks, federation): the spec's job state machines, handler by handler, with a fake clock.

A `Rig` is one Node with a real Membership whose table was loaded with peers (known and
reachable, outbound bus links up as the Bus would report them: no sockets, the Node's
messages land in `node.out` as (node id, message) pairs and stay there; `drop_link` /
`link` make a link go away or come up, and hand Membership's LinkChanged to the node). Bus messages from peers are fed straight into the handlers. Time only moves
through `Rig.advance`, which wakes the node at every instant its timer wheel asks for.
Each test names the spec step (README "Disque state machine", checklist sections 4, 9, 10).
"""

from __future__ import annotations

import random
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from disque.cluster.acks import GC_MAX_ATTEMPT, GC_MAX_MS
from disque.cluster.federation import NEEDER_HOLD_MS, RESPONDER_VALID_MS
from disque.cluster.membership import Connect, LinkChanged, Membership
from disque.cluster.messages import (
    QUEUED_INCR_DELIV,
    QUEUED_INCR_NACKS,
    QUEUED_STATE_ONLY,
    QUEUED_UNKNOWN,
    WILLQUEUE_CONFIRM,
    DelJob,
    EnqueueJob,
    GotAck,
    GotJob,
    GotJobBatch,
    Header,
    JobRecord,
    NeedJobs,
    PauseQueue,
    Pong,
    Queued,
    ReplJob,
    ReplJobBatch,
    SetAck,
    WillQueue,
    WorkingJob,
    YourJobs,
)
from disque.cluster.nodes import LEAVING, ClusterNode
from disque.cluster.records import CONFIRM_MS, HOLDERS_COUNT_MASK, holders_aux
from disque.cluster.replication import NOREPL_REMOVED, NOREPL_TIMEOUT, ReplWaiter
from disque.cluster.requeue import RELOAD_CONFIRM_ROUNDS, RELOAD_WAIT_ROUNDS, sender_wins
from disque.jobs.ids import IdGenerator, id_is_at_least_once, id_ttl_minutes
from disque.jobs.job import ACKED, ACTIVE, F_DUMMY, F_RELOADED, QUEUED, WAIT_REPL, Job
from disque.jobs.serialize import deserialize_job, serialize_job
from disque.node import CLUSTER_CRON_MS as CLUSTER_CRON
from disque.node import Node, Waiter
from disque.protocol.errors import CommandError
from disque.queues.queue import PAUSE_IN, PAUSE_OUT
from disque.state import BASE_MEMORY
from disque.timers import RES

T0 = 1_700_000_000_000
ME = b"0123abcd" + b"e" * 32
A, B, C, D = (bytes([c]) * 40 for c in b"abcd")
NOREPL_PLAIN = "Not enough reachable nodes for the requested replication level"
NOREPL_WHY = ("Not enough reachable nodes for the requested replication level, since I'm "
              "unable to hold a copy of the message for the following reason: ")


def hdr(node_id: bytes) -> Header:
    return Header(node_id, b"", 7711, 17711, 0)


class AddClient(ReplWaiter):
    """A client blocked in a synchronous ADDJOB."""

    def __init__(self) -> None:
        self.added: list[bytes] = []
        self.errors: list[CommandError] = []

    def on_added(self, job_id: bytes) -> None:
        self.added.append(job_id)

    def on_error(self, error: CommandError) -> None:
        self.errors.append(error)


class GetClient(Waiter):
    """A client blocked in GETJOB."""

    __slots__ = ("jobs", "errors", "timeouts")

    def __init__(self, queues: list[bytes]) -> None:
        super().__init__(queues, 1, False)
        self.jobs: list[Job] = []
        self.errors: list[CommandError] = []
        self.timeouts = 0

    def on_jobs(self, jobs: list[Job]) -> None:
        self.jobs.extend(jobs)

    def on_timeout(self) -> None:
        self.timeouts += 1

    def on_error(self, error: CommandError) -> None:
        self.errors.append(error)


class Rig:
    """One node of a cluster whose other members are `peers` (reachable; our bus links to
    them up, unless `linked` is False)."""

    def __init__(self, peers: tuple[bytes, ...] = (A, B), *, myself: bytes = ME,
                 seed: int = 1, linked: bool = True, **kw: Any) -> None:
        self.now = T0
        rng = random.Random(seed)
        self.m = Membership(myself, 7711, clock=self.clock, rng=random.Random(seed + 1))
        self.m.load([ClusterNode(p, b"10.0.0.%d" % (i + 2), 7711) for i, p in enumerate(peers)])
        self.node = Node(myself, self.clock, rng=rng, randbytes=rng.randbytes,
                         membership=self.m, **kw)
        self.ids = IdGenerator(A, random.Random(seed + 2).randbytes)
        self.links: dict[bytes, object] = {}
        if linked:
            self.link(*[p for p in peers if p != myself])

    def clock(self) -> int:
        return self.now

    def bus(self) -> None:
        """Carry out Membership's effects as the server's Bus does for the job layer:
        LinkChanged goes to the node (nothing else matters here)."""
        for e in self.m.drain():
            if type(e) is LinkChanged:
                self.node.link_changed(e.node_id, e.up)

    def link(self, *peers: bytes) -> None:
        """Our outbound links to `peers` come up, as a real connect does: Membership's tick
        asks for them (Connect), the I/O layer reports them connected, the peer answers
        the PING with a PONG. Links it asked for to other nodes fail (retried later)."""
        self.m.tick(self.now)
        effects = self.m.drain()
        for e in effects:
            if type(e) is not Connect:
                continue
            if e.node_id in peers:
                link = self.links[e.node_id] = object()
                self.m.link_connected(link, e.token)
                self.m.link_message(link, Pong(hdr(e.node_id), []), b"10.0.0.99")
            else:
                self.m.connect_failed(e.token)
        for e in effects:
            if type(e) is LinkChanged:  # (none expected from a tick, but not lost)
                self.node.link_changed(e.node_id, e.up)
        self.bus()
        assert all(self.node.link_up(p) for p in peers)

    def drop_link(self, peer: bytes) -> None:
        """Our outbound link to `peer` closes (the peer was killed: the kernel resets the
        connection)."""
        self.m.link_closed(self.links.pop(peer))
        self.bus()

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

    def take(self) -> list[tuple[bytes, Any]]:
        out = self.node.out
        self.node.out = []
        return out

    def add(self, queue: bytes = b"q", body: bytes = b"body", *, timeout: int = 0,
            replicate: int | None = None, ttl: int | None = None, retry: int | None = None,
            delay: int = 0, async_: bool = False) -> Job:
        return self.node.add_job(queue, body, timeout, replicate, ttl, retry, delay, None,
                                 async_)

    def add_sync(self, timeout: int = 5000, **kw: Any) -> tuple[Job, AddClient]:
        job = self.add(timeout=timeout, **kw)
        assert job.state == WAIT_REPL
        client = AddClient()
        self.node.wait_replication(job, client, timeout)
        return job, client

    def record(self, *, queue: bytes = b"q", retry: int = 10, delay: int = 0,
               ttl: int = 3600, delivered: tuple[bytes, ...] = (A, ME),
               job_id: bytes | None = None, repl: int = 2) -> JobRecord:
        """A job created by A, as it travels in REPLJOB / YOURJOBS."""
        jid = job_id or self.ids.new_id(ttl, retry)
        return JobRecord(jid, queue, b"body-" + jid[-8:], repl, ttl * 1000,
                         self.now * 1_000_000, delay, retry, 0, 0, delivered)

    def replica(self, **kw: Any) -> Job:
        """A copy held here after a REPLJOB from A (the GOTJOB reply is discarded)."""
        rec = self.record(**kw)
        self.node.on_message(A, ReplJob(hdr(A), rec, False))
        self.take()
        job = self.node.lookup_job(rec.id)
        assert job is not None
        return job

    def queued_replica(self, **kw: Any) -> Job:
        job = self.replica(**kw)
        self.node.on_message(A, EnqueueJob(hdr(A), job.id, 0))
        assert job.state == QUEUED
        self.take()
        return job

    def qlen(self, name: bytes = b"q") -> int:
        q = self.node.lookup_queue(name)
        return len(q.jobs) if q is not None else 0


def of(out: list[tuple[bytes, Any]], kind: type) -> list[tuple[bytes, Any]]:
    return [(n, msg) for n, msg in out if type(msg) is kind]


def targets(out: list[tuple[bytes, Any]], kind: type) -> list[bytes]:
    return sorted(n for n, _ in of(out, kind))


def near(value: int, expected: int, jitter: int = 250) -> bool:
    return expected - jitter <= value < expected + jitter


# ---------------------------------------------------------------------------- REPLJOB
def test_repljob_of_a_new_job_stores_it_active_requeue_at_delay_plus_retry_and_gotjob() -> None:
    r = Rig()
    rec = r.record(retry=10, delay=5, delivered=(A, B))
    r.node.on_message(A, ReplJob(hdr(A), rec, False))
    job = r.node.lookup_job(rec.id)
    assert job is not None and job.state == ACTIVE
    assert r.qlen() == 0
    assert near(job.qtime, T0 + 15_000)
    assert set(job.delivered) == {A, B, ME}
    assert (job.queue, job.body, job.retry, job.delay, job.repl) == (b"q", rec.body, 10, 5, 2)
    assert job.etime == T0 + 3600 * 1000
    (to, msg), = r.take()
    assert to == A and type(msg) is GotJob and msg.job_id == rec.id


def test_repljob_of_an_at_most_once_job_is_never_requeued_here() -> None:
    r = Rig()
    job = r.replica(retry=0, delivered=(A, ME))
    assert job.state == ACTIVE and job.qtime == 0
    r.advance(600_000)
    assert job.state == ACTIVE and r.qlen() == 0 and not r.take()


def test_repljob_of_a_known_job_merges_delivered_and_still_answers_gotjob() -> None:
    r = Rig(peers=(A, B, C))
    job = r.replica(delivered=(A, ME))
    qtime = job.qtime
    rec = r.record(job_id=job.id, delivered=(A, ME, C))
    r.node.on_message(A, ReplJob(hdr(A), rec, False))
    assert r.node.lookup_job(job.id) is job
    assert set(job.delivered) == {A, ME, C}
    assert job.qtime == qtime  # not a new copy: the requeue time stays
    assert [(n, type(m)) for n, m in r.take()] == [(A, GotJob)]


def test_a_frame_of_repljobs_is_held_like_single_ones_and_answered_with_one_gotjob() -> None:
    r = Rig(peers=(A, B, C))
    known = r.replica(delivered=(A, ME))
    r.node.pause(b"paused", PAUSE_IN)
    recs = [r.record(), r.record(job_id=known.id, delivered=(A, ME, C)),
            r.record(queue=b"paused"), r.record(retry=0, repl=1, delivered=(A, ME))]
    r.node.on_message(A, ReplJobBatch(hdr(A), recs, False))
    (to, msg), = r.take()
    # one GOTJOB message for the copies held, none for the paused queue's job
    assert to == A and type(msg) is GotJobBatch
    assert msg.items == [recs[0].id, known.id, recs[3].id]
    assert set(known.delivered) == {A, ME, C}
    assert r.node.lookup_job(recs[2].id) is None
    for rec in (recs[0], recs[3]):
        job = r.node.lookup_job(rec.id)
        assert job is not None and job.state == ACTIVE and job.body == rec.body
    r.node.on_message(A, ReplJobBatch(hdr(A), [r.record(), r.record()], True))
    assert r.take() == []  # noreply


def test_a_copy_of_a_job_older_than_this_node_is_confirmed_to_every_listed_holder() -> None:
    # a restart's refill: the other holders left the copy to A (rereplication._leave) and
    # learn from us that we hold it; a copy of a job created since our start (ADDJOB's
    # replication) is confirmed to its sender only
    r = Rig(peers=(A, B, C))
    old = r.record(delivered=(A, B, ME))._replace(ctime=(T0 - 5000) * 1_000_000)
    merged = r.record(delivered=(A, C, ME))._replace(ctime=(T0 - 6000) * 1_000_000)
    r.node.on_message(C, ReplJob(hdr(C), merged, False))  # held already (from C)
    r.take()
    fresh = r.record(delivered=(A, B, ME))
    r.node.on_message(A, ReplJobBatch(hdr(A), [old, merged, fresh], False))
    got = sorted((n, m.job_id if type(m) is GotJob else tuple(m.items)) for n, m in r.take())
    assert got == sorted([(A, (old.id, merged.id, fresh.id)), (B, old.id), (C, merged.id)])
    r.node.on_message(A, ReplJob(hdr(A), old, True))  # noreply: no GOTJOB at all
    assert r.take() == []


def test_a_frame_of_gotjobs_confirms_each_job() -> None:
    r = Rig(peers=(A, B))
    jobs = [r.add_sync(replicate=3)[0] for _ in range(3)]
    r.take()
    r.node.on_message(A, GotJobBatch(hdr(A), [j.id for j in jobs], 0))
    assert all(j.state == WAIT_REPL for j in jobs)
    r.node.on_message(B, GotJobBatch(hdr(B), [j.id for j in jobs[:2]], 0))
    assert [j.state for j in jobs] == [QUEUED, QUEUED, WAIT_REPL]


def test_repljob_with_noreply_stores_the_copy_without_gotjob() -> None:
    r = Rig()
    rec = r.record()
    r.node.on_message(A, ReplJob(hdr(A), rec, True))
    assert r.node.lookup_job(rec.id) is not None
    assert r.take() == []


def test_repljob_is_refused_without_gotjob_above_75_percent_of_maxmemory() -> None:
    r = Rig(maxmemory=BASE_MEMORY * 100 // 80)  # the base alone is 80%
    assert r.node.memory_level() == 1
    rec = r.record()
    r.node.on_message(A, ReplJob(hdr(A), rec, False))
    assert r.node.lookup_job(rec.id) is None and r.take() == []


def test_repljob_is_refused_by_a_leaving_node() -> None:
    r = Rig()
    r.node.set_leaving(True)
    rec = r.record()
    r.node.on_message(A, ReplJob(hdr(A), rec, False))
    assert r.node.lookup_job(rec.id) is None and r.take() == []


def test_repljob_is_refused_when_the_queue_is_paused_in_input() -> None:
    r = Rig()
    r.node.pause(b"q", PAUSE_IN)
    rec = r.record()
    r.node.on_message(A, ReplJob(hdr(A), rec, False))
    assert r.node.lookup_job(rec.id) is None and r.take() == []
    r.node.pause(b"q", PAUSE_OUT)  # paused in output only: accepted
    r.node.on_message(A, ReplJob(hdr(A), rec, False))
    assert r.node.lookup_job(rec.id) is not None


# ---------------------------------------------------------------------------- ADDJOB / GOTJOB
def test_sync_addjob_sends_repljob_to_replicate_minus_one_random_reachable_nodes() -> None:
    r = Rig(peers=(A, B, C, D))
    job, client = r.add_sync(replicate=3)
    out = r.take()
    sent = targets(out, ReplJob)
    assert len(sent) == 2 and set(sent) <= {A, B, C, D}
    assert all(not msg.noreply and msg.job.id == job.id for _, msg in out)
    assert job.state == WAIT_REPL and job.confirmed == (ME,)
    assert set(job.delivered) == {ME, *sent}
    assert r.qlen() == 0 and not client.added and not client.errors


def test_gotjob_is_ignored_unless_the_job_waits_for_replication() -> None:
    r = Rig()
    job = r.replica()
    r.node.on_message(B, GotJob(hdr(B), job.id))
    assert job.state == ACTIVE and job.confirmed == () and B not in job.delivered
    r.node.on_message(B, GotJob(hdr(B), r.ids.new_id(3600, 10)))  # unknown: nothing
    assert r.take() == []


def test_replication_achieved_queues_the_job_and_answers_the_client() -> None:
    r = Rig(peers=(A, B, C, D))
    job, client = r.add_sync(replicate=3)
    t1, t2 = targets(r.take(), ReplJob)
    r.node.on_message(t1, GotJob(hdr(t1), job.id))
    assert job.state == WAIT_REPL and not client.added
    r.node.on_message(t1, GotJob(hdr(t1), job.id))  # a duplicate does not count twice
    assert job.state == WAIT_REPL and not client.added
    r.node.on_message(t2, GotJob(hdr(t2), job.id))
    assert client.added == [job.id] and not client.errors
    assert job.state == QUEUED and r.qlen() == 1
    assert set(job.delivered) >= {ME, t1, t2}
    assert job.id not in r.node.replication.replicating
    r.advance(1000)
    assert not r.take()  # no more REPLJOB once replicated


def test_replication_achieved_with_delay_keeps_the_job_active_until_the_delay() -> None:
    r = Rig()
    job, client = r.add_sync(replicate=2, delay=3)
    (t1,) = targets(r.take(), ReplJob)
    r.node.on_message(t1, GotJob(hdr(t1), job.id))
    assert client.added == [job.id]
    assert job.state == ACTIVE and job.qtime == T0 + 3000 and r.qlen() == 0
    r.advance(2990)
    assert job.state == ACTIVE
    r.advance(10 + RES)
    assert job.state == QUEUED and r.qlen() == 1


def test_external_replication_sends_enqueue_to_one_confirmer_and_drops_the_local_copy() -> None:
    r = Rig(peers=(A, B, C), maxmemory=BASE_MEMORY * 100 // 80)  # level 1: external
    job, client = r.add_sync(replicate=2, delay=7)
    sent = targets(r.take(), ReplJob)
    assert len(sent) == 2 and ME not in job.delivered  # W copies elsewhere, none here
    assert job.confirmed == ()
    r.node.on_message(sent[0], GotJob(hdr(sent[0]), job.id))
    assert not client.added
    r.node.on_message(sent[1], GotJob(hdr(sent[1]), job.id))
    assert client.added == [job.id]
    ((to, msg),) = of(r.take(), EnqueueJob)
    assert to in sent and msg.job_id == job.id and msg.aux == 7
    assert r.node.lookup_job(job.id) is None and r.qlen() == 0


def test_sync_addjob_adds_one_more_node_every_50_ms_and_refreshes_delivered() -> None:
    r = Rig(peers=(A, B, C, D))
    job, client = r.add_sync(replicate=3, timeout=10_000)
    first = targets(r.take(), ReplJob)
    r.node.on_message(first[0], GotJob(hdr(first[0]), job.id))
    r.advance(49)
    assert r.take() == [] and len(job.delivered) == 3
    r.advance(1 + RES)
    out = r.take()
    assert len(job.delivered) == 4
    added = next(n for n in job.delivered if n not in (ME, *first))
    # REPLJOB again to every other holder: the confirmed one with NOREPLY, so that
    # everybody learns the full list.
    by_node = {n: msg for n, msg in of(out, ReplJob)}
    assert set(by_node) == {first[0], first[1], added}
    assert by_node[first[0]].noreply and not by_node[first[1]].noreply
    assert not by_node[added].noreply
    assert all(set(msg.job.delivered) == set(job.delivered) for msg in by_node.values())
    r.advance(50 + RES)
    assert len(job.delivered) == 5
    r.take()
    r.advance(50 + RES)  # nobody left to add: the unconfirmed ones get it again
    out = r.take()
    assert len(job.delivered) == 5
    assert targets(out, ReplJob) == sorted(n for n in job.delivered if n not in (ME, first[0]))
    assert job.state == WAIT_REPL and not client.added


def test_sync_addjob_timeout_answers_norepl_and_deletes_every_copy() -> None:
    r = Rig(peers=(A, B, C, D))
    job, client = r.add_sync(replicate=3, timeout=1000)
    r.advance(999)
    assert not client.errors
    r.take()
    r.advance(1 + RES)
    assert [(e.prefix, e.message) for e in client.errors] == [("NOREPL", NOREPL_TIMEOUT)]
    assert r.node.lookup_job(job.id) is None and job.id not in r.node.replication.replicating
    holders = [n for n in job.delivered if n != ME]
    assert sorted(holders) == [A, B, C, D]  # the 50 ms ticks added everybody
    assert targets(r.take(), DelJob) == sorted(holders)
    r.advance(1000)
    assert r.take() == [] and not client.added and len(client.errors) == 1


def test_a_job_deleted_while_waiting_for_replication_answers_job_removed() -> None:
    r = Rig()
    job, client = r.add_sync(replicate=3)
    r.node.on_message(A, DelJob(hdr(A), job.id))
    assert [(e.prefix, e.message) for e in client.errors] == [("NOREPL", NOREPL_REMOVED)]
    assert NOREPL_REMOVED == ("job removed (expired?) before the requested replication "
                              "level was achieved")
    r.take()
    r.advance(10_000)
    assert r.take() == [] and len(client.errors) == 1


def test_a_job_expiring_while_waiting_for_replication_answers_job_removed() -> None:
    r = Rig()
    job, client = r.add_sync(replicate=3, ttl=2, timeout=60_000)
    r.advance(2000 + RES)
    assert [(e.prefix, e.message) for e in client.errors] == [("NOREPL", NOREPL_REMOVED)]
    assert r.node.lookup_job(job.id) is None


def test_an_addjob_client_that_goes_away_deletes_the_job_cluster_wide() -> None:
    r = Rig(peers=(A, B, C))
    job, client = r.add_sync(replicate=3)
    sent = targets(r.take(), ReplJob)
    client.cancel()
    assert r.node.lookup_job(job.id) is None and job.id not in r.node.replication.replicating
    assert targets(r.take(), DelJob) == sent
    r.advance(5000)
    assert r.take() == [] and not client.added and not client.errors


def test_an_addjob_client_that_goes_away_after_its_reply_changes_nothing() -> None:
    r = Rig()
    job, client = r.add_sync(replicate=2)
    (t1,) = targets(r.take(), ReplJob)
    r.node.on_message(t1, GotJob(hdr(t1), job.id))
    client.cancel()  # the connection closes after the reply: no crash, the job stays
    assert r.node.lookup_job(job.id) is job and job.state == QUEUED
    assert r.take() == []


def test_async_addjob_queues_at_once_and_replicates_with_noreply() -> None:
    r = Rig(peers=(A, B, C))
    job = r.add(replicate=3, async_=True)
    assert job.state == QUEUED and r.qlen() == 1
    assert job.id not in r.node.replication.replicating
    out = r.take()
    assert len(targets(out, ReplJob)) == 2
    assert all(msg.noreply for _, msg in out)
    assert set(job.delivered) == {ME, *targets(out, ReplJob)}


def test_async_addjob_in_external_mode_sends_enqueue_to_one_target_and_keeps_nothing() -> None:
    r = Rig(peers=(A, B, C), maxmemory=BASE_MEMORY * 100 // 80)
    job = r.add(replicate=2, async_=True, delay=4)
    out = r.take()
    sent = targets(out, ReplJob)
    assert len(sent) == 2 and all(msg.noreply for _, msg in of(out, ReplJob))
    ((to, msg),) = of(out, EnqueueJob)
    assert to in sent and msg.aux == 4
    assert r.node.lookup_job(job.id) is None


def test_norepl_when_too_few_nodes_are_reachable() -> None:
    r = Rig(peers=(A,))
    with pytest.raises(CommandError) as info:
        r.add(replicate=3)
    assert (info.value.prefix, info.value.message) == ("NOREPL", NOREPL_PLAIN)


def test_norepl_of_a_leaving_node_says_why() -> None:
    r = Rig(peers=(A, B))
    r.node.set_leaving(True)
    with pytest.raises(CommandError) as info:
        r.add(replicate=3)  # external: 3 copies needed, 2 reachable
    assert info.value.message == NOREPL_WHY + "I'm leaving the cluster"
    with pytest.raises(CommandError) as info:
        r.add(replicate=4, async_=True)  # two short: the plain text, ASYNC alike
    assert info.value.message == NOREPL_PLAIN


def test_norepl_of_a_node_out_of_memory_says_why() -> None:
    r = Rig(peers=(A, B), maxmemory=BASE_MEMORY * 100 // 80)
    with pytest.raises(CommandError) as info:
        r.add(replicate=3, async_=True)
    assert info.value.message == NOREPL_WHY + "I'm out of memory"


# ---------------------------------------------------------------------------- down nodes
# Issue 25: copies go only to linked nodes (reachable, bus link up), as the original's
# clusterReplicateJob ("No link, no party"); a killed node's link resets at once, long
# before it is flagged PFAIL, and from then on nothing waits for it.
def test_copies_never_go_to_a_node_whose_link_is_down() -> None:
    r = Rig(peers=(A, B, C))
    r.drop_link(C)
    assert set(r.m.reachable()) == {A, B, C}  # not PFAIL yet: still reachable
    for _ in range(50):
        job, _client = r.add_sync(replicate=2)
        assert C not in job.delivered
        job = r.add(replicate=3, async_=True)
        assert C not in job.delivered
    assert C not in {n for n, _ in r.take()}


def test_all_linked_nodes_is_the_membership_tuple_so_consecutive_jobs_batch() -> None:
    r = Rig(peers=(A, B, C))
    r.drop_link(C)
    jobs = [r.add_sync(replicate=3)[0] for _ in range(3)]  # needs A and B: all linked
    out = r.take()
    assert [n for n, _ in out] == [A, B]  # one message per node for the three jobs
    assert [rec.id for rec in out[0][1].items] == [j.id for j in jobs]
    assert all(j.delivered == (ME, A, B) for j in jobs)


def test_the_retry_tick_adds_only_linked_nodes() -> None:
    r = Rig(peers=(A, B, C, D))
    r.drop_link(C)
    r.drop_link(D)
    job, client = r.add_sync(replicate=2, timeout=10_000)
    (first,) = targets(r.take(), ReplJob)
    for _ in range(5):
        r.advance(50 + RES)  # the first target is silent (stopped, slow)
    assert set(job.delivered) == {ME, A, B}
    assert {n for n, _ in r.take()} == {A, B}
    assert job.state == WAIT_REPL and not client.added


def test_a_link_drop_gives_the_replications_waiting_on_that_node_another_one_at_once() -> None:
    r = Rig(peers=(A, B, C))
    waiting = [r.add_sync(replicate=3, timeout=10_000) for _ in range(40)]
    r.take()
    on_a = [(job, client) for job, client in waiting if A in job.delivered]
    assert on_a and len(on_a) < len(waiting)
    for job, _client in on_a[::2]:  # the other target (B or C) confirmed half of them
        other = next(n for n in job.delivered if n not in (ME, A))
        r.node.on_message(other, GotJob(hdr(other), job.id))
    before = {job.id: job.delivered for job, _ in waiting}
    r.drop_link(A)  # A was killed: no timer runs, the event alone re-targets
    out = r.take()
    for job, client in waiting:
        if job not in [j for j, _ in on_a]:
            assert job.delivered == before[job.id]  # not waiting on A: untouched
            continue
        (new,) = [n for n in job.delivered if n not in before[job.id]]
        assert new != A and job.delivered[:3] == before[job.id]  # A stays listed
        sent = {n: msg for n, msg in out if type(msg) is ReplJob and msg.job.id == job.id}
        assert A not in sent  # no link: nothing to send it on
        # every other holder learns the full list; the confirmed one needs not answer
        assert set(sent) == set(job.delivered) - {ME, A}
        assert all(set(msg.job.delivered) == set(job.delivered) for msg in sent.values())
        assert all(msg.noreply == (n in job.confirmed) for n, msg in sent.items())
        assert any(msg.noreply for msg in sent.values()) == (len(job.confirmed) == 2)
        r.node.on_message(new, GotJob(hdr(new), job.id))
        confirmers = [n for n in job.delivered if n not in (ME, A, new)]
        for n in confirmers:
            r.node.on_message(n, GotJob(hdr(n), job.id))
        assert client.added == [job.id] and job.state == QUEUED


def test_a_link_drop_of_a_node_that_confirmed_changes_nothing() -> None:
    r = Rig(peers=(A, B, C, D))
    job, client = r.add_sync(replicate=3, timeout=10_000)
    t1, t2 = targets(r.take(), ReplJob)
    r.node.on_message(t1, GotJob(hdr(t1), job.id))
    before = job.delivered
    r.drop_link(t1)  # its copy is confirmed: nothing to replace
    assert job.delivered == before and r.take() == []


# A REPLJOB lost with a dropped link leaves its node listed without a copy (a phantom):
# the other holders count it, and repair sees enough copies where there are fewer. The
# simulation's seed 288 lost a job so: its creator and one holder crashed, the last real
# holder went down before its repair reached the job.
def test_a_node_listed_without_confirming_gets_the_job_when_its_link_comes_back() -> None:
    r = Rig(peers=(A, B, C))
    job, client = r.add_sync(replicate=3, timeout=10_000)
    lost, t2 = targets(r.take(), ReplJob)
    r.drop_link(lost)  # its REPLJOB went with the link: another node is targeted
    (t3,) = [n for n in job.delivered if n not in (ME, lost, t2)]
    r.take()
    r.node.on_message(t2, GotJob(hdr(t2), job.id))
    r.node.on_message(t3, GotJob(hdr(t3), job.id))
    assert client.added == [job.id] and lost in job.delivered
    assert r.take() == []  # no link to it yet

    def reconnect() -> list[tuple[bytes, Any]]:
        r.now += 150  # (the reconnect backoff)
        r.link(lost)
        r.advance(CLUSTER_CRON + RES)  # re-replication's cron sends what is due
        return [(n, m) for n, m in r.take() if isinstance(m, (ReplJob, ReplJobBatch))]

    # sent again once its link is back, until it answers: a REPLJOB is lost with a broken
    # link (re-replication's copies: every CONFIRM_MS while unconfirmed and reachable)
    for _ in range(2):
        ((to, msg),) = reconnect()
        assert to == lost and not msg.noreply
        (rec,) = msg.messages() if isinstance(msg, ReplJobBatch) else [msg]
        assert rec.job.id == job.id and set(rec.job.delivered) == set(job.delivered)
        r.drop_link(lost)
        r.advance(CONFIRM_MS)
    r.node.on_message(lost, GotJob(hdr(lost), job.id))
    assert (lost, job.id) not in r.node.rereplication.inflight
    assert reconnect() == []


def test_an_acknowledged_job_is_not_sent_to_a_node_that_never_confirmed_it() -> None:
    r = Rig(peers=(A, B, C))
    job, client = r.add_sync(replicate=3, timeout=10_000)
    lost, t2 = targets(r.take(), ReplJob)
    r.drop_link(lost)
    (t3,) = [n for n in job.delivered if n not in (ME, lost, t2)]
    r.node.on_message(t2, GotJob(hdr(t2), job.id))
    r.node.on_message(t3, GotJob(hdr(t3), job.id))
    assert client.added == [job.id]
    r.node.ackjob([job.id])  # acknowledged: its copies are collected, none is made
    r.take()
    r.now += 150
    r.link(lost)
    r.advance(CLUSTER_CRON + RES)
    assert not [m for _, m in r.take() if isinstance(m, (ReplJob, ReplJobBatch))]
    assert not r.node.rereplication.inflight


def test_a_linked_node_listed_without_confirming_gets_the_job_when_it_is_added() -> None:
    r = Rig(peers=(A, B, C))
    job, client = r.add_sync(replicate=2, timeout=10_000)
    (slow,) = targets(r.take(), ReplJob)
    r.advance(50 + RES)  # silent: the retry tick adds another node
    (other,) = [n for n in job.delivered if n not in (ME, slow)]
    r.take()
    r.node.on_message(other, GotJob(hdr(other), job.id))
    assert client.added == [job.id]
    sent = of(r.take(), ReplJob)
    assert [(n, m.noreply, m.job.id) for n, m in sent] == [(slow, False, job.id)]
    r.node.on_message(slow, GotJob(hdr(slow), job.id))
    assert not r.node.rereplication.inflight


def test_a_job_acked_before_its_copies_are_confirmed_is_not_sent_again() -> None:
    r = Rig(peers=(A, B, C))
    job, client = r.add_sync(replicate=3, timeout=10_000)
    t1, t2 = targets(r.take(), ReplJob)
    r.node.on_message(t1, SetAck(hdr(t1), job.id, 3))  # acked elsewhere already
    assert not of(r.take(), ReplJob) and not r.node.rereplication.inflight


def test_a_link_drop_with_no_other_linked_node_waits_and_times_out_with_norepl() -> None:
    r = Rig(peers=(A, B))
    r.drop_link(B)
    job, client = r.add_sync(replicate=2, timeout=1000)
    assert job.delivered == (ME, A) and targets(r.take(), ReplJob) == [A]
    r.drop_link(A)  # nobody left to take it: nothing to send, no crash
    assert job.delivered == (ME, A) and r.take() == []
    r.advance(1000 + RES)
    assert [(e.prefix, e.message) for e in client.errors] == [("NOREPL", NOREPL_TIMEOUT)]
    assert r.node.lookup_job(job.id) is None and not r.node.replication.replicating


def test_with_fewer_linked_nodes_than_needed_a_link_coming_up_completes_the_job() -> None:
    r = Rig(peers=(A, B))
    r.drop_link(A)
    r.drop_link(B)
    job, client = r.add_sync(replicate=3, timeout=10_000)  # 2 reachable: no NOREPL
    assert job.delivered == (ME,) and r.take() == []
    r.advance(200 + RES)  # the retry ticks find nobody to send to
    assert job.delivered == (ME,) and r.take() == []
    r.link(B)  # B restarted: its link is up, it is a target at once
    ((to, msg),) = r.take()
    assert to == B and type(msg) is ReplJob and not msg.noreply
    assert job.delivered == (ME, B) and msg.job.delivered == (ME, B)
    r.node.on_message(B, GotJob(hdr(B), job.id))
    r.now += 150  # (A's reconnect backoff)
    r.link(A)
    by_node = {n: m for n, m in of(r.take(), ReplJob)}
    assert set(by_node) == {A, B} and by_node[B].noreply and not by_node[A].noreply
    r.node.on_message(A, GotJob(hdr(A), job.id))
    assert client.added == [job.id] and job.state == QUEUED


def test_a_link_coming_up_leaves_replications_with_enough_prospects_alone() -> None:
    r = Rig(peers=(A, B, C))
    r.drop_link(C)
    job, client = r.add_sync(replicate=2, timeout=10_000)
    r.take()
    r.link(C)
    assert r.take() == [] and C not in job.delivered


def test_norepl_counts_reachable_nodes_even_with_their_links_down() -> None:
    r = Rig(peers=(A, B))
    r.drop_link(A)
    r.drop_link(B)
    job = r.add(replicate=3, async_=True)  # best effort, nobody linked: kept here only
    assert job.state == QUEUED and job.delivered == (ME,)
    with pytest.raises(CommandError) as info:
        r.add(replicate=4)
    assert info.value.message == NOREPL_PLAIN


def test_an_async_external_addjob_with_no_linked_node_is_refused_not_lost() -> None:
    r = Rig(peers=(A, B), maxmemory=BASE_MEMORY * 100 // 80)  # external: no local copy
    r.drop_link(A)
    r.drop_link(B)
    with pytest.raises(CommandError) as info:
        r.add(replicate=2, async_=True)
    assert (info.value.prefix, info.value.message) == ("NOREPL", NOREPL_PLAIN)
    r.now += 150
    r.link(A)
    job = r.add(replicate=2, async_=True)  # one linked copy, asked to queue it
    out = r.take()
    assert targets(out, ReplJob) == [A] and targets(out, EnqueueJob) == [A]
    assert r.node.lookup_job(job.id) is None


def test_at_most_once_jobs_refuse_replicate_above_one() -> None:
    r = Rig()
    with pytest.raises(CommandError) as info:
        r.add(retry=0)  # default REPLICATE is min(3, size) = 3
    assert "REPLICATE to 1" in info.value.message
    job = r.add(retry=0, replicate=1)
    assert job.state == QUEUED and r.take() == []


# ---------------------------------------------------------------------------- ENQUEUE
def test_enqueue_with_delay_zero_queues_at_once_even_an_at_most_once_job() -> None:
    r = Rig()
    job = r.replica(retry=0)
    r.node.on_message(A, EnqueueJob(hdr(A), job.id, 0))
    assert job.state == QUEUED and r.qlen() == 1
    assert r.take() == []  # silent: the first queueing of the job anywhere


def test_enqueue_with_a_delay_schedules_the_queueing() -> None:
    r = Rig()
    job = r.replica(retry=0)
    r.node.on_message(A, EnqueueJob(hdr(A), job.id, 5))
    assert job.state == ACTIVE and job.qtime == T0 + 5000
    r.advance(4990)
    assert job.state == ACTIVE
    r.advance(10 + RES)
    assert job.state == QUEUED and r.qlen() == 1


def test_enqueue_is_ignored_for_a_queue_paused_in_input_and_for_unknown_jobs() -> None:
    r = Rig()
    job = r.replica()
    qtime = job.qtime
    r.node.pause(b"q", PAUSE_IN)
    r.node.on_message(A, EnqueueJob(hdr(A), job.id, 0))
    assert job.state == ACTIVE and job.qtime == qtime and r.qlen() == 0
    r.node.on_message(A, EnqueueJob(hdr(A), r.ids.new_id(60, 1), 0))
    assert r.take() == []


# ---------------------------------------------------------------------------- re-queue
def test_willqueue_goes_out_500_ms_before_the_requeue_then_queued_with_a_delivery() -> None:
    r = Rig(peers=(A, B, C))
    job = r.replica(retry=10, delivered=(A, B, ME))
    qtime = job.qtime
    r.advance(qtime - 500 - r.now - 1)
    assert r.take() == []
    r.advance(1 + RES)
    out = r.take()
    assert targets(out, WillQueue) == [A, B] and len(out) == 2
    r.advance(qtime - r.now - 1)
    assert job.state == ACTIVE and r.take() == []
    r.advance(1 + RES)
    # The timer queues a replica: it counts as an additional delivery everywhere.
    assert job.state == QUEUED and r.qlen() == 1 and job.deliveries == 1
    out = r.take()
    assert targets(out, Queued) == [A, B]
    assert all(msg.aux == QUEUED_INCR_DELIV for _, msg in out)
    assert near(job.qtime, r.now + 10_000, 250 + RES)


def test_a_requeue_by_timer_of_a_job_queued_before_counts_a_delivery() -> None:
    r = Rig()
    job, client = r.add_sync(replicate=2, retry=5)
    (t1,) = targets(r.take(), ReplJob)
    r.node.on_message(t1, GotJob(hdr(t1), job.id))
    assert job.deliveries == 0  # the creator's first queueing is silent
    (got,) = r.node.get_jobs([b"q"], 1)
    assert got is job and job.state == ACTIVE
    r.take()
    r.advance(5_300)
    assert job.state == QUEUED and job.deliveries == 1
    assert [(n, m.aux) for n, m in of(r.take(), Queued)] == [(t1, QUEUED_INCR_DELIV)]


def test_a_job_handed_to_a_consumer_announces_willqueue_500_ms_before_its_requeue() -> None:
    """Checklist section 10: WILLQUEUE goes out 500 ms before the requeue of an *active* job.
    The usual active job is one a consumer took and did not acknowledge yet."""
    r = Rig()
    job, client = r.add_sync(replicate=2, retry=5)
    (t1,) = targets(r.take(), ReplJob)
    r.node.on_message(t1, GotJob(hdr(t1), job.id))
    r.node.get_jobs([b"q"], 1)
    qtime = job.qtime
    r.advance(qtime - 500 - r.now + RES)
    assert job.state == ACTIVE
    assert targets(r.take(), WillQueue) == [t1]


def test_a_queued_job_whose_requeue_time_passes_stays_queued_and_sends_nothing() -> None:
    r = Rig()
    job = r.queued_replica(retry=2)
    r.advance(10_000)
    assert job.state == QUEUED and r.qlen() == 1 and job.deliveries == 0
    assert r.take() == []


def test_a_due_requeue_into_a_queue_paused_in_input_is_postponed() -> None:
    r = Rig()
    job = r.replica(retry=2)
    r.node.pause(b"q", PAUSE_IN)
    r.advance(2_300)
    assert job.state == ACTIVE and r.qlen() == 0
    assert near(job.qtime, T0 + 4_000, 500 + RES)


def test_willqueue_from_a_node_when_queued_here_broadcasts_queued() -> None:
    r = Rig(peers=(A, B, C))
    job = r.queued_replica(delivered=(A, ME))
    r.node.on_message(B, WillQueue(hdr(B), job.id))
    assert B in job.delivered  # the sender may have it
    out = r.take()
    assert targets(out, Queued) == [A, B]
    assert all(msg.aux == 0 for _, msg in out)


def test_willqueue_for_an_active_job_only_records_the_sender() -> None:
    r = Rig(peers=(A, B, C))
    job = r.replica(delivered=(A, ME))
    r.node.on_message(C, WillQueue(hdr(C), job.id))
    assert C in job.delivered and r.take() == []
    r.node.on_message(C, WillQueue(hdr(C), r.ids.new_id(60, 1)))  # unknown: nothing
    assert r.take() == []


def test_willqueue_for_an_acked_job_answers_setack_to_the_sender() -> None:
    r = Rig(peers=(A, B, C))
    job = r.replica(delivered=(A, B, ME))
    r.node.ack_job(job)
    r.node.on_message(B, WillQueue(hdr(B), job.id))
    ((to, msg),) = r.take()
    assert to == B and type(msg) is SetAck and msg.aux == holders_aux(job.delivered)
    assert msg.aux & HOLDERS_COUNT_MASK == 3


def queued_pair(job_id: bytes) -> tuple[bytes, bytes]:
    """Two node IDs (winner, loser) for this job's tie-break."""
    x, y = b"1" * 40, b"2" * 40
    return (x, y) if sender_wins(x, y, job_id) else (y, x)


def test_queued_tie_break_dequeues_the_duplicate_on_the_loser_only() -> None:
    r0 = Rig()
    rec = r0.record()
    winner, loser = queued_pair(rec.id)
    rigs = {}
    for me, other in ((winner, loser), (loser, winner)):
        r = Rig(peers=(A, other), myself=me)
        r.node.on_message(A, ReplJob(hdr(A), rec._replace(delivered=(A, winner, loser)), True))
        job = r.node.lookup_job(rec.id)
        assert job is not None
        r.node.on_message(A, EnqueueJob(hdr(A), job.id, 0))
        assert job.state == QUEUED
        r.node.on_message(other, Queued(hdr(other), job.id, QUEUED_INCR_DELIV))
        rigs[me] = (r, job)
    r, job = rigs[winner]
    assert job.state == QUEUED and r.qlen() == 1
    r, job = rigs[loser]
    assert job.state == ACTIVE and r.qlen() == 0


def test_queued_pushes_the_requeue_time_by_retry() -> None:
    r = Rig()
    job = r.replica(retry=30)
    r.now += 20_000
    r.node.on_message(B, Queued(hdr(B), job.id, 0))
    assert job.state == ACTIVE and near(job.qtime, r.now + 30_000)
    r.advance(29_000 - 500 - 250 - 1)
    assert r.take() == []  # no WILLQUEUE for the old requeue time


def test_queued_does_not_make_an_at_most_once_job_requeueable() -> None:
    r = Rig()
    job = r.replica(retry=0)
    r.node.on_message(B, Queued(hdr(B), job.id, 0))
    assert job.qtime == 0


@pytest.mark.parametrize(("flags", "nacks", "deliveries"), [
    (0, 0, 0), (QUEUED_INCR_NACKS, 1, 0), (QUEUED_INCR_DELIV, 0, 1)])
def test_queued_bumps_the_counter_its_flag_names(flags: int, nacks: int,
                                                deliveries: int) -> None:
    r = Rig()
    job = r.replica()
    r.node.on_message(B, Queued(hdr(B), job.id, flags))
    assert (job.nacks, job.deliveries) == (nacks, deliveries)


def test_queued_for_an_acked_job_answers_setack() -> None:
    r = Rig()
    job = r.replica(delivered=(A, B, ME))
    r.node.ack_job(job)
    r.node.on_message(B, Queued(hdr(B), job.id, QUEUED_INCR_DELIV))
    ((to, msg),) = r.take()
    assert to == B and type(msg) is SetAck and msg.aux == holders_aux(job.delivered)
    assert job.deliveries == 0 and job.state == ACKED


def test_queued_for_an_unknown_job_is_ignored() -> None:
    r = Rig()
    r.node.on_message(B, Queued(hdr(B), r.ids.new_id(60, 1), 0))
    assert r.take() == [] and len(r.node.jobs) == 0


# ---------------------------------------------------------------------------- WORKING, NACK
def test_working_dequeues_postpones_and_tells_the_other_holders() -> None:
    r = Rig(peers=(A, B, C))
    job = r.queued_replica(retry=20, delivered=(A, B, ME))
    r.now += 5000
    assert r.node.working(job.id) == 20
    assert job.state == ACTIVE and r.qlen() == 0
    assert near(job.qtime, r.now + 20_000)
    assert targets(r.take(), WorkingJob) == [A, B]


def test_on_working_always_dequeues_postpones_and_counts_nothing() -> None:
    r = Rig()
    job = r.queued_replica(retry=20)
    r.now += 5000
    r.node.on_message(B, WorkingJob(hdr(B), job.id))
    assert job.state == ACTIVE and r.qlen() == 0
    assert near(job.qtime, r.now + 20_000)
    assert (job.nacks, job.deliveries) == (0, 0) and r.take() == []


def test_on_working_leaves_an_acked_job_alone() -> None:
    r = Rig()
    job = r.replica()
    r.node.ack_job(job)
    r.node.on_message(B, WorkingJob(hdr(B), job.id))
    assert job.state == ACKED and r.take() == []


def test_nack_counts_a_nack_and_broadcasts_queued_incr_nacks() -> None:
    r = Rig(peers=(A, B))
    job = r.queued_replica(delivered=(A, B, ME))
    r.node.get_jobs([b"q"], 1)
    assert r.node.enqueue_jobs([job.id], nack=True) == 1
    assert job.state == QUEUED and job.nacks == 1 and job.deliveries == 0
    out = r.take()
    assert targets(out, Queued) == [A, B]
    assert all(msg.aux == QUEUED_INCR_NACKS for _, msg in out)


def test_nack_delay_postpones_here_and_tells_the_holders_the_delay() -> None:
    r = Rig(peers=(A, B))
    job = r.queued_replica(retry=20, delivered=(A, B, ME))
    r.node.get_jobs([b"q"], 1)
    assert r.node.nack_jobs([job.id], delay=30) == 1
    assert job.state == ACTIVE and job.nacks == 1 and job.qtime == r.now + 30_000
    out = r.take()
    assert targets(out, WorkingJob) == [A, B] and all(m.aux == 30 for _, m in out)
    r.advance(30_000)  # the delay ends: queued again, still one nack and no delivery
    assert job.state == QUEUED and (job.nacks, job.deliveries) == (1, 0)
    out = r.take()
    assert all(m.aux == 0 for _, m in out if isinstance(m, Queued)), out


def test_on_working_with_a_delay_counts_a_nack_and_waits_delay_plus_retry() -> None:
    r = Rig()
    job = r.queued_replica(retry=20)
    r.node.on_message(B, WorkingJob(hdr(B), job.id, 30))
    assert job.state == ACTIVE and job.nacks == 1 and job.deliveries == 0
    assert near(job.qtime, r.now + 50_000)


def test_enqueue_of_a_job_queued_before_counts_a_delivery_and_broadcasts_it() -> None:
    r = Rig(peers=(A, B))
    job = r.queued_replica(delivered=(A, B, ME))
    r.node.get_jobs([b"q"], 1)
    assert r.node.enqueue_jobs([job.id], nack=False) == 1
    assert job.deliveries == 1 and job.nacks == 0
    out = r.take()
    assert targets(out, Queued) == [A, B]
    assert all(msg.aux == QUEUED_INCR_DELIV for _, msg in out)


# ---------------------------------------------------------------------------- ACK GC
def test_ackjob_of_a_job_nobody_else_holds_deletes_it_at_once() -> None:
    r = Rig()
    job = r.add(replicate=1)
    assert r.node.ackjob([job.id]) == 1
    assert r.node.lookup_job(job.id) is None and r.take() == []


def test_ackjob_sends_setack_with_the_holder_count_to_every_other_holder() -> None:
    r = Rig(peers=(A, B, C))
    job = r.queued_replica(delivered=(A, B, ME))
    assert r.node.ackjob([job.id]) == 1
    assert job.state == ACKED and r.qlen() == 0 and job.confirmed == (ME,)
    out = r.take()
    assert targets(out, SetAck) == [A, B]
    assert all(m.aux == holders_aux(job.delivered) for _, m in out)
    assert all(m.aux & HOLDERS_COUNT_MASK == 3 for _, m in out)
    assert r.node.ackjob([job.id]) == 0  # already acked: only another GC attempt
    assert targets(r.take(), SetAck) == [A, B]


def test_gc_skips_holders_no_longer_known_and_deletes_when_none_is_left() -> None:
    r = Rig(peers=(A,))
    job = r.queued_replica(delivered=(A, C, ME))  # C: forgotten / never known here
    r.node.ackjob([job.id])
    assert targets(r.take(), SetAck) == [A]
    r2 = Rig(peers=(A,))
    job2 = r2.queued_replica(delivered=(C, D, ME))
    r2.node.ackjob([job2.id])
    assert r2.node.lookup_job(job2.id) is None and r2.take() == []


def gc_attempts(r: Rig, until_ms: int) -> list[int]:
    """Times at which SETACK rounds went out, advancing 1 ms at a time up to `until_ms`."""
    times = []
    end = r.now + until_ms
    while r.now < end:
        nd = r.node.next_due()
        step = max(1, min(end, nd if nd is not None else end) - r.now)
        r.advance(step)
        if of(r.take(), SetAck):
            times.append(r.now)
    return times


def test_gc_is_retried_with_a_doubling_backoff_capped_at_180_s_and_jitter() -> None:
    r = Rig(peers=(A, B))
    job = r.queued_replica(delivered=(A, B, ME), ttl=86400)
    r.node.ackjob([job.id])
    start = r.now
    r.take()
    times = [start, *gc_attempts(r, 1_200_000)]
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    assert len(gaps) >= 10
    for k, gap in enumerate(gaps):
        base = min(1000 << min(k, GC_MAX_ATTEMPT), GC_MAX_MS)
        assert base - 250 <= gap <= base + 250 + RES, (k, gaps)
    assert job.gc_retry == GC_MAX_ATTEMPT


def test_setack_for_an_unknown_job_answers_gotack_not_known() -> None:
    r = Rig()
    jid = r.ids.new_id(3600, 10)
    r.node.on_message(A, SetAck(hdr(A), jid, 2))
    assert [(n, type(m), m.aux) for n, m in r.take()] == [(A, GotAck, 0)]
    assert r.node.lookup_job(jid) is None  # no dummy from a SETACK


def test_setack_when_the_sender_knows_as_many_holders_acks_and_answers_gotack() -> None:
    r = Rig(peers=(A, B))
    job = r.queued_replica(delivered=(A, B, ME))
    r.node.on_message(A, SetAck(hdr(A), job.id, 3))
    assert job.state == ACKED and r.qlen() == 0
    assert [(n, type(m), m.aux) for n, m in r.take()] == [(A, GotAck, 1)]


def test_a_job_acked_by_setack_gets_its_own_gc_timer() -> None:
    """ACK-JOB step 2 ("schedule first call to TIMER") and the TIMER "for every acknowledged
    job in memory: START-GC": a holder that got SETACK but never the final DELJOB (lost with
    a broken link) must still collect the job, not keep it until its TTL."""
    r = Rig(peers=(A, B))
    job = r.queued_replica(delivered=(A, B, ME), ttl=86400)
    r.node.on_message(A, SetAck(hdr(A), job.id, 3))
    r.take()
    r.advance(5 * 60_000)
    assert set(targets(r.take(), SetAck)) == {A, B}


def test_setack_from_a_node_knowing_fewer_holders_starts_our_gc_without_gotack() -> None:
    r = Rig(peers=(A, B, C))
    job = r.queued_replica(delivered=(A, B, C, ME))
    r.node.on_message(A, SetAck(hdr(A), job.id, 2))
    out = r.take()
    assert job.state == ACKED
    assert of(out, GotAck) == []
    assert targets(out, SetAck) == [A, B, C]
    assert all(m.aux == holders_aux(job.delivered) for _, m in of(out, SetAck))


def test_a_holder_collecting_over_another_list_is_not_cut_short_by_a_deljob() -> None:
    """Chaos random-kill seed 3: a holder whose list named C (the acking node's did not)
    ran its own GC, its SETACK to C went with a link reset, and the acking node's DELJOB
    deleted the job here: nobody asked C again, and C delivered its copy 8 s after the ACK.
    A GC's DELJOB carries the digest of its list: a node whose own GC runs over another
    list goes on with it, and its own DELJOB ends the job."""
    r = Rig(peers=(A, B, C, D))
    job = r.queued_replica(delivered=(A, B, C, ME))
    r.node.on_message(A, SetAck(hdr(A), job.id, holders_aux((A, B, D, ME))))
    assert targets(r.take(), SetAck) == [A, B, C]  # our GC, C included
    r.node.on_message(A, DelJob(hdr(A), job.id, holders_aux((A, B, D, ME))))
    assert r.node.lookup_job(job.id) is job and job.state == ACKED
    for peer, known in ((A, 0), (B, 1), (C, 1)):
        r.node.on_message(peer, GotAck(hdr(peer), job.id, known))
    assert set(targets(r.take(), DelJob)) == {A, B, C}
    assert r.node.lookup_job(job.id) is None
    # a DELJOB over the same list, or without a digest (FASTACK), deletes at once
    for aux in (holders_aux((A, B, C, ME)), 0):
        other = r.queued_replica(delivered=(A, B, C, ME))
        r.node.on_message(A, SetAck(hdr(A), other.id, holders_aux((A, B, D, ME))))
        r.take()
        r.node.on_message(A, DelJob(hdr(A), other.id, aux))
        assert r.node.lookup_job(other.id) is None


def test_setack_zero_from_a_dummy_ack_answers_gotack_known_and_starts_gc() -> None:
    r = Rig(peers=(A, B))
    job = r.queued_replica(delivered=(A, ME))
    r.node.on_message(B, SetAck(hdr(B), job.id, 0))
    out = r.take()
    assert [(n, m.aux) for n, m in of(out, GotAck)] == [(B, 1)]
    assert [(n, m.aux) for n, m in of(out, SetAck)] == [(A, holders_aux(job.delivered))]
    assert job.state == ACKED


def test_setack_from_a_node_listing_other_holders_starts_our_gc_once() -> None:
    """Lists shrink here too (re-replication unlists a restarted node whose copies are
    elsewhere): two holders can list as many nodes, but not the same. Chaos random-kill
    seed 9: the acking node listed (itself, B, A, D), this node (itself, A, B, C); the count
    alone said "nothing more here", C was never asked and delivered its copy 2.8 s after
    the ACK. The SETACK's digest of the sender's list tells this node to run the GC over
    its own; once its GC is under way, another such SETACK only gets a GOTACK (two
    holders with different lists would otherwise restart each other's GC forever)."""
    r = Rig(peers=(A, B, C, D))
    job = r.queued_replica(delivered=(A, B, C, ME))
    r.node.on_message(A, SetAck(hdr(A), job.id, holders_aux((A, B, D, ME))))
    out = r.take()
    assert job.state == ACKED and of(out, GotAck) == []
    assert targets(out, SetAck) == [A, B, C]
    r.node.on_message(A, SetAck(hdr(A), job.id, holders_aux((A, B, D, ME))))
    assert [(n, type(m), m.aux) for n, m in r.take()] == [(A, GotAck, 1)]
    # the same nodes, in another order: nothing to add
    r2 = Rig(peers=(A, B, C))
    job2 = r2.queued_replica(delivered=(A, B, C, ME))
    r2.node.on_message(B, SetAck(hdr(B), job2.id, holders_aux((ME, C, B, A))))
    assert [(n, type(m), m.aux) for n, m in r2.take()] == [(B, GotAck, 1)]


def test_setack_for_a_job_waiting_for_replication_finishes_the_replication_first() -> None:
    r = Rig(peers=(A, B))
    job, client = r.add_sync(replicate=3)
    r.take()
    r.node.on_message(A, SetAck(hdr(A), job.id, 3))
    assert client.added == [job.id] and not client.errors
    assert job.state == ACKED and r.qlen() == 0


def test_setack_for_an_external_job_waiting_without_any_confirmation_does_not_crash() -> None:
    """A SETACK (say the SETACK(0) of a dummy ACK made on a third node) for a job waiting for
    its copies in external mode, before any GOTJOB: replication is "achieved" with nobody
    to send the ENQUEUE to. The original (jobReplicationAchieved) sends no ENQUEUE when
    nodes_confirmed is empty, answers the client and drops the local copy."""
    r = Rig(peers=(A, B), maxmemory=BASE_MEMORY * 100 // 80)
    job, client = r.add_sync(replicate=2)
    r.take()
    assert job.confirmed == ()  # external: no GOTJOB yet
    r.node.on_message(A, SetAck(hdr(A), job.id, 0))
    assert client.added == [job.id] and not client.errors
    assert r.node.lookup_job(job.id) is None and job.id not in r.node.replication.replicating
    assert of(r.take(), EnqueueJob) == []


def test_gotack_collects_confirmations_then_deljob_to_every_holder() -> None:
    r = Rig(peers=(A, B, C))
    job = r.queued_replica(delivered=(A, B, ME))
    r.node.ackjob([job.id])
    r.take()
    r.node.on_message(A, GotAck(hdr(A), job.id, 1))
    assert r.node.lookup_job(job.id) is job and r.take() == []
    r.node.on_message(C, GotAck(hdr(C), job.id, 0))  # not a holder, did not know: no vote
    assert r.node.lookup_job(job.id) is job and r.take() == []
    r.node.on_message(B, GotAck(hdr(B), job.id, 0))  # a holder that forgot it: confirmed
    assert r.node.lookup_job(job.id) is None
    assert targets(r.take(), DelJob) == [A, B]


def test_gotack_known_from_a_new_node_adds_it_to_the_holders() -> None:
    r = Rig(peers=(A, B, C))
    job = r.queued_replica(delivered=(A, ME))
    r.node.ackjob([job.id])
    r.take()
    r.node.on_message(C, GotAck(hdr(C), job.id, 1))
    assert C in job.delivered and C in job.confirmed
    r.node.on_message(A, GotAck(hdr(A), job.id, 1))
    assert r.node.lookup_job(job.id) is None
    assert targets(r.take(), DelJob) == [A, C]


def test_gotack_for_an_unknown_job_is_ignored() -> None:
    r = Rig()
    r.node.on_message(A, GotAck(hdr(A), r.ids.new_id(60, 1), 1))
    assert r.take() == [] and len(r.node.jobs) == 0


def dummy(r: Rig) -> tuple[bytes, Job]:
    jid = r.ids.new_id(3600, 10)
    assert r.node.ackjob([jid]) == 0
    job = r.node.lookup_job(jid)
    assert job is not None and job.flags & F_DUMMY and job.state == ACKED
    return jid, job


def test_ackjob_of_an_unknown_at_least_once_id_creates_a_dummy_ack_broadcast_setack_0() -> None:
    r = Rig(peers=(A, B))
    jid, job = dummy(r)
    assert job.delivered == () and job.confirmed == (ME,)
    assert job.queue is None and job.body is None
    assert job.etime == T0 + id_ttl_minutes(jid) * 60_000
    out = r.take()
    assert targets(out, SetAck) == [A, B] and all(m.aux == 0 for _, m in out)


def test_a_dummy_ack_is_dropped_when_a_node_knowing_the_job_answers() -> None:
    r = Rig(peers=(A, B))
    jid, _ = dummy(r)
    r.take()
    r.node.on_message(A, GotAck(hdr(A), jid, 1))
    assert r.node.lookup_job(jid) is None and r.take() == []


def test_a_dummy_ack_is_dropped_when_every_node_of_the_cluster_says_unknown() -> None:
    r = Rig(peers=(A, B))
    jid, _ = dummy(r)
    r.take()
    r.node.on_message(A, GotAck(hdr(A), jid, 0))
    assert r.node.lookup_job(jid) is not None
    r.node.on_message(A, GotAck(hdr(A), jid, 0))  # the same node twice is one answer
    assert r.node.lookup_job(jid) is not None
    r.node.on_message(B, GotAck(hdr(B), jid, 0))
    assert r.node.lookup_job(jid) is None and r.take() == []


def test_a_dummy_ack_expires_with_the_ttl_of_its_id() -> None:
    r = Rig(peers=(A, B))
    jid = r.ids.new_id(120, 1)  # 2 minutes, odd: 3
    r.node.ackjob([jid])
    ttl_ms = id_ttl_minutes(jid) * 60_000
    r.advance(ttl_ms - 1000)
    assert r.node.lookup_job(jid) is not None
    r.advance(1000 + RES)
    assert r.node.lookup_job(jid) is None


def test_no_dummy_ack_for_at_most_once_ids_alone_or_leaving() -> None:
    r = Rig(peers=(A, B))
    amo = r.ids.new_id(3600, 0)
    assert not id_is_at_least_once(amo)
    assert r.node.ackjob([amo]) == 0
    assert r.node.lookup_job(amo) is None and r.take() == []
    alone = Rig(peers=())
    jid = alone.ids.new_id(3600, 10)
    alone.node.ackjob([jid])
    assert alone.node.lookup_job(jid) is None and alone.take() == []
    r.node.set_leaving(True)
    jid = r.ids.new_id(3600, 10)
    r.node.ackjob([jid])
    assert r.node.lookup_job(jid) is None and r.take() == []


def test_fastack_deletes_and_sends_deljob_to_the_holders() -> None:
    r = Rig(peers=(A, B, C))
    job = r.queued_replica(delivered=(A, B, ME))
    assert r.node.fastack([job.id]) == 1
    assert r.node.lookup_job(job.id) is None and r.qlen() == 0
    out = r.take()
    assert targets(out, DelJob) == [A, B] and len(out) == 2


def test_fastack_of_an_unknown_id_sends_deljob_to_every_node() -> None:
    r = Rig(peers=(A, B, C))
    jid = r.ids.new_id(3600, 10)
    assert r.node.fastack([jid]) == 0
    assert targets(r.take(), DelJob) == [A, B, C]
    assert r.node.lookup_job(jid) is None  # no dummy


@pytest.mark.parametrize("state", ["active", "queued", "acked"])
def test_deljob_deletes_the_local_copy_in_any_state(state: str) -> None:
    r = Rig()
    job = r.queued_replica() if state == "queued" else r.replica()
    if state == "acked":
        r.node.ack_job(job)
    r.node.on_message(A, DelJob(hdr(A), job.id))
    assert r.node.lookup_job(job.id) is None and r.qlen() == 0
    assert r.take() == []
    r.node.on_message(A, DelJob(hdr(A), job.id))  # unknown: nothing


# ---------------------------------------------------------------------------- NEEDJOBS
def needjobs(out: list[tuple[bytes, Any]]) -> list[tuple[bytes, int]]:
    return sorted((n, m.count) for n, m in of(out, NeedJobs))


def test_a_blocking_getjob_broadcasts_needjobs_for_one_job() -> None:
    r = Rig(peers=(A, B))
    client = GetClient([b"q"])
    r.node.block(client, 0)
    assert needjobs(r.take()) == [(A, 1), (B, 1)]


def test_the_needjobs_broadcast_also_asks_leaving_nodes() -> None:
    """A leaving node is still a source (issue 5: "no NEEDJOBS, ... still a source for
    others"; it drains to zero jobs): the original broadcasts NEEDJOBS to every node of the
    table (`clusterSendNeedJobs(q->name,1,server.cluster->nodes)`), not only to the nodes
    ADDJOB may replicate to. Otherwise jobs queued on a leaving node are never pulled: its
    QUEUED answers to WILLQUEUE keep the other holders from requeueing them, and GETJOB on
    it answers -LEAVING."""
    r = Rig(peers=(A,))
    r.m.load([ClusterNode(B, b"10.0.0.9", 7711, bits=LEAVING)])
    assert r.m.reachable() == (A,)
    r.node.block(GetClient([b"q"]), 0)
    assert needjobs(r.take()) == [(A, 1), (B, 1)]


def test_needjobs_broadcasts_back_off_from_2_s_doubling_to_30_s() -> None:
    r = Rig(peers=(A, B))
    r.node.block(GetClient([b"q"]), 0)
    times = [r.now]
    r.take()
    for _ in range(200_000 // 100):
        r.advance(100)
        if of(r.take(), NeedJobs):
            times.append(r.now)
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    assert len(gaps) >= 5
    for k, gap in enumerate(gaps, start=1):
        base = min(2000 << k, 30_000)  # the k-th broadcast so far sets the next delay
        assert base <= gap <= base + 100 + RES, (k, gaps)
    assert gaps[-1] == pytest.approx(30_000, abs=100 + RES)


def fresh(q: Any, node_id: bytes, now: int) -> None:
    q.needjobs_responders[node_id] = now


def test_adhoc_needjobs_to_recent_sources_backs_off_from_25_ms_doubling_to_2_s() -> None:
    r = Rig(peers=(A, B))
    q = r.node.create_queue(b"q")
    q.needjobs_bcast_time = r.now  # keep the broadcasts out of the way
    q.needjobs_bcast_attempt = 5
    times = []
    for t in range(r.now, r.now + 9000):
        fresh(q, A, t)
        r.node.need_jobs(q, t)
        out = r.take()
        if of(out, NeedJobs):
            assert targets(out, NeedJobs) == [A]
            times.append(t)
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    assert len(gaps) >= 8
    for k, gap in enumerate(gaps, start=1):
        base = min(25 << k, 2000)
        assert base <= gap <= base + 1, (k, gaps)


@pytest.mark.parametrize(("rate", "responders", "count"), [
    (0, 1, 5), (60, 2, 30), (1000, 2, 100), (9, 1, 9)])
def test_adhoc_needjobs_asks_for_the_import_rate_per_source_within_5_to_100(
        rate: int, responders: int, count: int) -> None:
    r = Rig(peers=(A, B))
    q = r.node.create_queue(b"q")
    q.needjobs_bcast_time = r.now
    q.import_rate = rate
    for n in (A, B)[:responders]:
        fresh(q, n, r.now)
    r.node.need_jobs(q, r.now)
    assert {c for _, c in needjobs(r.take())} == {count}


def test_a_queue_reaching_zero_asks_its_sources_at_once() -> None:
    r = Rig(peers=(A, B))
    r.node.on_message(A, YourJobs(hdr(A), [r.record(), r.record()]))
    q = r.node.lookup_queue(b"q")
    assert q is not None and len(q.jobs) == 2
    q.needjobs_bcast_time = r.now  # no broadcast due
    r.node.need_jobs(q, r.now)  # an ad hoc request right now...
    r.take()
    r.now += 1
    r.node.get_jobs([b"q"], 1)
    assert r.take() == []  # not empty yet
    r.node.get_jobs([b"q"], 1)  # ...and the queue empties 1 ms later: asked again
    assert [n for n, _ in needjobs(r.take())] == [A]


def test_sources_are_forgotten_after_5_s() -> None:
    r = Rig(peers=(A, B))
    q = r.node.create_queue(b"q")
    q.needjobs_bcast_time = r.now
    fresh(q, A, r.now - RESPONDER_VALID_MS - 1)
    r.node.need_jobs(q, r.now)
    assert r.take() == [] and q.needjobs_responders == {}


def test_needjobs_within_both_backoffs_sends_nothing_and_qstat_hides_stale_sources() -> None:
    r = Rig(peers=(A, B))
    q = r.node.create_queue(b"q")
    q.needjobs_bcast_time = q.needjobs_adhoc_time = r.now
    fresh(q, A, r.now - RESPONDER_VALID_MS - 1)
    fresh(q, B, r.now)
    r.node.need_jobs(q, r.now + 1)  # both backoffs running: nothing due
    assert r.take() == []
    assert r.node.import_sources(q) == [B]  # (A gave jobs over 5 s ago)
    r.now += 25  # the ad hoc backoff has passed: B is asked, A forgotten
    r.node.need_jobs(q, r.now)
    assert [n for n, _ in needjobs(r.take())] == [B]
    assert list(q.needjobs_responders) == [B]


def test_a_leaving_node_never_asks_for_jobs() -> None:
    r = Rig(peers=(A, B))
    q = r.node.create_queue(b"q")
    fresh(q, A, r.now)
    r.node.set_leaving(True)
    r.node.need_jobs(q, r.now, reached_zero=True)
    assert r.take() == []
    with pytest.raises(CommandError) as info:
        r.node.block(GetClient([b"q"]), 0)
    assert info.value.prefix == "LEAVING"


def test_needjobs_is_ignored_for_a_queue_paused_in_output() -> None:
    r = Rig(peers=(A, B))
    r.queued_replica()
    r.node.pause(b"q", PAUSE_OUT)
    r.node.on_message(B, NeedJobs(hdr(B), b"q", 5))
    assert r.take() == [] and r.qlen() == 1
    r.node.pause(b"q", 0)
    assert r.take() == [] and r.qlen() == 1  # and not remembered either


def test_needjobs_finding_nothing_is_remembered_briefly_for_jobs_queued_meanwhile() -> None:
    """A deliberate change from the original (which drops the request; the asker retries
    after its backoff): a NEEDJOBS for an empty or unknown queue is kept NEEDER_HOLD_MS, and
    a job queued here meanwhile goes straight to the asker."""
    r = Rig(peers=(A, B))
    r.node.on_message(B, NeedJobs(hdr(B), b"q", 5))
    assert r.take() == []
    r.now += NEEDER_HOLD_MS - 1
    job = r.replica()
    r.node.on_message(A, EnqueueJob(hdr(A), job.id, 0))
    ((to, msg),) = r.take()
    assert to == B and type(msg) is YourJobs and [x.id for x in msg.jobs] == [job.id]
    assert job.state == ACTIVE and r.qlen() == 0 and B in job.delivered
    r.node.on_message(B, NeedJobs(hdr(B), b"q", 5))
    r.now += NEEDER_HOLD_MS + 1
    r.queued_replica()  # too late: it stays here
    assert r.take() == [] and r.qlen() == 1


def test_a_job_added_while_a_needjobs_is_remembered_goes_to_the_asker() -> None:
    r = Rig(peers=(A, B))
    r.node.create_queue(b"q")
    r.node.on_message(B, NeedJobs(hdr(B), b"q", 1))
    job = r.add(replicate=1)
    ((to, msg),) = r.take()
    assert to == B and [x.id for x in msg.jobs] == [job.id]
    assert job.state == ACTIVE and r.qlen() == 0
    job2 = r.add(replicate=1)  # the asker got its one job: forgotten
    assert r.take() == [] and job2.state == QUEUED


def test_needjobs_is_ignored_while_we_import_the_queue_ourselves() -> None:
    r = Rig(peers=(A, B))
    r.node.on_message(A, YourJobs(hdr(A), [r.record() for _ in range(4)]))
    assert r.node.lookup_queue(b"q").import_rate > 0
    r.node.on_message(B, NeedJobs(hdr(B), b"q", 1))
    assert r.take() == [] and r.qlen() == 4


@pytest.mark.parametrize(("qlen", "count", "given"), [
    (10, 5, 5), (10, 6, 5), (1, 5, 1), (3, 1, 1), (2, 1, 1), (7, 100, 3)])
def test_needjobs_gets_count_or_half_the_queue_at_least_one(qlen: int, count: int,
                                                           given: int) -> None:
    r = Rig(peers=(A, B))
    jobs = [r.queued_replica() for _ in range(qlen)]
    q = r.node.lookup_queue(b"q")
    out_before = q.jobs_out
    r.node.on_message(B, NeedJobs(hdr(B), b"q", count))
    ((to, msg),) = r.take()
    assert to == B and type(msg) is YourJobs and len(msg.jobs) == given
    moved = [j for j in jobs if j.state != QUEUED]
    assert [rec.id for rec in msg.jobs] == [j.id for j in moved]
    assert r.qlen() == qlen - given and q.jobs_out == out_before + given
    for j in moved:
        assert j.state == ACTIVE and B in j.delivered and r.node.lookup_job(j.id) is j
        rec = next(x for x in msg.jobs if x.id == j.id)
        assert B in rec.delivered


def test_needjobs_moves_at_most_once_jobs_away_for_good() -> None:
    r = Rig(peers=(A, B))
    job = r.queued_replica(retry=0)
    r.node.on_message(B, NeedJobs(hdr(B), b"q", 1))
    ((to, msg),) = r.take()
    assert [rec.id for rec in msg.jobs] == [job.id]
    assert r.node.lookup_job(job.id) is None and r.qlen() == 0


# ---------------------------------------------------------------------------- YOURJOBS
def test_yourjobs_queues_the_jobs_and_records_the_source() -> None:
    r = Rig(peers=(A, B))
    recs = [r.record(delivered=(A, B)) for _ in range(3)]
    r.node.on_message(A, YourJobs(hdr(A), recs))
    q = r.node.lookup_queue(b"q")
    assert q is not None and len(q.jobs) == 3
    for rec in recs:
        job = r.node.lookup_job(rec.id)
        assert job is not None and job.state == QUEUED and ME in job.delivered
        assert near(job.qtime, r.now + 10_000)
    assert r.node.import_sources(q) == [A]
    assert r.take() == []  # no QUEUED broadcast for imports


def test_yourjobs_queues_at_most_once_jobs_too() -> None:
    """Seed bug: "At-most-once jobs are lost in cluster exchange" (disque-issues.txt)."""
    r = Rig(peers=(A, B))
    rec = r.record(retry=0, delivered=(A,))
    r.node.on_message(A, YourJobs(hdr(A), [rec]))
    job = r.node.lookup_job(rec.id)
    assert job is not None and job.state == QUEUED and r.qlen() == 1
    (got,) = r.node.get_jobs([b"q"], 1)
    assert got is job
    r.advance(600_000)
    assert job.state == ACTIVE and r.qlen() == 0  # delivered once, never again


def test_yourjobs_serves_a_blocked_consumer() -> None:
    r = Rig(peers=(A, B))
    client = GetClient([b"q"])
    r.node.block(client, 0)
    rec = r.record()
    r.node.on_message(A, YourJobs(hdr(A), [rec]))
    assert [j.id for j in client.jobs] == [rec.id]


def test_yourjobs_of_a_job_acked_here_answers_setack_instead_of_queueing() -> None:
    r = Rig(peers=(A, B))
    job = r.replica(delivered=(A, ME))
    r.node.ack_job(job)
    r.take()
    r.node.on_message(A, YourJobs(hdr(A), [r.record(job_id=job.id)]))
    assert job.state == ACKED and r.qlen() == 0
    assert [(n, type(m)) for n, m in r.take()] == [(A, SetAck)]


def test_yourjobs_of_a_job_held_here_active_queues_our_copy() -> None:
    r = Rig(peers=(A, B))
    job = r.replica(delivered=(A, ME))
    r.node.on_message(A, YourJobs(hdr(A), [r.record(job_id=job.id)]))
    assert job.state == QUEUED and r.qlen() == 1 and len(r.node.jobs) == 1


def test_yourjobs_of_a_job_held_here_keeps_the_senders_delivery_counters() -> None:
    """A requeue by timer can hand a job straight to a node whose NEEDJOBS its holder
    remembered; that node already holds a copy that never saw the deliveries counted at the
    holder. The copy took its own counters, so the next GETJOB there reported
    additional-deliveries 0 for a job delivered once already (seen in
    test_worker_cluster). The counters are the larger of the two, and the holder list the
    union."""
    r = Rig(peers=(A, B))
    job = r.replica(delivered=(A, ME))
    job.nacks = 1  # counted here earlier
    rec = r.record(job_id=job.id, delivered=(A, ME, B))._replace(nacks=0, deliveries=2)
    r.node.on_message(A, YourJobs(hdr(A), [rec]))
    assert job.state == QUEUED
    assert (job.nacks, job.deliveries) == (1, 2)
    assert set(job.delivered) == {A, ME, B}


def test_yourjobs_logs_a_job_new_here_to_the_aof() -> None:
    """A job another node moves here (YOURJOBS) is a copy this node now holds: it goes to
    the AOF like a REPLJOB copy, or a kill -9 and restart lose it here (seen in
    test_command_fuzz: a queued job with an hour to live gone after the restart)."""
    r = Rig(peers=(A, B))
    logged: list[bytes] = []
    r.node.persist = SimpleNamespace(loadjob=lambda job: logged.append(job.id),
                                     addjob=lambda job: None, deljob=lambda job_id: None,
                                     last_write_error=None)
    held = r.replica(delivered=(A, ME))
    logged.clear()
    new = r.record(delivered=(A,))
    r.node.on_message(A, YourJobs(hdr(A), [new, r.record(job_id=held.id)]))
    assert logged == [new.id]  # the copy held here was logged when it arrived


def test_a_new_source_resets_the_broadcast_backoff() -> None:
    r = Rig(peers=(A, B))
    q = r.node.create_queue(b"q")
    q.needjobs_bcast_attempt = 4
    q.needjobs_adhoc_attempt = 6
    r.node.on_message(A, YourJobs(hdr(A), [r.record()]))
    assert (q.needjobs_bcast_attempt, q.needjobs_adhoc_attempt) == (0, 0)
    q.needjobs_bcast_attempt = 4
    q.needjobs_adhoc_attempt = 6
    r.node.on_message(A, YourJobs(hdr(A), [r.record()]))  # A again: not new
    assert q.needjobs_bcast_attempt == 4 and q.needjobs_adhoc_attempt == 0


def test_the_import_rate_rises_with_imports_and_decays_to_zero() -> None:
    r = Rig(peers=(A, B))
    r.node.on_message(A, YourJobs(hdr(A), [r.record() for _ in range(10)]))
    q = r.node.lookup_queue(b"q")
    assert q.import_rate > 0
    assert q in r.node.federation.importing
    r.advance(10_000)  # cluster_cron every 100 ms
    assert q.import_rate == 0 and q not in r.node.federation.importing


# ---------------------------------------------------------------------------- PAUSE, LEAVING
def test_pause_bcast_sends_the_resulting_state_to_every_reachable_node() -> None:
    r = Rig(peers=(A, B, C))
    r.node.pause(b"q", PAUSE_IN | PAUSE_OUT)
    r.node.broadcast_pause(b"q")
    out = r.take()
    assert targets(out, PauseQueue) == [A, B, C]
    assert all(m.queue == b"q" and m.flags == 3 for _, m in out)


def test_on_pause_applies_the_state_creating_the_queue() -> None:
    r = Rig()
    r.node.on_message(A, PauseQueue(hdr(A), b"q", PAUSE_IN))
    q = r.node.lookup_queue(b"q")
    assert q is not None and q.paused == PAUSE_IN
    r.node.on_message(A, PauseQueue(hdr(A), b"q", 0))
    assert q.paused == 0
    r.node.on_message(A, PauseQueue(hdr(A), b"other", 0))
    assert r.node.lookup_queue(b"other") is None


def test_leaving_wakes_blocked_getjob_and_addjob_clients_with_leaving() -> None:
    r = Rig(peers=(A, B, C))
    getter = GetClient([b"q"])
    r.node.block(getter, 0)
    job, adder = r.add_sync(replicate=3)
    sent = targets(r.take(), ReplJob)
    r.node.set_leaving(True)
    assert [e.prefix for e in getter.errors] == ["LEAVING"]
    assert [e.prefix for e in adder.errors] == ["LEAVING"]
    assert r.node.lookup_job(job.id) is None
    assert targets(r.take(), DelJob) == sent
    q = r.node.lookup_queue(b"q")
    assert not q.waiters and r.node.blocked == 0


def test_a_leaving_node_still_gives_its_jobs_away() -> None:
    r = Rig(peers=(A, B))
    job = r.queued_replica()
    r.node.set_leaving(True)
    r.node.on_message(B, NeedJobs(hdr(B), b"q", 1))
    ((to, msg),) = r.take()
    assert to == B and [x.id for x in msg.jobs] == [job.id]


# ---------------------------------------------------------------------------- tie-break
node_ids = st.binary(min_size=20, max_size=20).map(lambda b: b.hex().encode())
job_ids = st.binary(min_size=18, max_size=18).map(
    lambda b: b"D-aaaaaaaa-" + __import__("base64").b64encode(b) + b"-0e11")


@given(node_ids, node_ids, job_ids)
def test_sender_wins_is_antisymmetric(x: bytes, y: bytes, jid: bytes) -> None:
    assert len(jid) == 40
    if x == y:
        assert not sender_wins(x, y, jid)
    else:
        assert sender_wins(x, y, jid) != sender_wins(y, x, jid)


def test_the_tie_break_winner_depends_on_the_job() -> None:
    gen = IdGenerator(A, random.Random(5).randbytes)
    x, y = b"1" * 40, b"2" * 40
    assert len({sender_wins(x, y, gen.new_id(60, 1)) for _ in range(64)}) == 2


def test_an_unanswered_needjobs_is_forgotten_after_the_hold_time() -> None:
    r = Rig(peers=(A, B))
    for i in range(100):
        r.node.on_message(A, NeedJobs(r.m.header, b"reply-%d" % i, 5))
    assert len(r.node.needers) == 100
    r.advance(NEEDER_HOLD_MS + 60_000)  # a minute after every entry's `until`
    assert len(r.node.needers) == 0, f"{len(r.node.needers)} stale NEEDJOBS entries kept"


# ---------------------------------------------------------------------------- audit findings
# GETJOB side effects and NEEDJOBS / import rate (checklist sections 4 and 10).
def test_getjob_nohang_on_an_empty_queue_asks_the_cluster_for_jobs() -> None:
    """Checklist 4 GETJOB: "for every empty queue a NEEDJOBS attempt (section 10) is made
    (creating an empty queue object if unknown)" - also for NOHANG and for the queues a
    non-blocking fetch found empty (original getjobCommand calls needJobsForQueue[Name]
    with NEEDJOBS_CLIENTS_WAITING for every queue it could not pop from). disque-py only
    asks when the client blocks (Node.block), so a consumer polling with GETJOB NOHANG
    never pulls jobs queued on other nodes."""
    r = Rig()
    assert r.node.get_jobs([b"q"], 1) == []  # what cmd_getjob runs before answering *-1
    assert r.node.lookup_queue(b"q") is not None
    assert needjobs(r.take()) == [(A, 1), (B, 1)]


def test_getjob_that_gets_a_job_elsewhere_still_asks_for_its_empty_queues() -> None:
    r = Rig()
    r.node.add_job(b"full", b"x", 0, 1, None, None, 0, None, False)
    r.take()
    jobs = r.node.get_jobs([b"full", b"empty"], 1)
    assert len(jobs) == 1
    # original: the pass over `full` returns before `empty` is tried when COUNT is reached,
    # so use COUNT 2: `empty` is visited and asked for.
    r.node.add_job(b"full", b"y", 0, 1, None, None, 0, None, False)
    r.take()
    jobs = r.node.get_jobs([b"full", b"empty"], 2)
    assert len(jobs) == 1
    assert r.node.lookup_queue(b"empty") is not None
    asked = sorted(n for n, m in r.take() if type(m) is NeedJobs and m.queue == b"empty")
    assert asked == [A, B]


def test_a_queue_reaching_zero_does_not_ask_when_not_importing() -> None:
    """Checklist 10: targeted request "at once when a queue just emptied *while importing*"
    (original needJobsForQueue: `if (type == NEEDJOBS_REACHED_ZERO && import_per_sec == 0)
    return;`). disque-py sends the ad hoc NEEDJOBS on reached-zero whenever a responder is
    still remembered (5 s), even after the import rate dropped to 0."""
    r = Rig()
    r.node.on_message(A, YourJobs(hdr(A), [r.record(), r.record()]))
    q = r.node.lookup_queue(b"q")
    r.advance(3000)  # responder still valid (<5 s); import rate (as disque-py computes it) 0
    r.take()
    q.needjobs_bcast_time = r.now  # no broadcast due either
    q.import_rate = 0  # precondition of this test: not importing any more
    assert q.needjobs_responders
    r.node.get_jobs([b"q"], 1)
    r.node.get_jobs([b"q"], 1)  # the queue empties
    assert needjobs(r.take()) == []


def test_the_import_rate_stays_above_zero_for_the_5_s_window() -> None:
    """Checklist 10: "import-rate window 5 s" (original getQueueImportRate returns 0 only
    when the current 1 s bucket is older than IMPORT_RATE_WINDOW = 5000 ms; before that it
    is ceil(jobs * 1000 / elapsed) >= 1). disque-py's update_import_rate only counts
    samples younger than 2 s, so the rate is 0 from 2 s after the last import: QSTAT
    import-rate, QSCAN IMPORTRATE and the "we import it ourselves" NEEDJOBS rule see 0."""
    r = Rig()
    r.node.on_message(A, YourJobs(hdr(A), [r.record() for _ in range(10)]))
    q = r.node.lookup_queue(b"q")
    r.advance(3000)  # cluster_cron refreshed the rate every 100 ms
    assert q.import_rate > 0
    r.take()
    r.node.on_message(B, NeedJobs(hdr(B), b"q", 1))  # still importing: ignored
    assert r.take() == [] and len(q.jobs) == 10
    r.advance(2500)  # 5.5 s after the import: now it is 0
    assert q.import_rate == 0


# WORKING on an acked job (checklist 4) / GC retry (checklist 10).
def test_working_on_an_acked_job_does_not_postpone_its_gc() -> None:
    """Checklist 4 WORKING: no special case for acked jobs; the requeue time it pushes is
    not the GC schedule (original: updateJobRequeueTime sets qtime, but an acked job's
    awake time comes from getNextGCRetryTime, section 10 "GC retry"). In disque-py an
    acked job keeps its next GC attempt in `qtime`, so WORKING moves the next SETACK round
    from ~1 s to `retry` seconds later (5 minutes with the default RETRY)."""
    r = Rig()
    node = r.node
    jid = r.queued_replica(retry=300).id  # REPLJOB then ENQUEUE from A
    assert node.lookup_job(jid).state == QUEUED
    node.ackjob([jid])
    assert node.lookup_job(jid).state == ACKED
    node.out.clear()
    assert node.working(jid) == 300
    node.out.clear()
    r.advance(2500)  # GC retry: 1000 ms (x2^attempt) +- 250 ms
    assert [n for n, m in node.out if type(m) is SetAck] == [A]


# AOF reload of an at-most-once job (checklist 12).
def test_external_copy_of_an_at_most_once_job_is_not_queued_again_after_a_restart() -> None:
    """The copy a node stores for a creator that keeps none (above 75% of maxmemory or
    LEAVING: ADDJOB ... REPLICATE 1 RETRY 0) is logged at REPLJOB and queued by the
    creator's ENQUEUE, which is not logged."""
    r = Rig(peers=(A,))
    loadjobs: list[bytes] = []  # each LOADJOB payload exactly as the AOF would store it
    log = lambda job: loadjobs.append(serialize_job(job))  # noqa: E731
    r.node.persist = SimpleNamespace(loadjob=log, addjob=log, deljob=lambda job_id: None,
                                     last_write_error=None)
    jid = r.replica(retry=0, ttl=600, repl=1, delivered=()).id
    r.node.on_message(A, EnqueueJob(hdr(A), jid, 0))
    got = r.node.get_jobs([b"q"], 1)
    assert [j.id for j in got] == [jid]  # delivered once
    r.now += 5000
    again = r.node = Node(ME, r.clock, rng=random.Random(9))  # restart: a lone, empty node
    assert again.load_job(deserialize_job(loadjobs[0])[0], False)
    r.advance(60_000)
    back = again.lookup_job(jid)
    assert back is not None and back.state == ACTIVE


def test_no_jobs_are_given_to_a_node_our_link_to_is_down() -> None:
    """A node killed right after its NEEDJOBS: the bus would drop the YOURJOBS (no link),
    leaving the jobs to wait for their RETRY on a dead node; they stay queued here."""
    r = Rig()
    r.drop_link(B)
    r.node.on_message(B, NeedJobs(hdr(B), b"q", 5))  # nothing here yet: remembered
    r.node.add_job(b"q", b"x", 0, 1, None, None, 0, None, False)
    r.node.add_job(b"q", b"y", 0, 1, None, 0, 0, None, False)  # at-most-once
    r.node.on_message(B, NeedJobs(hdr(B), b"q", 5))  # asked again, jobs queued now
    assert not of(r.take(), YourJobs)
    assert r.qlen() == 2
    r.link(B)
    r.node.on_message(B, NeedJobs(hdr(B), b"q", 5))
    assert [len(m.jobs) for _, m in of(r.take(), YourJobs)] == [1]  # max(1, qlen / 2)


# -- ADDJOB DEDUP retried while the first one waits for its copies ------------------------
def test_a_dedup_retry_waits_for_the_same_replication_outcome() -> None:
    r = Rig(peers=(A, B))
    job, first = r.add_sync(replicate=2)
    (t1,) = targets(r.take(), ReplJob)
    retry = AddClient()
    assert r.node.join_replication(job.id, retry)
    r.node.on_message(t1, GotJob(hdr(t1), job.id))
    assert first.added == [job.id] and retry.added == [job.id]


def test_a_dedup_retry_carries_on_when_the_first_client_goes() -> None:
    """The first client timed out and closed its connection, its retry waits: the job must
    not be deleted under the retry (it would be told added, or wait for nothing)."""
    r = Rig(peers=(A, B))
    job, first = r.add_sync(replicate=2)
    (t1,) = targets(r.take(), ReplJob)
    retry = AddClient()
    assert r.node.join_replication(job.id, retry)
    first.cancel()  # the first connection closed
    assert not of(r.take(), DelJob) and r.node.lookup_job(job.id) is job
    r.node.on_message(t1, GotJob(hdr(t1), job.id))
    assert retry.added == [job.id] and not first.added


def test_a_dedup_retry_going_away_leaves_the_first_client_waiting() -> None:
    r = Rig(peers=(A, B))
    job, first = r.add_sync(replicate=2, timeout=1000)
    r.take()
    retry = AddClient()
    assert r.node.join_replication(job.id, retry)
    retry.cancel()
    assert r.node.lookup_job(job.id) is job
    r.advance(1000 + RES)  # the ADDJOB timeout: only the first client is told
    assert [e.prefix for e in first.errors] == ["NOREPL"] and not retry.errors
    assert r.node.lookup_job(job.id) is None
    assert not r.node.join_replication(job.id, AddClient())  # nothing in flight any more


# ---------------------------------------------------------------------------- AOF reload (issue 13)
def reloaded(r: Rig, retry: int = 10) -> Job:
    """A copy of a job A created, read back from this node's AOF after a restart."""
    rec = r.record(retry=retry, delivered=(A, B, ME), repl=3)
    job = Job(rec.id, rec.queue, rec.body, 3, rec.ctime, r.now + rec.ttl_ms, 0, retry,
              rec.delivered)
    job.state = ACTIVE
    assert r.node.load_job(job, False)
    return job


def test_a_reloaded_copy_asks_every_holder_and_is_dropped_when_none_has_it() -> None:
    r = Rig(peers=(A, B))
    job = reloaded(r)
    r.advance(job.qtime - 400 - r.now)  # WILLQUEUE before the requeue, asking for answers
    out = r.take()
    assert targets(out, WillQueue) == [A, B]
    assert all(m.aux & WILLQUEUE_CONFIRM for _, m in of(out, WillQueue))
    for peer in (A, B):  # both collected it after its ACK while we were down
        r.node.on_message(peer, Queued(hdr(peer), job.id, QUEUED_STATE_ONLY | QUEUED_UNKNOWN))
    assert r.node.lookup_job(job.id) is None and r.qlen() == 0


def test_a_reloaded_copy_that_one_holder_knows_is_requeued_as_usual() -> None:
    r = Rig(peers=(A, B))
    job = reloaded(r)
    r.advance(job.qtime - 400 - r.now)  # the WILLQUEUE
    assert of(r.take(), WillQueue)
    r.node.on_message(B, Queued(hdr(B), job.id, QUEUED_STATE_ONLY))  # "I have it"
    r.advance(500)
    assert job.state == QUEUED and r.qlen() == 1


def test_one_holder_that_collected_the_job_drops_a_reloaded_copy() -> None:
    """The chaos run random-kill-aof delivered ~1.5% of its jobs again after their ACK: a
    restarted node's reloaded copy asked both other holders, but they restarted in turn, so
    "collected" answers came one per WILLQUEUE round and never from all of them in one;
    after RELOAD_CONFIRM_ROUNDS the copy was requeued. One "collected" answer is proof of
    the ACK, whatever the other holder says, before or after it, or if it never answers."""
    r = Rig(peers=(A, B))
    job = reloaded(r)
    r.advance(job.qtime - 400 - r.now)  # the first WILLQUEUE round: B is down, silent
    assert of(r.take(), WillQueue)
    r.node.on_message(A, Queued(hdr(A), job.id, QUEUED_STATE_ONLY | QUEUED_UNKNOWN))
    assert r.node.lookup_job(job.id) is None and r.qlen() == 0
    assert job.id in r.node.collected  # so this node answers other reloaded copies too
    r.advance(3 * 20_000)
    assert r.node.lookup_job(job.id) is None and r.qlen() == 0
    # "I have it" first (B: a reloaded copy itself), then A's "collected": dropped all the same
    r2 = Rig(peers=(A, B))
    job2 = reloaded(r2)
    r2.advance(job2.qtime - 400 - r2.now)
    r2.node.on_message(B, Queued(hdr(B), job2.id, QUEUED_STATE_ONLY))
    r2.node.on_message(A, Queued(hdr(A), job2.id, QUEUED_STATE_ONLY | QUEUED_UNKNOWN))
    r2.advance(500)
    assert r2.node.lookup_job(job2.id) is None and r2.qlen() == 0


def test_a_reloaded_copy_nobody_answers_waits_then_is_requeued_anyway() -> None:
    r = Rig(peers=(A, B))
    job = reloaded(r)
    r.advance(job.qtime + 100 - r.now)
    assert job.state == ACTIVE and r.qlen() == 0  # one RETRY more
    r.advance(job.qtime + 100 - r.now)
    assert job.state == ACTIVE
    r.advance(job.qtime + 100 - r.now)  # RELOAD_CONFIRM_ROUNDS: silence never loses a job
    assert job.state == QUEUED


def test_a_reloaded_copy_waits_for_its_holders_while_none_is_reachable() -> None:
    """Chaos random-kill-aof seed 3 delivered ~400 jobs 12-15 s after their ACK: a node
    restarted with its AOF reloaded them while the two holders that had collected them
    were down; their silence counted, and after RELOAD_CONFIRM_ROUNDS the copies were
    requeued. Silence from holders that cannot be reached says nothing: those rounds do not
    count (up to RELOAD_WAIT_ROUNDS in all: a job is never given up)."""
    r = Rig(peers=(A, B))
    job = reloaded(r)
    r.drop_link(A)
    r.drop_link(B)
    for _ in range(RELOAD_CONFIRM_ROUNDS + 2):
        r.advance(job.qtime + 100 - r.now)
        assert job.state == ACTIVE and r.qlen() == 0
    r.link(A)  # back: asked at the next WILLQUEUE, it answers "collected"
    r.advance(job.qtime - 400 - r.now)
    assert A in targets(r.take(), WillQueue)
    r.node.on_message(A, Queued(hdr(A), job.id, QUEUED_STATE_ONLY | QUEUED_UNKNOWN))
    assert r.node.lookup_job(job.id) is None and r.qlen() == 0
    # no holder ever reachable again: requeued after RELOAD_WAIT_ROUNDS
    r2 = Rig(peers=(A, B))
    job2 = reloaded(r2)
    r2.drop_link(A)
    r2.drop_link(B)
    for _ in range(RELOAD_WAIT_ROUNDS - 1):
        r2.advance(job2.qtime + 100 - r2.now)
        assert job2.state == ACTIVE
    r2.advance(job2.qtime + 100 - r2.now)
    assert job2.state == QUEUED


def test_a_reloaded_copy_does_not_vouch_for_another_reloaded_copy() -> None:
    # chaos random-kill-aof seed 3: two restarted nodes had each missed the ACK while down,
    # reloaded the job from their AOFs, and answered each other "I have it": requeued
    r = Rig(peers=(A, B))
    job = reloaded(r)
    r.node.on_message(A, WillQueue(hdr(A), job.id, WILLQUEUE_CONFIRM))
    assert not of(r.take(), Queued)  # silent: our copy proves nothing either
    r.node.on_message(B, Queued(hdr(B), job.id, QUEUED_STATE_ONLY))  # B has it for real
    assert not job.flags & F_RELOADED
    r.node.on_message(A, WillQueue(hdr(A), job.id, WILLQUEUE_CONFIRM))
    (to, msg), = r.take()
    assert to == A and msg.aux & QUEUED_STATE_ONLY and not msg.aux & QUEUED_UNKNOWN


def test_willqueue_asking_for_an_answer_gets_collected_unknown_or_known() -> None:
    r = Rig(peers=(A, B))
    missing = r.record().id
    # never known here (or deleted by a local DELJOB): no proof of an ACK, "requeue it"
    r.node.on_message(A, WillQueue(hdr(A), missing, WILLQUEUE_CONFIRM))
    (to, msg), = r.take()
    assert to == A and msg.aux == QUEUED_STATE_ONLY
    # collected here (a DELJOB from the bus): "unknown", the reloaded copy may drop it
    collected = r.replica(delivered=(A, B, ME))
    r.node.on_message(B, DelJob(hdr(B), collected.id))
    assert r.node.lookup_job(collected.id) is None
    r.node.on_message(A, WillQueue(hdr(A), collected.id, WILLQUEUE_CONFIRM))
    (to, msg), = r.take()
    assert to == A and msg.aux == QUEUED_STATE_ONLY | QUEUED_UNKNOWN
    job = r.replica(delivered=(A, ME))
    r.node.on_message(A, WillQueue(hdr(A), job.id, WILLQUEUE_CONFIRM))
    (to, msg), = r.take()
    assert to == A and msg.aux == QUEUED_STATE_ONLY and job.state == ACTIVE


def collected_here(r: Rig) -> bytes:
    """The ID of a job this node held and collected (a DELJOB from the bus after its ACK)."""
    job = r.replica(delivered=(A, ME))
    r.node.on_message(A, DelJob(hdr(A), job.id))
    assert r.node.lookup_job(job.id) is None and job.id in r.node.collected
    r.take()
    return job.id


@pytest.mark.parametrize("kind", ["willqueue", "queued", "yourjobs"])
def test_a_holder_announcing_a_job_collected_here_is_told_it_was_acknowledged(
        kind: str) -> None:
    """Chaos random-kill-aof seed 3: a node no holder's list named (its copy came from a
    repair; the others' lists, reloaded from their AOFs, had lost it) kept its copy queued
    after the ACK GC; NEEDJOBS moved it to a node that had collected the job, which took
    it as new and delivered it 11 s after its ACK. Whatever announces such a copy to a node
    that collected the job (its WILLQUEUE, its QUEUED, a YOURJOBS) gets a SETACK (may-have
    0), so its holder acknowledges it and runs the GC over its own list."""
    r = Rig(peers=(A, B))
    job_id = collected_here(r)
    if kind == "willqueue":
        r.node.on_message(B, WillQueue(hdr(B), job_id, 0))
    elif kind == "queued":
        r.node.on_message(B, Queued(hdr(B), job_id, QUEUED_INCR_DELIV))
    else:
        r.node.on_message(B, YourJobs(hdr(B), [r.record(job_id=job_id, delivered=(B,))]))
    (to, msg), = r.take()
    assert (to, type(msg), msg.job_id, msg.aux) == (B, SetAck, job_id, 0)
    assert r.node.lookup_job(job_id) is None and r.qlen() == 0  # not brought back here
    # an ID never held here may be the last copy of a live job: no answer
    other = r.record().id
    r.node.on_message(B, WillQueue(hdr(B), other, 0))
    r.node.on_message(B, Queued(hdr(B), other, 0))
    assert r.take() == []


def test_a_holder_told_its_job_was_acknowledged_collects_it_over_its_own_list() -> None:
    r = Rig(peers=(A, B))
    job = r.queued_replica(delivered=(A, B, ME))
    r.node.on_message(A, SetAck(hdr(A), job.id, 0))
    assert job.state == ACKED and r.qlen() == 0
    assert set(targets(r.take(), SetAck)) == {A, B}  # the GC asks every holder it knows


def test_a_copy_received_while_the_aof_loads_keeps_the_holders_it_names() -> None:
    """The bus is up while the AOF loads: a holder's REPLJOB (re-replication, a repair)
    naming a holder the AOF record does not was replaced by the record when the loader
    reached it; the node forgot that holder, and its ACK GC later missed it (a copy
    delivered 11 s after its ACK). The copy stays, with the record's holders too; an
    acknowledged record still acknowledges it."""
    r = Rig(peers=(A, B))
    rec = r.record(delivered=(A, B, ME), repl=3)
    r.node.on_message(A, ReplJob(hdr(A), rec, False))
    copy = r.node.lookup_job(rec.id)
    assert copy is not None
    saved = Job(rec.id, rec.queue, rec.body, 3, rec.ctime, r.now + rec.ttl_ms, 0, 10,
                (A, ME, C))
    saved.state = ACTIVE
    assert r.node.load_job(saved, False)
    assert r.node.lookup_job(rec.id) is copy and set(copy.delivered) == {A, B, ME, C}
    assert not copy.flags & F_RELOADED  # a holder just sent it: alive
    acked = Job(rec.id, rec.queue, None, 3, rec.ctime, r.now + rec.ttl_ms, 0, 10, (A, ME))
    acked.state = ACKED
    assert r.node.load_job(acked, False)
    assert r.node.lookup_job(rec.id) is copy and copy.state == ACKED
    # two records of the AOF: the later one stands, with the holders of both
    first = reloaded(r)
    later = Job(first.id, first.queue, first.body, 3, first.ctime, first.etime, 0, 10,
                (A, ME))
    later.state = ACTIVE
    later.nacks = 2
    assert r.node.load_job(later, False)
    kept = r.node.lookup_job(first.id)
    assert kept is later and set(kept.delivered) == {A, B, ME} and kept.flags & F_RELOADED


def test_a_merge_that_names_a_new_holder_is_logged_to_the_aof() -> None:
    """A node list grown by a REPLJOB's merge (or a repair) was only in memory: after a
    restart the AOF named the holders of the first copy, and this node's ACK GC missed the
    others. The grown list goes to the AOF (a LOADJOB); a merge that adds nobody writes
    nothing."""
    r = Rig(peers=(A, B))
    logged: list[tuple[bytes, tuple[bytes, ...]]] = []
    r.node.persist = SimpleNamespace(
        loadjob=lambda job: logged.append((job.id, job.delivered)), addjob=lambda job: None,
        deljob=lambda job_id: None, ackjob=lambda job: None, last_write_error=None)
    job = r.replica(delivered=(A, ME))
    logged.clear()
    r.node.on_message(A, ReplJob(hdr(A), r.record(job_id=job.id, delivered=(A, ME)), False))
    assert logged == []
    r.node.on_message(B, ReplJob(hdr(B), r.record(job_id=job.id, delivered=(A, B, ME)),
                                 False))
    assert logged == [(job.id, job.delivered)] and B in job.delivered


def test_a_state_only_queued_never_dequeues_or_postpones_our_copy() -> None:
    r = Rig(peers=(A, B))
    job = r.queued_replica(delivered=(A, B, ME))
    qtime = job.qtime
    for peer in (A, B):
        r.node.on_message(peer, Queued(hdr(peer), job.id, QUEUED_STATE_ONLY))
    assert job.state == QUEUED and job.qtime == qtime


def test_the_ids_of_collected_jobs_are_kept_up_to_a_cap_oldest_dropped_first(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import disque.state
    monkeypatch.setattr(disque.state, "COLLECTED_MAX", 2)
    r = Rig(peers=(A, B))
    jobs = [r.replica(delivered=(A, ME)) for _ in range(3)]
    for job in jobs:
        r.node.on_message(A, DelJob(hdr(A), job.id))
    assert list(r.node.collected) == [jobs[1].id, jobs[2].id]
