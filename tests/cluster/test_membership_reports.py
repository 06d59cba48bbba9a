"""Original-Disque membership reports (docs/original-bugs.md rows 15, 32).

Row 32: the original's own suite chained 7 nodes with CLUSTER MEET and never got a full mesh.
Row 15: MEET answered OK, no cluster formed, and neither node logged anything because the bus
port (client port + 10000) was unreachable.
"""

from __future__ import annotations

import socket

from tests.cluster.conftest import cluster_nodes, cmd, ok, reachable
from tests.harness import free_port, wait_for


def test_meet_chain_of_seven_nodes_reaches_full_mesh(cluster):
    c = cluster(7, meet="chain")  # node i meets node i+1; fixture waits for the full mesh
    ids = set(c.ids())
    assert len(ids) == 7
    for p in c:
        assert reachable(p) == 6
        assert set(cluster_nodes(p)) == ids


def test_meet_to_a_node_whose_bus_port_is_closed_is_logged_and_expires(cluster):
    """The client port answers (a real listener) but the bus port is closed: MEET is +OK,
    a handshake entry appears, the failed bus connection is logged with the address, and
    the entry expires."""
    c = cluster(1, node_timeout=1000, meet=None)
    p = c[0]
    # a client-port listener whose bus port (port + 10000) has nothing behind it
    port = free_port()  # port and port + 10000 both free
    lst = socket.socket()
    lst.bind(("127.0.0.1", port))
    lst.listen()
    try:
        ok(p, "CLUSTER", "MEET", "127.0.0.1", port)
        hs = [n for n in cluster_nodes(p).values() if "handshake" in n.flags]
        assert len(hs) == 1 and hs[0].port == port, cluster_nodes(p)
        bus = str(port + 10000)
        wait_for(lambda: f"127.0.0.1:{bus}" in p.output(), timeout=10,
                 what="the failed bus connection logged with its address")
        wait_for(lambda: len(cluster_nodes(p)) == 1, timeout=10, what="the handshake to expire")
        assert reachable(p) == 0
        assert cmd(p, "PING") == "PONG"
    finally:
        lst.close()
