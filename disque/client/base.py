"""What the blocking and the asyncio client share: settings, the node table, result records,
and every connection decision, without I/O.

Neither client owns a socket of its own: each node gets a redis-py connection pool (hiredis
parsing and command packing when hiredis is installed), and a client is "on" one node at a
time (`node`), chosen by `NodeTable` and refreshed from HELLO. `Client` and `AsyncClient`
are two drivers of the decisions made here, once:

- `Connecting`: one search for the node to be on. Candidates in the table's order; one that
  does not answer HELLO cools down and the next is tried; a refused password ends the
  search; a node that is leaving is used only if no other answers.
- `ClientBase.refreshed` / `use`: HELLO every `hello_interval` seconds on the current node
  (a leaving or silent node is left), and the move to a chosen node.
- `Attempts`: the failover of one command or batch (which node, resend or give up).
- `ClientBase.resp3_refused`: redis-py opens a connection with `HELLO 3`. A node that refuses
  it (antirez's Disque answers "wrong number of arguments for 'hello' command", older
  servers "unknown command", or -NOPROTO) is spoken to over RESP2 from then on, without the
  user saying so; an explicit `protocol=` is never overridden. HELLO's node list reads the
  same in both protocols (`replies.parse_hello`).
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from disque.client.errors import AuthError, DisqueConnectionError, DisqueError
from disque.client.nodes import (
    LEAVING_PRIORITY,
    Node,
    NodeTable,
    parse_nodes,
    url_password,
    url_tls,
)
from disque.client.replies import Hello

_hiredis_pack: Any  # hiredis' C function, or None
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
    """Settings, node bookkeeping and the connection decisions (see the module doc); the
    I/O lives in `Client` and `AsyncClient`. The clock is the node table's."""

    def __init__(self, nodes: NodesSpec, *, password: str | None = None,
                 protocol: int | None = None, socket_timeout: float = 10.0,
                 connect_timeout: float = 2.0, retries: int = 3, hello_interval: float = 30.0,
                 cooldown: float = 5.0, discover: bool = True, client_name: str | None = None,
                 max_connections: int | None = None, rng: random.Random | None = None,
                 ssl: bool = False, **connection_kwargs: Any) -> None:
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
        # TLS (`ssl=True`, or a disque+tls:// / rediss:// URL) to every node, the ones HELLO
        # lists too; redis-py's ssl_* keywords (ssl_ca_certs, ssl_certfile, ssl_keyfile,
        # ssl_cert_reqs, ssl_check_hostname, ...) go to its SSL connection class
        self.tls = ssl or url_tls(nodes) or any(k.startswith("ssl_") for k in kwargs)
        self.protocol = protocol  # as the user gave it: None lets a node choose (see below)
        self.resp2_nodes: set[str] = set()  # addresses that refused HELLO 3: spoken RESP2
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

    # -- the connection decisions (see the module doc) ---------------------------------------
    def pool_options(self, node: Node) -> dict[str, Any]:
        """The keyword arguments of `node`'s connection pool: RESP2 for a node that refused
        HELLO 3 (`resp3_refused`)."""
        if node.addr in self.resp2_nodes:
            return dict(self.connection_kwargs, protocol=2)
        return self.connection_kwargs

    def resp3_refused(self, node: Node, exc: BaseException) -> bool:
        """A new connection to `node` failed its handshake with error reply `exc`. True
        when that is HELLO 3 refused and the client may choose: `node` is spoken to over
        RESP2 from now on, its pool is to be made again (`pool_options`); also for another
        connection of the refused pool, made concurrently (a RESP2 pool sends no HELLO, so
        the retry ends). False: `exc` is the caller's error (a refused password, or HELLO 3
        refused although the user asked for RESP3)."""
        if self.protocol is not None:
            return False
        text = str(exc).lower()
        if not (text.startswith("noproto") or ("'hello'" in text and (
                "wrong number of arguments" in text or "unknown command" in text))):
            return False
        self.resp2_nodes.add(node.addr)
        return True

    def node_failed(self, node: Node) -> None:
        """`node` refused a connection, dropped one or said -LEAVING: it cools down, and the
        client leaves it if it was on it (the next command finds another)."""
        self.table.mark_failed(node.addr)
        if self.node is node:
            self.node = None

    def refreshed(self, node: Node, hello: Hello | None) -> bool:
        """The periodic HELLO on the current `node` answered `hello` (None: it failed).
        False when the client left `node` (silent, or leaving while others are not)."""
        if hello is None:
            self.table.mark_failed(node.addr)
            ok = False
        else:
            ok = self.pick_after_hello(node, hello)
        if not ok and self.node is node:
            self.node = None
        return ok

    def use(self, node: Node, hello: Hello) -> None:
        """`use_node`: `node` answered HELLO; the client is on it now."""
        self.pick_after_hello(node, hello)
        self.node = node

    def unusable(self, node: Node, exc: BaseException) -> DisqueConnectionError:
        """`use_node`: no connection to `node`; the error to raise."""
        self.table.mark_failed(node.addr)
        return DisqueConnectionError(f"cannot use {node.addr}: {exc}", unreachable=True)

    def node_for_prefix(self, prefix: str) -> Node | None:
        """The node whose ID starts with job-ID `prefix`, if a consumer may move there now
        (known, not leaving, not cooling down)."""
        target = self.table.by_prefix(prefix)
        if (target is None or target.priority >= LEAVING_PRIORITY
                or self.table.is_cooling(target.addr)):
            return None
        return target

    def pick_after_hello(self, node: Node, hello: Hello) -> bool:
        """Merge HELLO from `node`; False when `node` is leaving and another is better."""
        self.table.update_from_hello(hello, node, add_nodes=self.discover)
        self.last_hello = self.table.clock()
        if node.priority >= LEAVING_PRIORITY:
            return not any(n.priority < LEAVING_PRIORITY and not self.table.is_cooling(n.addr)
                           for n in self.table.nodes.values() if n is not node)
        return True

    def hello_due(self) -> bool:
        return self.discover and self.table.clock() - self.last_hello > self.hello_interval

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


class Connecting:
    """One search for the node to be on, without I/O. The driver asks each candidate for
    HELLO in turn and reports the answer or the failure:

        search = Connecting(client)
        for node in search.candidates:
            try:
                hello = <HELLO on node>
            except <network error or DisqueError> as exc:
                if (failure := search.refused(node, exc)) is not None:
                    raise failure
                continue
            if search.answered(node, hello):
                return node
        return search.give_up()
    """

    __slots__ = ("client", "candidates", "fallback", "errors")

    def __init__(self, client: ClientBase) -> None:
        self.client = client
        self.candidates = client.table.candidates()
        self.fallback: Node | None = None  # a leaving node that answered
        self.errors: list[str] = []

    def refused(self, node: Node, exc: BaseException) -> DisqueError | None:
        """`node` did not answer HELLO: None to try the next candidate (it cools down), or
        the error that ends the search (a refused password does not heal elsewhere)."""
        if isinstance(exc, AuthError):
            return exc
        self.errors.append(f"{node.addr}: {exc}")
        self.client.table.mark_failed(node.addr)
        return None

    def answered(self, node: Node, hello: Hello) -> bool:
        """`node` answered `hello`: True when the client is on it now (search over)."""
        client = self.client
        client.table.mark_ok(node.addr)
        if client.pick_after_hello(node, hello):
            client.node = node
            return True
        self.fallback = self.fallback or node  # leaving: only if nothing better answers
        return False

    def give_up(self) -> Node:
        """Every candidate was tried: on the leaving node that answered, else raise."""
        if self.fallback is not None:
            self.client.node = self.fallback
            return self.fallback
        raise DisqueConnectionError("no reachable node among "
                                    f"{', '.join(self.client.seeds)}: {'; '.join(self.errors)}",
                                    unreachable=True)


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

    def __init__(self, client: ClientBase, safe: bool, pinned: Node | None) -> None:
        self.client = client
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
        client.node_failed(node)
        self.count += 1
        if self.pinned is not None or self.count > client.retries + len(client.table):
            return DisqueConnectionError(f"cannot connect to {node.addr}: {exc}",
                                         unreachable=True)
        return None

    def leaving(self, node: Node) -> bool:
        """`node` answered -LEAVING: True to send the command to another node."""
        self.client.node_failed(node)
        self.count += 1
        return self.safe and self.pinned is None and self.count <= self.client.retries

    def lost(self, node: Node, exc: BaseException) -> DisqueConnectionError | None:
        """The connection broke after sending: None to resend, else the error to raise."""
        self.count += 1
        if self.safe and self.count <= self.client.retries:
            self.again = node
            return None
        self.client.node_failed(node)
        return DisqueConnectionError(f"connection to {node.addr} lost: {exc}")


class PacksCommands(Protocol):
    """A redis-py connection, blocking or asyncio: what `pack_pipeline` falls back on."""

    def pack_commands(self, commands: Iterable[Iterable[Any]]) -> list[bytes]: ...


def pack_pipeline(conn: PacksCommands, commands: Sequence[Sequence[Any]]) -> list[bytes]:
    """Many commands as the bytes to write at once (what redis-py's Pipeline sends)."""
    if _hiredis_pack is not None:
        return [b"".join([_hiredis_pack(tuple(c)) for c in commands])]
    return conn.pack_commands(commands)
