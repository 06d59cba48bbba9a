"""The node: jobs, queues and timers of one Disque node, as plain sans-I/O code.

Everything a node decides happens here, driven by three kinds of events: client commands
(called by `disque.commands`), timers (`tick(now)` from the I/O layer) and, with the cluster
issues, bus messages. Effects leave through narrow doors: replies to blocked clients go to
their `Waiter`, persistence records to `self.persist`, cluster messages (later) to an outbox.
The clock (`clock()` -> unix ms) and randomness are injected, so tests run a node with a
fake clock and no sockets.

Procedures carry the spec's names: `enqueue`, `dequeue`, `unregister`, `ack_job`,
`start_gc`; the per-job timer is `process_job`, as in the original's job.c.

Invariants:
- a job is in the registry iff it is known; it is in its queue iff its state is QUEUED;
- `job.qtime == 0` means this node will never queue the job (again): at-most-once jobs after
  their first queueing;
- `job.awake` is the time of the job's live timer-wheel entry (0 after unregister).
"""

from __future__ import annotations

import heapq
import random
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from disque.cluster.deadletters import DeadLetters
from disque.cluster.jobs import RESPONDER_VALID_MS, ClusterJobs, Replication, ReplTimer
from disque.cluster.messages import QUEUED_INCR_DELIV, QUEUED_INCR_NACKS, DelJob, Message
from disque.cluster.nodes import ClusterNode
from disque.cluster.repair import Repair
from disque.cluster.rereplication import Rereplication
from disque.jobs.deadletter import DeadLetter
from disque.jobs.ids import IdGenerator, id_is_at_least_once, id_ttl_minutes
from disque.jobs.job import (
    ACKED,
    ACTIVE,
    F_BCAST_QUEUED,
    F_BCAST_WILLQUEUE,
    F_DELIVERED,
    F_DUMMY,
    F_NACK_DELAYED,
    F_RELOADED,
    JOB_MEMORY,
    QUEUED,
    WAIT_REPL,
    Job,
)
from disque.latency import EVICTION_CYCLE, EXPIRE_CYCLE, LatencyMonitor
from disque.protocol.errors import CommandError, err, leaving
from disque.queues.queue import PAUSE_IN, PAUSE_OUT, Queue
from disque.scan import ScanDict
from disque.timers import Timer, TimerWheel

DEFAULT_TTL = 86400
RETRY_CAP = 300
REQUEUE_JITTER = 250  # ms: requeue times get uniform [-250, +250) added
QUEUE_GC_PERIOD = 100  # ms between queue eviction samples
QUEUE_GC_SHARDS = 16  # queue-table shards sampled per period
EVICT_SAMPLE = 500  # jobs (then queues) one eviction attempt examines at most
COLLECTED_MAX = 100_000  # IDs of collected jobs kept to answer reloaded copies (~10 MB)

# Memory estimate (INFO used_memory and the maxmemory rules). The constants are the measured
# Python cost of a queued job besides its body (JOB_MEMORY, in disque.jobs.job: object, ID,
# registry and queue slots) and of an empty queue object; `BASE_MEMORY` stands for the
# server's fixed structures.
QUEUE_MEMORY = 900
BASE_MEMORY = 1024 * 1024
DEDUP_MEMORY = 150


def _no_callback(now: int) -> None:
    pass


class Waiter:
    """A client blocked in GETJOB. The command layer subclasses it to write the replies."""

    __slots__ = ("queues", "timer", "count", "withcounters", "node")

    def __init__(self, queues: list[bytes], count: int, withcounters: bool) -> None:
        self.queues = queues
        self.count = count
        self.withcounters = withcounters
        self.timer: Timer | None = None
        self.node: Any = None

    def cancel(self) -> None:
        """The client went away."""
        if self.node is not None:
            self.node.unblock(self)

    def on_jobs(self, jobs: list[Job]) -> None:
        raise NotImplementedError

    def on_timeout(self) -> None:
        raise NotImplementedError

    def on_error(self, error: CommandError) -> None:
        raise NotImplementedError


class Node(ClusterJobs):
    def __init__(self, myself: bytes, clock: Callable[[], int], *,
                 rng: random.Random | None = None,
                 randbytes: Callable[[int], bytes] | None = None,
                 maxmemory: int = 1 << 30, maxmemory_policy: str = "acks",
                 queue_idle_timeout: int = 300, latency: LatencyMonitor | None = None) -> None:
        self.myself = myself  # 40 hex chars, as bytes
        self.clock = clock
        # slow timer passes and evictions are recorded here (off unless the server's is on)
        self.latency = latency if latency is not None else LatencyMonitor.disabled()
        self.rng = rng or random.Random()
        self._random = self.rng.random
        self.ids = IdGenerator(myself, randbytes) if randbytes else IdGenerator(myself)
        self.jobs = ScanDict(12)
        self.queues = ScanDict(8)
        self.wheel = TimerWheel()
        self.persist: Any = None  # the AOF, when persistence is on
        self.last_ctime = 0
        self.leaving = False
        self.my_ip = b""  # the address clients and peers reach us at (HELLO)
        self.my_port = 0
        self.maxmemory_policy = maxmemory_policy
        self.queue_idle_timeout = queue_idle_timeout
        self.mem_used = BASE_MEMORY  # running estimate, see used_memory()
        self.mem_evict_at = 0  # 95% of maxmemory: above it, commands that add memory check
        self.maxmemory = maxmemory
        # The registry's shards, held directly: register/lookup are on the hot path.
        self._jshards = self.jobs._shards
        self._jmask = self.jobs._mask
        self._qshards = self.queues._shards
        self._qmask = self.queues._mask
        self.membership: Any = None  # cluster.membership.Membership, set by the server
        self.out: list[tuple[bytes, Message]] = []  # bus messages to send: (node id, msg)
        self.replicating: dict[bytes, Replication] = {}  # sync ADDJOBs waiting for GOTJOB
        self.repl_timer: ReplTimer | None = None  # the newest replications' timer
        self.repl_last: Any = None  # the newest REPLJOB sent, and to which nodes
        self.repl_last_targets: Sequence[bytes] = ()
        # `delivered` lists shared by the jobs that have the same (see shared_delivered)
        self._delivered: dict[tuple[bytes, ...], tuple[bytes, ...]] = {}
        self.rereplication = Rereplication(self)  # copies lost by restarted nodes, again
        self.repair = Repair(self)  # copies of jobs short of a down holder, elsewhere
        self.waiting_queues: set[Queue] = set()  # queues with blocked GETJOB clients
        self.importing: set[Queue] = set()  # queues with a recent import rate
        # ADDJOB ... DEDUP <key>: queue + NUL + key -> (job id, until ms); expiry heap
        # NEEDJOBS that found nothing: queue -> {node: (until ms, count)} (cluster/jobs.py)
        self.needers: dict[bytes, dict[bytes, tuple[int, int]]] = {}
        self.dedup: dict[bytes, tuple[bytes, int]] = {}
        self._dedup_heap: list[tuple[int, bytes]] = []
        self._cluster_timer = Timer(self._cluster_tick)
        self.wheel.schedule(self._cluster_timer, clock() + 100)
        self.blocked = 0  # clients blocked in GETJOB
        self._self_only = (myself,)
        self._queue_gc_cursor = 0
        self._evict_cursor = 0  # registry shard the next eviction attempt starts from
        self._evict_qcursor = 0
        self._queue_gc_timer = Timer(self._queue_gc)
        self.wheel.schedule(self._queue_gc_timer, clock() + QUEUE_GC_PERIOD)
        self.deadletters = DeadLetters(self)
        # jobs reloaded from the AOF waiting for a holder to confirm them (F_RELOADED):
        # job id -> (holders that have not said "unknown" yet, WILLQUEUE rounds so far)
        self.reload_pending: dict[bytes, tuple[set[bytes], int]] = {}
        # IDs of jobs acknowledged and forgotten here (collected by the ACK GC, a DELJOB from
        # the bus, FASTACK), oldest first, at most COLLECTED_MAX: what lets this node tell a
        # reloaded copy "collected, drop it" rather than "unknown here" (a local DELJOB, a
        # copy never received). Past the cap the answer is "unknown": at worst a delivery
        # after the ACK, never a lost job. (An OrderedDict: dropping a plain dict's first key
        # over and over makes each next(iter()) skip every slot deleted before it, ~60 us
        # per collected job once the cap is reached.)
        self.collected: OrderedDict[bytes, None] = OrderedDict()
        self.set_deadletter_defaults(0, 0, b"deadletter")
        self.redrive_rate = 1000  # jobs/s of a REDRIVE without RATE (redrive-rate)

    def set_deadletter_defaults(self, max_deliveries: int, max_nacks: int,
                                queue: bytes) -> None:
        """default-max-deliveries, default-max-nacks, deadletter-queue: the policy of jobs
        added without MAXDELIVERIES / MAXNACKS / DEADLETTER."""
        self.default_max_deliveries = max_deliveries
        self.default_max_nacks = max_nacks
        self.deadletter_queue = queue
        self.deadletter_defaults_on = bool(max_deliveries or max_nacks)

    def set_myself(self, myself: bytes) -> None:
        """A new node ID (CLUSTER RESET HARD): new jobs carry its prefix."""
        self.myself = myself
        self._self_only = (myself,)
        self.ids.prefix = b"D-" + myself[:8] + b"-"

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

    def import_sources(self, q: Queue) -> list[bytes]:
        """Nodes that gave us jobs for `q` in the last RESPONDER_VALID_MS (QSTAT
        import-from; need_jobs forgets older ones only when it is about to ask)."""
        now = self.clock()
        return [n for n, t in q.needjobs_responders.items() if now - t <= RESPONDER_VALID_MS]


    # ------------------------------------------------------------------ memory
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

    def memory_level(self) -> int:
        """0 normal; 1 above 75% of maxmemory; 2 above 95%; 3 above 100%."""
        if not self.maxmemory:
            return 0
        used = self.used_memory()
        if used > self.maxmemory:
            return 3
        if used * 100 > self.maxmemory * 95:
            return 2
        if used * 100 > self.maxmemory * 75:
            return 1
        return 0

    def ensure_memory(self) -> bool:
        """Before a command that adds memory (checklist section 11): above 95% of
        maxmemory, policy `acks` evicts what is safe to drop; the command may run only if
        that brings usage back under 95% (`noeviction`: refused at once)."""
        if self.mem_used <= self.mem_evict_at:
            return True
        if self.maxmemory_policy == "acks":
            self.evict(self.mem_evict_at)
        return self.mem_used <= self.mem_evict_at

    def evict(self, target: int) -> int:
        """One eviction attempt (see evict_sample), timed as the latency event
        `eviction-cycle`."""
        started = self.latency.start()
        freed = self.evict_sample(target)
        self.latency.end(EVICTION_CYCLE, started)
        return freed

    def evict_sample(self, target: int) -> int:
        """Free acked jobs and already delivered at-most-once jobs (never anything a consumer
        could still need), then idle empty queues, until used memory <= target.

        Each call examines a bounded sample (EVICT_SAMPLE jobs, then as many queues), going
        on from where the previous call stopped, so successive calls cover the whole
        registry: when nothing is evictable, a refused ADDJOB costs ~0.1 ms, not a walk over
        millions of jobs (the original gives up after a few random samples)."""
        freed = 0
        for job in self._eviction_sample(self.jobs, "_evict_cursor"):
            if self.used_memory() <= target:
                return freed
            if job.state == ACKED or (job.retry == 0 and job.flags & F_DELIVERED
                                      and job.state != QUEUED):
                self.delete_job(job)
                freed += 1
        # Then empty queues idle for the level-2 idle time (2 s), as the original's
        # evictIdleQueues: a queue used a moment ago keeps its counters and sources.
        now = self.clock()
        idle_ms = min(self.queue_idle_timeout * 1000, 2000)
        for q in self._eviction_sample(self.queues, "_evict_qcursor"):
            if self.used_memory() <= target:
                break
            if q.evictable() and now - q.atime >= idle_ms:
                self.drop_queue(q)
        return freed

    def _eviction_sample(self, table: ScanDict, cursor: str) -> Iterator[Any]:
        """Entries of `table`, whole shards from the shard the attribute `cursor` names
        (advanced as they are visited), until EVICT_SAMPLE entries were handed out."""
        n = table.shard_count()
        examined = 0
        for _ in range(n):
            if examined >= EVICT_SAMPLE:
                return
            i = getattr(self, cursor)
            setattr(self, cursor, (i + 1) % n)
            shard = table.shard(i)
            if shard:
                examined += len(shard)
                yield from list(shard.values())

    # ------------------------------------------------------------------ registry
    def lookup_job(self, job_id: bytes) -> Job | None:
        return self._jshards[hash(job_id) & self._jmask].get(job_id)

    def register(self, job: Job) -> None:
        """Add a job that is not registered yet (callers look it up first)."""
        self._jshards[hash(job.id) & self._jmask][job.id] = job
        self.jobs._len += 1
        self.mem_used += JOB_MEMORY + len(job.body or b"")

    def unregister(self, job: Job) -> None:
        """Delete the job from memory and, if queued, from its queue (spec: UNREGISTER)."""
        if job.state == QUEUED:
            self.dequeue(job)
        elif job.state == WAIT_REPL and job.id in self.replicating:
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

    def persist_failing(self) -> bool:
        """The AOF cannot be written (a full disk): no new job nor copy is taken here."""
        persist = self.persist
        return persist is not None and persist.last_write_error is not None

    def cancel_adds(self, jobs: list[Job]) -> None:
        """New jobs whose LOADJOB could not be written to the AOF (a full disk): their
        clients are told the ADDJOB failed, so they go, here and on the nodes that got a
        copy, and their DEDUP keys with them (a retry must be able to add the job).
        Acknowledged meanwhile: kept, the ack is logged as any other."""
        gone = set()
        for job in jobs:
            if self.lookup_job(job.id) is job and job.state in (ACTIVE, QUEUED):
                self.delete_everywhere(job)
                gone.add(job.id)
        if gone and self.dedup:
            for full, (job_id, _) in list(self.dedup.items()):
                if job_id in gone:
                    del self.dedup[full]
                    self.mem_used -= DEDUP_MEMORY + len(full)

    # ------------------------------------------------------------------ queues
    def lookup_queue(self, name: bytes) -> Queue | None:
        return self._qshards[hash(name) & self._qmask].get(name)

    def create_queue(self, name: bytes, now: int = 0) -> Queue:
        shard = self._qshards[hash(name) & self._qmask]
        q = shard.get(name)
        if q is None:
            q = shard[name] = Queue(name, now or self.clock())
            self.queues._len += 1
            self.mem_used += QUEUE_MEMORY
        return q

    def drop_queue(self, q: Queue) -> None:
        if self.queues.pop(q.name) is not None:
            self.mem_used -= QUEUE_MEMORY

    def enqueue(self, job: Job, now: int = 0) -> bool:
        """Put an active job into its queue (spec: ENQUEUE; original: queueJob).

        Refused for jobs already queued, not active, or that must never be queued again
        (qtime 0: an at-most-once job after its first queueing).
        """
        if job.state != ACTIVE or job.qtime == 0:
            return False
        if not now:
            now = self.clock()
        q = self._qshards[hash(job.queue) & self._qmask].get(job.queue)
        if q is None:  # (not `or`: that would ask the queue for its length)
            q = self.create_queue(job.queue, now)
        job.state = QUEUED
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
                                 + int(self._random() * 2 * REQUEUE_JITTER) - REQUEUE_JITTER)
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
        q = self.lookup_queue(job.queue)
        if q is not None:
            q.jobs.remove(job)
        job.state = ACTIVE
        return True

    def fetch(self, q: Queue, now: int) -> Job:
        """Pop the oldest job of a queue for a consumer."""
        job = q.jobs.pop_first()
        job.state = ACTIVE
        job.flags |= F_DELIVERED
        q.jobs_out += 1
        q.atime = now
        if len(job.delivered) > 1:
            self.schedule_job(job)  # active with other holders: WILLQUEUE before requeueing
        return job

    def requeue_time(self, job: Job, now: int) -> int:
        # uniform in [-250, +250) ms; random() is several times cheaper than randrange()
        return now + job.retry * 1000 + int(self._random() * 2 * REQUEUE_JITTER) - REQUEUE_JITTER

    # ------------------------------------------------------------------ ADDJOB
    def job_options(self, replicate: int | None, ttl: int | None, retry: int | None,
                    delay: int) -> tuple[int, int, int]:
        """ADDJOB's defaults and checks 3 and 4 (options that contradict each other):
        (repl, ttl, retry)."""
        if replicate is None:
            # min(3, reachable nodes) as issue 5 asks (the original counted every known node,
            # failing ones too, so one dead node of three made every default ADDJOB fail).
            m = self.membership
            size = 1 + len(m.reachable()) if m is not None and m.size() > 1 else 1
            repl = 3 if size >= 3 else size
        else:
            repl = replicate
        if ttl is None:
            ttl = DEFAULT_TTL
        if retry is None:
            retry = RETRY_CAP if ttl >= 10 * RETRY_CAP else max(1, ttl // 10)
        elif retry == 0 and repl > 1:
            raise err("With RETRY set to 0 please explicitly set  REPLICATE to 1 "
                      "(at-most-once delivery)")
        if delay >= ttl:
            raise err("The specified DELAY is greater than TTL. Job refused since would "
                      "never be delivered")
        return repl, ttl, retry

    def add_job(self, queue: bytes, body: bytes, timeout_ms: int, replicate: int | None,
                ttl: int | None, retry: int | None, delay: int, maxlen: int | None,
                async_: bool, dl: DeadLetter | None = None) -> Job:
        """ADDJOB after option parsing: checks 3..7 of the checklist, in order. `dl`: the
        job's dead-letter policy (MAXDELIVERIES / MAXNACKS / DEADLETTER), if any."""
        m = self.membership
        clustered = m is not None and m.size() > 1
        repl, ttl, retry = self.job_options(replicate, ttl, retry, delay)
        # External replication (checklist section 4): above 75% of maxmemory, or when leaving,
        # the node keeps no copy. Above 75% a lone node keeps its own (nobody else can hold
        # it: a documented choice); a leaving one refuses the job as the original does, since
        # it is about to drop whatever it holds.
        external = self.leaving
        # Copies go to linked nodes (reachable, bus link up); the NOREPL check counts the
        # reachable ones, as the original: a node whose link is down for a moment (a
        # reconnect) does not fail the ADDJOB, its job waits for a link (link_changed).
        linked: tuple[bytes, ...] = ()
        if clustered:
            linked = m.linked()
            if self.above_copy_limit():
                external = True
        needed = repl if external else repl - 1
        if needed > len(linked):
            reachable = m.reachable() if clustered else ()
            if needed > len(reachable):
                if external and needed - 1 == len(reachable):
                    why = "I'm leaving the cluster" if self.leaving else "I'm out of memory"
                    raise CommandError("NOREPL", "Not enough reachable nodes for the requested"
                                       " replication level, since I'm unable to hold a copy of"
                                       f" the message for the following reason: {why}")
                raise CommandError("NOREPL", "Not enough reachable nodes for the requested "
                                             "replication level")
            if async_ and external and not linked:
                # kept nowhere here and sent nowhere: the ID would name a job that is lost
                raise CommandError("NOREPL", "Not enough reachable nodes for the requested "
                                             "replication level")
        q = self._qshards[hash(queue) & self._qmask].get(queue)
        if q is not None:
            if maxlen is not None and len(q.jobs) >= maxlen:
                raise CommandError("MAXLEN", "Queue is already longer than the specified "
                                             "MAXLEN count")
            if q.paused & PAUSE_IN:
                raise CommandError("PAUSED", "Queue paused in input, try later")
            queue = q.name  # one shared bytes object for all the queue's jobs
        now = self.clock()
        ctime = now * 1_000_000  # strictly increasing per node (checklist section 3)
        if ctime <= self.last_ctime:
            ctime = self.last_ctime + 1
        self.last_ctime = ctime
        job_id = self.ids.new_id(ttl, retry)
        job = Job(job_id, queue, body, repl, ctime, now + ttl * 1000, delay, retry,
                  self._self_only)
        if dl is not None:
            job.dl = dl
        if needed:
            return self._add_replicated(job, linked, needed, external, async_, now,
                                        timeout_ms)
        # register(), inlined: this is the hot path of ADDJOB
        self._jshards[hash(job_id) & self._jmask][job_id] = job
        self.jobs._len += 1
        self.mem_used += JOB_MEMORY + len(body)
        job.state = ACTIVE
        if delay:
            job.qtime = now + delay * 1000
            self.schedule_job(job)
        elif q is not None and not q.waiters and not self.needers:
            # enqueue() of a brand-new job into an existing queue nobody waits on, inlined
            job.state = QUEUED
            job.flags = F_BCAST_QUEUED
            q.jobs.add(job)
            q.jobs_in += 1
            q.added += 1
            q.atime = now
            if retry:
                job.qtime = (now + retry * 1000 + int(self._random() * 2 * REQUEUE_JITTER)
                             - REQUEUE_JITTER)
                self.wheel.schedule(job, job.qtime if job.qtime < job.etime else job.etime)
            else:
                job.qtime = 0
                self.wheel.schedule(job, job.etime)
        else:
            job.qtime = now  # due: the first queueing below
            self.enqueue(job, now)
        if self.persist is not None:
            self.persist.addjob(job)
        return job

    def _add_replicated(self, job: Job, linked: tuple[bytes, ...], needed: int,
                        external: bool, async_: bool, now: int, timeout_ms: int) -> Job:
        """ADDJOB with copies on other nodes: sync (the job waits in wait-repl and the
        command layer parks the client with wait_replication) or ASYNC. The copies go to
        linked nodes; with fewer of them than needed, to all of them now, and a sync job
        takes the others as their links come up (link_changed) or at a retry tick."""
        # every linked node when all are needed (R3 on 3 nodes) or fewer are linked: no
        # sampling to pay for, and the membership's own tuple, which tells start_replication
        # that consecutive jobs go to the same nodes; one of them (R2): one random() rather
        # than rng.sample's
        if needed >= len(linked):
            targets: Sequence[bytes] = linked
        elif needed == 1:
            targets = [linked[int(self._random() * len(linked))]]
        else:
            targets = self.rng.sample(linked, needed)
        job.delivered = self.shared_delivered((() if external else self._self_only)
                                              + tuple(targets))
        if async_ and external:
            self.start_replication(job, targets, True, True, now)  # never registered here
            job.state = ACTIVE  # not WAIT_REPL: the command layer must not wait for it
            return job
        self.register(job)
        if async_:
            self.activate(job, now)
        elif not timeout_ms or now + timeout_ms >= job.etime:
            # Expiry while waiting. Not needed when the ADDJOB times out first: the job
            # leaves wait-repl by then (replicated and scheduled, or deleted), and no
            # timer-wheel entry for its expiry is left to hold it for its whole TTL.
            self.schedule_job(job)
        self.start_replication(job, targets, external, async_, now)
        return job

    def shared_delivered(self, nodes: tuple[bytes, ...]) -> tuple[bytes, ...]:
        """One tuple object for every job whose `delivered` list is `nodes`: with
        replication most jobs list the same few nodes, and each tuple of three IDs held
        per job would cost 64 bytes (tuples are immutable: a job whose list changes gets
        a new one). A few hundred distinct lists at most are kept."""
        shared = self._delivered.get(nodes)
        if shared is None:
            if len(self._delivered) >= 256:
                self._delivered.clear()
            shared = self._delivered[nodes] = nodes
        return shared

    def activate(self, job: Job, now: int) -> None:
        """A new job with its copies made (or not needed): queue it, or wait out its
        DELAY; log it to the AOF."""
        job.state = ACTIVE
        if job.delay:
            job.qtime = now + job.delay * 1000
            self.schedule_job(job)
        else:
            job.qtime = now
            self.enqueue(job, now)
        if self.persist is not None:
            self.persist.addjob(job)

    def load_job(self, job: Job, enqueue_queued: bool) -> bool:
        """Restore a job read from the AOF (a LOADJOB record); False if it is skipped.

        Expired jobs are dropped. A job saved as queued comes back queued only after a
        controlled restart (`enqueue_queued`, aof-enqueue-jobs-once); otherwise it is active
        and re-queued by its timer after delay + retry. At-most-once jobs are never queued
        again (they may have been delivered), except one whose delay is still running:
        that one cannot have been queued yet, so it is queued when its delay ends.
        """
        now = self.clock()
        if job.etime <= now or job.state == WAIT_REPL:
            return False
        old = self.lookup_job(job.id)
        if old is not None:
            self.unregister(old)
        if job.state == ACKED:
            # An acknowledgement (see ack_job): kept so that it answers for the job, and
            # collected by the usual GC, starting a second from now.
            self.register(job)
            job.awake = 0
            job.qtime = now + 1000 + int(self._random() * 500) - 250
            self.schedule_job(job)
            return True
        saved_queued = job.state == QUEUED
        job.state = ACTIVE
        job.awake = 0
        self.register(job)
        if saved_queued and enqueue_queued:
            job.qtime = now
            self.enqueue(job, now)
            return True
        if job.retry:
            job.qtime = now + (job.delay + job.retry) * 1000 + \
                int(self._random() * 2 * REQUEUE_JITTER) - REQUEUE_JITTER
            if len(job.delivered) > 1 or self.myself not in job.delivered:
                # It may have been acked and collected while we were down: ask first
                # (see ClusterJobs.requeue_by_timer).
                job.flags |= F_RELOADED
        elif (not job.flags & F_BCAST_QUEUED
              and job.ctime // 1_000_000 + job.delay * 1000 > now):
            # Queueing is not logged: only a delay still running at the restart proves the
            # job was never queued (so never delivered). One whose delay already ended may
            # have been queued and delivered after its LOADJOB was written.
            job.qtime = job.ctime // 1_000_000 + job.delay * 1000
        else:
            job.qtime = 0
        self.schedule_job(job)
        return True

    # ------------------------------------------------------------------ DEDUP
    # Idempotent production (ADDJOB ... DEDUP <key>): a producer that retries (a Spark task
    # attempt, a client after a lost reply) sends the same key; within the job's TTL this
    # node answers with the first job's ID instead of adding a copy, even after the job was
    # acked and collected. The memory is per node: a retry must reach the same node.
    def dedup_lookup(self, queue: bytes, key: bytes) -> bytes | None:
        entry = self.dedup.get(queue + b"\0" + key)
        if entry is None:
            return None
        if entry[1] <= self.clock():
            return None
        return entry[0]

    def dedup_remember(self, queue: bytes, key: bytes, job: Job) -> None:
        full = queue + b"\0" + key
        self.dedup[full] = (job.id, job.etime)
        heapq.heappush(self._dedup_heap, (job.etime, full))
        self.mem_used += DEDUP_MEMORY + len(full)

    def dedup_forget(self, queue: bytes, key: bytes, job_id: bytes) -> None:
        """The ADDJOB failed (NOREPL): a retry must be able to add the job."""
        full = queue + b"\0" + key
        entry = self.dedup.get(full)
        if entry is not None and entry[0] == job_id:
            del self.dedup[full]
            self.mem_used -= DEDUP_MEMORY + len(full)

    def dedup_expire(self, now: int) -> None:
        heap = self._dedup_heap
        dedup = self.dedup
        while heap and heap[0][0] <= now:
            until, full = heapq.heappop(heap)
            entry = dedup.get(full)
            if entry is not None and entry[1] <= now:
                del dedup[full]
                self.mem_used -= DEDUP_MEMORY + len(full)

    # ------------------------------------------------------------------ GETJOB
    def get_jobs(self, names: list[bytes], count: int) -> list[Job]:
        """Passes over the queues left to right, one job per queue per pass, until `count`
        jobs or a pass that yields nothing. Queues paused in output are skipped."""
        shards = self._qshards
        mask = self._qmask
        if count == 1 and len(names) == 1:  # the common GETJOB [NOHANG] FROM q
            q = shards[hash(names[0]) & mask].get(names[0])
            if q is None or not q.jobs._len or q.paused & PAUSE_OUT:
                self.need_jobs_for(names[0], q)
                return []
            now = self.clock()
            job = self.fetch(q, now)
            if not q.jobs._len and (q.needjobs_responders or q.waiters):
                self.need_jobs(q, now, reached_zero=True)
            return [job]
        jobs: list[Job] = []
        queues = [shards[hash(n) & mask].get(n) for n in names]
        now = 0
        while True:
            got = False
            for i, q in enumerate(queues):
                if q is not None and q.jobs and not q.paused & PAUSE_OUT:
                    if not now:
                        now = self.clock()
                    jobs.append(self.fetch(q, now))
                    if not q.jobs and (q.needjobs_responders or q.waiters):
                        self.need_jobs(q, now, reached_zero=True)
                    got = True
                    if len(jobs) >= count:
                        return jobs
                else:
                    queues[i] = self.need_jobs_for(names[i], q)
            if not got:
                return jobs

    def need_jobs_for(self, name: bytes, q: Queue | None) -> Queue | None:
        """GETJOB found nothing in `name`: a NEEDJOBS attempt, creating the queue object
        that holds its backoff state (checklist section 4, GETJOB side effects; the original
        does this for NOHANG and non-blocking fetches too, not only for blocked clients)."""
        if self.membership is None or self.leaving or self.cluster_size() < 2:
            return q  # alone: nobody to ask, and no queue object is created
        now = self.clock()
        if q is None:
            q = self.create_queue(name, now)
        self.need_jobs(q, now)
        return q

    def block(self, waiter: Waiter, timeout_ms: int) -> None:
        """Park a GETJOB client on its queues until a job, the timeout, or LEAVING."""
        if self.leaving:
            raise leaving()
        waiter.node = self
        now = self.clock()
        for name in waiter.queues:
            q = self.create_queue(name, now)
            q.waiters[waiter] = None
            self.waiting_queues.add(q)
            if not q.jobs:
                self.need_jobs(q, now)
        self.blocked += 1
        if timeout_ms:
            waiter.timer = Timer(lambda now, w=waiter: self._waiter_timeout(w))
            self.wheel.schedule(waiter.timer, self.clock() + timeout_ms)

    def unblock(self, waiter: Waiter) -> None:
        """Forget a blocked client (served, timed out, or disconnected)."""
        removed = False
        for name in waiter.queues:
            q = self.queues.get(name)
            if q is not None and q.waiters.pop(waiter, 0) is None:
                removed = True
                if not q.waiters:
                    self.waiting_queues.discard(q)
                    # the last blocked client left: try to collect the queue now (original
                    # unblockClientBlockedForJobs -> GCQueue)
                    if q.evictable() and self.clock() - q.atime >= self.queue_idle_ms():
                        self.drop_queue(q)
        if removed:
            self.blocked -= 1
        if waiter.timer is not None:
            self.wheel.cancel(waiter.timer)
            waiter.timer.callback = _no_callback  # the closure holds the waiter: no cycle
            waiter.timer = None

    def _waiter_timeout(self, waiter: Waiter) -> None:
        self.unblock(waiter)
        waiter.on_timeout()

    def serve_waiters(self, q: Queue) -> None:
        """Hand jobs of `q` to its blocked clients, oldest client first, one job each."""
        waiters = q.waiters
        while q.jobs and waiters and not q.paused & PAUSE_OUT:
            waiter = next(iter(waiters))
            self.unblock(waiter)
            now = self.clock()
            waiter.on_jobs([self.fetch(q, now)])
            if not q.jobs and (q.needjobs_responders or waiters):
                self.need_jobs(q, now, reached_zero=True)

    def set_leaving(self, flag: bool) -> None:
        """CLUSTER LEAVING yes|no; blocked GETJOB clients are told to go elsewhere."""
        self.leaving = flag
        if self.membership is not None:
            self.membership.set_leaving(flag)
        if flag:
            self.leaving_started()
            for q in list(self.queues.values()):
                for waiter in list(q.waiters):
                    self.unblock(waiter)
                    waiter.on_error(leaving())

    # ------------------------------------------------------------------ ACK and friends
    def ack_job(self, job: Job) -> None:
        """Mark a job acknowledged (spec: ACK-JOB)."""
        if job.state == ACKED:
            return
        if job.state == QUEUED:
            self.dequeue(job)
        logged = job.state in (ACTIVE, QUEUED) and self.persist is not None
        job.state = ACKED
        job.gc_retry = 0
        if logged:
            # The acknowledgement itself goes to the AOF (a bodiless acked LOADJOB), not a
            # DELJOB: after a restart this node still answers WILLQUEUE with SETACK, so a
            # copy elsewhere is not queued again after its ACKJOB returned (issue 13).
            self.persist.ackjob(job)
        # An acked job always has a GC attempt ahead (qtime, for an acked job): if the node
        # driving the collection dies before its DELJOB arrives, this copy still goes.
        job.qtime = self.clock() + 1000 + int(self._random() * 500) - 250
        self.schedule_job(job)

    def ackjob(self, ids: Iterable[bytes]) -> int:
        known = 0
        for job_id in ids:
            job = self.jobs.get(job_id)
            if job is None:
                if (self.cluster_size() > 1 and not self.leaving
                        and id_is_at_least_once(job_id)):
                    self._dummy_ack(job_id)
                continue
            if job.state != ACKED:
                known += 1
                self.count_acked(job)
                if job.delivered == self._self_only:
                    # Only this node ever held it: START-GC would find nobody to ask and
                    # delete it at once, so skip the GC timer ack_job arms for copies
                    # elsewhere (a timer entry, a clock read and a random draw per ACK).
                    self.delete_job(job)
                    job.state = ACKED
                    continue
                self.ack_job(job)
            self.start_gc(job)
        return known

    def count_acked(self, job: Job) -> None:
        """A client acknowledged a job here (ACKJOB / FASTACK): the queue's acked total,
        when the queue object still exists (an evicted empty queue is not re-created)."""
        q = self.queue_of(job)
        if q is not None:
            q.acked += 1

    def count_nacked(self, job: Job) -> None:
        q = self.queue_of(job)
        if q is not None:
            q.nacked += 1

    def queue_of(self, job: Job) -> Queue | None:
        return (self._qshards[hash(job.queue) & self._qmask].get(job.queue)
                if job.queue is not None else None)

    def _dummy_ack(self, job_id: bytes) -> None:
        now = self.clock()
        job = Job(job_id, None, None, 0, 0, now + id_ttl_minutes(job_id) * 60_000, 0, 0, ())
        job.state = ACKED
        job.flags |= F_DUMMY
        job.confirmed = self._self_only
        self.register(job)
        self.schedule_job(job)
        self.start_gc(job)

    def fastack(self, ids: Iterable[bytes]) -> int:
        """Delete locally and send a best-effort DELJOB to every node that may have a copy
        (to every node, for a job we do not know)."""
        known = 0
        for job_id in ids:
            job = self.jobs.get(job_id)
            if job is not None:
                known += 1
                if job.state != ACKED:
                    self.count_acked(job)
                if self.others(job):
                    self.send_to(job.delivered, DelJob(self.header(), job_id))
                    self.note_collected(job_id)
                self.delete_job(job)
            elif self.membership is not None and self.cluster_size() > 1:
                self.send_to(self.reachable_or_known(), DelJob(self.header(), job_id))
        return known

    def deljob(self, ids: Iterable[bytes]) -> int:
        known = 0
        for job_id in ids:
            job = self.jobs.get(job_id)
            if job is not None:
                known += 1
                self.delete_job(job)
        return known

    def enqueue_jobs(self, ids: Iterable[bytes], nack: bool = False) -> int:
        """ENQUEUE / NACK: active jobs back into their queue; counters as the checklist."""
        moved = 0
        for job_id in ids:
            job = self.jobs.get(job_id)
            if job is None or job.state != ACTIVE:
                continue
            if nack and job.dl is not None and job.qtime and \
                    self.deadletters.check(job, self.clock(), nack=True):
                moved += 1  # over its limit: into its dead-letter queue instead
                continue
            if job.qtime == 0:
                continue  # never queued again (enqueue refuses it)
            # counters first: enqueue may hand the job at once to a blocked GETJOB, whose
            # WITHCOUNTERS reply must include them
            requeued = job.flags & F_BCAST_QUEUED
            if nack:
                job.nacks += 1
                self.count_nacked(job)
                flags = QUEUED_INCR_NACKS
            elif requeued:
                job.deliveries += 1
                flags = QUEUED_INCR_DELIV
            else:
                flags = 0
            self.enqueue(job)
            moved += 1
            if self.membership is not None and (nack or requeued):
                self.broadcast_queued(job, flags)
        return moved

    def nack_jobs(self, ids: Iterable[bytes], delay: int | None = None) -> int:
        """NACK [DELAY seconds]: the consumer failed; the job goes back to its queue at once,
        or after `delay` seconds (its requeue timer is set to then, and the other holders
        push theirs past it). Without DELAY, a job added with BACKOFF is put off by its
        backoff for the delivery that failed (DeadLetter.backoff_delay). Counts a nack
        either way, never an additional delivery."""
        if delay == 0:
            return self.enqueue_jobs(ids, nack=True)
        moved = 0
        now = self.clock()
        for job_id in ids:
            job = self.jobs.get(job_id)
            if job is None or job.state != ACTIVE:
                continue
            wait = delay
            if wait is None:
                dl = job.dl
                wait = (dl.backoff_delay(1 + job.nacks + job.deliveries, self._random())
                        if dl is not None and dl.backoff and job.qtime else 0)
                if not wait:
                    moved += self.enqueue_jobs((job_id,), nack=True)
                    continue
            if job.qtime == 0:
                continue
            moved += 1
            if job.dl is not None and self.deadletters.check(job, now, nack=True):
                continue
            job.nacks += 1
            self.count_nacked(job)
            job.qtime = now + wait * 1000
            job.flags = (job.flags | F_NACK_DELAYED) & ~F_BCAST_WILLQUEUE
            self.schedule_job(job)
            if self.membership is not None:
                self.broadcast_nack_delay(job, wait)
        return moved

    def dequeue_jobs(self, ids: Iterable[bytes]) -> int:
        moved = 0
        for job_id in ids:
            job = self.jobs.get(job_id)
            if job is not None and self.dequeue(job):
                moved += 1
        return moved

    def working(self, job_id: bytes) -> int:
        """Postpone the next delivery by the retry time; returns the retry (seconds)."""
        job = self.jobs.get(job_id)
        if job is None:
            raise CommandError("NOJOB", "Job not known in the context of this node.")
        now = self.clock()
        ctime_ms = job.ctime // 1_000_000
        if now - ctime_ms > (job.etime - ctime_ms) / 2:
            raise CommandError("TOOLATE", "Half of job TTL already elapsed, you are no longer "
                                          "allowed to postpone the next delivery.")
        if job.state == QUEUED:
            self.dequeue(job)
        # An acked job's qtime is its next GC attempt, not a requeue time: leave it alone.
        if job.retry and job.qtime and job.state != ACKED:
            job.qtime = self.requeue_time(job, now)
            job.flags &= ~F_BCAST_WILLQUEUE
            self.schedule_job(job)
        if self.membership is not None:
            self.broadcast_working(job)
        return job.retry

    # ------------------------------------------------------------------ PAUSE
    def pause(self, name: bytes, flags: int | None) -> bytes:
        """Set (flags not None) and report a queue's pause state."""
        q = self.queues.get(name)
        if flags is not None:
            if q is None and flags:
                q = self.create_queue(name)
            if q is not None:
                old = q.paused
                q.paused = flags
                if old & PAUSE_OUT and not flags & PAUSE_OUT and q.waiters:
                    self.serve_waiters(q)
        return q.pause_name() if q is not None else b"none"

    # ------------------------------------------------------------------ timers
    def schedule_job(self, job: Job) -> None:
        """(Re)arm the job's timer at its next action: requeue, GC retry or expiry."""
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
        if job.awake != when:
            self.wheel.schedule(job, when)

    def next_due(self) -> int | None:
        return self.wheel.next_due()

    def tick(self, now: int | None = None) -> None:
        """Run everything the wheel says is due; the pass is timed as the latency event
        `expire-cycle` (jobs expire here, as keys do in Redis's expire cycle)."""
        started = self.latency.start()
        if now is None:
            now = self.clock()
        for entry in self.wheel.due(now):
            if entry.__class__ is Job:
                if entry.awake and entry.awake <= now:
                    self.process_job(entry, now)
            elif entry.awake and entry.awake <= now:
                entry.awake = 0
                entry.callback(now)
        self.latency.end(EXPIRE_CYCLE, started)

    def process_job(self, job: Job, now: int) -> None:
        """The per-job timer (original: processJob)."""
        job.awake = 0
        if now >= job.etime:
            dl = job.dl
            if (dl is not None and dl.dead_on_expiry() and job.state in (ACTIVE, QUEUED)
                    and (job.retry or job.state == QUEUED)):
                # (an at-most-once job only while it is still queued: never delivered)
                self.deadletters.expired(job, now)
            else:
                self.delete_job(job)
            return
        qtime = job.qtime
        state = job.state
        if qtime and state == ACTIVE:
            if now >= qtime:
                q = self.queues.get(job.queue)
                if job.retry and q is not None and q.paused & PAUSE_IN:
                    job.qtime = self.requeue_time(job, now)
                else:
                    self.requeue_by_timer(job, now)
            elif job.retry and not job.flags & F_BCAST_WILLQUEUE and now >= qtime - 500:
                self.will_queue(job)
        elif qtime and state == QUEUED and now >= qtime:
            job.qtime = self.requeue_time(job, now) if job.retry else 0
            if job.dl is not None and job.dl.epoch & 1:
                self.deadletters.still_queued(job)
        elif qtime and state == ACKED and now >= qtime:
            self.start_gc(job)
        if self.jobs.get(job.id) is job:
            self.schedule_job(job)

    def _cluster_tick(self, now: int) -> None:
        self.cluster_cron(now)
        self.rereplication.tick(now)
        self.repair.tick(now)
        self.wheel.schedule(self._cluster_timer, now + 100)

    def queues_with_waiters(self) -> list[Queue]:
        return list(self.waiting_queues)

    def queue_idle_ms(self) -> int:
        """How long an empty queue must be idle to be collected: queue-idle-timeout, at
        most 10 s above 75% of maxmemory and 2 s above 95% (checklist section 10)."""
        idle_ms = self.queue_idle_timeout * 1000
        level = self.memory_level()
        if level >= 2:
            return min(idle_ms, 2000)
        if level >= 1:
            return min(idle_ms, 10000)
        return idle_ms

    def _queue_gc(self, now: int) -> None:
        """Evict a sample of empty, idle, unpaused queues with no blocked clients, forget
        expired DEDUP keys, and above 95% of maxmemory evict what is safe to drop (the
        original evicts before every command: this frees memory while a full node only
        serves GETJOB / ACKJOB, without a per-command cost)."""
        self.dedup_expire(now)
        if self.mem_used > self.mem_evict_at and self.maxmemory_policy == "acks":
            self.evict(self.mem_evict_at)
        idle_ms = self.queue_idle_ms()
        queues = self.queues
        n = queues.shard_count()
        for _ in range(QUEUE_GC_SHARDS):
            shard = queues.shard(self._queue_gc_cursor)
            self._queue_gc_cursor = (self._queue_gc_cursor + 1) % n
            if shard:
                for q in [q for q in shard.values() if q.evictable()
                          and now - q.atime >= idle_ms]:
                    self.drop_queue(q)
        self.wheel.schedule(self._queue_gc_timer, now + QUEUE_GC_PERIOD)

    # ------------------------------------------------------------------ admin
    def flushall(self) -> None:
        """Delete every job and queue (DEBUG FLUSHALL, CLUSTER RESET); blocked clients get
        a nil reply, clients waiting on replication -NOREPL."""
        for rep in list(self.replicating.values()):
            self.replication_removed(rep.job)
        for q in list(self.queues.values()):
            for waiter in list(q.waiters):
                self.unblock(waiter)
                waiter.on_timeout()
        for job in list(self.jobs.values()):
            self.wheel.cancel(job)
            if (job.state in (ACTIVE, QUEUED) or job.state == ACKED
                    and not job.flags & F_DUMMY) and self.persist is not None:
                self.persist.deljob(job.id)
        self.jobs.clear()
        self.reload_pending.clear()
        self.collected.clear()
        self.queues.clear()
        self.waiting_queues.clear()
        self.importing.clear()
        self.dedup.clear()
        self._dedup_heap.clear()
        self.needers.clear()
        self.deadletters.clear()
        self.mem_used = BASE_MEMORY
