"""NodeState: what every subsystem of a node shares, and the one door they receive.

A node (`disque.node.Node`) is this state plus subsystems, one per file: replication
(disque.cluster.replication), re-queue (cluster.requeue), ACK GC (cluster.acks), federation
(cluster.federation), dead letters, re-replication, repair, blocked consumers
(queues.waiting), memory (disque.memory) and DEDUP (jobs.dedup). Each is built with this
state and, where it must reach another subsystem, an explicit callable wired by Node at
construction. None imports `disque.node` or a sibling subsystem.

What the state holds: the node's identity (`myself`), its clock and randomness (injected:
tests run a node with a fake clock and no sockets), the job registry and the queue table
(`ScanDict`s), the timer wheel, the persistence door (the AOF, when on), the cluster view
(the membership; None for a lone node in unit tests), the memory estimate, and the outbox of
bus messages. And the local half of the job state machine, the spec's procedures every
subsystem uses: `register` / `unregister`, `enqueue` / `dequeue`, `fetch`, `activate`,
`ack_job`, `schedule_job`. Every change of `job.state` follows the table of
`disque.jobs.states`.

Three things the local machine does reach beyond the state, declared here as methods Node
implements by routing to its subsystems (the template-method pattern, not a mixin): a job
queued where consumers wait (`serve_waiters`) or where a NEEDJOBS found nothing
(`serve_needers`), and a job unregistered while its ADDJOB waits for copies
(`replication_removed`).

Invariants:
- a job is in the registry iff it is known and in memory (with `overflow yes` a known job
  may be on disk instead: `lookup_job` brings it back); a job in memory is in its queue iff
  its state is QUEUED;
- `job.qtime == 0` means this node will never queue the job (again): at-most-once jobs after
  their first queueing;
- `job.awake` is the time of the job's live timer-wheel entry (0 after unregister).
"""

from __future__ import annotations

import random
from collections import OrderedDict, deque
from collections.abc import Callable, Collection, Iterable
from typing import Final, Protocol

from disque.cluster.membership import Membership
from disque.cluster.messages import Header, Message, Queued, SetAck
from disque.cluster.nodes import ClusterNode
from disque.cluster.records import holders_aux, state_bits
from disque.jobs.ids import IdGenerator
from disque.jobs.job import (
    ACKED,
    ACTIVE,
    F_BCAST_QUEUED,
    F_BCAST_WILLQUEUE,
    F_DELIVERED,
    F_DUMMY,
    JOB_MEMORY,
    QUEUED,
    WAIT_REPL,
    Job,
)
from disque.latency import LatencyMonitor
from disque.queues.queue import PAUSE_OUT, Queue
from disque.scan import ScanDict
from disque.timers import TimerWheel

REQUEUE_JITTER: Final = 250  # ms: requeue times get uniform [-250, +250) added
COLLECTED_MAX = 100_000  # IDs of collected jobs kept to answer reloaded copies (~10 MB)

# Memory estimate (INFO used_memory and the maxmemory rules). The constants are the measured
# Python cost of a queued job besides its body (JOB_MEMORY, in disque.jobs.job: object, ID,
# registry and queue slots) and of an empty queue object; `BASE_MEMORY` stands for the
# server's fixed structures.
QUEUE_MEMORY: Final = 900
BASE_MEMORY: Final = 1024 * 1024
NO_SPILL: Final = 1 << 62  # NodeState.spill_at with overflow off


class Persistence(Protocol):
    """The AOF as the node and the job commands use it (disque.aof.writer.AppendOnlyFile);
    `node.persist` is None while appendonly is off."""

    last_write_error: str | None  # set while the AOF cannot be written (a full disk)
    appended: int  # records logged so far

    def addjob(self, job: Job) -> None: ...
    def loadjob(self, job: Job) -> None: ...
    def ackjob(self, job: Job) -> None: ...
    def deljob(self, job_id: bytes) -> None: ...
    def rewrite_note(self, job: Job) -> None: ...
    def pending(self) -> bool: ...
    def confirm(self, waiter: Callable[[bool], None]) -> None: ...


def _nothing() -> None:
    pass


class NodeState:
    """The shared state and local job machine of a node (see the module docstring)."""

    def __init__(self, myself: bytes, clock: Callable[[], int], *,
                 rng: random.Random | None = None,
                 randbytes: Callable[[int], bytes] | None = None,
                 maxmemory: int = 1 << 30, latency: LatencyMonitor | None = None,
                 membership: Membership | None = None,
                 on_out: Callable[[], None] = _nothing, registry_bits: int = 12) -> None:
        self.myself = myself  # 40 hex chars, as bytes
        self.self_only = (myself,)  # the `delivered` list of a job only this node holds
        self.clock = clock
        # a job created before this (ctime: ms x 1e6) was created before this node started:
        # a copy of it that reaches us is a restart's refill or a repair (replication's
        # `tell_holders`)
        self.start_ctime = clock() * 1_000_000
        # slow timer passes and evictions are recorded here (off unless the server's is on)
        self.latency = latency if latency is not None else LatencyMonitor.disabled()
        self.rng = rng or random.Random()
        self.random = self.rng.random
        self.ids = IdGenerator(myself, randbytes) if randbytes else IdGenerator(myself)
        # 2^registry_bits shards (JSCAN's cursor steps); the simulation, which walks the
        # registry after every event, asks for fewer
        self.jobs: ScanDict[bytes, Job] = ScanDict(registry_bits)
        self.queues: ScanDict[bytes, Queue] = ScanDict(8)
        # The registry's shards, held directly: register/lookup are on the hot path.
        self.jshards = self.jobs.shards
        self.jmask = self.jobs.mask
        self.qshards = self.queues.shards
        self.qmask = self.queues.mask
        self.wheel = TimerWheel()
        self.persist: Persistence | None = None  # the AOF, when persistence is on
        self.membership = membership  # the cluster view; None: a lone node (unit tests)
        self.leaving = membership.leaving if membership is not None else False
        self.my_ip = b""  # the address clients and peers reach us at (HELLO)
        self.my_port = 0
        self.mem_used = BASE_MEMORY  # running estimate, see used_memory()
        self.mem_evict_at = 0  # 95% of maxmemory: above it, commands that add memory check
        self.maxmemory = maxmemory
        # Overflow (disque.overflow): jobs on disk now (a registry miss asks the disk while
        # there are some), and the memory estimate above which jobs go there.
        self.on_disk = 0
        self.spill_at = NO_SPILL
        # with overflow on and memory over half of spill_at (so, none while a node stays
        # far under it), the IDs of the active jobs in the order they were registered: a
        # spill of active jobs takes the oldest first, so that the jobs of a segment on
        # disk came together, and come back together (a replica's copies, as their SETACKs
        # come). IDs of jobs gone meanwhile are skipped, and pruned (Overflow.tick).
        self.arrivals: deque[bytes] = deque()
        self.out: list[tuple[bytes, Message]] = []  # bus messages to send: (node id, msg)
        self.on_out = on_out  # called when the outbox goes from empty to non-empty
        # NEEDJOBS that found nothing: queue -> {node: (until ms, count)}; jobs queued
        # meanwhile go to those nodes (disque.cluster.federation)
        self.needers: dict[bytes, dict[bytes, tuple[int, int]]] = {}
        # `delivered` lists shared by the jobs that have the same (see shared_delivered)
        self.delivered_lists: dict[tuple[bytes, ...], tuple[bytes, ...]] = {}
        # IDs of jobs acknowledged and forgotten here (collected by the ACK GC, a DELJOB from
        # the bus, FASTACK), oldest first, at most COLLECTED_MAX: what lets this node tell a
        # reloaded copy "collected, drop it" rather than "unknown here" (a local DELJOB, a
        # copy never received). Past the cap the answer is "unknown": at worst a delivery
        # after the ACK, never a lost job. (An OrderedDict: dropping a plain dict's first key
        # over and over makes each next(iter()) skip every slot deleted before it, ~60 us
        # per collected job once the cap is reached.)
        self.collected: OrderedDict[bytes, None] = OrderedDict()

    def set_myself(self, myself: bytes) -> None:
        """A new node ID (CLUSTER RESET HARD): new jobs carry its prefix."""
        self.myself = myself
        self.self_only = (myself,)
        self.ids.prefix = b"D-" + myself[:8] + b"-"

    # ------------------------------------------------------------------ events for Node
    def serve_waiters(self, q: Queue) -> None:
        """Jobs were queued in `q` and clients wait on it (queues.waiting)."""
        raise NotImplementedError

    def serve_needers(self, q: Queue, now: int) -> None:
        """Jobs were queued where a recent NEEDJOBS found none (cluster.federation)."""
        raise NotImplementedError

    def replication_removed(self, job: Job) -> None:
        """A job still waiting for its copies went (cluster.replication)."""
        raise NotImplementedError

    def fault_in(self, job_id: bytes) -> Job | None:
        """A job looked up by ID is not in memory while jobs are on disk: bring it back if
        it is there (disque.overflow)."""
        raise NotImplementedError

    def held_on_disk(self, job_id: bytes, delivered: tuple[bytes, ...]) -> bool:
        """Whether the job is on disk listing exactly the nodes of `delivered`
        (disque.overflow): a copy received again merges to nothing."""
        raise NotImplementedError

    def disk_job(self, job_id: bytes) -> Job | None:
        """A copy of a job on disk, read and left there (not registered): to send it
        (disque.overflow)."""
        raise NotImplementedError

    def disk_listing(self, after: int, n: int, nodes: Collection[bytes],
                     end: int) -> tuple[int, list[tuple[bytes, bytes]]]:
        """Of n jobs on disk past segment `after` up to segment `end`, the at-least-once
        ones that list any of `nodes` (each its ID and its listed nodes' IDs,
        concatenated), and the segment to go on after (0: the end): the walks of
        re-replication and repair over the disk (disque.overflow)."""
        raise NotImplementedError

    def disk_last(self) -> int:
        """The newest segment on disk now: where a walk over the disk that starts now ends
        (disque.overflow)."""
        raise NotImplementedError

    def refill(self, q: Queue) -> None:
        """A job is about to be taken from `q`, which has jobs on disk: bring back its
        oldest ones if they are there (disque.overflow)."""
        raise NotImplementedError

    # ------------------------------------------------------------------ cluster view
    # With a Membership (the server always has one) these read the node table; without one
    # (unit tests of the single-node logic) the node is alone.
    def cluster_size(self) -> int:
        """Known non-handshake nodes including myself."""
        m = self.membership
        return m.size() if m is not None else 1

    def reachable_others(self) -> tuple[bytes, ...]:
        m = self.membership
        return m.reachable() if m is not None else ()

    def linked_others(self) -> tuple[bytes, ...]:
        """The reachable nodes our bus link to is up: where copies of jobs go."""
        m = self.membership
        return m.linked() if m is not None else ()

    def is_known_node(self, node_id: bytes) -> bool:
        m = self.membership
        return m.get(node_id) is not None if m is not None else node_id == self.myself

    def reachable_or_known(self) -> list[bytes]:
        """Every node of the table but those in handshake."""
        m = self.membership
        if m is None:
            return []
        return [n.id for n in m.nodes() if not n.bits & 0x08]  # not handshake

    def hello_nodes(self) -> list[ClusterNode]:
        """Every known node for HELLO and CLUSTER NODES."""
        if self.membership is not None:
            return self.membership.nodes()
        me = ClusterNode(self.myself, self.my_ip, self.my_port)
        me.flags = ["myself", "leaving"] if self.leaving else ["myself"]
        return [me]

    def cluster_info(self) -> list[tuple[str, object]]:
        if self.membership is not None:
            return self.membership.cluster_info()
        return [("cluster_state", "ok"), ("cluster_known_nodes", 1),
                ("cluster_reachable_nodes", 0), ("cluster_size", 1),
                ("cluster_stats_messages_sent", 0), ("cluster_stats_messages_received", 0)]

    def link_up(self, node_id: bytes) -> bool:
        """Whether a message to `node_id` can leave now: our outbound bus link to it is up
        (without a membership, a lone node in unit tests: yes)."""
        m = self.membership
        if m is None:
            return True
        n = m.get(node_id)
        return n is not None and n.out_link is not None

    # ------------------------------------------------------------------ outbox
    def send(self, node_id: bytes, msg: Message) -> None:
        if not self.out:
            self.on_out()
        self.out.append((node_id, msg))

    def send_to(self, node_ids: Iterable[bytes], msg: Message) -> None:
        """Send to every listed node but myself."""
        myself = self.myself
        for n in node_ids:
            if n != myself:
                self.send(n, msg)

    def header(self) -> Header:
        m = self.membership
        assert m is not None, "bus messages need a membership"
        return m.header

    def others(self, job: Job) -> list[bytes]:
        myself = self.myself
        return [n for n in job.delivered if n != myself]

    def broadcast_queued(self, job: Job, flags: int) -> None:
        """QUEUED to the job's other holders: it was queued here (spec: re-queue)."""
        if self.others(job):
            self.send_to(job.delivered, Queued(self.header(), job.id, flags | state_bits(job)))

    def log_holders(self, job: Job) -> None:
        """The job's node list grew (a copy's merge, a repair): a LOADJOB with the new list
        goes to the AOF, so that after a restart this node still names every holder (its
        ACK GC asks them all). Only a job that may still be delivered."""
        if self.persist is not None and job.state in (ACTIVE, QUEUED):
            self.persist.loadjob(job)

    def setack(self, job: Job) -> SetAck:
        """The SETACK of a job acknowledged here: aux, the nodes we list (`holders_aux`)."""
        return SetAck(self.header(), job.id, holders_aux(job.delivered))

    def tell_collected(self, sender: bytes, job_id: bytes) -> None:
        """A holder announced a job (WILLQUEUE, QUEUED, YOURJOBS) this node acknowledged
        and collected: a holder the collection missed (an ACK GC runs over the lists of the
        holders it reached, and a list reloaded from the AOF, or one a repair's copy never
        reached, may not name it). SETACK (may-have 0): the holder acks its copy and
        collects it over its own list, instead of queueing it again after its ACK (chaos
        random-kill-aof seed 3: such a copy, queued on a node no list named, was moved by
        NEEDJOBS to the node that had collected the job and delivered 11 s after its ACK).
        Nothing for an ID not collected here: it may be the last copy of a live job."""
        if job_id in self.collected:
            self.send(sender, SetAck(self.header(), job_id, 0))

    # ------------------------------------------------------------------ memory estimate
    @property
    def maxmemory(self) -> int:
        return self._maxmemory

    @maxmemory.setter
    def maxmemory(self, value: int) -> None:
        self._maxmemory = value
        self.mem_evict_at = value * 95 // 100 if value else 1 << 62

    def used_memory(self) -> int:
        """Estimated bytes held: a fixed base, each job (JOB_MEMORY + body) and queue."""
        return self.mem_used

    def above_copy_limit(self) -> bool:
        """Above 75% of maxmemory: this node holds no more copies of other nodes' jobs (it
        refuses REPLJOB) and its own new jobs are replicated externally (memory_level 1+)."""
        return bool(self._maxmemory) and self.mem_used * 4 > self._maxmemory * 3

    def persist_failing(self) -> bool:
        """The AOF cannot be written (a full disk): no new job nor copy is taken here."""
        persist = self.persist
        return persist is not None and persist.last_write_error is not None

    # ------------------------------------------------------------------ registry
    def lookup_job(self, job_id: bytes) -> Job | None:
        """The job with this ID, in memory or (brought back) from disk."""
        job: Job | None = self.jshards[hash(job_id) & self.jmask].get(job_id)
        if job is None and self.on_disk:
            job = self.fault_in(job_id)
        return job

    def register(self, job: Job) -> None:
        """Add a job that is not registered yet (callers look it up first)."""
        self.jshards[hash(job.id) & self.jmask][job.id] = job
        self.jobs.size += 1
        self.mem_used += JOB_MEMORY + len(job.body or b"")
        if job.state == ACTIVE and self.keeps_arrivals():
            self.arrivals.append(job.id)

    def keeps_arrivals(self) -> bool:
        """Whether active jobs registered now go into `arrivals` (memory over half of the
        overflow threshold)."""
        return self.mem_used > self.spill_at >> 1

    def unregister(self, job: Job) -> None:
        """Delete the job from memory and, if queued, from its queue (spec: UNREGISTER)."""
        if job.state == QUEUED:
            self.dequeue(job)
        elif job.state == WAIT_REPL:
            self.replication_removed(job)
        if self.jobs.pop(job.id) is not None:
            self.mem_used -= JOB_MEMORY + len(job.body or b"")
            if job.state == ACKED and not job.flags & F_DUMMY:
                self.note_collected(job.id)
                if self.persist is not None:
                    self.persist.deljob(job.id)  # its acked record (see ack_job) is done
        self.wheel.cancel(job)  # (so the wheel lets go of a deleted job: see disque.timers)

    def note_collected(self, job_id: bytes) -> None:
        """Remember that `job_id` was acknowledged and forgotten here (see `collected`)."""
        collected = self.collected
        collected[job_id] = None
        if len(collected) > COLLECTED_MAX:
            collected.popitem(last=False)

    def delete_job(self, job: Job) -> None:
        """Unregister, logging the deletion when the AOF holds the job."""
        if job.state in (ACTIVE, QUEUED) and self.persist is not None:
            self.persist.deljob(job.id)
        self.unregister(job)

    def shared_delivered(self, nodes: tuple[bytes, ...]) -> tuple[bytes, ...]:
        """One tuple object for every job whose `delivered` list is `nodes`: with
        replication most jobs list the same few nodes, and each tuple of three IDs held
        per job would cost 64 bytes (tuples are immutable: a job whose list changes gets
        a new one). A few hundred distinct lists at most are kept."""
        lists = self.delivered_lists
        shared = lists.get(nodes)
        if shared is None:
            if len(lists) >= 256:
                lists.clear()
            shared = lists[nodes] = nodes
        return shared

    # ------------------------------------------------------------------ queue table
    def lookup_queue(self, name: bytes) -> Queue | None:
        q: Queue | None = self.qshards[hash(name) & self.qmask].get(name)
        return q

    def create_queue(self, name: bytes, now: int = 0) -> Queue:
        shard = self.qshards[hash(name) & self.qmask]
        q: Queue | None = shard.get(name)
        if q is None:
            q = shard[name] = Queue(name, now or self.clock())
            self.queues.size += 1
            self.mem_used += QUEUE_MEMORY
        return q

    def drop_queue(self, q: Queue) -> None:
        if self.queues.pop(q.name) is not None:
            self.mem_used -= QUEUE_MEMORY

    def queue_of(self, job: Job) -> Queue | None:
        """The job's queue object, if it exists (one probe: every ACKJOB asks)."""
        queue = job.queue
        if queue is None:
            return None
        q: Queue | None = self.qshards[hash(queue) & self.qmask].get(queue)
        return q

    # ------------------------------------------------------------------ local job machine
    def enqueue(self, job: Job, now: int = 0) -> bool:
        """Put an active job into its queue (spec: ENQUEUE; original: queueJob).

        Refused for jobs already queued, not active, or that must never be queued again
        (qtime 0: an at-most-once job after its first queueing).
        """
        if job.state != ACTIVE or job.qtime == 0:
            return False
        if not now:
            now = self.clock()
        queue = job.queue
        assert queue is not None  # (only a dummy ACK has none, and it is never active)
        q: Queue | None = self.qshards[hash(queue) & self.qmask].get(queue)
        if q is None:  # (not `or`: that would ask the queue for its length)
            q = self.create_queue(queue, now)
        job.state = QUEUED  # state: ACTIVE -> QUEUED
        if job.flags & F_BCAST_QUEUED:
            q.requeued += 1
        else:
            q.added += 1  # the first queueing on this node: jobs_in == added + requeued
        job.flags = (job.flags | F_BCAST_QUEUED) & ~F_BCAST_WILLQUEUE
        q.jobs.add(job)
        q.jobs_in += 1
        q.atime = now
        # schedule_job() of a queued job, inlined: the next requeue, or the expiry
        if job.retry:
            job.qtime = qtime = (now + job.retry * 1000
                                 + int(self.random() * 2 * REQUEUE_JITTER) - REQUEUE_JITTER)
            when = qtime if qtime < job.etime else job.etime
        else:
            job.qtime = 0
            when = job.etime
        if job.awake != when:
            self.wheel.schedule(job, when)
        if q.waiters and not q.paused & PAUSE_OUT:
            self.serve_waiters(q)
        elif self.needers:
            self.serve_needers(q, now)
        return True

    def dequeue(self, job: Job) -> bool:
        """Take a queued job out of its queue; it stays active (spec: DEQUEUE)."""
        if job.state != QUEUED:
            return False
        q = self.queue_of(job)
        if q is not None:
            q.jobs.remove(job)
        job.state = ACTIVE  # state: QUEUED -> ACTIVE
        return True

    def fetch(self, q: Queue, now: int) -> Job:
        """Pop the oldest job of a queue for a consumer."""
        job = q.jobs.pop_first()
        assert job is not None  # (callers fetch from a non-empty queue)
        job.state = ACTIVE  # state: QUEUED -> ACTIVE
        job.flags |= F_DELIVERED
        q.jobs_out += 1
        q.atime = now
        if len(job.delivered) > 1:
            self.schedule_job(job)  # active with other holders: WILLQUEUE before requeueing
        return job

    def requeue_time(self, job: Job, now: int) -> int:
        # uniform in [-250, +250) ms; random() is several times cheaper than randrange()
        return now + job.retry * 1000 + int(self.random() * 2 * REQUEUE_JITTER) - REQUEUE_JITTER

    def activate(self, job: Job, now: int) -> None:
        """A new job with its copies made (or not needed): queue it, or wait out its
        DELAY; log it to the AOF."""
        job.state = ACTIVE  # state: WAIT_REPL -> ACTIVE
        if job.delay:
            job.qtime = now + job.delay * 1000
            self.schedule_job(job)
        else:
            job.qtime = now
            self.enqueue(job, now)
        if self.persist is not None:
            self.persist.addjob(job)

    def ack_job(self, job: Job) -> None:
        """Mark a job acknowledged (spec: ACK-JOB)."""
        if job.state == ACKED:
            return
        if job.state == QUEUED:
            self.dequeue(job)
        logged = job.state in (ACTIVE, QUEUED) and self.persist is not None
        job.state = ACKED  # state: WAIT_REPL | ACTIVE -> ACKED
        job.gc_retry = 0
        if logged:
            # The acknowledgement itself goes to the AOF (a bodiless acked LOADJOB), not a
            # DELJOB: after a restart this node still answers WILLQUEUE with SETACK, so a
            # copy elsewhere is not queued again after its ACKJOB returned (issue 13).
            assert self.persist is not None
            self.persist.ackjob(job)
        # An acked job always has a GC attempt ahead (qtime, for an acked job): if the node
        # driving the collection dies before its DELJOB arrives, this copy still goes.
        job.qtime = self.clock() + 1000 + int(self.random() * 500) - 250
        self.schedule_job(job)

    def schedule_job(self, job: Job) -> None:
        """(Re)arm the job's timer at its next action: requeue, GC retry or expiry."""
        when = self.next_wake(job)
        if job.awake != when:
            self.wheel.schedule(job, when)

    def next_wake(self, job: Job) -> int:
        """When the job's timer has something to do next: requeue (WILLQUEUE first when
        other nodes may hold it), GC retry or expiry."""
        when = job.etime
        qt = job.qtime
        if qt:
            state = job.state
            if state == ACTIVE:
                if (job.retry and not job.flags & F_BCAST_WILLQUEUE
                        and (len(job.delivered) > 1 or self.myself not in job.delivered)):
                    qt -= 500  # WILLQUEUE first
                if qt < when:
                    when = qt
            elif (state in (QUEUED, ACKED)) and qt < when:
                when = qt
        return when
