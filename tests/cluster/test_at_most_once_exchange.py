"""Original-Disque report "At-most-once jobs are lost in cluster exchange" (docs/original-bugs.md
row 7), the reporter's exact scenario: 2 nodes, one RETRY 0 job added on each; two GETJOBs on
node 1: the second blocks until node 2's job arrives through NEEDJOBS / YOURJOBS. On a
2-node cluster shared with other calm tests, in a queue of its own.
"""

from __future__ import annotations

from tests.cluster.conftest import cmd
from tests.cluster.test_jobs import jobs_of
from tests.harness import wait_for
from tests.integration.resp import Conn, Status


def test_at_most_once_job_moved_by_yourjobs_is_delivered(shared_cluster, q):
    c = shared_cluster(2)
    n1, n2 = c.nodes
    j1 = cmd(n1, "ADDJOB", q, "one", 0, "REPLICATE", 1, "RETRY", 0)
    j2 = cmd(n2, "ADDJOB", q, "two", 0, "REPLICATE", 1, "RETRY", 0)
    assert isinstance(j1, Status) and isinstance(j2, Status)
    with Conn(n1.port, timeout=20) as conn:
        first = conn.cmd("GETJOB", "FROM", q)
        assert [(jid.decode(), body) for _, jid, body in first] == [(str(j1), b"one")]
        second = conn.cmd("GETJOB", "TIMEOUT", 10000, "FROM", q)
        assert second is not None, "the RETRY 0 job of node 2 was never delivered on node 1"
        assert [(jid.decode(), body) for _, jid, body in second] == [(str(j2), b"two")]
    wait_for(lambda: jobs_of(n2, q) == [], timeout=10,
             what="the moved job deleted on the sender")
    assert cmd(n1, "ACKJOB", str(j1), str(j2)) == 2
