"""Re-replication (disque.cluster.rereplication), sans-I/O: a node and its Membership on a
fake clock; a peer's restart is a PING whose header announces a new incarnation."""

from __future__ import annotations

import random

from disque.cluster.membership import Connect, Log, Membership
from disque.cluster.messages import (
    INCARNATION_BITS,
    INCARNATION_MASK,
    INCARNATION_SHIFT,
    PERSIST_FLAG,
    TLS_PORT_FLAG,
    TLS_PORT_SHIFT,
    GotJob,
    Header,
    Ping,
    ReplJob,
)
from disque.cluster.nodes import LEAVING
from disque.cluster.records import CONFIRM_MS, MAX_ATTEMPTS, STEP_MS, job_record
from disque.cluster.rereplication import (
    DEFER_MAX_MS,
    FIRST_SIGHT_MS,
    RECHECK_MS,
    SCAN_PER_STEP,
    SKEW_MS,
    STALL_MS,
)
from disque.jobs.job import ACKED, F_RELOADED
from disque.overflow.store import CHUNK
from tests.unit.noderig import IPS, ME, T0, A, B, NodeRig


class Rig(NodeRig):
    def __init__(self, rate: int = 5000) -> None:
        super().__init__(IPS)
        self.node.rereplication.rate = rate
        self.node.repair.rate = 0  # no peer's link drops here
        # the jobs added here look created by B (their IDs name it): this node, not B,
        # sends their copies first (`records.first_sender`: the creator last)
        self.node.ids.prefix = b"D-" + B[:8] + b"-"

    def ping_from(self, peer: bytes, incarnation: int, flags: int = 0) -> None:
        """A PING on an inbound link, announcing the peer's incarnation (and `flags`)."""
        h = Header(peer, IPS[peer], 7711, 17711, incarnation << INCARNATION_SHIFT | flags)
        self.m.link_message(self.link, Ping(h, []), IPS[peer])

    def copy(self, retry: int = 10, delivered: tuple[bytes, ...] = (A, B, ME)) -> bytes:
        """A job of which this node holds a copy (added here with REPLICATE 3)."""
        job = self.node.add_job(b"q", b"body", 0, 3 if retry else 1, 3600, retry, 0, None,
                                True)
        job.delivered = delivered
        self.node.out = []
        return job.id

    def restart(self, peer: bytes) -> None:
        self.ping_from(peer, 1)
        self.cron()
        self.ping_from(peer, 2)

    def info(self) -> dict[str, int]:
        return dict(self.node.rereplication.info_fields())


def repljobs(out: list[tuple[bytes, object]]) -> list[tuple[bytes, bytes]]:
    return [(to, msg.job.id) for to, msg in out if type(msg) is ReplJob]


def test_membership_notes_a_peer_s_incarnation_and_logs_a_change_as_a_restart() -> None:
    r = Rig()
    r.ping_from(A, 7)
    assert r.m.get(A).incarnation == 7
    assert not [e for e in r.m.drain() if type(e) is Log and e.event == "node.restarted"]
    r.ping_from(A, 8)
    assert r.m.get(A).incarnation == 8
    assert [e.fields for e in r.m.drain() if type(e) is Log and e.event == "node.restarted"]


def test_headers_announce_the_node_s_incarnation_above_its_flags() -> None:
    m = Membership(ME, 7711, clock=lambda: T0, rng=random.Random(1), incarnation=12345)
    assert m.header.flags >> INCARNATION_SHIFT == 12345
    m.set_leaving(True)
    assert m.header.flags >> INCARNATION_SHIFT == 12345 and m.header.flags & 32


def test_headers_announce_a_tls_port_that_older_nodes_read_as_a_steady_incarnation() -> None:
    # issue 23: HELLO on a TLS connection lists the TLS ports the headers announce
    m = Membership(ME, 7711, clock=lambda: T0, rng=random.Random(1), incarnation=12345,
                   tls_port=6380)
    flags = m.header.flags
    assert flags & TLS_PORT_FLAG and flags >> TLS_PORT_SHIFT == 6380 and flags < 1 << 63
    assert (flags >> INCARNATION_SHIFT) & INCARNATION_MASK == 12345 and m.me.tls_port == 6380
    r = Rig()
    r.ping_from(A, 7 | 6380 << INCARNATION_BITS, TLS_PORT_FLAG)  # a TLS port: parsed
    assert (r.m.get(A).incarnation, r.m.get(A).tls_port) == (7, 6380)
    old = (1 << 46) | 99  # a sender of the version before: a 47-bit incarnation, no flag
    r.ping_from(B, old)
    assert (r.m.get(B).incarnation, r.m.get(B).tls_port) == (old, 0)
    r.ping_from(B, old)
    assert not [e for e in r.m.drain() if type(e) is Log and e.event == "node.restarted"]


def test_a_restarted_holder_gets_its_copies_again_and_confirms_them() -> None:
    r = Rig()
    jid = r.copy()
    r.ping_from(A, 1)
    assert repljobs(r.cron()) == []  # first heard: no restart
    r.ping_from(A, 2)
    out = r.cron()
    assert repljobs(out) == [(A, jid)]
    (msg,) = [m for _, m in out if type(m) is ReplJob]
    assert set(msg.job.delivered) == {A, B, ME} and not msg.noreply
    assert r.info() == {"rereplication_nodes": 0, "rereplication_pending": 1,
                        "rereplicated_jobs": 0, "rereplication_unlisted": 0,
                        "rereplication_rechecks": 0, "rereplication_rechecked": 0,
                        "rereplication_left": 0}
    r.node.on_message(A, GotJob(Header(A, b"", 7711, 17711, 0), jid))
    assert r.info() == {"rereplication_nodes": 0, "rereplication_pending": 0,
                        "rereplicated_jobs": 1, "rereplication_unlisted": 0,
                        "rereplication_rechecks": 0, "rereplication_rechecked": 0,
                        "rereplication_left": 0}
    assert repljobs(r.cron()) == []


def test_a_node_first_heard_from_long_after_our_start_gets_its_copies() -> None:
    # The simulation's seed 1147: this node restarted while A was down, got a job listing A
    # from another holder, and never saw A restart: A's first incarnation was its new one.
    r = Rig()
    r.ping_from(B, 1)
    assert repljobs(r.cron()) == []  # heard at our start: no restart
    for _ in range(FIRST_SIGHT_MS // 100):
        r.cron()
    jid = r.copy()
    r.ping_from(A, 5)
    assert repljobs(r.cron()) == [(A, jid)]


def test_a_node_heard_late_with_the_incarnation_nodes_conf_kept_did_not_restart() -> None:
    # A busy cluster answered a restarted node's first PINGs ~500 ms late: counted as
    # restarted, both got a copy of every job the refilled node received (overflow: a read
    # from disk each). nodes.conf's incarnation says they did not restart.
    r = Rig()
    r.m.get(A).incarnation = 5  # as Membership.load sets it from nodes.conf
    r.cron()
    for _ in range(FIRST_SIGHT_MS // 100 + 1):
        r.cron()
    jid = r.copy()
    r.ping_from(A, 5)
    assert repljobs(r.cron()) == []
    assert r.info()["rereplication_nodes"] == 0
    r.ping_from(A, 6)  # another one later: a restart
    assert repljobs(r.cron()) == [(A, jid)]


def test_a_node_heard_at_once_with_another_incarnation_than_nodes_conf_s_restarted() -> None:
    r = Rig()
    r.m.get(A).incarnation = 5
    r.cron()
    jid = r.copy()
    r.ping_from(A, 9)  # it restarted while we were down
    assert repljobs(r.cron()) == [(A, jid)]


def test_a_walk_that_finds_little_to_send_goes_on_over_several_steps() -> None:
    r = Rig()
    for _ in range(2 * SCAN_PER_STEP + 1):
        r.copy(delivered=(B, ME))  # not A's: nothing to send, only jobs to look at
    jid = r.copy()
    r.restart(A)
    out = r.cron()  # the cron that notices the restart: the walk's first step
    assert r.info()["rereplication_nodes"] == 1
    steps = 1
    while r.info()["rereplication_nodes"]:
        r.now += STEP_MS
        r.node.tick(r.now)
        out, r.node.out = out + r.node.out, []
        steps += 1
    assert steps >= 2 and repljobs(out) == [(A, jid)]


def test_the_copies_go_out_in_steps_of_the_rate_s_share() -> None:
    # one burst of the cron's whole share (500 at the default rate) held up the GOTJOBs of
    # the ADDJOBs queued behind it at the receiver: each step sends what the rate allows
    # since the one before
    r = Rig(rate=5000)
    r.cron()
    jobs = {r.copy() for _ in range(300)}
    r.restart(A)
    per_step = [len(repljobs(r.cron()))]  # the cron that notices it: the first step
    while r.info()["rereplication_nodes"]:
        r.now += STEP_MS
        r.node.tick(r.now)
        per_step.append(len(repljobs(r.node.out)))
        r.node.out = []
    assert sum(per_step) == len(jobs)
    # (a step finishes the shard it is in: a few more than its share)
    assert max(per_step) <= 5000 * STEP_MS // 1000 + 5 and len(per_step) >= 6


def test_acked_at_most_once_unconfirmed_reloaded_and_unrelated_jobs_are_not_sent() -> None:
    r = Rig()
    acked = r.copy()
    r.node.ack_job(r.node.lookup_job(acked))
    assert r.node.lookup_job(acked).state == ACKED
    r.copy(retry=0)  # at-most-once: a second copy could deliver it twice
    r.copy(delivered=(B, ME))  # A holds no copy of it
    ghost = r.copy()
    r.node.lookup_job(ghost).flags |= F_RELOADED  # read from the AOF, not confirmed yet
    kept = r.copy()
    r.node.out = []
    r.restart(A)
    assert repljobs(r.cron()) == [(A, kept)]


def test_a_restarted_node_that_is_leaving_gets_its_copies_once_it_stops_leaving() -> None:
    # found by `make sim` (seeds 8081, 9266): the copies went to a restarted node marked
    # LEAVING, which refuses them, until their attempts ran out; it never got them back
    r = Rig()
    jid = r.copy()
    r.ping_from(A, 1)
    r.cron()
    r.ping_from(A, 2, LEAVING)
    for _ in range((MAX_ATTEMPTS + 1) * CONFIRM_MS // 100):
        r.ping_from(A, 2, LEAVING)
        assert repljobs(r.cron()) == []
    r.ping_from(A, 2)
    assert repljobs(r.cron()) == [(A, jid)]


def test_copies_wait_while_the_link_to_the_restarted_node_is_down() -> None:
    r = Rig()
    jid = r.copy()
    r.ping_from(A, 1)
    r.cron()
    r.m.link_closed(r.out_links.pop(A))  # restarted, then our link to it dropped
    r.ping_from(A, 2)
    # its PING makes us connect back: until the connect succeeds, nothing is sent
    (connect,) = [e for e in r.m.drain() if type(e) is Connect]
    for _ in range(3):
        assert repljobs(r.cron()) == []
    assert r.info()["rereplication_nodes"] == 1
    r.m.link_connected(object(), connect.token)
    assert repljobs(r.cron()) == [(A, jid)]


def test_copies_are_sent_at_most_at_the_configured_rate() -> None:
    r = Rig(rate=20)  # 2 per 100 ms
    jids = {r.copy() for _ in range(5)}
    r.restart(A)
    sent = [repljobs(r.cron()) for _ in range(4)]
    # the cron that notices the restart sends one at once (a step's share, at least one)
    assert [len(s) for s in sent] == [1, 2, 2, 0]
    assert {j for s in sent for _, j in s} == jids


def test_rate_zero_turns_rereplication_off() -> None:
    r = Rig(rate=0)
    r.copy()
    r.restart(A)
    assert repljobs(r.cron()) == []


def test_an_unconfirmed_copy_is_sent_again_a_bounded_number_of_times() -> None:
    r = Rig()
    jid = r.copy()
    r.restart(A)
    assert repljobs(r.cron()) == [(A, jid)]
    sends = 1
    for _ in range(MAX_ATTEMPTS * CONFIRM_MS // 100 + 20):
        sends += len(repljobs(r.cron()))
    assert sends == MAX_ATTEMPTS
    assert r.info()["rereplication_pending"] == 0


def test_a_second_restart_during_the_walk_starts_it_over() -> None:
    r = Rig(rate=10)  # 1 per cron
    jids = {r.copy() for _ in range(3)}
    r.restart(A)
    first = repljobs(r.cron())
    r.ping_from(A, 3)  # restarted again: the copy sent before is lost too
    rest = [repljobs(r.cron()) for _ in range(4)]
    assert len(first) == 1
    assert {j for s in rest for _, j in s} == jids


def test_a_job_with_its_copies_elsewhere_unlists_the_restarted_node_instead() -> None:
    # Refilling a restarted node with every job it ever held costs a copy per job and
    # restart: with a large backlog and a restart every few seconds, those copies starved
    # the repairs that keep jobs alive (chaos random-kill lost up to a third of its jobs).
    # A job that has its REPLICATE copies without the node (repair made them while it was
    # down) leaves it off its list instead.
    r = Rig()
    enough = r.copy(delivered=(A, B, ME))
    r.node.lookup_job(enough).repl = 2  # ME and B: REPLICATE 2 without A
    short = r.copy(delivered=(A, B, ME))  # REPLICATE 3: needs A's copy again
    r.restart(A)
    assert repljobs(r.cron()) == [(A, short)]
    assert r.node.lookup_job(enough).delivered == (B, ME)
    assert r.node.lookup_job(short).delivered == (A, B, ME)
    assert r.info()["rereplication_unlisted"] == 1
    # a holder itself restarted and not refilled yet does not count as a copy
    again = r.copy(delivered=(A, B, ME))
    r.node.lookup_job(again).repl = 2
    r.node.rereplication.cursors[B] = 0  # B restarted too: our walk for it under way
    r.restart(A)
    assert (A, again) in repljobs(r.cron())


def test_a_restarted_node_with_an_aof_stays_listed_and_gets_its_copies() -> None:
    # It may hold copies again, reloaded: unlisted, it would miss the QUEUED, SETACK and
    # dead-letter exchanges of those copies (the dead-letter simulation's seed 741 kept a
    # dead job queued on two nodes so).
    m = Membership(ME, 7711, clock=lambda: T0, rng=random.Random(1), incarnation=5,
                   persistent=True)
    assert m.header.flags & PERSIST_FLAG
    m.set_persistent(False)
    assert not m.header.flags & PERSIST_FLAG and m.header.flags >> INCARNATION_SHIFT == 5
    r = Rig()
    jid = r.copy(delivered=(A, B, ME))
    r.node.lookup_job(jid).repl = 2  # ME and B: enough without A
    r.ping_from(A, 1, PERSIST_FLAG)
    r.cron()
    r.ping_from(A, 2, PERSIST_FLAG)
    assert r.m.get(A).persistent
    assert repljobs(r.cron()) == [(A, jid)]
    assert r.node.lookup_job(jid).delivered == (A, B, ME)
    assert r.info()["rereplication_unlisted"] == 0


def test_a_copy_received_after_the_walk_listing_the_restarted_node_is_looked_at_again() -> None:
    # Chaos random-kill: B held jobs listing A, and A restarted empty. Our walk for A was
    # over before B's repair sent us copies of those jobs (B's own walk had not come to
    # them), so we counted A as a holder for good: B's walk then unlisted A in its list
    # only, or B died before its walk sent A the job; either way the job had fewer copies
    # than we counted, and no repair saw it one crash from lost.
    b = Rig()  # B's jobs, created before A's restart
    short, enough, again, late = (
        job_record(b.node.lookup_job(b.copy(delivered=(A, B))), b.now) for _ in range(4))
    r = Rig()
    r.restart(A)
    assert repljobs(r.cron()) == [] and r.node.rereplication.cursors == {}  # walk over
    for rec in (short, enough._replace(repl=2), short):
        r.node.on_message(B, ReplJob(Header(B, b"", 7711, 17711, 0), rec, False))
    assert r.info()["rereplication_rechecks"] == 2  # (each job once)
    assert repljobs(r.cron()) == [(A, short.id)]  # REPLICATE 3: A's copy is needed
    assert r.node.lookup_job(enough.id).delivered == (B, ME)  # enough without A: unlisted
    assert r.info()["rereplication_rechecks"] == 0 and r.info()["rereplication_rechecked"] == 1
    # sent by A itself: A holds it
    r.node.on_message(A, ReplJob(Header(A, b"", 7711, 17711, 0), again, False))
    assert r.info()["rereplication_rechecks"] == 0
    # jobs created after the restart list A because A took them: not looked at again;
    # nor, after RECHECK_MS, those created before
    for _ in range(SKEW_MS // 100 + 1):
        r.cron()
    new = r.copy(delivered=(A, B, ME))
    r.node.rereplication.copies_held(B, [new], 0)  # (0: looked at job by job)
    assert r.info()["rereplication_rechecks"] == 0
    # a REPLJOB of such jobs only carries an oldest ctime past every restart's bound, so
    # copies_held returns before looking at it job by job
    rr = r.node.rereplication
    assert rr.recent_before == rr.recent[A][1]
    fresh = job_record(r.node.lookup_job(new), r.now)
    r.node.on_message(B, ReplJob(Header(B, b"", 7711, 17711, 0), fresh, False))
    assert r.node.replication.oldest_held == fresh.ctime >= rr.recent_before
    at, _ = r.node.rereplication.recent[A]
    while A in r.node.rereplication.recent:
        r.cron()
    assert RECHECK_MS <= r.now - at <= RECHECK_MS + 100
    r.node.on_message(B, ReplJob(Header(B, b"", 7711, 17711, 0), late, False))
    assert r.info()["rereplication_rechecks"] == 0


def test_a_recheck_waits_for_the_link_and_ends_with_the_window() -> None:
    b = Rig()
    rec = job_record(b.node.lookup_job(b.copy(delivered=(A, B))), b.now)
    r = Rig()
    r.restart(A)
    r.cron()
    r.m.link_closed(r.out_links.pop(A))  # our link to A dropped
    r.node.on_message(B, ReplJob(Header(B, b"", 7711, 17711, 0), rec, False))
    for _ in range(5):
        assert repljobs(r.cron()) == []
    assert r.info()["rereplication_rechecks"] == 1  # waits for the link
    while A in r.node.rereplication.recent:
        assert repljobs(r.cron()) == []
    r.cron()
    assert r.info()["rereplication_rechecks"] == 0  # still unreachable: dropped


def test_a_node_first_heard_late_opens_the_recheck_window_without_slack() -> None:
    # A restarted while we were down (the simulation's seed 1147, seen from copies that
    # arrive after our walk): a job created long before may list it stale. One created in
    # the second before we first heard from it may not (a cluster's formation: A had just
    # joined, and ADDJOB gave it copies).
    r = Rig()
    r.ping_from(B, 1)
    for _ in range(FIRST_SIGHT_MS // 100 + SKEW_MS // 100 + 2):
        r.cron()
    b = Rig()
    old = job_record(b.node.lookup_job(b.copy(delivered=(A, B))), b.now)
    b.now = r.now - SKEW_MS // 2
    fresh = job_record(b.node.lookup_job(b.copy(delivered=(A, B))), b.now)
    r.ping_from(A, 5)
    assert repljobs(r.cron()) == []  # first heard late: a restart, walked (nothing here)
    for rec in (old, fresh):
        r.node.on_message(B, ReplJob(Header(B, b"", 7711, 17711, 0), rec, False))
    assert list(r.node.rereplication.rechecks) == [(A, old.id)]


# ---------------------------------------------------------------------------- overflow
def on_disk_rig(tmp_path, n: int = 40) -> tuple[Rig, list[bytes]]:  # type: ignore[no-untyped-def]
    """A rig whose node holds n copies, all on disk (issue 22's overflow)."""
    r = Rig()
    jids = [r.copy() for _ in range(n)]
    node = r.node
    r.to_disk(str(tmp_path / "jobs.db"))
    assert node.on_disk == n and all(node.jobs.get(j) is None for j in jids)
    return r, jids


def test_a_restarted_holder_gets_its_copies_on_disk_again(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # sent from disk as they are: reading each back to memory (and writing it out again)
    # made a refill of a node with overflow on cost more than the writes it competed with
    r, jids = on_disk_rig(tmp_path)
    r.ping_from(A, 1)
    r.cron()
    r.ping_from(A, 2)
    sent: set[bytes] = set()
    for _ in range(20):
        sent |= {j for to, j in repljobs(r.cron()) if to == A}
    assert sent == set(jids)
    assert r.node.on_disk == len(jids) and all(r.node.jobs.get(j) is None for j in jids)


def test_a_recheck_sends_jobs_on_disk_without_bringing_them_back(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # (the simulation with overflow on: a job brought back by a recheck queued more
    # rechecks while they were being walked, RuntimeError in the cluster cron; and each
    # job brought back while a walk went on was rechecked and sent again)
    r, jids = on_disk_rig(tmp_path)
    rr = r.node.rereplication
    r.ping_from(A, 1)
    r.cron()
    rr.cursors[A] = r.node.jobs.shard_count()  # walks for A and B past the registry
    rr.cursors[B] = r.node.jobs.shard_count()
    rr.recent[A] = (r.now, r.now * 1_000_000 + 10**15)
    for j in jids:
        rr.rechecks[(A, j)] = None
    rr._recheck(r.now, 1000)
    assert {j for to, j in repljobs(r.node.out) if to == A} == set(jids)
    assert r.node.on_disk == len(jids) and not rr.rechecks


def test_a_job_back_from_disk_is_rechecked_only_where_the_disk_walk_missed_it(tmp_path) -> None:  # type: ignore[no-untyped-def]
    r, jids = on_disk_rig(tmp_path, 3 * CHUNK)
    node = r.node
    store = node.overflow.store
    assert store is not None
    segment: dict[int, list[bytes]] = {}
    for j in jids:
        entry = store._entry(hash(j))  # (place, fresh, its segment)
        assert entry is not None
        chunk = entry[2].id
        segment.setdefault(chunk, []).append(j)
    s1, s2, s3 = sorted(segment)[:3]
    rr = node.rereplication
    count = node.jobs.shard_count()
    rr.cursors[A] = count + s1  # walked up to s1
    rr.disk_ends[A] = s2  # s3 went to disk after the walk of the disk began
    rr.cursors[B] = count  # B's walk of the disk has not begun
    for seg in (s1, s2, s3):
        node.lookup_job(segment[seg][0])  # a GETJOB, an ACK, a SHOW...
    assert set(rr.rechecks) == ({(A, segment[s2][0])}
                                | {(B, segment[c][0]) for c in (s1, s2, s3)})


def test_a_copy_received_again_for_a_job_on_disk_merges_without_a_read(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # every holder of a job sends it to a refilled node: the second copy found the first
    # on disk and read it back to merge nothing (two thirds of the refilled node's time)
    r, jids = on_disk_rig(tmp_path, 3)
    node = r.node
    copy = node.disk_job(jids[0])
    assert copy is not None and set(copy.delivered) == {A, B, ME}
    rec = job_record(copy, r.now)
    node.on_message(B, ReplJob(Header(B, b"", 7711, 17711, 0), rec, False))
    assert [type(m).__name__ for _, m in node.out] == ["GotJob"]
    assert node.on_disk == 3 and node.jobs.get(jids[0]) is None  # answered, not read
    node.out = []
    C = b"c" * 40
    copy.delivered = (A, B, C)  # a node more: read back and merged
    node.on_message(B, ReplJob(Header(B, b"", 7711, 17711, 0), job_record(copy, r.now), False))
    back = node.jobs.get(jids[0])
    assert back is not None and set(back.delivered) == {A, B, C, ME} and node.on_disk == 2


def test_a_copy_the_restarted_node_confirmed_is_not_sent_again_during_its_refill(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # chaos random-kill with overflow: a queued job went to disk and came back every ~1 s
    # (its other holders' WILLQUEUEs read it back), and each time it came back into a
    # shard the walk had passed it was rechecked and sent to the node being refilled
    # again: ~3 copies a job, up to 10, while that node's refill and the urgent repairs
    # waited for the same budget
    r, jids = on_disk_rig(tmp_path, 3)
    node = r.node
    rr = node.rereplication
    r.restart(A)
    rr.rate = 0
    r.cron()  # the restart noticed, no walk yet
    rr.cursors[A] = node.jobs.shard_count()  # the walk is past the registry
    first, second, third = jids
    for j in (first, second):  # copies sent (by the walk, or a repair) and confirmed
        node.on_message(A, GotJob(Header(A, b"", 7711, 17711, 0), j))
    for j in jids:
        node.lookup_job(j)  # back from disk into shards the walk passed
    assert set(rr.rechecks) == {(A, third)}  # only the one A has not confirmed
    assert rr.has_copy(A, first) and not rr.has_copy(A, third) and not rr.has_copy(B, first)
    r.ping_from(A, 3)
    r.cron()  # A restarted again: what it held is gone
    assert not rr.has_copy(A, first) and A in rr.cursors


def test_the_refill_s_walk_skips_the_copies_the_node_confirmed_already() -> None:
    r = Rig()
    jids = [r.copy(delivered=(A, ME)) for _ in range(3)]  # short without A: sent to it
    rr = r.node.rereplication
    r.restart(A)
    rr.rate = 0
    r.cron()  # the restart noticed, no walk yet
    rr.rate = 5000
    rr.got_copy(A, jids[0])  # e.g. a repair's copy, confirmed before the walk came to it
    assert sorted(j for to, j in repljobs(r.cron()) if to == A) == sorted(jids[1:])
    assert A not in rr.cursors and A not in rr.copied  # walked: A counts as a holder now


def _left_to_b(r: Rig) -> bytes:
    """A job this node created (its ID names us: we send its copies last), held by A, B and
    us; A restarts empty: its copy is left to B, which sends first."""
    r.node.ids.prefix = b"D-" + ME[:8] + b"-"
    jid = r.copy()
    r.restart(A)
    assert repljobs(r.cron()) == []
    info = r.info()
    assert (info["rereplication_left"], info["rereplication_nodes"]) == (1, 1)
    return jid


def test_a_copy_another_linked_holder_sends_first_is_left_to_it_until_the_target_confirms() -> None:
    r = Rig()
    jid = _left_to_b(r)
    # B's copy reached A, which tells us (replication's tell_holders): A holds it now
    r.node.on_message(A, GotJob(Header(A, b"", 7711, 17711, 0), jid))
    assert r.node.rereplication.has_copy(A, jid)
    for _ in range((STALL_MS + DEFER_MAX_MS) // 100):
        assert repljobs(r.cron()) == []
    info = r.info()
    assert (info["rereplication_left"], info["rereplication_nodes"]) == (0, 0)  # walk over


def test_a_copy_left_to_a_holder_that_goes_down_is_sent_from_here() -> None:
    r = Rig()
    jid = _left_to_b(r)
    r.m.link_closed(r.out_links.pop(B))
    assert repljobs(r.cron()) == [(A, jid)]
    r.node.on_message(A, GotJob(Header(A, b"", 7711, 17711, 0), jid))
    assert r.info()["rereplication_nodes"] == 0


def test_a_copy_left_to_a_holder_is_sent_once_the_target_confirms_nothing_for_a_while() -> None:
    # that holder lists the job without holding it, or its walk is over: the target's
    # confirmations (to us, for any copy) stop coming
    r = Rig()
    jid = _left_to_b(r)
    sent: list[tuple[bytes, bytes]] = []
    for _ in range(STALL_MS // 100 - 1):
        sent += repljobs(r.cron())
    assert sent == []
    for _ in range(2):
        sent += repljobs(r.cron())
    assert sent == [(A, jid)]


def test_a_copy_left_while_the_target_confirms_others_is_sent_after_the_longest_wait() -> None:
    r = Rig()
    jid = _left_to_b(r)
    sent: list[tuple[bytes, bytes]] = []
    for i in range(DEFER_MAX_MS // 100 - 1):
        r.node.rereplication.got_copy(A, b"other %d" % i)  # the refill goes on
        sent += repljobs(r.cron())
    assert sent == []
    for i in range(2):
        r.node.rereplication.got_copy(A, b"last %d" % i)
        sent += repljobs(r.cron())
    assert sent == [(A, jid)]
