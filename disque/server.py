"""Server wiring: config -> event loop -> listeners -> node; startup, shutdown, signals.

One uvloop event loop per process. `Client` is a flat `asyncio.Protocol`: bytes in, the
request reader splits them into commands, `Server.execute` dispatches each one, and the
replies produced by one read leave in one write. Timers: the node's timer wheel says when
it next needs to run and the server arms a single loop timer for that instant; a cron at
`hz` does the periodic housekeeping (idle clients, instantaneous stats).

Everything below this module is sans-I/O: the node gets its clock from here.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import gc
import logging
import logging.handlers
import os
import random
import resource
import signal
import socket
import sys
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import structlog

from disque import __version__
from disque.aof.loader import AofLoadError
from disque.aof.manager import AofManager, misconf_reply
from disque.cluster.bus import Bus
from disque.cluster.membership import Membership, new_node_id
from disque.cluster.messages import INCARNATION_BITS, GotJob, GotJobBatch
from disque.cluster.nodes import NodesConfError, parse_nodes_conf
from disque.commands import TABLE, Command, load_all, wrong_arity
from disque.config import (
    Config,
    ConfigError,
    ConfigSetError,
    load_config,
    on_set,
    specific_binds,
)
from disque.latency import LatencyMonitor
from disque.logs import configure_structlog, renderer_for
from disque.node import Node
from disque.protocol.errors import (
    LOADING_REPLY,
    NOAUTH_REPLY,
    OOM_REPLY,
    CommandError,
    ProtocolError,
)
from disque.protocol.reader import RequestReader
from disque.protocol.reply import NULL3, NULL_ARRAY2, NULL_BULK2, OK

log = structlog.get_logger("disque")


_perf_ns = time.perf_counter_ns
_time_ns = time.time_ns


def wall_ms() -> int:
    return _time_ns() // 1_000_000


class Client(asyncio.Protocol):
    """One client connection."""

    __slots__ = ("server", "node", "id", "transport", "reader", "out", "proto", "null_bulk",
                 "null_array", "authenticated", "name", "addr", "laddr", "ctime",
                 "last_interaction", "waiter", "pending", "closing", "monitor", "last_cmd",
                 "reply_mode", "lib_name", "lib_ver", "soft_limit_since", "held", "held_bytes",
                 "aof_held", "aof_marks", "write_paused", "in_deferred")

    def __init__(self, server: Server) -> None:
        self.server = server
        self.node = server.node
        self.id = 0
        self.transport: Any = None
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
        self.waiter: Any = None
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
        self.in_deferred = False  # in server.deferred: written at the end of the iteration

    # ------------------------------------------------------------------ asyncio callbacks
    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        server = self.server
        server.stat_connections += 1
        peer = transport.get_extra_info("peername")
        local = transport.get_extra_info("sockname")
        self.addr = _fmt_addr(peer)
        self.laddr = _fmt_addr(local)
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
        if _debug_log[0]:  # a filtered structlog call still costs ~4 us through the proxy
            log.debug("client.accepted", id=self.id, addr=self.addr)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closing = True
        server = self.server
        if server.clients.pop(self.id, None) is not None and _debug_log[0]:
            log.debug("client.closed", id=self.id, addr=self.addr,
                      error=str(exc) if exc else None)
        server.monitors.discard(self)
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
        self.transport.pause_reading()

    def resume_writing(self) -> None:
        self.write_paused = False
        if not self.closing and not self.server.clients_paused_until:
            self.transport.resume_reading()

    def data_received(self, data: bytes) -> None:
        server = self.server
        server.stat_net_input += len(data)
        self.last_interaction = server.now_mono
        if self.closing:
            return
        if self.waiter is not None or server.clients_paused_until:
            self.held.append(data)
            self.held_bytes += len(data)
            if self.held_bytes > self.reader.max_query:
                server.log_client_error("protocol", "query buffer limit while blocked")
                self.drop("query buffer limit")
            elif server.clients_paused_until:
                # a client accepted during CLIENT PAUSE: uvloop starts reading after
                # connection_made, so it is paused at its first read
                self.transport.pause_reading()
            return
        self.process(data)

    def process(self, data: bytes) -> None:
        """Parse and run the requests in `data`; replies leave in one write."""
        server = self.server
        reqs: list[list[bytes]] = []
        perr = None
        try:
            self.reader.feed(data, reqs)
        except ProtocolError as exc:
            perr = exc
        if reqs:
            self.run(reqs)
        if perr is not None and not self.closing:
            server.log_client_error("protocol", str(perr))
            self.out.append(b"-ERR Protocol error: " + str(perr).encode() + b"\r\n")
            self.closing = True
            if not server.aofm.hold(self):  # held: the AOF's release writes, then closes
                self.flush()
                self.transport.close()
            return
        if self.out and not server.aofm.hold(self):
            if server.ack_sent:
                # An ACKJOB ran: its SETACKs leave before its reply, so an acknowledgement a
                # client saw is on its way to the other holders even if this node is
                # killed right after (otherwise they would deliver the job again).
                server.ack_sent = False
                server.route_out()
            # Written at once, from the read callback. Deferring every reply to the end of
            # the loop iteration (as Redis does in beforeSleep) gained 5-13% on the
            # redis-benchmark rows but cost 30-45% of the pipelined produce->consume rate:
            # on loopback the write wakes the peer, which then runs on the other core while
            # this loop serves the rest of the batch.
            self.flush()
        if server.node.wheel._heap and server.node.wheel._heap[0] < server.wake_key:
            server.arm_timer()

    # ------------------------------------------------------------------ execution
    def run(self, reqs: list[list[bytes]]) -> None:
        execute = self.server.execute
        for i, argv in enumerate(reqs):
            if self.reply_mode:
                self.run_quietly(argv)
            else:
                execute(self, argv)
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
        self.server.execute(self, argv)
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
               and not self.server.clients_paused_until):
            data = b"".join(self.held)
            self.held = []
            self.held_bytes = 0
            self.process(data)

    def block(self, waiter: Any) -> None:
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
            self.server.defer_flush(self)
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
        server = self.server
        server.stat_net_output += len(data)
        transport = self.transport
        transport.write(data)
        hard = server.obuf_hard
        if hard or server.obuf_soft:
            self.check_output_limits(transport.get_write_buffer_size())

    def check_output_limits(self, size: int) -> None:
        server = self.server
        if server.obuf_hard and size > server.obuf_hard:
            self.drop("output buffer hard limit")
            return
        if server.obuf_soft and size > server.obuf_soft:
            now = time.monotonic()
            if not self.soft_limit_since:
                self.soft_limit_since = now
            elif now - self.soft_limit_since >= server.obuf_soft_seconds:
                self.drop("output buffer soft limit")
        else:
            self.soft_limit_since = 0.0

    def drop(self, reason: str) -> None:
        self.server.log_client_error("output-limit", reason)
        self.closing = True
        self.transport.abort()

    def close(self) -> None:
        """Close after what is already written has been sent."""
        self.closing = True
        self.transport.close()

    def close_after_reply(self) -> None:
        """Close once the reply of the command being run is written (CLIENT KILL of the
        calling connection): closing clients are flushed at once, before this runs."""
        self.closing = True
        self.server.loop.call_soon(self.transport.close)

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

    def set_proto(self, proto: int) -> None:
        self.proto = proto
        if proto == 3:
            self.null_bulk = self.null_array = NULL3
        else:
            self.null_bulk, self.null_array = NULL_BULK2, NULL_ARRAY2


# CLIENT REPLY modes (Client.reply_mode); anything but ON sends requests through run_quietly.
REPLY_ON = 0
REPLY_OFF = 1
REPLY_SKIP_NEXT = 2   # set by CLIENT REPLY SKIP: the next command's reply is dropped
REPLY_SKIPPING = 3    # that next command is running (or blocked)


def _fmt_addr(addr: Any) -> str:
    if isinstance(addr, tuple) and len(addr) >= 2:
        host = addr[0]
        return f"[{host}]:{addr[1]}" if ":" in host else f"{host}:{addr[1]}"
    return str(addr or "")


class Server:
    """Process-wide state: config, node, clients, statistics, timers."""

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.loop: asyncio.AbstractEventLoop | None = None
        rng = random.Random()
        myself, entries, fresh = load_cluster_config(cfg, rng)
        self.node_id = myself
        binds = specific_binds(cfg.bind)
        bind_ip = binds[0] if binds else ""
        self.membership = Membership(
            myself, cfg.port, clock=wall_ms, rng=rng, node_timeout=cfg.cluster_node_timeout,
            blacklist_ttl=cfg.cluster_forget_ttl * 1000,
            bus_port_offset=cfg.cluster_port_offset,
            announce_ip=cfg.cluster_announce_ip.encode() or None,
            announce_port=cfg.cluster_announce_port or None, my_ip=bind_ip.encode(),
            # a new one at every start: peers re-replicate the copies we may have lost
            incarnation=rng.getrandbits(INCARNATION_BITS) or 1)
        self.membership.load(entries)
        me = self.membership.me
        if (bind_ip and not cfg.cluster_announce_ip and len(binds) == len(cfg.bind)
                and me.ip.decode() not in binds):
            # nodes.conf names an address we no longer listen on (restarted elsewhere):
            # announce the one we bind, not the stale one.
            me.ip = bind_ip.encode()
        self.latency = LatencyMonitor(wall_ms, _perf_ns, cfg.latency_monitor_threshold)
        self.node = Node(myself, wall_ms, rng=rng, maxmemory=cfg.maxmemory,
                         maxmemory_policy=cfg.maxmemory_policy,
                         queue_idle_timeout=cfg.queue_idle_timeout, latency=self.latency)
        self.node.membership = self.membership
        self.node.leaving = self.membership.leaving
        self.node.rereplication.rate = cfg.rereplicate_rate
        self.node.repair.rate = cfg.repair_rate
        self.node.repair.grace = cfg.repair_grace
        self.apply_deadletter_defaults()
        self.bus = Bus(self.membership, password=cfg.cluster_password,
                       save_config=self.save_nodes_conf,
                       deliver_job_message=self.on_job_message,
                       link_changed=self.node.link_changed)
        self.node.on_out = self.schedule_route
        self.route_scheduled = False
        self.ack_sent = False  # an ACKJOB queued bus messages: route them before replying
        if fresh:
            self.save_nodes_conf(self.membership.nodes_conf())
        self.bus_handle: asyncio.TimerHandle | None = None
        self.run_id = os.urandom(20).hex()
        self.table = load_all()
        names = dict(self.table)
        for old, new in cfg.renamed_commands.items():  # rename-command, in file order
            cmd = names.pop(old.encode(), None)
            if cmd is not None and new:
                names[new.encode()] = cmd
        self.lookup: dict[bytes, Command] = {}
        for name, cmd in names.items():
            self.lookup[name] = cmd
            self.lookup[name.upper()] = cmd
        self.clients: dict[int, Client] = {}
        self.deferred: list[Client] = []  # clients whose replies are written at iteration end
        self.next_client_id = 0
        self.monitors: set[Client] = set()
        self.clients_paused_until = 0.0  # CLIENT PAUSE: monotonic end, 0 when not paused
        self.pause_handle: asyncio.TimerHandle | None = None
        self.listeners: list[Any] = []
        self.http: Any = None  # disque.http.HttpSide while http-port is set
        self.start_time = time.time()
        self.now_mono = time.monotonic()
        self.loading = False
        self.shutting_down = False
        self.stopped: asyncio.Future[None] = asyncio.get_event_loop().create_future()
        self.exit_code = 0
        # absolute paths of the pidfile and unix socket made at start (whatever dir is now)
        self.own_files: list[str] = []
        # stats
        self.stat_connections = 0
        self.stat_rejected = 0
        self.stat_commands = 0
        self.stat_unknown_commands = 0
        self.stat_net_input = 0
        self.stat_net_output = 0
        self.ops_samples: deque[tuple[float, int, int, int]] = deque(maxlen=16)
        self.peak_memory = 0
        self.slowlog: deque[list[Any]] = deque()
        self.slowlog_id = 0
        self.client_errors: dict[str, float] = {}
        self.gc_full_at = self.now_mono
        # timers
        self.wake_key = 1 << 62  # wheel bucket key the loop timer is armed for
        self.wake_handle: asyncio.TimerHandle | None = None
        self.cron_handle: asyncio.TimerHandle | None = None
        self.apply_limits()
        self.install_config_hooks()
        self.aofm = AofManager(self)

    # ------------------------------------------------------------------ config hooks
    def apply_deadletter_defaults(self, *_: Any) -> None:
        cfg = self.cfg
        self.node.set_deadletter_defaults(cfg.default_max_deliveries, cfg.default_max_nacks,
                                          cfg.deadletter_queue.encode("utf-8", "surrogateescape"))
        self.node.redrive_rate = cfg.redrive_rate

    def apply_limits(self) -> None:
        hard, soft, seconds = self.cfg.client_output_buffer_limit
        self.obuf_hard, self.obuf_soft, self.obuf_soft_seconds = hard, soft, seconds

    def install_config_hooks(self) -> None:
        cfg = self.cfg
        node = self.node

        def set_node(attr: str, cfg_attr: str) -> Any:
            return lambda c, name: setattr(node, attr, getattr(c, cfg_attr))

        on_set(cfg, "maxmemory", set_node("maxmemory", "maxmemory"))
        on_set(cfg, "maxmemory-policy", set_node("maxmemory_policy", "maxmemory_policy"))
        on_set(cfg, "queue-idle-timeout", set_node("queue_idle_timeout", "queue_idle_timeout"))
        on_set(cfg, "rereplicate-rate",
               lambda c, name: setattr(node.rereplication, "rate", c.rereplicate_rate))
        on_set(cfg, "repair-rate", lambda c, name: setattr(node.repair, "rate", c.repair_rate))
        on_set(cfg, "repair-grace",
               lambda c, name: setattr(node.repair, "grace", c.repair_grace))
        for name in ("default-max-deliveries", "default-max-nacks", "deadletter-queue",
                     "redrive-rate"):
            on_set(cfg, name, self.apply_deadletter_defaults)
        on_set(cfg, "client-output-buffer-limit", lambda c, name: self.apply_limits())
        on_set(cfg, "latency-monitor-threshold",
               lambda c, name: self.latency.set_threshold(c.latency_monitor_threshold))

        def set_reader_limits(c: Config, name: str) -> None:
            for client in self.clients.values():
                client.reader.max_bulk = c.proto_max_bulk_len
                client.reader.max_query = c.client_query_buffer_limit

        on_set(cfg, "proto-max-bulk-len", set_reader_limits)
        on_set(cfg, "client-query-buffer-limit", set_reader_limits)
        def relog(c: Config, name: str) -> None:
            try:
                configure_logging(c)
            except OSError as exc:
                raise ConfigSetError(f"ERR Can't reopen the log file: {exc.strerror}") from None

        on_set(cfg, "loglevel", relog)
        on_set(cfg, "log-format", relog)
        on_set(cfg, "cluster-node-timeout",
               lambda c, name: setattr(self.membership, "node_timeout", c.cluster_node_timeout))
        on_set(cfg, "cluster-forget-ttl", lambda c, name: setattr(
            self.membership, "blacklist_ttl", c.cluster_forget_ttl * 1000))

        def set_announce(c: Config, name: str) -> None:
            self.membership.set_announce(c.cluster_announce_ip.encode(), c.cluster_announce_port)
            self.bus.apply()

        on_set(cfg, "cluster-announce-ip", set_announce)
        on_set(cfg, "cluster-announce-port", set_announce)

        def check_maxclients(c: Config, name: str) -> None:
            fits, _, _ = adjust_open_files_limit(c.maxclients)
            if fits < c.maxclients:
                raise ConfigSetError("ERR The operating system is not able to handle the "
                                     f"specified number of clients, try with {fits}")

        on_set(cfg, "maxclients", check_maxclients)
        on_set(cfg, "http-port", lambda c, name: self.set_http_port(c))
        on_set(cfg, "dir", lambda c, name: self.change_dir(c))

    def set_http_port(self, cfg: Config) -> None:
        """CONFIG SET http-port: the HTTP listener moves to the new port at once (0 stops
        it); a port that cannot be bound is refused and the old listener stays."""
        if self.loop is None or (self.http is None and not cfg.http_port):
            return
        try:
            if self.http is None:
                self.http = new_http_side(self)
            self.http.listen(cfg.bind, cfg.http_port, cfg.tcp_backlog)
        except OSError as exc:
            raise ConfigSetError(f"ERR Could not listen on http-port {cfg.http_port}: "
                                 f"{exc.strerror or exc}") from None

    def change_dir(self, cfg: Config) -> None:
        """CONFIG SET dir: move the node's files, as the `dir` directive places them.

        The original only chdir'ed: its open AOF kept growing in the old directory until a
        rewrite, so a restart from the rewritten config could come up without the jobs. Here
        nodes.conf is locked and saved in the new directory at once, a relative logfile is
        reopened there and the AOF is rewritten there (the live file moves when the rewrite
        completes). A directory holding another node's files is refused, and any failure
        leaves the node where it was."""
        global _config_lock_fd
        old = os.getcwd()
        try:
            os.chdir(cfg.dir)
        except OSError as exc:
            raise ConfigSetError(f"ERR Changing directory: {exc.strerror}") from None
        except ValueError:  # a NUL in the path
            raise ConfigSetError("ERR Changing directory: Invalid argument") from None
        new = cfg.dir = os.getcwd()
        if os.path.samefile(new, old):
            return
        undo: list[Any] = [lambda: os.chdir(old)]
        try:
            lock_fd = lock_cluster_config(cfg)
            undo.append(lambda: os.close(lock_fd))
            nodes_conf = os.path.abspath(cfg.cluster_config_file)
            foreign = self.foreign_files(nodes_conf)
            if foreign:
                raise ClusterConfigError(foreign)
            if not os.path.exists(nodes_conf):
                undo.append(lambda: os.unlink(nodes_conf))
            self.save_nodes_conf(self.membership.nodes_conf())
            if cfg.logfile and not os.path.isabs(cfg.logfile):
                configure_logging(cfg)
                undo.append(lambda: (os.chdir(old), configure_logging(cfg)))
            aofm = self.aofm
            if aofm.aof is not None and aofm.rewrite is not None:
                # it finishes where it started (its paths are absolute); then one more here
                aofm.rewrite_scheduled = True
            elif aofm.aof is not None and not aofm.start_rewrite():
                raise ClusterConfigError("can't write the AOF there, check the server log")
        except (OSError, ClusterConfigError) as exc:
            for step in reversed(undo):
                step()
            why = exc.strerror if isinstance(exc, OSError) else str(exc)
            raise ConfigSetError(f"ERR Changing directory: {why}") from None
        if _config_lock_fd is not None:
            os.close(_config_lock_fd)
        _config_lock_fd = lock_fd
        log.info("server.dir_changed", old=old, dir=new, aof=self.aofm.aof is not None)

    def foreign_files(self, nodes_conf: str) -> str:
        """Why the working directory holds another node's files ('' if it does not)."""
        try:
            with open(nodes_conf) as f:
                text = f.read()
        except FileNotFoundError:
            text = ""
        if text.strip():
            try:
                owner, _ = parse_nodes_conf(text)
            except NodesConfError:
                return f"{self.cfg.cluster_config_file} there is not readable"
            if owner != self.node_id:
                return (f"{self.cfg.cluster_config_file} there belongs to node "
                        f"{owner.decode()}")
        elif os.path.exists(self.cfg.appendfilename):
            return f"{self.cfg.appendfilename} there belongs to another node"
        return ""

    # ------------------------------------------------------------------ dispatch
    def defer_flush(self, c: Client) -> None:
        deferred = self.deferred
        if not deferred:
            assert self.loop is not None
            self.loop.call_soon(self.flush_deferred)
        deferred.append(c)

    def flush_deferred(self) -> None:
        """Write the replies of the clients unblocked during this loop iteration."""
        clients = self.deferred
        self.deferred = []
        hold = self.aofm.hold
        for c in clients:
            c.in_deferred = False
            if not c.closing and c.transport is not None and not hold(c):
                c.flush()

    def execute(self, c: Client, argv: list[bytes]) -> None:
        """Run one command: QUIT, unknown, arity, auth, OOM, LOADING checks, then the
        handler (checklist section 0 order)."""
        name = argv[0]
        cmd = self.lookup.get(name)
        if cmd is None:
            cmd = self.lookup.get(name.lower())
            if cmd is None:
                if name.lower() == b"quit":
                    if c.reply_mode == REPLY_ON:  # under CLIENT REPLY OFF/SKIP: no +OK
                        c.out.append(OK)
                    c.flush()
                    c.close()
                    return
                self.stat_unknown_commands += 1
                c.out.append(b"-ERR unknown command '" + name.replace(b"\r", b" ")
                             .replace(b"\n", b" ") + b"'\r\n")
                return
        arity = cmd.arity
        n = len(argv)
        if (arity > 0 and n != arity) or n < -arity:
            cmd.rejected += 1
            c.out.append(wrong_arity(cmd.name).resp())
            return
        if not c.authenticated and not cmd.noauth:
            cmd.rejected += 1
            c.out.append(NOAUTH_REPLY)
            return
        node = self.node
        if cmd.denyoom and node.mem_used > node.mem_evict_at and not node.ensure_memory():
            cmd.rejected += 1
            c.out.append(OOM_REPLY)
            return
        if self.loading and not cmd.loading:
            cmd.rejected += 1
            c.out.append(LOADING_REPLY)
            return
        aof = self.aofm.aof
        if aof is not None:
            if aof.last_write_error is not None and (cmd.logs or cmd.name == "ping"):
                # a new job now could only be refused after the fact; PING tells health
                # checks, as in Redis and the original (checklist section 0)
                cmd.rejected += 1
                c.out.append(misconf_reply(aof.last_write_error))
                return
            mark = len(c.out)
            logged = aof.appended
        if self.monitors:
            self.feed_monitors(c, argv)
        c.last_cmd = cmd
        t0 = _perf_ns()
        try:
            cmd.handler(c, argv)
        except CommandError as exc:
            cmd.failed += 1
            c.out.append(exc.resp())
        except Exception as exc:  # never let one command take the server down
            cmd.failed += 1
            log.exception("command.crash", command=cmd.name)
            c.out.append(b"-ERR internal error while running '" + cmd.name.encode()
                         + b"': " + type(exc).__name__.encode() + b"\r\n")
        if (aof is not None and aof.appended != logged and c.waiter is None
                and len(c.out) > mark and self.aofm.aof is aof):
            c.aof_marks.append((mark, len(c.out)))  # its reply waits for the write
        usec = (_perf_ns() - t0) // 1000
        cmd.calls += 1
        cmd.usec += usec
        self.stat_commands += 1
        if usec > self.cfg.slowlog_log_slower_than >= 0:
            self.slowlog_add(argv, usec)
        if usec >= self.latency.min_usec:  # never while latency-monitor-threshold is 0
            self.latency.add_command_sample("fast" in cmd.flags, usec)

    def feed_monitors(self, c: Client, argv: list[bytes]) -> None:
        now = time.time()
        line = b"+%d.%06d [%s] %s\r\n" % (int(now), int((now % 1) * 1e6), c.addr.encode(),
                                          b" ".join(_repr_arg(a) for a in argv))
        for m in list(self.monitors):
            if m is not c and not m.closing:
                m.transport.write(line)

    def slowlog_add(self, argv: list[bytes], usec: int) -> None:
        self.slowlog_id += 1
        args = [a if len(a) <= 128 else a[:128] + b"... (%d more bytes)" % (len(a) - 128)
                for a in argv[:32]]
        if len(argv) > 32:
            args[-1] = b"... (%d more arguments)" % (len(argv) - 31)
        self.slowlog.appendleft([self.slowlog_id, int(time.time()), usec, args])
        while len(self.slowlog) > max(0, self.cfg.slowlog_max_len):
            self.slowlog.pop()

    def log_client_error(self, kind: str, detail: str) -> None:
        """At most one log line per client error class per 10 seconds."""
        now = time.monotonic()
        if now - self.client_errors.get(kind, -1e9) >= 10:
            self.client_errors[kind] = now
            log.warning("client.error", kind=kind, detail=detail)

    # ------------------------------------------------------------------ timers
    def arm_timer(self) -> None:
        """Arm the loop timer for the node's next due time."""
        heap = self.node.wheel._heap
        if not heap:
            return
        key = heap[0]
        if key >= self.wake_key and self.wake_handle is not None:
            return
        if self.wake_handle is not None:
            self.wake_handle.cancel()
        self.wake_key = key
        from disque.timers import RES
        delay = max(0.0, (key * RES - wall_ms()) / 1000)
        assert self.loop is not None
        self.wake_handle = self.loop.call_later(delay, self.on_timer)

    def on_timer(self) -> None:
        self.wake_handle = None
        self.wake_key = 1 << 62
        try:
            self.node.tick(wall_ms())
        except Exception:
            log.exception("timer.crash")
        self.arm_timer()

    def cron(self) -> None:
        """Periodic housekeeping at `hz`."""
        now = time.monotonic()
        self.now_mono = now
        cfg = self.cfg
        self.ops_samples.append((now, self.stat_commands, self.stat_net_input,
                                 self.stat_net_output))
        used = self.node.used_memory()
        if used > self.peak_memory:
            self.peak_memory = used
        if cfg.timeout:
            for c in list(self.clients.values()):
                if (c.waiter is None and not c.monitor
                        and now - c.last_interaction > cfg.timeout):
                    c.close()
        if self.obuf_soft:
            for c in list(self.clients.values()):
                if c.transport is not None and not c.closing:
                    c.check_output_limits(c.transport.get_write_buffer_size())
        self.aofm.cron()
        self.gc_tick()
        self.arm_timer()
        hz = min(max(cfg.hz, 1), 500)
        assert self.loop is not None
        self.cron_handle = self.loop.call_later(1 / hz, self.cron)

    def gc_tick(self) -> None:
        """Garbage-collector policy, run from the cron.

        Every job is a GC-tracked object and a node holds millions of them, none in a
        reference cycle; letting the collector traverse them over and over cost a quarter
        of ADDJOB's time, and a full collection of a million jobs stalls for ~0.3 s. So
        automatic collection is off: each cron tick collects the young objects created since
        the last tick and freezes the survivors (each object is traversed once). Cycles that
        outlive a tick are broken explicitly where they form (client <-> waiter <-> timer,
        see Client.connection_lost); as a safety net a full collection runs every minute
        while the node holds few enough jobs for it to be quick. (Not judged by
        gc.get_freeze_count(): it walks the whole frozen heap, and once a node held 200k
        jobs it did so at every tick, 80% of the node's time with 600k jobs.)
        """
        gc.collect(1)
        now = self.now_mono
        if now - self.gc_full_at >= 60:
            self.gc_full_at = now
            if len(self.node.jobs) < 200_000:
                gc.unfreeze()
                gc.collect()
        gc.freeze()

    def instantaneous(self) -> tuple[int, float, float]:
        """ops/sec and input/output kbps over the recent cron samples."""
        if len(self.ops_samples) < 2:
            return 0, 0.0, 0.0
        t0, c0, i0, o0 = self.ops_samples[0]
        t1, c1, i1, o1 = self.ops_samples[-1]
        dt = max(t1 - t0, 1e-6)
        return int((c1 - c0) / dt), (i1 - i0) / dt / 1024, (o1 - o0) / dt / 1024

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        cfg = self.cfg
        # -LOADING from the first accepted command until the AOF is loaded *and* open for
        # writing: a write accepted earlier would be acknowledged and never logged.
        self.loading = bool(cfg.appendonly or cfg.aof_enqueue_jobs_once)
        if cfg.http_port:
            # Before the RESP listeners: once the node answers, its HTTP side is up too (a
            # scrape right after the first PING found it still starting on a loaded machine).
            self.http = new_http_side(self)
            await self.http.start(cfg.bind, cfg.http_port, cfg.tcp_backlog)
        if cfg.port:
            for addr in cfg.bind:
                srv = await self.loop.create_server(lambda: Client(self), addr, cfg.port,
                                                    backlog=cfg.tcp_backlog, reuse_address=True)
                self.listeners.append(srv)
        if cfg.unixsocket:
            try:
                os.unlink(cfg.unixsocket)
            except FileNotFoundError:
                pass
            srv = await self.loop.create_unix_server(lambda: Client(self), cfg.unixsocket,
                                                     backlog=cfg.tcp_backlog)
            if cfg.unixsocketperm:
                os.chmod(cfg.unixsocket, cfg.unixsocketperm)
            self.listeners.append(srv)
            self.own_files.append(os.path.abspath(cfg.unixsocket))
        if cfg.port:
            await self.bus.start(cfg.bind, cfg.port + cfg.cluster_port_offset, cfg.tcp_backlog)
        self.cron()
        self.bus_cron()
        await self.aofm.load_at_start()

    def persistence_info(self) -> list[tuple[str, Any]]:
        return self.aofm.info()

    def prepare_shutdown(self, mode: bytes) -> bool:
        return self.aofm.prepare_shutdown(mode)

    def shutdown(self, code: int = 0, exit_prepared: bool = False) -> None:
        """Stop serving and exit the loop (SHUTDOWN, SIGTERM, SIGINT); the AOF is flushed
        and fsynced first (SHUTDOWN has already done that: exit_prepared)."""
        if self.shutting_down:
            return
        if not exit_prepared and not self.prepare_shutdown(b""):
            log.error("server.shutdown_aof_failed")
        self.shutting_down = True
        self.exit_code = code
        log.info("server.shutdown", reason="requested", pid=os.getpid())
        for srv in self.listeners:
            srv.close()
        if self.http is not None:
            self.http.close_listeners()
        self.bus.close()
        for c in list(self.clients.values()):
            c.closing = True
            if c.transport is not None:
                c.transport.abort()
        for path in self.own_files:  # pidfile, unix socket: removed as redis-server does
            try:
                os.unlink(path)
            except OSError:
                pass
        if not self.stopped.done():
            self.stopped.set_result(None)

    async def serve(self, started: Callable[[], None]) -> bool:
        """Start, call `started`, and serve until shutdown(); False when shutdown came while
        starting. One run of the loop from start to exit: uvloop hears signals only while it
        runs, so a SIGTERM between a run that starts and a run that serves was lost."""
        starting = asyncio.ensure_future(self.start())
        await asyncio.wait((starting, self.stopped), return_when=asyncio.FIRST_COMPLETED)
        if not starting.done():
            starting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await starting
            return False
        starting.result()  # a failed listen or AOF load raises here
        started()
        await self.stopped
        return True

    def on_job_message(self, link: Any, msg: Any) -> None:
        """A job message arrived on the bus: only members of the cluster are heard."""
        sender = msg.header.sender
        n = self.membership.get(sender)
        if n is None or n.bits & 0x08:  # unknown or still in handshake
            return
        self.node.on_message(sender, msg)

    def schedule_route(self) -> None:
        if not self.route_scheduled:
            self.route_scheduled = True
            assert self.loop is not None
            self.loop.call_soon(self.route_out)

    def route_out(self) -> None:
        """Hand the node's bus messages to the links, once per loop iteration. The AOF is
        written (and fsynced under `always`) first: a GOTJOB must not confirm a copy that
        is not on disk yet."""
        self.route_scheduled = False
        out = self.node.out
        if not out:
            return
        self.node.out = []
        if not self.aofm.flush_before_send():
            # what they would confirm is not on disk: the sender tries another node
            out = [(n, m) for n, m in out if m.__class__ not in CONFIRMS_COPY]
        get = self.membership.get
        for node_id, msg in out:
            n = get(node_id)
            if n is not None and n.out_link is not None:
                n.out_link.send(msg)
        # This already runs at the end of the loop iteration: write now rather than one
        # more loop pass later (a replication round trip crosses this twice).
        self.bus.apply(flush_now=True)

    def bus_cron(self) -> None:
        """The cluster's 100 ms tick (failure detection, pings, handshakes)."""
        try:
            self.bus.tick()
        except Exception:
            log.exception("bus.tick_crash")
        assert self.loop is not None
        self.bus_handle = self.loop.call_later(0.1, self.bus_cron)

    def save_nodes_conf(self, text: str) -> None:
        """Write nodes.conf atomically (temp file, fsync, rename, fsync of the directory)."""
        path = os.path.abspath(self.cfg.cluster_config_file)
        tmp = f"{path}.tmp-{os.getpid()}"
        try:
            with open(tmp, "w") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
            os.rename(tmp, path)
            fd = os.open(os.path.dirname(path), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError as exc:
            log.error("cluster.config_save_failed", path=path, error=exc.strerror)
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise

    def cluster_reset(self, hard: bool) -> None:
        """CLUSTER RESET: forget other nodes, delete all jobs and queues; HARD also takes a
        new node ID."""
        self.node.flushall()
        new_id = new_node_id(self.membership.rng) if hard else None
        self.membership.reset(hard, new_id)
        if hard:
            self.node_id = self.membership.myself
            self.node.set_myself(self.node_id)
        self.bus.apply()

    def rusage(self) -> tuple[resource.struct_rusage, resource.struct_rusage]:
        return (resource.getrusage(resource.RUSAGE_SELF),
                resource.getrusage(resource.RUSAGE_CHILDREN))


_config_lock_fd: int | None = None


def new_http_side(server: Server) -> Any:
    """The HTTP side, imported only when http-port is set (aiohttp costs start-up time)."""
    from disque.http import HttpSide, NodeView

    assert server.loop is not None
    return HttpSide(NodeView(server), server.loop)


class ClusterConfigError(Exception):
    pass


def lock_cluster_config(cfg: Config) -> int:
    """Lock nodes.conf of the working directory (a side file: nodes.conf itself is replaced
    by rename on every save); the lock's fd. OSError if the lock file cannot be created."""
    lock_fd = os.open(os.path.abspath(cfg.cluster_config_file) + ".lock",
                      os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(lock_fd)
        raise ClusterConfigError(
            f"Sorry, the cluster configuration file {cfg.cluster_config_file} is already "
            f"used by a different Disque node.") from None
    return lock_fd


def load_cluster_config(cfg: Config, rng: random.Random) -> tuple[bytes, list[Any], bool]:
    """Read nodes.conf (creating the identity on first start) and lock it for the life of
    the process, so two servers never share one identity. Returns (my id, other entries,
    whether the file is new)."""
    global _config_lock_fd
    path = os.path.abspath(cfg.cluster_config_file)
    _config_lock_fd = lock_cluster_config(cfg)
    try:
        with open(path) as f:
            text = f.read()
    except FileNotFoundError:
        text = ""
    if not text.strip():
        return new_node_id(rng), [], True
    try:
        myself, entries = parse_nodes_conf(text)
    except NodesConfError as exc:
        raise ClusterConfigError(f"Unrecoverable error: {exc} ({path})") from None
    return myself, entries, False


def _repr_arg(a: bytes) -> bytes:
    """Quote an argument as Redis's MONITOR does (sdscatrepr)."""
    out = bytearray(b'"')
    for ch in a:
        if ch in (34, 92):
            out += b"\\" + bytes([ch])
        elif ch == 10:
            out += b"\\n"
        elif ch == 13:
            out += b"\\r"
        elif ch == 9:
            out += b"\\t"
        elif 32 <= ch < 127:
            out.append(ch)
        else:
            out += b"\\x%02x" % ch
    out += b'"'
    return bytes(out)


# verbose shows what debug shows (client connections and closes), as Redis's verbose level
# adds its connection lines to notice
_debug_log = [False]  # debug events are on (configure_logging sets it)
_LEVELS = {"debug": logging.DEBUG, "verbose": logging.DEBUG, "notice": logging.INFO,
           "warning": logging.WARNING}


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


class _SyslogSender(logging.handlers.SysLogHandler):
    """The standard library's syslog client on the configured socket (syslog-socket), in
    glibc's shape: `<PRI>ident[pid]: line`. Like openlog/syslog, a daemon that is not there
    (yet) costs nothing: the socket is retried on the next line and the line dropped."""

    append_nul = False

    def __init__(self, ident: str, facility: str, path: str) -> None:
        super().__init__(address=path, facility=facility)
        self.base_ident = ident

    def send_line(self, level: str, line: str) -> None:
        self.ident = f"{self.base_ident}[{os.getpid()}]: "  # the pid after daemonize()
        record = logging.LogRecord("disque", logging.INFO, "", 0, line, None, None)
        record.levelname = level.upper()
        self.emit(record)

    def handleError(self, record: logging.LogRecord) -> None:  # noqa: N802 - stdlib's name
        """No syslog daemon listening: drop the line, as syslog(3) does."""


def _also_to_syslog(render: Any, sender: _SyslogSender) -> Any:
    """Wrap the final renderer: every rendered line also goes to syslog (syslog-enabled)."""
    def processor(logger: Any, method: str, event_dict: Any) -> Any:
        line = render(logger, method, event_dict)
        sender.send_line(event_dict.get("level", "info"),
                         line if isinstance(line, str) else str(line))
        return line
    return processor


def configure_logging(cfg: Config) -> None:
    """structlog with key-value events: console by default, JSON with log-format json; also to
    syslog with syslog-enabled yes (syslog-ident, syslog-facility)."""
    level = _LEVELS.get(cfg.loglevel, logging.INFO)
    _debug_log[0] = level <= logging.DEBUG
    stream: Any = sys.stdout
    if cfg.logfile:
        stream = open(cfg.logfile, "a", buffering=1)  # noqa: SIM115 - lives with the process
    renderer = renderer_for(cfg.log_format)
    if cfg.syslog_enabled:
        sender = _SyslogSender(cfg.syslog_ident, cfg.syslog_facility, cfg.syslog_socket)
        renderer = _also_to_syslog(renderer, sender)
    configure_structlog(level, renderer, stream)


_READY = b"\0disque-server-ready\n"


def daemonize() -> None:
    """Detach as a classic daemon: fork, new session, fork again, stdio to /dev/null.

    Until daemon_ready(), the daemon's stderr is a pipe to the starting process, which waits
    and exits 0 once the node serves, or prints what went wrong and exits 1 (a port in use,
    a bad AOF...): tooling that starts daemonized nodes sees a failed start."""
    r, w = os.pipe()
    if os.fork():
        os.close(w)
        os._exit(_await_daemon(r))
    os.close(r)
    os.setsid()
    if os.fork():
        os._exit(0)
    fd = os.open(os.devnull, os.O_RDWR)
    os.dup2(fd, 0)
    os.dup2(fd, 1)
    os.dup2(w, 2)
    for extra in {fd, w} - {0, 1, 2}:
        os.close(extra)


def _await_daemon(r: int) -> int:
    data = bytearray()
    while chunk := os.read(r, 65536):
        data += chunk
    ready = data.endswith(_READY)
    if ready:
        del data[-len(_READY):]
    elif not data:
        data += b"disque-server: the daemon exited during start-up (see its log)\n"
    if data:
        os.write(2, bytes(data))
    return 0 if ready else 1


def daemon_ready() -> None:
    """The daemonized node serves: release the starting process, stderr to /dev/null."""
    sys.stderr.flush()
    os.write(2, _READY)
    fd = os.open(os.devnull, os.O_RDWR)
    os.dup2(fd, 2)
    os.close(fd)


USAGE = """Usage: disque-server [/path/to/disque.conf] [options]
       disque-server - (read config from stdin)
       disque-server --version
       disque-server --help

Any directive of the config file can be given as an option, overriding the file:
       disque-server conf/disque.conf --port 7712 --dir /tmp/n2 --loglevel verbose
"""


# Bus messages that tell the sender a copy is held here: not sent when its record could
# not be written to the AOF.
CONFIRMS_COPY = (GotJob, GotJobBatch)

RESERVED_FDS = 32  # listeners, bus links, the AOF, logs: descriptors that are not clients


def adjust_open_files_limit(maxclients: int) -> tuple[int, int, str]:
    """Make room for `maxclients` clients in RLIMIT_NOFILE, as Redis does at startup.

    Raises the soft limit (and the hard one when allowed) to maxclients + RESERVED_FDS if it
    is lower. Returns (how many clients fit now, the limit in force, why a raise failed or
    ""). Without this a default `ulimit -n` of 1024 made the 1000th connection fail at
    accept() with a reset instead of the max-clients error.
    """
    need = maxclients + RESERVED_FDS
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= need:
        return maxclients, soft, ""
    if hard == resource.RLIM_INFINITY or hard >= need:
        attempts = [(need, hard)]
    else:  # raising the hard limit needs privileges; else settle for the hard limit
        attempts = [(need, need), (hard, hard)]
    why = ""
    for limits in attempts:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, limits)
            break
        except (ValueError, OverflowError, OSError) as exc:
            why = str(exc)
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft == resource.RLIM_INFINITY or soft >= need:
        return maxclients, soft, ""
    return max(0, soft - RESERVED_FDS), soft, why or "limit reached"


def main(argv: list[str] | None = None) -> int:
    """Console entry point: `disque-server [CONFIG_FILE] [--directive value ...]`."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ("-v", "--version"):
        print(f"disque-py server v={__version__} python={sys.version.split()[0]}")
        return 0
    if argv and argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0
    try:
        cfg = load_config(argv, commands=[n.decode() for n in load_all()])
    except ConfigError as exc:
        print(str(exc), file=sys.stderr)
        return 1
    if not cfg.port and not cfg.unixsocket:
        # as redis-server: a node nobody can reach would run until killed
        print("Configured to not listen anywhere, exiting.", file=sys.stderr)
        return 1
    try:
        os.makedirs(cfg.dir, exist_ok=True)
        os.chdir(cfg.dir)
    except OSError as exc:
        print(f"Can't chdir to '{cfg.dir}': {exc.strerror}", file=sys.stderr)
        return 1
    try:
        # before daemonize(): once detached, stderr is /dev/null and the exit status is lost
        configure_logging(cfg)
    except OSError as exc:
        print(str(ConfigError(cfg.config_file or "command line",
                              f"Can't open the log file '{cfg.logfile}': {exc.strerror}")),
              file=sys.stderr)
        return 1
    if cfg.daemonize:
        daemonize()
    fits, limit, why = adjust_open_files_limit(cfg.maxclients)
    if fits < cfg.maxclients:
        if fits < 1:
            log.error("server.ulimit_too_low", open_files=limit,
                      hint="increase 'ulimit -n' to start the server")
            print(f"Your current 'ulimit -n' of {limit} is not enough for the server to start.",
                  file=sys.stderr)
            return 1
        log.warning("server.maxclients_reduced", requested=cfg.maxclients, maxclients=fits,
                    open_files=limit, error=why,
                    hint="increase 'ulimit -n' if you need more clients")
        cfg.maxclients = fits
    try:
        import uvloop
        uvloop.install() if sys.version_info < (3, 12) else None
        loop = uvloop.new_event_loop()
    except ImportError:  # pragma: no cover - uvloop is a hard dependency
        loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        server = Server(cfg)
    except ClusterConfigError as exc:
        print(str(exc), file=sys.stderr)
        log.error("cluster.config_error", error=str(exc))
        return 1
    gc.disable()  # see Server.gc_tick
    gc.freeze()
    # Before start(): the listener answers (even -LOADING) while the AOF loads, so a client
    # or a test harness may already send SIGTERM.
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, server.shutdown)
    # Over a file-size limit (RLIMIT_FSIZE) an AOF write must fail with EFBIG, which the AOF
    # handles as a full disk, not kill the process (CPython ignores it too; say it here).
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)

    def started() -> None:
        if cfg.pidfile:
            try:
                with open(cfg.pidfile, "w") as f:
                    f.write(f"{os.getpid()}\n")
                server.own_files.append(os.path.abspath(cfg.pidfile))
            except OSError as exc:
                log.warning("server.pidfile_failed", path=cfg.pidfile, error=str(exc))
        log.info("server.start", version=__version__, port=cfg.port, bind=" ".join(cfg.bind),
                 pid=os.getpid(), config_file=cfg.config_file or "",
                 node_id=server.node_id.decode(), dir=os.getcwd())
        if cfg.daemonize:
            daemon_ready()

    try:
        served = loop.run_until_complete(server.serve(started))
    except OSError as exc:
        log.error("server.listen_failed", port=cfg.port, error=str(exc))
        print(f"Could not listen: {exc}", file=sys.stderr)
        return 1
    except AofLoadError as exc:
        log.error("aof.load_failed", error=str(exc))
        print(str(exc), file=sys.stderr)
        return 1
    finally:
        loop.run_until_complete(asyncio.sleep(0))
        loop.close()
    if not served:
        log.info("server.exit", code=server.exit_code, during="startup")
        return server.exit_code
    log.info("server.exit", code=server.exit_code)
    return server.exit_code


__all__ = ["Client", "Server", "main", "TABLE"]
