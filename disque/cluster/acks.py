"""Acknowledgements and their garbage collection (the original's ack.c). Sans-I/O.

ACKJOB marks a job acknowledged (`ackjob`, the state's `ack_job`) and starts the GC
(`start_gc`): SETACK to every holder not yet confirmed, retried with exponential backoff
(GC_BASE_MS doubling up to GC_MAX_MS). A holder acks its copy and answers GOTACK, or runs the
GC itself when it knows of more holders (`on_setack`); once every holder confirmed, DELJOB
to all of them and the job is forgotten (`on_gotack`, `on_deljob`). An ACKJOB for an ID this
node never had keeps a dummy ACK (`dummy_ack`) that asks every node, so a copy elsewhere is
not delivered again. FASTACK deletes at once and sends a best-effort DELJOB (`fastack`).

A SETACK for a job still waiting for its copies first ends its replication
(`replication_achieved`, the replication subsystem's, given at construction).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Final

from disque.cluster.messages import DelJob, GotAck, SetAck
from disque.cluster.records import HOLDERS_COUNT_MASK, holders_aux, other_holders
from disque.jobs.ids import id_is_at_least_once, id_ttl_minutes
from disque.jobs.job import ACKED, F_DUMMY, WAIT_REPL, Job
from disque.state import NodeState

GC_BASE_MS: Final = 1000
GC_MAX_MS: Final = 180_000
GC_MAX_ATTEMPT: Final = 10


class Acks:
    """The ACK subsystem of a node (`node.acks`)."""

    def __init__(self, state: NodeState,
                 replication_achieved: Callable[[Job, int], None]) -> None:
        self.state = state
        self.replication_achieved = replication_achieved

    # ------------------------------------------------------------------ commands
    def ackjob(self, ids: Iterable[bytes]) -> int:
        known = 0
        st = self.state
        for job_id in ids:
            job = st.lookup_job(job_id)
            if job is None:
                if (st.cluster_size() > 1 and not st.leaving
                        and id_is_at_least_once(job_id)):
                    self.dummy_ack(job_id)
                continue
            if job.state != ACKED:
                known += 1
                self.count_acked(job)
                if job.delivered == st.self_only:
                    # Only this node ever held it: START-GC would find nobody to ask and
                    # delete it at once, so skip the GC timer ack_job arms for copies
                    # elsewhere (a timer entry, a clock read and a random draw per ACK).
                    st.delete_job(job)
                    job.state = ACKED  # state: ACTIVE -> ACKED (gone: a queued one left its queue)
                    continue
                st.ack_job(job)
            self.start_gc(job)
        return known

    def fastack(self, ids: Iterable[bytes]) -> int:
        """Delete locally and send a best-effort DELJOB to every node that may have a copy
        (to every node, for a job we do not know)."""
        st = self.state
        known = 0
        for job_id in ids:
            job = st.lookup_job(job_id)
            if job is not None:
                known += 1
                if job.state != ACKED:
                    self.count_acked(job)
                if st.others(job):
                    st.send_to(job.delivered, DelJob(st.header(), job_id))
                    st.note_collected(job_id)
                st.delete_job(job)
            elif st.membership is not None and st.cluster_size() > 1:
                st.send_to(st.reachable_or_known(), DelJob(st.header(), job_id))
        return known

    def count_acked(self, job: Job) -> None:
        """A client acknowledged a job here (ACKJOB / FASTACK): the queue's acked total,
        when the queue object still exists (an evicted empty queue is not re-created)."""
        q = self.state.queue_of(job)
        if q is not None:
            q.acked += 1

    def dummy_ack(self, job_id: bytes) -> None:
        now = self.state.clock()
        job = Job(job_id, None, None, 0, 0, now + id_ttl_minutes(job_id) * 60_000, 0, 0, ())
        job.state = ACKED  # state: WAIT_REPL -> ACKED (a new Job object)
        job.flags |= F_DUMMY
        job.confirmed = self.state.self_only
        self.state.register(job)
        self.state.schedule_job(job)
        self.start_gc(job)

    # ------------------------------------------------------------------ ACK GC
    def start_gc(self, job: Job) -> None:
        """START-GC: SETACK to every node that may hold the job and has not confirmed; with
        nobody to ask (alone, or every other holder forgotten) the job is simply deleted.
        Retried by the job timer with exponential backoff."""
        myself = self.state.myself
        job.confirmed = (myself,)
        dummy = job.flags & F_DUMMY
        if dummy:
            targets = [n for n in self.state.reachable_or_known() if n != myself]
        else:
            targets = [n for n in job.delivered if n != myself and self.state.is_known_node(n)]
        if not targets:
            self.state.unregister(job)
            return
        msg = SetAck(self.state.header(), job.id, 0) if dummy else self.state.setack(job)
        for n in targets:
            self.state.send(n, msg)
        now = self.state.clock()
        backoff = min(GC_BASE_MS << min(job.gc_retry, GC_MAX_ATTEMPT), GC_MAX_MS)
        job.qtime = now + backoff + int(self.state.random() * 500) - 250  # next GC attempt
        if job.gc_retry < GC_MAX_ATTEMPT:
            job.gc_retry += 1
        self.state.schedule_job(job)

    def on_setack(self, sender: bytes, msg: SetAck) -> None:
        """ON RECV SETACK(may-have): ack our copy; GOTACK unless we know of more holders, or
        of others (`holders_aux`: a digest of the sender's list), in which case we run the
        GC ourselves; for other holders only if our GC is not under way already (two
        holders whose lists differ would otherwise start each other's GC again and again)."""
        job = self.state.lookup_job(msg.job_id)
        if job is None:
            self.state.send(sender, GotAck(self.state.header(), msg.job_id, 0))
            return
        if job.state == WAIT_REPL:
            self.replication_achieved(job, 0)
            job = self.state.lookup_job(msg.job_id)
            if job is None:
                self.state.send(sender, GotAck(self.state.header(), msg.job_id, 0))
                return
        collecting = job.state == ACKED and job.gc_retry > 0
        self.state.ack_job(job)
        aux = msg.aux
        may_have = aux & HOLDERS_COUNT_MASK
        if len(job.delivered) <= may_have and (
                collecting or not other_holders(aux, job.delivered)):
            self.state.send(sender, GotAck(self.state.header(), job.id, 1))
        else:
            if may_have == 0:
                self.state.send(sender, GotAck(self.state.header(), job.id, 1))
            self.start_gc(job)

    def on_gotack(self, sender: bytes, msg: GotAck) -> None:
        """ON RECV GOTACK(known): collect confirmations; when every holder confirmed,
        DELJOB to all of them and forget the job."""
        job = self.state.lookup_job(msg.job_id)
        if job is None:
            return
        self.state.ack_job(job)
        known = msg.aux == 1
        dummy = job.flags & F_DUMMY
        if dummy:
            if known:
                self.state.unregister(job)  # somebody holds the real ack: drop our dummy
                return
            if sender not in job.confirmed:
                job.confirmed = job.confirmed + (sender,)
            if len(job.confirmed) >= self.state.cluster_size():
                self.state.unregister(job)
            return
        if known or sender in job.delivered:
            if sender not in job.delivered:
                job.delivered = job.delivered + (sender,)
            if sender not in job.confirmed:
                job.confirmed = job.confirmed + (sender,)
        confirmed = job.confirmed
        if all(n in confirmed or not self.state.is_known_node(n) for n in job.delivered):
            self.state.send_to(job.delivered, DelJob(self.state.header(), job.id,
                                                     holders_aux(job.delivered)))
            self.state.unregister(job)

    def on_deljob(self, sender: bytes, msg: DelJob) -> None:
        """ON RECV DELJOB: the job is done with cluster-wide (collected or FASTACKed).

        A GC's DELJOB carries the digest of the list it collected over (`holders_aux`, as
        SETACK). A node running its own GC because its list named other holders goes on
        with it instead: deleted here, it would stop asking them (chaos random-kill seed 3:
        a holder that started its GC for a node the acking node's list did not name lost
        its SETACK with a link reset, then took the acking node's DELJOB; the node never
        heard of the ACK and delivered its copy 8 s later). Its own DELJOB ends the job."""
        job = self.state.lookup_job(msg.job_id)
        if job is not None and job.state == ACKED and job.gc_retry > 0 and \
                other_holders(msg.aux, job.delivered):
            return
        if job is not None:
            self.state.note_collected(job.id)
            self.state.delete_job(job)
