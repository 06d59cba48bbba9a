"""What a node's event loop does at the edges of its iterations, compiled with the hot path.

The server (disque.server) wires the node to the loop; these are the pieces of that wiring
that run once or more per job, kept here so that mypyc compiles them with their callers
(the client connection, the bus) instead of leaving an interpreted call on every job:

- bus routing: the node's outgoing messages go to the links once per loop iteration
  (`schedule_route` when the node's outbox stops being empty, `route_out` at the end of
  the iteration), after the AOF write that they may confirm; messages for a node without
  a link are dropped, as the bus would;
- bus delivery: a job message from a link reaches the node only from a member of the
  cluster (`on_job_message`);
- deferred replies: clients unblocked by a bus message or a timer are written once, at the
  end of the iteration (`defer_flush`, `flush_deferred`);
- the loop timer: one loop timer armed for the timer wheel's next bucket (`arm_timer`,
  `on_timer`).

And the wall clock every subsystem is given (`wall_ms`): a compiled function is a cheap
call from the compiled code that reads it several times per job.

Invariants: `route_scheduled` is True exactly while a `route_out` is scheduled;
`wake_key` is the wheel bucket the loop timer is armed for (NEVER: none).
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Final

import structlog

from disque.cluster.bus import Bus, BusLink
from disque.cluster.messages import GotJob, GotJobBatch, Message
from disque.cluster.nodes import HANDSHAKE
from disque.node import Node
from disque.timers import NEVER, RES

if TYPE_CHECKING:
    from disque.aof.manager import AofManager
    from disque.cluster.membership import Membership
    from disque.connection import Client

log = structlog.get_logger("disque")

# Bus messages that tell the sender a copy is held here: not sent when its record could
# not be written to the AOF.
CONFIRMS_COPY: Final = (GotJob, GotJobBatch)

_time_ns: Final = time.time_ns


def wall_ms() -> int:
    """The wall clock in ms: the node's clock."""
    return _time_ns() // 1_000_000


class Iteration:
    """The per-iteration work of one server (`server.iteration`)."""

    def __init__(self, node: Node, bus: Bus, membership: Membership,
                 aofm: AofManager) -> None:
        self.node = node
        self.bus = bus
        self.membership = membership
        self.aofm = aofm
        self.loop: asyncio.AbstractEventLoop | None = None  # set once the loop runs
        self.route_scheduled = False
        self.deferred: list[Client] = []  # clients whose replies are written at iteration end
        self.wake_handle: asyncio.TimerHandle | None = None
        self.wake_key = NEVER  # the wheel bucket the loop timer is armed for

    # ------------------------------------------------------------------ bus
    def on_job_message(self, link: BusLink, msg: Message) -> None:
        """A job message arrived on the bus: only members of the cluster are heard."""
        sender = msg.header.sender
        if self.heard(sender):
            self.node.on_message(sender, msg)

    def heard(self, sender: bytes) -> bool:
        """Whether the job messages of `sender` are heard: a member of the cluster, not
        unknown nor still in handshake."""
        n = self.membership.table.get(sender)
        return n is not None and not n.bits & HANDSHAKE

    def prefetch(self, msgs: list[Message]) -> None:
        """Job messages arrived together on the bus: those of members read their jobs on
        disk back at once (Node.prefetch) before each is handled (`on_job_message`)."""
        node = self.node
        if not node.on_disk:
            return
        node.prefetch([msg for msg in msgs if self.heard(msg.header.sender)])

    def schedule_route(self) -> None:
        if not self.route_scheduled:
            self.route_scheduled = True
            loop = self.loop
            assert loop is not None
            loop.call_soon(self.route_out)

    def route_out(self) -> None:
        """Hand the node's bus messages to the links, once per loop iteration. The AOF is
        written (and fsynced under `always`) first: a GOTJOB must not confirm a copy that
        is not on disk yet."""
        self.route_scheduled = False
        node = self.node
        out = node.out
        if not out:
            return
        node.out = []
        aofm = self.aofm
        if aofm.aof is not None and not aofm.flush_before_send():
            # what they would confirm is not on disk: the sender tries another node
            out = [(n, m) for n, m in out if not isinstance(m, CONFIRMS_COPY)]
        table = self.membership.table
        for node_id, msg in out:
            n = table.get(node_id)
            if n is not None:
                link = n.out_link
                if link is not None:
                    link.send(msg)
        # This already runs at the end of the loop iteration: write now rather than one
        # more loop pass later (a replication round trip crosses this twice).
        self.bus.apply(True)

    # ------------------------------------------------------------------ clients
    def defer_flush(self, c: Client) -> None:
        deferred = self.deferred
        if not deferred:
            loop = self.loop
            assert loop is not None
            loop.call_soon(self.flush_deferred)
        deferred.append(c)

    def flush_deferred(self) -> None:
        """Write the replies of the clients unblocked during this loop iteration."""
        clients = self.deferred
        self.deferred = []
        aofm = self.aofm
        for c in clients:
            c.in_deferred = False
            if not c.closing and c.transport is not None and not aofm.hold(c):
                c.flush()

    # ------------------------------------------------------------------ timers
    def arm_timer(self) -> None:
        """Arm the loop timer for the node's next due time."""
        key = self.node.wheel.earliest
        if key == NEVER:
            return
        handle = self.wake_handle
        if handle is not None:
            if key >= self.wake_key:
                return
            handle.cancel()
        self.wake_key = key
        delay = (key * RES - wall_ms()) / 1000
        loop = self.loop
        assert loop is not None
        self.wake_handle = loop.call_later(delay if delay > 0 else 0.0, self.on_timer)

    def on_timer(self) -> None:
        self.wake_handle = None
        self.wake_key = NEVER
        try:
            self.node.tick(wall_ms())
        except Exception:
            log.exception("timer.crash")
        self.arm_timer()
