"""Dead-letter queues and redrive, across the cluster (sans-I/O).

A job with a `DeadLetter` policy (disque.jobs.deadletter) that fails too often is not queued
again into its source queue: the node that would requeue it (its RETRY timer expired, or a
consumer NACKed it) finds the limit reached (`check`) and moves it into its dead-letter
queue instead (`dead_letter`), keeping its ID and body and recording the reason and time.
REDRIVE moves dead jobs back to their source queues (`redrive_job`, at most `rate` jobs a
second by a task per dead-letter queue).

How the holders of a job agree. Every holder keeps the job's `epoch`: even while it is
alive in its source queue, odd while it is dead. Dead-lettering and redriving move the job
to the next epoch; no node moves it back. Every QUEUED and WILLQUEUE a node sends about the
job carries its epoch (and the reason) in `aux` (`state_bits`), so the spec's re-queue
exchange doubles as the dead-letter exchange:

- a holder that hears of a higher epoch adopts it (`adopt`): it takes its copy out of the
  queue it was in, renames the job's queue, and keeps the copy active as a backup whose
  requeue timer goes into the new queue;
- a holder that hears of a lower epoch answers QUEUED with QUEUED_STATE_ONLY and its own
  state (the sender adopts it; STATE_ONLY means "I did not queue it": no tie-break);
- equal epochs follow the ordinary rules: two nodes that dead-lettered the same job at the
  same moment both queued it in the dead-letter queue, and the QUEUED tie-break leaves one.
- a dead job queued here asks its other holders again with a WILLQUEUE every RETRY
  (`still_queued`): nobody need consume a dead-letter queue, and without a consumer two
  queued copies would never exchange a message.

Guarantees (best effort, as the spec's counters): once the holders have exchanged a message
about the job, it is live in one queue only. During a partition, a holder cut off from the
node that dead-lettered a job may requeue it into its source queue; the two copies meet at
the next WILLQUEUE / QUEUED between them and the source copy is taken out, or an ACK of
either copy removes both. The limits are checked against the counters of the node that
requeues, which may lag behind by the messages it missed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from disque.cluster.messages import (
    QUEUED_INCR_NACKS,
    QUEUED_RESET,
    QUEUED_STATE_ONLY,
    STATE_EPOCH_SHIFT,
    STATE_REASON_MASK,
    STATE_REASON_SHIFT,
    Queued,
    WillQueue,
)
from disque.cluster.records import state_bits
from disque.jobs.deadletter import MAX_EPOCH, REASON_EXPIRED, REASON_NONE
from disque.jobs.job import ACTIVE, F_BCAST_WILLQUEUE, F_NACK_DELAYED, QUEUED, Job
from disque.state import NodeState
from disque.timers import Timer

REDRIVE_TICK_MS: Final = 100
REDRIVE_SCAN_EXTRA: Final = 1000  # queued jobs a tick looks at past its budget, at most


class RedriveTask:
    """REDRIVE of one dead-letter queue: `remaining` jobs at `rate` a second."""

    __slots__ = ("queue", "remaining", "rate", "reset", "credit")

    def __init__(self, queue: bytes, remaining: int, rate: int, reset: bool) -> None:
        self.queue = queue
        self.remaining = remaining
        self.rate = rate
        self.reset = reset
        self.credit = 0.0  # jobs this task may move now (rate x elapsed ticks)


class DeadLetters:
    """The node's dead-letter side: counters, the decisions above, REDRIVE tasks."""

    def __init__(self, node: NodeState) -> None:
        self.node = node
        self.deadlettered = 0  # jobs this node moved into a dead-letter queue
        self.redriven = 0  # jobs this node moved back to their source queue
        # source queue -> jobs this node dead-lettered out of it (QSTAT); kept when the
        # queue object is collected, like the totals above
        self.by_queue: dict[bytes, int] = {}
        self.tasks: dict[bytes, RedriveTask] = {}
        self._timer = Timer(self._redrive_tick)
        # told of every decision to dead-letter a job (job, reason), before it is moved:
        # for the simulation's checks, which cannot wrap a method of a compiled class
        self.observer: Callable[[Job, int], None] | None = None

    # ------------------------------------------------------------------ dead-lettering
    def check(self, job: Job, now: int, nack: bool) -> bool:
        """Before a requeue (RETRY timer, or NACK when `nack`): True if the job was over its
        limit and went to its dead-letter queue instead (a NACK counted)."""
        assert job.dl is not None  # (checked only for jobs with a policy)
        reason = job.dl.over_limit(job.nacks, job.deliveries, nack)
        if reason == REASON_NONE:
            return False
        if nack:
            job.nacks += 1
        self.dead_letter(job, reason, now, QUEUED_INCR_NACKS if nack else 0)
        return True

    def dead_letter(self, job: Job, reason: int, now: int, flags: int = 0) -> None:
        if self.observer is not None:
            self.observer(job, reason)
        node = self.node
        by_queue = self.by_queue
        source = job.queue or b""  # (a job with a policy always has its queue)
        by_queue[source] = by_queue.get(source, 0) + 1
        if job.state == QUEUED:
            node.dequeue(job)
        assert job.dl is not None
        dl = job.dl = job.dl.moved(min(job.dl.epoch + 1, MAX_EPOCH), reason, now)
        job.queue = node.create_queue(dl.queue, now).name
        if dl.deadttl:
            job.etime = max(job.etime, now + dl.deadttl * 1000)
        self.deadlettered += 1
        self._requeue(job, now, flags)

    def expired(self, job: Job, now: int) -> None:
        """The job's TTL ended while it was alive and its policy has a DEADTTL (original
        issue #95): into its dead-letter queue, living DEADTTL more. Every holder's TTL ends
        at the same moment, so each decides alone: a holder with the job queued dead-letters
        it (queued in the dead-letter queue, the others told by QUEUED); one holding it
        active (delivered, or a backup copy) only moves its copy there, kept active with its
        requeue timer from now, as when it adopts another holder's state. If nobody had it
        queued (a consumer held it), the first of those timers queues it in the dead-letter
        queue."""
        if job.state == QUEUED:
            self.dead_letter(job, REASON_EXPIRED, now)
        else:
            assert job.dl is not None
            self.adopt(job, min(job.dl.epoch + 1, MAX_EPOCH), REASON_EXPIRED, False)

    def redrive_job(self, job: Job, reset: bool, now: int) -> bool:
        """A dead job back into its source queue (a new epoch), counters reset if asked."""
        dl = job.dl
        if dl is None or not dl.dead or job.state not in (ACTIVE, QUEUED):
            return False
        node = self.node
        if job.state == QUEUED:
            node.dequeue(job)
        job.dl = dl.moved(min(dl.epoch + 1, MAX_EPOCH), REASON_NONE, now)
        job.queue = node.create_queue(dl.source, now).name
        if reset:
            job.nacks = job.deliveries = 0
        self.redriven += 1
        self._requeue(job, now, QUEUED_RESET if reset else 0)
        return True

    def _requeue(self, job: Job, now: int, flags: int) -> None:
        """Queue the job in its (new) queue here and tell the other holders."""
        node = self.node
        # (active: the callers took a queued copy out of its old queue first)
        job.flags &= ~F_NACK_DELAYED
        job.qtime = now  # due: allowed even for a job whose timer had ended
        node.enqueue(job, now)
        if node.membership is not None:
            node.broadcast_queued(job, flags)
        if node.persist is not None:
            node.persist.loadjob(job)

    # ------------------------------------------------------------------ the exchange
    def still_queued(self, job: Job) -> None:
        """A dead job queued here reached its requeue time: ask the other holders again, a
        WILLQUEUE with its state. Nobody need consume a dead-letter queue, so without this
        the copies both sides of a partition dead-lettered would stay queued on both after
        it healed, and a holder that missed the dead-lettering (or a redrive) would not hear
        of it. A holder with the job queued answers QUEUED, so the tie-break reaches the
        loser whichever of them asks; one with another epoch adopts or answers it (compare).
        A WILLQUEUE, not a QUEUED: a QUEUED would push the winner's own timer every time a
        loser spoke, and the winner might never speak. Jobs with one holder send nothing."""
        node = self.node
        if node.membership is not None and node.others(job):
            node.send_to(job.delivered, WillQueue(node.header(), job.id, state_bits(job)))

    def compare(self, sender: bytes, job: Job, aux: int) -> int:
        """A QUEUED / WILLQUEUE from `sender` carried its state of the job: 1 if it was
        newer (adopted), -1 if older (the sender was told ours), 0 if the same."""
        epoch = aux >> STATE_EPOCH_SHIFT
        dl = job.dl
        mine = dl.epoch if dl is not None else 0
        if sender not in job.delivered:
            # it has a copy: our own QUEUED must reach it too, or a duplicate queued there
            # would never hear the tie-break it loses (see still_queued)
            job.delivered = job.delivered + (sender,)
        if epoch > mine and dl is not None:
            self.adopt(job, epoch, (aux >> STATE_REASON_SHIFT) & STATE_REASON_MASK,
                       bool(aux & QUEUED_RESET))
            return 1
        if epoch < mine:
            node = self.node
            node.send(sender, Queued(node.header(), job.id, QUEUED_STATE_ONLY | state_bits(job)))
            return -1
        return 0

    def adopt(self, job: Job, epoch: int, reason: int, reset: bool) -> None:
        """Another holder moved the job to `epoch`: our copy follows, as a backup."""
        node = self.node
        now = node.clock()
        if job.state == QUEUED:
            node.dequeue(job)  # (before the rename: the queue it is in is job.queue)
        assert job.dl is not None
        dl = job.dl = job.dl.moved(epoch, reason, now)
        name = dl.current_queue()
        q = node.lookup_queue(name)
        job.queue = q.name if q is not None else name
        if dl.dead and dl.deadttl:
            job.etime = max(job.etime, now + dl.deadttl * 1000)
        if reset:
            job.nacks = job.deliveries = 0
        if job.state == ACTIVE and job.retry and job.qtime:
            job.qtime = node.requeue_time(job, now)
            job.flags &= ~(F_BCAST_WILLQUEUE | F_NACK_DELAYED)
        node.schedule_job(job)
        if node.persist is not None:
            node.persist.loadjob(job)

    # ------------------------------------------------------------------ REDRIVE
    def redrive(self, queue: bytes, count: int | None, rate: int, reset: bool) -> int:
        """Start (or replace) the task moving dead jobs queued in `queue` here back to their
        source queues: `count` of them (None: as many as are queued now). Returns how many
        the task will move at most."""
        q = self.node.lookup_queue(queue)
        n = len(q) if q is not None else 0  # (jobs on disk included: disque.overflow)
        remaining = n if count is None else min(count, n)
        if not remaining:
            self.tasks.pop(queue, None)
            return 0
        self.tasks[queue] = RedriveTask(queue, remaining, rate, reset)
        if not self._timer.awake:
            self.node.wheel.schedule(self._timer, self.node.clock() + REDRIVE_TICK_MS)
        return remaining

    def redrive_ids(self, queue: bytes, ids: list[bytes], reset: bool) -> int:
        """REDRIVE ... ID: these jobs now, if they are dead jobs of `queue` known here."""
        node = self.node
        now = node.clock()
        moved = 0
        for job_id in ids:
            job = node.lookup_job(job_id)
            if job is not None and job.queue == queue and self.redrive_job(job, reset, now):
                moved += 1
        return moved

    def pending(self) -> int:
        return sum(t.remaining for t in self.tasks.values())

    def _redrive_tick(self, now: int) -> None:
        node = self.node
        for name, task in list(self.tasks.items()):
            task.credit = min(task.credit + task.rate * REDRIVE_TICK_MS / 1000, task.rate)
            budget = min(task.remaining, int(task.credit))
            if not budget:
                continue
            q = node.lookup_queue(name)
            picked: list[Job] = []
            if q is not None and q.spilled:
                node.refill(q)  # its oldest jobs may be on disk
            if q is not None:
                # oldest first; jobs added to this queue directly (no source) stay, and a
                # bounded look past them keeps a tick short
                for i, job in enumerate(q.jobs):
                    if job.dl is not None and job.dl.dead:
                        picked.append(job)
                        if len(picked) >= budget:
                            break
                    if i >= budget + REDRIVE_SCAN_EXTRA:
                        break
            for job in picked:
                if self.redrive_job(job, task.reset, now):
                    task.remaining -= 1
                    task.credit -= 1
            if not picked or not task.remaining:
                del self.tasks[name]
        if self.tasks:
            node.wheel.schedule(self._timer, now + REDRIVE_TICK_MS)

    def clear(self) -> None:
        self.tasks.clear()
        self.by_queue.clear()
