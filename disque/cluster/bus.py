"""The cluster bus, asyncio side: a listener on port + cluster-port-offset, one link per
connection, and the loop that carries out Membership's effects.

Everything the bus decides lives in `membership.Membership` (and, for jobs, the node); this
module only moves frames. Writes to a link are queued and sent once per loop iteration (many
messages, one send); a link whose peer stops reading is dropped once its write buffer passes
a bound, so a stuck peer cannot grow our memory. A malformed, oversized or unauthenticated
frame closes that link with a log line and nothing else.

With `cluster-password`, the accepting side sends a random challenge and the connecting side
must answer HMAC-SHA256(password, challenge || its node id) before anything else counts.
Without it, anyone who can reach the bus port can join: keep it on trusted networks.
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
import ssl
import time
from collections.abc import Awaitable, Callable
from typing import Any, Final, cast

import structlog

from disque.cluster.membership import (
    CloseLink,
    Connect,
    LinkChanged,
    Log,
    Membership,
    SaveConfig,
    Send,
)
from disque.cluster.messages import (
    FAIL,
    MEET,
    PING,
    PONG,
    AuthChallenge,
    AuthResponse,
    BusProtocolError,
    FrameDecoder,
    Message,
    auth_digest,
    auth_verify,
    encode_many,
    make_nonce,
)
from disque.config import specific_binds

log = structlog.get_logger("disque.bus")

MEMBERSHIP_TYPES: Final = frozenset((PING, PONG, MEET, FAIL))
LINK_OUTPUT_LIMIT: Final = 64 * 1024 * 1024  # bytes queued for a peer that does not read
CONNECT_TIMEOUT_MAX: Final = 5.0  # seconds


class BusLink(asyncio.Protocol):
    """One bus connection, inbound (accepted) or outbound (ours, for our requests)."""

    def __init__(self, bus: Bus, inbound: bool, token: int = 0) -> None:
        self.bus = bus
        self.inbound = inbound
        self.token = token
        self.transport: asyncio.Transport | None = None
        self.decoder = FrameDecoder(bus.max_frame, stats=bus.membership.stats)
        self.queue: list[Message] = []
        self.peer_ip = b""
        self.local_ip = b""
        self.closed = False
        self.nonce = b""
        # "auth": waiting for the peer's AUTH_RESPONSE (inbound) or challenge (outbound)
        self.state = "open"
        self.ready: asyncio.Future[bool] | None = None

    def __repr__(self) -> str:
        side = "in" if self.inbound else "out"
        return f"<BusLink {side} {self.peer_ip.decode(errors='replace')}>"

    # ------------------------------------------------------------------ asyncio
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # (uvloop's transports are not asyncio.Transport subclasses, but have its methods)
        transport = self.transport = cast(asyncio.Transport, transport)
        peer = transport.get_extra_info("peername")
        local = transport.get_extra_info("sockname")
        self.peer_ip = (peer[0] if isinstance(peer, tuple) else "").encode()
        self.local_ip = (local[0] if isinstance(local, tuple) else "").encode()
        bus = self.bus
        if self.inbound:
            bus.inbound.add(self)
            if bus.password:
                self.state = "auth"
                self.nonce = make_nonce()
                self.write_now([AuthChallenge(bus.membership.header, self.nonce)])
            else:
                bus.membership.link_accepted(self, self.local_ip)
                bus.apply()
        elif bus.password:
            self.state = "auth"

    def data_received(self, data: bytes) -> None:
        if self.is_closed():
            return
        bus = self.bus
        try:
            msgs = self.decoder.feed(data)
            error = None
        except BusProtocolError as exc:
            msgs = exc.messages
            error = exc
        if bus.prefetch is not None and self.state != "auth" and msgs:
            bus.prefetch(msgs)
        for msg in msgs:
            if self.closed:  # by a message before this one
                return
            if self.state == "auth":
                if not self.authenticate(msg):
                    return
                continue
            bus.deliver(self, msg)
        if error is not None:
            bus.log_link_error("bus.bad_frame", self, str(error))
            self.close()
        bus.apply()

    def is_closed(self) -> bool:
        """`self.closed`, through a call: `if self.closed: return` on entry to
        data_received would narrow it to False for mypy, the check in the delivery loop
        (a message can close the link) would read as unreachable, and a compiled build
        turns an unreachable block into a RuntimeError."""
        return self.closed

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        bus = self.bus
        bus.inbound.discard(self)
        bus.pending.discard(self)
        if self.ready is not None and not self.ready.done():
            self.ready.set_result(False)
        if self.state == "open" or self.state == "ready":
            bus.membership.link_closed(self)
            bus.apply()

    def pause_writing(self) -> None:
        pass  # the output bound below decides when a slow peer is dropped

    def resume_writing(self) -> None:
        pass

    # ------------------------------------------------------------------ auth
    def authenticate(self, msg: Message) -> bool:
        bus = self.bus
        if self.inbound:
            if (isinstance(msg, AuthResponse)
                    and auth_verify(bus.password, self.nonce, msg.header.sender, msg.digest)):
                self.state = "ready"
                bus.membership.link_accepted(self, self.local_ip)
                return True
            bus.log_link_error("bus.auth_refused", self, "bad or missing AUTH_RESPONSE")
        else:
            if isinstance(msg, AuthChallenge):
                self.write_now([AuthResponse(bus.membership.header,
                                             auth_digest(bus.password, msg.nonce,
                                                         bus.membership.myself))])
                self.state = "ready"
                if self.ready is not None and not self.ready.done():
                    self.ready.set_result(True)
                return True
            bus.log_link_error("bus.auth_refused", self, "expected an AUTH_CHALLENGE")
        self.close()
        return False

    # ------------------------------------------------------------------ output
    def send(self, msg: Message) -> None:
        if self.closed:
            return
        if not self.queue:
            self.bus.pending.add(self)
        self.queue.append(msg)

    def write_now(self, msgs: list[Message]) -> None:
        assert self.transport is not None
        self.transport.write(encode_many(msgs, self.bus.membership.stats))

    def flush(self, shared: dict[tuple[Any, ...], bytes] | None = None) -> None:
        queue = self.queue
        if not queue or self.closed:
            return
        self.queue = []
        transport = self.transport
        stats = self.bus.membership.stats
        try:
            data = encode_many(queue, stats, shared)
        except (OverflowError, ValueError, TypeError) as exc:
            data = self.salvage(queue, exc)
        assert transport is not None  # (connected: links are flushed once connected)
        transport.write(data)
        if transport.get_write_buffer_size() > LINK_OUTPUT_LIMIT:
            self.bus.log_link_error("bus.slow_peer", self, "output limit reached")
            self.close()

    def salvage(self, queue: list[Message], exc: Exception) -> bytes:
        """A message that cannot be encoded is a bug, not a reason to lose the rest of the
        batch (other jobs' REPLJOB, GOTJOB, ACKs): drop that one, log it, send the others."""
        stats = self.bus.membership.stats
        frames = []
        for msg in queue:
            try:
                frames.append(encode_many((msg,), stats))
            except (OverflowError, ValueError, TypeError):
                self.bus.log_link_error("bus.encode_error", self,
                                        f"dropped {type(msg).__name__}: {exc}")
        return b"".join(frames)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.queue = []
        if self.transport is not None:
            self.transport.abort()
        bus = self.bus
        bus.pending.discard(self)
        if self.state != "auth":
            bus.membership.link_closed(self)


def source_for(target: str, binds: list[str]) -> str:
    """The first bind address a link to `target` can leave from: same family, and loopback
    for a loopback target, not for another (a socket bound to 127.0.0.1 cannot reach a
    remote host). '' (the kernel chooses) when none fits or `target` is a host name."""
    try:
        to = ipaddress.ip_address(target)
    except ValueError:
        return ""
    for b in binds:
        try:
            a = ipaddress.ip_address(b)
        except ValueError:
            continue
        if a.version == to.version and a.is_loopback == to.is_loopback:
            return b
    return ""


class Bus:
    """The bus of one node: listener, links, and the effect loop of Membership."""

    def __init__(self, membership: Membership, *, password: str = "",
                 save_config: Callable[[str], None],
                 deliver_job_message: Callable[[BusLink, Message], None] | None = None, link_changed: Callable[[bytes, bool], None] | None = None,
                 max_frame: int = 64 * 1024 * 1024) -> None:
        self.membership = membership
        self.password = password.encode() if password else b""
        self.save_config = save_config
        self.deliver_job_message = deliver_job_message
        # called with the messages of a read before they are delivered (Iteration.prefetch)
        self.prefetch: Callable[[list[Message]], None] | None = None
        # the job layer's hook for Membership's LinkChanged(node_id, up) effects
        self.link_changed = link_changed
        self.max_frame = max_frame
        self.loop: asyncio.AbstractEventLoop | None = None
        self.servers: list[asyncio.AbstractServer] = []
        self.inbound: set[BusLink] = set()
        self.pending: set[BusLink] = set()  # links with queued output
        self.flush_scheduled = False
        self.error_log: dict[str, float] = {}
        # Outbound links leave from a bind address, as the original's DISQUE_BIND_ADDR:
        # peers take our address from the connection's source, and the kernel's default
        # source (127.0.0.1, or the interface toward the peer) may not be one we listen on.
        self.source_ips: list[str] = []
        self.save_retry_at: float | None = None  # a failed nodes.conf write is retried then
        # tls-cluster (disque.tls): listen through a TLS acceptor, dial with this context
        self.tls_listen: Callable[[Callable[[], asyncio.Protocol], list[str], int, int],
                                  Awaitable[None]] | None = None
        self.tls_dial: Callable[[], ssl.SSLContext] | None = None

    async def start(self, addresses: list[str], port: int, backlog: int = 511) -> None:
        self.loop = asyncio.get_running_loop()
        self.source_ips = specific_binds(addresses)
        if self.tls_listen is not None:
            await self.tls_listen(lambda: BusLink(self, inbound=True), addresses, port, backlog)
            return
        for addr in addresses:
            srv = await self.loop.create_server(lambda: BusLink(self, inbound=True), addr, port,
                                                backlog=backlog, reuse_address=True)
            self.servers.append(srv)

    def close(self) -> None:
        for srv in self.servers:
            srv.close()
        for link in list(self.inbound):
            link.close()

    # ------------------------------------------------------------------ events in
    def deliver(self, link: BusLink, msg: Message) -> None:
        if msg.TYPE in MEMBERSHIP_TYPES:
            self.membership.link_message(link, msg, link.peer_ip)
        elif self.deliver_job_message is not None:
            self.deliver_job_message(link, msg)

    def tick(self) -> None:
        self.membership.tick()
        if self.save_retry_at is not None and time.monotonic() >= self.save_retry_at:
            self.save()
        self.apply()

    def save(self) -> None:
        """Write nodes.conf. A failure (logged by `save_config`) must neither fail the
        command that changed the table, after the change, nor drop the effects queued after
        it: the write is retried every second until it succeeds."""
        try:
            self.save_config(self.membership.nodes_conf())
            self.save_retry_at = None
        except OSError:
            self.save_retry_at = time.monotonic() + 1.0

    # ------------------------------------------------------------------ effects out
    def apply(self, flush_now: bool = False) -> None:
        """Carry out what Membership asked for, in order; the links' writes go at the end
        of the loop iteration, or now (`flush_now`: the caller runs there already)."""
        m = self.membership
        while m.outbox:
            for effect in m.drain():
                if isinstance(effect, Send):
                    effect.link.send(effect.msg)
                elif isinstance(effect, Connect):
                    assert self.loop is not None
                    self.loop.create_task(self.connect(effect))
                elif isinstance(effect, CloseLink):
                    effect.link.close()
                elif isinstance(effect, SaveConfig):
                    self.save()
                elif isinstance(effect, LinkChanged):
                    if self.link_changed is not None:
                        self.link_changed(effect.node_id, effect.up)
                elif isinstance(effect, Log):
                    log.info(effect.event, **effect.fields)
        if flush_now:
            if self.pending:
                self.flush()
        elif self.pending and not self.flush_scheduled:
            self.flush_scheduled = True
            assert self.loop is not None
            self.loop.call_soon(self.flush)

    def flush(self) -> None:
        """Send everything queued this loop iteration, one write per link."""
        self.flush_scheduled = False
        pending = self.pending
        self.pending = set()
        # the same REPLJOBs go to every replica: their frames are encoded once
        shared: dict[tuple[Any, ...], bytes] | None = {} if len(pending) > 1 else None
        for link in pending:
            link.flush(shared)

    async def connect(self, effect: Connect) -> None:
        m = self.membership
        assert self.loop is not None
        timeout = min(CONNECT_TIMEOUT_MAX, max(m.node_timeout / 1000, 0.5))
        link = BusLink(self, inbound=False, token=effect.token)
        if self.password:
            # Before connecting: the peer's challenge can arrive as soon as we are connected.
            link.ready = self.loop.create_future()
        ip = effect.ip.decode(errors="replace")
        source = source_for(ip, self.source_ips)
        local_addr = (source, 0) if source else None
        try:
            await asyncio.wait_for(
                self.loop.create_connection(
                    lambda: link, ip, effect.bus_port, local_addr=local_addr,
                    ssl=self.tls_dial() if self.tls_dial is not None else None),
                timeout)
            if link.ready is not None:
                ok = await asyncio.wait_for(link.ready, timeout)
                if not ok:
                    raise ConnectionError("authentication failed")
            else:
                link.state = "ready"
        except (TimeoutError, OSError, ConnectionError, UnicodeDecodeError) as exc:
            if link.transport is not None and not link.closed:
                link.closed = True
                link.transport.abort()
            m.connect_failed(effect.token)
            self.log_link_error("bus.connect_failed", link,
                                f"{effect.ip.decode(errors='replace')}:{effect.bus_port} "
                                f"{type(exc).__name__}: {exc}")
            self.apply()
            return
        if link.closed:
            m.connect_failed(effect.token)
        else:
            m.link_connected(link, effect.token)
        self.apply()

    def log_link_error(self, event: str, link: BusLink, detail: str) -> None:
        """At most one line per kind of link error every 10 s."""
        now = os.times().elapsed
        if now - self.error_log.get(event, -1e9) >= 10:
            self.error_log[event] = now
            log.warning(event, peer=link.peer_ip.decode(errors="replace"), detail=detail)
