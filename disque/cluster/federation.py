"""Federation (the original's queue.c, NEEDJOBS / YOURJOBS): jobs move to the nodes whose
consumers wait for them. Sans-I/O.

A queue with waiting consumers and no jobs asks for jobs (`need_jobs`): ad hoc to recent
sources (25 ms doubling to 2 s) and by broadcast (2 s doubling to 30 s); `on_needjobs`
answers YOURJOBS with jobs moved out of its queue (`give_jobs`), `on_yourjobs` queues them.
A NEEDJOBS that found nothing is remembered briefly (the state's `needers`): jobs queued
meanwhile go straight to the asker (`serve_needers`). Import rates (jobs/s received per
queue) decide how many jobs an ad hoc NEEDJOBS asks for and whether a queue that just ran
dry asks at once (`note_import`, `update_import_rate`). `cluster_cron` runs every 100 ms.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Final

from disque.cluster.messages import NeedJobs, YourJobs
from disque.cluster.records import job_from_record, job_record
from disque.jobs.job import ACKED, ACTIVE, WAIT_REPL
from disque.queues.queue import PAUSE_IN, PAUSE_OUT, Queue
from disque.state import NodeState

NEEDJOBS_ADHOC_MS: Final = 25
NEEDJOBS_ADHOC_MAX_MS: Final = 2000
NEEDJOBS_BCAST_MS: Final = 2000
NEEDJOBS_BCAST_MAX_MS: Final = 30_000
RESPONDER_VALID_MS: Final = 5000
IMPORT_WINDOW_S: Final = 5
NEEDJOBS_MIN: Final = 5
NEEDJOBS_MAX: Final = 100
NEEDER_HOLD_MS: Final = 1000  # how long an unanswered NEEDJOBS is remembered (see on_needjobs)


class Federation:
    """The federation subsystem of a node (`node.federation`)."""

    def __init__(self, state: NodeState,
                 queues_with_waiters: Callable[[], Iterable[Queue]]) -> None:
        self.state = state
        self.queues_with_waiters = queues_with_waiters  # (queues.waiting)
        self.importing: set[Queue] = set()  # queues with a recent import rate

    def import_sources(self, q: Queue) -> list[bytes]:
        """Nodes that gave us jobs for `q` in the last RESPONDER_VALID_MS (QSTAT
        import-from; need_jobs forgets older ones only when it is about to ask)."""
        now = self.state.clock()
        return [n for n, t in q.needjobs_responders.items() if now - t <= RESPONDER_VALID_MS]

    def need_jobs(self, q: Queue, now: int, reached_zero: bool = False) -> None:
        """Ask other nodes for jobs of `q` (NEEDJOBS), within the backoffs."""
        if self.state.leaving or self.state.membership is None or self.state.cluster_size() < 2:
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
            msg = NeedJobs(self.state.header(), q.name, count)
            for n in responders:
                self.state.send(n, msg)
            q.needjobs_adhoc_time = now
            if q.needjobs_adhoc_attempt < 7:
                q.needjobs_adhoc_attempt += 1
        if bcast_due:
            # Every node of the table, leaving ones included: a leaving node is still a
            # source (it drains), as in the original.
            others = [n for n in self.state.reachable_or_known() if n != self.state.myself]
            if others:
                msg = NeedJobs(self.state.header(), q.name, 1)
                for n in others:
                    self.state.send(n, msg)
            q.needjobs_bcast_time = now
            if q.needjobs_bcast_attempt < 5:
                q.needjobs_bcast_attempt += 1

    def on_needjobs(self, sender: bytes, msg: NeedJobs) -> None:
        """ON RECV NEEDJOBS: move some of our queued jobs to the asking node (YOURJOBS)."""
        q = self.state.lookup_queue(msg.queue)
        if q is not None and (q.paused & PAUSE_OUT or q.import_rate > 0):
            return
        now = self.state.clock()
        count = max(msg.count, 1)
        if q is not None and q.spilled:
            self.state.refill(q)  # the oldest jobs go, from disk if that is where they are
        if q is None or not q.jobs:
            # Nothing to give now. Unlike the original (which drops the request and leaves
            # the asker to retry after its backoff, up to 2 s later), remember it briefly:
            # jobs queued here meanwhile go straight to the node whose consumers wait.
            self.state.needers.setdefault(msg.queue, {})[sender] = (now + NEEDER_HOLD_MS, count)
            return
        n = len(q.jobs)
        self.give_jobs(q, sender, count if n >= 2 * count else max(1, n // 2), now)

    def give_jobs(self, q: Queue, to: bytes, count: int, now: int) -> None:
        """Move `count` jobs out of `q` to node `to` (YOURJOBS). Not while our link to it
        is down (a node killed after its NEEDJOBS): the bus would drop the message and the
        jobs would wait for their RETRY there (at-most-once ones would be lost)."""
        if not self.state.link_up(to):
            return
        records = []
        for _ in range(min(count, len(q.jobs))):
            job = q.jobs.pop_first()
            assert job is not None  # (at most len(q.jobs) of them)
            job.state = ACTIVE  # state: QUEUED -> ACTIVE (moving out)
            q.jobs_out += 1
            if to not in job.delivered:
                job.delivered = job.delivered + (to,)
            records.append(job_record(job, now))
            if not job.retry:
                # An at-most-once job moves: it exists on the wire or at the receiver only.
                self.state.delete_job(job)
        q.atime = now
        self.state.send(to, YourJobs(self.state.header(), records))

    def serve_needers(self, q: Queue, now: int) -> None:
        """Jobs were queued where a recent NEEDJOBS found none: forward them."""
        needers = self.state.needers.get(q.name)
        if not needers:
            self.state.needers.pop(q.name, None)
            return
        if q.paused & PAUSE_OUT:
            return
        reachable = self.state.reachable_others()
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
            del self.state.needers[q.name]

    def on_yourjobs(self, sender: bytes, msg: YourJobs) -> None:
        """ON RECV YOURJOBS: queue the jobs another node moved to us (no QUEUED broadcast;
        an at-most-once job is allowed exactly one queueing here)."""
        now = self.state.clock()
        for rec in msg.jobs:
            job = self.state.lookup_job(rec.id)
            if job is None:
                if rec.id in self.state.collected:  # acknowledged here: not queued again
                    self.state.tell_collected(sender, rec.id)
                    continue
                job = job_from_record(rec, now)
                if self.state.myself not in job.delivered:
                    job.delivered = job.delivered + (self.state.myself,)
                self.state.register(job)
                if self.state.persist is not None:  # a copy held here now, as after a REPLJOB
                    self.state.persist.loadjob(job)
            elif job.state not in (ACTIVE, WAIT_REPL):
                if job.state == ACKED:
                    self.state.send(sender, self.state.setack(job))
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
            if job.state == WAIT_REPL:
                job.state = ACTIVE  # state: WAIT_REPL -> ACTIVE
            job.qtime = now
            q = self.state.create_queue(job.queue or rec.queue, now)
            if q.paused & PAUSE_IN:
                if job.retry:
                    job.qtime = self.state.requeue_time(job, now)
                    self.state.schedule_job(job)
                else:
                    self.state.enqueue(job, now)  # nowhere else to go: keep the one delivery
            else:
                self.state.enqueue(job, now)
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
        if self.state.needers:
            for name, askers in list(self.state.needers.items()):
                for n, (until, _count) in list(askers.items()):
                    if until < now:
                        del askers[n]
                if not askers:
                    del self.state.needers[name]
        if self.state.membership is not None and self.state.cluster_size() > 1:
            for q in self.queues_with_waiters():
                if not q.jobs:
                    self.need_jobs(q, now)
            for q in list(self.importing):
                self.update_import_rate(q, now)
                if not q.import_samples:
                    self.importing.discard(q)
