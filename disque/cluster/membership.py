"""Membership: the node table and its state machine (handshake, gossip, failure detection).

Sans-I/O, in the style of h11: events come in as method calls (`meet`, `link_connected`,
`link_message`, `tick`, ...), effects go out as small records appended to `outbox`, which the
I/O layer drains after every event and applies in order (Connect, Send, CloseLink,
SaveConfig, Log, LinkChanged: see disque.cluster.effects).

Links, handshake and failure detection (as Redis Cluster) are described in
docs/architecture.md ("Cluster membership").

Replication targets. `reachable()` (not handshake, leaving, PFAIL, FAIL or noaddr) is what
CLUSTER INFO counts and what ADDJOB's NOREPL check compares REPLICATE with, as the original.
`linked()` is the subset whose outbound link is up: where copies are sent, as the original's
clusterReplicateJob ("No link, no party"). Both are cached tuples that stay the same object
until the table (flags) or the links change, so the job layer can tell consecutive jobs with
the same targets by identity.

Invariants:
- exactly one entry has MYSELF, it is `self.me`, keyed by my ID; no other entry has my ID;
- HANDSHAKE entries are never gossiped, persisted, counted in `size()` or reachable;
- `node.out_link` is set iff the link is in `_out_links`, mapped to that node;
- every change of a non-handshake node's `out_link` (set, cleared) emits `LinkChanged`;
- LEAVING of another node only changes from that node's own message header;
- a node is FAIL here only after a majority decision here or a FAIL message from a known node.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Iterable
from typing import Any, Final

from disque.cluster.effects import (
    SAVE_CONFIG,
    CloseLink,
    Connect,
    Effect,
    Link,
    LinkChanged,
    Log,
    SaveConfig,
    Send,
    gossip_entries,
    new_node_id,
    normalize_ip,
)
from disque.cluster.messages import (
    INCARNATION_MASK,
    INCARNATION_SHIFT,
    PERSIST_FLAG,
    TLS_PORT_FLAG,
    TLS_PORT_SHIFT,
    BusStats,
    Fail,
    GossipEntry,
    Header,
    Meet,
    Message,
    Ping,
    Pong,
)
from disque.cluster.nodes import (
    FAIL,
    FAILING,
    HANDSHAKE,
    LEAVING,
    MEET,
    MYSELF,
    NOADDR,
    PFAIL,
    ClusterNode,
    NodesConfError,
    parse_nodes_conf,
    render_cluster_nodes,
    render_nodes_conf,
)
from disque.protocol.errors import err

__all__ = [
    "Membership", "Connect", "Send", "CloseLink", "SaveConfig", "Log", "LinkChanged",
    "SAVE_CONFIG",
    "new_node_id", "parse_nodes_conf", "render_nodes_conf", "render_cluster_nodes",
    "NodesConfError",
]

DEFAULT_NODE_TIMEOUT: Final = 15000  # ms (cluster-node-timeout)
BUS_PORT_OFFSET: Final = 10000
TICK_MS: Final = 100  # how often the I/O layer calls tick()
RANDOM_PING_EVERY: Final = 10  # ticks: about once a second
RANDOM_PING_SAMPLE: Final = 5
FAIL_REPORT_VALIDITY_MULT: Final = 2
MIN_HANDSHAKE_TIMEOUT: Final = 1000  # ms
BLACKLIST_TTL: Final = 60_000  # ms a forgotten node cannot be re-added by gossip (the default)
RECONNECT_MIN: Final = 100  # ms, first retry after a failed connect; doubles up to RECONNECT_MAX
RECONNECT_MAX: Final = 1000


def _sid(node_id: bytes) -> str:
    return node_id.decode("ascii", "replace")


class Membership:
    """The node table of one node. See the module docstring for the protocol."""

    def __init__(self, myself: bytes, port: int, *, clock: Callable[[], int],
                 rng: random.Random, node_timeout: int = DEFAULT_NODE_TIMEOUT,
                 bus_port_offset: int = BUS_PORT_OFFSET, bus_port: int | None = None,
                 announce_ip: bytes | None = None, announce_port: int | None = None,
                 my_ip: bytes = b"", incarnation: int = 0, tls_port: int = 0,
                 persistent: bool = False, blacklist_ttl: int = BLACKLIST_TTL) -> None:
        self.clock = clock
        self.blacklist_ttl = blacklist_ttl  # ms; may be changed at any time (CONFIG SET)
        # announced in every header (see messages.INCARNATION_SHIFT); 0: none
        self.incarnation = incarnation
        self.tls_port = tls_port  # announced in every header too (TLS_PORT_FLAG); 0: none
        self.rng = rng
        self.node_timeout = node_timeout  # ms; may be changed at any time (CONFIG SET)
        self.bus_port_offset = bus_port_offset
        self.port = port
        self.bus_port = bus_port if bus_port is not None else port + bus_port_offset
        self.announce_ip = announce_ip or b""
        self.announce_port = announce_port or 0
        me = ClusterNode(myself, self.announce_ip or my_ip, self.announce_port or port,
                         self._announced_bus_port(), MYSELF, ctime=clock())
        me.tls_port = tls_port
        me.persistent = persistent  # announced in every header too (PERSIST_FLAG)
        self.me = me
        self.table: dict[bytes, ClusterNode] = {myself: me}
        self.blacklist: dict[bytes, int] = {}  # forgotten ID -> until (ms)
        self.outbox: list[Effect] = []
        self.stats = BusStats()  # kept by the I/O layer (it sees the frames)
        self._out_links: dict[Any, ClusterNode] = {}
        self._inbound: dict[Any, bytes] = {}  # inbound link -> local IP it was accepted on
        self._tokens: dict[int, ClusterNode] = {}
        self._next_token = itertools.count(1).__next__
        self._iteration = 0
        self._save = False
        self._views_dirty = True
        self._reachable: tuple[bytes, ...] = ()
        self._links_dirty = True  # an outbound link was set or closed: linked() is stale
        self._linked: tuple[bytes, ...] = ()
        self._size = 1
        self.header = self._make_header()

    # ------------------------------------------------------------------ identity
    @property
    def myself(self) -> bytes:
        return self.me.id

    @property
    def my_ip(self) -> bytes:
        return self.me.ip

    @property
    def leaving(self) -> bool:
        return bool(self.me.bits & LEAVING)

    def _announced_bus_port(self) -> int:
        if self.announce_port:
            return self.announce_port + self.bus_port_offset
        return self.bus_port

    def _make_header(self) -> Header:
        me = self.me
        flags = (me.bits & LEAVING) | (self.incarnation << INCARNATION_SHIFT)
        if self.tls_port:
            flags |= TLS_PORT_FLAG | (self.tls_port << TLS_PORT_SHIFT)
        if me.persistent:
            flags |= PERSIST_FLAG
        return Header(me.id, self.announce_ip, me.port, me.bus_port, flags)

    # ------------------------------------------------------------------ effects
    def drain(self) -> list[Effect]:
        """Take the effects produced so far (the I/O layer applies them in order)."""
        out = self.outbox
        self.outbox = []
        return out

    def _log(self, event: str, **fields: Any) -> None:
        self.outbox.append(Log(event, fields))

    def _flush(self) -> None:
        if self._save:
            self._save = False
            self.outbox.append(SAVE_CONFIG)

    def _changed(self, save: bool = True) -> None:
        self._views_dirty = True
        if save:
            self._save = True

    # ------------------------------------------------------------------ views
    def nodes(self) -> list[ClusterNode]:
        """Every known node, myself first, handshake entries included (HELLO, CLUSTER NODES).
        The records are live: read them, do not keep or change them."""
        return list(self.table.values())

    def get(self, node_id: bytes) -> ClusterNode | None:
        return self.table.get(node_id)

    def _refresh_views(self) -> None:
        # NOADDR too (unlike the original): a node whose address answered with another ID
        # cannot be reached, and jobs replicated to it would never be acknowledged.
        excluded = MYSELF | HANDSHAKE | LEAVING | PFAIL | FAIL | NOADDR
        reachable = tuple([n.id for n in self.table.values() if not n.bits & excluded])
        if reachable != self._reachable:
            self._reachable = reachable
        self._size = sum(1 for n in self.table.values() if not n.bits & HANDSHAKE)
        self._views_dirty = False
        self._links_dirty = True

    def reachable(self) -> tuple[bytes, ...]:
        """IDs of the other nodes not in handshake, leaving, PFAIL, FAIL or noaddr (CLUSTER
        INFO's count, ADDJOB's NOREPL check). Cached until the table changes."""
        if self._views_dirty:
            self._refresh_views()
        return self._reachable

    def linked(self) -> tuple[bytes, ...]:
        """The reachable nodes whose outbound bus link is up: where the job layer sends
        copies. Cached until the table or a link changes, and the same tuple object for as
        long as its content does not change (start_replication batches by identity)."""
        if self._views_dirty:
            self._refresh_views()
        if self._links_dirty:
            table = self.table
            linked = tuple([n for n in self._reachable if table[n].out_link is not None])
            if linked != self._linked:
                self._linked = linked
            self._links_dirty = False
        return self._linked

    def size(self) -> int:
        """Known non-handshake nodes, myself included."""
        if self._views_dirty:
            self._refresh_views()
        return self._size

    def known(self) -> int:
        """All entries, myself and handshake ones included."""
        return len(self.table)

    def cluster_info(self) -> list[tuple[str, object]]:
        """CLUSTER INFO fields, in the original's order."""
        return [("cluster_state", "ok"), ("cluster_known_nodes", len(self.table)),
                ("cluster_reachable_nodes", len(self.reachable())),
                ("cluster_size", self.size()),
                ("cluster_stats_messages_sent", self.stats.total_sent()),
                ("cluster_stats_messages_received", self.stats.total_received())]

    def info_fields(self) -> list[tuple[str, object]]:
        """Our INFO Cluster section: node counts, then bus counters per message type."""
        nodes = self.table.values()
        stats = self.stats
        return [
            ("cluster_nodes", self.size()),
            ("cluster_reachable_nodes", len(self.reachable())),
            ("cluster_failing_nodes", sum(1 for n in nodes if n.bits & FAILING)),
            ("cluster_leaving_nodes", sum(1 for n in nodes if n.bits & LEAVING)),
            ("cluster_handshake_nodes", sum(1 for n in nodes if n.bits & HANDSHAKE)),
            *stats.info_fields(),
        ]

    def cluster_nodes(self) -> str:
        """CLUSTER NODES text."""
        return render_cluster_nodes(self.table.values())

    def nodes_conf(self) -> str:
        """nodes.conf text (the I/O layer writes it atomically)."""
        return render_nodes_conf(self.table.values())

    def node_for_link(self, link: Link) -> ClusterNode | None:
        """The node an outbound link belongs to, if any."""
        return self._out_links.get(link)

    # ------------------------------------------------------------------ loading
    def load(self, entries: Iterable[ClusterNode]) -> None:
        """Populate the table from `parse_nodes_conf` entries (myself included). Non-zero
        ping/pong times are loaded as now; bus ports are port + offset."""
        now = self.clock()
        me = self.me
        for e in entries:
            if e.bits & MYSELF or e.id == me.id:
                if e.id != me.id:
                    raise ValueError("nodes.conf myself line does not match my node ID")
                me.bits = MYSELF | (e.bits & LEAVING)
                if not self.announce_ip and e.ip:
                    me.ip = e.ip
                continue
            if e.bits & HANDSHAKE or e.id in self.table:
                continue
            node = ClusterNode(e.id, e.ip, e.port, e.port + self.bus_port_offset,
                               e.bits & (PFAIL | FAIL | NOADDR | LEAVING), ctime=now)
            node.ping_sent = now if e.ping_sent else 0
            node.pong_received = now if e.pong_received else 0
            node.incarnation = e.incarnation  # (a different one heard: it restarted)
            self.table[e.id] = node
        self.header = self._make_header()
        self._changed(save=False)

    # ------------------------------------------------------------------ commands
    def meet(self, ip: bytes | str, port: int) -> None:
        """CLUSTER MEET ip port (port: the client port; the bus is port + offset). The
        command layer resolves host names first. A pending handshake to the address is OK."""
        norm = normalize_ip(ip)
        if norm is None or port <= 0 or port + self.bus_port_offset > 65535:
            text = ip.decode("utf-8", "replace") if isinstance(ip, bytes) else ip
            raise err(f"Invalid node address specified: {text}:{port}")
        self._start_handshake(norm, port, port + self.bus_port_offset, self.clock())
        self._flush()

    def forget(self, node_id: bytes) -> None:
        """CLUSTER FORGET: drop the node and keep gossip from re-adding it for blacklist_ttl
        (60 s by default)."""
        if len(node_id) != 40:
            raise err("Invalid node identifier")
        node = self.table.get(node_id)
        if node is self.me:
            raise err("I tried hard but I can't forget myself...")
        if node is None:
            raise err(f"Unknown node {_sid(node_id)}")
        now = self.clock()
        self.blacklist[node_id] = now + self.blacklist_ttl
        self._del_node(node)
        self._log("node.forgotten", node=_sid(node_id))
        self._flush()

    def reset(self, hard: bool, new_id: bytes | None = None) -> None:
        """CLUSTER RESET: forget every other node (HARD: take a new node ID too)."""
        for node in list(self.table.values()):
            if node is not self.me:
                self._del_node(node)
        for link in self._inbound:
            self.outbox.append(CloseLink(link))
        self._inbound.clear()
        self.blacklist.clear()
        if hard:
            me = self.me
            del self.table[me.id]
            me.id = new_id if new_id is not None else new_node_id(self.rng)
            self.table[me.id] = me
            self.header = self._make_header()
        self._changed()
        self._log("cluster.reset", hard=hard, myself=_sid(self.me.id))
        self._flush()

    def set_announce(self, ip: bytes, port: int) -> None:
        """CONFIG SET cluster-announce-ip/-port: advertise a new address at once (PONG to
        every connected node); empty/0 go back to the learned address and real port."""
        me = self.me
        self.announce_ip = ip
        self.announce_port = port
        if ip:
            me.ip = ip
        me.port = port or self.port
        me.bus_port = self._announced_bus_port()
        self.header = self._make_header()
        self._changed()
        for node in self.table.values():
            if node.out_link is not None and not node.bits & HANDSHAKE:
                self.outbox.append(Send(node.out_link, Pong(self.header, gossip_entries(self.table, node, self.rng))))
        self._flush()

    def set_persistent(self, flag: bool) -> None:
        """appendonly turned on or off: the headers say so from now on."""
        if self.me.persistent != flag:
            self.me.persistent = flag
            self.header = self._make_header()

    def set_leaving(self, flag: bool) -> None:
        """CLUSTER LEAVING yes|no: flag myself; every node copies it from my header. A PONG to
        every connected node spreads it at once."""
        me = self.me
        if bool(me.bits & LEAVING) == flag:
            return
        me.bits = me.bits | LEAVING if flag else me.bits & ~LEAVING
        self.header = self._make_header()
        self._changed()
        for node in self.table.values():
            if node.out_link is not None and not node.bits & HANDSHAKE:
                self.outbox.append(Send(node.out_link, Pong(self.header, gossip_entries(self.table, node, self.rng))))
        self._flush()

    # ------------------------------------------------------------------ link events
    def link_connected(self, link: Link, token: int) -> None:
        """The outbound link asked by Connect(token, ...) is up (and authenticated)."""
        node = self._tokens.pop(token, None)
        if node is None or node.connecting != token or self.table.get(node.id) is not node:
            self.outbox.append(CloseLink(link))  # the node went away meanwhile
            return
        now = self.clock()
        node.connecting = 0
        node.retries = 0
        node.out_link = link
        node.link_ctime = now
        self._out_links[link] = node
        self._link_changed(node, True)
        if node.bits & (MEET | HANDSHAKE):
            # Every link of a handshake gets a MEET: a PING would not make the peer add us.
            node.bits &= ~MEET
            self._send_ping(node, now, Meet)
        else:
            self._send_ping(node, now, Ping)
        self._flush()

    def connect_failed(self, token: int) -> None:
        """The outbound connection asked by Connect(token, ...) could not be made."""
        node = self._tokens.pop(token, None)
        if node is None or node.connecting != token:
            return
        node.connecting = 0
        node.retries += 1
        delay = min(RECONNECT_MIN << min(node.retries - 1, 16), RECONNECT_MAX)
        node.retry_at = self.clock() + delay

    def link_accepted(self, link: Link, local_ip: bytes) -> None:
        """An inbound link was accepted (and authenticated) on our address `local_ip`."""
        self._inbound[link] = local_ip

    def link_closed(self, link: Link) -> None:
        """A link went away (peer closed, I/O error, or after our CloseLink)."""
        node = self._out_links.pop(link, None)
        if node is not None:
            if node.out_link is link:
                node.out_link = None
                self._link_changed(node, False)
            return
        self._inbound.pop(link, None)

    def link_message(self, link: Link, msg: Message, peer_ip: bytes) -> None:
        """A decoded membership message arrived on `link` from remote address `peer_ip`."""
        now = self.clock()
        node = self._out_links.get(link)
        if node is not None:
            self._outbound_message(node, msg, now)
        else:
            self._inbound_message(link, msg, peer_ip, now)
        self._flush()

    def _outbound_message(self, node: ClusterNode, msg: Message, now: int) -> None:
        """A reply on our own link to `node`: only PONGs are expected here."""
        if type(msg) is not Pong:
            return
        h = msg.header
        sender_id = h.sender
        if node.bits & HANDSHAKE:
            known = self.table.get(sender_id)
            if known is not None:
                # Met myself, or a node already known (maybe at a new address).
                if known is not self.me:
                    self._update_address(known, h.ip or node.ip, h.port, h.bus_port)
                self._del_node(node)
                return
            del self.table[node.id]
            node.id = sender_id
            self.table[sender_id] = node
            node.bits &= ~(HANDSHAKE | MEET)
            if h.ip:
                node.ip = h.ip
            node.port = h.port
            node.bus_port = h.bus_port
            node.ctime = now
            self._changed()
            self._link_changed(node, True)  # a new node, with its link up already
            self._log("node.added", node=_sid(sender_id), ip=node.ip.decode(), port=node.port,
                      via="handshake")
        elif sender_id != node.id:
            # Another node answers at this address: the one we knew is elsewhere now.
            node.bits |= NOADDR
            node.ip = b""
            node.port = 0
            node.bus_port = 0
            self._close_out_link(node)
            self._changed()
            self._log("node.noaddr", node=_sid(node.id), answered_by=_sid(sender_id))
            return
        node.pong_received = now
        node.ping_sent = 0
        if node.bits & FAILING:
            was_fail = bool(node.bits & FAIL)
            node.bits &= ~FAILING
            self._changed(save=was_fail)
            self._log("node.fail_cleared", node=_sid(node.id), was="fail" if was_fail else "pfail")
        self._sender_flags(node, h.flags)
        self._process_gossip(node, msg.gossip, now)

    def _inbound_message(self, link: Link, msg: Message, peer_ip: bytes, now: int) -> None:
        """A request (or broadcast) from another node's outbound link."""
        h = msg.header
        sender_id = h.sender
        cls = type(msg)
        if sender_id == self.me.id:
            if cls is Ping or cls is Meet:  # we met our own address
                self.outbox.append(Send(link, Pong(self.header, [])))
            return
        sender = self.table.get(sender_id)
        if cls is Ping or cls is Meet:
            me = self.me
            if not self.announce_ip and (cls is Meet or not me.ip):
                local_ip = self._inbound.get(link)
                if local_ip and local_ip != me.ip:
                    me.ip = local_ip
                    self._changed()
                    self._log("myself.ip", ip=local_ip.decode())
            if sender is None and cls is Meet:
                if self._blacklisted(sender_id, now):
                    return
                ip = h.ip or peer_ip
                bits = h.flags & LEAVING if ip and h.bus_port else NOADDR
                # Our link back opens with a MEET too: if the sender's handshake with us
                # timed out before our PONG reached it (a loaded machine; a short
                # cluster-node-timeout), it forgot us, and a PING would not make it add us
                # again (a fresh 3-node cluster never formed so: the node met knew both
                # others, and neither knew it)
                sender = ClusterNode(sender_id, ip, h.port, h.bus_port, bits | MEET, ctime=now)
                self.table[sender_id] = sender
                self._changed()
                self._log("node.added", node=_sid(sender_id), ip=ip.decode(), port=h.port,
                          via="meet")
                if not bits & NOADDR:
                    self._connect(sender, now)
            elif sender is not None:
                self._update_address(sender, h.ip or peer_ip, h.port, h.bus_port)
                if (sender.out_link is None and not sender.connecting
                        and not sender.bits & NOADDR):
                    # It pings us, so it is up again (a restart): connect back now rather
                    # than at the next tick after the reconnect backoff (up to 1.1 s), so
                    # its PONG clears PFAIL/FAIL and the job layer sees it within a round
                    # trip of its first PING.
                    sender.retries = 0
                    sender.retry_at = 0
                    self._connect(sender, now)
            self.outbox.append(Send(link, Pong(self.header, gossip_entries(self.table, sender, self.rng))))
            if sender is not None:
                self._sender_flags(sender, h.flags)
                self._process_gossip(sender, msg.gossip, now)  # type: ignore[attr-defined]
        elif sender is None:
            return
        elif cls is Pong:  # unsolicited: the sender's flags changed
            self._sender_flags(sender, h.flags)
            self._process_gossip(sender, msg.gossip, now)  # type: ignore[attr-defined]
        elif cls is Fail:
            self._sender_flags(sender, h.flags)
            failing = self.table.get(msg.node_id)  # type: ignore[attr-defined]
            if failing is not None and not failing.bits & (FAIL | MYSELF | HANDSHAKE):
                failing.bits = (failing.bits & ~PFAIL) | FAIL
                failing.fail_time = now
                self._changed()
                self._log("node.fail", node=_sid(failing.id), via="message",
                          reporter=_sid(sender_id))

    # ------------------------------------------------------------------ the cron
    def tick(self, now: int | None = None) -> None:
        """Every TICK_MS: connect, ping, detect timeouts, expire handshakes and blacklist."""
        if now is None:
            now = self.clock()
        self._iteration += 1
        timeout = self.node_timeout
        half = timeout // 2
        if self.blacklist:
            for node_id in [k for k, until in self.blacklist.items() if until <= now]:
                del self.blacklist[node_id]
        handshake_timeout = max(timeout, MIN_HANDSHAKE_TIMEOUT)
        nodes = list(self.table.values())
        for node in nodes:
            bits = node.bits
            if bits & MYSELF:
                continue
            if bits & HANDSHAKE and now - node.ctime > handshake_timeout:
                self._log("node.handshake_timeout", node=_sid(node.id),
                          ip=node.ip.decode(), port=node.port)
                self._del_node(node)
                continue
            if bits & NOADDR:
                continue
            if node.out_link is None and not node.connecting and now >= node.retry_at:
                self._connect(node, now)

        if self._iteration % RANDOM_PING_EVERY == 0 and len(nodes) > 1:
            best = None
            choice = self.rng.choice
            for _ in range(RANDOM_PING_SAMPLE):
                n = choice(nodes)
                if (n.out_link is None or n.ping_sent or n.bits & (MYSELF | HANDSHAKE)
                        or self.table.get(n.id) is not n):
                    continue
                if best is None or n.pong_received < best.pong_received:
                    best = n
            if best is not None:
                self._send_ping(best, now, Ping)

        for node in nodes:
            if node.bits & (MYSELF | NOADDR | HANDSHAKE) or self.table.get(node.id) is not node:
                continue
            if (node.out_link is not None and now - node.link_ctime > timeout
                    and node.ping_sent and now - node.ping_sent > half):
                self._close_out_link(node)  # maybe a stuck connection: reconnect
            if (node.out_link is not None and not node.ping_sent
                    and now - node.pong_received > half):
                self._send_ping(node, now, Ping)
                continue
            if node.ping_sent and now - node.ping_sent > timeout and not node.bits & FAILING:
                node.bits |= PFAIL
                self._changed(save=False)
                self._log("node.pfail", node=_sid(node.id))
                self._mark_failing_if_needed(node, now)
        self._flush()

    # ------------------------------------------------------------------ internals
    def _blacklisted(self, node_id: bytes, now: int) -> bool:
        until = self.blacklist.get(node_id)
        return until is not None and until > now

    def _start_handshake(self, ip: bytes, port: int, bus_port: int, now: int) -> bool:
        for n in self.table.values():
            if n.bits & HANDSHAKE and n.ip == ip and n.port == port:
                return False
        temp = new_node_id(self.rng)
        while temp in self.table:
            temp = new_node_id(self.rng)
        node = ClusterNode(temp, ip, port, bus_port, HANDSHAKE | MEET, ctime=now)
        self.table[temp] = node
        self._changed(save=False)
        self._connect(node, now)
        return True

    def _connect(self, node: ClusterNode, now: int) -> None:
        token = self._next_token()
        node.connecting = token
        self._tokens[token] = node
        if not node.ping_sent and not node.bits & HANDSHAKE:
            node.ping_sent = now  # the PING goes out on connect: the timeout counts from now
        self.outbox.append(Connect(token, node.id, node.ip, node.bus_port))

    def _close_out_link(self, node: ClusterNode) -> None:
        link = node.out_link
        if link is not None:
            node.out_link = None
            self._out_links.pop(link, None)
            self.outbox.append(CloseLink(link))
            self._link_changed(node, False)

    def _link_changed(self, node: ClusterNode, up: bool) -> None:
        self._links_dirty = True
        if not node.bits & HANDSHAKE:  # (a handshake entry's ID is a temporary one)
            self.outbox.append(LinkChanged(node.id, up))

    def _del_node(self, node: ClusterNode) -> None:
        del self.table[node.id]
        self._close_out_link(node)
        if node.connecting:
            self._tokens.pop(node.connecting, None)
            node.connecting = 0
        for other in self.table.values():
            if other.fail_reports:
                other.fail_reports.pop(node.id, None)
        self._changed(save=not node.bits & HANDSHAKE)

    def _update_address(self, node: ClusterNode, ip: bytes, port: int, bus_port: int) -> None:
        if not ip:
            ip = node.ip
        if (node.ip == ip and node.port == port and node.bus_port == bus_port
                and not node.bits & NOADDR):
            return
        node.ip = ip
        node.port = port
        node.bus_port = bus_port
        node.bits &= ~NOADDR
        self._close_out_link(node)
        if node.connecting:
            self._tokens.pop(node.connecting, None)
            node.connecting = 0
        node.retry_at = 0
        self._changed()
        self._log("node.address", node=_sid(node.id), ip=ip.decode(), port=port)

    def _sender_flags(self, node: ClusterNode, flags: int) -> None:
        if flags & TLS_PORT_FLAG:
            incarnation = (flags >> INCARNATION_SHIFT) & INCARNATION_MASK
            node.tls_port = (flags >> TLS_PORT_SHIFT) & 0xFFFF
        else:  # (a sender without a TLS port, or of a version that does not announce it)
            incarnation = flags >> INCARNATION_SHIFT
            node.tls_port = 0
        node.persistent = bool(flags & PERSIST_FLAG)
        if incarnation and incarnation != node.incarnation:
            if node.incarnation:
                self._log("node.restarted", node=_sid(node.id))
            node.incarnation = incarnation
            self._save = True  # (nodes.conf keeps it for our own next start)
        if (node.bits ^ flags) & LEAVING:
            node.bits ^= LEAVING
            self._changed()
            self._log("node.leaving", node=_sid(node.id), leaving=bool(node.bits & LEAVING))

    def _send_ping(self, node: ClusterNode, now: int, cls: type[Ping] | type[Meet]) -> None:
        if not node.ping_sent:
            node.ping_sent = now
        link = node.out_link
        assert link is not None  # (pings go out on a node's link)
        self.outbox.append(Send(link, cls(self.header, gossip_entries(self.table, node,
                                                                      self.rng))))

    def _process_gossip(self, sender: ClusterNode, entries: list[GossipEntry],
                        now: int) -> None:
        table = self.table
        me = self.me
        for e in entries:
            node = table.get(e.node_id)
            if node is not None:
                if node is me or node is sender or node.bits & HANDSHAKE:
                    continue
                if e.flags & FAILING:
                    node.fail_reports[sender.id] = now
                    self._mark_failing_if_needed(node, now)
                else:
                    node.fail_reports.pop(sender.id, None)
                # A node we cannot reach, reported at another address: try that one.
                if (node.bits & FAILING and e.ip and e.port and e.bus_port
                        and (e.ip != node.ip or e.port != node.port)):
                    self._start_handshake(e.ip, e.port, e.bus_port, now)
            elif (not e.flags & NOADDR and e.ip and e.port and e.bus_port
                    and not self._blacklisted(e.node_id, now)
                    and not (e.ip == me.ip and e.port == me.port)):
                self._start_handshake(e.ip, e.port, e.bus_port, now)

    def _mark_failing_if_needed(self, node: ClusterNode, now: int) -> None:
        if not node.bits & PFAIL or node.bits & FAIL:
            return
        validity = self.node_timeout * FAIL_REPORT_VALIDITY_MULT
        reports = node.fail_reports
        for reporter in [r for r, t in reports.items() if now - t > validity]:
            del reports[reporter]
        quorum = self.size() // 2 + 1
        if len(reports) + 1 < quorum:
            return
        node.bits = (node.bits & ~PFAIL) | FAIL
        node.fail_time = now
        self._changed()
        self._log("node.fail", node=_sid(node.id), via="reports", reports=len(reports),
                  quorum=quorum)
        msg = Fail(self.header, node.id)
        for n in self.table.values():
            if n.out_link is not None and not n.bits & (MYSELF | HANDSHAKE):
                self.outbox.append(Send(n.out_link, msg))
