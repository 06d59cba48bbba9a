"""Restarts with the same nodes.conf at another address, and with a new identity at the same
address (checklist §7 nodes.conf reload, §9 address updates, §13.2)."""

from __future__ import annotations

from tests.cluster.conftest import (
    NODE_TIMEOUT,
    cluster_info,
    cluster_nodes,
    kill_until_failed,
    myid,
)
from tests.harness import DisqueProcess, wait_for


def test_restart_at_another_port_with_the_same_nodes_conf_is_followed_by_the_others(cluster):
    """The restarted node keeps its ID (nodes.conf); its PINGs carry the new port, so the
    others update the address, reconnect and clear fail?/fail."""
    c = cluster(3, node_timeout=NODE_TIMEOUT)
    x = c[2]
    xid = kill_until_failed(c, 2)
    moved = DisqueProcess(x.workdir, args=x.args)  # same dir, same nodes.conf, new port
    c.nodes[2] = moved
    moved.start()
    assert myid(moved) == xid

    def followed() -> bool:
        for p in c[:2]:
            line = cluster_nodes(p)[xid]
            if (line.port != moved.port or line.flags != ["noflags"]
                    or line.link != "connected"):
                return False
        return all(int(cluster_info(p)["cluster_reachable_nodes"]) == 2 for p in c)

    wait_for(followed, timeout=15, what="the others following the new port")


def test_new_identity_at_a_known_address(cluster):
    """A node wiped (nodes.conf deleted) and restarted at the same address answers with a
    new ID: the old ID can no longer be reached, so it must not stay counted as reachable
    (jobs would be replicated to a node nobody can talk to)."""
    c = cluster(3)
    x = c[2]
    old = myid(x)
    x.kill()
    (x.workdir / "nodes.conf").unlink()
    x.start()
    assert myid(x) != old

    def old_id_unreachable() -> bool:
        return all(int(cluster_info(p)["cluster_reachable_nodes"]) == 1 for p in c[:2])

    try:
        wait_for(old_id_unreachable, timeout=15,
                 what="the old ID no longer counted as reachable")
    except AssertionError:
        raise AssertionError({p.port: (cluster_nodes(p).get(old),
                                       cluster_info(p)["cluster_reachable_nodes"])
                              for p in c[:2]}) from None
