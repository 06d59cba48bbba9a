"""Jobs across a real cluster (issue 5, checklist §13): replication, re-queue, ACK garbage
collection, federation, WORKING / NACK / PAUSE bcast / LEAVING and the memory rules, each
exercised on 3 or 5 real `disque-server` processes formed with CLUSTER MEET.

A test that leaves the cluster as it found it (no node killed, frozen, leaving or
reconfigured) runs on a cluster shared with the other such tests (`shared_cluster`, node
timeout 5 s) and names its queues with `q`; what it counts is its own queue and jobs, which a
late bus message of an earlier test cannot change. The others start their own cluster: node
timeout 5 s, 1000 ms (NODE_TIMEOUT) where killed holders are to be detected down, 3000 ms
where a test must act *before* a killed node is flagged. Every wait is a poll with a generous
deadline. A test that asserts something does *not* happen observes it for a bounded time with
`holds_for`.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from disque.cluster.replication import NOREPL_REMOVED, NOREPL_TIMEOUT
from tests.cluster.conftest import (
    NODE_TIMEOUT,
    Cluster,
    cluster_nodes,
    cmd,
    hello,
    holds_for,
    myid,
    ok,
    parse_fields,
)
from tests.harness import DisqueProcess, wait_for
from tests.integration.resp import Conn, Err, Status, pairs

Q = "q"


# ---------------------------------------------------------------------------- helpers
def add(proc: DisqueProcess, body: str, *opts: Any, queue: str = Q, timeout: int = 5000) -> str:
    """ADDJOB that must succeed; returns the job ID."""
    reply = cmd(proc, "ADDJOB", queue, body, timeout, *opts, timeout=timeout / 1000 + 10)
    assert isinstance(reply, Status), f"ADDJOB on :{proc.port} -> {reply!r}"
    return str(reply)


def show(proc: DisqueProcess, job_id: str) -> dict[str, Any] | None:
    reply = cmd(proc, "SHOW", job_id)
    return None if reply is None else pairs(reply)


def state_of(proc: DisqueProcess, job_id: str) -> str | None:
    s = show(proc, job_id)
    return None if s is None else s["state"].decode()


def states(nodes: Any, job_id: str) -> dict[int, str | None]:
    """SHOW state of the job on every node, by port (None: the node does not know it)."""
    return {p.port: state_of(p, job_id) for p in nodes}


def holders(nodes: Any, job_id: str, live: tuple[str, ...] = ("active", "queued")
            ) -> list[DisqueProcess]:
    return [p for p in nodes if state_of(p, job_id) in live]


def registered_jobs(proc: DisqueProcess) -> int:
    return int(parse_fields(cmd(proc, "INFO", "jobs"))["registered_jobs"])


def all_ids(proc: DisqueProcess) -> list[str]:
    """Every job ID the node holds (JSCAN BUSYLOOP)."""
    reply = cmd(proc, "JSCAN", "BUSYLOOP")
    assert isinstance(reply, list), reply
    return [i.decode() if isinstance(i, bytes) else str(i) for i in reply[1]]


def gone_everywhere(nodes: Any, job_id: str) -> bool:
    return all(show(p, job_id) is None for p in nodes)


def empty_everywhere(nodes: Any) -> bool:
    return all(registered_jobs(p) == 0 for p in nodes)


def jobs_of(proc: DisqueProcess, queue: str) -> list[str]:
    """IDs of the node's jobs of `queue`, in any state (JSCAN BUSYLOOP QUEUE; a dummy ACK has
    no queue and is not listed)."""
    reply = cmd(proc, "JSCAN", "BUSYLOOP", "QUEUE", queue)
    assert isinstance(reply, list), reply
    return [i.decode() if isinstance(i, bytes) else str(i) for i in reply[1]]


def none_left(nodes: Any, queue: str, ids: Any = ()) -> bool:
    """empty_everywhere for the jobs of one test on a shared cluster: no job of `queue` on any
    node, and no trace (a copy or a dummy ACK) of the jobs `ids`. A late bus message of an
    earlier test may still create a job of its own queue; it cannot change this."""
    return (all(not jobs_of(p, queue) for p in nodes)
            and all(gone_everywhere(nodes, j) for j in ids))


def getjob(proc: DisqueProcess, *opts: Any, queue: str = Q, timeout_ms: int = 10000) -> Any:
    """GETJOB TIMEOUT t [opts] FROM queue on a fresh connection; None on timeout."""
    return cmd(proc, "GETJOB", "TIMEOUT", timeout_ms, *opts, "FROM", queue,
               timeout=timeout_ms / 1000 + 10)


def delivered_of(proc: DisqueProcess, job_id: str) -> set[str]:
    s = show(proc, job_id)
    assert s is not None, f"job {job_id} unknown on :{proc.port}"
    return {n.decode() for n in s["nodes-delivered"]}


def by_id(c: Cluster) -> dict[str, DisqueProcess]:
    return {myid(p): p for p in c}


# ---------------------------------------------------------------------------- replication
def test_addjob_replicate_3_is_held_by_exactly_three_nodes(shared_cluster, q):
    c = shared_cluster(5)
    a = c[0]
    jid = add(a, "hello", "REPLICATE", 3, queue=q)
    # Sync replication: by the time the client has the ID, the copies exist.
    assert state_of(a, jid) == "queued"
    others = [p for p in c.nodes[1:] if show(p, jid) is not None]
    assert len(others) == 2, states(c, jid)
    assert all(state_of(p, jid) == "active" for p in others)
    ids = by_id(c)
    delivered = delivered_of(a, jid)
    assert len(delivered) == 3
    assert {ids[n].port for n in delivered} == {a.port} | {p.port for p in others}
    for p in others:
        s = show(p, jid)
        assert s["body"] == b"hello" and s["repl"] == 3 and s["queue"] == q.encode()
        assert {n.decode() for n in s["nodes-delivered"]} == delivered
        assert s["nodes-confirmed"] == []


def test_replicate_1_keeps_a_single_queued_copy(shared_cluster, q):
    c = shared_cluster(3)
    jid = add(c[0], "one", "REPLICATE", 1, queue=q)
    s = show(c[0], jid)
    assert s["state"] == b"queued" and len(s["nodes-delivered"]) == 1
    assert show(c[1], jid) is None and show(c[2], jid) is None


def test_huge_ttl_or_retry_is_refused_and_replication_keeps_working(shared_cluster, q):
    """Regression: `ADDJOB q b 0 TTL 9223372036854775807` in a cluster never returned (the
    bus could not encode the job's expiry and dropped the whole batch of messages with it).
    Now ADDJOB refuses TTL/RETRY beyond 10 years and the cluster keeps replicating."""
    c = shared_cluster(3)
    for opt in ("TTL", "RETRY"):
        reply = cmd(c[0], "ADDJOB", q, "huge", 0, opt, "9223372036854775807", timeout=10)
        assert isinstance(reply, Err) and "at most 315360000 seconds" in reply, reply
    jid = add(c[0], "fine", "TTL", 315360000, "REPLICATE", 3, queue=q)
    assert len(holders(c, jid)) == 3


def test_default_replication_is_three_copies(shared_cluster, q):
    c = shared_cluster(5)
    jid = add(c[2], "default", queue=q)
    assert show(c[2], jid)["repl"] == 3
    assert len(holders(c, jid)) == 3


def test_async_addjob_replies_at_once_and_replicates_in_background(shared_cluster, q):
    c = shared_cluster(5)
    a = c[0]
    jid = add(a, "async", "REPLICATE", 3, "ASYNC", queue=q)
    assert state_of(a, jid) == "queued"  # queued locally right away
    wait_for(lambda: len(holders(c, jid)) == 3, timeout=15, what="three async copies")
    assert [p.port for p in holders(c, jid, ("queued",))] == [a.port]
    assert len(delivered_of(a, jid)) == 3


def test_a_replicated_job_is_queued_on_exactly_one_node(shared_cluster, q):
    """Checklist §13.7: RETRY 1, no consumer: for 3 s one copy is queued, the others stay
    active (the queueing node answers WILLQUEUE with QUEUED, which postpones them)."""
    c = shared_cluster(3)
    jid = add(c[0], "once", "REPLICATE", 3, "RETRY", 1, queue=q)

    def one_queued() -> bool:
        st = states(c, jid)
        return list(st.values()).count("queued") == 1 and list(st.values()).count("active") == 2

    holds_for(one_queued, 3.0, "exactly one queued copy and two active ones")


def test_noreplicate_more_than_reachable_nodes(shared_cluster, q):
    c = shared_cluster(3)
    reply = cmd(c[0], "ADDJOB", q, "x", 1000, "REPLICATE", 4)
    assert isinstance(reply, Err) and reply.startswith("NOREPL"), reply
    assert jobs_of(c[0], q) == []


def test_noreplicate_right_after_killing_nodes_and_extra_nodes_are_tried(cluster):
    """Checklist §13.6: with 2 of 5 nodes freshly killed (not yet flagged: node timeout
    15 s), REPLICATE 5 times out with -NOREPL and leaves no copy behind; REPLICATE 3 (= the
    alive nodes) still succeeds because one more node is tried every 50 ms."""
    c = cluster(5, node_timeout=15000)
    a, b, cc, d, e = c.nodes
    d.kill()
    e.kill()
    reply = cmd(a, "ADDJOB", Q, "too-many", 1000, "REPLICATE", 5)
    assert reply == f"NOREPL {NOREPL_TIMEOUT}", reply  # it waited: d and e counted
    jid = add(a, "just-enough", "REPLICATE", 3, timeout=5000)
    # Both ADDJOBs ran while a still counted d and e as reachable (a dead node, once
    # flagged, stays flagged), so the second one had to try more nodes than it first
    # chose; flagged, they would not have been chosen at all.
    dead = [n for n in cluster_nodes(a).values() if n.port in (d.port, e.port)]
    assert len(dead) == 2 and not any({"fail?", "fail"} & set(n.flags) for n in dead), dead
    assert sorted(p.port for p in holders([a, b, cc], jid)) == sorted([a.port, b.port, cc.port])
    # The timed-out job was deleted (best effort DELJOB) on the nodes that got a copy.
    wait_for(lambda: all(all_ids(p) == [jid] for p in (a, b, cc)), timeout=10,
             what="only the successful job left on the alive nodes")


def test_noreplicate_when_the_job_expires_while_waiting(cluster):
    """Checklist §13.6: TTL 1 with a REPLICATE that cannot be reached -> -NOREPL (expired):
    the job's expiry ends the wait, not the ADDJOB timeout (10 s), which has its own text."""
    c = cluster(3, node_timeout=15000)
    c[2].kill()
    reply = cmd(c[0], "ADDJOB", Q, "short", 10000, "REPLICATE", 3, "TTL", 1, "RETRY", 1,
                timeout=20)
    assert reply == f"NOREPL {NOREPL_REMOVED}", reply
    wait_for(lambda: registered_jobs(c[0]) == 0 and registered_jobs(c[1]) == 0, timeout=10,
             what="no copy left")


def test_sync_addjob_succeeds_when_a_dead_target_comes_back_in_time(cluster):
    """Checklist §13.6: REPLJOB is re-sent, so a target restarted within the ADDJOB timeout
    confirms and the client gets its ID."""
    c = cluster(3, node_timeout=3000)
    a, _, victim = c.nodes
    victim.kill()
    conn = Conn(a.port, timeout=30)
    try:
        conn.send_cmd("ADDJOB", Q, "late", 20000, "REPLICATE", 3)
        # the ADDJOB is taken and waits for the dead target: no early answer (-NOREPL)
        wait_for(lambda: parse_fields(cmd(a, "INFO", "clients"))["blocked_clients"] == "1",
                 what="the ADDJOB waiting for its copies")
        assert registered_jobs(a) == 1
        assert conn.nothing_pending()
        victim.start()
        reply = conn.read(timeout=25)
    finally:
        conn.close()
    assert isinstance(reply, Status), reply
    jid = str(reply)
    assert state_of(victim, jid) == "active"
    assert len(holders(c, jid)) == 3


def test_client_gone_while_its_addjob_waits_leaves_no_job_and_no_crash(cluster):
    """A client that disconnects while its sync ADDJOB waits for a dead target: the job
    is deleted (best effort, everywhere) and the nodes keep serving."""
    c = cluster(3, node_timeout=3000)
    a, b, victim = c.nodes
    victim.kill()
    conn = Conn(a.port, timeout=30)
    conn.send_cmd("ADDJOB", Q, "abandoned", 10000, "REPLICATE", 3)
    wait_for(lambda: parse_fields(cmd(a, "INFO", "clients"))["blocked_clients"] == "1",
             what="the ADDJOB client blocked")
    assert registered_jobs(a) == 1
    conn.close()
    wait_for(lambda: registered_jobs(a) == 0 and registered_jobs(b) == 0, timeout=10,
             what="the abandoned job deleted on the live nodes")
    assert parse_fields(cmd(a, "INFO", "clients"))["blocked_clients"] == "0"
    victim.start()
    c.wait_mesh()
    assert all(cmd(p, "PING") == "PONG" for p in c)
    jid = add(a, "after", "REPLICATE", 3)
    assert len(holders(c, jid)) == 3


def test_external_replication_when_out_of_memory(cluster):
    """Checklist §13.4: past 75% of maxmemory the node keeps no copy; the job lives on
    REPLICATE other nodes, one of which queues it (ENQUEUE)."""
    c = cluster(3)
    a = c[0]
    ok(a, "CONFIG", "SET", "maxmemory", "3mb")
    body = "x" * 10_000
    jid = None
    for _ in range(500):
        jid = add(a, body, "REPLICATE", 2)
        if show(a, jid) is None:
            break
    else:
        pytest.fail("the node never switched to external replication")
    others = c.nodes[1:]
    assert sorted(p.port for p in holders(others, jid)) == sorted(p.port for p in others)
    wait_for(lambda: len(holders(others, jid, ("queued",))) == 1, timeout=10,
             what="the externally replicated job queued on one node")
    assert myid(a) not in delivered_of(others[0], jid)
    # whichever of the two confirmed first queued it (under load not always others[0]: a
    # GETJOB there with a 1 ms timeout found its queue empty in one CI run)
    (queuing,) = holders(others, jid, ("queued",))
    got = getjob(queuing, "COUNT", 1, queue=Q, timeout_ms=1)
    assert got == [[Q.encode(), jid.encode(), body.encode()]], got


# ---------------------------------------------------------------------------- federation
def test_getjob_on_b_promptly_serves_a_job_produced_on_a(shared_cluster, q):
    """The GETJOB on b, blocked up to 60 s, returns because the job came from a (its reply
    holds the job), not because its timeout expired. That the GETJOB asks at once (its
    NEEDJOBS broadcast) is pinned by the sans-I/O test_a_blocking_getjob_broadcasts_
    needjobs_for_one_job; how fast jobs move between nodes is for `make bench`."""
    c = shared_cluster(3)
    a, b = c[0], c[1]
    jid = add(a, "far away", "REPLICATE", 1, queue=q)
    got = getjob(b, queue=q, timeout_ms=60000)
    assert got == [[q.encode(), jid.encode(), b"far away"]], got
    assert show(a, jid) is not None  # a retry > 0 job moved: the source keeps a copy
    imported = pairs(cmd(b, "QSTAT", q))["import-from"]
    assert myid(a).encode() in imported, "QSTAT import-from names the source"


def test_waiting_consumer_gets_a_job_produced_later_on_another_node(shared_cluster, q):
    c = shared_cluster(3)
    a, b = c[0], c[1]
    conn = Conn(b.port, timeout=30)
    try:
        conn.send_cmd("GETJOB", "TIMEOUT", 20000, "FROM", q)
        wait_for(lambda: pairs(cmd(b, "QSTAT", q))["blocked"] == 1, what="consumer blocked")
        jid = add(a, "later", "REPLICATE", 1, queue=q)
        got = conn.read(timeout=25)
    finally:
        conn.close()
    assert got == [[q.encode(), jid.encode(), b"later"]], got


def test_jobs_added_on_random_nodes_are_all_obtainable_on_one_node(shared_cluster, q):
    """Checklist §13.14: 60 REPLICATE 3 jobs added round-robin on 5 nodes are all served
    by GETJOB on node 0; once acked, none is left anywhere."""
    c = shared_cluster(5)
    added = {}
    for i in range(60):
        body = f"job-{i}"
        added[add(c[i % 5], body, "REPLICATE", 3, queue=q)] = body
    got = {}
    conn = Conn(c[0].port, timeout=30)
    try:
        while len(got) < len(added):
            reply = conn.cmd("GETJOB", "TIMEOUT", 10000, "FROM", q)
            assert reply is not None, f"only {len(got)} of {len(added)} jobs served"
            for _, jid, body in reply:
                got[jid.decode()] = body.decode()
                assert conn.cmd("ACKJOB", jid) in (0, 1)
    finally:
        conn.close()
    assert got == added
    wait_for(lambda: none_left(c, q, added), timeout=30, what="no job left on any node")


def test_at_most_once_jobs_move_between_nodes_and_are_not_lost(shared_cluster, q):
    """The seed bug: RETRY 0 jobs (REPLICATE 1) produced on one node are all obtainable via
    GETJOB on another; a job moved by YOURJOBS must be queued on the receiver."""
    c = shared_cluster(3)
    a, b = c[0], c[1]
    added = {add(b, f"amo-{i}", "REPLICATE", 1, "RETRY", 0, queue=q): f"amo-{i}"
             for i in range(100)}
    got: dict[str, str] = {}
    conn = Conn(a.port, timeout=30)
    try:
        while len(got) < len(added):
            reply = conn.cmd("GETJOB", "TIMEOUT", 5000, "COUNT", 10, "FROM", q)
            assert reply is not None, (f"only {len(got)} of {len(added)} at-most-once jobs "
                                       f"served; left on the producer: {len(jobs_of(b, q))}")
            for _, jid, body in reply:
                assert jid.decode() not in got, "an at-most-once job delivered twice"
                got[jid.decode()] = body.decode()
    finally:
        conn.close()
    assert got == added
    assert jobs_of(b, q) == [], "moved at-most-once jobs are deleted on the source"
    ok_count = cmd(a, "ACKJOB", *added)
    assert ok_count == len(added)
    wait_for(lambda: none_left(c, q, added), timeout=30, what="acked jobs collected")


def test_qscan_importrate_lists_the_queues_just_imported(shared_cluster, q):
    """Checklist §13.16 (the original's test): 4 jobs in each of 4 queues on A, fetched by
    4 GETJOBs per queue on B -> QSCAN IMPORTRATE 1 on B lists exactly those 4 queues."""
    c = shared_cluster(3)
    a, b = c[0], c[1]
    names = [f"{q}-imp{i}" for i in range(4)]
    for _ in range(4):
        for name in names:
            add(a, "myjob", "REPLICATE", 1, queue=name)
    for _ in range(4):
        for name in names:
            got = getjob(b, queue=name, timeout_ms=10000)
            assert got is not None and got[0][0] == name.encode(), got
    # (the queues of this test only: a late YOURJOBS of an earlier test on the shared
    # cluster may still import a job into a queue of its own)
    reply = cmd(b, "QSCAN", "BUSYLOOP", "IMPORTRATE", 1)
    assert sorted(n.decode() for n in reply[1] if n.decode().startswith(f"{q}-")) == names, (
        reply, [pairs(cmd(b, "QSTAT", n))["import-rate"] for n in names])
    assert pairs(cmd(b, "QSTAT", names[0]))["import-rate"] > 0
    assert [n for n in cmd(a, "QSCAN", "BUSYLOOP", "IMPORTRATE", 1)[1]
            if n.decode().startswith(f"{q}-")] == []


def test_a_queue_paused_for_output_is_never_a_source(shared_cluster, q):
    c = shared_cluster(3)
    a, b = c[0], c[1]
    assert cmd(a, "PAUSE", q, "out") == "out"
    jid = add(a, "held", "REPLICATE", 1, queue=q)
    assert getjob(b, queue=q, timeout_ms=2500) is None
    assert state_of(a, jid) == "queued"
    assert cmd(a, "PAUSE", q, "none") == "none"
    got = getjob(b, queue=q, timeout_ms=15000)
    assert got == [[q.encode(), jid.encode(), b"held"]], got


# ---------------------------------------------------------------------------- acks
@pytest.mark.parametrize("acker", ["holder", "non-holder"])
def test_ackjob_on_another_node_removes_the_job_everywhere(shared_cluster, q, acker):
    """Checklist §13.13: ACK on a node holding a copy (SETACK/GOTACK/DELJOB) or on a node
    without one (a dummy ACK) -> every copy goes, and so does the dummy."""
    c = shared_cluster(5)
    a = c[0]
    jid = add(a, "ack me", "REPLICATE", 3, queue=q)
    held = {p.port for p in holders(c, jid)}
    pick = [p for p in c.nodes[1:] if (p.port in held) == (acker == "holder")][0]
    assert cmd(pick, "ACKJOB", jid) == (1 if acker == "holder" else 0)
    wait_for(lambda: gone_everywhere(c, jid), timeout=20, what="the job gone from every node")
    wait_for(lambda: none_left(c, q, [jid]), timeout=20,
             what="no job of the test left on any node")


def test_acked_copy_is_collected_even_if_the_node_running_the_gc_dies(cluster):
    """Every acked copy retries the GC on its own timer (original: updateJobAwakeTime arms
    getNextGCRetryTime for any ACKED job), so a lost DELJOB cannot leave it behind.

    A REPLICATE 3 job on A, B, D; D is killed, then ACKJOB on A: B acks on A's SETACK and
    answers GOTACK, A keeps waiting for D. A is killed -9 too and both come back empty. Nobody
    will ever send B a DELJOB: only B's own GC retry (SETACK -> GOTACK(unknown) from A and D)
    can collect its copy."""
    c = cluster(3)
    a, b, d = c.nodes
    jid = add(a, "ack then crash", "REPLICATE", 3, "RETRY", 30)
    assert len(holders(c, jid)) == 3
    d.kill()
    assert cmd(a, "ACKJOB", jid) == 1
    wait_for(lambda: state_of(b, jid) == "acked", timeout=10, what="B acked by A's SETACK")
    assert state_of(a, jid) == "acked", "A still waits for D's GOTACK"
    a.kill()
    a.start()
    d.start()
    c.wait_mesh()
    try:
        wait_for(lambda: show(b, jid) is None, timeout=30, interval=0.2,
                 what="B's acked copy collected by its own GC retry")
    except AssertionError:
        raise AssertionError(f"B's acked copy is still there: {show(b, jid)}") from None


def test_ack_on_the_producer_of_a_single_copy_job(shared_cluster, q):
    c = shared_cluster(3)
    jid = add(c[0], "single", "REPLICATE", 1, queue=q)
    assert cmd(c[0], "ACKJOB", jid) == 1
    wait_for(lambda: show(c[0], jid) is None, what="the acked single copy collected")


@pytest.mark.parametrize("acker", ["holder", "non-holder"])
def test_fastack_removes_the_job_everywhere(shared_cluster, q, acker):
    c = shared_cluster(5)
    jid = add(c[0], "fast", "REPLICATE", 3, queue=q)
    held = {p.port for p in holders(c, jid)}
    pick = [p for p in c.nodes[1:] if (p.port in held) == (acker == "holder")][0]
    assert cmd(pick, "FASTACK", jid) == (1 if acker == "holder" else 0)
    wait_for(lambda: gone_everywhere(c, jid), timeout=20, what="the job gone from every node")
    assert none_left(c, q, [jid])


def test_ttl_expired_jobs_disappear_from_every_node(shared_cluster, q):
    """Checklist §13.12: a TTL 5 job is gone everywhere after >= 4 s; once a batch of TTL 5
    jobs expires, no job of their queue is left on any node."""
    c = shared_cluster(3)
    t0 = time.monotonic()
    jid = add(c[0], "short lived", "REPLICATE", 3, "TTL", 5, queue=q)
    conn = Conn(c[1].port)
    try:
        replies = conn.pipeline([("ADDJOB", q, f"b{i}", 0, "REPLICATE", 2, "TTL", 5, "ASYNC")
                                 for i in range(300)])
    finally:
        conn.close()
    assert all(isinstance(r, Status) for r in replies)
    assert len(holders(c, jid)) == 3
    wait_for(lambda: gone_everywhere(c, jid), timeout=20, interval=0.1,
             what="the TTL 5 job gone everywhere")
    assert time.monotonic() - t0 >= 4.0, "expired too early"
    wait_for(lambda: none_left(c, q, [jid]), timeout=20,
             what="no job of the test left on any node")


# ---------------------------------------------------------------------------- re-queue
@pytest.mark.parametrize("killed", [1, 2])
def test_job_is_requeued_on_a_surviving_holder_when_holders_die(cluster, killed):
    """Checklist §13.8/§13.9: kill -9 the queueing node (and one more holder) of a
    REPLICATE 3 RETRY 2 job: a surviving copy is queued after RETRY and delivered with the
    right body."""
    c = cluster(5, node_timeout=NODE_TIMEOUT)
    a = c[0]
    t_add = time.monotonic()
    jid = add(a, "survivor", "REPLICATE", 3, "RETRY", 2)
    replicas = [p for p in holders(c.nodes[1:], jid)]
    assert len(replicas) == 2
    victims = [a] + replicas[:killed - 1]
    for v in victims:
        v.kill()
    alive = [p for p in c if p not in victims]
    survivors = [p for p in replicas if p not in victims]
    wait_for(lambda: holders(survivors, jid, ("queued",)), timeout=15,
             what="a surviving copy queued")
    assert time.monotonic() - t_add > 1.5, "re-queued before RETRY elapsed"
    consumer = [p for p in alive if p not in survivors][0]  # a node without a copy
    got = getjob(consumer, "WITHCOUNTERS", timeout_ms=15000)
    assert got is not None, states(alive, jid)
    assert got[0][:3] == [b"q", jid.encode(), b"survivor"]
    assert got[0][6] >= 1, "additional-deliveries counts the re-queue"


def test_unacked_job_is_requeued_and_counted(shared_cluster, q):
    """Checklist §13.20: additional-deliveries > 0 after a timer re-queue."""
    c = shared_cluster(3)
    t_add = time.monotonic()
    jid = add(c[0], "again", "REPLICATE", 3, "RETRY", 1, queue=q)
    first = getjob(c[0], queue=q, timeout_ms=1000)
    assert first[0][1] == jid.encode()
    wait_for(lambda: holders(c, jid, ("queued",)), timeout=15, what="re-queued somewhere")
    assert time.monotonic() - t_add > 0.5, "re-queued before RETRY elapsed"
    got = getjob(c[0], "WITHCOUNTERS", queue=q, timeout_ms=10000)  # wherever it is queued now
    assert got is not None and got[0][1] == jid.encode(), (got, states(c, jid))
    assert got[0][5] == b"additional-deliveries" and got[0][6] >= 1, got


def test_at_most_once_job_is_never_requeued(shared_cluster, q):
    c = shared_cluster(3)
    jid = add(c[0], "once", "REPLICATE", 1, "RETRY", 0, queue=q)
    assert getjob(c[0], queue=q, timeout_ms=1000)[0][1] == jid.encode()
    holds_for(lambda: not holders(c, jid, ("queued",)), 2.0, "never queued again")


def test_working_on_one_node_postpones_delivery_everywhere(shared_cluster, q):
    """Checklist §13.19: WORKING every second for ~6 s with RETRY 2, sent to a node other
    than the one that delivered it, keeps the job from being queued anywhere."""
    c = shared_cluster(3)
    a, b = c[0], c[1]
    jid = add(a, "busy", "REPLICATE", 3, "RETRY", 2, queue=q)
    assert getjob(a, queue=q, timeout_ms=1000)[0][1] == jid.encode()
    deadline = time.monotonic() + 6.0
    last = 0.0
    while time.monotonic() < deadline:
        if time.monotonic() - last >= 0.8:
            last = time.monotonic()
            assert cmd(b, "WORKING", jid) == 2
        assert not holders(c, jid, ("queued",)), states(c, jid)
        time.sleep(0.1)
    # Once the worker stops, the job comes back.
    wait_for(lambda: holders(c, jid, ("queued",)), timeout=15, what="re-queued after WORKING")


def test_working_on_an_unknown_job_is_nojob(shared_cluster, q):
    c = shared_cluster(3)
    jid = add(c[0], "w", "REPLICATE", 1, queue=q)
    reply = cmd(c[1], "WORKING", jid)
    assert isinstance(reply, Err) and reply.startswith("NOJOB"), reply


def test_nack_counters_travel_with_queued(shared_cluster, q):
    """Checklist §13.20: NACK re-queues; GETJOB WITHCOUNTERS element 4 counts the nacks on
    the node that queued it, including NACKs given on another holder."""
    c = shared_cluster(3)
    a, b = c[0], c[1]
    jid = add(a, "nacked", "REPLICATE", 3, "RETRY", 60, queue=q)
    assert getjob(a, queue=q, timeout_ms=1000)[0][1] == jid.encode()
    assert cmd(a, "NACK", jid) == 1
    got = getjob(a, "WITHCOUNTERS", queue=q, timeout_ms=1000)
    assert got[0][1] == jid.encode() and got[0][3] == b"nacks" and got[0][4] == 1, got
    wait_for(lambda: show(b, jid)["nacks"] == 1, what="QUEUED(nacks) counted on another holder")
    assert cmd(b, "NACK", jid) == 1  # b's copy is active: queued there now
    got = getjob(b, "WITHCOUNTERS", queue=q, timeout_ms=1000)
    assert got[0][1] == jid.encode() and got[0][4] == 2, got
    wait_for(lambda: show(a, jid)["nacks"] == 2, what="b's NACK counted on a")


# ---------------------------------------------------------------------------- PAUSE bcast
def test_pause_bcast_pauses_the_queue_on_every_node(shared_cluster, q):
    c = shared_cluster(3)
    assert cmd(c[0], "PAUSE", q, "out", "bcast") == "out"
    wait_for(lambda: all(cmd(p, "PAUSE", q, "state") == "out" for p in c), timeout=10,
             what="queue paused for output on every node")
    jid = add(c[1], "paused", "REPLICATE", 1, queue=q)
    assert cmd(c[1], "GETJOB", "NOHANG", "FROM", q) is None
    assert cmd(c[2], "PAUSE", q, "none", "bcast") == "none"
    wait_for(lambda: all(cmd(p, "PAUSE", q, "state") == "none" for p in c), timeout=10,
             what="queue unpaused on every node")
    assert getjob(c[1], queue=q, timeout_ms=1000)[0][1] == jid.encode()


# ---------------------------------------------------------------------------- LEAVING
def test_leaving_node_basics(cluster):
    """Checklist §13.18: other nodes see the flag and HELLO priority 100; ADDJOB on the
    leaving node keeps no copy there; GETJOB serves queued jobs first, then -LEAVING."""
    c = cluster(5)
    leaver, other = c[0], c[1]
    queued_before = add(leaver, "before", "REPLICATE", 1)
    assert cmd(leaver, "CLUSTER", "LEAVING") == "no"
    ok(leaver, "CLUSTER", "LEAVING", "yes")
    assert cmd(leaver, "CLUSTER", "LEAVING") == "yes"
    lid = myid(leaver)
    wait_for(lambda: all(hello(p)[lid][3] == b"100" for p in c.nodes[1:]), timeout=10,
             what="HELLO priority 100 for the leaving node everywhere")
    jid = add(leaver, "external", "REPLICATE", 3)
    assert show(leaver, jid) is None
    assert len(holders(c.nodes[1:], jid)) == 3
    assert registered_jobs(leaver) == 1  # only the job queued before leaving
    got = getjob(leaver, timeout_ms=1000)
    assert got[0][1] == queued_before.encode(), "already queued jobs are still served"
    reply = getjob(leaver, timeout_ms=1000)
    assert isinstance(reply, Err) and reply.startswith("LEAVING"), reply
    assert getjob(other, timeout_ms=5000)[0][1] == jid.encode()


def test_blocked_getjob_is_woken_with_leaving(cluster):
    c = cluster(3)
    conn = Conn(c[0].port, timeout=30)
    try:
        conn.send_cmd("GETJOB", "TIMEOUT", 20000, "FROM", "nothing")
        wait_for(lambda: pairs(cmd(c[0], "QSTAT", "nothing"))["blocked"] == 1,
                 what="consumer blocked")
        ok(c[0], "CLUSTER", "LEAVING", "yes")
        reply = conn.read(timeout=10)
    finally:
        conn.close()
    assert isinstance(reply, Err) and reply.startswith("LEAVING"), reply


class Worker(threading.Thread):
    """A producer or consumer against one node, on its own connection."""

    def __init__(self, proc: DisqueProcess, role: str, tag: str, log: dict[str, Any]) -> None:
        super().__init__(daemon=True)
        self.proc = proc
        self.role = role
        self.tag = tag
        self.log = log
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            conn = Conn(self.proc.port, timeout=30)
            try:
                self.produce(conn) if self.role == "producer" else self.consume(conn)
            finally:
                conn.close()
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc

    def produce(self, conn: Conn) -> None:
        i = 0
        while not self.stop.is_set():
            body = f"{self.tag}-{i}"
            reply = conn.cmd("ADDJOB", Q, body, 5000, "REPLICATE", 2, "RETRY", 2)
            if isinstance(reply, Status):
                self.log["added"][str(reply)] = body
            elif reply.startswith("LEAVING"):
                # checklist §4: a sync ADDJOB still waiting for its copies when the node
                # starts leaving gets -LEAVING (the job is deleted); later ones succeed
                self.log["leaving_errors"] += 1
            else:
                self.log["errors"].append((self.tag, str(reply)))
            i += 1
            time.sleep(0.01)

    def consume(self, conn: Conn) -> None:
        while not self.stop.is_set():
            reply = conn.cmd("GETJOB", "TIMEOUT", 300, "FROM", Q)
            if isinstance(reply, Err):
                self.log["leaving_errors"] += reply.startswith("LEAVING")
                time.sleep(0.05)
                continue
            for _, jid, body in reply or []:
                self.log["got"][jid.decode()] = body.decode()
                conn.cmd("ACKJOB", jid)


def test_leaving_node_drains_to_zero_while_the_cluster_keeps_serving(cluster):
    """A producer and a consumer on every node, the leaving one included: after CLUSTER
    LEAVING yes its job count drains to 0 while jobs keep flowing, and every job produced
    anywhere is consumed."""
    c = cluster(4)
    leaver = c[0]
    # Jobs on the leaver before it leaves: queued ones, and replicas of others' jobs.
    for i in range(20):
        add(leaver, f"pre-l-{i}", "REPLICATE", 2, "RETRY", 2)
        add(c[1 + i % 3], f"pre-o-{i}", "REPLICATE", 2, "RETRY", 2)
    assert registered_jobs(leaver) >= 20
    log: dict[str, Any] = {"added": {}, "got": {}, "errors": [], "leaving_errors": 0}
    workers = [Worker(p, role, f"{role}{i}", log) for i, p in enumerate(c)
               for role in ("producer", "consumer")]
    for w in workers:
        w.start()
    try:
        time.sleep(0.5)  # some traffic before the node leaves (not a wait for state)
        ok(leaver, "CLUSTER", "LEAVING", "yes")
        lid = myid(leaver)
        wait_for(lambda: all(hello(p)[lid][3] == b"100" for p in c.nodes[1:]), timeout=10,
                 what="HELLO priority 100 for the leaving node")
        wait_for(lambda: registered_jobs(leaver) == 0, timeout=60, interval=0.05,
                 what="the leaving node drained to zero jobs while producers run")
        reply = getjob(leaver, queue="empty-queue", timeout_ms=1000)
        assert isinstance(reply, Err) and reply.startswith("LEAVING"), reply
        n_before = len(log["got"])
        wait_for(lambda: len(log["got"]) > n_before + 20, timeout=20,
                 what="the cluster still serving after the node drained")
    finally:
        for w in workers:
            if w.role == "producer":
                w.stop.set()
        for w in workers:
            if w.role == "producer":
                w.join(timeout=30)
    for w in workers:
        assert w.error is None, f"{w.tag}: {w.error!r}"
    try:
        wait_for(lambda: set(log["added"]) <= set(log["got"]), timeout=60, interval=0.2,
                 what="every produced job consumed")
    finally:
        for w in workers:
            w.stop.set()
        for w in workers:
            w.join(timeout=30)
    assert not log["errors"], log["errors"][:5]
    wait_for(lambda: registered_jobs(leaver) == 0, timeout=30, what="leaver still empty")
    wait_for(lambda: empty_everywhere(c), timeout=60, what="acked jobs collected everywhere")
    print(f"\nleaving: {len(log['added'])} produced, {len(log['got'])} consumed, "
          f"{log['leaving_errors']} -LEAVING replies")


# ---------------------------------------------------------------------------- GC with nodes down
def test_ack_while_the_producer_is_down_is_collected_when_it_returns(cluster):
    """Checklist §13.13: the acked copies wait for the creator; once it is back, every copy
    is collected."""
    c = cluster(5)
    a = c[0]
    jid = add(a, "ack later", "REPLICATE", 3, "RETRY", 30)
    replicas = holders(c.nodes[1:], jid)
    a.kill()
    assert cmd(replicas[0], "ACKJOB", jid) == 1
    wait_for(lambda: all(state_of(p, jid) == "acked" for p in replicas), timeout=10,
             what="both replicas acked")
    holds_for(lambda: all(state_of(p, jid) == "acked" for p in replicas), 2.0,
              "acked copies kept while the creator is down")
    a.start()
    wait_for(lambda: gone_everywhere(c, jid), timeout=60, what="every copy collected")
    wait_for(lambda: empty_everywhere(c), timeout=60, what="no job left")


def test_dummy_ack_with_all_owners_down_leaves_nothing_once_they_return(cluster):
    c = cluster(5)
    jid = add(c[0], "orphan", "REPLICATE", 2, "RETRY", 30)
    owners = holders(c, jid)
    rest = [p for p in c if p not in owners]
    for p in owners:
        p.kill()
    assert cmd(rest[0], "ACKJOB", jid) == 0  # a dummy ACK
    for p in owners:
        p.start()
    wait_for(lambda: gone_everywhere(c, jid), timeout=90, interval=0.2,
             what="no copy and no dummy left")


def test_maxlen_checks_only_the_local_queue(shared_cluster, q):
    """Original report #26 (docs/original-bugs.md): MAXLEN is a check of the queue of the
    node receiving the ADDJOB; the replicas holding copies do not apply it."""
    c = shared_cluster(2)
    a, b = c[0], c[1]
    add(a, "first", "REPLICATE", 2, queue=q)  # queued on a, an active copy on b
    assert cmd(a, "QLEN", q) == 1 and cmd(b, "QLEN", q) == 0
    refused = cmd(a, "ADDJOB", q, "second", 0, "REPLICATE", 2, "MAXLEN", 1)
    assert isinstance(refused, Err) and refused.startswith("MAXLEN")
    jid = cmd(b, "ADDJOB", q, "second", 0, "REPLICATE", 2, "MAXLEN", 1)
    assert isinstance(jid, Status)  # b's own queue is empty
    assert cmd(b, "QLEN", q) == 1 and cmd(a, "QLEN", q) == 1
