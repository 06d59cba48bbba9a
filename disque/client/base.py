"""What the blocking and the asyncio client share: settings, the node table, result records.

Neither client owns a socket of its own: each node gets a redis-py connection pool (hiredis
parsing and command packing when hiredis is installed), and a client is "on" one node at a
time (`node`), chosen by `NodeTable` and refreshed from HELLO.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from disque.client.errors import DisqueConnectionError, DisqueError
from disque.client.nodes import LEAVING_PRIORITY, Node, NodeTable, parse_nodes, url_password
from disque.client.replies import Hello

_hiredis_pack: Any
try:  # hiredis packs a command ~5x faster than redis-py's own packer calling it per argument
    from hiredis import pack_command as _hiredis_pack
except ImportError:  # pragma: no cover - redis-py without hiredis
    _hiredis_pack = None

NodesSpec = str | Iterable[str]


@dataclass(slots=True)
class AddJobsResult:
    """`add_jobs`: `ids[i]` is the ID of `bodies[i]`, or None with `errors[i]` set.
    An error of type DisqueConnectionError means the reply was lost: that job may or may not
    have been added."""

    ids: list[str | None]
    errors: list[DisqueError | None]

    @property
    def added(self) -> int:
        return sum(1 for i in self.ids if i is not None)

    @property
    def failed(self) -> int:
        return sum(1 for e in self.errors if e is not None)

    @property
    def ok(self) -> bool:
        return not self.failed


@dataclass(slots=True)
class ConsumeStats:
    """What `consume` did: jobs received, acknowledged, handed back, WORKING sent,
    node switches towards the producers."""

    received: int = 0
    acked: int = 0
    nacked: int = 0
    working: int = 0
    switches: int = 0
    errors: list[str] = field(default_factory=list)


class ClientBase:
    """Settings and node bookkeeping; the I/O lives in `Client` and `AsyncClient`."""

    def __init__(self, nodes: NodesSpec, *, password: str | None = None,
                 protocol: int | None = None, socket_timeout: float = 10.0,
                 connect_timeout: float = 2.0, retries: int = 3, hello_interval: float = 30.0,
                 cooldown: float = 5.0, discover: bool = True, client_name: str | None = None,
                 max_connections: int | None = None, rng: random.Random | None = None,
                 **connection_kwargs: Any) -> None:
        self.table = NodeTable(parse_nodes(nodes), cooldown=cooldown, rng=rng)
        self.seeds = [n.addr for n in self.table.nodes.values()]
        self.retries = retries
        self.hello_interval = hello_interval
        self.discover = discover
        self.socket_timeout = socket_timeout
        kwargs: dict[str, Any] = dict(socket_timeout=socket_timeout,
                                      socket_connect_timeout=connect_timeout,
                                      **connection_kwargs)
        password = password or url_password(nodes)
        if password:
            kwargs["password"] = password
        if protocol is not None:
            kwargs["protocol"] = protocol
        if client_name:
            kwargs["client_name"] = client_name
        if max_connections is not None:
            kwargs["max_connections"] = max_connections
        self.connection_kwargs = kwargs
        self.node: Node | None = None  # the node commands go to; None until connected
        self.last_hello = 0.0
        # address -> whether the node has ADDJOBS, once a batch found out (see `batch`)
        self.addjobs_support: dict[str, bool] = {}

    def __repr__(self) -> str:
        where = self.node.addr if self.node else "not connected"
        return f"<{type(self).__name__} {where} of {len(self.table)} known node(s)>"

    @property
    def node_id(self) -> str | None:
        return self.node.id if self.node else None

    @property
    def nodes(self) -> list[Node]:
        """Every node known (seeds and what HELLO listed)."""
        return list(self.table.nodes.values())

    def has_addjobs(self, node: Node | str | None = None) -> bool | None:
        """Whether `node` (default: the current one) has ADDJOBS: None until `add_jobs`
        sent it a batch, False for a node that answered it "unknown command"."""
        target = self.resolve(node) if node is not None else self.node
        return None if target is None else self.addjobs_support.get(target.addr)

    def read_timeout(self, blocking_ms: int | None) -> float | None:
        """Socket read timeout for a command the node may hold back `blocking_ms`
        (0: forever, so no timeout); None keeps the connection's own timeout."""
        if blocking_ms is None:
            return self.socket_timeout
        if blocking_ms == 0:
            return None
        return blocking_ms / 1000.0 + self.socket_timeout

    def pick_after_hello(self, node: Node, hello: Hello) -> bool:
        """Merge HELLO from `node`; False when `node` is leaving and another is better."""
        self.table.update_from_hello(hello, node, add_nodes=self.discover)
        self.last_hello = time.monotonic()
        if node.priority >= LEAVING_PRIORITY:
            return not any(n.priority < LEAVING_PRIORITY and not self.table.is_cooling(n.addr)
                           for n in self.table.nodes.values() if n is not node)
        return True

    def hello_due(self) -> bool:
        return self.discover and time.monotonic() - self.last_hello > self.hello_interval

    def resolve(self, node: Node | str | None) -> Node | None:
        """A Node, an address known to the table, or a new address (added, not a seed)."""
        if node is None or isinstance(node, Node):
            return node
        found = self.table.get(node)
        if found is None:
            host, port = parse_nodes(node)[0]
            found = Node(host, port)
            self.table.nodes[found.addr] = found
        return found


class Attempts:
    """The failover policy of one command or one pipelined batch, without I/O: which node
    the next attempt must use, and whether a failure is tried again or ends the call.
    `Client` and `AsyncClient` run the same policy around their own sockets.

    - Nothing sent (no connection): any command may go to another node, until every known
      node and `retries` more were tried; a call pinned to a node ends at once.
    - `-LEAVING`: a safe, unpinned command goes to another node, up to `retries` times.
    - Connection lost after sending: only a safe command is resent, to the same node first
      (it may have run there), up to `retries` times.
    """

    __slots__ = ("client", "safe", "pinned", "count", "again")

    def __init__(self, client: Any, safe: bool, pinned: Node | None) -> None:
        self.client = client  # has .retries, .table and ._node_failed(node)
        self.safe = safe
        self.pinned = pinned
        self.count = 0
        self.again: Node | None = None

    def required(self) -> Node | None:
        """The node the next attempt must use, or None for the client's current node."""
        node = self.pinned or self.again
        self.again = None
        return node

    def connect_failed(self, node: Node, exc: BaseException) -> DisqueConnectionError | None:
        """No connection to `node`: None to try again (elsewhere), else the error to raise."""
        client = self.client
        client._node_failed(node)
        self.count += 1
        if self.pinned is not None or self.count > client.retries + len(client.table):
            return DisqueConnectionError(f"cannot connect to {node.addr}: {exc}",
                                         unreachable=True)
        return None

    def leaving(self, node: Node) -> bool:
        """`node` answered -LEAVING: True to send the command to another node."""
        self.client._node_failed(node)
        self.count += 1
        return self.safe and self.pinned is None and self.count <= self.client.retries

    def lost(self, node: Node, exc: BaseException) -> DisqueConnectionError | None:
        """The connection broke after sending: None to resend, else the error to raise."""
        self.count += 1
        if self.safe and self.count <= self.client.retries:
            self.again = node
            return None
        self.client._node_failed(node)
        return DisqueConnectionError(f"connection to {node.addr} lost: {exc}")


def pack_pipeline(conn: Any, commands: Sequence[Sequence[Any]]) -> Any:
    """Many commands as the bytes to write at once (what redis-py's Pipeline sends)."""
    if _hiredis_pack is not None:
        return [b"".join([_hiredis_pack(tuple(c)) for c in commands])]
    return conn.pack_commands(commands)
