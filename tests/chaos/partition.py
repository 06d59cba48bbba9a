"""The partition nemesis: a TCP proxy of ours in front of every node's cluster bus port.

How the nodes are steered through it: a node reaches a peer at the bus port the peer
announces in its message headers (`cluster-announce-port` + the bus offset, see
`disque.cluster.membership`), and nodes.conf derives it the same way after a restart. So node
i runs with `--cluster-announce-port a_i`, where nothing listens on a_i and a_i + 10000 is
this proxy, forwarding to node i's real bus port. `CLUSTER MEET 127.0.0.1 a_0` then makes
every bus connection of the cluster pass through the proxy of the node it goes to. Client
ports are not proxied: the producers and consumers talk to the nodes directly.

Who is at the other end: the first frame a connecting node sends (PING/MEET, or
AUTH_RESPONSE with a cluster password) carries its node ID in the header, so the proxy
reads that one frame before it opens the upstream connection and knows the link's (from,
to) pair. A cut pair loses its links both ways: established connections are aborted (the
nodes see the links drop, as after a router's RST), and while the cut lasts new connections
are accepted and black-holed (bytes read and dropped: the connecting node sees a link that
never answers, as behind a firewall that drops packets). Healing closes the black holes so
that the nodes reconnect at once. Everything stays on loopback; no root needed.

The proxies run on one asyncio loop in a thread of the test process; `cut`, `isolate` and
`heal` are called from the test's thread and return once applied.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
import threading
from collections.abc import Iterable
from typing import Any

import msgpack

_LEN = struct.Struct(">I")
FIRST_FRAME_MAX = 1 << 20  # a PING/MEET with gossip is far smaller


class _Link:
    """One proxied bus connection: from node `src` (None: not identified) to node `dst`."""

    __slots__ = ("src", "dst", "writers", "blackholed")

    def __init__(self, src: int | None, dst: int, writers: list[asyncio.StreamWriter],
                 blackholed: bool) -> None:
        self.src = src
        self.dst = dst
        self.writers = writers
        self.blackholed = blackholed

    def abort(self) -> None:
        for w in self.writers:
            w.transport.abort()


class BusProxies:
    """One proxy per node: `add(i, listen_port, bus_port)`, `set_node_id(i, id)`, then
    `cut(groups)` / `isolate(i)` / `heal()`."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True,
                                       name="bus-proxies")
        self.thread.start()
        self.servers: list[asyncio.AbstractServer] = []
        self.ids: dict[bytes, int] = {}  # node ID -> node index
        self.cut_pairs: set[frozenset[int]] = set()
        self.links: set[_Link] = set()
        self.cuts = 0  # links aborted or black-holed, for the report

    # -- control (from the test's thread) ---------------------------------------------------
    def _run(self, fn: Any, *args: Any) -> Any:
        async def call() -> Any:
            return fn(*args)
        return asyncio.run_coroutine_threadsafe(call(), self.loop).result(timeout=10)

    def add(self, index: int, listen_port: int, bus_port: int) -> None:
        """Listen on 127.0.0.1:listen_port for node `index`, whose bus is at bus_port."""
        async def start() -> None:
            server = await asyncio.start_server(
                lambda r, w: self._accepted(r, w, index, bus_port), "127.0.0.1", listen_port)
            self.servers.append(server)
        asyncio.run_coroutine_threadsafe(start(), self.loop).result(timeout=10)

    def set_node_id(self, index: int, node_id: str | bytes) -> None:
        nid = node_id.encode() if isinstance(node_id, str) else node_id
        self._run(self.ids.__setitem__, nid, index)

    def cut(self, groups: Iterable[Iterable[int]]) -> None:
        """Partition: nodes of different groups lose every bus link between them."""
        groups = [list(g) for g in groups]
        pairs = {frozenset((a, b)) for gi, g in enumerate(groups) for a in g
                 for h in groups[gi + 1:] for b in h}
        self._run(self._apply_cut, pairs)

    def isolate(self, index: int, n: int) -> None:
        self.cut([[index], [i for i in range(n) if i != index]])

    def heal(self) -> None:
        self._run(self._apply_heal)

    def close(self) -> None:
        async def stop() -> None:
            for s in self.servers:
                s.close()
            for link in list(self.links):
                link.abort()
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(stop(), self.loop).result(timeout=10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)

    # -- on the loop -----------------------------------------------------------------------
    def _is_cut(self, a: int | None, b: int) -> bool:
        return a is not None and frozenset((a, b)) in self.cut_pairs

    def _apply_cut(self, pairs: set[frozenset[int]]) -> None:
        self.cut_pairs |= pairs
        for link in list(self.links):
            if not link.blackholed and self._is_cut(link.src, link.dst):
                self.cuts += 1
                link.abort()

    def _apply_heal(self) -> None:
        self.cut_pairs.clear()
        for link in list(self.links):
            if link.blackholed:
                link.abort()

    async def _accepted(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                        dst: int, bus_port: int) -> None:
        try:
            first = await self._first_frame(reader)
        except (OSError, asyncio.IncompleteReadError, ValueError):
            writer.transport.abort()
            return
        src = self._sender(first)
        if self._is_cut(src, dst):
            self.cuts += 1
            link = _Link(src, dst, [writer], True)
            self.links.add(link)
            try:
                while await reader.read(65536):
                    pass  # black hole
            except OSError:
                pass
            finally:
                self.links.discard(link)
                writer.transport.abort()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", bus_port)
        except OSError:
            writer.transport.abort()  # the node is down: the connecting node sees a reset
            return
        link = _Link(src, dst, [writer, up_writer], False)
        self.links.add(link)
        up_writer.write(first)
        try:
            await asyncio.gather(self._pump(reader, up_writer), self._pump(up_reader, writer))
        finally:
            self.links.discard(link)
            link.abort()

    @staticmethod
    async def _first_frame(reader: asyncio.StreamReader) -> bytes:
        head = await reader.readexactly(4)
        (size,) = _LEN.unpack(head)
        if size > FIRST_FRAME_MAX:
            raise ValueError("first bus frame too large")
        return head + await reader.readexactly(size)

    def _sender(self, frame: bytes) -> int | None:
        try:
            obj = msgpack.unpackb(frame[4:], raw=False)
            return self.ids.get(obj[2])
        except Exception:  # noqa: BLE001 - not a frame we understand: pass it through
            return None

    @staticmethod
    async def _pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        try:
            while data := await src.read(65536):
                dst.write(data)
                await dst.drain()
        except OSError:
            pass
        finally:
            dst.transport.abort()
