"""A killed node is not waited for (issue 25), on 3 real processes.

kill -9 of a node makes its kernel reset its connections at once, while its peers flag it
`fail?` only after cluster-node-timeout (a minute here, so it never happens during the
test). Synchronous ADDJOBs sent right after the kill must all complete with their copy on
the live node; once the node that takes them shows its link to the dead node down, no new
job lists the dead node among its copies (ADDJOB, ADDJOBS and ASYNC alike).
"""

from __future__ import annotations

from typing import Any

from tests.cluster.conftest import cluster_nodes, cmd
from tests.harness import wait_for
from tests.integration.resp import Conn, Err, Status

NODE_TIMEOUT = 60_000  # ms: the killed node stays "reachable" (not fail?) all along


def show(proc: Any, job_id: str) -> dict[bytes, Any] | None:
    reply = cmd(proc, "SHOW", job_id)
    if reply is None:
        return None
    return dict(zip(*[iter(reply)] * 2, strict=True))


def delivered(proc: Any, job_id: str) -> set[str]:
    info = show(proc, job_id)
    assert info is not None, f"{job_id} unknown on :{proc.port}"
    return {n.decode() for n in info[b"nodes-delivered"]}


def test_sync_addjobs_right_after_a_kill_replicate_to_the_live_node(cluster) -> None:  # type: ignore[no-untyped-def]
    c = cluster(3, node_timeout=NODE_TIMEOUT)
    a, b, x = c.nodes
    aid, bid, xid = c.ids()
    producer = Conn(a.port, timeout=30)
    try:
        x.kill()  # SIGKILL, reaped: its connections are reset by now
        # At once, without waiting for anything: some of these may be sent before node a
        # has read the reset, and wait on x until the link drop re-targets them.
        first = []
        for i in range(100):
            reply = producer.cmd("ADDJOB", "dq", f"first{i}", 20_000, "REPLICATE", 2)
            assert isinstance(reply, (bytes, Status)) and not isinstance(reply, Err), reply
            first.append(str(reply) if isinstance(reply, Status) else reply.decode())
        wait_for(lambda: cluster_nodes(a)[xid].link == "disconnected",
                 what="node a showing its link to the killed node down")
        after = []
        for i in range(100):
            reply = producer.cmd("ADDJOB", "dq", f"after{i}", 20_000, "REPLICATE", 2)
            assert isinstance(reply, (bytes, Status)) and not isinstance(reply, Err), reply
            after.append(str(reply) if isinstance(reply, Status) else reply.decode())
        batch = producer.cmd("ADDJOBS", "dq", 20_000, "REPLICATE", 2, "JOBS",
                             *[f"batch{i}" for i in range(50)])
        assert isinstance(batch, list) and len(batch) == 50
        assert not [r for r in batch if isinstance(r, Err)], batch
        after += [str(r) if isinstance(r, Status) else r.decode() for r in batch]
        quick = []
        for i in range(50):
            reply = producer.cmd("ADDJOB", "dq", f"async{i}", 0, "REPLICATE", 2, "ASYNC")
            assert not isinstance(reply, Err), reply
            quick.append(str(reply) if isinstance(reply, Status) else reply.decode())
    finally:
        producer.close()

    for job_id in first + after:
        assert bid in delivered(a, job_id)
        assert show(b, job_id) is not None, f"{job_id}: no copy on the live node"
    for job_id in after:
        assert xid not in delivered(a, job_id), f"{job_id} lists the dead node"
    wait_for(lambda: all(show(b, j) is not None for j in quick),
             what="the ASYNC copies on the live node")
    for job_id in quick:
        assert delivered(a, job_id) == {aid, bid}
    flags = cluster_nodes(a)[xid].flags
    assert "fail?" not in flags and "fail" not in flags  # all of it before any PFAIL
