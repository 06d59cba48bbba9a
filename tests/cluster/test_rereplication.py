"""Re-replication across real processes (issue 13, part 1): a node killed with SIGKILL and
restarted without AOF comes back empty and gets its copies again from the other holders;
acked and at-most-once jobs are not sent to it."""

from __future__ import annotations

from tests.cluster.conftest import cmd, parse_fields
from tests.harness import wait_for


def info_jobs(p) -> dict[str, str]:  # type: ignore[no-untyped-def]
    return parse_fields(cmd(p, "INFO", "jobs"))


def test_a_node_restarted_empty_gets_its_copies_back(cluster) -> None:  # type: ignore[no-untyped-def]
    c = cluster(3)
    a, b, x = c.nodes
    kept = [str(cmd(a, "ADDJOB", "rq", f"j{i}", 5000, "REPLICATE", 3, "RETRY", 60))
            for i in range(20)]
    acked = str(cmd(a, "ADDJOB", "rq", "acked", 5000, "REPLICATE", 3, "RETRY", 60))
    once = str(cmd(a, "ADDJOB", "rq", "once", 5000, "REPLICATE", 1, "RETRY", 0))
    assert cmd(b, "ACKJOB", acked) == 1
    wait_for(lambda: all(cmd(p, "SHOW", acked) is None for p in c), what="ack collected")
    assert all(cmd(x, "SHOW", j) is not None for j in kept)
    x.kill()
    x.start()
    c.wait_mesh()
    assert int(info_jobs(x)["registered_jobs"]) <= len(kept)  # came back empty (or refilling)
    wait_for(lambda: all(cmd(x, "SHOW", j) is not None for j in kept), timeout=20,
             what="the restarted node holding its copies again")
    wait_for(lambda: all(info_jobs(p)["rereplication_pending"] == "0"
                         and info_jobs(p)["rereplication_nodes"] == "0" for p in (a, b)),
             what="re-replication finished")
    assert sum(int(info_jobs(p)["rereplicated_jobs"]) for p in (a, b)) >= len(kept)
    assert cmd(x, "SHOW", acked) is None and cmd(x, "SHOW", once) is None
    show = dict(zip(*[iter(cmd(x, "SHOW", kept[0]))] * 2, strict=True))
    assert show[b"state"] == b"active" and len(show[b"nodes-delivered"]) == 3
