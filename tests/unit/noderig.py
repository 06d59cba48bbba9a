"""A sans-I/O node with its Membership on a fake clock, its outbound bus links to the peers
up: the rig of the tests of the cluster's background copiers (re-replication, repair)."""

from __future__ import annotations

import random

from disque.cluster.membership import Connect, Membership
from disque.cluster.nodes import ClusterNode
from disque.node import Node

T0 = 1_700_000_000_000
ME = b"0123abcd" + b"e" * 32
A, B = (bytes([c]) * 40 for c in b"ab")  # two peers, and their addresses
IPS = {A: b"10.0.0.2", B: b"10.0.0.3"}


class NodeRig:
    def __init__(self, peers: dict[bytes, bytes]) -> None:
        self.now = T0
        rng = random.Random(1)
        self.m = Membership(ME, 7711, clock=self.clock, rng=random.Random(2))
        self.m.load([ClusterNode(p, ip, 7711) for p, ip in peers.items()])
        self.node = Node(ME, self.clock, rng=rng, randbytes=rng.randbytes, membership=self.m)
        self.link = object()  # an inbound link the peers' PINGs arrive on
        self.m.link_accepted(self.link, b"10.0.0.1")
        self.out_links: dict[bytes, object] = {}
        self.connect()

    def clock(self) -> int:
        return self.now

    def to_disk(self, path: str) -> None:
        """Overflow on (issue 22), its file at `path`, and every job held here moved to disk."""
        node = self.node
        node.maxmemory = 2 * node.mem_used  # (the threshold is half of it: under the jobs)
        node.overflow.keep = 0
        node.overflow.enable(path, 25, 0)
        node.overflow.spill(self.now)

    def connect(self) -> None:
        """Our outbound links to the peers without one come up (copies go only over a
        link): Membership's tick asks for them, the I/O layer reports them connected."""
        self.m.tick(self.now)
        for e in self.m.drain():
            if type(e) is Connect:
                link = self.out_links[e.node_id] = object()
                self.m.link_connected(link, e.token)
        self.m.drain()

    def cron(self) -> list[tuple[bytes, object]]:
        """The node's timers for 100 ms (one cluster cron); the messages it sent."""
        target = self.now + 100
        while (nd := self.node.next_due()) is not None and nd <= target:
            self.now = max(self.now, nd)
            self.node.tick(self.now)
        self.now = target
        self.node.tick(target)
        out, self.node.out = self.node.out, []
        return out
