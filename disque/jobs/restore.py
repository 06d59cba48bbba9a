"""Restoring a job read from the AOF (a LOADJOB record) into a node's state.

The loader (disque.aof.loader) decodes the records; what a restored job becomes is decided
here: expired ones are dropped, an acknowledgement is kept to answer for the job, queued
ones come back queued only after a controlled restart, and a copy that may be the ghost of a
job collected while the node was down waits for a holder to confirm it (F_RELOADED).
"""

from __future__ import annotations

from disque.jobs.job import (
    ACKED,
    ACTIVE,
    F_BCAST_QUEUED,
    F_RELOADED,
    F_RESTORED,
    QUEUED,
    WAIT_REPL,
    Job,
)
from disque.state import REQUEUE_JITTER, NodeState


def restore_job(state: NodeState, job: Job, enqueue_queued: bool) -> bool:
    """Restore a job read from the AOF (a LOADJOB record); False if it is skipped.

    Expired jobs are dropped. A job saved as queued comes back queued only after a
    controlled restart (`enqueue_queued`, aof-enqueue-jobs-once); otherwise it is active
    and re-queued by its timer after delay + retry. At-most-once jobs are never queued
    again (they may have been delivered), except one whose delay is still running:
    that one cannot have been queued yet, so it is queued when its delay ends.
    """
    now = state.clock()
    if job.etime <= now or job.state == WAIT_REPL:
        return False
    old = state.lookup_job(job.id)
    if old is not None:
        if not old.flags & F_RESTORED or (old.state == ACKED and job.state != ACKED):
            # A copy a holder sent over the bus while the AOF loads (the bus is up
            # meanwhile), or an acknowledgement: newer than this record, so kept, with the
            # holders the record names too. (Replaced by the record, the holders only that
            # copy named were forgotten: an ACK GC from this node later missed one, and it
            # delivered the job 11 s after its ACK.)
            old.delivered = old.delivered + tuple(n for n in job.delivered
                                                  if n not in old.delivered)
            if job.state == ACKED:
                state.ack_job(old)  # acknowledged before the restart: not a live copy
            return True
        job.delivered = job.delivered + tuple(n for n in old.delivered
                                              if n not in job.delivered)
        state.unregister(old)  # an earlier record of the job
    job.flags |= F_RESTORED
    if job.state == ACKED:
        # An acknowledgement (see ack_job): kept so that it answers for the job, and
        # collected by the usual GC, starting a second from now.
        state.register(job)
        job.awake = 0
        job.qtime = now + 1000 + int(state.random() * 500) - 250
        state.schedule_job(job)
        return True
    saved_queued = job.state == QUEUED
    job.state = ACTIVE  # state: QUEUED -> ACTIVE (a restored job, saved queued)
    job.awake = 0
    state.register(job)
    if saved_queued and enqueue_queued:
        job.qtime = now
        state.enqueue(job, now)
        return True
    if job.retry:
        job.qtime = now + (job.delay + job.retry) * 1000 + \
            int(state.random() * 2 * REQUEUE_JITTER) - REQUEUE_JITTER
        if len(job.delivered) > 1 or state.myself not in job.delivered:
            # It may have been acked and collected while we were down: ask first
            # (see disque.cluster.requeue.Requeue.requeue_by_timer).
            job.flags |= F_RELOADED
    elif (not job.flags & F_BCAST_QUEUED
          and job.ctime // 1_000_000 + job.delay * 1000 > now):
        # Queueing is not logged: only a delay still running at the restart proves the
        # job was never queued (so never delivered). One whose delay already ended may
        # have been queued and delivered after its LOADJOB was written.
        job.qtime = job.ctime // 1_000_000 + job.delay * 1000
    else:
        job.qtime = 0
    state.schedule_job(job)
    return True

