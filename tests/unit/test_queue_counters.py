"""The per-queue totals /metrics exports (issue 14), on a lone node with a fake clock.

`added` counts a job's first queueing on this node, `requeued` every later one, so that
QSTAT's jobs-in is always added + requeued; `acked` and `nacked` count ACKJOB / FASTACK and
NACK (with or without DELAY) once per job.
"""

from __future__ import annotations

from disque.queues.queue import Queue
from tests.unit.test_node import Sim


def q_of(sim: Sim, name: bytes = b"q") -> Queue:
    q = sim.node.lookup_queue(name)
    assert q is not None
    return q


def test_added_counts_new_jobs_at_their_first_queueing() -> None:
    sim = Sim()
    sim.add()  # queue created by this job (enqueue path)
    sim.add()  # existing queue (the inlined ADDJOB path)
    sim.add(delay=5)  # queued when its delay ends
    q = q_of(sim)
    assert (q.added, q.requeued, q.jobs_in) == (2, 0, 2)
    sim.advance(5000 + 300)
    assert (q.added, q.requeued, q.jobs_in) == (3, 0, 3)


def test_requeued_counts_retry_nack_and_enqueue() -> None:
    sim = Sim()
    a, b, c = (sim.add(retry=10) for _ in range(3))
    node = sim.node
    assert len(node.get_jobs([b"q"], 3)) == 3
    assert node.nack_jobs([a.id]) == 1
    assert node.enqueue_jobs([b.id]) == 1
    sim.advance(10_000 + 500)  # c's RETRY timer puts it back
    q = q_of(sim)
    assert (q.added, q.requeued, q.nacked) == (3, 3, 1)
    assert q.jobs_in == q.added + q.requeued == 6


def test_nack_with_delay_counts_at_the_nack() -> None:
    sim = Sim()
    job = sim.add(retry=60)
    sim.node.get_jobs([b"q"], 1)
    assert sim.node.nack_jobs([job.id], delay=5) == 1
    q = q_of(sim)
    assert (q.nacked, q.requeued) == (1, 0)
    sim.advance(5000 + 300)
    assert (q.nacked, q.requeued, len(q.jobs)) == (1, 1, 1)


def test_acked_counts_each_job_once() -> None:
    sim = Sim()
    a, b, c = (sim.add() for _ in range(3))
    node = sim.node
    node.get_jobs([b"q"], 3)
    assert node.ackjob([a.id, a.id]) == 1
    assert node.ackjob([a.id]) == 0
    assert node.fastack([b.id]) == 1
    assert q_of(sim).acked == 2
    assert node.ackjob([b"D-0123abcd-unknownunknownunknownun-05a1"]) == 0
    assert node.deljob([c.id]) == 1  # DELJOB is no acknowledgement
    assert q_of(sim).acked == 2
