"""Checklist §4 CLUSTER / §7 statements without a real-cluster test so far."""

from __future__ import annotations

from tests.cluster.conftest import (
    cluster_info,
    cluster_nodes,
    cmd,
    hello,
    myid,
    ok,
)
from tests.harness import free_port, wait_for
from tests.integration.resp import Conn, Status
from tests.threads import Background


def test_leaving_survives_a_restart_through_nodes_conf(cluster):
    """§4 CLUSTER LEAVING: "persisted in nodes.conf"."""
    c = cluster(3)
    leaver = c[1]
    lid = myid(leaver)
    ok(leaver, "CLUSTER", "LEAVING", "yes")
    wait_for(lambda: "leaving" in cluster_nodes(c[0])[lid].flags, timeout=10,
             what="leaving seen by the others")
    leaver.kill()
    leaver.start()
    assert cmd(leaver, "CLUSTER", "LEAVING") == Status("yes")
    assert cluster_nodes(leaver)[lid].flags == ["myself", "leaving"]
    wait_for(lambda: all("fail" not in cluster_nodes(p)[lid].flags
                         and "leaving" in cluster_nodes(p)[lid].flags for p in (c[0], c[2])),
             timeout=15, what="the restarted node still leaving for the others")


def test_handshake_entry_is_listed_counted_not_saved_and_expires(cluster):
    """§7: handshake nodes appear in CLUSTER NODES / HELLO / cluster_known_nodes but not in
    cluster_size or nodes.conf; they expire after max(node_timeout, 1000 ms)."""
    c = cluster(1, node_timeout=1000, meet=None)
    p = c[0]
    dead = free_port()  # nothing listens there
    ok(p, "CLUSTER", "MEET", "127.0.0.1", dead)
    ok(p, "CLUSTER", "MEET", "127.0.0.1", dead)  # pending handshake: still +OK, no duplicate
    nodes = cluster_nodes(p)
    hs = [n for n in nodes.values() if "handshake" in n.flags]
    assert len(hs) == 1 and hs[0].port == dead and hs[0].link == "disconnected", nodes
    info = cluster_info(p)
    assert info["cluster_known_nodes"] == "2" and info["cluster_size"] == "1", info
    assert info["cluster_reachable_nodes"] == "0", info
    assert hs[0].id in hello(p)
    ok(p, "CLUSTER", "SAVECONFIG")
    assert hs[0].id not in (p.workdir / "nodes.conf").read_text()
    wait_for(lambda: len(cluster_nodes(p)) == 1, timeout=5, what="the handshake to expire")


def test_reset_answers_blocked_getjob_with_a_null_array(cluster):
    """§4 CLUSTER RESET: "blocked GETJOB clients get *-1"."""
    c = cluster(2)
    conn = Conn(c[0].port, timeout=10)
    getter = Background(conn.cmd, "GETJOB", "TIMEOUT", "0", "FROM", "q")
    try:
        wait_for(lambda: "blocked_clients:1" in cmd(c[0], "INFO", "clients").decode(),
                 timeout=5, what="GETJOB blocked")
        ok(c[0], "CLUSTER", "RESET", "SOFT")
        # (a GETJOB left blocked fails here: its connection times out after 10 s)
        assert getter.result(timeout=15) is None
    finally:
        conn.close()
