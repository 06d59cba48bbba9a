"""Failed jobs end to end on a real 3-node cluster, through the Python client and
`disque-worker` (issue 15): the README's worked example (a handler that fails three times,
the job in the dead-letter queue, SHOW, redrive), and a dead job that outlives the node that
dead-lettered it (another holder queues it in the dead-letter queue, never in its source).
The first runs on a cluster shared with other calm tests (`shared_cluster`), in queues of its
own (`q`); the second kills a node, on a cluster of its own."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from disque.client import Client
from tests.cluster.conftest import NODE_TIMEOUT, cmd, holds_for, kill_until_failed
from tests.harness import DisqueProcess, wait_for
from tests.integration.resp import pairs
from tests.integration.worker_proc import Workers, stop, workers_of


@pytest.fixture
def workers(tmp_path: Path) -> Iterator[Workers]:
    yield from workers_of(tmp_path)


def where_queued(nodes: list[DisqueProcess], job_id: str) -> list[tuple[int, str]]:
    """(port, queue) of every node that has the job queued."""
    out = []
    for p in nodes:
        shown = cmd(p, "SHOW", job_id)
        if shown is not None:
            s = pairs(shown)
            if s["state"] == b"queued":
                out.append((p.port, s["queue"].decode()))
    return out


def addr(p: DisqueProcess) -> str:
    return f"127.0.0.1:{p.port}"


def test_a_handler_that_fails_three_times_dead_letters_the_job_then_redrive(
        shared_cluster: Any, q: str, workers: Workers) -> None:
    c = shared_cluster(3)
    nodes = c.nodes
    client = Client([addr(p) for p in nodes])
    try:
        dead = f"{q}-dead"
        job_id = client.add_job(q, b"to:bob", 5000, replicate=3, retry=30,
                                max_nacks=3, deadletter=dead)
        # plain NACKs (--backoff 0): three failures in a row, then the node moves the job
        w = workers.start("fail", [q], [nodes[0].port], "--backoff", "0")
        wait_for(lambda: [q for _, q in where_queued(nodes, job_id)] == [dead],
                 timeout=30, what="the job dead-lettered")
        assert stop(w) == 0
        assert len(workers.events("fail")) == 3
        s = w.summary()
        assert (s["failed"], s["nacked"], s["acked"]) == (3, 3, 0)
        ((port, _),) = where_queued(nodes, job_id)
        dead_node = next(p for p in nodes if p.port == port)
        shown = client.show(job_id, node=addr(dead_node))
        assert shown["deadletter-reason"] == "max-nacks"
        assert shown["source-queue"] == q and shown["nacks"] == 3
        # every holder agrees on where the job is, and it stays queued once
        wait_for(lambda: all(pairs(cmd(p, "SHOW", job_id))["queue"] == dead.encode()
                             for p in nodes), what="every copy renamed")
        holds_for(lambda: len(where_queued(nodes, job_id)) == 1, 3, "queued once")
        # redrive on the node holding it: back in its source queue with its counters reset,
        # and a working handler then acknowledges it
        assert client.redrive(dead, reset=True, ids=[job_id],
                              node=addr(dead_node)) == 1
        assert where_queued(nodes, job_id) == [(port, q)]
        assert client.show(job_id, node=addr(dead_node))["nacks"] == 0
        ok = workers.start("ok", [q], [port])
        wait_for(lambda: [e.job for e in workers.events("done")] == [job_id],
                 what="the redriven job done")
        assert stop(ok) == 0
        wait_for(lambda: all(cmd(p, "SHOW", job_id) is None
                             or pairs(cmd(p, "SHOW", job_id))["state"] == b"acked"
                             for p in nodes), timeout=20, what="acked everywhere")
    finally:
        client.close()


def test_a_dead_job_outlives_the_node_that_dead_lettered_it(cluster: Any) -> None:
    c = cluster(3, node_timeout=NODE_TIMEOUT)
    nodes = c.nodes
    a = nodes[0]
    client = Client([addr(a)], discover=False)
    try:
        job_id = client.add_job("work", b"body", 5000, replicate=3, retry=2, max_nacks=1,
                                deadletter="dead")
        (job,) = client.get_job("work", timeout=5000)
        assert job.id == job_id
        assert client.nack(job_id) == 1
        assert where_queued(nodes, job_id) == [(a.port, "dead")]
        wait_for(lambda: all(pairs(cmd(p, "SHOW", job_id))["queue"] == b"dead"
                             for p in nodes[1:]), what="the other holders learnt it")
    finally:
        client.close()
    kill_until_failed(c, 0)
    # a surviving holder requeues it after RETRY: into the dead-letter queue, once
    wait_for(lambda: len(where_queued(nodes[1:], job_id)) == 1, timeout=20,
             what="a survivor queues the dead job")
    ((port, queue),) = where_queued(nodes[1:], job_id)
    assert queue == "dead"
    holds_for(lambda: [q for _, q in where_queued(nodes[1:], job_id)] == ["dead"], 4,
              "queued once, in dead, never in work")
    survivor = next(p for p in nodes if p.port == port)
    s = pairs(cmd(survivor, "SHOW", job_id))
    assert (s["deadletter-reason"], s["source-queue"]) == (b"max-nacks", b"work")
    # and redrive there loses nothing: back in its source queue
    assert cmd(survivor, "REDRIVE", "dead", "ID", job_id) == 1
    reply = cmd(survivor, "GETJOB", "NOHANG", "FROM", "work")
    assert reply and reply[0][1].decode() == job_id
