"""Server wiring: config -> event loop -> listeners -> node; startup, shutdown, signals.

One uvloop event loop per process. Each RESP connection is a `disque.connection.Client`;
`disque.dispatch.Dispatcher` runs its commands; `disque.process.main` sets the process up and
runs a `Server`. The server builds the node, the membership, the bus, the AOF and the HTTP
side from the config, keeps the list of clients and the process-wide statistics, and moves
time and messages between the asyncio world and the sans-I/O node:

- timers: the node's timer wheel says when it next needs to run and a single loop timer
  is armed for that instant (disque.iteration); a cron at `hz` does the periodic
  housekeeping (idle clients, output limits, instantaneous stats, the collector policy);
- bus routing: the node's outgoing messages are handed to the links once per loop
  iteration, after the AOF write that they may confirm (disque.iteration, compiled with
  the hot path: it runs several times per job);
- config hooks: CONFIG SET of a directive that lives in a subsystem reaches it here.

Everything below this module is sans-I/O: the node gets its clock from here.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import resource
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import structlog

from disque import config_hooks
from disque.aof.manager import AofManager
from disque.cluster.bus import Bus
from disque.cluster.membership import Membership, new_node_id
from disque.cluster.messages import INCARNATION_BITS
from disque.commands import TABLE, load_all
from disque.config import Config, on_set, specific_binds
from disque.connection import Client, Shared
from disque.cron import Cron
from disque.dispatch import Dispatcher
from disque.iteration import Iteration, wall_ms
from disque.latency import LatencyMonitor
from disque.node import Node
from disque.process import (
    load_cluster_config,
    main,
)
from disque.tls import TlsListener

if TYPE_CHECKING:
    from disque.http import HttpSide

log = structlog.get_logger("disque")


_perf_ns = time.perf_counter_ns


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
            myself, cfg.port or cfg.tls_port, clock=wall_ms, rng=rng, node_timeout=cfg.cluster_node_timeout,
            blacklist_ttl=cfg.cluster_forget_ttl * 1000,
            bus_port_offset=cfg.cluster_port_offset,
            announce_ip=cfg.cluster_announce_ip.encode() or None,
            announce_port=cfg.cluster_announce_port or None, my_ip=bind_ip.encode(),
            # a new one at every start: peers re-replicate the copies we may have lost
            incarnation=rng.getrandbits(INCARNATION_BITS) or 1,
            # for HELLO on TLS connections (port 0: the node's port is its TLS port already)
            tls_port=cfg.tls_port if cfg.port else 0,
            # peers keep us on their jobs' lists after a restart: we may reload copies
            persistent=cfg.appendonly)
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
                         queue_idle_timeout=cfg.queue_idle_timeout, latency=self.latency,
                         membership=self.membership)
        self.node.rereplication.rate = cfg.rereplicate_rate
        self.node.repair.rate = cfg.repair_rate
        self.node.repair.grace = cfg.repair_grace
        self.apply_deadletter_defaults()
        self.bus = Bus(self.membership, password=cfg.cluster_password,
                       save_config=self.save_nodes_conf,
                       link_changed=self.node.link_changed)
        if fresh:
            self.save_nodes_conf(self.membership.nodes_conf())
        self.bus_handle: asyncio.TimerHandle | None = None
        self.run_id = os.urandom(20).hex()
        self.clients: dict[int, Client] = {}
        self.next_client_id = 0
        self.pause_handle: asyncio.TimerHandle | None = None
        self.listeners: list[asyncio.AbstractServer] = []
        self.http: HttpSide | None = None  # while http-port is set
        self.tls = TlsListener(self)  # the tls-port listener (disque.tls), if tls-port is set
        self.start_time = time.time()
        self.shutting_down = False
        self.stopped: asyncio.Future[None] = asyncio.get_event_loop().create_future()
        self.exit_code = 0
        # absolute paths of the pidfile and unix socket made at start (whatever dir is now)
        self.own_files: list[str] = []
        # stats
        self.stat_connections = 0
        self.stat_rejected = 0
        self.peak_memory = 0
        self.client_errors: dict[str, float] = {}
        self.cron = Cron(self)
        config_hooks.install(self)
        config_hooks.apply_overflow(self, cfg)  # before the AOF loads: it may overflow
        self.aofm = AofManager(self)
        # after the AOF manager's hook, which may refuse to turn the AOF on
        on_set(cfg, "appendonly", lambda c, _: self.membership.set_persistent(c.appendonly))
        # routing, delivery, deferred replies, the loop timer (compiled: per job)
        self.iteration = Iteration(self.node, self.bus, self.membership, self.aofm)
        self.node.on_out = self.iteration.schedule_route
        self.bus.deliver_job_message = self.iteration.on_job_message
        self.bus.prefetch = self.iteration.prefetch
        self.dispatch = Dispatcher(cfg, self.node, self.latency, self.aofm, load_all())
        # what the clients read and count per request (compiled with them)
        self.shared = Shared(self.dispatch, self.iteration, self.aofm)
        self.apply_limits()

    @property
    def loading(self) -> bool:
        """The AOF is loading: commands without the `loading` flag answer -LOADING."""
        return self.dispatch.loading

    @loading.setter
    def loading(self, value: bool) -> None:
        self.dispatch.loading = value

    @property
    def stat_commands(self) -> int:
        return self.dispatch.stat_commands

    # ------------------------------------------------------------------ the commands' API
    def reset_stats(self) -> None:
        """CONFIG RESETSTAT: command statistics, connection and traffic counters, the
        instantaneous samples and the memory peak start again."""
        for cmd in self.dispatch.table.values():
            cmd.calls = cmd.usec = cmd.failed = cmd.rejected = 0
        self.stat_connections = self.stat_rejected = 0
        self.dispatch.stat_commands = self.dispatch.stat_unknown_commands = 0
        self.shared.stat_net_input = self.shared.stat_net_output = 0
        self.cron.ops_samples.clear()
        self.peak_memory = self.node.used_memory()

    def pause_clients(self, ms: int) -> None:
        """CLIENT PAUSE: stop reading from every client, those that connect meanwhile
        included, until `ms` milliseconds from now; replies still flow. A pause that would
        end earlier than the one in force does not shorten it (Redis)."""
        end = time.monotonic() + ms / 1000
        if end <= self.shared.clients_paused_until:
            return
        self.shared.clients_paused_until = end
        for x in self.clients.values():
            if not x.closing and x.transport is not None:
                x.transport.pause_reading()
        if self.pause_handle is not None:
            self.pause_handle.cancel()
        assert self.loop is not None
        self.pause_handle = self.loop.call_later(ms / 1000, self.resume_clients)

    def resume_clients(self) -> None:
        """CLIENT PAUSE is over: every client reads again and runs what it received."""
        self.shared.clients_paused_until = 0.0
        self.pause_handle = None
        for x in list(self.clients.values()):
            x.end_pause()

    # ------------------------------------------------------------------ config hooks
    def apply_deadletter_defaults(self, *_: object) -> None:
        cfg = self.cfg
        self.node.set_deadletter_defaults(cfg.default_max_deliveries, cfg.default_max_nacks,
                                          cfg.deadletter_queue.encode("utf-8", "surrogateescape"))
        self.node.redrive_rate = cfg.redrive_rate

    def apply_limits(self) -> None:
        hard, soft, seconds = self.cfg.client_output_buffer_limit
        shared = self.shared
        shared.obuf_hard, shared.obuf_soft, shared.obuf_soft_seconds = hard, soft, seconds

    # ------------------------------------------------------------------ dispatch
    def log_client_error(self, kind: str, detail: str) -> None:
        """At most one log line per client error class per 10 seconds."""
        now = time.monotonic()
        if now - self.client_errors.get(kind, -1e9) >= 10:
            self.client_errors[kind] = now
            log.warning("client.error", kind=kind, detail=detail)

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        self.loop = self.iteration.loop = asyncio.get_running_loop()
        cfg = self.cfg
        # What the AOF does at start-up follows the configuration the node started with.
        # With nothing to load, the commands of a client that connects early are served
        # before this method ends, and a CONFIG SET appendonly or aof-enqueue-jobs-once
        # among them is for the running node or for the next start, not for this one.
        self.aofm.begin_start(cfg.appendonly, cfg.aof_enqueue_jobs_once)
        if cfg.tls_port or cfg.tls_cluster or cfg.tls_http:
            self.tls.load(cfg)  # (process.main checked the files: a TlsConfigError is rare)
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
        if cfg.tls_port:
            await self.tls.start(cfg.bind, cfg.tls_port, cfg.tcp_backlog)
        if cfg.tls_cluster:
            self.bus.tls_listen = self.tls.start_bus
            self.bus.tls_dial = self.tls.bus_dial_context
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
        if cfg.port or cfg.tls_port:  # (TLS only, port 0: the bus port is tls-port + offset)
            await self.bus.start(cfg.bind, (cfg.port or cfg.tls_port) + cfg.cluster_port_offset,
                                 cfg.tcp_backlog)
        self.cron.run()
        self.bus_cron()
        await self.aofm.load_at_start()

    def persistence_info(self) -> list[tuple[str, Any]]:
        return self.aofm.info()

    def prepare_shutdown(self, mode: bytes) -> bool:
        return self.aofm.prepare_shutdown(mode)

    def remove_own_files(self) -> None:
        """The pidfile and unix socket this process made: removed on the way out, as
        redis-server does."""
        for path in self.own_files:
            try:
                os.unlink(path)
            except OSError:
                pass
        self.own_files.clear()

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
        self.tls.close()
        if self.http is not None:
            self.http.close_listeners()
        self.bus.close()
        for c in list(self.clients.values()):
            c.closing = True
            if c.transport is not None:
                c.transport.abort()
        self.remove_own_files()
        if not self.stopped.done():
            self.stopped.set_result(None)

    async def serve(self, started: Callable[[], None],
                    first: Callable[[], None] | None = None) -> bool:
        """Call `first` (the pidfile), start, call `started`, and serve until shutdown();
        False when shutdown came while starting. One run of the loop from start to exit:
        uvloop hears signals only while it runs, so a SIGTERM between a run that starts and
        a run that serves was lost."""
        if first is not None:
            first()
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


def new_http_side(server: Server) -> HttpSide:
    """The HTTP side, imported only when http-port is set (aiohttp costs start-up time)."""
    from disque.http import HttpSide, NodeView

    assert server.loop is not None
    return HttpSide(NodeView(server), server.loop, server.tls if server.cfg.tls_http else None)



__all__ = ["Client", "Server", "main", "TABLE"]
