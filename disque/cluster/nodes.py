"""ClusterNode: what a node knows about one member of the cluster (itself included), its
flags, and the CLUSTER NODES / nodes.conf line format built from it.

Flags are bits (`MYSELF`, `PFAIL`, ...) on the record; `flags` gives their names in the order
CLUSTER NODES prints them (`myself,fail?,fail,handshake,noaddr,leaving`, or `noflags`). The
same bits travel in gossip entries (only `WIRE_FLAGS`) and in a message header (the sender's
own LEAVING).

nodes.conf is exactly the CLUSTER NODES text minus handshake entries. `parse_nodes_conf`
applies the original's loading rules: blank lines skipped, `vars ...` lines ignored, every
other line has 6 fields and a 40-char hex ID, exactly one `myself` line; anything else raises
`NodesConfError` naming the line. The bus port is not in the file: the loader derives it from
the client port (port + bus offset).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from disque.cluster.effects import Link

MYSELF: Final = 1
PFAIL: Final = 2  # "fail?": this node's own timeout observation
FAIL: Final = 4  # agreed by a majority (or told by a FAIL message)
HANDSHAKE: Final = 8  # temporary entry with a random ID until the first PONG names it
NOADDR: Final = 16  # address unknown (its ID answered from another address)
LEAVING: Final = 32  # set by the node itself (CLUSTER LEAVING yes), copied from its own header
MEET: Final = 64  # internal: send MEET instead of PING on the next outbound link

_FLAG_NAMES: Final = ((MYSELF, "myself"), (PFAIL, "fail?"), (FAIL, "fail"), (HANDSHAKE, "handshake"),
               (NOADDR, "noaddr"), (LEAVING, "leaving"))
# Flag names in the order CLUSTER NODES prints them.
FLAG_ORDER = tuple(name for _, name in _FLAG_NAMES)
_BY_NAME = {name: bit for bit, name in _FLAG_NAMES}
WIRE_FLAGS: Final = PFAIL | FAIL | NOADDR | LEAVING  # what a gossip entry carries about a node
FAILING: Final = PFAIL | FAIL

_NODE_ID = re.compile(r"[0-9a-f]{40}")


def flag_names(bits: int) -> list[str]:
    return [name for bit, name in _FLAG_NAMES if bits & bit]


def flag_bits(names: Iterable[str]) -> int:
    """Names (as CLUSTER NODES prints them) -> bits; ValueError on an unknown name."""
    bits = 0
    for name in names:
        if name == "noflags":
            continue
        try:
            bits |= _BY_NAME[name]
        except KeyError:
            raise ValueError(f"unknown node flag {name!r}") from None
    return bits


class ClusterNode:
    """One entry of the node table. Membership mutates it; views read it.

    `out_link` is the opaque outbound bus link (None when not connected); the rest of the
    bookkeeping fields belong to `disque.cluster.membership`."""

    __slots__ = ("id", "ip", "port", "bus_port", "bits", "ping_sent", "pong_received",
                 "out_link", "link_ctime", "connecting", "retry_at", "retries", "ctime",
                 "fail_time", "fail_reports", "incarnation", "tls_port", "persistent")

    def __init__(self, node_id: bytes, ip: bytes, port: int, bus_port: int = 0,
                 bits: int = 0, ctime: int = 0) -> None:
        self.id = node_id
        self.ip = ip
        self.port = port
        self.bus_port = bus_port
        self.bits = bits
        self.ping_sent = 0  # unix ms of the unanswered PING, 0 if none
        self.pong_received = 0  # unix ms of the last PONG
        self.out_link: Link | None = None
        self.link_ctime = 0
        self.connecting = 0  # token of the pending Connect, 0 if none
        self.retry_at = 0  # no reconnect attempt before this time
        self.retries = 0
        self.ctime = ctime
        self.fail_time = 0
        self.fail_reports: dict[bytes, int] = {}  # reporter ID -> last report time
        # the process incarnation its headers announce (0: not heard yet); a new value
        # means it restarted and may have lost its jobs (disque.cluster.rereplication)
        self.incarnation = 0
        self.tls_port = 0  # the TLS client port its headers announce (0: none heard)
        self.persistent = False  # its headers announce an AOF (PERSIST_FLAG)

    @property
    def flags(self) -> list[str]:
        """Flag names in CLUSTER NODES order."""
        return flag_names(self.bits)

    @flags.setter
    def flags(self, names: Iterable[str]) -> None:
        self.bits = flag_bits(names)

    @property
    def link(self) -> str:
        """`connected` if an outbound bus link exists or this is myself."""
        return "connected" if self.out_link is not None or self.bits & MYSELF else "disconnected"

    @property
    def priority(self) -> int:
        """HELLO priority: 1 normal, 5 no link, 10 PFAIL, 100 FAIL or leaving."""
        bits = self.bits
        prio = 1
        if self.out_link is None and not bits & MYSELF:
            prio = 5
        if bits & PFAIL:
            prio = 10
        if bits & (FAIL | LEAVING):
            prio = 100
        return prio

    def line(self) -> str:
        """The CLUSTER NODES / nodes.conf line, newline included."""
        flags = ",".join(flag_names(self.bits)) or "noflags"
        return (f"{self.id.decode()} {self.ip.decode()}:{self.port} {flags} {self.ping_sent} "
                f"{self.pong_received} {self.link}\n")

    def __repr__(self) -> str:
        return (f"ClusterNode({self.id[:8]!r}.., {self.ip!r}:{self.port}, "
                f"{','.join(self.flags) or 'noflags'})")


# ---------------------------------------------------------------------------- nodes.conf
class NodesConfError(ValueError):
    """nodes.conf cannot be loaded; the message names the offending line."""


def render_cluster_nodes(nodes: Iterable[ClusterNode]) -> str:
    """CLUSTER NODES: one line per known node, handshake entries included."""
    return "".join([n.line() for n in nodes])


def render_nodes_conf(nodes: Iterable[ClusterNode]) -> str:
    """nodes.conf text: the CLUSTER NODES lines minus handshake entries, then a `vars
    incarnations` line: the last process incarnation heard from each other node, so a node
    that restarts knows which of the others restarted while it was down and which did not
    (disque.cluster.rereplication)."""
    nodes = [n for n in nodes if not n.bits & HANDSHAKE]
    heard = [f"{n.id.decode()}:{n.incarnation}" for n in nodes
             if n.incarnation and not n.bits & MYSELF]
    tail = f"vars incarnations {','.join(heard)}\n" if heard else ""
    return "".join([n.line() for n in nodes]) + tail


def parse_nodes_conf(text: str) -> tuple[bytes, list[ClusterNode]]:
    """nodes.conf text -> (my node ID, entries incl. myself) with the values as written.

    Handshake lines (not written by us) are skipped. The caller applies the "non-zero
    ping/pong means now" rule (`Membership.load` does). A `vars incarnations` line gives
    the entries their last heard incarnation (an entry it does not name, or one it names
    badly, keeps 0: not heard)."""
    myself: bytes | None = None
    entries: list[ClusterNode] = []
    seen: set[bytes] = set()
    heard: dict[bytes, int] = {}
    for lineno, raw in enumerate(text.split("\n"), 1):
        line = raw.strip()
        if not line:
            continue
        if line.split()[0] == "vars":
            heard.update(_incarnations(line.split()[1:]))
            continue

        def bad(reason: str, lineno: int = lineno, line: str = line) -> NodesConfError:
            return NodesConfError(f"corrupted cluster config file, line {lineno}: {reason}: "
                                  f"{line!r}")

        fields = line.split()
        if len(fields) != 6:
            raise bad(f"expected 6 fields, got {len(fields)}")
        node_id, addr, flags, ping, pong, link = fields
        if len(node_id) != 40 or _NODE_ID.fullmatch(node_id) is None:
            raise bad("node ID is not 40 lowercase hex characters")
        ip, sep, port_text = addr.rpartition(":")
        if not sep or not port_text.isdigit() or int(port_text) > 65535:
            raise bad("address is not ip:port")
        try:
            bits = flag_bits(flags.split(","))
        except ValueError as e:
            raise bad(str(e)) from None
        if not ping.isdigit() or not pong.isdigit():
            raise bad("ping/pong times are not integers")
        if link not in ("connected", "disconnected"):
            raise bad("link state is not connected/disconnected")
        nid = node_id.encode()
        if nid in seen:
            raise bad("duplicate node ID")
        seen.add(nid)
        if bits & MYSELF:
            if myself is not None:
                raise bad("more than one myself line")
            myself = nid
        if bits & HANDSHAKE:
            continue
        node = ClusterNode(nid, ip.encode(), int(port_text), bits=bits)
        node.ping_sent = int(ping)
        node.pong_received = int(pong)
        entries.append(node)
    if myself is None:
        raise NodesConfError("corrupted cluster config file: no myself line")
    for node in entries:
        node.incarnation = heard.get(node.id, 0)
    return myself, entries


def _incarnations(fields: list[str]) -> dict[bytes, int]:
    """The `incarnations` value of a `vars` line's key/value pairs: node ID -> incarnation
    (an unreadable item is left out: it only costs the node a check it would make without
    the line)."""
    out: dict[bytes, int] = {}
    for key, value in zip(fields[::2], fields[1::2], strict=False):
        if key != "incarnations":
            continue
        for item in value.split(","):
            node_id, _, inc = item.partition(":")
            if len(node_id) == 40 and _NODE_ID.fullmatch(node_id) and inc.isdigit():
                out[node_id.encode()] = int(inc)
    return out
