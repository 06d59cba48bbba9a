"""Job replication (the original's job.c): ADDJOB's copies, sans-I/O.

ADDJOB with REPLICATE n blocks the client (`start_replication`) until n - 1 other nodes
answered GOTJOB to REPLJOB (`on_repljob`, `on_gotjob`); the timeout answers -NOREPL and
deletes the copies (best effort). Copies go only to reachable nodes whose bus link is up
(`membership.linked()`, the original's "No link, no party"): a killed node's connection
resets at once, long before it is flagged PFAIL, so it is never waited for. When the link to
a node drops, every replication in flight that counted on it (listed, not confirmed) gets
another linked node at once (`link_changed`); when a link comes up, a replication short of
linked candidates takes the node at once. Linked nodes that do not answer (stopped, slow,
refusing) are covered by one more node every 50 ms (`repl_tick`). External replication
(memory above 75%, or LEAVING): the node keeps no copy and asks one confirming node to queue
the job (`on_enqueue`).

The receiving side holds copies (`hold_copies`, the hot path of a replica) and confirms them
(GOTJOB); a copy of a job created before this node started (a restart's refill, a repair)
is confirmed to every holder listed, not only to the sender (`tell_holders`: the others
left it to the sender). A GOTJOB that answers no ADDJOB goes to `copy_confirmed`
(re-replication and repair count their copies there); a copy of a job reloaded from the AOF that another holder
sends again proves the job alive (`reload_confirmed`, the re-queue subsystem's).

Effects leave through the state's outbox (`state.send`); nothing here touches a socket or
the real clock.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Final

from mypy_extensions import mypyc_attr

from disque.cluster.messages import (
    DelJob,
    EnqueueJob,
    GotJob,
    GotJobBatch,
    Header,
    JobRecord,
    ReplJob,
    ReplJobBatch,
)
from disque.cluster.records import job_record
from disque.jobs.job import ACTIVE, F_RELOADED, JOB_MEMORY, WAIT_REPL, Job
from disque.protocol.errors import CommandError, leaving
from disque.queues.queue import PAUSE_IN, Queue
from disque.state import NodeState

REPL_RETRY_MS: Final = 50  # one more target every 50 ms while a sync ADDJOB is short

NOREPL_TIMEOUT: Final = "Timeout reached before replicating to the requested number of nodes"
NOREPL_REMOVED: Final = "job removed (expired?) before the requested replication level was achieved"


# Subclassed by the command layer (and the tests), which stays interpreted.
@mypyc_attr(allow_interpreted_subclasses=True)
class ReplWaiter:
    """The client of a synchronous ADDJOB. The command layer subclasses it."""

    replication: JobReplication | None = None
    job_id: bytes = b""

    def cancel(self) -> None:
        """The client went away: the job is deleted cluster-wide (best effort), unless a
        retry of the same ADDJOB (DEDUP) waits for it too."""
        if self.replication is not None:
            self.replication.cancel_replication(self.job_id, self)

    def on_added(self, job_id: bytes) -> None:
        raise NotImplementedError

    def on_error(self, error: CommandError) -> None:
        raise NotImplementedError


class Replication:
    """A job waiting for synchronous replication (woken by its window's `ReplTimer`)."""

    __slots__ = ("job", "waiter", "followers", "external", "deadline", "next_tick")

    def __init__(self, job: Job, waiter: ReplWaiter, external: bool, started: int,
                 deadline: int) -> None:
        self.job = job
        self.waiter = waiter
        # DEDUP retries of the same ADDJOB: a list once there is one
        self.followers: list[ReplWaiter] | None = None
        self.external = external
        self.deadline = deadline  # ms: the ADDJOB timeout (0: none)
        self.next_tick = started + REPL_RETRY_MS  # ms: one more target then, while short

    def wake_at(self) -> int:
        """The next retry tick, or the timeout if it comes first."""
        deadline = self.deadline
        return deadline if deadline and deadline < self.next_tick else self.next_tick

    def added(self, job_id: bytes) -> None:
        self.waiter.on_added(job_id)
        if self.followers:
            for w in self.followers:
                w.on_added(job_id)

    def failed(self, error: CommandError) -> None:
        self.waiter.on_error(error)
        if self.followers:
            for w in self.followers:
                w.on_error(error)


class ReplTimer:
    """The timer of the replications started in the same REPL_RETRY_MS window (the jobs
    of a pipelined or ADDJOBS batch, and of the next few milliseconds): one timer-wheel
    entry for them all, waking at the earliest of their retry ticks and timeouts. Most
    replications are over within a millisecond or two, long before their first tick; a
    timer per millisecond woke the loop for nothing once per job when a node's clients
    add a job every few milliseconds (a cluster of many nodes, one client each). A
    replication that is over simply leaves `replicating`; the timer skips it, and goes
    when none is left."""

    __slots__ = ("replication", "reps", "window", "awake")

    def __init__(self, replication: JobReplication, window: int) -> None:
        self.replication = replication
        self.reps: list[Replication] = []
        self.window = window  # started // REPL_RETRY_MS of its replications
        self.awake = 0

    def callback(self, now: int) -> None:
        """Called by the node's timer wheel (see Node.tick)."""
        self.replication.repl_wake(self, now)


class ReplJobsOut(ReplJobBatch):
    """The REPLJOBs of consecutive new jobs to the same nodes, as one outbox message (see
    `start_replication`): one encoding for every node it goes to."""

    __slots__ = ("encoded",)

    def __init__(self, header: Header, items: list[JobRecord], noreply: bool) -> None:
        super().__init__(header, items, noreply)
        self.encoded: bytes | None = None  # the frame, once encoded

    @property
    def noreply(self) -> bool:
        return bool(self.key)

    def add(self, rec: JobRecord) -> None:
        self.items.append(rec)
        self.n += 1
        self.encoded = None

    def encode(self) -> bytes:
        frame = self.encoded
        if frame is None:
            frame = self.encoded = ReplJob.frame(self.header, self.items, self.key)
        return frame


def _gotjob(header: Header, ids: list[bytes]) -> GotJob | GotJobBatch:
    """GOTJOB for the copies `ids` (one frame: a batch if more than one)."""
    return GotJobBatch(header, ids, 0) if len(ids) > 1 else GotJob(header, ids[0])


class JobReplication:
    """The replication subsystem of a node (`node.replication`)."""

    def __init__(self, state: NodeState, copy_confirmed: Callable[[bytes, bytes], None],
                 reload_confirmed: Callable[[bytes], None],
                 copy_again: Callable[[bytes, Job, int], None],
                 copies_held: Callable[[bytes, list[bytes], int], None]) -> None:
        self.state = state
        self.copy_confirmed = copy_confirmed  # a GOTJOB answering no ADDJOB
        self.reload_confirmed = reload_confirmed  # a reloaded copy proved alive
        # (target, job, now): the job to a node that may not hold it, until its GOTJOB
        # (re-replication's copies: disque.cluster.rereplication)
        self.copy_again = copy_again
        # (sender, job IDs, their oldest ctime): the copies a REPLJOB left here, which may
        # list a restarted node (re-replication looks at them again)
        self.copies_held = copies_held
        self.replicating: dict[bytes, Replication] = {}  # sync ADDJOBs waiting for GOTJOB
        self.repl_timer: ReplTimer | None = None  # the newest replications' timer
        # the newest REPLJOB sent, and to which nodes (see start_replication)
        self.repl_last: ReplJob | ReplJobsOut | None = None
        self.repl_last_targets: Sequence[bytes] = ()
        # the copies `hold_copies` held of jobs created before this node started, for
        # `tell_holders` (emptied after each REPLJOB)
        self.older: list[Job] = []
        self.oldest_held = 0  # the oldest ctime of the last `hold_copies` (its records')

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
        st = self.state
        rec = job_record(job, now)
        if not async_:  # (the new job is in WAIT_REPL already: Job objects start there)
            job.confirmed = () if external else st.self_only
        if not targets:
            return  # no linked node now: link_changed or repl_tick sends it later
        out = st.out
        last = self.repl_last
        header = st.header()
        if (out and last is not None and out[-1][1] is last
                and targets is self.repl_last_targets and last.header is header
                and last.noreply == async_):
            # nothing else was sent since the previous job's REPLJOB: this one joins it
            if isinstance(last, ReplJobsOut):
                last.add(rec)
            else:
                batch = ReplJobsOut(header, [last.job, rec], async_)
                out[-len(targets):] = [(n, batch) for n in targets]
                self.repl_last = batch
        else:
            msg = self.repl_last = ReplJob(header, rec, async_)
            self.repl_last_targets = targets
            for n in targets:
                st.send(n, msg)
        if async_ and external:
            st.send(st.rng.choice(targets), EnqueueJob(header, job.id, job.delay))

    def wait_replication(self, job: Job, waiter: ReplWaiter, timeout_ms: int) -> None:
        """Park the ADDJOB client until the job is replicated, times out, or goes."""
        now = self.state.clock()
        rep = Replication(job, waiter, self.state.myself not in job.delivered, now,
                          now + timeout_ms if timeout_ms else 0)
        waiter.replication = self
        waiter.job_id = job.id
        self.replicating[job.id] = rep
        window = now // REPL_RETRY_MS
        timer = self.repl_timer
        if timer is None or timer.window != window:
            timer = self.repl_timer = ReplTimer(self, window)
        wake = rep.wake_at()
        if not timer.awake or wake < timer.awake:
            self.state.wheel.schedule(timer, wake)
        timer.reps.append(rep)

    def repl_wake(self, timer: ReplTimer, now: int) -> None:
        """The wheel woke the replications of a ReplTimer: time out, or one more retry
        tick, for each of them still waiting and due."""
        replicating = self.replicating
        left: list[Replication] = []
        wake = 0
        for rep in timer.reps:
            job_id = rep.job.id
            if replicating.get(job_id) is not rep:
                continue  # over: replicated, timed out, cancelled
            if rep.deadline and now >= rep.deadline:
                self.repl_timeout(job_id)
                continue
            if now >= rep.next_tick:
                rep.next_tick = now + REPL_RETRY_MS
                self.repl_tick(job_id)
            left.append(rep)
            at = rep.wake_at()
            if not wake or at < wake:
                wake = at
        timer.reps = left
        if not left:
            if self.repl_timer is timer:  # done with: nothing joins it any more
                self.repl_timer = None
            return
        self.state.wheel.schedule(timer, wake)

    def repl_tick(self, job_id: bytes) -> None:
        """TIMER every 50 ms while short of the replication factor: add one more linked
        node to `delivered` and re-send REPLJOB (so every holder learns the full list)."""
        rep = self.replicating.get(job_id)
        if rep is None:
            return
        job = rep.job
        candidates = [n for n in self.state.linked_others() if n not in job.delivered]
        added = False
        if candidates:
            job.delivered = job.delivered + (self.state.rng.choice(candidates),)
            added = True
        self.resend_repljob(job, added)

    def resend_repljob(self, job: Job, added: bool) -> None:
        """REPLJOB again to every other holder with a link: those that have not confirmed
        yet must answer; the confirmed ones, when the list grew, only learn it (NOREPLY)."""
        rec = job_record(job, self.state.clock())
        confirmed = job.confirmed
        link_up = self.state.link_up
        for n in self.state.others(job):
            if not link_up(n):
                continue  # (the bus would drop it; sent when a tick finds the link back)
            if n not in confirmed:
                self.state.send(n, ReplJob(self.state.header(), rec, False))
            elif added:
                self.state.send(n, ReplJob(self.state.header(), rec, True))

    def link_changed(self, node_id: bytes, up: bool) -> None:
        """Membership's LinkChanged: our bus link to `node_id` came up or went away.

        Down: every replication in flight that lists the node without its GOTJOB gets
        other linked nodes at once, as many as it is now short (see `replicate_more`): a
        REPLJOB lost with the link is not waited for. Up: replications short of linked
        candidates (fewer linked nodes than REPLICATE asked for) take the node now."""
        if not self.replicating:
            return
        linked = self.state.linked_others()
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
        myself = self.state.myself
        prospects = len(confirmed) + sum(1 for n in job.delivered if n != myself
                                         and n not in confirmed and n in linked)
        added = False
        while prospects < job.repl:
            delivered = job.delivered
            candidates = [n for n in linked if n not in delivered]
            if not candidates:
                break
            job.delivered = delivered + (self.state.rng.choice(candidates),)
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
        waiter.replication = self
        waiter.job_id = job_id
        if rep.followers is None:
            rep.followers = []
        rep.followers.append(waiter)
        return True

    def cancel_replication(self, job_id: bytes, waiter: ReplWaiter | None = None) -> bool:
        """An ADDJOB client went away: the job is deleted cluster-wide (best effort), unless
        another client waits for it (a DEDUP retry), which then carries on alone. True if
        the job was deleted."""
        rep = self.replicating.get(job_id)
        if rep is None:
            return False
        if waiter is not None and waiter is not rep.waiter:
            if rep.followers and waiter in rep.followers:
                rep.followers.remove(waiter)
            return False
        if rep.followers:
            rep.waiter = rep.followers.pop(0)
            return False
        del self.replicating[job_id]
        self.delete_everywhere(rep.job)
        return True

    def delete_everywhere(self, job: Job) -> None:
        """Delete locally and ask every node that may hold a copy to delete it."""
        self.state.send_to(job.delivered, DelJob(self.state.header(), job.id))
        if self.state.lookup_job(job.id) is job:
            self.state.delete_job(job)

    def replication_achieved(self, job: Job, now: int = 0) -> None:
        rep = self.replicating.pop(job.id, None)
        if not now:
            now = self.state.clock()
        if rep is not None and rep.external:
            confirmed = [n for n in job.confirmed if n != self.state.myself]
            if confirmed:  # (none when a SETACK "achieves" it first: nothing to queue)
                self.state.send(self.state.rng.choice(confirmed),
                                EnqueueJob(self.state.header(), job.id, job.delay))
            job.state = ACTIVE  # state: WAIT_REPL -> ACTIVE (never logged: the copy goes)
            self.state.unregister(job)
        else:
            job.confirmed = ()
            self.state.activate(job, now)
        if rep is not None:
            rep.added(job.id)

    def verify_unconfirmed(self, job: Job, now: int) -> None:
        """The job has its copies, but its list names nodes that did not confirm one: a
        REPLJOB lost with a dropped link (the job was re-targeted) or still on its way.
        Listed, such a node counts as a holder for repair (disque.cluster.repair) and the
        other holders cannot tell that it holds nothing: a phantom copy, and the job one
        crash closer to lost than it looks. So the job goes to it again as re-replication
        sends its copies (`copy_again`): until it answers GOTJOB (a copy, or a merge if the
        first one arrived), waiting while its link is down (a REPLJOB sent on a link that
        breaks before it arrives is lost with the link)."""
        myself = self.state.myself
        confirmed = job.confirmed
        for n in job.delivered:
            if n != myself and n not in confirmed:
                self.copy_again(n, job, now)

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

    def hold_and_confirm(self, sender: bytes, recs: Iterable[JobRecord],
                         noreply: bool) -> None:
        st = self.state
        if st.leaving or st.above_copy_limit() or st.persist_failing():
            return  # refused: no GOTJOB, the sender tries another node
        older = self.older
        held = self.hold_copies(recs, st.clock())
        if held:
            self.copies_held(sender, held, self.oldest_held)
            if not noreply:
                st.send(sender, _gotjob(st.header(), held))
                if older:
                    self.tell_holders(sender, older)
        if older:
            older.clear()

    def tell_holders(self, sender: bytes, jobs: list[Job]) -> None:
        """GOTJOB to the other holders of jobs created before this node started, of which
        `sender` sent us a copy: a restart's refill (or a repair). Re-replication sends each
        job to a restarted node from one holder and leaves it to that one on the others
        (`Rereplication._leave`): they learn from us that we hold it (`got_copy`), instead
        of sending it too."""
        st = self.state
        myself = st.myself
        told: dict[bytes, list[bytes]] = {}
        for job in jobs:
            for n in job.delivered:
                if n != myself and n != sender:
                    told.setdefault(n, []).append(job.id)
        header = st.header()
        for n, ids in told.items():
            st.send(n, _gotjob(header, ids))

    def hold_copies(self, recs: Iterable[JobRecord], now: int) -> list[bytes]:
        """Keep a copy of each replicated job (or merge its `delivered` into the copy we
        hold); the IDs held, which leaves out the jobs whose queue is paused for input (no
        GOTJOB: the sender tries another node).

        The hot path of a replica, so what the jobs of one frame share is worked out once
        (their queue, their `delivered` list: the decoder hands the jobs of a frame one
        tuple per distinct list) and a new copy is built and scheduled inline (the fields
        of `job_from_record`, the timer of `schedule_job`). The copy comes from Job's
        constructor: a compiled Job cannot be made with `object.__new__`, and compiled the
        call costs next to nothing."""
        st = self.state
        myself = st.myself
        shards = st.jshards
        mask = st.jmask
        schedule = st.wheel.schedule
        random = st.random
        persist = st.persist
        collected = st.collected
        held: list[bytes] = []
        last_queue: bytes | None = None
        q: Queue | None = None
        last_delivered: tuple[bytes, ...] | None = None
        delivered: tuple[bytes, ...] = ()
        willqueue = 0
        added = 0
        mem = 0
        started = st.start_ctime
        older = self.older
        oldest = 1 << 62
        # (as register(): the copies added while memory is near the overflow threshold)
        arrivals = st.arrivals if st.keeps_arrivals() else None
        for rec in recs:
            job_id, queue, body, repl, ttl_ms, ctime, delay, retry, nacks, deliv, \
                rec_delivered, dl = rec
            if ctime < oldest:
                oldest = ctime
            if queue != last_queue:
                last_queue = queue
                q = st.lookup_queue(queue)
            if q is not None:
                if q.paused & PAUSE_IN:
                    continue
                queue = q.name  # one shared bytes object for all the queue's jobs
            if rec_delivered is not last_delivered:
                last_delivered = rec_delivered
                delivered = st.shared_delivered(
                    rec_delivered if myself in rec_delivered else rec_delivered + (myself,))
                # the WILLQUEUE 500 ms before a requeue, when others may hold the job
                willqueue = 500 if len(delivered) > 1 else 0
            job = Job(job_id, queue, body, repl, ctime, now + ttl_ms, delay, retry, delivered)
            # register() and the lookup of a copy we already hold in one probe of the
            # registry (among millions of jobs, each probe is a cache miss)
            shard = shards[hash(job_id) & mask]
            if st.on_disk and job_id not in shard:
                # a copy held on disk (disque.overflow) merges too: read back, unless it
                # lists the same nodes (re-replication sends a job from every holder)
                if st.held_on_disk(job_id, delivered):
                    held.append(job_id)
                    continue
                st.fault_in(job_id)
            known = shard.setdefault(job_id, job)
            if known is not job:
                more = tuple(n for n in rec_delivered if n not in known.delivered)
                if more:
                    known.delivered = known.delivered + more
                    st.log_holders(known)
                if known.flags & F_RELOADED:  # a holder sent it again: it is alive
                    known.flags &= ~F_RELOADED
                    self.reload_confirmed(job_id)
                if ctime < started:
                    older.append(known)
                held.append(job_id)
                continue
            if job_id in collected:
                # acknowledged and collected here already: a copy that raced with the GC
                # (a repair's or a restart's REPLJOB) must not bring the job back
                del shard[job_id]
                continue
            job.state = ACTIVE  # state: WAIT_REPL -> ACTIVE (a new Job object)
            job.nacks = nacks
            job.deliveries = deliv
            job.dl = dl
            etime = job.etime
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
            if arrivals is not None:
                arrivals.append(job_id)
            if persist is not None:
                persist.loadjob(job)
            if ctime < started:
                older.append(job)
            held.append(job_id)
        if added:
            st.jobs.size += added
            st.mem_used += mem
        self.oldest_held = oldest
        return held

    def on_gotjob(self, sender: bytes, msg: GotJob) -> None:
        """ON RECV GOTJOB: count the confirmation; enough of them and the job is added."""
        self.got_job(sender, msg.job_id, self.state.clock())

    def on_gotjob_batch(self, sender: bytes, msg: GotJobBatch) -> None:
        got_job = self.got_job
        now = self.state.clock()
        for job_id in msg.items:
            got_job(sender, job_id, now)

    def got_job(self, sender: bytes, job_id: bytes, now: int) -> None:
        # the jobs waiting for copies first: a small, warm table (the registry holds
        # millions of jobs and a lookup there is a cache miss)
        rep = self.replicating.get(job_id)
        # (not from disk: a job there waits for no copy, and reading it back for a GOTJOB
        # of re-replication cost a read and a write per copy with overflow on)
        job = rep.job if rep is not None else self.state.jobs.get(job_id)
        if job is None or job.state != WAIT_REPL:
            if rep is None:
                self.copy_confirmed(sender, job_id)  # re-replication's or repair's
            return
        if sender not in job.confirmed:
            job.confirmed = job.confirmed + (sender,)
            if sender not in job.delivered:
                job.delivered = job.delivered + (sender,)
        if len(job.confirmed) >= job.repl:
            if len(job.delivered) > len(job.confirmed):
                self.verify_unconfirmed(job, now)
            self.replication_achieved(job, now)

    def on_enqueue(self, sender: bytes, msg: EnqueueJob) -> None:
        """ON RECV ENQUEUE: the creator kept no copy; queue ours (now or after the delay)."""
        job = self.state.lookup_job(msg.job_id)
        if job is None or job.state not in (WAIT_REPL, ACTIVE):
            return
        q = self.state.queue_of(job)
        if q is not None and q.paused & PAUSE_IN:
            return
        now = self.state.clock()
        if job.state == WAIT_REPL:
            job.state = ACTIVE  # state: WAIT_REPL -> ACTIVE
        if msg.aux == 0:
            job.qtime = now  # allowed exactly once even for an at-most-once job
            self.state.enqueue(job, now)
        else:
            job.qtime = now + msg.aux * 1000
            self.state.schedule_job(job)

    def leaving_started(self) -> None:
        """CLUSTER LEAVING yes: clients waiting on replication get -LEAVING, copies go."""
        for rep in list(self.replicating.values()):
            self.replicating.pop(rep.job.id, None)
            self.delete_everywhere(rep.job)
            rep.failed(leaving())
