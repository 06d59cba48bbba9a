"""The node: its subsystems, composed, and the API the commands call. Sans-I/O.

Everything a node decides happens below this object, driven by three kinds of events:
client commands (called by `disque.commands`), timers (`tick(now)` from the I/O layer) and
bus messages (`on_message`, routed by type). The node is its shared state
(`disque.state.NodeState`: identity, clock, registry, queue table, timer wheel, outbox,
persistence, cluster view, and the local job procedures `enqueue`, `dequeue`, `unregister`,
`ack_job`...) plus one object per subsystem, each in its own module and built here with the
state and the few callables it needs from another:

    replication   cluster/replication.py  REPLJOB / GOTJOB / ENQUEUE (job.c)
    requeue       cluster/requeue.py      WILLQUEUE / QUEUED / WORKING; ENQUEUE, NACK...
    acks          cluster/acks.py         ACKJOB, FASTACK, SETACK / GOTACK / DELJOB (ack.c)
    federation    cluster/federation.py   NEEDJOBS / YOURJOBS (queue.c)
    deadletters   cluster/deadletters.py  dead-letter queues and REDRIVE
    rereplication cluster/rereplication.py copies a restarted node lost, again
    repair        cluster/repair.py       copies of jobs short of a down holder
    waiting       queues/waiting.py       blocked GETJOB clients (blocked.c)
    memory        memory.py               maxmemory levels, eviction, queue GC
    dedup         jobs/dedup.py           ADDJOB ... DEDUP keys

This module keeps ADDJOB and GETJOB (the command-facing hot paths), restoring jobs from the
AOF, the per-job timer (`process_job`, as the original's job.c), PAUSE, LEAVING, FLUSHALL,
and the table from bus message type to handler. See docs/architecture.md for the map.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Collection, Iterable, Sequence
from typing import Any, Final

from disque.cluster.acks import Acks
from disque.cluster.deadletters import DeadLetters
from disque.cluster.federation import Federation
from disque.cluster.membership import Membership
from disque.cluster.messages import (
    DelJob,
    EnqueueJob,
    GotAck,
    GotJob,
    GotJobBatch,
    Message,
    NeedJobs,
    PauseQueue,
    Queued,
    ReplJob,
    ReplJobBatch,
    SetAck,
    WillQueue,
    WorkingJob,
    YourJobs,
)
from disque.cluster.repair import Repair
from disque.cluster.replication import JobReplication, ReplJobsOut, ReplWaiter
from disque.cluster.requeue import Requeue
from disque.cluster.rereplication import Rereplication
from disque.jobs.deadletter import DeadLetter
from disque.jobs.dedup import Dedup
from disque.jobs.job import (
    ACKED,
    ACTIVE,
    F_BCAST_QUEUED,
    F_BCAST_WILLQUEUE,
    F_DUMMY,
    JOB_MEMORY,
    QUEUED,
    Job,
)
from disque.jobs.restore import restore_job
from disque.latency import EXPIRE_CYCLE, LatencyMonitor
from disque.memory import Memory
from disque.overflow.spill import Overflow
from disque.protocol.errors import CommandError, err, leaving
from disque.queues.queue import PAUSE_IN, PAUSE_OUT, Queue
from disque.queues.waiting import Waiter, Waiting
from disque.state import BASE_MEMORY, REQUEUE_JITTER, NodeState
from disque.timers import Timer

__all__ = ["Node", "Waiter"]

DEFAULT_TTL: Final = 86400
RETRY_CAP: Final = 300
CLUSTER_CRON_MS: Final = 100


def _nothing() -> None:
    pass


class Node(NodeState):
    def __init__(self, myself: bytes, clock: Callable[[], int], *,
                 rng: random.Random | None = None,
                 randbytes: Callable[[int], bytes] | None = None,
                 maxmemory: int = 1 << 30, maxmemory_policy: str = "acks",
                 queue_idle_timeout: int = 300, latency: LatencyMonitor | None = None,
                 membership: Membership | None = None,
                 on_out: Callable[[], None] = _nothing, registry_bits: int = 12) -> None:
        super().__init__(myself, clock, rng=rng, randbytes=randbytes, maxmemory=maxmemory,
                         latency=latency, membership=membership, on_out=on_out,
                         registry_bits=registry_bits)
        self.last_ctime = 0
        self.deadletters = DeadLetters(self)
        self.requeue = Requeue(self, self.deadletters)
        self.rereplication = Rereplication(self)  # copies lost by restarted nodes, again
        self.repair = Repair(self, self.rereplication)  # copies short of a down holder
        self.replication = JobReplication(self, self.copy_confirmed,
                                          self.requeue.reload_confirmed,
                                          self.rereplication.copy_again,
                                          self.rereplication.copies_held)
        self.acks = Acks(self, self.replication.replication_achieved)
        self.waiting = Waiting(self, self.need_jobs, self.queue_idle_ms)
        self.federation = Federation(self, self.waiting.queues_with_waiters)
        self.dedup = Dedup(self)
        self._cluster_timer = Timer(self._cluster_tick)
        self.wheel.schedule(self._cluster_timer, clock() + CLUSTER_CRON_MS)
        self.overflow = Overflow(self, self._crossed, self.replication.replicating.__contains__)
        self.memory = Memory(self, self.dedup.expire, maxmemory_policy=maxmemory_policy,
                             queue_idle_timeout=queue_idle_timeout,
                             spill=self.overflow.spill_if_needed)
        self.set_deadletter_defaults(0, 0, b"deadletter")
        self.redrive_rate = 1000  # jobs/s of a REDRIVE without RATE (redrive-rate)
        rep, req, acks, fed = self.replication, self.requeue, self.acks, self.federation
        # bus message type -> handler (the spec's "ON RECV ..." procedures)
        self.handlers: dict[type, Callable[[bytes, Any], None]] = {
            ReplJob: rep.on_repljob,
            ReplJobBatch: rep.on_repljob_batch,
            ReplJobsOut: rep.on_repljob_batch,  # (handed over without the codec: tests)
            GotJob: rep.on_gotjob,
            GotJobBatch: rep.on_gotjob_batch,
            EnqueueJob: rep.on_enqueue,
            Queued: req.on_queued,
            WillQueue: req.on_willqueue,
            WorkingJob: req.on_working,
            SetAck: acks.on_setack,
            GotAck: acks.on_gotack,
            DelJob: acks.on_deljob,
            NeedJobs: fed.on_needjobs,
            YourJobs: fed.on_yourjobs,
            PauseQueue: self.on_pause,
        }  # (each handler takes the message type it is listed with)

    # ------------------------------------------------------------------ state events
    def serve_waiters(self, q: Queue) -> None:
        self.waiting.serve_waiters(q)

    def serve_needers(self, q: Queue, now: int) -> None:
        self.federation.serve_needers(q, now)

    def replication_removed(self, job: Job) -> None:
        self.replication.replication_removed(job)

    def fault_in(self, job_id: bytes) -> Job | None:
        return self.overflow.fault_in(job_id)

    def refill(self, q: Queue) -> None:
        self.overflow.refill(q)

    def held_on_disk(self, job_id: bytes, delivered: tuple[bytes, ...]) -> bool:
        return self.overflow.holds(job_id, delivered)

    def disk_job(self, job_id: bytes) -> Job | None:
        return self.overflow.get(job_id)

    def disk_listing(self, after: int, n: int, nodes: Collection[bytes],
                     end: int) -> tuple[int, list[tuple[bytes, bytes]]]:
        return self.overflow.scan_listing(after, n, nodes, end)

    def disk_last(self) -> int:
        return self.overflow.last_segment()

    def _crossed(self, job: Job) -> None:
        """A job went to disk or came back: an AOF rewrite under way logs it, and a
        re-replication walk under way looks at it again if it came back, since either may
        have walked the side it is on now before it got there."""
        if self.persist is not None:
            self.persist.rewrite_note(job)
        if self.rereplication.cursors and self.jobs.get(job.id) is job:
            # back into a shard a walk may have passed
            self.rereplication.came_back(job, self.overflow.came_from())

    def copy_confirmed(self, sender: bytes, job_id: bytes) -> None:
        """A GOTJOB that answers no ADDJOB: a copy re-replication or repair made."""
        rereplication = self.rereplication
        if rereplication.inflight:
            rereplication.confirmed(sender, job_id)  # a copy made again
        if self.repair.inflight:
            self.repair.confirmed(sender, job_id)  # a copy on a new node
        if rereplication.cursors:
            rereplication.got_copy(sender, job_id)  # a node being refilled holds it

    def need_jobs(self, q: Queue, now: int, reached_zero: bool = False) -> None:
        self.federation.need_jobs(q, now, reached_zero)

    def queue_idle_ms(self) -> int:
        return self.memory.queue_idle_ms()

    # ------------------------------------------------------------------ the commands' API
    # (what disque.commands and the server call; each goes to its subsystem)
    def ackjob(self, ids: Iterable[bytes]) -> int:
        return self.acks.ackjob(ids)

    def fastack(self, ids: Iterable[bytes]) -> int:
        return self.acks.fastack(ids)

    def enqueue_jobs(self, ids: Iterable[bytes], nack: bool = False) -> int:
        return self.requeue.enqueue_jobs(ids, nack)

    def nack_jobs(self, ids: Iterable[bytes], delay: int | None = None) -> int:
        return self.requeue.nack_jobs(ids, delay)

    def dequeue_jobs(self, ids: Iterable[bytes]) -> int:
        return self.requeue.dequeue_jobs(ids)

    def working(self, job_id: bytes) -> int:
        return self.requeue.working(job_id)

    def block(self, waiter: Waiter, timeout_ms: int) -> None:
        self.waiting.block(waiter, timeout_ms)

    def unblock(self, waiter: Waiter) -> None:
        self.waiting.unblock(waiter)

    @property
    def blocked(self) -> int:
        """Clients blocked in GETJOB."""
        return self.waiting.blocked

    def memory_level(self) -> int:
        return self.memory.memory_level()

    def evict(self, target: int) -> int:
        return self.memory.evict(target)

    @property
    def maxmemory_policy(self) -> str:
        return self.memory.maxmemory_policy

    @maxmemory_policy.setter
    def maxmemory_policy(self, policy: str) -> None:
        self.memory.maxmemory_policy = policy

    @property
    def queue_idle_timeout(self) -> int:
        return self.memory.queue_idle_timeout

    @queue_idle_timeout.setter
    def queue_idle_timeout(self, seconds: int) -> None:
        self.memory.queue_idle_timeout = seconds

    def next_due(self) -> int | None:
        return self.wheel.next_due()

    def ensure_memory(self) -> bool:
        return self.memory.ensure_memory()

    def link_changed(self, node_id: bytes, up: bool) -> None:
        self.replication.link_changed(node_id, up)

    def wait_replication(self, job: Job, waiter: ReplWaiter, timeout_ms: int) -> None:
        self.replication.wait_replication(job, waiter, timeout_ms)

    def join_replication(self, job_id: bytes, waiter: ReplWaiter) -> bool:
        return self.replication.join_replication(job_id, waiter)

    def load_job(self, job: Job, enqueue_queued: bool) -> bool:
        """A job read from the AOF (see disque.jobs.restore)."""
        return restore_job(self, job, enqueue_queued)

    def import_sources(self, q: Queue) -> list[bytes]:
        return self.federation.import_sources(q)

    def cancel_replication(self, job_id: bytes, waiter: ReplWaiter | None = None) -> bool:
        return self.replication.cancel_replication(job_id, waiter)

    def dedup_lookup(self, queue: bytes, key: bytes) -> bytes | None:
        return self.dedup.lookup(queue, key)

    def dedup_remember(self, queue: bytes, key: bytes, job: Job) -> None:
        self.dedup.remember(queue, key, job)

    def dedup_forget(self, queue: bytes, key: bytes, job_id: bytes) -> None:
        self.dedup.forget(queue, key, job_id)

    # ------------------------------------------------------------------ ADDJOB
    def set_deadletter_defaults(self, max_deliveries: int, max_nacks: int,
                                queue: bytes) -> None:
        """default-max-deliveries, default-max-nacks, deadletter-queue: the policy of jobs
        added without MAXDELIVERIES / MAXNACKS / DEADLETTER."""
        self.default_max_deliveries = max_deliveries
        self.default_max_nacks = max_nacks
        self.deadletter_queue = queue
        self.deadletter_defaults_on = bool(max_deliveries or max_nacks)

    def cancel_adds(self, jobs: list[Job]) -> None:
        """New jobs whose LOADJOB could not be written to the AOF (a full disk): their
        clients are told the ADDJOB failed, so they go, here and on the nodes that got a
        copy, and their DEDUP keys with them (a retry must be able to add the job).
        Acknowledged meanwhile: kept, the ack is logged as any other."""
        gone = set()
        for job in jobs:
            if self.lookup_job(job.id) is job and job.state in (ACTIVE, QUEUED):
                self.replication.delete_everywhere(job)
                gone.add(job.id)
        self.dedup.cancel(gone)

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
        if m is not None and m.size() <= 1:
            m = None  # alone: the same as no cluster
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
        if m is not None:
            linked = m.linked()
            if self.above_copy_limit():
                external = True
        needed = repl if external else repl - 1
        if needed > len(linked):
            reachable = m.reachable() if m is not None else ()
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
        q = self.qshards[hash(queue) & self.qmask].get(queue)
        if q is not None:
            if maxlen is not None and len(q) >= maxlen:
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
                  self.self_only)
        if dl is not None:
            job.dl = dl
        if needed:
            return self._add_replicated(job, linked, needed, external, async_, now,
                                        timeout_ms)
        job.state = ACTIVE  # state: WAIT_REPL -> ACTIVE
        if (not delay and q is not None and q.spilled and not q.waiters and not self.needers
                and self.persist is None and self.overflow.takes_fresh(now)):
            # The queue has jobs on disk and memory is at the spill's target: this job, the
            # newest, would be spilled behind them. It goes straight to disk with the next
            # write instead (disque.overflow's `add_fresh`), never entering the registry,
            # the queue's list nor the timer wheel, to leave them at once.
            self._queued_now(job, q, now, retry)
            self.overflow.add_fresh(job, q)
            return job
        # register(), inlined: this is the hot path of ADDJOB
        self.jshards[hash(job_id) & self.jmask][job_id] = job
        self.jobs.size += 1
        self.mem_used += JOB_MEMORY + len(body)
        if delay:
            job.qtime = now + delay * 1000
            self.schedule_job(job)
        elif q is not None and not q.waiters and not self.needers:
            # enqueue() of a brand-new job into an existing queue nobody waits on, inlined
            self._queued_now(job, q, now, retry)
            q.jobs.add(job)
            self.wheel.schedule(job, job.qtime if job.qtime and job.qtime < job.etime
                                else job.etime)
        else:
            job.qtime = now  # due: the first queueing below
            self.enqueue(job, now)
        if self.persist is not None:
            self.persist.addjob(job)
        return job

    def _queued_now(self, job: Job, q: Queue, now: int, retry: int) -> None:
        """A brand-new job queued at once in `q` (enqueue()'s fields, its requeue time
        jittered); the caller puts it in the queue's list or on disk."""
        job.state = QUEUED  # state: ACTIVE -> QUEUED
        job.flags = F_BCAST_QUEUED
        q.jobs_in += 1
        q.added += 1
        q.atime = now
        if retry:
            job.qtime = (now + retry * 1000 + int(self.random() * 2 * REQUEUE_JITTER)
                         - REQUEUE_JITTER)
        else:
            job.qtime = 0

    def _add_replicated(self, job: Job, linked: tuple[bytes, ...], needed: int,
                        external: bool, async_: bool, now: int, timeout_ms: int) -> Job:
        """ADDJOB with copies on other nodes: sync (the job waits in wait-repl and the
        command layer parks the client with wait_replication) or ASYNC. The copies go to
        linked nodes; with fewer of them than needed, to all of them now, and a sync job
        takes the others as their links come up (link_changed) or at a retry tick."""
        # every linked node when all are needed (R3 on 3 nodes) or fewer are linked: no
        # sampling to pay for, and the membership's own tuple, which tells start_replication
        # that consecutive jobs go to the same nodes; otherwise the first `needed` steps of
        # a Fisher-Yates shuffle (compiled, where rng.sample is interpreted library code:
        # 3% of a node's time at 20 nodes)
        n = len(linked)
        if needed >= n:
            targets: Sequence[bytes] = linked
        elif needed == 1:
            targets = [linked[int(self.random() * n)]]
        else:
            pool = list(linked)
            random = self.random
            for i in range(needed):
                j = i + int(random() * (n - i))
                pool[i], pool[j] = pool[j], pool[i]
            targets = pool[:needed]
        job.delivered = self.shared_delivered((() if external else self.self_only)
                                              + tuple(targets))
        if async_ and external:
            self.replication.start_replication(job, targets, True, True, now)  # never registered here
            # not WAIT_REPL: the command layer must not wait for it
            job.state = ACTIVE  # state: WAIT_REPL -> ACTIVE
            return job
        self.register(job)
        if async_:
            self.activate(job, now)
        elif not timeout_ms or now + timeout_ms >= job.etime:
            # Expiry while waiting. Not needed when the ADDJOB times out first: the job
            # leaves wait-repl by then (replicated and scheduled, or deleted), and no
            # timer-wheel entry for its expiry is left to hold it for its whole TTL.
            self.schedule_job(job)
        self.replication.start_replication(job, targets, external, async_, now)
        return job

    # ------------------------------------------------------------------ GETJOB
    def get_jobs(self, names: list[bytes], count: int) -> list[Job]:
        """Passes over the queues left to right, one job per queue per pass, until `count`
        jobs or a pass that yields nothing. Queues paused in output are skipped."""
        shards = self.qshards
        mask = self.qmask
        if count == 1 and len(names) == 1:  # the common GETJOB [NOHANG] FROM q
            q = shards[hash(names[0]) & mask].get(names[0])
            if q is not None and q.spilled:
                self.refill(q)
            if q is None or not q.jobs.size or q.paused & PAUSE_OUT:
                self.need_jobs_for(names[0], q)
                return []
            now = self.clock()
            job = self.fetch(q, now)
            if not q.jobs.size and (q.needjobs_responders or q.waiters):
                self.federation.need_jobs(q, now, reached_zero=True)
            return [job]
        jobs: list[Job] = []
        queues = [shards[hash(n) & mask].get(n) for n in names]
        now = 0
        while True:
            got = False
            for i, q in enumerate(queues):
                if q is not None and q.spilled:
                    self.refill(q)
                if q is not None and q.jobs and not q.paused & PAUSE_OUT:
                    if not now:
                        now = self.clock()
                    jobs.append(self.fetch(q, now))
                    if not q.jobs and (q.needjobs_responders or q.waiters):
                        self.federation.need_jobs(q, now, reached_zero=True)
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
        self.federation.need_jobs(q, now)
        return q

    # ------------------------------------------------------------------ PAUSE, LEAVING
    def set_leaving(self, flag: bool) -> None:
        """CLUSTER LEAVING yes|no; blocked GETJOB clients are told to go elsewhere."""
        self.leaving = flag
        if self.membership is not None:
            self.membership.set_leaving(flag)
        if flag:
            self.replication.leaving_started()
            for q in list(self.queues.values()):
                for waiter in list(q.waiters):
                    self.waiting.unblock(waiter)
                    waiter.on_error(leaving())

    def deljob(self, ids: Iterable[bytes]) -> int:
        known = 0
        for job_id in ids:
            job = self.lookup_job(job_id)
            if job is not None:
                known += 1
                self.delete_job(job)
        return known

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
                q = self.queue_of(job)
                if job.retry and q is not None and q.paused & PAUSE_IN:
                    job.qtime = self.requeue_time(job, now)
                else:
                    self.requeue.requeue_by_timer(job, now)
            elif job.retry and not job.flags & F_BCAST_WILLQUEUE and now >= qtime - 500:
                self.requeue.will_queue(job)
        elif qtime and state == QUEUED and now >= qtime:
            job.qtime = self.requeue_time(job, now) if job.retry else 0
            if job.dl is not None and job.dl.epoch & 1:
                self.deadletters.still_queued(job)
        elif qtime and state == ACKED and now >= qtime:
            self.acks.start_gc(job)
        if self.jobs.get(job.id) is job:
            self.schedule_job(job)

    def _cluster_tick(self, now: int) -> None:
        self.federation.cluster_cron(now)
        self.rereplication.tick(now)
        self.repair.tick(now)
        self.wheel.schedule(self._cluster_timer, now + 100)

    # ------------------------------------------------------------------ admin, bus
    def flushall(self) -> None:
        """Delete every job and queue (DEBUG FLUSHALL, CLUSTER RESET); blocked clients get
        a nil reply, clients waiting on replication -NOREPL."""
        for rep in list(self.replication.replicating.values()):
            self.replication.replication_removed(rep.job)
        for q in list(self.queues.values()):
            for waiter in list(q.waiters):
                self.waiting.unblock(waiter)
                waiter.on_timeout()
        for job in list(self.jobs.values()):
            self.wheel.cancel(job)
            if (job.state in (ACTIVE, QUEUED) or job.state == ACKED
                    and not job.flags & F_DUMMY) and self.persist is not None:
                self.persist.deljob(job.id)
        self.jobs.clear()
        self.requeue.reload_pending.clear()
        self.collected.clear()
        self.queues.clear()
        self.waiting.waiting_queues.clear()
        self.federation.importing.clear()
        self.dedup.clear()
        self.needers.clear()
        self.deadletters.clear()
        self.overflow.drop_all()
        self.mem_used = BASE_MEMORY

    def broadcast_pause(self, name: bytes) -> None:
        q = self.lookup_queue(name)
        flags = q.paused if q is not None else 0
        self.send_to(self.reachable_others(), PauseQueue(self.header(), name, flags))

    def on_pause(self, sender: bytes, msg: PauseQueue) -> None:
        self.pause(msg.queue, msg.flags & (PAUSE_IN | PAUSE_OUT))

    def prefetch(self, msgs: Sequence[Message]) -> None:
        """Before job messages that came together are handled, one at a time: with jobs
        on disk, the jobs that their handlers look up by ID first (and would read back
        one read each) are read back together (a replica's SETACKs, a bus frame's worth
        at a time, while a backlog on disk drains). GOTJOB and WILLQUEUE are left out:
        their handlers answer a job on disk without reading it back."""
        if not self.on_disk:
            return
        jobs = self.jobs
        ids: list[bytes] = []
        for msg in msgs:
            if isinstance(msg, (SetAck, GotAck, DelJob, EnqueueJob, Queued, WorkingJob)):
                if jobs.get(msg.job_id) is None:
                    ids.append(msg.job_id)
            elif isinstance(msg, YourJobs):
                ids += [rec.id for rec in msg.jobs if jobs.get(rec.id) is None]
        if ids:
            self.overflow.fault_in_many(ids)

    def on_message(self, sender: bytes, msg: Message) -> None:
        """A job message from another node of the cluster, to the subsystem that handles
        its type (see `handlers`)."""
        handler = self.handlers.get(type(msg))
        if handler is not None:
            handler(sender, msg)
