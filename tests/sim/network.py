"""A deterministic simulated network for sans-I/O cluster code.

N `Membership` instances run in one process against one fake clock (`SimNetwork.now`, unix
ms) and seeded random generators; the network applies their effects:

- `Connect` -> after a delay, a pair of `SimLink` ends (outbound at the caller, inbound at
  the target) and `link_accepted` + `link_connected`, or `connect_failed` (refused at once
  by a crashed node, timed out through a partition or to a paused node);
- `Send` -> the message is encoded and decoded through the real codec (a `FrameDecoder` per
  link end) and delivered after a random delay, in FIFO order per link;
- `CloseLink` -> the peer end gets `link_closed` after the data already sent;
- `SaveConfig` -> the node's nodes.conf text is kept (a restart loads it);
- `LinkChanged` -> `_link_changed` (SimCluster hands it to the node's job layer).

Links behave like TCP: nothing is lost silently. A partition or a paused reader stalls a
stream (delivered in order after `heal()` / `resume()`); `drop` is the probability that a
send breaks its connection instead (both ends see `link_closed`, unread data is lost).

Faults: `partition(groups)` / `heal()`, `pause(i)` / `resume(i)` (a stopped process: no
ticks, reads nothing), `crash(i)` / `restart(i)` (connections reset; restart builds a new
Membership from the saved nodes.conf), and `drop`.

`check` (on by default) asserts invariants after every event; `fail_decisions` records every
FAIL a node decided by itself with the nodes whose failure reports reached it within the
validity window (each report checked, as it arrives, to come from a node that really had
flagged the target), so tests can check the majority rule against history.
"""

from __future__ import annotations

import heapq
import itertools
import random
from collections.abc import Callable
from typing import Any

from disque.cluster.membership import (
    TICK_MS,
    CloseLink,
    Connect,
    LinkChanged,
    Log,
    Membership,
    SaveConfig,
    Send,
    new_node_id,
    parse_nodes_conf,
)
from disque.cluster.messages import Fail, FrameDecoder, Message, _GossipMessage
from disque.cluster.nodes import FAIL, FAILING, MYSELF

START_MS = 1_700_000_000_000
CONNECT_TIMEOUT = 1000  # ms before a connect through a partition / to a paused node fails


class SimLink:
    """One end of a simulated TCP connection."""

    __slots__ = ("sim_id", "owner", "peer", "open", "outbound", "decoder", "last_delivery",
                 "held")

    def __init__(self, sim_id: int, owner: SimNode, outbound: bool) -> None:
        self.sim_id = sim_id
        self.owner = owner
        self.peer: SimLink | None = None
        self.open = True
        self.outbound = outbound
        self.decoder = FrameDecoder(stats=owner.membership.stats)
        self.last_delivery = 0  # keeps deliveries on this end in FIFO order
        self.held: list[tuple[Any, ...]] = []  # stalled by a partition or a paused reader

    def __repr__(self) -> str:
        kind = "out" if self.outbound else "in"
        return f"SimLink({self.sim_id}, node{self.owner.idx}, {kind}, open={self.open})"


class SimNode:
    __slots__ = ("idx", "ip", "port", "bus_port", "membership", "state", "incarnation",
                 "conf", "links", "logs")

    def __init__(self, idx: int, ip: bytes, port: int, membership: Membership) -> None:
        self.idx = idx
        self.ip = ip
        self.port = port
        self.bus_port = port + membership.bus_port_offset
        self.membership = membership
        self.state = "up"  # up | paused | down
        self.incarnation = 0
        self.conf = membership.nodes_conf()
        self.links: dict[int, SimLink] = {}  # by sim_id: iteration order is deterministic
        self.logs: list[tuple[int, Log]] = []

    @property
    def id(self) -> bytes:
        return self.membership.myself


class SimNetwork:
    def __init__(self, n: int, seed: int = 0, *, node_timeout: int = 1000,
                 delay: tuple[int, int] = (1, 5), drop: float = 0.0, check: bool = True,
                 port: int = 7711) -> None:
        self.now = START_MS
        self.seed = seed
        self.rng = random.Random(seed)
        self.node_timeout = node_timeout
        self.delay = delay
        self.drop = drop
        self.check = check
        self._events: list[tuple[int, int, Callable[..., None], tuple[Any, ...]]] = []
        self._seq = itertools.count()
        self._link_ids = itertools.count(1)
        self.blocked: set[tuple[int, int]] = set()
        self.all_links: dict[int, SimLink] = {}
        self.nodes: list[SimNode] = []
        # (observer id, target id) -> last time the observer had the target PFAIL/FAIL
        self.flagged_at: dict[tuple[bytes, bytes], int] = {}
        # (receiver id, reporter id, target id) -> when the receiver got the reporter's last
        # gossip flagging the target (cleared by gossip saying it is fine), as Membership
        # counts failure reports: at arrival, however long the report was in flight
        self.reported_at: dict[tuple[bytes, bytes, bytes], int] = {}
        self.fail_decisions: list[dict[str, Any]] = []
        self._delivering: Message | None = None
        for i in range(n):
            ip = f"10.0.0.{i + 1}".encode()
            m = self._new_membership(i, new_node_id(random.Random(seed * 7919 + i)), port, 0)
            node = SimNode(i, ip, port, m)
            self.nodes.append(node)
            self._schedule_tick(node, self.now + (i * 37) % TICK_MS + 1)

    # ------------------------------------------------------------------ setup helpers
    def _new_membership(self, idx: int, node_id: bytes, port: int,
                        incarnation: int, persistent: bool = False) -> Membership:
        rng = random.Random(self.seed * 1_000_003 + idx * 1009 + incarnation)
        return Membership(node_id, port, clock=self._clock, rng=rng,
                          node_timeout=self.node_timeout, incarnation=incarnation + 1,
                          persistent=persistent)

    def _clock(self) -> int:
        return self.now

    def by_id(self, node_id: bytes) -> SimNode | None:
        for n in self.nodes:
            if n.id == node_id:
                return n
        return None

    def _by_addr(self, ip: bytes, bus_port: int) -> SimNode | None:
        for n in self.nodes:
            if n.ip == ip and n.bus_port == bus_port:
                return n
        return None

    # ------------------------------------------------------------------ event loop
    def schedule(self, at: int, fn: Callable[..., None], *args: Any) -> None:
        heapq.heappush(self._events, (at, next(self._seq), fn, args))

    def _delay(self) -> int:
        lo, hi = self.delay
        return self.rng.randint(lo, hi)

    def run_for(self, ms: int) -> None:
        self.run_until(self.now + ms)

    def run_until(self, t: int) -> None:
        events = self._events
        while events and events[0][0] <= t:
            at, _, fn, args = heapq.heappop(events)
            self.now = at
            fn(*args)
        self.now = t

    def run_until_true(self, pred: Callable[[], bool], timeout: int, step: int = 100) -> bool:
        """Advance until pred() holds (checked every `step` ms) or `timeout` ms pass."""
        deadline = self.now + timeout
        while self.now < deadline:
            if pred():
                return True
            self.run_for(min(step, deadline - self.now))
        return pred()

    # ------------------------------------------------------------------ node events
    def _schedule_tick(self, node: SimNode, at: int) -> None:
        self.schedule(at, self._tick, node, node.incarnation)

    def _tick(self, node: SimNode, incarnation: int) -> None:
        if node.incarnation != incarnation or node.state == "down":
            return
        if node.state == "up":
            self._call(node, node.membership.tick, self.now)
        self._schedule_tick(node, self.now + TICK_MS)

    def _call(self, node: SimNode, fn: Callable[..., None], *args: Any) -> None:
        """Run one event on a node, apply its effects, check invariants."""
        m = node.membership
        before = self._fail_set(m) if self.check else None
        fn(*args)
        self._apply(node, m.drain())
        if self.check:
            self._after_event(node, before)

    def meet(self, i: int, j: int) -> None:
        """CLUSTER MEET on node i with node j's address."""
        a, b = self.nodes[i], self.nodes[j]
        self._call(a, a.membership.meet, b.ip, b.port)

    def command(self, i: int, fn: Callable[[Membership], None]) -> None:
        """Run a command on node i's membership (forget, set_leaving, reset...)."""
        node = self.nodes[i]
        self._call(node, fn, node.membership)

    # ------------------------------------------------------------------ effects
    def _apply(self, node: SimNode, effects: list[Any]) -> None:
        for e in effects:
            if isinstance(e, Send):
                self._send(node, e.link, e.msg)
            elif isinstance(e, Connect):
                self._connect(node, e)
            elif isinstance(e, CloseLink):
                self._close(e.link)
            elif isinstance(e, SaveConfig):
                node.conf = node.membership.nodes_conf()
            elif isinstance(e, Log):
                node.logs.append((self.now, e))
            elif isinstance(e, LinkChanged):
                self._link_changed(node, e)
            else:  # pragma: no cover
                raise AssertionError(f"unknown effect {e!r}")

    def _link_changed(self, node: SimNode, e: LinkChanged) -> None:
        """An outbound link of `node` came up or went away (subclasses tell the job
        layer, as the server's Bus does)."""

    def _reachable(self, a: SimNode, b: SimNode) -> bool:
        return (a.idx, b.idx) not in self.blocked

    def _connect(self, node: SimNode, e: Connect) -> None:
        target = self._by_addr(e.ip, e.bus_port)
        inc = node.incarnation
        if target is None or target.state == "down":
            self.schedule(self.now + self._delay(), self._connect_failed, node, inc, e.token)
        elif target.state == "paused" or not self._reachable(node, target):
            self.schedule(self.now + CONNECT_TIMEOUT, self._connect_failed, node, inc, e.token)
        else:
            self.schedule(self.now + self._delay(), self._connected, node, inc, target,
                          target.incarnation, e.token)

    def _connect_failed(self, node: SimNode, inc: int, token: int) -> None:
        if node.incarnation == inc and node.state != "down":
            self._call(node, node.membership.connect_failed, token)

    def _connected(self, node: SimNode, inc: int, target: SimNode, tinc: int,
                   token: int) -> None:
        if node.incarnation != inc or node.state == "down":
            return
        if (target.incarnation != tinc or target.state != "up"
                or not self._reachable(node, target) or not self._reachable(target, node)):
            self._call(node, node.membership.connect_failed, token)
            return
        out = SimLink(next(self._link_ids), node, outbound=True)
        inn = SimLink(next(self._link_ids), target, outbound=False)
        out.peer, inn.peer = inn, out
        for end in (out, inn):
            end.owner.links[end.sim_id] = end
            self.all_links[end.sim_id] = end
        self._call(target, target.membership.link_accepted, inn, target.ip)
        self._call(node, node.membership.link_connected, out, token)

    def _send(self, node: SimNode, link: SimLink, msg: Message) -> None:
        if not link.open or link.owner is not node:
            return
        peer = link.peer
        assert peer is not None
        frame = msg.encode()
        node.membership.stats.sent(msg.TYPE, len(frame), msg.n)
        if self.drop and self.rng.random() < self.drop:
            self._reset(link)  # TCP loses nothing silently: the connection breaks instead
            return
        self._transmit(peer, ("frame", frame, node.ip))

    def _transmit(self, dest: SimLink, item: tuple[Any, ...]) -> None:
        """Queue a frame (or the close) for the `dest` end, FIFO per link."""
        at = max(self.now + self._delay(), dest.last_delivery + 1)
        dest.last_delivery = at
        self.schedule(at, self._arrive, dest, item)

    def _deliverable(self, dest: SimLink) -> bool:
        assert dest.peer is not None
        return dest.owner.state == "up" and self._reachable(dest.peer.owner, dest.owner)

    def _arrive(self, dest: SimLink, item: tuple[Any, ...]) -> None:
        if not dest.open or dest.owner.state == "down":
            return
        if dest.held or not self._deliverable(dest):
            dest.held.append(item)  # a partition or a stopped reader stalls the stream
            return
        self._consume(dest, item)

    def _consume(self, dest: SimLink, item: tuple[Any, ...]) -> None:
        node = dest.owner
        if item[0] == "close":
            dest.open = False
            node.links.pop(dest.sim_id, None)
            self.all_links.pop(dest.sim_id, None)
            self._call(node, node.membership.link_closed, dest)
            return
        _, frame, peer_ip = item
        msgs = dest.decoder.feed(frame)
        self._prefetch(node, msgs)
        for msg in msgs:
            if self.check and isinstance(msg, _GossipMessage):
                self._note_reports(node.membership.myself, msg)
            self._delivering = msg
            try:
                self._deliver(node, dest, msg, peer_ip)
            finally:
                self._delivering = None
            if not dest.open:
                break

    def _prefetch(self, node: SimNode, msgs: list[Message]) -> None:
        """The messages of a frame, before they are delivered one at a time (subclasses
        hand them to the job layer, as the server's Bus does)."""

    def _deliver(self, node: SimNode, dest: SimLink, msg: Message, peer_ip: bytes) -> None:
        """Hand one decoded message to the node (subclasses route the job messages)."""
        self._call(node, node.membership.link_message, dest, msg, peer_ip)

    def _release(self) -> None:
        """After heal/resume: stalled streams flow again, in order."""
        for link in list(self.all_links.values()):
            if link.held and link.open and self._deliverable(link):
                held, link.held = link.held, []
                for item in held:
                    self._transmit(link, item)

    def _close(self, link: SimLink) -> None:
        """Our end closes (CloseLink): the peer sees the close after its pending data."""
        if not link.open:
            return
        link.open = False
        link.held.clear()
        link.owner.links.pop(link.sim_id, None)
        self.all_links.pop(link.sim_id, None)
        peer = link.peer
        if peer is not None and peer.open:
            self._transmit(peer, ("close",))

    def _reset(self, link: SimLink) -> None:
        """The connection breaks under both ends (RST): unread data is lost and each side
        sees its link closed."""
        for end in (link, link.peer):
            if end is not None and end.open:
                end.held.clear()
                self.schedule(self.now + self._delay(), self._arrive_reset, end)

    def _arrive_reset(self, end: SimLink) -> None:
        if not end.open or end.owner.state == "down":
            return
        if self._deliverable(end):
            self._consume(end, ("close",))
        else:
            end.held = [("close",)]

    # ------------------------------------------------------------------ faults
    def partition(self, *groups: list[int]) -> None:
        """Block traffic between nodes of different groups (nodes in no group: isolated).
        Established connections stall (nothing is lost); new ones cannot be made."""
        side = {i: g for g, members in enumerate(groups) for i in members}
        self.blocked = {(a.idx, b.idx) for a in self.nodes for b in self.nodes
                        if a is not b and side.get(a.idx, -1 - a.idx) != side.get(b.idx,
                                                                                 -1 - b.idx)}
        self._release()

    def heal(self) -> None:
        self.blocked = set()
        self._release()

    def pause(self, i: int) -> None:
        """Stop node i like SIGSTOP: it neither ticks nor reads; its streams stall."""
        if self.nodes[i].state == "up":
            self.nodes[i].state = "paused"

    def resume(self, i: int) -> None:
        if self.nodes[i].state == "paused":
            self.nodes[i].state = "up"
            self._release()

    def crash(self, i: int) -> None:
        """kill -9: every link of the node is reset; its table is lost (nodes.conf kept)."""
        node = self.nodes[i]
        if node.state == "down":
            return
        node.state = "down"
        for link in list(node.links.values()):
            self._close(link)  # the kernel resets every connection of the dead process
        node.links.clear()

    def restart(self, i: int, aof: bool = False) -> None:
        """Start node i again from its saved nodes.conf (same ID and known nodes); `aof`:
        its headers say it reloads copies (PERSIST_FLAG)."""
        node = self.nodes[i]
        if node.state != "down":
            return
        myself, entries = parse_nodes_conf(node.conf)
        node.incarnation += 1
        m = self._new_membership(i, myself, node.port, node.incarnation, aof)
        m.load(entries)
        node.membership = m
        node.state = "up"
        self._schedule_tick(node, self.now + 1)

    # ------------------------------------------------------------------ invariants
    def _note_reports(self, receiver: bytes, msg: _GossipMessage) -> None:
        reporter = msg.header.sender
        for e in msg.gossip:
            key = (receiver, reporter, e.node_id)
            if e.flags & FAILING:
                # a report is only ever the truth about its sender's view at some moment
                assert (reporter, e.node_id) in self.flagged_at, (
                    f"{reporter[:8]!r} reported {e.node_id[:8]!r} failing and never flagged it")
                self.reported_at[key] = self.now
            else:
                self.reported_at.pop(key, None)

    @staticmethod
    def _fail_set(m: Membership) -> set[bytes]:
        return {n.id for n in m.table.values() if n.bits & FAIL}

    def _after_event(self, node: SimNode, before: set[bytes] | None) -> None:
        m = node.membership
        ids = [n.id for n in m.table.values()]
        assert len(ids) == len(set(ids)), f"node{node.idx} lists a node twice: {ids}"
        mine = [n for n in m.table.values() if n.bits & MYSELF]
        assert len(mine) == 1 and mine[0] is m.me and m.table.get(m.myself) is m.me, \
            f"node{node.idx} myself entries: {mine}"
        for n in m.table.values():
            if n.bits & FAILING:
                self.flagged_at[(m.myself, n.id)] = self.now
        assert before is not None
        new_fail = self._fail_set(m) - before
        if not new_fail:
            return
        msg = self._delivering
        for target in new_fail:
            if isinstance(msg, Fail) and msg.node_id == target:
                continue  # told by a FAIL message
            # The majority rule as the protocol can apply it: distinct other nodes whose
            # report flagging the target reached this node within the validity window, each
            # of which really had flagged it (checked as reports arrive).
            validity = 2 * m.node_timeout
            others = sorted(r for (o, r, t), at in self.reported_at.items()
                            if o == m.myself and t == target and r != m.myself
                            and self.now - at <= validity)
            quorum = m.size() // 2 + 1
            self.fail_decisions.append({"at": self.now, "observer": m.myself, "target": target,
                                        "flagged_by": others, "quorum": quorum})
            assert len(others) + 1 >= quorum, (
                f"node{node.idx} marked {target[:8]!r} FAIL with only {len(others)} other "
                f"nodes flagging it (quorum {quorum})")

    # ------------------------------------------------------------------ queries
    def up(self) -> list[SimNode]:
        return [n for n in self.nodes if n.state == "up"]

    def flags_of(self, observer: int, target: int) -> list[str]:
        n = self.nodes[observer].membership.get(self.nodes[target].id)
        return n.flags if n is not None else []

    def full_mesh(self, members: list[int] | None = None) -> bool:
        """Every member lists every other member as reachable (none failing). Without
        `members`: all nodes, and no node knows anything else (no handshake entries)."""
        idxs = members if members is not None else list(range(len(self.nodes)))
        for i in idxs:
            m = self.nodes[i].membership
            want = {self.nodes[j].id for j in idxs if j != i}
            if not want <= set(m.reachable()):
                return False
            if members is None and (m.known() != len(idxs) or len(m.reachable()) != len(want)):
                return False
        return True
