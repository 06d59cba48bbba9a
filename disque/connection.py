"""The client connection: one `asyncio.Protocol` per RESP client.

Bytes in, the request reader (disque.protocol.reader) splits them into commands, the
dispatcher (disque.dispatch) runs each one, and the replies produced by one read leave in one
write. Here too: back-pressure (a peer that does not read its replies is not read either),
the CLIENT REPLY ON/OFF/SKIP modes, the requests held while the client is blocked (GETJOB,
synchronous ADDJOB) or paused (CLIENT PAUSE), the output-buffer limits, and the hold of
replies whose commands logged to the AOF until the write is done (see AofManager.hold).

Invariants: `out` holds reply chunks in command order; a client with a `waiter` runs
nothing else until it is unblocked (later requests wait in `pending` or `held`); once
`closing` is set nothing more is parsed.
"""

from __future__ import annotations

import asyncio
import socket
import time
from typing import TYPE_CHECKING, Final, cast

import structlog

from disque.commands import Blocker, Command
from disque.protocol.errors import ProtocolError
from disque.protocol.reader import RequestReader
from disque.protocol.reply import NULL3, NULL_ARRAY2, NULL_BULK2

if TYPE_CHECKING:
    from disque.aof.manager import AofManager
    from disque.dispatch import Dispatcher
    from disque.iteration import Iteration
    from disque.server import Server

log = structlog.get_logger("disque")

# verbose shows what debug shows (client connections and closes), as Redis's verbose level
# adds its connection lines to notice
debug_events = [False]  # debug events are on (disque.process.configure_logging sets it)


class Shared:
    """What every client connection reads or counts on each request: the dispatcher, the
    per-iteration wiring, the network counters, CLIENT PAUSE, the output limits. One object
    of the server's (`Server.shared`), compiled with the clients, so that each of these is a
    field read, not a lookup in the interpreted server's attributes (a dozen per request)."""

    def __init__(self, dispatch: Dispatcher, iteration: Iteration, aofm: AofManager) -> None:
        self.dispatch = dispatch
        self.iteration = iteration
        self.aofm = aofm
        self.stat_net_input = 0
        self.stat_net_output = 0
        self.now_mono = time.monotonic()  # as of the last cron run (idle-client checks)
        self.clients_paused_until = 0.0  # CLIENT PAUSE: monotonic end, 0 when not paused
        self.ack_sent = False  # an ACKJOB queued bus messages: route them before replying
        # client-output-buffer-limit: hard and soft bytes (0: none), soft seconds
        self.obuf_hard = 0
        self.obuf_soft = 0
        self.obuf_soft_seconds = 0


class Client(asyncio.Protocol):
    """One client connection."""

    __slots__ = ("server", "shared", "node", "id", "transport", "reader", "out", "proto", "null_bulk",
                 "null_array", "authenticated", "name", "addr", "laddr", "ctime",
                 "last_interaction", "waiter", "pending", "closing", "monitor", "last_cmd",
                 "reply_mode", "lib_name", "lib_ver", "soft_limit_since", "held", "held_bytes",
                 "aof_held", "aof_marks", "write_paused", "in_deferred")

    def __init__(self, server: Server) -> None:
        self.server = server
        self.shared = server.shared
        self.node = server.node
        self.id = 0
        self.transport: asyncio.Transport | None = None
        cfg = server.cfg
        self.reader = RequestReader(cfg.proto_max_bulk_len, cfg.client_query_buffer_limit)
        self.out: list[bytes] = []
        self.proto = 2
        self.null_bulk = NULL_BULK2
        self.null_array = NULL_ARRAY2
        self.authenticated = not cfg.requirepass
        self.name = b""
        self.addr = ""
        self.laddr = ""
        self.ctime = time.monotonic()
        self.last_interaction = self.ctime
        self.waiter: Blocker | None = None
        self.pending: list[list[bytes]] = []
        self.closing = False
        self.monitor = False
        self.last_cmd: Command | None = None
        self.reply_mode = REPLY_ON
        self.lib_name = b""
        self.lib_ver = b""
        self.soft_limit_since = 0.0
        # Bytes that arrive while the client is blocked: kept unparsed until it is unblocked.
        # Reading goes on (not pause_reading) so that a disconnect is noticed at once and
        # the blocked GETJOB is withdrawn before any job is handed to a dead client.
        self.held: list[bytes] = []
        self.held_bytes = 0
        self.aof_held = False  # replies wait for the AOF fsync (appendfsync always)
        # (start, end) in `out` of each reply whose command logged to the AOF: -MISCONF in
        # its place if the write fails (see AofManager.hold)
        self.aof_marks: list[tuple[int, int]] = []
        self.write_paused = False  # backpressure: the peer does not read its replies
        self.in_deferred = False  # in server.iteration.deferred: written at the end of the iteration

    # ------------------------------------------------------------------ asyncio callbacks
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # (TCP or Unix: a Transport; BaseTransport is asyncio.Protocol's signature)
        transport = self.transport = cast(asyncio.Transport, transport)
        server = self.server
        server.stat_connections += 1
        peer = transport.get_extra_info("peername")
        local = transport.get_extra_info("sockname")
        self.addr = fmt_addr(peer)
        self.laddr = fmt_addr(local)
        if len(server.clients) >= server.cfg.maxclients:
            server.stat_rejected += 1
            transport.write(b"-ERR max number of clients reached\r\n")
            transport.close()
            self.closing = True
            return
        sock = transport.get_extra_info("socket")
        if sock is not None and server.cfg.tcp_keepalive and sock.family != socket.AF_UNIX:
            set_keepalive(sock, server.cfg.tcp_keepalive)
        server.next_client_id += 1
        self.id = server.next_client_id
        server.clients[self.id] = self
        if debug_events[0]:  # a filtered structlog call still costs ~4 us through the proxy
            log.debug("client.accepted", id=self.id, addr=self.addr)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closing = True
        server = self.server
        if server.clients.pop(self.id, None) is not None and debug_events[0]:
            log.debug("client.closed", id=self.id, addr=self.addr,
                      error=str(exc) if exc else None)
        server.dispatch.monitors.discard(self)
        if self.waiter is not None:
            self.waiter.cancel()
            self.waiter.client = None  # break the client <-> waiter cycle (see gc policy)
            self.waiter = None
        self.pending = []
        self.held = []
        self.transport = None

    def pause_writing(self) -> None:
        # The peer is not reading its replies: stop reading its requests (backpressure).
        self.write_paused = True
        assert self.transport is not None
        self.transport.pause_reading()

    def resume_writing(self) -> None:
        self.write_paused = False
        if not self.closing and not self.shared.clients_paused_until:
            assert self.transport is not None
            self.transport.resume_reading()

    def data_received(self, data: bytes) -> None:
        shared = self.shared
        shared.stat_net_input += len(data)
        self.last_interaction = shared.now_mono
        if self.closing:
            return
        if self.waiter is not None or shared.clients_paused_until:
            self.held.append(data)
            self.held_bytes += len(data)
            if self.held_bytes > self.reader.max_query:
                self.server.log_client_error("protocol", "query buffer limit while blocked")
                self.drop("query buffer limit")
            elif shared.clients_paused_until:
                # a client accepted during CLIENT PAUSE: uvloop starts reading after
                # connection_made, so it is paused at its first read
                assert self.transport is not None
                self.transport.pause_reading()
            return
        self.process(data)

    def process(self, data: bytes) -> None:
        """Parse and run the requests in `data`; replies leave in one write."""
        shared = self.shared
        reqs: list[list[bytes]] = []
        perr = None
        try:
            self.reader.feed(data, reqs)
        except ProtocolError as exc:
            perr = exc
        if reqs:
            self.run(reqs)
        if perr is not None and not self.closing:
            self.server.log_client_error("protocol", str(perr))
            self.out.append(b"-ERR Protocol error: " + str(perr).encode() + b"\r\n")
            self.closing = True
            if not shared.aofm.hold(self):  # held: the AOF's release writes, then closes
                self.flush()
                assert self.transport is not None
                self.transport.close()
            return
        aofm = shared.aofm
        if self.out and (aofm.aof is None or not aofm.hold(self)):  # (no AOF: no call)
            if shared.ack_sent:
                # An ACKJOB ran: its SETACKs leave before its reply, so an acknowledgement a
                # client saw is on its way to the other holders even if this node is
                # killed right after (otherwise they would deliver the job again).
                shared.ack_sent = False
                shared.iteration.route_out()
            # Written at once, from the read callback. Deferring every reply to the end of
            # the loop iteration (as Redis does in beforeSleep) gained 5-13% on the
            # redis-benchmark rows but cost 30-45% of the pipelined produce->consume rate:
            # on loopback the write wakes the peer, which then runs on the other core while
            # this loop serves the rest of the batch.
            self.flush()
        iteration = shared.iteration
        if self.node.wheel.earliest < iteration.wake_key:
            iteration.arm_timer()

    # ------------------------------------------------------------------ execution
    def run(self, reqs: list[list[bytes]]) -> None:
        dispatch = self.shared.dispatch
        for i, argv in enumerate(reqs):
            if self.reply_mode:
                self.run_quietly(argv)
            else:
                dispatch.execute(self, argv)
            if self.waiter is not None:
                rest = reqs[i + 1:]
                if rest and self.reply_mode == REPLY_ON:
                    # pipelined ADDJOBs behind a blocked one start now (BlockedAddJob.absorb)
                    absorb = getattr(self.waiter, "absorb", None)
                    if absorb is not None:
                        rest = absorb(self, rest)
                self.pending = rest
                return
            if self.closing:
                return

    def run_quietly(self, argv: list[bytes]) -> None:
        """CLIENT REPLY OFF / SKIP: run the command and drop what it answered (Redis 3.2):
        OFF drops every reply until REPLY ON (whose +OK is sent); SKIP drops the reply of
        the one command after it. A blocked command keeps its mode until it is answered."""
        mode = self.reply_mode
        if mode == REPLY_SKIP_NEXT:
            self.reply_mode = mode = REPLY_SKIPPING
        mark = len(self.out)
        self.shared.dispatch.execute(self, argv)
        if self.waiter is not None:
            return
        if self.reply_mode:  # still OFF, or skipping (REPLY ON answers +OK, and is kept)
            del self.out[mark:]
            self.forget_marks(mark)
            if self.reply_mode == REPLY_SKIPPING:
                self.reply_mode = REPLY_ON

    def end_pause(self) -> None:
        """CLIENT PAUSE is over: read again and run what arrived meanwhile."""
        if self.closing or self.transport is None:
            return
        if not self.write_paused:
            self.transport.resume_reading()
        self.run_held()

    def run_held(self) -> None:
        """Run the requests that arrived while the client was blocked or paused."""
        while (self.held and self.waiter is None and not self.closing
               and not self.shared.clients_paused_until):
            data = b"".join(self.held)
            self.held = []
            self.held_bytes = 0
            self.process(data)

    def block(self, waiter: Blocker) -> None:
        self.waiter = waiter

    def unblocked(self, reply: bytes) -> None:
        """The node served, timed out or refused our blocked command."""
        self.waiter = None
        if self.closing:
            return
        if self.reply_mode == REPLY_SKIPPING:
            self.reply_mode = REPLY_ON
        elif self.reply_mode != REPLY_OFF:
            self.out.append(reply)
        pending = self.pending
        if pending:
            self.pending = []
            self.run(pending)
        if self.out and not self.in_deferred:
            # Unblocked from a bus message or a timer: many clients (and the same client
            # several times, pipelined GETJOBs served from one YOURJOBS) are answered in
            # one callback, so the write waits for the end of the loop iteration.
            self.in_deferred = True
            self.shared.iteration.defer_flush(self)
        self.run_held()

    def forget_marks(self, mark: int) -> None:
        """The replies from `out[mark]` on were taken out of `out` (CLIENT REPLY OFF, an
        ADDJOB group): their AOF marks go too."""
        marks = self.aof_marks
        while marks and marks[-1][0] >= mark:
            marks.pop()

    def refuse_logged(self, reply: bytes) -> None:
        """The AOF write of the records this client's commands logged failed: each of
        those commands answers `reply` (-MISCONF) instead of what it would have."""
        marks = self.aof_marks
        out = self.out
        for start, end in reversed(marks):
            out[start:end] = [reply]
        marks.clear()

    def flush(self) -> None:
        out = self.out
        if not out or self.aof_held:
            return
        if self.aof_marks:
            self.aof_marks.clear()
        data = out[0] if len(out) == 1 else b"".join(out)
        out.clear()
        shared = self.shared
        shared.stat_net_output += len(data)
        transport = self.transport
        assert transport is not None
        transport.write(data)
        if shared.obuf_hard or shared.obuf_soft:
            self.check_output_limits(transport.get_write_buffer_size())

    def check_output_limits(self, size: int) -> None:
        shared = self.shared
        if shared.obuf_hard and size > shared.obuf_hard:
            self.drop("output buffer hard limit")
            return
        if shared.obuf_soft and size > shared.obuf_soft:
            now = time.monotonic()
            if not self.soft_limit_since:
                self.soft_limit_since = now
            elif now - self.soft_limit_since >= shared.obuf_soft_seconds:
                self.drop("output buffer soft limit")
        else:
            self.soft_limit_since = 0.0

    def drop(self, reason: str) -> None:
        self.server.log_client_error("output-limit", reason)
        self.closing = True
        assert self.transport is not None
        self.transport.abort()

    def close(self) -> None:
        """Close after what is already written has been sent."""
        self.closing = True
        assert self.transport is not None
        self.transport.close()

    def close_after_reply(self) -> None:
        """Close once the reply of the command being run is written (CLIENT KILL of the
        calling connection): closing clients are flushed at once, before this runs."""
        self.closing = True
        loop = self.server.loop
        assert loop is not None and self.transport is not None
        loop.call_soon(self.transport.close)

    def query_buffer(self) -> int:
        """CLIENT LIST `qbuf`: bytes received and not run yet, i.e. an incomplete request in
        the reader and whatever arrived while the client was blocked or paused."""
        return self.reader.buffered() + self.held_bytes

    def output_buffer(self) -> tuple[int, int, int]:
        """CLIENT LIST (`obl`, `oll`, `omem`): bytes written and still in the transport's
        buffer (the peer does not read fast enough), reply chunks not yet handed to the
        transport (held for the AOF fsync, or until the end of the loop iteration), and the
        bytes of both."""
        transport = self.transport
        pending = transport.get_write_buffer_size() if transport is not None else 0
        queued = sum(map(len, self.out))
        return pending, len(self.out), pending + queued

    def query_limit(self) -> int:
        """client-query-buffer-limit as this connection's reader applies it."""
        return self.reader.max_query

    def set_proto(self, proto: int) -> None:
        self.proto = proto
        if proto == 3:
            self.null_bulk = self.null_array = NULL3
        else:
            self.null_bulk, self.null_array = NULL_BULK2, NULL_ARRAY2


# CLIENT REPLY modes (Client.reply_mode); anything but ON sends requests through run_quietly.
REPLY_ON: Final = 0
REPLY_OFF: Final = 1
REPLY_SKIP_NEXT: Final = 2   # set by CLIENT REPLY SKIP: the next command's reply is dropped
REPLY_SKIPPING: Final = 3    # that next command is running (or blocked)


def fmt_addr(addr: object) -> str:
    if isinstance(addr, tuple) and len(addr) >= 2:
        host = addr[0]
        return f"[{host}]:{addr[1]}" if ":" in host else f"{host}:{addr[1]}"
    return str(addr or "")



def set_keepalive(sock: socket.socket, interval: int) -> None:
    """tcp-keepalive as Redis sets it: the first probe after `interval` seconds of silence,
    then every interval/3, the peer declared dead after 3 unanswered probes."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        if hasattr(socket, "TCP_KEEPIDLE"):
            interval = min(interval, 32767)  # Linux's limit for these options
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, interval)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, max(1, interval // 3))
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, 3)
    except (OSError, OverflowError):
        pass

