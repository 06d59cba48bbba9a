"""Whole Disque nodes on the simulated network: membership *and* jobs, one fake clock.

`SimCluster` extends `SimNetwork` (tests/sim/network.py): every simulated host runs a full
`disque.node.Node` whose `membership` is the host's `Membership`. The network carries the
job messages exactly like the server does:

- the node's outbox (`node.out`, (node id, message) pairs) is drained after every event on
  that host and each message goes out on the host's outbound link to that node, if it has
  one (no link: dropped, as `Server.route_out`); it is encoded and decoded through the real
  codec by the network;
- a job message arriving on a link goes to `node.on_message` if its sender is a known,
  non-handshake node (as `Server.on_job_message`); membership messages go to Membership;
- Membership's `LinkChanged` effects go to `node.link_changed` (as the server's Bus hook):
  a crash resets the links of the dead host, its peers see them close after the data in
  flight, and re-target the copies they were waiting for from it at once;
- the node's timer wheel is driven by wake-up events at `node.next_due()`, calling
  `node.tick(now)` (a paused host wakes when resumed; a crashed one loses its Node: a
  restart comes back with an empty job table and its saved nodes.conf, or with `aof` its
  jobs reloaded as an AOF with appendfsync always would).

Clients are plain objects calling node methods (`add_job` + `wait_replication`, `get_jobs` +
`block`, `ackjob`, `fastack`, `working`, `enqueue_jobs`) as the command layer does; each call
is one event. `Worker` is a consumer that keeps a GETJOB blocked on its node, records every
delivery in `SimCluster.deliveries` and acknowledges after a processing time (on another
node if its own crashed: a client failing over), or gives some jobs back with NACK.

With `check_jobs` (on by default) every event that enters the job layer is followed by the
node invariant "a job is in its queue iff its state is queued" on the host that ran it, over
its whole registry (which the simulated nodes keep in 16 shards, not 4096: walking those
after every event would cost more than the simulation itself) and every queue the cluster
has named (on the bus, in ADDJOB). `check_all` checks every queue of every live host.
"""

from __future__ import annotations

import os
import random
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from disque.cluster.membership import TICK_MS, LinkChanged
from disque.cluster.messages import JOB_TYPES, Message
from disque.cluster.nodes import HANDSHAKE
from disque.cluster.records import job_from_record, job_record
from disque.cluster.replication import ReplWaiter
from disque.jobs.deadletter import DeadLetter
from disque.jobs.job import ACTIVE, QUEUED, WAIT_REPL, Job
from disque.node import Node, Waiter
from disque.protocol.errors import CommandError
from disque.state import BASE_MEMORY
from tests.sim.network import SimLink, SimNetwork, SimNode


class AddResult(ReplWaiter):
    """The outcome of one ADDJOB: `ok` (job id) or `error` once answered."""

    def __init__(self, net: SimCluster, idx: int) -> None:
        self.net = net
        self.idx = idx
        self.ok: bytes | None = None
        self.error: CommandError | None = None
        self.at = 0  # when it was answered
        self.lost = False  # the node crashed before answering: the client saw no reply

    @property
    def done(self) -> bool:
        return self.ok is not None or self.error is not None or self.lost

    def on_added(self, job_id: bytes) -> None:
        assert not self.done, "ADDJOB answered twice"
        self.ok = job_id
        self.at = self.net.now
        self.net.added_ok(job_id, self.idx)

    def on_error(self, error: CommandError) -> None:
        assert not self.done, "ADDJOB answered twice"
        self.error = error
        self.at = self.net.now


class Worker(Waiter):
    """A consumer on node `idx`: GETJOB (blocking) in a loop, ACKJOB after `process_ms`."""

    __slots__ = ("net", "idx", "queue", "process_ms", "ack", "node_obj", "got", "stopped",
                 "poll_ms", "nack_rate", "nack_if", "nack_delay")

    def __init__(self, net: SimCluster, idx: int, queue: bytes, *,
                 process_ms: tuple[int, int] = (5, 50), ack: bool = True,
                 poll_ms: int = 500, nack_rate: float = 0.0,
                 nack_if: Callable[[Job], bool] | None = None, nack_delay: int = 0) -> None:
        super().__init__([queue], 1, False)
        self.net = net
        self.idx = idx
        self.queue = queue
        self.process_ms = process_ms
        self.ack = ack
        self.node_obj: Node | None = None  # the Node we are blocked on, if any
        self.got: list[tuple[int, bytes]] = []  # (time, job id)
        self.stopped = False
        self.poll_ms = poll_ms
        self.nack_rate = nack_rate  # share of at-least-once deliveries given back (NACK)
        self.nack_if = nack_if  # ...or the jobs this says fail (a poison job), always
        self.nack_delay = nack_delay  # NACK ... DELAY seconds

    def start(self) -> Worker:
        self.net.schedule(self.net.now, self._poll)
        return self

    def stop(self) -> None:
        self.stopped = True
        node = self.node_obj
        if node is not None:
            self.node_obj = None
            self.net.run_on(self.idx, lambda n: n.unblock(self))

    def _poll(self) -> None:
        if self.stopped:
            return
        net = self.net
        live = net.live_node(self.idx)
        if live is not None and self.node_obj is not live:
            self.node_obj = None
            self._fetch()
        net.schedule(net.now + self.poll_ms, self._poll)

    def _fetch(self) -> None:
        if self.stopped or self.node_obj is not None:
            return
        net = self.net
        if net.live_node(self.idx) is None:
            return

        def getjob(node: Node) -> None:
            jobs = node.get_jobs([self.queue], 1)
            if jobs:
                self._received(jobs)
                return
            try:
                node.block(self, 0)
            except CommandError:
                return  # -LEAVING: try again at the next poll
            self.node_obj = node

        net.run_on(self.idx, getjob)

    def _received(self, jobs: list[Job]) -> None:
        net = self.net
        for job in jobs:
            self.got.append((net.now, job.id))
            net.deliveries[job.id].append((net.now, self.idx))
            lo, hi = self.process_ms
            if job.retry and (self.nack_if(job) if self.nack_if is not None else
                              self.nack_rate and net.rng.random() < self.nack_rate):
                net.schedule(net.now + net.rng.randint(lo, hi), net.client_nack, self.idx,
                             job.id, self.nack_delay)
            elif self.ack:
                net.schedule(net.now + net.rng.randint(lo, hi), net.client_ack, self.idx,
                             job.id)
        net.schedule(net.now + 1, self._fetch)

    # Waiter callbacks (called from inside the node)
    def on_jobs(self, jobs: list[Job]) -> None:
        self.node_obj = None
        self._received(jobs)

    def on_timeout(self) -> None:
        self.node_obj = None
        self.net.schedule(self.net.now + 1, self._fetch)

    def on_error(self, error: CommandError) -> None:
        self.node_obj = None  # -LEAVING: the next poll tries again


OVERFLOW_ROOM = 8000  # bytes of jobs a node holds in memory with overflow on (~16 jobs)
OVERFLOW_KEEP = 4


def on_disk(node: Node) -> list[Job]:
    """Every job node i holds on disk (overflow)."""
    out: list[Job] = []
    after = 0
    while True:
        after, jobs = node.overflow.scan(after, 1000)
        out += jobs
        if not after:
            return out


class SimCluster(SimNetwork):
    def __init__(self, n: int, seed: int = 0, *, check_jobs: bool = True,
                 repair_grace: int | None = None, copy_rate: int | None = None,
                 overflow_dir: str | None = None, **kw: Any) -> None:
        self.check_jobs = check_jobs
        # with a directory, every node overflows to a file there past a few jobs
        self.overflow_dir = overflow_dir
        self.repair_grace = repair_grace  # the nodes' repair-grace (None: the default)
        self.copy_rate = copy_rate  # their rereplicate-rate and repair-rate (None: defaults)
        self.jobnodes: list[Node] = []
        self.wake_at: list[int | None] = []
        self.deliveries: dict[bytes, list[tuple[int, int]]] = defaultdict(list)
        self.added: dict[bytes, int] = {}  # job id -> node it was added on
        self.acked: dict[bytes, int] = {}  # job id -> time of the first ACKJOB
        self.pending_adds: list[AddResult] = []
        self.to_lose: list[tuple[int, int, type]] = []  # see lose_next()
        self.queue_names: set[bytes] = set()
        self.job_event = True  # whether the event running may have changed a job (_call)
        super().__init__(n, seed=seed, **kw)
        for sn in self.nodes:
            self.jobnodes.append(self._new_node(sn))
            self.wake_at.append(None)
            self._arm(sn)

    # ------------------------------------------------------------------ hosts
    def _new_node(self, sn: SimNode) -> Node:
        rng = random.Random(self.seed * 2_000_003 + sn.idx * 7 + sn.incarnation * 10_007)
        node = Node(sn.membership.myself, self._clock, rng=rng, randbytes=rng.randbytes,
                    membership=sn.membership, registry_bits=4)
        if self.repair_grace is not None:
            node.repair.grace = self.repair_grace
        if self.copy_rate is not None:
            node.repair.rate = node.rereplication.rate = self.copy_rate
        if self.overflow_dir is not None:
            # room for OVERFLOW_ROOM bytes of jobs under the threshold, queues of more than
            # OVERFLOW_KEEP jobs spill too
            node.maxmemory = 2 * (BASE_MEMORY + OVERFLOW_ROOM)
            node.overflow.keep = OVERFLOW_KEEP
            # (the process in the name: the seed runner's workers share the directory)
            node.overflow.enable(
                f"{self.overflow_dir}/p{os.getpid()}-n{sn.idx}-{sn.incarnation}.db", 50, 0)
        return node

    def node(self, i: int) -> Node:
        return self.jobnodes[i]

    def live_node(self, i: int) -> Node | None:
        """Node i if it is up (a client could talk to it), else None."""
        return self.jobnodes[i] if self.nodes[i].state == "up" else None

    def crash(self, i: int) -> None:
        if self.nodes[i].state != "down":
            for res in self.pending_adds:
                if res.idx == i and not res.done:
                    res.lost = True
        super().crash(i)

    def restart(self, i: int, aof: bool = False) -> None:
        """Start node i again: with an empty job table, or (`aof`) reloading the jobs it
        held when it crashed, as an AOF with appendfsync always would (`Node.load_job`:
        active and queued jobs come back active, re-queued by their timers)."""
        sn = self.nodes[i]
        if sn.state != "down":
            return
        old = self.jobnodes[i]
        super().restart(i, aof)
        node = self.jobnodes[i] = self._new_node(sn)
        if aof:
            now = self.now
            for job in [*old.jobs.values(), *on_disk(old)]:
                if job.state in (ACTIVE, QUEUED):
                    copy = job_from_record(job_record(job, now), now)
                    copy.state = job.state
                    node.load_job(copy, False)
        if old.overflow.store is not None:
            old.overflow.store.close()  # (its file is the crashed process's)
            old.overflow.store = None
        self.wake_at[i] = None
        self._arm(sn)

    def resume(self, i: int) -> None:
        super().resume(i)
        if self.nodes[i].state == "up":
            self.wake_at[i] = None
            self._arm(self.nodes[i])

    # ------------------------------------------------------------------ events
    def _call(self, node: SimNode, fn: Callable[..., None], *args: Any) -> None:
        # An event of the membership alone (its tick, a gossip message, a link's change the
        # job layer is not told of) cannot change a job: the job layer is entered only by
        # its own calls (on_message, tick, link_changed, a client's command), so the queue
        # invariant is checked after those (a third of the events here).
        self.job_event = getattr(fn, "__self__", None) is not node.membership
        super()._call(node, fn, *args)
        if self.jobnodes and node.state != "down":
            self._after_job_event(node)

    def _prefetch(self, node: SimNode, msgs: list[Message]) -> None:
        """As Iteration.prefetch: a frame's job messages from members read their jobs on
        disk back together."""
        if not self.jobnodes or not self.jobnodes[node.idx].on_disk:
            return
        heard: list[Message] = []
        for msg in msgs:
            known = node.membership.get(msg.header.sender)
            if msg.TYPE in JOB_TYPES and known is not None and not known.bits & HANDSHAKE:
                heard.append(msg)
        if heard:
            self._call(node, self.jobnodes[node.idx].prefetch, heard)

    def _deliver(self, node: SimNode, dest: SimLink, msg: Message, peer_ip: bytes) -> None:
        if msg.TYPE not in JOB_TYPES:
            super()._deliver(node, dest, msg, peer_ip)
            return
        sender = msg.header.sender
        known = node.membership.get(sender)
        if known is None or known.bits & HANDSHAKE:
            return  # only members of the cluster are heard
        self._call(node, self.jobnodes[node.idx].on_message, sender, msg)

    def _link_changed(self, node: SimNode, e: LinkChanged) -> None:
        """As the server's Bus: the job layer hears of every outbound link change (its
        messages are routed after the event, by `_after_job_event`)."""
        if self.jobnodes and node.state != "down":
            self.job_event = True
            self.jobnodes[node.idx].link_changed(e.node_id, e.up)

    def run_on(self, i: int, fn: Callable[[Node], Any]) -> Any:
        """Run a client command on node i (must be up) as one event; returns its result."""
        sn = self.nodes[i]
        assert sn.state == "up", f"node{i} is {sn.state}"
        result: list[Any] = []
        self._call(sn, lambda: result.append(fn(self.jobnodes[i])))
        return result[0]

    def _after_job_event(self, sn: SimNode) -> None:
        node = self.jobnodes[sn.idx]
        out = node.out
        if out:
            node.out = []
            get = sn.membership.get
            for node_id, msg in out:
                if self.check_jobs:
                    self._note_queues(msg)
                n = get(node_id)
                if n is not None and n.out_link is not None:
                    if self.to_lose and self._lost(sn, node_id, msg):
                        self._reset(n.out_link)
                        continue
                    self._send(sn, n.out_link, msg)
        self._arm(sn)
        if self.check_jobs and self.job_event:
            check_queues(node, sn.idx, self.queue_names)

    def lose_next(self, src: int, dst: int, kind: type) -> None:
        """The next `kind` message from node src to node dst is lost: the connection breaks
        as it is written (both ends see it closed, unread data is lost)."""
        self.to_lose.append((src, dst, kind))

    def _lost(self, sn: SimNode, node_id: bytes, msg: Message) -> bool:
        dst = self.by_id(node_id)
        for entry in self.to_lose:
            src, d, kind = entry
            if src == sn.idx and dst is not None and d == dst.idx and type(msg) is kind:
                self.to_lose.remove(entry)
                return True
        return False

    def _note_queues(self, msg: Message) -> None:
        rec = getattr(msg, "job", None)
        if rec is not None:
            self.queue_names.add(rec.queue)
        for rec in getattr(msg, "jobs", ()):
            self.queue_names.add(rec.queue)
        queue = getattr(msg, "queue", None)
        if queue is not None:
            self.queue_names.add(queue)

    def check_all(self) -> None:
        """The queue invariant on every live host, over the whole registry."""
        for sn in self.nodes:
            if sn.state != "down":
                node = self.jobnodes[sn.idx]
                check_queues(node, sn.idx, {q.name for q in node.queues.values()})

    def _arm(self, sn: SimNode) -> None:
        nd = self.jobnodes[sn.idx].next_due()
        if nd is None:
            return
        at = max(nd, self.now)
        cur = self.wake_at[sn.idx]
        if cur is not None and cur <= at:
            return
        self.wake_at[sn.idx] = at
        self.schedule(at, self._wake, sn, sn.incarnation, at)

    def _wake(self, sn: SimNode, incarnation: int, at: int) -> None:
        i = sn.idx
        if sn.incarnation != incarnation or sn.state == "down" or self.wake_at[i] != at:
            return
        if sn.state == "paused":  # a stopped process: its timers run when it resumes
            self.wake_at[i] = self.now + TICK_MS
            self.schedule(self.now + TICK_MS, self._wake, sn, incarnation, self.now + TICK_MS)
            return
        self.wake_at[i] = None
        self._call(sn, self.jobnodes[i].tick, self.now)

    # ------------------------------------------------------------------ clients
    def addjob(self, i: int, queue: bytes = b"q", body: bytes = b"body", *,
               timeout: int = 5000, replicate: int | None = None, ttl: int | None = None,
               retry: int | None = None, delay: int = 0, async_: bool = False,
               dl: DeadLetter | None = None) -> AddResult:
        """ADDJOB on node i; the result is answered now or later (sync replication).
        `dl`: the job's dead-letter policy (ADDJOB MAXNACKS / MAXDELIVERIES / DEADLETTER)."""
        res = AddResult(self, i)
        self.queue_names.add(queue)

        def add(node: Node) -> None:
            try:
                job = node.add_job(queue, body, timeout, replicate, ttl, retry, delay, None,
                                   async_, dl)
            except CommandError as e:
                res.on_error(e)
                return
            if job.state == WAIT_REPL:
                node.wait_replication(job, res, timeout)
            else:
                res.on_added(job.id)

        self.run_on(i, add)
        if not res.done:
            self.pending_adds = [r for r in self.pending_adds if not r.done]
            self.pending_adds.append(res)
        return res

    def added_ok(self, job_id: bytes, idx: int) -> None:
        self.added[job_id] = idx

    def client_ack(self, i: int, job_id: bytes) -> None:
        """ACKJOB from a client of node i. A stopped node makes the client wait; a crashed
        one makes it fail over to the next live node (which then holds a dummy ACK, or
        nothing for an at-most-once ID: that copy died with the crashed node)."""
        n = len(self.nodes)
        for k in range(n):
            j = (i + k) % n
            state = self.nodes[j].state
            if state == "paused":
                break
            if state == "up":
                self.acked.setdefault(job_id, self.now)
                self.run_on(j, lambda node: node.ackjob([job_id]))
                return
        self.schedule(self.now + 100, self.client_ack, i, job_id)

    def client_nack(self, i: int, job_id: bytes, delay: int = 0) -> None:
        """NACK [DELAY delay] from a client of node i (lost if the node crashed: the job's
        RETRY then brings it back)."""
        state = self.nodes[i].state
        if state == "paused":
            self.schedule(self.now + 100, self.client_nack, i, job_id, delay)
        elif state == "up":
            self.run_on(i, lambda node: node.nack_jobs([job_id], delay))

    def worker(self, i: int, queue: bytes = b"q", **kw: Any) -> Worker:
        self.queue_names.add(queue)
        return Worker(self, i, queue, **kw).start()

    # ------------------------------------------------------------------ queries
    def holders(self, job_id: bytes) -> list[int]:
        """Nodes (not down) holding a copy of the job, in any state."""
        return [sn.idx for sn in self.nodes if sn.state != "down"
                and self.jobnodes[sn.idx].lookup_job(job_id) is not None]

    def job_count(self) -> int:
        return sum(len(self.jobnodes[sn.idx].jobs) + self.jobnodes[sn.idx].on_disk
                   for sn in self.nodes if sn.state != "down")

    def all_jobs(self) -> dict[int, list[Job]]:
        return {sn.idx: [*self.jobnodes[sn.idx].jobs.values(), *on_disk(self.jobnodes[sn.idx])]
                for sn in self.nodes if sn.state != "down"}


def check_queues(node: Node, idx: int, names: set[bytes]) -> None:
    """A job in memory is in a queue iff its state is QUEUED (then in its own queue,
    registered), over the whole registry and the queues `names`."""
    # (node.jobs, not lookup_job: that brings jobs back from disk)
    registry = node.jobs
    in_queues: set[bytes] = set()
    for name in names:
        q = node.lookup_queue(name)
        if q is None:
            continue
        for job in q.jobs:
            assert job.state == QUEUED, f"node{idx}: {job!r} in queue {q.name!r}"
            assert job.queue == q.name, f"node{idx}: {job!r} in the wrong queue {q.name!r}"
            assert registry.get(job.id) is job, f"node{idx}: queued {job!r} unregistered (registry: {registry.get(job.id)!r})"
            assert job.id not in in_queues, f"node{idx}: {job!r} queued twice"
            in_queues.add(job.id)
    lost = [job for job in registry.values() if job.state == QUEUED and job.id not in in_queues]
    assert not lost, f"node{idx}: {lost[0]!r} queued but in no queue"
