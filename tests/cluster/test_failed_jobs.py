"""Failed jobs across a real 3-node cluster (issue 15): NACK DELAY, dead-letter queues and
redrive. Every holder of a copy may requeue a job, so each behaviour is checked on all nodes."""

from __future__ import annotations

import time
from typing import Any

from tests.cluster.conftest import cmd, holds_for
from tests.harness import DisqueProcess, wait_for
from tests.integration.resp import Status, pairs

Q = "work"


def add(proc: DisqueProcess, *opts: Any, body: str = "body", queue: str = Q) -> str:
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


def fetch(proc: DisqueProcess, queue: str = Q) -> str:
    """GETJOB on `proc`, waiting for the job to be queued there (or imported)."""
    reply = cmd(proc, "GETJOB", "TIMEOUT", 10000, "FROM", queue, timeout=15)
    assert reply, f"nothing in {queue} on :{proc.port}"
    return reply[0][1].decode()


def test_nack_delay_holds_the_job_back_on_every_holder(cluster) -> None:
    c = cluster(3)
    a = c[0]
    job_id = add(a, "REPLICATE", 3, "RETRY", 2)
    assert fetch(a) == job_id
    start = time.monotonic()
    assert cmd(a, "NACK", job_id, "DELAY", 5) == 1
    # the other holders heard of the NACK: one nack each, and none requeues before the
    # delay, although their RETRY (2 s) ends well before it
    wait_for(lambda: all(show(p, job_id)["nacks"] == 1 for p in c.nodes))
    holds_for(lambda: queued_on(c.nodes, job_id) == [], 3.5, "not queued during the delay")
    wait_for(lambda: queued_on(c.nodes, job_id) == [Q], timeout=15)
    assert time.monotonic() - start >= 4.5
    for p in c.nodes:
        s = show(p, job_id)
        assert (s["nacks"], s["additional-deliveries"]) == (1, 0), (p.port, s)
