"""A node listening on one address only (bind 127.0.0.2) must be reachable by the nodes it
meets. Peers take a node's address from the source of its bus connection (the header's IP
field is empty), so outbound links must leave from the first bind address, as the original's
anetTcpNonBlockBindConnect(..., DISQUE_BIND_ADDR) does. Without that the kernel picks
127.0.0.1 (or, on a real host, the interface toward the peer), the peers record the wrong
address, and the node stays `fail?`/`fail` for them forever while it sees them fine."""

from __future__ import annotations

import socket
from pathlib import Path

import redis

from tests.cluster.conftest import NODE_TIMEOUT, cluster_info, cluster_nodes, kill_until_failed
from tests.harness import DisqueProcess, wait_for

ALT_IP = "127.0.0.2"


class BoundProcess(DisqueProcess):
    """A node listening on ALT_IP only (client port and bus)."""

    def wait_ready(self, timeout: float = 30.0) -> None:
        def ready() -> bool:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"server exited:\n{self.output()}")
            try:
                with socket.create_connection((ALT_IP, self.port), timeout=1) as s:
                    s.sendall(b"*1\r\n$4\r\nPING\r\n")
                    return s.recv(64).startswith(b"+PONG")
            except OSError:
                return False
        wait_for(ready, timeout=timeout, what=f"node on {ALT_IP}:{self.port}")

    def client(self, **kw: object) -> redis.Redis:
        return redis.Redis(host=ALT_IP, port=self.port, protocol=2, socket_timeout=10)


def test_node_bound_to_another_loopback_address_joins_and_is_reachable(cluster,
                                                                        tmp_path: Path) -> None:
    c = cluster(2)
    x = BoundProcess(tmp_path / "bound", args=["--bind", ALT_IP,
                                               "--cluster-node-timeout", "1000"])
    try:
        x.start()
        xr = x.client()
        xid = xr.execute_command("CLUSTER", "MYID").decode()
        assert xr.execute_command("CLUSTER", "MEET", "127.0.0.1", c[0].port) in (b"OK", "OK",
                                                                                   True)

        def joined() -> bool:
            for p in c:
                line = cluster_nodes(p).get(xid)
                if (line is None or line.addr != f"{ALT_IP}:{x.port}" or line.link != "connected"
                        or {"fail?", "fail"} & set(line.flags)
                        or int(cluster_info(p)["cluster_reachable_nodes"]) != 2):
                    return False
            return True

        try:
            wait_for(joined, timeout=15, what="the bound node reachable from the others")
        except AssertionError:
            views = {p.port: cluster_nodes(p).get(xid) for p in c}
            raise AssertionError(f"others' view of {ALT_IP}:{x.port}: {views}") from None
    finally:
        x.kill()


def test_restart_on_another_address_with_the_same_nodes_conf(cluster, tmp_path: Path) -> None:
    """Same ID (nodes.conf kept), restarted bound to 127.0.0.2 only: the others must follow
    the new address, and the node must not keep announcing the stale address of its
    nodes.conf `myself` line in HELLO (clients connect to what HELLO lists)."""
    c = cluster(3, node_timeout=NODE_TIMEOUT)
    x = c[2]
    xid = kill_until_failed(c, 2)
    moved = BoundProcess(x.workdir, port=x.port, args=["--bind", ALT_IP,
                                                       "--cluster-node-timeout", "1000"])
    try:
        moved.start()
        r = moved.client()

        def followed() -> bool:
            for p in c[:2]:
                line = cluster_nodes(p)[xid]
                if line.addr != f"{ALT_IP}:{moved.port}" or line.flags != ["noflags"]:
                    return False
            return True

        try:
            wait_for(followed, timeout=15, what="the others following the new address")
        except AssertionError:
            raise AssertionError({p.port: cluster_nodes(p)[xid] for p in c[:2]}) from None
        me = [e for e in r.execute_command("HELLO")[2:] if e[0].decode() == xid][0]
        assert me[1] == ALT_IP.encode(), f"HELLO on the moved node lists itself at {me}"
    finally:
        moved.kill()
