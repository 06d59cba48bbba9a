"""ADDJOBS and pipelined synchronous ADDJOBs on 3 real nodes.

ADDJOBS replicates a batch together: an element is a job ID only once the job has its
REPLICATE copies; a job that cannot get them answers -NOREPL and leaves no copy anywhere
once the cluster settles. Pipelined ADDJOBs behind a blocked one start replicating at once
and are answered together, in order, with the replies one-by-one execution would give.

Replicas are frozen with SIGSTOP (node timeout 5 s, so they stay "reachable" and answer
late) or killed with SIGKILL; every wait is a poll with a deadline. The tests that neither
freeze, kill nor reconfigure a node share one cluster (`shared_cluster`) and use queue names of
their own (`q`).
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.cluster.conftest import NODE_TIMEOUT, cmd, frozen, kill_until_failed, ok, parse_fields
from tests.cluster.test_jobs import all_ids, empty_everywhere, jobs_of, registered_jobs, show
from tests.harness import DisqueProcess, wait_for
from tests.integration.resp import Conn, Err, Status, encode

Q = "q"
NOREPL_TIMEOUT = "NOREPL Timeout reached before replicating to the requested number of nodes"
NOREPL_REACH = "NOREPL Not enough reachable nodes for the requested replication level"
NOREPL_REMOVED = ("NOREPL job removed (expired?) before the requested replication level was "
                  "achieved")
SLOW_LINK = 5000  # ms node timeout: a frozen node is not flagged failing during a test


def addjobs(proc: DisqueProcess, *args: Any, timeout: int = 5000, queue: str = Q) -> list[Any]:
    """ADDJOBS queue timeout *args on a fresh connection: the array reply."""
    reply = cmd(proc, "ADDJOBS", queue, timeout, *args, timeout=timeout / 1000 + 20)
    assert isinstance(reply, list), reply
    return reply


def bodies(n: int, prefix: str = "b") -> list[bytes]:
    return [f"{prefix}{i}".encode() for i in range(n)]


def queued_bodies(proc: DisqueProcess, n: int, queue: str = Q) -> list[tuple[str, bytes]]:
    """(ID, body) of up to n jobs GETJOB NOHANG takes from `queue` on proc, in queue order."""
    jobs = cmd(proc, "GETJOB", "NOHANG", "COUNT", n, "FROM", queue)
    return [] if jobs is None else [(j[1].decode(), j[2]) for j in jobs]


def copies(nodes: Any, job_id: str) -> int:
    return sum(show(p, job_id) is not None for p in nodes)


def assert_on_every_node(nodes: Any, ids: list[str], body_of: dict[str, bytes],
                         holders: int = 3, queue: str = Q) -> None:
    """Every node of `nodes` knows every job of `ids`, with its body and queue, delivered to
    `holders` nodes."""
    for p in nodes:
        for job_id in ids:
            job = show(p, job_id)
            assert job is not None, f"{job_id} missing on :{p.port}"
            assert job["body"] == body_of[job_id] and job["queue"] == queue.encode()
            assert len(job["nodes-delivered"]) == holders


def add_pipelined(n: int, *opts: Any, prefix: str = "body_", queue: str = Q) -> bytes:
    return b"".join(encode("ADDJOB", queue, f"{prefix}{i}", *opts) for i in range(n))


# ---------------------------------------------------------------------------- ADDJOBS
def test_addjobs_replicate_3_answers_ids_of_jobs_held_by_three_nodes(shared_cluster, q):
    c = shared_cluster(3)
    a = c[0]
    batch = bodies(30)
    ids = addjobs(a, "REPLICATE", 3, "JOBS", *batch, queue=q)
    assert all(isinstance(i, Status) for i in ids), ids
    assert len(set(ids)) == 30
    assert_on_every_node(c, ids, dict(zip(ids, batch, strict=True)), queue=q)
    assert all(show(a, i)["state"] == b"queued" for i in ids)  # type: ignore[index]
    assert queued_bodies(a, 100, queue=q) == list(zip(ids, batch, strict=True))


def test_addjobs_maxlen_counts_the_batch_jobs_waiting_for_copies(shared_cluster, q):
    c = shared_cluster(3)
    a = c[0]
    reply = addjobs(a, "REPLICATE", 3, "MAXLEN", 3, "JOBS", *bodies(5), queue=q)
    assert [type(r) for r in reply] == [Status, Status, Status, Err, Err], reply
    assert reply[3].startswith("MAXLEN ")
    assert cmd(a, "QLEN", q) == 3
    assert all(len(jobs_of(p, q)) == 3 for p in c)


def test_addjobs_replicate_beyond_reachable_nodes_is_norepl_per_job(cluster):
    c = cluster(3, node_timeout=NODE_TIMEOUT)
    a = c[0]
    assert addjobs(a, "REPLICATE", 4, "JOBS", *bodies(5)) == [NOREPL_REACH] * 5
    assert empty_everywhere(c)
    kill_until_failed(c, 2)
    live = c.nodes[:2]
    assert addjobs(a, "REPLICATE", 3, "JOBS", *bodies(5)) == [NOREPL_REACH] * 5
    assert all(registered_jobs(p) == 0 and cmd(p, "QLEN", Q) == 0 for p in live)
    ids = addjobs(a, "REPLICATE", 2, "JOBS", *bodies(3))  # still fine within reach
    assert all(isinstance(i, Status) and copies(live, i) == 2 for i in ids), ids


def test_addjobs_async_replies_at_once_and_the_copies_follow(shared_cluster, q):
    c = shared_cluster(3)
    a = c[0]
    batch = bodies(20)
    ids = addjobs(a, "REPLICATE", 3, "ASYNC", "JOBS", *batch, timeout=0, queue=q)
    assert all(isinstance(i, Status) for i in ids), ids
    assert cmd(a, "QLEN", q) == 20
    wait_for(lambda: all(copies(c, i) == 3 for i in ids), timeout=15,
             what="every ASYNC job copied to 3 nodes")
    assert_on_every_node(c, ids, dict(zip(ids, batch, strict=True)), queue=q)


def test_addjobs_with_a_frozen_replica_times_out_per_job_and_leaves_no_copy(cluster):
    c = cluster(3, node_timeout=SLOW_LINK)
    a, _, late = c
    with frozen(late):
        reply = addjobs(a, "REPLICATE", 3, "JOBS", *bodies(10), timeout=500)
        assert reply == [NOREPL_TIMEOUT] * 10
        assert registered_jobs(a) == 0 and cmd(a, "QLEN", Q) == 0
    # the thawed replica handles the stale REPLJOBs, then the DELJOBs
    wait_for(lambda: empty_everywhere(c), timeout=15, what="no copy left on any node")
    ids = addjobs(a, "REPLICATE", 3, "JOBS", "after")
    assert isinstance(ids[0], Status) and copies(c, ids[0]) == 3


@pytest.mark.parametrize("fault", ["sigstop", "sigkill"])
def test_addjobs_replica_lost_mid_batch_answers_ids_only_for_jobs_with_copies(cluster, fault):
    """A replica stops mid-batch: some jobs may have their copies, the rest time out. An ID
    means REPLICATE copies exist; a -NOREPL job leaves nothing anywhere once settled. (The
    copies travel in batched bus frames, so the outcome is mostly all IDs or all -NOREPL,
    depending on whether the replica's GOTJOBs left before the fault: both are seen.)"""
    c = cluster(3, node_timeout=SLOW_LINK)
    a, b, late = c
    batch = [b.ljust(1000, b".") for b in bodies(2000)]
    with Conn(a.port, timeout=60) as conn:
        conn.send_cmd("ADDJOBS", Q, 1500, "REPLICATE", 3, "JOBS", *batch)
        wait_for(lambda: registered_jobs(late) > 0, timeout=20, interval=0.005,
                 what="the replica receiving the batch")
        if fault == "sigkill":
            late.kill()
            reply = conn.read(timeout=60)
        else:
            with frozen(late):
                reply = conn.read(timeout=60)
    assert len(reply) == len(batch)
    assert all(isinstance(r, Status) or r == NOREPL_TIMEOUT for r in reply), \
        {r for r in reply if not isinstance(r, Status)}
    ids = [str(r) for r in reply if isinstance(r, Status)]
    body_of = {i: batch[k] for k, i in enumerate(reply) if isinstance(i, Status)}
    live = [a, b] if fault == "sigkill" else list(c)
    for p in live:  # nothing but the answered jobs, after the DELJOBs of the others
        wait_for(lambda p=p: sorted(all_ids(p)) == sorted(ids), timeout=20,
                 what=f"only the answered jobs on :{p.port}")
    assert_on_every_node(live, ids, body_of)
    assert cmd(a, "QLEN", Q) == len(ids)


def test_addjobs_withdedup_over_the_cluster(cluster):
    c = cluster(3, node_timeout=SLOW_LINK)
    a, _, late = c
    first = addjobs(a, "REPLICATE", 3, "WITHDEDUP", "JOBS", "k1", "a", "k2", "b", "k1", "a")
    assert all(isinstance(i, Status) for i in first), first
    assert first[0] == first[2] != first[1]
    assert_on_every_node(c, first[:2], {first[0]: b"a", first[1]: b"b"})
    assert all(registered_jobs(p) == 2 for p in c)
    assert addjobs(a, "REPLICATE", 3, "WITHDEDUP", "JOBS", "k2", "b") == [first[1]]
    # a key whose job could not be replicated is forgotten: a later batch adds the job
    with frozen(late):
        failed = addjobs(a, "REPLICATE", 3, "WITHDEDUP", "JOBS", "k3", "c", "k1", "a",
                         "k3", "c", timeout=300)
        assert failed == [NOREPL_TIMEOUT, first[0], NOREPL_TIMEOUT]
    retry = addjobs(a, "REPLICATE", 3, "WITHDEDUP", "JOBS", "k3", "c")
    assert isinstance(retry[0], Status) and retry[0] not in first
    wait_for(lambda: all(sorted(all_ids(p)) == sorted([*first[:2], retry[0]]) for p in c),
             timeout=15, what="the three jobs, and only them, on every node")


def test_addjobs_from_a_leaving_node_replicates_externally(cluster):
    """A LEAVING node keeps no copy: REPLICATE 2 puts every job on the two others (queued on
    one of them); REPLICATE 3 cannot be met and is -NOREPL with the reason, per job."""
    c = cluster(3)
    a, others = c[0], c.nodes[1:]
    ok(a, "CLUSTER", "LEAVING", "yes")
    ids = addjobs(a, "REPLICATE", 2, "JOBS", "e1", "e2", "e3")
    assert all(isinstance(i, Status) for i in ids), ids
    assert all(show(a, i) is None for i in ids)
    assert_on_every_node(others, ids, dict(zip(ids, [b"e1", b"e2", b"e3"], strict=True)),
                         holders=2)
    wait_for(lambda: sum(cmd(p, "QLEN", Q) for p in others) == 3, timeout=10,
             what="every job queued on one of the other nodes")
    reply = addjobs(a, "REPLICATE", 3, "JOBS", "f1", "f2")
    assert reply == [NOREPL_REACH + ", since I'm unable to hold a copy of the message for "
                     "the following reason: I'm leaving the cluster"] * 2


def test_jobs_removed_while_the_batch_waits_answer_norepl(cluster):
    c = cluster(3, node_timeout=SLOW_LINK)
    a, _, late = c
    with Conn(a.port) as batch, Conn(a.port) as piped, frozen(late):
        batch.send_cmd("ADDJOBS", Q, 0, "REPLICATE", 3, "JOBS", "x0", "x1", "x2")
        piped.send(add_pipelined(3, 0, "REPLICATE", 3) + encode("QLEN", Q))
        wait_for(lambda: registered_jobs(a) == 6, timeout=10, what="six jobs waiting")
        ok(a, "DEBUG", "FLUSHALL")
        assert batch.read(timeout=10) == [NOREPL_REMOVED] * 3
        assert [piped.read(timeout=10) for _ in range(4)] == [NOREPL_REMOVED] * 3 + [0]


def test_a_client_blocked_on_a_batch_counts_as_one_blocked_client(cluster):
    c = cluster(3, node_timeout=SLOW_LINK)
    a, _, late = c
    with Conn(a.port) as batch, Conn(a.port) as piped, frozen(late):
        batch.send_cmd("ADDJOBS", Q, 0, "REPLICATE", 3, "JOBS", *bodies(5))
        piped.send(add_pipelined(5, 0, "REPLICATE", 3))
        wait_for(lambda: registered_jobs(a) == 10, timeout=10, what="ten jobs waiting")
        blocked = int(parse_fields(cmd(a, "INFO", "clients"))["blocked_clients"])
        ok(a, "DEBUG", "FLUSHALL")  # answer both before the replica thaws
    assert blocked == 2


# ---------------------------------------------------------------------------- pipelining
def test_fifty_pipelined_sync_addjobs_get_their_ids_in_order(shared_cluster, q):
    c = shared_cluster(3)
    a = c[0]
    with Conn(a.port) as conn:
        conn.send(add_pipelined(50, 5000, "REPLICATE", 3, queue=q))
        ids = [conn.read() for _ in range(50)]
    assert all(isinstance(i, Status) for i in ids), ids
    batch = bodies(50, "body_")
    assert_on_every_node(c, ids, dict(zip(ids, batch, strict=True)), queue=q)
    assert queued_bodies(a, 100, queue=q) == list(zip(ids, batch, strict=True))
    # the same through redis-py's non-transactional pipeline (one write, RESP3)
    r = a.client()
    try:
        pipe = r.pipeline(transaction=False)
        for i in range(50):
            pipe.execute_command("ADDJOB", q, f"rp_{i}", 5000, "REPLICATE", 3)
        rp_ids = [i.decode() for i in pipe.execute()]
    finally:
        r.close()
    assert_on_every_node(c, rp_ids, dict(zip(rp_ids, bodies(50, "rp_"), strict=True)),
                         queue=q)
    assert [b for _, b in queued_bodies(a, 100, queue=q)] == bodies(50, "rp_")


def test_pipelined_addjobs_replicate_together_and_answer_together(cluster):
    """The second ADDJOB starts while the first waits (one by one it would start only after
    the first's timeout), and the first's -NOREPL waits for the second's outcome."""
    c = cluster(3, node_timeout=SLOW_LINK)
    a, _, late = c
    with Conn(a.port, timeout=30) as conn:
        with frozen(late):
            conn.send(encode("ADDJOB", Q, "first", 2000, "REPLICATE", 3)
                      + encode("ADDJOB", Q, "second", 0, "REPLICATE", 3))
            wait_for(lambda: registered_jobs(a) == 2, timeout=10,
                     what="both ADDJOBs waiting for copies at once")
            wait_for(lambda: registered_jobs(a) == 1, timeout=10,
                     what="the first ADDJOB timed out")
            assert conn.nothing_pending(), conn.buf  # its reply is held for the second's
        replies = [conn.read(timeout=20), conn.read(timeout=20)]
    assert replies[0] == NOREPL_TIMEOUT and isinstance(replies[1], Status), replies
    wait_for(lambda: all(all_ids(p) == [replies[1]] for p in c), timeout=15,
             what="only the second job, on every node")


def _mixed_script(q: str) -> list[tuple[Any, ...]]:
    return [
        ("ADDJOB", q, "a", 5000, "REPLICATE", 3),
        ("ADDJOB", q, "b", 5000, "REPLICATE", 3),
        ("ADDJOB", q, "c", 5000, "REPLICATE", 9),          # NOREPL at once
        ("ADDJOB", q, "d", 5000, "REPLICATE", 1),          # added at once
        ("ADDJOB", q, "e", 5000, "REPLICATE", 3, "BOGUS"),  # syntax error
        ("ADDJOB", q, "f", 5000, "REPLICATE", 3, "DEDUP", "k"),
        ("ADDJOB", q, "f", 5000, "REPLICATE", 3, "DEDUP", "k"),
        ("QLEN", q),
        ("ADDJOB", q, "g", 5000, "REPLICATE", 3, "MAXLEN", 5),
        ("ADDJOB", q, "h", 5000, "REPLICATE", 3, "MAXLEN", 5),
        ("ADDJOB", q, "i", 5000, "REPLICATE", 3),
        ("QLEN", q),
        ("GETJOB", "NOHANG", "COUNT", 100, "FROM", q),
    ]


def _shape(replies: list[Any]) -> list[Any]:
    """IDs as "ID" (their values differ between runs), GETJOB as its bodies."""
    out = []
    for r in replies:
        if isinstance(r, Status) and r.startswith("D-"):
            out.append("ID")
        elif isinstance(r, list):
            out.append([j[2] for j in r])
        else:
            out.append(r)
    return out


def test_a_mixed_pipeline_answers_as_one_by_one_execution(shared_cluster, q):
    c = shared_cluster(3)
    a = c[0]
    with Conn(a.port) as conn:
        one_by_one = [conn.cmd(*argv) for argv in _mixed_script(f"{q}-seq")]
        piped = conn.pipeline(_mixed_script(q))
    assert _shape(piped) == _shape(one_by_one)
    assert piped[5] == piped[6]  # the DEDUP repeat answers the first's ID
    assert piped[7] == 4  # QLEN after the group counts a, b, d, f
    assert isinstance(piped[8], Status) and str(piped[9]).startswith("MAXLEN ")
    assert piped[11] == 6
    assert piped[12] == [[q.encode(), i.encode(), b] for i, b in
                         zip([piped[k] for k in (0, 1, 3, 5, 8, 10)],
                             [b"a", b"b", b"d", b"f", b"g", b"i"], strict=True)]


@pytest.mark.parametrize("request_kind", ["pipelined-addjob", "addjobs"])
def test_client_leaving_while_its_jobs_wait_for_copies_leaves_no_job(cluster, request_kind):
    c = cluster(3, node_timeout=SLOW_LINK)
    a, _, late = c
    if request_kind == "addjobs":
        payload = encode("ADDJOBS", Q, 10000, "REPLICATE", 3, "JOBS", *bodies(20))
    else:
        payload = add_pipelined(20, 10000, "REPLICATE", 3)
    with frozen(late):
        conn = Conn(a.port)
        conn.send(payload)
        wait_for(lambda: registered_jobs(a) == 20, timeout=10,
                 what="all 20 jobs waiting for their copies at once")
        conn.close()
        wait_for(lambda: registered_jobs(a) == 0, timeout=10,
                 what="the producer dropped the client's jobs")
    wait_for(lambda: empty_everywhere(c), timeout=15,
             what="no copy of the client's jobs on any node")
    assert all(cmd(p, "QLEN", Q) == 0 for p in c)
    assert all(p.alive() for p in c)


def test_client_reply_off_or_skip_pipelined_addjobs_are_still_added(shared_cluster, q):
    c = shared_cluster(3)
    a = c[0]
    with Conn(a.port) as conn:
        conn.send(encode("CLIENT", "REPLY", "OFF")
                  + add_pipelined(10, 5000, "REPLICATE", 3, prefix="off_", queue=q)
                  + encode("CLIENT", "REPLY", "ON") + encode("QLEN", q))
        assert conn.read() == "OK"
        assert conn.read() == 10
        conn.send(encode("CLIENT", "REPLY", "SKIP")
                  + add_pipelined(3, 5000, "REPLICATE", 3, prefix="skip_", queue=q))
        skip_ids = [conn.read(), conn.read()]  # the first ADDJOB's reply is skipped
        assert all(isinstance(i, Status) for i in skip_ids), skip_ids
        assert conn.cmd("QLEN", q) == 13
    jobs = queued_bodies(a, 100, queue=q)
    assert [b for _, b in jobs] == [*bodies(10, "off_"), *bodies(3, "skip_")]
    assert [i for i, _ in jobs[-2:]] == skip_ids
    assert all(copies(c, i) == 3 for i, _ in jobs)

