"""Which node to talk to: address parsing, the node table kept fresh from HELLO, and the
job-ID prefix statistics a consumer uses to move next to its producers.

This is the spec's "Client libraries" protocol as plain data, with no sockets and with the
clock and the random source injected, so every decision is unit-tested:

1. The client is given some `host:port` addresses (or a `disque://h:p,h:p` URL). It tries
   them in random order until one answers.
2. On connection it sends HELLO and learns every node of the cluster with its *priority*
   (1 healthy, 5 no link, 10 possibly failing, 100 failing or leaving). New connections
   prefer the lowest priority; among equals the choice is random, which spreads clients.
3. A node that refused a connection, dropped one or answered `-LEAVING` is put aside for a
   short cooldown; when every node is cooling down, all are tried again anyway.
4. A consumer counts the node prefix (characters 2..9) of the job IDs it receives; when most
   jobs were created by another node, it is worth consuming there directly.

Invariant: the seeds given by the user are never forgotten, whatever HELLO says, so a client
whose whole HELLO view went stale can still find the cluster again.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

if TYPE_CHECKING:
    from disque.client.replies import Hello

DEFAULT_PORT = 7711
LEAVING_PRIORITY = 100


@dataclass(slots=True)
class Node:
    """One node as the client knows it: address, ID once HELLO told it, priority."""

    host: str
    port: int
    id: str | None = None
    priority: int = 1
    seed: bool = False

    @property
    def addr(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    @property
    def prefix(self) -> str | None:
        """The 8 characters job IDs created by this node carry (None before HELLO)."""
        return self.id[:8] if self.id else None


def parse_addr(text: str, default_port: int = DEFAULT_PORT) -> tuple[str, int]:
    """`host:port`, `host`, `[v6]:port` or `[v6]` -> (host, port)."""
    text = text.strip()
    if not text:
        raise ValueError("empty node address")
    if text.startswith("["):
        host, sep, rest = text[1:].partition("]")
        if not sep:
            raise ValueError(f"bad node address {text!r}")
        if not rest:
            return host, default_port
        if not rest.startswith(":"):
            raise ValueError(f"bad node address {text!r}")
        port_text = rest[1:]
    elif text.count(":") == 1:
        host, _, port_text = text.partition(":")
    elif ":" in text:  # a bare IPv6 address
        return text, default_port
    else:
        return text, default_port
    try:
        port = int(port_text)
    except ValueError:
        raise ValueError(f"bad port in node address {text!r}") from None
    if not 0 < port < 65536:
        raise ValueError(f"port out of range in node address {text!r}")
    return host or "127.0.0.1", port


def parse_nodes(spec: str | Iterable[str]) -> list[tuple[str, int]]:
    """The node list the user gives, in any of its forms, as (host, port) pairs in order.

    Accepted: `"disque://h1:7711,h2:7712"` (or `disque+tls://`, `redis://`, `rediss://`:
    `url_tls` tells TLS), `"h1:7711,h2:7712"`, `["h1:7711", "h2"]`; a missing port is
    7711. Duplicates are dropped."""
    items: list[str] = []
    if isinstance(spec, str):
        text = spec.strip()
        if "://" in text:
            url = urlsplit(text)
            if url.scheme not in URL_SCHEMES:
                raise ValueError(f"unsupported URL scheme {url.scheme!r}: use disque:// "
                                 f"(or disque+tls:// for TLS)")
            netloc = url.netloc.rpartition("@")[2]  # credentials are passed separately
            text = netloc
        items = text.split(",")
    else:
        for entry in spec:
            items.extend(str(entry).split(","))
    out: list[tuple[str, int]] = []
    for item in items:
        if item.strip():
            addr = parse_addr(item)
            if addr not in out:
                out.append(addr)
    if not out:
        raise ValueError("no node address given")
    return out


URL_SCHEMES = {"disque": False, "redis": False, "disque+tls": True, "rediss": True}


def url_tls(spec: str | Iterable[str]) -> bool:
    """Whether the node list is a URL whose scheme asks for TLS (disque+tls://, rediss://)."""
    if isinstance(spec, str) and "://" in spec:
        return URL_SCHEMES.get(urlsplit(spec.strip()).scheme, False)
    return False


def url_password(spec: str | Iterable[str]) -> str | None:
    """The password of `disque://:secret@host:port,...`, if the URL has one."""
    if isinstance(spec, str) and "://" in spec:
        netloc = urlsplit(spec.strip()).netloc
        if "@" in netloc:
            creds = netloc.rpartition("@")[0]
            return creds.partition(":")[2] or creds or None
    return None


class NodeTable:
    """Known nodes by address, their priorities and cooldowns; picks where to connect."""

    def __init__(self, seeds: Sequence[tuple[str, int]], *, cooldown: float = 5.0,
                 rng: random.Random | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.nodes: dict[str, Node] = {}
        for host, port in seeds:
            node = Node(host, port, seed=True)
            self.nodes[node.addr] = node
        self.cooldown = cooldown
        self.rng = rng or random.Random()
        self.clock = clock
        self.down_until: dict[str, float] = {}

    def __len__(self) -> int:
        return len(self.nodes)

    def get(self, addr: str) -> Node | None:
        return self.nodes.get(addr)

    def by_id(self, node_id: str) -> Node | None:
        for node in self.nodes.values():
            if node.id == node_id:
                return node
        return None

    def by_prefix(self, prefix: str) -> Node | None:
        """The node whose ID starts with this job-ID prefix (None if unknown or ambiguous)."""
        found = [n for n in self.nodes.values() if n.id and n.id.startswith(prefix)]
        return found[0] if len(found) == 1 else None

    # -- candidates --------------------------------------------------------------------------
    def candidates(self, exclude: Iterable[str] = ()) -> list[Node]:
        """Every node in the order to try it: not cooling down first, then lowest priority,
        random among equals; nodes cooling down come last (the soonest available first)."""
        now = self.clock()
        skip = set(exclude)
        fresh: list[Node] = []
        cooling: list[Node] = []
        for addr, node in self.nodes.items():
            if addr in skip:
                continue
            if self.down_until.get(addr, 0.0) > now:
                cooling.append(node)
            else:
                fresh.append(node)
        self.rng.shuffle(fresh)
        fresh.sort(key=lambda n: n.priority)  # stable: random within a priority
        cooling.sort(key=lambda n: self.down_until[n.addr])
        return fresh + cooling

    def mark_failed(self, addr: str, cooldown: float | None = None) -> None:
        """A connection to `addr` failed or it said -LEAVING: try others first for a while."""
        self.down_until[addr] = self.clock() + (self.cooldown if cooldown is None else cooldown)

    def mark_ok(self, addr: str) -> None:
        self.down_until.pop(addr, None)

    def is_cooling(self, addr: str) -> bool:
        return self.down_until.get(addr, 0.0) > self.clock()

    # -- HELLO -------------------------------------------------------------------------------
    def update_from_hello(self, hello: Hello, via: Node, add_nodes: bool = True) -> None:
        """Merge a HELLO reply (see `replies.Hello`) received from node `via`.

        Nodes HELLO lists are added or updated; a node with an empty IP (a node bound to a
        wildcard address without `cluster-announce-ip`) is reached on the host we used for
        `via`. Non-seed nodes that HELLO no longer lists are dropped. With `add_nodes` False
        only nodes already known are updated (a client pinned to its seeds)."""
        via.id = hello.node_id
        listed: set[str] = {via.addr}
        for entry in hello.nodes:
            if entry.id == hello.node_id:
                via.priority = entry.priority
                continue
            host = entry.host or via.host
            node = Node(host, entry.port, entry.id, entry.priority)
            # the same node may be known under another address (a seed given as localhost)
            known = self.by_id(entry.id) or self.nodes.get(node.addr)
            if known is not None:
                known.id = entry.id
                known.priority = entry.priority
                listed.add(known.addr)
            elif add_nodes:
                self.nodes[node.addr] = node
                listed.add(node.addr)
        if not add_nodes:
            return
        for addr in [a for a, n in self.nodes.items() if a not in listed and not n.seed]:
            del self.nodes[addr]
            self.down_until.pop(addr, None)


class PrefixStats:
    """Counts the creating-node prefix of the jobs a consumer receives (the spec's advice:
    consume where the producers produce). Counts decay by half every `window` jobs so the
    choice follows a changing workload."""

    def __init__(self, window: int = 1000) -> None:
        self.window = window
        self.counts: Counter[str] = Counter()
        self.seen = 0

    def observe(self, job_id: str) -> None:
        self.counts[job_id[2:10]] += 1
        self.seen += 1
        if self.seen >= self.window:
            self.seen = 0
            for key in list(self.counts):
                self.counts[key] //= 2
                if not self.counts[key]:
                    del self.counts[key]

    def preferred(self, min_jobs: int = 50, share: float = 0.5) -> str | None:
        """The prefix of more than `share` of the recent jobs, once at least `min_jobs`
        were counted; None when no node dominates."""
        total = sum(self.counts.values())
        if total < min_jobs or not self.counts:
            return None
        prefix, n = self.counts.most_common(1)[0]
        return prefix if n > share * total else None
