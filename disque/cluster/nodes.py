"""ClusterNode: what a node knows about one member of the cluster (itself included)."""

from __future__ import annotations

# Flag names in the order CLUSTER NODES prints them.
FLAG_ORDER = ("myself", "fail?", "fail", "handshake", "noaddr", "leaving")


class ClusterNode:
    __slots__ = ("id", "ip", "port", "flags", "ping_sent", "pong_received", "link")

    def __init__(self, node_id: bytes, ip: bytes, port: int) -> None:
        self.id = node_id
        self.ip = ip
        self.port = port
        self.flags: list[str] = []
        self.ping_sent = 0
        self.pong_received = 0
        self.link = "connected"

    @property
    def priority(self) -> int:
        """HELLO priority: 1 normal, 5 no link, 10 PFAIL, 100 FAIL or leaving."""
        prio = 1
        if self.link != "connected":
            prio = 5
        if "fail?" in self.flags:
            prio = 10
        if "fail" in self.flags or "leaving" in self.flags:
            prio = 100
        return prio
