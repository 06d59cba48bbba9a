"""Re-replication across real processes (issue 13, part 1): a node killed with SIGKILL and
restarted without AOF comes back empty and gets its copies again from the other holders;
acked and at-most-once jobs are not sent to it."""

from __future__ import annotations

from tests.cluster.conftest import cmd, frozen, parse_fields
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


def test_a_restarted_node_that_hears_a_peer_late_knows_it_did_not_restart(cluster) -> None:  # type: ignore[no-untyped-def]
    # nodes.conf keeps the incarnation last heard from each node. Without it, a peer heard
    # more than 500 ms after our start counted as restarted (it might have been, while we
    # were down), and the refilled node sent it a copy of every job it got: with overflow
    # on, each a read from disk on the peer (a busy cluster answered that late).
    c = cluster(3)
    a, b, x = c.nodes
    kept = [str(cmd(a, "ADDJOB", "lq", f"j{i}", 5000, "REPLICATE", 3, "RETRY", 60))
            for i in range(50)]
    assert all(cmd(x, "SHOW", j) is not None for j in kept)
    wait_for(lambda: "vars incarnations" in (x.workdir / "nodes.conf").read_text(),
             what="x's nodes.conf naming the others' incarnations")
    x.kill()
    with frozen(a):
        x.start()
        wait_for(lambda: all(cmd(x, "SHOW", j) is not None for j in kept), timeout=20,
                 what="b's copies back on x")
        wait_for(lambda: int(parse_fields(cmd(x, "INFO", "server"))["uptime_in_seconds"]) >= 1,
                 what="a heard only after x's first second")
    c.wait_mesh()
    start = int(parse_fields(cmd(x, "INFO", "server"))["uptime_in_seconds"])
    wait_for(lambda: int(parse_fields(cmd(x, "INFO", "server"))["uptime_in_seconds"]) >= start + 2,
             what="x's cron running a while after hearing a")
    assert info_jobs(x)["rereplicated_jobs"] == "0"
    assert info_jobs(x)["rereplication_rechecked"] == "0"
