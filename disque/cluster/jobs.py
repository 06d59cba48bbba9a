"""Jobs across the cluster: the spec's "Disque state machine", sans-I/O.

`ClusterJobs` is a mixin of `disque.node.Node`: it shares the node's registry, queues and
timers, and adds the handlers of the four state machines, named as in the spec:

- Job replication: ADDJOB with REPLICATE n blocks the client (`start_replication`) until
  n - 1 other nodes answered GOTJOB to REPLJOB (`on_repljob`, `on_gotjob`); the timeout
  answers -NOREPL and deletes the copies (best effort). Copies go only to reachable nodes
  whose bus link is up (`membership.linked()`, the original's "No link, no party"): a killed
  node's connection resets at once, long before it is flagged PFAIL, so it is never waited
  for. When the link to a node drops, every replication in flight that counted on it (listed,
  not confirmed) gets another linked node at once (`link_changed`); when a link comes up, a
  replication short of linked candidates takes the node at once. Linked nodes that do not
  answer (stopped, slow, refusing) are covered by one more node every 50 ms (`repl_tick`). External replication (memory above 75%, or LEAVING): the node keeps
  no copy and asks one confirming node to queue the job (`on_enqueue`).
- Re-queue: 500 ms before its requeue time an active job announces WILLQUEUE to the nodes
  that may have it (`on_willqueue`: a node that has it queued answers QUEUED, one that has it
  acked answers SETACK); requeueing broadcasts QUEUED (`on_queued`), which postpones the
  others and dequeues duplicates on the node that loses the per-job node-ID comparison.
- ACK garbage collection: `ack_job`, `start_gc` (SETACK to every holder not yet confirmed,
  retried with exponential backoff), `on_setack`, `on_gotack`, `on_deljob`; dummy ACKs keep
  an acknowledgement for an ID this node never had.
- Federation: a queue with waiting consumers and no jobs asks for jobs (`need_jobs`): ad hoc
  to recent sources (25 ms doubling to 2 s) and by broadcast (2 s doubling to 30 s);
  `on_needjobs` answers YOURJOBS with jobs moved out of its queue, `on_yourjobs` queues them.

Effects: messages leave through `self.send` into `self.out` as (node id, message) pairs; the
server routes them to the nodes' bus links. Nothing here touches a socket or the real clock.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from disque.cluster.deadletters import state_bits
from disque.cluster.messages import (
    QUEUED_INCR_DELIV,
    QUEUED_INCR_NACKS,
    QUEUED_STATE_ONLY,
    QUEUED_UNKNOWN,
    STATE_EPOCH_SHIFT,
    WILLQUEUE_CONFIRM,
    DelJob,
    EnqueueJob,
    GotAck,
    GotJob,
    GotJobBatch,
    JobRecord,
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
    new_record,
)
from disque.jobs.job import (
    ACKED,
    ACTIVE,
    F_BCAST_QUEUED,
    F_BCAST_WILLQUEUE,
    F_DUMMY,
    F_NACK_DELAYED,
    F_RELOADED,
    JOB_MEMORY,
    QUEUED,
    WAIT_REPL,
    Job,
)
from disque.protocol.errors import CommandError, leaving
from disque.queues.queue import PAUSE_IN, PAUSE_OUT, Queue

REPL_RETRY_MS = 50  # one more target every 50 ms while a sync ADDJOB is short
WILLQUEUE_ADVANCE_MS = 500
GC_BASE_MS = 1000
GC_MAX_MS = 180_000
GC_MAX_ATTEMPT = 10
NEEDJOBS_ADHOC_MS = 25
NEEDJOBS_ADHOC_MAX_MS = 2000
NEEDJOBS_BCAST_MS = 2000
NEEDJOBS_BCAST_MAX_MS = 30_000
RESPONDER_VALID_MS = 5000
IMPORT_WINDOW_S = 5
NEEDJOBS_MIN = 5
NEEDJOBS_MAX = 100
CLUSTER_CRON_MS = 100
RELOAD_CONFIRM_ROUNDS = 3  # RETRY periods a reloaded copy waits for its holders' answers
NEEDER_HOLD_MS = 1000  # how long an unanswered NEEDJOBS is remembered (see on_needjobs)

NOREPL_TIMEOUT = "Timeout reached before replicating to the requested number of nodes"
NOREPL_REMOVED = "job removed (expired?) before the requested replication level was achieved"


class ReplWaiter:
    """The client of a synchronous ADDJOB. The command layer subclasses it."""

    node: Any = None
    job_id: bytes = b""

    def cancel(self) -> None:
        """The client went away: the job is deleted cluster-wide (best effort), unless a
        retry of the same ADDJOB (DEDUP) waits for it too."""
        if self.node is not None:
            self.node.cancel_replication(self.job_id, self)

    def on_added(self, job_id: bytes) -> None:
        raise NotImplementedError

    def on_error(self, error: CommandError) -> None:
        raise NotImplementedError


class Replication:
    """A job waiting for synchronous replication (its timer is its `ReplTimer`'s)."""

    __slots__ = ("job", "waiter", "followers", "external")

    def __init__(self, job: Job, waiter: ReplWaiter, external: bool) -> None:
        self.job = job
        self.waiter = waiter
        # DEDUP retries of the same ADDJOB: a list once there is one
        self.followers: list[ReplWaiter] | tuple[()] = ()
        self.external = external

    def added(self, job_id: bytes) -> None:
        self.waiter.on_added(job_id)
        for w in self.followers:
            w.on_added(job_id)

    def failed(self, error: CommandError) -> None:
        self.waiter.on_error(error)
        for w in self.followers:
            w.on_error(error)


class ReplTimer:
    """The timer of the replications started in the same millisecond with the same
    timeout (the jobs of a pipelined or ADDJOBS batch): one timer-wheel entry for them all,
    waking at the earlier of the next retry tick and the timeout. A replication that is
    over simply leaves `node.replicating`; the timer skips it, and goes when none is
    left."""

    __slots__ = ("node", "reps", "started", "deadline", "next_tick", "awake")

    def __init__(self, node: Any, started: int, deadline: int) -> None:
        self.node = node
        self.reps: list[Replication] = []
        self.started = started
        self.deadline = deadline  # ms: the ADDJOB timeout (0: none)
        self.next_tick = started + REPL_RETRY_MS  # ms: one more target then, while short
        self.awake = 0

    def wake_at(self) -> int:
        """The next retry tick, or the timeout if it comes first."""
        deadline = self.deadline
        return deadline if deadline and deadline < self.next_tick else self.next_tick

    def callback(self, now: int) -> None:
        """Called by the node's timer wheel (see Node.tick)."""
        self.node.repl_wake(self, now)


class ReplJobsOut(ReplJobBatch):
    """The REPLJOBs of consecutive new jobs to the same nodes, as one outbox message (see
    `start_replication`): one encoding for every node it goes to."""

    __slots__ = ("frame",)

    def __init__(self, header: Any, items: list[JobRecord], noreply: bool) -> None:
        super().__init__(header, items, noreply)
        self.frame: bytes | None = None

    @property
    def noreply(self) -> bool:
        return self.key  # type: ignore[no-any-return]

    def add(self, rec: JobRecord) -> None:
        self.items.append(rec)
        self.n += 1
        self.frame = None

    def encode(self) -> bytes:
        frame = self.frame
        if frame is None:
            frame = self.frame = ReplJob.frame(self.header, self.items, self.key)
        return frame


def job_record(job: Job, now: int) -> JobRecord:
    """A job as it travels on the bus (expiry relative to the sender's clock)."""
    ttl = job.etime - now
    return new_record(JobRecord, (job.id, job.queue or b"", job.body or b"", job.repl,
                                  ttl if ttl > 0 else 0, job.ctime, job.delay, job.retry,
                                  job.nacks, job.deliveries, job.delivered, job.dl))


def job_from_record(rec: JobRecord, now: int, queue: bytes | None = None,
                    delivered: tuple[bytes, ...] | None = None) -> Job:
    """An active job from a record; `queue` / `delivered` replace the record's (a queue
    name object already held, a list with this node added)."""
    job = Job(rec.id, queue or rec.queue, rec.body, rec.repl, rec.ctime, now + rec.ttl_ms,
              rec.delay, rec.retry, rec.delivered if delivered is None else delivered)
    job.nacks = rec.nacks
    job.deliveries = rec.deliveries
    job.dl = rec.dl
    job.state = ACTIVE
    return job


_new_job = object.__new__  # a Job whose fields the caller sets (see hold_copies)


def sender_wins(sender: bytes, myself: bytes, job_id: bytes) -> bool:
    """QUEUED tie-break: True if `sender` beats me for this job, so I dequeue my copy.

    Node IDs are XORed byte-wise with the job ID's random chars (11 + i % 24) before they
    are compared, so the node that keeps a duplicate differs from job to job.
    """
    for i in range(min(len(sender), len(myself))):
        k = job_id[11 + i % 24]
        a = sender[i] ^ k
        b = myself[i] ^ k
        if a != b:
            return a > b
    return False


class ClusterJobs:
    """Mixin of Node: the cluster side of the job state machines."""

    # Attributes provided by Node (declared for readers and type checkers).
    myself: bytes
    clock: Any
    rng: Any
    membership: Any
    leaving: bool
    out: list[tuple[bytes, Message]]
    replicating: dict[bytes, Replication]
    repl_timer: ReplTimer | None
    repl_last: ReplJob | ReplJobsOut | None  # the newest REPLJOB sent (see start_replication)
    repl_last_targets: Sequence[bytes]
    shared_delivered: Any
    above_copy_limit: Any
    persist_failing: Any
    rereplication: Any
    collected: Any
    repair: Any
    jobs: Any
    _jshards: Any
    _jmask: int
    _maxmemory: int
    mem_used: int

    # ------------------------------------------------------------------ effects
    def send(self, node_id: bytes, msg: Message) -> None:
        if not self.out:
            self.on_out()
        self.out.append((node_id, msg))

    def send_to(self, node_ids: Any, msg: Message) -> None:
        """Send to every listed node but myself."""
        myself = self.myself
        for n in node_ids:
            if n != myself:
                self.send(n, msg)

    def link_up(self, node_id: bytes) -> bool:
        """Whether a message to `node_id` can leave now: our outbound bus link to it is up
        (without a membership, a lone node in unit tests: yes)."""
        m = self.membership
        if m is None:
            return True
        n = m.get(node_id)
        return n is not None and n.out_link is not None

    def on_out(self) -> None:
        """Called when the outbox goes from empty to non-empty (the server hooks it)."""

    def header(self) -> Any:
        return self.membership.header

    def others(self, job: Job) -> list[bytes]:
        myself = self.myself
        return [n for n in job.delivered if n != myself]

    # ------------------------------------------------------------------ replication
    def start_replication(self, job: Job, targets: Sequence[bytes], external: bool,
                          async_: bool, now: int) -> None:
        """Send REPLJOB for a new job (ADDJOB). Sync: the job waits in wait-repl until
        `wait_replication` parks its client; async: it is already queued here (unless
        external) and the copies are best effort.

        The REPLJOBs of consecutive new jobs to every linked node (`targets` is then
        the membership's `linked()` tuple: the same object from job to job) become one
        message in the outbox (a pipelined group, an ADDJOBS, the ADDJOBs of several
        clients in one loop iteration): no message object, no outbox entry and no
        encoding step per job and per node, and one frame per node as before. Not for
        targets drawn at random (REPLICATE 2 of 3 nodes): the encoder already packs each
        node's REPLJOBs into one frame, and batches of alternating targets would split
        those frames. No targets (no linked node now): nothing is sent, a sync job waits
        for a link (`link_changed`) or a retry tick."""
        rec = job_record(job, now)
        if not async_:
            job.state = WAIT_REPL
            job.confirmed = () if external else (self.myself,)
        if not targets:
            return  # no linked node now: link_changed or repl_tick sends it later
        out = self.out
        last = self.repl_last
        header = self.header()
        if (out and out[-1][1] is last and targets is self.repl_last_targets
                and last.header is header and last.noreply == async_):  # type: ignore
            # nothing else was sent since the previous job's REPLJOB: this one joins it
            if last.__class__ is ReplJob:
                batch = ReplJobsOut(header, [last.job, rec], async_)  # type: ignore
                out[-len(targets):] = [(n, batch) for n in targets]
                self.repl_last = batch
            else:
                last.add(rec)  # type: ignore[union-attr]
        else:
            msg = self.repl_last = ReplJob(header, rec, async_)
            self.repl_last_targets = targets
            for n in targets:
                self.send(n, msg)
        if async_ and external:
            self.send(self.rng.choice(targets), EnqueueJob(header, job.id, job.delay))

    def wait_replication(self, job: Job, waiter: ReplWaiter, timeout_ms: int) -> None:
        """Park the ADDJOB client until the job is replicated, times out, or goes."""
        rep = Replication(job, waiter, self.myself not in job.delivered)
        waiter.node = self
        waiter.job_id = job.id
        self.replicating[job.id] = rep
        now = self.clock()
        deadline = now + timeout_ms if timeout_ms else 0
        timer = self.repl_timer
        if timer is None or timer.started != now or timer.deadline != deadline:
            timer = self.repl_timer = ReplTimer(self, now, deadline)
            self.wheel.schedule(timer, timer.wake_at())
        timer.reps.append(rep)

    def repl_wake(self, timer: ReplTimer, now: int) -> None:
        """The wheel woke the replications of a ReplTimer: time out, or one more retry
        tick, for each of them still waiting."""
        replicating = self.replicating
        reps = timer.reps = [rep for rep in timer.reps
                             if replicating.get(rep.job.id) is rep]
        timed_out = timer.deadline and now >= timer.deadline
        if not reps or timed_out:
            if self.repl_timer is timer:  # done with: nothing joins it any more
                self.repl_timer = None
            if timed_out:
                for rep in reps:
                    self.repl_timeout(rep.job.id)
            return
        if now >= timer.next_tick:
            for rep in reps:
                self.repl_tick(rep.job.id)
            timer.next_tick = now + REPL_RETRY_MS
        self.wheel.schedule(timer, timer.wake_at())

    def repl_tick(self, job_id: bytes) -> None:
        """TIMER every 50 ms while short of the replication factor: add one more linked
        node to `delivered` and re-send REPLJOB (so every holder learns the full list)."""
        rep = self.replicating.get(job_id)
        if rep is None:
            return
        job = rep.job
        candidates = [n for n in self.linked_others() if n not in job.delivered]
        added = False
        if candidates:
            job.delivered = job.delivered + (self.rng.choice(candidates),)
            added = True
        self.resend_repljob(job, added)

    def resend_repljob(self, job: Job, added: bool) -> None:
        """REPLJOB again to every other holder with a link: those that have not confirmed
        yet must answer; the confirmed ones, when the list grew, only learn it (NOREPLY)."""
        rec = job_record(job, self.clock())
        confirmed = job.confirmed
        link_up = self.link_up
        for n in self.others(job):
            if not link_up(n):
                continue  # (the bus would drop it; sent when a tick finds the link back)
            if n not in confirmed:
                self.send(n, ReplJob(self.header(), rec, False))
            elif added:
                self.send(n, ReplJob(self.header(), rec, True))

    def link_changed(self, node_id: bytes, up: bool) -> None:
        """Membership's LinkChanged: our bus link to `node_id` came up or went away.

        Down: every replication in flight that lists the node without its GOTJOB gets
        other linked nodes at once, as many as it is now short (see `replicate_more`): a
        REPLJOB lost with the link is not waited for. Up: replications short of linked
        candidates (fewer linked nodes than REPLICATE asked for) take the node now."""
        if not self.replicating:
            return
        linked = self.linked_others()
        if up:
            if node_id not in linked:
                return  # linked but PFAIL / FAIL / LEAVING: not a target (yet)
            for rep in list(self.replicating.values()):
                if node_id not in rep.job.delivered:
                    self.replicate_more(rep.job, linked)
            return
        for rep in list(self.replicating.values()):
            job = rep.job
            if node_id in job.delivered and node_id not in job.confirmed:
                self.replicate_more(job, linked)

    def replicate_more(self, job: Job, linked: Sequence[bytes]) -> None:
        """Add linked nodes to a job waiting for its copies until the nodes that confirmed
        or still may (listed, unconfirmed, link up) reach REPLICATE, or none is left; then
        re-send REPLJOB as repl_tick does."""
        confirmed = job.confirmed
        myself = self.myself
        prospects = len(confirmed) + sum(1 for n in job.delivered if n != myself
                                         and n not in confirmed and n in linked)
        added = False
        while prospects < job.repl:
            delivered = job.delivered
            candidates = [n for n in linked if n not in delivered]
            if not candidates:
                break
            job.delivered = delivered + (self.rng.choice(candidates),)
            prospects += 1
            added = True
        if added:
            self.resend_repljob(job, True)

    def repl_timeout(self, job_id: bytes) -> None:
        rep = self.replicating.pop(job_id, None)
        if rep is None:
            return
        self.delete_everywhere(rep.job)
        rep.failed(CommandError("NOREPL", NOREPL_TIMEOUT))

    def join_replication(self, job_id: bytes, waiter: ReplWaiter) -> bool:
        """A retry of an ADDJOB (same DEDUP key) whose job still waits for its copies: it
        gets the same outcome as the first client (False: nothing in flight)."""
        rep = self.replicating.get(job_id)
        if rep is None:
            return False
        waiter.node = self
        waiter.job_id = job_id
        if not rep.followers:
            rep.followers = []
        rep.followers.append(waiter)  # type: ignore[union-attr]
        return True

    def cancel_replication(self, job_id: bytes, waiter: ReplWaiter | None = None) -> bool:
        """An ADDJOB client went away: the job is deleted cluster-wide (best effort), unless
        another client waits for it (a DEDUP retry), which then carries on alone. True if
        the job was deleted."""
        rep = self.replicating.get(job_id)
        if rep is None:
            return False
        if waiter is not None and waiter is not rep.waiter:
            if waiter in rep.followers:
                rep.followers.remove(waiter)  # type: ignore[union-attr]
            return False
        if rep.followers:
            rep.waiter = rep.followers.pop(0)  # type: ignore[union-attr]
            return False
        del self.replicating[job_id]
        self.delete_everywhere(rep.job)
        return True

    def delete_everywhere(self, job: Job) -> None:
        """Delete locally and ask every node that may hold a copy to delete it."""
        self.send_to(job.delivered, DelJob(self.header(), job.id))
        if self.lookup_job(job.id) is job:
            self.delete_job(job)

    def replication_achieved(self, job: Job, now: int = 0) -> None:
        rep = self.replicating.pop(job.id, None)
        if not now:
            now = self.clock()
        if rep is not None and rep.external:
            confirmed = [n for n in job.confirmed if n != self.myself]
            if confirmed:  # (none when a SETACK "achieves" it first: nothing to queue)
                self.send(self.rng.choice(confirmed),
                          EnqueueJob(self.header(), job.id, job.delay))
            job.state = ACTIVE  # never logged: the local copy is dropped
            self.unregister(job)
        else:
            job.confirmed = ()
            self.activate(job, now)
        if rep is not None:
            rep.added(job.id)

    def replication_removed(self, job: Job) -> None:
        """A job still waiting for replication disappeared (expiry, DELJOB, flush)."""
        rep = self.replicating.pop(job.id, None)
        if rep is not None:
            rep.failed(CommandError("NOREPL", NOREPL_REMOVED))

    def on_repljob(self, sender: bytes, msg: ReplJob) -> None:
        """ON RECV REPLJOB: hold a copy (or merge `delivered`) and confirm with GOTJOB."""
        self.hold_and_confirm(sender, (msg.job,), msg.noreply)

    def on_repljob_batch(self, sender: bytes, msg: ReplJobBatch) -> None:
        """REPLJOB for the jobs of one frame: the same, answered with one GOTJOB frame."""
        self.hold_and_confirm(sender, msg.items, msg.key)  # key: noreply

    def hold_and_confirm(self, sender: bytes, recs: Any, noreply: bool) -> None:
        if self.leaving or self.above_copy_limit() or self.persist_failing():
            return  # refused: no GOTJOB, the sender tries another node
        held = self.hold_copies(recs, self.clock())
        if held and not noreply:
            self.send(sender, GotJobBatch(self.header(), held, 0) if len(held) > 1
                      else GotJob(self.header(), held[0]))

    def hold_copies(self, recs: Any, now: int) -> list[bytes]:
        """Keep a copy of each replicated job (or merge its `delivered` into the copy we
        hold); the IDs held, which leaves out the jobs whose queue is paused for input (no
        GOTJOB: the sender tries another node).

        The hot path of a replica, so what the jobs of one frame share is worked out once
        (their queue, their `delivered` list: the decoder hands the jobs of a frame one
        tuple per distinct list) and a new copy is built and scheduled inline (the fields
        of `job_from_record`, the timer of `schedule_job`)."""
        myself = self.myself
        shards = self._jshards
        mask = self._jmask
        schedule = self.wheel.schedule
        random = self._random
        persist = self.persist
        collected = self.collected
        held: list[bytes] = []
        last_queue: Any = None
        q: Queue | None = None
        last_delivered: Any = None
        delivered: tuple[bytes, ...] = ()
        willqueue = 0
        added = 0
        mem = 0
        for rec in recs:
            job_id, queue, body, repl, ttl_ms, ctime, delay, retry, nacks, deliv, \
                rec_delivered, dl = rec
            if queue != last_queue:
                last_queue = queue
                q = self.lookup_queue(queue)
            if q is not None:
                if q.paused & PAUSE_IN:
                    continue
                queue = q.name  # one shared bytes object for all the queue's jobs
            if rec_delivered is not last_delivered:
                last_delivered = rec_delivered
                delivered = self.shared_delivered(
                    rec_delivered if myself in rec_delivered else rec_delivered + (myself,))
                # the WILLQUEUE 500 ms before a requeue, when others may hold the job
                willqueue = 500 if len(delivered) > 1 else 0
            job = _new_job(Job)
            # register() and the lookup of a copy we already hold in one probe of the
            # registry (among millions of jobs, each probe is a cache miss)
            shard = shards[hash(job_id) & mask]
            known = shard.setdefault(job_id, job)
            if known is not job:
                known.delivered = known.delivered + tuple(
                    n for n in rec_delivered if n not in known.delivered)
                if known.flags & F_RELOADED:  # a holder sent it again: it is alive
                    known.flags &= ~F_RELOADED
                    self.reload_pending.pop(job_id, None)
                held.append(job_id)
                continue
            if job_id in collected:
                # acknowledged and collected here already: a copy that raced with the GC
                # (a repair's or a restart's REPLJOB) must not bring the job back
                del shard[job_id]
                continue
            job.id = job_id
            job.queue = queue
            job.body = body
            job.state = ACTIVE
            job.flags = 0
            job.repl = repl
            job.ctime = ctime
            job.etime = etime = now + ttl_ms
            job.delay = delay
            job.retry = retry
            job.nacks = nacks
            job.deliveries = deliv
            job.delivered = delivered
            job.confirmed = ()
            job.gc_retry = 0
            job.dl = dl
            job.awake = 0  # (not scheduled yet: schedule() sets it)
            if retry:
                job.qtime = qtime = (now + (delay + retry) * 1000
                                     + int(random() * 500) - 250)
                when = qtime - willqueue
                schedule(job, when if when < etime else etime)  # (sets job.awake)
            else:
                job.qtime = 0
                schedule(job, etime)
            added += 1
            mem += JOB_MEMORY + len(body)
            if persist is not None:
                persist.loadjob(job)
            held.append(job_id)
        if added:
            self.jobs._len += added
            self.mem_used += mem
        return held

    def on_gotjob(self, sender: bytes, msg: GotJob) -> None:
        """ON RECV GOTJOB: count the confirmation; enough of them and the job is added."""
        self.got_job(sender, msg.job_id, self.clock())

    def on_gotjob_batch(self, sender: bytes, msg: GotJobBatch) -> None:
        got_job = self.got_job
        now = self.clock()
        for job_id in msg.items:
            got_job(sender, job_id, now)

    def got_job(self, sender: bytes, job_id: bytes, now: int) -> None:
        # the jobs waiting for copies first: a small, warm table (the registry holds
        # millions of jobs and a lookup there is a cache miss)
        rep = self.replicating.get(job_id)
        job = rep.job if rep is not None else self.lookup_job(job_id)
        if job is None or job.state != WAIT_REPL:
            if rep is None:
                if self.rereplication.inflight:
                    self.rereplication.confirmed(sender, job_id)  # a copy made again
                if self.repair.inflight:
                    self.repair.confirmed(sender, job_id)  # a copy on a new node
            return
        if sender not in job.confirmed:
            job.confirmed = job.confirmed + (sender,)
            if sender not in job.delivered:
                job.delivered = job.delivered + (sender,)
        if len(job.confirmed) >= job.repl:
            self.replication_achieved(job, now)

    def on_enqueue(self, sender: bytes, msg: EnqueueJob) -> None:
        """ON RECV ENQUEUE: the creator kept no copy; queue ours (now or after the delay)."""
        job = self.lookup_job(msg.job_id)
        if job is None or job.state not in (WAIT_REPL, ACTIVE):
            return
        q = self.lookup_queue(job.queue)
        if q is not None and q.paused & PAUSE_IN:
            return
        now = self.clock()
        job.state = ACTIVE
        if msg.aux == 0:
            job.qtime = now  # allowed exactly once even for an at-most-once job
            self.enqueue(job, now)
        else:
            job.qtime = now + msg.aux * 1000
            self.schedule_job(job)

    # ------------------------------------------------------------------ re-queue
    def requeue_by_timer(self, job: Job, now: int) -> None:
        """TIMER at qtime: queue the job again and tell the other holders (QUEUED).

        A copy reloaded from the AOF (F_RELOADED) may be the last trace of a job that was
        acknowledged and collected while this node was down, or just before it crashed
        with its DELJOB not yet on disk: its WILLQUEUE asked every holder to answer. An
        answer from one that has the job cleared the flag (it is alive: requeue); every
        holder answering "unknown" deleted it (reload_unknown). Still flagged here means
        some holders did not answer: wait one more RETRY, RELOAD_CONFIRM_ROUNDS times at
        most, then requeue anyway (a job is never given up for silence)."""
        if job.flags & F_RELOADED:
            _, rounds = self.reload_pending.get(job.id, (None, 0))
            if rounds + 1 < RELOAD_CONFIRM_ROUNDS:
                self.reload_pending[job.id] = (set(), rounds + 1)
                job.qtime = self.requeue_time(job, now)
                job.flags &= ~F_BCAST_WILLQUEUE
                return
            job.flags &= ~F_RELOADED
            self.reload_pending.pop(job.id, None)
        if job.flags & F_NACK_DELAYED:  # the end of a NACK DELAY: that NACK was counted
            job.flags &= ~F_NACK_DELAYED
            if self.enqueue(job, now):
                self.broadcast_queued(job, 0)
            return
        requeued = job.flags & F_BCAST_QUEUED or job.id[2:10] != self.myself[:8]
        if requeued and job.dl is not None and self.deadletters.check(job, now, nack=False):
            return  # over its limit: into its dead-letter queue instead
        if job.state != ACTIVE or not job.qtime:
            return  # (what enqueue refuses)
        if requeued:
            # counted first: enqueue may hand the job at once to a blocked GETJOB, whose
            # WITHCOUNTERS reply must include this delivery
            job.deliveries += 1
        self.enqueue(job, now)
        if requeued:
            others = self.others(job)
            if others:
                msg = Queued(self.header(), job.id, QUEUED_INCR_DELIV | state_bits(job))
                for n in others:
                    self.send(n, msg)

    def will_queue(self, job: Job) -> None:
        """TIMER 500 ms before qtime: WILLQUEUE to every node that may have the job (aux:
        its dead-letter state, see disque.cluster.deadletters; a copy reloaded from the AOF
        also asks every holder to answer, see requeue_by_timer)."""
        job.flags |= F_BCAST_WILLQUEUE
        aux = state_bits(job)
        if job.flags & F_RELOADED:
            aux |= WILLQUEUE_CONFIRM
            others = self.others(job)
            _, rounds = self.reload_pending.get(job.id, (None, 0))
            self.reload_pending[job.id] = (set(others), rounds)
        self.send_to(job.delivered, WillQueue(self.header(), job.id, aux))

    def on_willqueue(self, sender: bytes, msg: WillQueue) -> None:
        job = self.lookup_job(msg.job_id)
        if job is None:
            if msg.aux & WILLQUEUE_CONFIRM:
                # collected here: the reloaded copy is a ghost of an acknowledged job.
                # Never known (a copy refused or lost, a local DELJOB) or forgotten: it may
                # be the last copy of a live job, so let it requeue now.
                self.send(sender, Queued(self.header(), msg.job_id, QUEUED_STATE_ONLY | (
                    QUEUED_UNKNOWN if msg.job_id in self.collected else 0)))
            return
        if job.state in (ACTIVE, QUEUED) and sender not in job.delivered:
            job.delivered = job.delivered + (sender,)
        if job.state == ACKED:
            self.send(sender, SetAck(self.header(), job.id, len(job.delivered)))
            return
        if (job.dl is not None or msg.aux >> STATE_EPOCH_SHIFT) and \
                self.deadletters.compare(sender, job, msg.aux):
            return  # one side was behind: the newer state went where it was missing
        if job.state == QUEUED:
            self.send_to(job.delivered, Queued(self.header(), job.id, state_bits(job)))
        elif msg.aux & WILLQUEUE_CONFIRM:  # "I have it": the reloaded copy may requeue
            self.send(sender, Queued(self.header(), job.id,
                                     QUEUED_STATE_ONLY | state_bits(job)))

    def on_queued(self, sender: bytes, msg: Queued) -> None:
        """ON RECV QUEUED: someone queued the job; postpone ours, drop a duplicate. A
        STATE_ONLY one only carries the sender's state of the job (dead letters, or the
        answer to a reloaded copy's WILLQUEUE)."""
        job = self.lookup_job(msg.job_id)
        if job is None:
            return
        aux = msg.aux
        if aux & QUEUED_UNKNOWN:
            self.reload_unknown(sender, job)
            return
        if job.flags & F_RELOADED:  # another holder has the job: it is alive
            job.flags &= ~F_RELOADED
            self.reload_pending.pop(job.id, None)
        if job.state == ACKED:
            self.send(sender, SetAck(self.header(), job.id, len(job.delivered)))
            return
        order = 0
        if job.dl is not None or aux >> STATE_EPOCH_SHIFT:
            order = self.deadletters.compare(sender, job, aux)
            if order < 0:
                return  # a stale sender: it was told our state
        if aux & QUEUED_STATE_ONLY:
            return
        if order == 0 and job.state == QUEUED and sender_wins(sender, self.myself, job.id):
            self.dequeue(job)
        if job.retry and job.qtime:
            job.qtime = self.requeue_time(job, self.clock())
            job.flags &= ~F_BCAST_WILLQUEUE
            self.schedule_job(job)
        if msg.aux & QUEUED_INCR_NACKS:
            job.nacks += 1
        if msg.aux & QUEUED_INCR_DELIV:
            job.deliveries += 1

    def on_working(self, sender: bytes, msg: WorkingJob) -> None:
        """ON RECV WORKING: like QUEUED, but always dequeue, and no counters. With aux > 0 it
        is a NACK DELAY of aux seconds: count the nack, and requeue no sooner than a RETRY
        after the sender's own requeue."""
        job = self.lookup_job(msg.job_id)
        if job is None or job.state == ACKED:
            return
        if job.state == QUEUED:
            self.dequeue(job)
        if msg.aux:
            job.nacks += 1
        if job.retry and job.qtime:
            job.qtime = self.requeue_time(job, self.clock() + msg.aux * 1000)
            job.flags &= ~F_BCAST_WILLQUEUE
            self.schedule_job(job)

    def reload_unknown(self, sender: bytes, job: Job) -> None:
        """A holder asked by a reloaded copy's WILLQUEUE has no copy. When none of them has
        one, the job was acknowledged and collected while we were away: drop ours."""
        entry = self.reload_pending.get(job.id)
        if entry is None or not job.flags & F_RELOADED:
            return
        waiting = entry[0]
        waiting.discard(sender)
        if not waiting:
            self.reload_pending.pop(job.id, None)
            self.delete_job(job)

    def broadcast_queued(self, job: Job, flags: int) -> None:
        if self.others(job):
            self.send_to(job.delivered, Queued(self.header(), job.id, flags | state_bits(job)))

    def broadcast_working(self, job: Job) -> None:
        if self.others(job):
            self.send_to(job.delivered, WorkingJob(self.header(), job.id))

    def broadcast_nack_delay(self, job: Job, delay: int) -> None:
        if self.others(job):
            self.send_to(job.delivered, WorkingJob(self.header(), job.id, delay))

    # ------------------------------------------------------------------ ACK GC
    def start_gc(self, job: Job) -> None:
        """START-GC: SETACK to every node that may hold the job and has not confirmed; with
        nobody to ask (alone, or every other holder forgotten) the job is simply deleted.
        Retried by the job timer with exponential backoff."""
        myself = self.myself
        job.confirmed = (myself,)
        dummy = job.flags & F_DUMMY
        if dummy:
            targets = [n for n in self.reachable_or_known() if n != myself]
        else:
            targets = [n for n in job.delivered if n != myself and self.is_known_node(n)]
        if not targets:
            self.unregister(job)
            return
        msg = SetAck(self.header(), job.id, len(job.delivered))
        for n in targets:
            self.send(n, msg)
        now = self.clock()
        backoff = min(GC_BASE_MS << min(job.gc_retry, GC_MAX_ATTEMPT), GC_MAX_MS)
        job.qtime = now + backoff + int(self._random() * 500) - 250  # next GC attempt
        if job.gc_retry < GC_MAX_ATTEMPT:
            job.gc_retry += 1
        self.schedule_job(job)

    def reachable_or_known(self) -> list[bytes]:
        m = self.membership
        if m is None:
            return []
        return [n.id for n in m.nodes() if not n.bits & 0x08]  # not handshake

    def on_setack(self, sender: bytes, msg: SetAck) -> None:
        """ON RECV SETACK(may-have): ack our copy; GOTACK unless we know of more holders, in
        which case we run the GC ourselves."""
        job = self.lookup_job(msg.job_id)
        if job is None:
            self.send(sender, GotAck(self.header(), msg.job_id, 0))
            return
        if job.state == WAIT_REPL:
            self.replication_achieved(job)
            job = self.lookup_job(msg.job_id)
            if job is None:
                self.send(sender, GotAck(self.header(), msg.job_id, 0))
                return
        self.ack_job(job)
        may_have = msg.aux
        if len(job.delivered) <= may_have:
            self.send(sender, GotAck(self.header(), job.id, 1))
        else:
            if may_have == 0:
                self.send(sender, GotAck(self.header(), job.id, 1))
            self.start_gc(job)

    def on_gotack(self, sender: bytes, msg: GotAck) -> None:
        """ON RECV GOTACK(known): collect confirmations; when every holder confirmed,
        DELJOB to all of them and forget the job."""
        job = self.lookup_job(msg.job_id)
        if job is None:
            return
        self.ack_job(job)
        known = msg.aux == 1
        dummy = job.flags & F_DUMMY
        if dummy:
            if known:
                self.unregister(job)  # somebody holds the real ack: drop our dummy
                return
            if sender not in job.confirmed:
                job.confirmed = job.confirmed + (sender,)
            if len(job.confirmed) >= self.cluster_size():
                self.unregister(job)
            return
        if known or sender in job.delivered:
            if sender not in job.delivered:
                job.delivered = job.delivered + (sender,)
            if sender not in job.confirmed:
                job.confirmed = job.confirmed + (sender,)
        confirmed = job.confirmed
        if all(n in confirmed or not self.is_known_node(n) for n in job.delivered):
            self.send_to(job.delivered, DelJob(self.header(), job.id))
            self.unregister(job)

    def on_deljob(self, sender: bytes, msg: DelJob) -> None:
        """ON RECV DELJOB: the job is done with cluster-wide (collected or FASTACKed)."""
        job = self.lookup_job(msg.job_id)
        if job is not None:
            self.note_collected(job.id)
            self.delete_job(job)

    # ------------------------------------------------------------------ federation
    def need_jobs(self, q: Queue, now: int, reached_zero: bool = False) -> None:
        """Ask other nodes for jobs of `q` (NEEDJOBS), within the backoffs."""
        if self.leaving or self.membership is None or self.cluster_size() < 2:
            return
        adhoc_delay = min(NEEDJOBS_ADHOC_MS << q.needjobs_adhoc_attempt, NEEDJOBS_ADHOC_MAX_MS)
        bcast_due = now - q.needjobs_bcast_time >= min(
            NEEDJOBS_BCAST_MS << q.needjobs_bcast_attempt, NEEDJOBS_BCAST_MAX_MS)
        if reached_zero:
            if not q.import_rate:
                return  # only an active import flow is worth asking at once (original)
        elif not bcast_due and now - q.needjobs_adhoc_time < adhoc_delay:
            return  # within both backoffs: nothing to send (every empty GETJOB comes here)
        responders = q.needjobs_responders
        for n, t in list(responders.items()):
            if now - t > RESPONDER_VALID_MS:
                del responders[n]
        if responders and (reached_zero or now - q.needjobs_adhoc_time >= adhoc_delay):
            count = q.import_rate // len(responders)
            count = max(NEEDJOBS_MIN, min(NEEDJOBS_MAX, count))
            msg = NeedJobs(self.header(), q.name, count)
            for n in responders:
                self.send(n, msg)
            q.needjobs_adhoc_time = now
            if q.needjobs_adhoc_attempt < 7:
                q.needjobs_adhoc_attempt += 1
        if bcast_due:
            # Every node of the table, leaving ones included: a leaving node is still a
            # source (it drains), as in the original.
            others = [n for n in self.reachable_or_known() if n != self.myself]
            if others:
                msg = NeedJobs(self.header(), q.name, 1)
                for n in others:
                    self.send(n, msg)
            q.needjobs_bcast_time = now
            if q.needjobs_bcast_attempt < 5:
                q.needjobs_bcast_attempt += 1

    def on_needjobs(self, sender: bytes, msg: NeedJobs) -> None:
        """ON RECV NEEDJOBS: move some of our queued jobs to the asking node (YOURJOBS)."""
        q = self.lookup_queue(msg.queue)
        if q is not None and (q.paused & PAUSE_OUT or q.import_rate > 0):
            return
        now = self.clock()
        count = max(msg.count, 1)
        if q is None or not q.jobs:
            # Nothing to give now. Unlike the original (which drops the request and leaves
            # the asker to retry after its backoff, up to 2 s later), remember it briefly:
            # jobs queued here meanwhile go straight to the node whose consumers wait.
            self.needers.setdefault(msg.queue, {})[sender] = (now + NEEDER_HOLD_MS, count)
            return
        n = len(q.jobs)
        self.give_jobs(q, sender, count if n >= 2 * count else max(1, n // 2), now)

    def give_jobs(self, q: Queue, to: bytes, count: int, now: int) -> None:
        """Move `count` jobs out of `q` to node `to` (YOURJOBS). Not while our link to it
        is down (a node killed after its NEEDJOBS): the bus would drop the message and the
        jobs would wait for their RETRY there (at-most-once ones would be lost)."""
        if not self.link_up(to):
            return
        records = []
        for _ in range(min(count, len(q.jobs))):
            job = q.jobs.pop_first()
            job.state = ACTIVE
            q.jobs_out += 1
            if to not in job.delivered:
                job.delivered = job.delivered + (to,)
            records.append(job_record(job, now))
            if not job.retry:
                # An at-most-once job moves: it exists on the wire or at the receiver only.
                self.delete_job(job)
        q.atime = now
        self.send(to, YourJobs(self.header(), records))

    def serve_needers(self, q: Queue, now: int) -> None:
        """Jobs were queued where a recent NEEDJOBS found none: forward them."""
        needers = self.needers.get(q.name)
        if not needers:
            self.needers.pop(q.name, None)
            return
        if q.paused & PAUSE_OUT:
            return
        reachable = self.reachable_others()
        for node, (until, count) in list(needers.items()):
            if not q.jobs:
                break
            if until < now or node not in reachable:
                del needers[node]
                continue
            give = min(count, len(q.jobs))
            self.give_jobs(q, node, give, now)
            if give >= count:
                del needers[node]
            else:
                needers[node] = (until, count - give)
        if not needers:
            del self.needers[q.name]

    def on_yourjobs(self, sender: bytes, msg: YourJobs) -> None:
        """ON RECV YOURJOBS: queue the jobs another node moved to us (no QUEUED broadcast;
        an at-most-once job is allowed exactly one queueing here)."""
        now = self.clock()
        for rec in msg.jobs:
            job = self.lookup_job(rec.id)
            if job is None:
                job = job_from_record(rec, now)
                if self.myself not in job.delivered:
                    job.delivered = job.delivered + (self.myself,)
                self.register(job)
                if self.persist is not None:  # a copy held here now, as after a REPLJOB
                    self.persist.loadjob(job)
            elif job.state not in (ACTIVE, WAIT_REPL):
                if job.state == ACKED:
                    self.send(sender, SetAck(self.header(), job.id, len(job.delivered)))
                continue
            else:
                # a copy held here: the sender counted deliveries and NACKs ours never saw
                if rec.deliveries > job.deliveries:
                    job.deliveries = rec.deliveries
                if rec.nacks > job.nacks:
                    job.nacks = rec.nacks
                missing = tuple(n for n in rec.delivered if n not in job.delivered)
                if missing:
                    job.delivered = job.delivered + missing
            job.state = ACTIVE
            job.qtime = now
            q = self.create_queue(job.queue, now)
            if q.paused & PAUSE_IN:
                if job.retry:
                    job.qtime = self.requeue_time(job, now)
                    self.schedule_job(job)
                else:
                    self.enqueue(job, now)  # nowhere else to go: keep the one delivery
            else:
                self.enqueue(job, now)
            new = sender not in q.needjobs_responders
            q.needjobs_responders[sender] = now
            if new:
                q.needjobs_bcast_attempt = 0
            q.needjobs_adhoc_attempt = 0
            self.note_import(q, now, 1)
            self.importing.add(q)

    def note_import(self, q: Queue, now: int, n: int) -> None:
        """Count imported jobs in 1 s buckets of (first import time, count)."""
        samples = q.import_samples
        if samples and now - samples[-1][0] < 1000:
            samples[-1] = (samples[-1][0], samples[-1][1] + n)
        else:
            samples.append((now, n))
        self.update_import_rate(q, now)

    def update_import_rate(self, q: Queue, now: int) -> None:
        """Jobs per second imported recently: the jobs of the last two 1 s buckets over the
        time since the older one started (at least 50 ms), as the original; 0 once the
        newest bucket is older than the 5 s window."""
        samples = q.import_samples
        if len(samples) > 2:
            del samples[:-2]
        if samples and now - samples[-1][0] > IMPORT_WINDOW_S * 1000:
            samples.clear()
        if not samples:
            q.import_rate = 0
            return
        recent = samples[-2:]
        span = max(now - recent[0][0], 50)
        q.import_rate = -(-sum(c for _, c in recent) * 1000 // span)

    def cluster_cron(self, now: int) -> None:
        """Every 100 ms: queues with blocked consumers ask again (within the backoffs);
        import rates decay; unanswered NEEDJOBS past their hold time are forgotten."""
        if self.needers:
            for name, askers in list(self.needers.items()):
                for n, (until, _count) in list(askers.items()):
                    if until < now:
                        del askers[n]
                if not askers:
                    del self.needers[name]
        if self.membership is not None and self.cluster_size() > 1:
            for q in self.queues_with_waiters():
                if not q.jobs:
                    self.need_jobs(q, now)
            for q in list(self.importing):
                self.update_import_rate(q, now)
                if not q.import_samples:
                    self.importing.discard(q)

    # ------------------------------------------------------------------ PAUSE
    def broadcast_pause(self, name: bytes) -> None:
        q = self.lookup_queue(name)
        flags = q.paused if q is not None else 0
        self.send_to(self.reachable_others(), PauseQueue(self.header(), name, flags))

    def on_pause(self, sender: bytes, msg: PauseQueue) -> None:
        self.pause(msg.queue, msg.flags & (PAUSE_IN | PAUSE_OUT))

    # ------------------------------------------------------------------ dispatch
    def on_message(self, sender: bytes, msg: Message) -> None:
        """A job message from another node of the cluster."""
        handler = _HANDLERS.get(type(msg))
        if handler is not None:
            handler(self, sender, msg)

    def leaving_started(self) -> None:
        """CLUSTER LEAVING yes: clients waiting on replication get -LEAVING, copies go."""
        for rep in list(self.replicating.values()):
            self.replicating.pop(rep.job.id, None)
            self.delete_everywhere(rep.job)
            rep.failed(leaving())


_HANDLERS: dict[type, Any] = {
    ReplJob: ClusterJobs.on_repljob,
    ReplJobBatch: ClusterJobs.on_repljob_batch,
    ReplJobsOut: ClusterJobs.on_repljob_batch,  # (handed over without the codec: tests)
    GotJob: ClusterJobs.on_gotjob,
    GotJobBatch: ClusterJobs.on_gotjob_batch,
    EnqueueJob: ClusterJobs.on_enqueue,
    Queued: ClusterJobs.on_queued,
    SetAck: ClusterJobs.on_setack,
    WillQueue: ClusterJobs.on_willqueue,
    GotAck: ClusterJobs.on_gotack,
    DelJob: ClusterJobs.on_deljob,
    NeedJobs: ClusterJobs.on_needjobs,
    YourJobs: ClusterJobs.on_yourjobs,
    WorkingJob: ClusterJobs.on_working,
    PauseQueue: ClusterJobs.on_pause,
}
