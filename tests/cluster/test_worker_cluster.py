"""`disque-worker` against real 3-node clusters: jobs from every node, a worker killed -9
mid-job (its job goes to another worker after RETRY), a node killed -9 mid-job (the worker
acknowledges through another node and goes on), WORKING and NACK DELAY holding on every
copy of a job. Issue 15.

The tests that kill no node run on a cluster shared with other calm tests (`shared_cluster`),
in queues of their own (`q`): a worker killed -9 leaves the cluster as it found it."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from disque.state import REQUEUE_JITTER
from tests.cluster.conftest import NODE_TIMEOUT, cmd, kill_until_failed, parse_fields
from tests.harness import DisqueProcess, wait_for
from tests.integration.resp import pairs
from tests.integration.worker_proc import Workers, stop, workers_of

RETRY = 2  # s, of the job a killed worker leaves behind


@pytest.fixture
def workers(tmp_path: Path) -> Iterator[Workers]:
    yield from workers_of(tmp_path)


def state(node: DisqueProcess, job_id: str) -> Any:
    """The job's state on `node`, None when the node does not have it."""
    shown = cmd(node, "SHOW", job_id)
    return None if shown is None else pairs(shown)["state"]


def connected_clients(node: DisqueProcess) -> int:
    """INFO's connected_clients (the asking connection included)."""
    return int(parse_fields(cmd(node, "INFO", "clients"))["connected_clients"])


def done_with(nodes: list[DisqueProcess], job_id: str) -> bool:
    """Acknowledged as far as these nodes know: acked, or already garbage-collected."""
    return all(state(p, job_id) in (None, b"acked") for p in nodes)


def test_worker_on_one_node_processes_jobs_added_on_every_node(
        shared_cluster, q, workers: Workers) -> None:
    nodes = shared_cluster(3)
    ids = [cmd(p, "ADDJOB", q, f"from{p.port}-{i}", "0") for p in nodes for i in range(2)]
    w = workers.start("ok", [q], [nodes[0].port], "-c", "2")
    done = workers.wait_events("done", 6)
    assert sorted(e.job for e in done) == sorted(ids)
    for job_id in ids:
        wait_for(lambda job_id=job_id: done_with(nodes.nodes, job_id), what="ACK everywhere")
    assert stop(w) == 0
    s = w.summary()
    assert (s["processed"], s["acked"], s["errors"]) == (6, 6, 0)


def test_worker_killed_mid_job_leaves_the_job_to_another_worker_after_retry(
        cluster, workers: Workers) -> None:
    nodes = cluster(3)
    added_at = time.time()  # before the job exists: every copy's requeue timer is later
    job_id = cmd(nodes[0], "ADDJOB", "q", "body", "0", "RETRY", str(RETRY))
    a = workers.start("slow", ["q"], [nodes[0].port], work=600)
    (started,) = workers.wait_events("start", 1)
    assert started.pid == a.pid and started.job == job_id
    a.kill()  # kill -9: no ACK, no NACK, no more WORKING
    # The node saw the worker's connections close and did not requeue the job for that:
    # it is still active, unless a RETRY timer could already have come due (then it is
    # an additional delivery).
    wait_for(lambda: connected_clients(nodes[0]) == 1, what="the worker's connections closed")
    shown = pairs(cmd(nodes[0], "SHOW", job_id))
    retry_may_be_due = time.time() - added_at >= RETRY - REQUEUE_JITTER / 1000
    assert shown["nacks"] == 0, shown
    assert shown["state"] == b"active" or (
        retry_may_be_due and shown["additional-deliveries"] >= 1), shown
    b = workers.start("slow", ["q"], [nodes[1].port], work=0)
    (done,) = workers.wait_events("done", 1, timeout=30)
    assert done.pid == b.pid and done.job == job_id
    again = [e for e in workers.events("start") if e.pid == b.pid]
    assert len(again) == 1
    # requeued by a RETRY timer (an additional delivery, not a NACK), and not before
    # RETRY, less the node's requeue jitter, from before the job existed
    assert again[0].deliveries >= 1 and again[0].nacks == 0
    assert again[0].time - added_at >= RETRY - REQUEUE_JITTER / 1000, (again, added_at)
    wait_for(lambda: done_with(nodes.nodes, job_id), what="the job acked everywhere")
    assert stop(b) == 0
    assert b.summary()["acked"] == 1


def test_node_killed_mid_job_the_worker_acks_elsewhere_and_goes_on(cluster, workers: Workers
                                                                   ) -> None:
    nodes = cluster(3, node_timeout=NODE_TIMEOUT)
    first = cmd(nodes[0], "ADDJOB", "q", "first", "0", "RETRY", "60")
    w = workers.start("slow", ["q"], [nodes[0].port], work=2)
    (started,) = workers.wait_events("start", 1)
    assert started.job == first
    kill_until_failed(nodes, 0)  # kill -9 of the node that delivered the job
    workers.wait_events("done", 1)
    survivors = nodes.nodes[1:]
    # the ACK went to a surviving copy: no node will run the job again
    wait_for(lambda: done_with(survivors, first), what="the ACK on the survivors")
    second = cmd(nodes[1], "ADDJOB", "q", "second", "0", "RETRY", "60", "REPLICATE", "2")
    done = workers.wait_events("done", 2, timeout=30)
    assert [e.job for e in done] == [first, second]
    assert w.proc.poll() is None
    assert stop(w) == 0
    s = w.summary()
    assert (s["processed"], s["acked"], s["failed"], s["errors"]) == (2, 2, 0, 0), s
    moved = [r for r in w.logged("job.command_elsewhere") if r["command"] == "ACK"]
    assert [r["job"] for r in moved] == [first]
    assert moved[0]["node"] == f"127.0.0.1:{nodes[0].port}"


def test_working_reaches_every_copy_so_no_other_node_redelivers_a_long_job(
        shared_cluster, q, workers: Workers) -> None:
    # RETRY 2 with three copies: each holder would requeue the job after 2 s, and the
    # worker on the other node would run it, unless WORKING reaches all of them
    nodes = shared_cluster(3)
    job_id = cmd(nodes[0], "ADDJOB", q, "long", "0", "RETRY", "2")
    a = workers.start("slow", [q], [nodes[0].port], work=3.5)
    workers.wait_events("start", 1)
    b = workers.start("slow", [q], [nodes[1].port], work=0)
    (done,) = workers.wait_events("done", 1, timeout=30)
    assert done.pid == a.pid
    wait_for(lambda: done_with(nodes.nodes, job_id), what="the job acked everywhere")
    assert [e.pid for e in workers.events("start")] == [a.pid], workers.events()
    assert stop(a) == 0 and stop(b) == 0
    assert a.summary()["working"] >= 2 and b.summary()["processed"] == 0


def test_nack_delay_holds_on_every_copy(shared_cluster, q, workers: Workers) -> None:
    # a NACK DELAY on the delivering node: the other holders must not requeue the job before
    # the delay is over either (its RETRY, 2 s, is shorter than the delay, 3 s at least)
    nodes = shared_cluster(3)
    job_id = cmd(nodes[0], "ADDJOB", q, "payload", "0", "RETRY", "2")
    w = workers.start("fail", [q], [nodes[0].port, nodes[1].port, nodes[2].port],
                      "--backoff", "6", "--max-backoff", "6")
    (first,) = workers.wait_events("fail", 1)
    fails = workers.wait_events("fail", 2, timeout=30)
    assert fails[1].job == job_id
    assert (fails[1].nacks, fails[1].deliveries) == (1, 0)  # NACKed once, no RETRY requeue
    assert fails[1].time - first.time >= 3.0  # ceil(6 x uniform(0.5, 1)) >= 3
    assert stop(w) == 0
    assert w.logged("job.failed")[0]["nack_delay"] >= 3
