"""Repair of under-replicated jobs (issue 25), on 4 real processes.

Jobs with REPLICATE 2 are added on node a, each with its second copy on b, c or d. One of
those is killed (kill -9). Repair is off (`repair-rate 0`) at first: nothing is copied.
Once CONFIG SET turns it on, after `repair-grace` the jobs the killed node held get a copy
on another live node, made by a or by their other holder, and node a's list grows to name
it. The killed node
comes back empty (no AOF); once every job is acknowledged, no node holds any copy: the
extra copies are collected with the others.
"""

from __future__ import annotations

from typing import Any

from tests.cluster.conftest import cmd, holds_for, ok, parse_fields
from tests.harness import free_port, wait_for
from tests.integration.test_http import sample, scrape

NODE_TIMEOUT = 60_000  # ms: the killed node is never flagged failing; only its link drops
GRACE = 300


def show(proc: Any, job_id: str) -> dict[bytes, Any] | None:
    reply = cmd(proc, "SHOW", job_id)
    return None if reply is None else dict(zip(*[iter(reply)] * 2, strict=True))


def holders(procs: list[Any], job_id: str) -> list[Any]:
    return [p for p in procs if p.alive() and show(p, job_id) is not None]


def jobs_info(proc: Any) -> dict[str, str]:
    return parse_fields(cmd(proc, "INFO", "jobs"))


def test_jobs_short_of_a_killed_holder_get_a_copy_elsewhere_and_are_collected_later(
        cluster) -> None:  # type: ignore[no-untyped-def]
    c = cluster(4, node_timeout=NODE_TIMEOUT,
                args=["--repair-grace", str(GRACE), "--repair-rate", "0"])
    nodes = list(c.nodes)
    a = nodes[0]
    ids = c.ids()
    jobs = [str(cmd(a, "ADDJOB", "rq", f"j{i}", 5000, "REPLICATE", 2, "RETRY", 30))
            for i in range(60)]
    second = {j: next(p for p in nodes[1:] if show(p, j) is not None) for j in jobs}
    victim = max(nodes[1:], key=lambda p: sum(1 for s in second.values() if s is p))
    lost = [j for j in jobs if second[j] is victim]
    assert lost
    victim.kill()
    live = [p for p in nodes if p is not victim]
    holds_for(lambda: all(len(holders(live, j)) == 1 for j in lost), 3 * GRACE / 1000,
              "no copy made with repair-rate 0")
    for p in live:
        ok(p, "CONFIG", "SET", "repair-rate", "5000")
    wait_for(lambda: all(len(holders(live, j)) >= 2 for j in lost),
             what="a second live copy of every job the killed node held", timeout=30)
    vid = ids[nodes.index(victim)]
    for j in lost:
        listed = {n.decode() for n in show(a, j)[b"nodes-delivered"]}
        assert vid in listed and len(listed) == 3, listed  # the list grew, nothing dropped
        assert {ids[nodes.index(p)] for p in holders(live, j)} <= listed
    assert sum(int(jobs_info(p)["repaired_jobs"]) for p in live) >= len(lost)
    wait_for(lambda: all(jobs_info(p)["underreplicated_jobs"] == "0" for p in live),
             what="no job counted short any more")
    http = free_port()
    ok(a, "CONFIG", "SET", "http-port", http)  # Prometheus shows INFO's figures
    fams = wait_for(lambda: scrape(http), what="node a's /metrics")
    # a is the only live holder of the jobs the killed node shared with it: it copied each
    assert sample(fams, "disque_jobs_repaired", "disque_jobs_repaired_total") == int(
        jobs_info(a)["repaired_jobs"]) == len(lost)
    assert sample(fams, "disque_jobs_underreplicated") == 0
    # untouched: the jobs whose copies all live
    for j in jobs:
        if j not in lost:
            assert len(holders(live, j)) == 2

    victim.start()  # empty (no AOF); re-replication gives it its copies back
    c.wait_mesh()
    for j in jobs:
        cmd(a, "ACKJOB", j)
    wait_for(lambda: not any(holders(nodes, j) for j in jobs),
             what="every copy collected, the extra ones and the restarted node's too",
             timeout=30)
