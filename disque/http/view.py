"""NodeView: the one door between the HTTP side and the node.

The HTTP side (metrics collector, JSON API) never touches the server, the node, the
membership or the AOF directly: it asks this object. Reads are plain attribute walks done at
request / scrape time (nothing is added to the RESP hot path). Everything that changes state,
and every read that a command already formats (SHOW, JSCAN, QPEEK), goes through
`command()`, which runs the node's own command code exactly as a RESP client would: the same
argument parsing, error texts, MONITOR feed and command statistics. There is no second
implementation of any command here.

Invariant: `command()` only accepts the commands in `ALLOWED` (none of them can block or
close the connection), so the internal client never waits on anything.
"""

from __future__ import annotations

import asyncio
import heapq
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import hiredis

from disque.cluster.nodes import flag_names
from disque.commands import Blocker, Caller, Command
from disque.commands.admin import password_bytes
from disque.commands.info import info_sections
from disque.commands.queues import queue_stats
from disque.jobs.job import STATE_NAMES
from disque.protocol.reply import NULL_ARRAY2, NULL_BULK2
from disque.protocol.values import decode as _text
from disque.queues.queue import Queue

if TYPE_CHECKING:
    from disque.server import Server

# The commands the HTTP side may run: the dashboard's reads and its actions.
ALLOWED = frozenset({
    b"PAUSE", b"NACK", b"ACKJOB", b"FASTACK", b"DELJOB", b"ENQUEUE", b"DEQUEUE", b"QPEEK",
    b"JSCAN", b"SHOW", b"QSTAT", b"QLEN", b"QSCAN", b"INFO", b"HELLO", b"PING",
})

CENSUS_SLICE = 5_000  # jobs counted between two yields to the event loop (~1 ms)
# Walking a registry of millions of jobs costs the loop ~0.1 s per million. So that however
# many scrapers and dashboards poll, the census costs a loaded node at most ~1% of its time:
# - a census is reused while it is younger than CENSUS_REUSE times the loop time its walk
#   used (on a small registry every request counts afresh);
# - once a census exists, the next walk runs in the background, resting after each slice
#   long enough to use at most CENSUS_DUTY of the loop, and requests meanwhile get the
#   last census (its age is disque_census_age_seconds). Only the first walk is awaited.
# (A dashboard polling every second cost a loaded node 3-6% with a walk every 15 s.)
CENSUS_REUSE = 100
CENSUS_DUTY = 0.01


class CommandFailed(Exception):
    """The command answered an error (its text, as a RESP client would read it)."""


class InternalClient:
    """What the dispatcher and the command handlers need of a client (`Caller`), and
    nothing more: replies are collected in `out` (RESP2) and parsed by the caller."""

    __slots__ = ("server", "node", "id", "out", "proto", "null_bulk", "null_array",
                 "authenticated", "name", "addr", "laddr", "waiter", "closing", "monitor",
                 "last_cmd", "reply_mode", "lib_name", "lib_ver", "transport", "ctime",
                 "last_interaction", "aof_marks")

    def __init__(self, server: Server, addr: str) -> None:
        self.server = server
        self.node = server.node
        self.id = 0
        self.out: list[bytes] = []
        self.proto = 2
        self.null_bulk = NULL_BULK2
        self.null_array = NULL_ARRAY2
        self.authenticated = True  # the HTTP side checked its own password first
        self.name = b"http"
        self.addr = addr
        self.laddr = ""
        self.waiter: Blocker | None = None
        self.closing = False
        self.monitor = False
        self.last_cmd: Command | None = None
        self.reply_mode = 0
        self.lib_name = b""
        self.lib_ver = b""
        self.transport: asyncio.Transport | None = None
        self.ctime = self.last_interaction = time.monotonic()
        self.aof_marks: list[tuple[int, int]] = []  # set when the command logged to the AOF

    def block(self, waiter: Blocker) -> None:  # pragma: no cover - ALLOWED never block
        raise RuntimeError("the HTTP side runs no blocking command")

    # (None of the ALLOWED commands blocks, closes its connection or lists clients: these
    # only complete the door.)
    def unblocked(self, reply: bytes) -> None:  # pragma: no cover
        self.out.append(reply)

    def set_proto(self, proto: int) -> None:  # pragma: no cover - HELLO 3 is not allowed
        raise RuntimeError("the HTTP side reads RESP2")

    def flush(self) -> None:
        """Replies stay in `out`, for the caller."""

    def close(self) -> None:  # pragma: no cover
        self.closing = True

    def close_after_reply(self) -> None:  # pragma: no cover
        self.closing = True

    def forget_marks(self, mark: int) -> None:  # pragma: no cover
        marks = self.aof_marks
        while marks and marks[-1][0] >= mark:
            marks.pop()

    def query_buffer(self) -> int:  # pragma: no cover
        return 0

    def query_limit(self) -> int:  # pragma: no cover
        return 0

    def output_buffer(self) -> tuple[int, int, int]:  # pragma: no cover
        return 0, 0, sum(map(len, self.out))


def pairs(flat: list[Any]) -> dict[str, Any]:
    """A flat RESP2 [name, value, ...] reply (SHOW, QSTAT, JSCAN REPLY ALL) as a dict."""
    return {_text(flat[i]): _text(flat[i + 1]) for i in range(0, len(flat) - 1, 2)}


class Census:
    """Jobs counted by state, and per queue the active (delivered, not acked) ones."""

    __slots__ = ("by_state", "active_by_queue", "taken_at", "cost", "slices")

    def __init__(self) -> None:
        self.by_state = dict.fromkeys((s.decode() for s in STATE_NAMES), 0)
        self.active_by_queue: dict[bytes, int] = {}
        self.taken_at = 0.0  # the view's clock when the walk ended
        self.cost = 0.0  # seconds of loop time the walk used (its rests not included)
        self.slices = 0  # how many slices it took


class QueueTable:
    """The busiest queues' fields, how many queues there are, totals over all of them."""

    __slots__ = ("queues", "count", "totals")

    def __init__(self) -> None:
        self.queues: list[dict[str, Any]] = []
        self.count = 0
        self.totals = dict.fromkeys(("added", "acked", "nacked", "requeued", "jobs-in",
                                     "jobs-out"), 0)


class NodeView:
    """Read-only facade over the running server, plus the command door. `clock` (monotonic
    seconds) and `sleep` pace the census; tests pass their own to check the pacing without
    waiting for it."""

    def __init__(self, server: Server, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
        self._server = server
        self._clock = clock
        self._sleep = sleep
        self._census: Census | None = None
        self._census_task: asyncio.Task[Census] | None = None

    # ------------------------------------------------------------------ configuration
    @property
    def http_password(self) -> str:
        """http-password, else requirepass ('' = open)."""
        cfg = self._server.cfg
        return cfg.http_password or cfg.requirepass

    @property
    def resp_password(self) -> str:
        """requirepass: what this node gives its peers' RESP ports (a cluster shares it)."""
        return self._server.cfg.requirepass

    def password_matches(self, given: str) -> bool:
        import hmac
        want = password_bytes(self.http_password)
        return hmac.compare_digest(password_bytes(given), want)

    @property
    def maxmemory(self) -> int:
        return self._server.cfg.maxmemory

    @property
    def metrics_max_queues(self) -> int:
        return self._server.cfg.metrics_max_queues

    @property
    def idle_timeout(self) -> float:
        """http-idle-timeout: seconds a connection may take to send a request header."""
        return float(self._server.cfg.http_idle_timeout)

    @property
    def body_timeout(self) -> float:
        """http-body-timeout: seconds a request body may take to arrive."""
        return float(self._server.cfg.http_body_timeout)

    # ------------------------------------------------------------------ the command door
    def command(self, *args: str | bytes, addr: str = "http") -> Any:
        """Run one command through the node's dispatcher; its reply, decoded by hiredis.
        Raises CommandFailed with the error text when the command answers an error."""
        argv = [a if isinstance(a, bytes) else a.encode("utf-8", "surrogateescape")
                for a in args]
        if not argv or argv[0].upper() not in ALLOWED:
            raise CommandFailed(f"ERR command not available over HTTP: {_text(argv[:1])}")
        c: Caller = InternalClient(self._server, addr)  # (mypy: it is a Caller)
        self._server.dispatch.execute(c, argv)
        if c.aof_marks and not self._server.aofm.write_now():
            # an ACK or a deletion whose record could not be written: not confirmed
            raise CommandFailed(self._server.aofm.misconf_text())
        reader = hiredis.Reader()
        reader.feed(b"".join(c.out))
        reply = reader.gets()
        if isinstance(reply, hiredis.ReplyError):
            raise CommandFailed(str(reply))
        if self._server.node.out:
            self._server.iteration.schedule_route()  # bus messages the command produced (NACK, ACK...)
        return reply

    # ------------------------------------------------------------------ node
    def info(self) -> dict[str, dict[str, Any]]:
        """INFO's sections, from the function that renders INFO (the same numbers)."""
        return {name: dict(fields) for name, fields in info_sections(self._server).items()}

    def myself(self) -> dict[str, Any]:
        s = self._server
        me = s.membership.me
        return {"id": s.node_id.decode(), "ip": me.ip.decode(), "port": s.cfg.port,
                "http_port": s.cfg.http_port}

    def commands(self) -> list[tuple[str, int, int, int, int]]:
        """(name, calls, usec, failed, rejected) per command that ran at least once."""
        out = []
        for cmd in self._server.dispatch.table.values():
            calls = cmd.calls
            failed = cmd.failed
            rejected = cmd.rejected
            if calls or failed or rejected:
                out.append((cmd.name, calls, cmd.usec, failed, rejected))
        return out

    def unknown_commands(self) -> int:
        return self._server.dispatch.stat_unknown_commands

    def aof(self) -> dict[str, Any]:
        """AOF size, how long the oldest write not yet fsynced has waited, whether writing
        it fails (a full disk) and how many attempts failed."""
        aof = self._server.aofm.aof
        if aof is None:
            return {"enabled": False, "size": 0, "fsync_lag": 0.0, "write_ok": True,
                    "write_errors": 0}
        lag = time.monotonic() - aof.dirty_since if aof.dirty else 0.0
        return {"enabled": True, "size": aof.current_size, "fsync_lag": max(0.0, lag),
                "write_ok": aof.last_write_error is None, "write_errors": aof.write_errors}

    # ------------------------------------------------------------------ cluster
    def cluster_nodes(self) -> list[dict[str, Any]]:
        """Every known node: address, flags, HELLO priority, link state."""
        out = []
        for n in self._server.membership.nodes():
            names = flag_names(n.bits)
            me = "myself" in names
            out.append({
                "id": n.id.decode(), "ip": n.ip.decode(), "port": n.port,
                "flags": names or ["noflags"], "priority": n.priority,
                "link": "self" if me else ("up" if n.out_link is not None else "down"),
                "pong_received": n.pong_received,
            })
        return out

    def bus_messages(self) -> dict[str, tuple[int, int, int, int]]:
        """Per message type: (sent, received, bytes sent, bytes received)."""
        from disque.cluster.messages import TYPE_NAMES
        st = self._server.membership.stats
        return {name: (st.msgs_sent.get(t, 0), st.msgs_received.get(t, 0),
                       st.bytes_sent.get(t, 0), st.bytes_received.get(t, 0))
                for t, name in TYPE_NAMES.items()}

    def peer_addresses(self) -> list[tuple[str, str, int]]:
        """(id, ip, client port) of the other nodes, for the dashboard's per-node INFO."""
        return [(n.id.decode(), n.ip.decode(), n.port)
                for n in self._server.membership.nodes() if not n.bits & 1 and n.ip]

    # ------------------------------------------------------------------ queues
    def queue_fields(self, q: Queue, active: dict[bytes, int], now: int) -> dict[str, Any]:
        """QSTAT's fields (the function QSTAT renders) plus the queue's totals, the age of
        its oldest job and its active jobs from a census."""
        st = queue_stats(self._server.node, q)
        d = {_text(st[i]): _text(st[i + 1]) for i in range(0, len(st), 2)}
        first = q.jobs.first() if len(q.jobs) else None
        d["oldest_age"] = (max(0, now - first.ctime // 1_000_000) / 1000
                           if first is not None else 0.0)
        d["added"] = q.added
        d["acked"] = q.acked
        d["nacked"] = q.nacked
        d["requeued"] = q.requeued
        d["active"] = active.get(q.name, 0)
        return d

    async def queue_table(self, cap: int, active: dict[bytes, int]) -> QueueTable:
        """The `cap` busiest queues (longest, then most active jobs, then most traffic),
        busiest first, and totals over every queue. The queue table is walked a slice at
        a time like the census: a node may hold millions of queues."""
        node = self._server.node
        table = QueueTable()
        heap: list[tuple[int, int, int, int, Queue]] = []
        totals = table.totals
        seq = seen = 0
        queues = node.queues
        for i in range(queues.shard_count()):
            shard = queues.shard(i)
            if not shard:
                continue
            for q in shard.values():  # (no await inside a shard: it cannot change)
                table.count += 1
                totals["added"] += q.added
                totals["acked"] += q.acked
                totals["nacked"] += q.nacked
                totals["requeued"] += q.requeued
                totals["jobs-in"] += q.jobs_in
                totals["jobs-out"] += q.jobs_out
                if cap > 0:
                    seq += 1  # (ties: no Queue comparison)
                    key = (len(q), active.get(q.name, 0), q.jobs_in + q.jobs_out, seq, q)
                    if len(heap) < cap:
                        heapq.heappush(heap, key)
                    elif key[:4] > heap[0][:4]:
                        heapq.heapreplace(heap, key)
            seen += len(shard)
            if seen >= CENSUS_SLICE:
                seen = 0
                await asyncio.sleep(0)
        now = node.clock()
        table.queues = [self.queue_fields(k[4], active, now)
                        for k in sorted(heap, key=lambda k: k[:4], reverse=True)]
        return table

    async def census(self) -> Census:
        """Jobs by state, counted over the registry a slice at a time (the loop serves RESP
        between slices). A recent census is reused (CENSUS_REUSE); concurrent callers share
        one walk; a walk over more than one slice is paced (CENSUS_DUTY) and, while it runs,
        callers get the previous census."""
        c = self._census
        if c is not None and self._clock() - c.taken_at < c.cost * CENSUS_REUSE:
            return c
        stale = c is not None and c.slices > 1
        if self._census_task is None or self._census_task.done():
            self._census_task = asyncio.ensure_future(self._take_census(paced=stale))
        if stale and c is not None:
            return c
        return await asyncio.shield(self._census_task)

    def close(self) -> None:
        """The HTTP side stops: a census walking in the background stops too."""
        task = self._census_task
        if task is not None and not task.done():
            task.cancel()

    def census_age(self) -> float:
        """Seconds since the last census ended (0 before the first)."""
        c = self._census
        return self._clock() - c.taken_at if c is not None else 0.0

    async def _take_census(self, paced: bool) -> Census:
        c = Census()
        jobs = self._server.node.jobs
        counts = [0] * len(STATE_NAMES)
        active = c.active_by_queue
        rest = 1 / CENSUS_DUTY - 1 if paced else 0.0
        clock, sleep = self._clock, self._sleep
        seen = 0
        start = clock()
        for i in range(jobs.shard_count()):
            shard = jobs.shard(i)
            if not shard:
                continue
            for job in shard.values():  # (no await inside a shard: it cannot change)
                counts[job.state] += 1
                if job.state == 1 and job.queue is not None:  # ACTIVE
                    active[job.queue] = active.get(job.queue, 0) + 1
            seen += len(shard)
            if seen >= CENSUS_SLICE:
                seen = 0
                took = clock() - start
                c.cost += took
                c.slices += 1
                await sleep(took * rest)
                start = clock()
        c.cost += clock() - start
        c.slices += 1
        c.by_state = {STATE_NAMES[i].decode(): n for i, n in enumerate(counts)}
        c.taken_at = clock()
        self._census = c
        return c
