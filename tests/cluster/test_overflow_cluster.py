"""Overflow (issue 22) on real clusters: REPLICATE 3 on three nodes whose queued jobs and
copies overflow to disk; every job is delivered once through any node, and the copies on
disk are collected after the ACK."""

from __future__ import annotations

from typing import Any

from tests.harness import wait_for
from tests.integration.resp import Conn, Status, info

BODY = "x" * 1000
ARGS = ["--maxmemory", "8mb", "--overflow", "yes", "--overflow-threshold", "30"]


def on_disk(port: int) -> int:
    with Conn(port) as c:
        return int(info(c, "jobs")["overflow_jobs"])


def registered(port: int) -> int:
    with Conn(port) as c:
        return int(info(c, "jobs")["registered_jobs"])


def test_replicated_jobs_overflow_on_every_node_and_are_delivered_once(cluster: Any) -> None:
    c = cluster(3, args=ARGS)
    n = 3000
    with Conn(c[0].port) as a:
        for start in range(0, n, 250):
            replies = a.pipeline([("ADDJOB", "rq", "%06d" % i + BODY, 5000, "REPLICATE", 3,
                                   "RETRY", 30) for i in range(start, min(start + 250, n))])
            assert all(isinstance(r, Status) for r in replies), replies[:2]
    # the queued jobs on node 0 and the copies on 1 and 2 went to disk
    wait_for(lambda: all(on_disk(p.port) > 500 for p in c), what="jobs on disk everywhere")
    seen: list[int] = []
    # consume through node 1 (federation moves them there) and node 0, in turns
    turn = 0
    while len(seen) < n:
        port = c[turn % 2 and 1 or 0].port
        turn += 1
        with Conn(port) as x:
            got = x.cmd("GETJOB", "TIMEOUT", 500, "COUNT", 50, "FROM", "rq")
            if not got:
                continue
            seen += [int(j[2][:6]) for j in got]
            assert x.cmd("ACKJOB", *[j[1] for j in got]) == len(got)
    assert sorted(seen) == list(range(n))
    wait_for(lambda: all(registered(p.port) == 0 for p in c), timeout=60,
             what="every copy collected, on disk too")
