"""Re-queue (the spec's WILLQUEUE / QUEUED / WORKING exchange) and the commands that put
jobs back: ENQUEUE, NACK [DELAY], DEQUEUE, WORKING. Sans-I/O.

500 ms before its requeue time an active job announces WILLQUEUE to the nodes that may have
it (`will_queue`; `on_willqueue`: a node that has it queued answers QUEUED, one that has it
acked answers SETACK); requeueing broadcasts QUEUED (`requeue_by_timer`, `on_queued`), which
postpones the others and dequeues duplicates on the node that loses the per-job node-ID
comparison (`sender_wins`). WORKING (and a NACK DELAY) postpones every holder's requeue.

A copy reloaded from the AOF (F_RELOADED) asks every holder before its first requeue
(`reload_pending`): one that answers "collected here" proves the job acknowledged and
collected while this node was away, and the copy is dropped (`reload_collected`).

The dead-letter policy is reached through its door (`DeadLetterDoor`: check a limit before
a requeue, compare the holders' states); messages leave through the state's outbox.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final, Protocol

from disque.cluster.messages import (
    QUEUED_INCR_DELIV,
    QUEUED_INCR_NACKS,
    QUEUED_STATE_ONLY,
    QUEUED_UNKNOWN,
    STATE_EPOCH_SHIFT,
    WILLQUEUE_CONFIRM,
    Queued,
    WillQueue,
    WorkingJob,
)
from disque.cluster.records import state_bits
from disque.jobs.job import (
    ACKED,
    ACTIVE,
    F_BCAST_QUEUED,
    F_BCAST_WILLQUEUE,
    F_NACK_DELAYED,
    F_RELOADED,
    QUEUED,
    Job,
)
from disque.protocol.errors import CommandError
from disque.state import NodeState

RELOAD_CONFIRM_ROUNDS: Final = 3  # RETRY periods a reloaded copy waits for its holders' answers
# ... counting only the periods that end with one of its other holders reachable: the silence
# of holders that cannot be reached says nothing (chaos random-kill-aof seed 3 requeued ~400
# reloaded copies while the two holders that had collected them were down: delivered 12-15 s
# after their ACK); up to RELOAD_WAIT_ROUNDS periods in all (a job is never given up)
RELOAD_WAIT_ROUNDS: Final = 10
_NO_ROUNDS: Final = (0, 0)  # reload_pending: (periods counted, periods waited)


class DeadLetterDoor(Protocol):
    """What re-queueing asks of the dead-letter subsystem (disque.cluster.deadletters)."""

    def check(self, job: Job, now: int, nack: bool) -> bool: ...
    def compare(self, sender: bytes, job: Job, aux: int) -> int: ...


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


class Requeue:
    """The re-queue subsystem of a node (`node.requeue`)."""

    def __init__(self, state: NodeState, deadletters: DeadLetterDoor) -> None:
        self.state = state
        self.deadletters = deadletters
        # jobs reloaded from the AOF waiting for a holder to confirm them (F_RELOADED):
        # job id -> (RETRY periods counted, periods waited): see requeue_by_timer
        self.reload_pending: dict[bytes, tuple[int, int]] = {}

    def reload_confirmed(self, job_id: bytes) -> None:
        """Another holder has the reloaded job: it is alive (the flag is cleared)."""
        self.reload_pending.pop(job_id, None)

    # ------------------------------------------------------------------ commands
    def enqueue_jobs(self, ids: Iterable[bytes], nack: bool = False) -> int:
        """ENQUEUE / NACK: active jobs back into their queue; counters as the checklist."""
        moved = 0
        for job_id in ids:
            job = self.state.lookup_job(job_id)
            if job is None or job.state != ACTIVE:
                continue
            if nack and job.dl is not None and job.qtime and \
                    self.deadletters.check(job, self.state.clock(), nack=True):
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
            self.state.enqueue(job)
            moved += 1
            if self.state.membership is not None and (nack or requeued):
                self.state.broadcast_queued(job, flags)
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
        now = self.state.clock()
        for job_id in ids:
            job = self.state.lookup_job(job_id)
            if job is None or job.state != ACTIVE:
                continue
            wait = delay
            if wait is None:
                dl = job.dl
                wait = (dl.backoff_delay(1 + job.nacks + job.deliveries, self.state.random())
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
            self.state.schedule_job(job)
            if self.state.membership is not None:
                self.broadcast_nack_delay(job, wait)
        return moved

    def dequeue_jobs(self, ids: Iterable[bytes]) -> int:
        moved = 0
        for job_id in ids:
            job = self.state.lookup_job(job_id)
            if job is not None and self.state.dequeue(job):
                moved += 1
        return moved

    def working(self, job_id: bytes) -> int:
        """Postpone the next delivery by the retry time; returns the retry (seconds)."""
        job = self.state.lookup_job(job_id)
        if job is None:
            raise CommandError("NOJOB", "Job not known in the context of this node.")
        now = self.state.clock()
        ctime_ms = job.ctime // 1_000_000
        if now - ctime_ms > (job.etime - ctime_ms) / 2:
            raise CommandError("TOOLATE", "Half of job TTL already elapsed, you are no longer "
                                          "allowed to postpone the next delivery.")
        if job.state == QUEUED:
            self.state.dequeue(job)
        # An acked job's qtime is its next GC attempt, not a requeue time: leave it alone.
        if job.retry and job.qtime and job.state != ACKED:
            job.qtime = self.state.requeue_time(job, now)
            job.flags &= ~F_BCAST_WILLQUEUE
            self.state.schedule_job(job)
        if self.state.membership is not None:
            self.broadcast_working(job)
        return job.retry

    def count_nacked(self, job: Job) -> None:
        q = self.state.queue_of(job)
        if q is not None:
            q.nacked += 1

    # ------------------------------------------------------------------ the exchange
    def requeue_by_timer(self, job: Job, now: int) -> None:
        """TIMER at qtime: queue the job again and tell the other holders (QUEUED).

        A copy reloaded from the AOF (F_RELOADED) may be the last trace of a job that was
        acknowledged and collected while this node was down, or just before it crashed
        with its DELJOB not yet on disk: its WILLQUEUE asked every holder to answer. An
        answer from one that has the job cleared the flag (it is alive: requeue); one
        holder answering "collected here" deleted it (reload_collected). Still flagged here
        means no holder answered either way: wait one more RETRY, RELOAD_CONFIRM_ROUNDS
        times at most, then requeue anyway (a job is never given up for silence). A period
        that ends with none of the other holders reachable does not count (they could not
        answer), RELOAD_WAIT_ROUNDS periods at most."""
        if job.flags & F_RELOADED:
            st = self.state
            counted, waited = self.reload_pending.get(job.id, _NO_ROUNDS)
            waited += 1
            myself = st.myself
            if any(n != myself and st.link_up(n) for n in job.delivered):
                counted += 1
            if counted < RELOAD_CONFIRM_ROUNDS and waited < RELOAD_WAIT_ROUNDS:
                self.reload_pending[job.id] = (counted, waited)
                job.qtime = st.requeue_time(job, now)
                job.flags &= ~F_BCAST_WILLQUEUE
                return
            job.flags &= ~F_RELOADED
            self.reload_pending.pop(job.id, None)
        if job.flags & F_NACK_DELAYED:  # the end of a NACK DELAY: that NACK was counted
            job.flags &= ~F_NACK_DELAYED
            if self.state.enqueue(job, now):
                self.state.broadcast_queued(job, 0)
            return
        requeued = job.flags & F_BCAST_QUEUED or job.id[2:10] != self.state.myself[:8]
        if requeued and job.dl is not None and self.deadletters.check(job, now, nack=False):
            return  # over its limit: into its dead-letter queue instead
        if job.state != ACTIVE or not job.qtime:
            return  # (what enqueue refuses)
        if requeued:
            # counted first: enqueue may hand the job at once to a blocked GETJOB, whose
            # WITHCOUNTERS reply must include this delivery
            job.deliveries += 1
        self.state.enqueue(job, now)
        if requeued:
            others = self.state.others(job)
            if others:
                msg = Queued(self.state.header(), job.id, QUEUED_INCR_DELIV | state_bits(job))
                for n in others:
                    self.state.send(n, msg)

    def will_queue(self, job: Job) -> None:
        """TIMER 500 ms before qtime: WILLQUEUE to every node that may have the job (aux:
        its dead-letter state, see disque.cluster.deadletters; a copy reloaded from the AOF
        also asks every holder to answer, see requeue_by_timer)."""
        job.flags |= F_BCAST_WILLQUEUE
        aux = state_bits(job)
        if job.flags & F_RELOADED:
            aux |= WILLQUEUE_CONFIRM
            self.reload_pending.setdefault(job.id, _NO_ROUNDS)
        self.state.send_to(job.delivered, WillQueue(self.state.header(), job.id, aux))

    def on_willqueue(self, sender: bytes, msg: WillQueue) -> None:
        st = self.state
        job = st.jobs.get(msg.job_id)
        if job is None and st.on_disk:
            if self._queued_on_disk(sender, msg):
                return
            job = st.fault_in(msg.job_id)  # (not in the registry: looked above)
        if job is None:
            if msg.aux & WILLQUEUE_CONFIRM:
                # collected here: the reloaded copy is a ghost of an acknowledged job.
                # Never known (a copy refused or lost, a local DELJOB) or forgotten: it may
                # be the last copy of a live job, so let it requeue now.
                self.state.send(sender, Queued(self.state.header(), msg.job_id, QUEUED_STATE_ONLY | (
                    QUEUED_UNKNOWN if msg.job_id in self.state.collected else 0)))
            else:
                self.state.tell_collected(sender, msg.job_id)
            return
        if job.state in (ACTIVE, QUEUED) and sender not in job.delivered:
            job.delivered = job.delivered + (sender,)
            st.log_holders(job)
        if job.state == ACKED:
            self.state.send(sender, self.state.setack(job))
            return
        if (job.dl is not None or msg.aux >> STATE_EPOCH_SHIFT) and \
                self.deadletters.compare(sender, job, msg.aux):
            return  # one side was behind: the newer state went where it was missing
        if job.state == QUEUED:
            self.state.send_to(job.delivered, Queued(self.state.header(), job.id, state_bits(job)))
        elif msg.aux & WILLQUEUE_CONFIRM and not job.flags & F_RELOADED:
            # "I have it": the reloaded copy may requeue. Not from a copy reloaded itself and
            # not confirmed yet: no proof that the job is alive (chaos random-kill-aof seed 3:
            # two nodes that had missed an ACK while down reloaded the job after their
            # restarts and vouched for each other, ~400 jobs delivered 12 s after their ACK)
            self.state.send(sender, Queued(self.state.header(), job.id,
                                     QUEUED_STATE_ONLY | state_bits(job)))

    def _queued_on_disk(self, sender: bytes, msg: WillQueue) -> bool:
        """A WILLQUEUE for a job queued here and on disk (disque.overflow) that changes
        nothing here (the sender is listed, no dead-letter state on either side): QUEUED
        answered from a copy read in place, the job left on disk. Read back into memory,
        each job queued on disk came back every RETRY seconds (its other holders'
        WILLQUEUEs) and went out again: with RETRY 2 a backlog on disk cycled through
        memory, ~5,000 jobs a second each way on a chaos node."""
        st = self.state
        copy = st.disk_job(msg.job_id)
        if copy is None or copy.state != QUEUED or sender not in copy.delivered or \
                copy.dl is not None or msg.aux >> STATE_EPOCH_SHIFT:
            return False
        st.send_to(copy.delivered, Queued(st.header(), copy.id, 0))
        return True

    def on_queued(self, sender: bytes, msg: Queued) -> None:
        """ON RECV QUEUED: someone queued the job; postpone ours, drop a duplicate. A
        STATE_ONLY one only carries the sender's state of the job (dead letters, or the
        answer to a reloaded copy's WILLQUEUE)."""
        job = self.state.lookup_job(msg.job_id)
        if job is None:
            self.state.tell_collected(sender, msg.job_id)
            return
        aux = msg.aux
        if aux & QUEUED_UNKNOWN:
            self.reload_collected(job)
            return
        if job.flags & F_RELOADED:  # another holder has the job: it is alive
            job.flags &= ~F_RELOADED
            self.reload_pending.pop(job.id, None)
        if job.state == ACKED:
            self.state.send(sender, self.state.setack(job))
            return
        order = 0
        if job.dl is not None or aux >> STATE_EPOCH_SHIFT:
            order = self.deadletters.compare(sender, job, aux)
            if order < 0:
                return  # a stale sender: it was told our state
        if aux & QUEUED_STATE_ONLY:
            return
        if order == 0 and job.state == QUEUED and sender_wins(sender, self.state.myself, job.id):
            self.state.dequeue(job)
        if job.retry and job.qtime:
            job.qtime = self.state.requeue_time(job, self.state.clock())
            job.flags &= ~F_BCAST_WILLQUEUE
            self.state.schedule_job(job)
        if msg.aux & QUEUED_INCR_NACKS:
            job.nacks += 1
        if msg.aux & QUEUED_INCR_DELIV:
            job.deliveries += 1

    def on_working(self, sender: bytes, msg: WorkingJob) -> None:
        """ON RECV WORKING: like QUEUED, but always dequeue, and no counters. With aux > 0 it
        is a NACK DELAY of aux seconds: count the nack, and requeue no sooner than a RETRY
        after the sender's own requeue."""
        job = self.state.lookup_job(msg.job_id)
        if job is None or job.state == ACKED:
            return
        if job.state == QUEUED:
            self.state.dequeue(job)
        if msg.aux:
            job.nacks += 1
        if job.retry and job.qtime:
            job.qtime = self.state.requeue_time(job, self.state.clock() + msg.aux * 1000)
            job.flags &= ~F_BCAST_WILLQUEUE
            self.state.schedule_job(job)

    def reload_collected(self, job: Job) -> None:
        """A holder asked by a reloaded copy's WILLQUEUE collected the job: it was
        acknowledged (or FASTACKed, or its ADDJOB failed) and every copy is to go, as on a
        DELJOB. One such answer is proof enough, whatever the other holders say or whether
        they answer at all: the others may be down, or reloaded copies themselves. (Before,
        every holder had to answer "unknown" within one WILLQUEUE round; with holders
        restarting one after another that rarely happened, and the ghost was requeued and
        delivered again after its ACK.)"""
        self.reload_pending.pop(job.id, None)
        self.state.note_collected(job.id)
        self.state.delete_job(job)

    def broadcast_working(self, job: Job) -> None:
        if self.state.others(job):
            self.state.send_to(job.delivered, WorkingJob(self.state.header(), job.id))

    def broadcast_nack_delay(self, job: Job, delay: int) -> None:
        if self.state.others(job):
            self.state.send_to(job.delivered, WorkingJob(self.state.header(), job.id, delay))
