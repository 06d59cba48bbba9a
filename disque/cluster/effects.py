"""What the membership state machine (disque.cluster.membership) asks of the I/O layer, as
values, and the pure helpers it uses (node IDs, IP text, the gossip sample). The I/O layer
drains the effects after every event and applies them in order:

- `Connect(token, node_id, ip, bus_port)`: open a bus link; report `link_connected(link,
  token)` with the link object (opaque to the membership) or `connect_failed(token)`;
- `Send(link, msg)`: write `msg` on `link` (coalescing writes is the I/O layer's business);
- `CloseLink(link)`: close it and deliver nothing more from it;
- `SaveConfig()`: nodes.conf changed, write `nodes_conf()` atomically;
- `Log(event, fields)`: a rare, noteworthy change (node added/failed/forgotten...);
- `LinkChanged(node_id, up)`: our outbound link to a (non-handshake) node came up or went
  away; the I/O layer tells the job layer, which re-targets the replications in flight at
  once (a killed peer's connection resets long before the node is flagged PFAIL).
"""

from __future__ import annotations

import ipaddress
import random
from typing import Any, NamedTuple, Protocol

from disque.cluster.messages import GossipEntry, Message
from disque.cluster.nodes import FAILING, HANDSHAKE, MYSELF, NOADDR, WIRE_FLAGS, ClusterNode


class Connect(NamedTuple):
    """Open an outbound bus link to ip:bus_port, then call link_connected(link, token) or
    connect_failed(token). Attempts must end (use a connect timeout <= node_timeout)."""

    token: int
    node_id: bytes  # the node's ID, or the temporary ID of a handshake entry
    ip: bytes
    bus_port: int


class Link(Protocol):
    """A bus link as the membership sees it: a handle it keeps per node and hands back in
    effects; the I/O layer (disque.cluster.bus.BusLink) sends on it and closes it."""

    def send(self, msg: Message) -> None: ...
    def close(self) -> None: ...


class Send(NamedTuple):
    link: Link
    msg: Message


class CloseLink(NamedTuple):
    link: Link


class SaveConfig(NamedTuple):
    """nodes.conf must be rewritten with `Membership.nodes_conf()`."""


SAVE_CONFIG = SaveConfig()


class Log(NamedTuple):
    event: str
    fields: dict[str, Any]


class LinkChanged(NamedTuple):
    """Our outbound link to `node_id` is up (`up`) or gone; `linked()` already says so."""

    node_id: bytes
    up: bool


Effect = Connect | Send | CloseLink | SaveConfig | Log | LinkChanged


def new_node_id(rng: random.Random) -> bytes:
    """A random 40-hex-char node ID."""
    return b"%040x" % rng.getrandbits(160)


def normalize_ip(ip: bytes | str) -> bytes | None:
    """Canonical text of an IP address, or None if `ip` is not one."""
    try:
        text = ip.decode("ascii") if isinstance(ip, bytes) else ip
        return str(ipaddress.ip_address(text)).encode()
    except (ValueError, UnicodeDecodeError):
        return None


def gossip_entries(table: dict[bytes, ClusterNode], target: ClusterNode | None,
                   rng: random.Random) -> list[GossipEntry]:
    """The gossip section of a PING / MEET to `target`: max(3, known/10) random entries of
    the node table, at most known - 2, failing nodes first."""
    known = len(table)
    wanted = min(max(3, known // 10), known - 2)
    if wanted <= 0:
        return []
    failing: list[ClusterNode] = []
    others: list[ClusterNode] = []
    for n in table.values():
        bits = n.bits
        if bits & (MYSELF | HANDSHAKE | NOADDR) or n is target:
            continue
        (failing if bits & FAILING else others).append(n)
    sample = rng.sample
    if len(failing) >= wanted:
        chosen = sample(failing, wanted)
    else:
        chosen = failing + sample(others, min(wanted - len(failing), len(others)))
    return [GossipEntry(n.id, n.ip, n.port, n.bus_port, n.bits & WIRE_FLAGS, n.ping_sent,
                        n.pong_received) for n in chosen]
