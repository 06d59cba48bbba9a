"""Failed jobs across a real 3-node cluster (issue 15): NACK DELAY, dead-letter queues and
redrive. Every holder of a copy may requeue a job, so each behaviour is checked on all nodes.

The cluster is shared by these tests (and other calm ones, `shared_cluster`): each test's
queues are its own (`q`, and f"{q}-dead" for its dead-letter queue); the default dead-letter
queue `deadletter` is common to all, so what is checked there is one job by its ID."""

from __future__ import annotations

import time
from typing import Any

from tests.cluster.conftest import cmd, holds_for
from tests.harness import DisqueProcess, wait_for
from tests.integration.resp import Status, pairs


def add(proc: DisqueProcess, queue: str, *opts: Any, body: str = "body") -> str:
    reply = cmd(proc, "ADDJOB", queue, body, 5000, *opts, timeout=15)
    assert isinstance(reply, Status), reply
    return str(reply)


def show(proc: DisqueProcess, job_id: str) -> dict[str, Any] | None:
    reply = cmd(proc, "SHOW", job_id)
    return None if reply is None else pairs(reply)


def queued_on(nodes: list[DisqueProcess], job_id: str) -> list[str]:
    """The queue of every node that has the job queued."""
    out = []
    for p in nodes:
        s = show(p, job_id)
        if s is not None and s["state"] == b"queued":
            out.append(s["queue"].decode())
    return out


def fetch(proc: DisqueProcess, queue: str) -> str:
    """GETJOB on `proc`, waiting for the job to be queued there (or imported)."""
    reply = cmd(proc, "GETJOB", "TIMEOUT", 10000, "FROM", queue, timeout=15)
    assert reply, f"nothing in {queue} on :{proc.port}"
    return reply[0][1].decode()


def test_nack_delay_holds_the_job_back_on_every_holder(shared_cluster, q) -> None:
    c = shared_cluster(3)
    a = c[0]
    job_id = add(a, q, "REPLICATE", 3, "RETRY", 2)
    assert fetch(a, q) == job_id
    start = time.monotonic()
    assert cmd(a, "NACK", job_id, "DELAY", 5) == 1
    # the other holders heard of the NACK: one nack each, and none requeues before the
    # delay, although their RETRY (2 s) ends well before it
    wait_for(lambda: all(show(p, job_id)["nacks"] == 1 for p in c.nodes))
    holds_for(lambda: queued_on(c.nodes, job_id) == [], 3.5, "not queued during the delay")
    wait_for(lambda: queued_on(c.nodes, job_id) == [q], timeout=15)
    assert time.monotonic() - start >= 4.5
    for p in c.nodes:
        s = show(p, job_id)
        assert (s["nacks"], s["additional-deliveries"]) == (1, 0), (p.port, s)


def state(proc: DisqueProcess, job_id: str) -> tuple[str, str] | None:
    s = show(proc, job_id)
    return None if s is None else (s["state"].decode(), s["queue"].decode())


def test_maxnacks_moves_the_job_to_its_dead_letter_queue_on_every_holder(shared_cluster, q) -> None:
    c = shared_cluster(3)
    a = c[0]
    dead = f"{q}-dead"

    def deadlettered() -> int:
        # INFO deadlettered_jobs counts since the node started (the shared cluster's wipe
        # keeps it): this test's count is the difference
        fields = dict(line.split(":", 1) for line in
                      cmd(a, "INFO", "jobs").decode().split("\r\n") if ":" in line)
        return int(fields["deadlettered_jobs"])

    before = deadlettered()
    job_id = add(a, q, "REPLICATE", 3, "RETRY", 2, "MAXNACKS", 2, "DEADLETTER", dead)
    for _ in range(2):
        assert fetch(a, q) == job_id
        assert cmd(a, "NACK", job_id) == 1
    s = show(a, job_id)
    assert (s["state"], s["queue"]) == (b"queued", dead.encode())
    assert (s["deadletter-reason"], s["source-queue"]) == (b"max-nacks", q.encode())
    assert s["nacks"] == 2 and s["body"] == b"body"
    # every holder follows: renamed, and queued nowhere else; it stays so over RETRYs
    wait_for(lambda: all(show(p, job_id)["queue"] == dead.encode() for p in c.nodes))
    holds_for(lambda: queued_on(c.nodes, job_id) == [dead], 5, "queued once, in dead")
    assert cmd(a, "QSTAT", q)[-2:] == [b"deadlettered", 1]
    assert deadlettered() - before == 1
    # an ordinary job of the dead-letter queue: GETJOB + ACKJOB remove it everywhere
    assert fetch(a, dead) == job_id
    assert cmd(a, "ACKJOB", job_id) == 1
    wait_for(lambda: all(show(p, job_id) is None for p in c.nodes), timeout=20)


def test_maxdeliveries_dead_letters_a_job_whose_consumers_never_ack(shared_cluster, q) -> None:
    c = shared_cluster(3)
    job_id = add(c[0], q, "REPLICATE", 3, "RETRY", 1, "MAXDELIVERIES", 2)
    seen = 0
    deadline = time.monotonic() + 30
    while seen < 2 and time.monotonic() < deadline:
        for p in c.nodes:
            reply = cmd(p, "GETJOB", "NOHANG", "FROM", q)
            if reply:
                assert reply[0][1].decode() == job_id
                seen += 1
    assert seen == 2
    # the default dead-letter queue; every holder ends with it, queued on one node only
    wait_for(lambda: queued_on(c.nodes, job_id) == ["deadletter"], timeout=20)
    wait_for(lambda: all(show(p, job_id)["queue"] == b"deadletter" for p in c.nodes))
    s = show(c[0], job_id)
    assert s["deadletter-reason"] == b"max-deliveries"
    holds_for(lambda: queued_on(c.nodes, job_id) == ["deadletter"], 4, "dead once")


def test_redrive_moves_dead_jobs_back_to_their_source_queue(shared_cluster, q) -> None:
    c = shared_cluster(3)
    a = c[0]
    dead = f"{q}-dead"
    ids = [add(a, q, "REPLICATE", 2, "RETRY", 30, "MAXNACKS", 1, "DEADLETTER", dead,
               body=f"b{i}") for i in range(3)]
    assert sorted(fetch(a, q) for _ in ids) == sorted(ids)
    assert cmd(a, "NACK", *ids) == 3
    assert cmd(a, "QLEN", dead) == 3
    # one by ID, at once, counters reset
    assert cmd(a, "REDRIVE", dead, "RESET", "ID", ids[0]) == 1
    s = show(a, ids[0])
    assert (s["queue"], s["state"], s["nacks"], s["redrives"]) == (q.encode(), b"queued", 0, 1)
    assert s["deadletter-reason"] is None
    # the rest by the rate-limited task, counters kept
    assert cmd(a, "REDRIVE", dead, "RATE", 10) == 2
    wait_for(lambda: cmd(a, "QLEN", dead) == 0 and cmd(a, "QLEN", q) == 3)
    assert show(a, ids[1])["nacks"] == 1
    wait_for(lambda: all(show(p, j)["queue"] == q.encode() for p in c.nodes
                         for j in ids if show(p, j) is not None))
    assert cmd(a, "REDRIVE", dead) == 0


def test_backoff_travels_with_the_job_and_its_nack_holds_on_every_holder(shared_cluster, q) -> None:
    c = shared_cluster(3)
    a = c[0]
    job_id = add(a, q, "REPLICATE", 3, "RETRY", 1, "BACKOFF", 4)
    assert all(show(p, job_id)["backoff"] == 4 for p in c.nodes)
    # two failed deliveries: the second NACK puts the job off 1-2 s on a, and the other
    # holders, whose RETRY (1 s) would end first, wait for it too
    for k in (1, 2):
        assert fetch(a, q) == job_id
        assert cmd(a, "NACK", job_id) == 1
        wait_for(lambda k=k: all(show(p, job_id)["nacks"] == k for p in c.nodes))
        assert queued_on(c.nodes, job_id) == []
        wait_for(lambda: queued_on(c.nodes, job_id) == [q], timeout=15)
    for p in c.nodes:
        assert show(p, job_id)["additional-deliveries"] == 0, p.port


def test_a_job_whose_ttl_ends_alive_is_dead_lettered_once_across_its_holders(
        shared_cluster, q) -> None:
    c = shared_cluster(3)
    dead = f"{q}-dead"
    job_id = add(c[0], q, "REPLICATE", 3, "TTL", 3, "RETRY", 1, "DEADTTL", 60,
                 "DEADLETTER", dead)
    # every holder's TTL ends at the same moment: one queued copy, in dead, on one node
    wait_for(lambda: queued_on(c.nodes, job_id) == [dead], timeout=20)
    wait_for(lambda: all(show(p, job_id)["queue"] == dead.encode() for p in c.nodes))
    holds_for(lambda: queued_on(c.nodes, job_id) == [dead], 3, "queued once, in dead")
    for p in c.nodes:
        s = show(p, job_id)
        assert (s["deadletter-reason"], s["source-queue"]) == (b"expired", q.encode())
        assert s["ttl"] > 50, (p.port, s["ttl"])
