"""Jobs across a simulated cluster: replication, federation, ACK GC, re-queue after a crash,
partitions, and hypothesis-generated fault schedules. Full Nodes (membership + jobs) run on
the simulated network of tests/sim/cluster.py; times are simulated ms, every run is
reproducible from its seed, and after every event that reaches the job layer the hosts
check that a job is in a queue iff its state is queued."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from disque.cluster.messages import DelJob
from disque.jobs.job import ACKED, ACTIVE, QUEUED
from disque.queues.queue import PAUSE_IN
from tests.sim.cluster import SimCluster
from tests.sim.schedules import (
    formed,
    random_kill_params,
    random_params,
    run_random_kills,
    run_schedule,
)

TIMEOUT = 1000  # cluster-node-timeout of these clusters (the one of schedules.formed)


def added(net: SimCluster, i: int, **kw: object) -> bytes:
    res = net.addjob(i, **kw)  # type: ignore[arg-type]
    assert net.run_until_true(lambda: res.done, 10_000, step=1)
    assert res.ok is not None, res.error
    return res.ok


def gone_everywhere(net: SimCluster, job_id: bytes) -> bool:
    return not net.holders(job_id)


# ---------------------------------------------------------------------------- the check
def test_the_per_event_check_finds_a_queued_job_outside_its_queue() -> None:
    net = formed(3, seed=1)
    jid = added(net, 0, replicate=3, retry=30)
    # node 1 holds an ACTIVE copy; marked QUEUED without being queued, the event that did it
    # fails the check
    with pytest.raises(AssertionError, match="queued but in no queue"):
        net.run_on(1, lambda n: setattr(n.lookup_job(jid), "state", QUEUED))


def test_the_per_event_check_finds_a_job_in_a_queue_that_is_not_queued() -> None:
    net = formed(3, seed=1)
    jid = added(net, 0, replicate=1, retry=30)
    with pytest.raises(AssertionError, match="in queue"):
        net.run_on(0, lambda n: setattr(n.lookup_job(jid), "state", ACTIVE))


# ---------------------------------------------------------------------------- basics
def test_replicate_3_puts_a_copy_on_every_node_of_a_3_node_cluster() -> None:
    net = formed(3, seed=1)
    jid = added(net, 0, replicate=3, retry=30)
    ids = {sn.id for sn in net.nodes}
    assert net.holders(jid) == [0, 1, 2]
    assert net.node(0).lookup_job(jid).state == QUEUED
    for i in (1, 2):
        assert net.node(i).lookup_job(jid).state == ACTIVE
    net.run_for(100)  # the last REPLJOB refreshes reach everybody
    for i in range(3):
        assert set(net.node(i).lookup_job(jid).delivered) == ids


def test_a_job_produced_on_one_node_is_consumed_on_another_promptly() -> None:
    net = formed(3, seed=2)
    jid = added(net, 0, replicate=1)
    start = net.now
    w = net.worker(1)
    assert net.run_until_true(lambda: bool(w.got), 1000, step=1)
    assert w.got[0][1] == jid and w.got[0][0] - start < 100
    assert net.node(0).lookup_job(jid) is None or net.node(0).lookup_job(jid).state != QUEUED


def test_a_consumer_waiting_first_gets_a_job_produced_soon_after_at_once() -> None:
    net = formed(3, seed=3)
    w = net.worker(2, ack=False)
    net.run_for(300)  # within NEEDER_HOLD_MS of node 2's NEEDJOBS broadcast
    jid = added(net, 0, replicate=1)
    start = net.now
    assert net.run_until_true(lambda: bool(w.got), 1000, step=1)
    assert w.got[0][1] == jid and net.now - start < 100


def test_a_consumer_waiting_long_gets_a_job_produced_later_with_the_next_broadcast() -> None:
    net = formed(3, seed=3)
    w = net.worker(2, ack=False)
    blocked_at = net.now
    net.run_for(1500)  # node 0 forgot node 2's NEEDJOBS
    jid = added(net, 0, replicate=1)
    # Nobody tells node 2 about the new job: its next NEEDJOBS broadcast (4 s after the
    # first one) finds it.
    assert net.run_until_true(lambda: bool(w.got), 5000, step=10)
    assert w.got[0][1] == jid
    assert 4000 - 100 <= net.now - blocked_at <= 4000 + 200


def test_ackjob_on_a_third_node_removes_every_copy() -> None:
    net = formed(3, seed=4)
    jid = added(net, 0, replicate=3, retry=60)
    w = net.worker(1, ack=False)
    assert net.run_until_true(lambda: bool(w.got), 1000, step=1)
    w.stop()
    net.client_ack(2, jid)
    assert net.run_until_true(lambda: gone_everywhere(net, jid), 5000, step=10), \
        net.all_jobs()
    net.run_for(70_000)
    assert gone_everywhere(net, jid) and len(net.deliveries[jid]) == 1


def test_fastack_removes_every_copy() -> None:
    net = formed(3, seed=5)
    jid = added(net, 0, replicate=3, retry=60)
    assert net.run_on(1, lambda n: n.fastack([jid])) == 1
    assert net.run_until_true(lambda: gone_everywhere(net, jid), 1000, step=5)


def test_a_crashed_holder_s_job_is_requeued_by_another_holder_after_retry() -> None:
    net = formed(3, seed=6)
    jid = added(net, 0, replicate=3, retry=2)
    w = net.worker(1)
    net.crash(0)
    start = net.now
    assert net.run_until_true(lambda: bool(w.got), 10_000, step=10)
    assert w.got[0][1] == jid
    assert 1750 - 500 <= net.now - start <= 2250 + 500  # the requeue, not before
    net.run_for(10_000)
    # The ACK cannot be collected while a holder (node 0) may still have a copy...
    assert net.holders(jid) == [1, 2]
    assert all(net.node(i).lookup_job(jid).state == ACKED for i in (1, 2))
    net.restart(0)
    # ...its restart without the job lets the GC finish.
    assert net.run_until_true(lambda: net.holders(jid) == [], 60_000, step=100)
    assert len(net.deliveries[jid]) == 1


def test_a_requeue_race_leaves_the_job_queued_on_one_node_only() -> None:
    net = formed(3, seed=7)
    jid = added(net, 0, replicate=3, retry=1)
    net.crash(0)
    net.run_for(5000)
    queued = [i for i in (1, 2) if net.node(i).lookup_job(jid).state == QUEUED]
    assert len(queued) == 1


def test_working_postpones_the_requeue_on_every_holder() -> None:
    net = formed(3, seed=15)
    jid = added(net, 0, replicate=3, retry=2)
    (got,) = net.run_on(0, lambda n: n.get_jobs([b"q"], 1))
    assert got.id == jid
    for _ in range(5):  # a consumer working for 7.5 s on a job with RETRY 2
        net.run_for(1500)
        assert net.run_on(0, lambda n: n.working(jid)) == 2
    assert all(net.node(i).lookup_job(jid).state == ACTIVE for i in range(3))
    assert all(net.node(i).lookup_job(jid).deliveries == 0 for i in range(3))
    net.run_for(3000)  # it stopped calling WORKING: the job comes back (once)
    assert sum(net.node(i).lookup_job(jid).state == QUEUED for i in range(3)) == 1


def test_nack_counts_on_every_holder() -> None:
    net = formed(3, seed=16)
    jid = added(net, 0, replicate=3, retry=60)
    net.run_on(0, lambda n: n.get_jobs([b"q"], 1))
    assert net.run_on(0, lambda n: n.enqueue_jobs([jid], nack=True)) == 1
    net.run_for(100)
    assert [net.node(i).lookup_job(jid).nacks for i in range(3)] == [1, 1, 1]
    assert net.node(0).lookup_job(jid).state == QUEUED


def test_pause_bcast_reaches_every_node() -> None:
    net = formed(3, seed=17)
    net.run_on(1, lambda n: n.pause(b"q", PAUSE_IN))
    net.run_on(1, lambda n: n.broadcast_pause(b"q"))
    net.run_for(100)
    assert [net.node(i).pause(b"q", None) for i in range(3)] == [b"in"] * 3
    res = net.addjob(0, replicate=1)
    assert res.error is not None and res.error.prefix == "PAUSED"


def test_a_leaving_node_is_drained_to_zero_jobs_while_the_cluster_serves() -> None:
    """Jobs queued on a node that starts leaving are pulled by the consumers of the other
    nodes (NEEDJOBS; GETJOB on the leaving node answers -LEAVING), and acked there: the
    leaving node ends with no job at all."""
    net = formed(3, seed=18)
    jids = [added(net, 2, replicate=2, retry=5) for _ in range(10)]
    net.run_on(2, lambda n: n.set_leaving(True))
    net.run_for(200)  # everybody sees node 2 leaving
    res = net.addjob(2, replicate=2)  # a leaving node keeps no copy: external replication
    assert net.run_until_true(lambda: res.done, 1000, step=1) and res.ok is not None
    jids.append(res.ok)
    assert net.node(2).lookup_job(res.ok) is None
    workers = [net.worker(i) for i in (0, 1)]
    assert net.run_until_true(lambda: all(net.deliveries[j] for j in jids), 30_000)
    assert net.run_until_true(lambda: len(net.node(2).jobs) == 0, 60_000, step=100)
    assert net.run_until_true(lambda: net.job_count() == 0, 60_000, step=100)
    for w in workers:
        w.stop()


def test_sync_addjobs_do_not_wait_for_a_crashed_node() -> None:
    """Issue 25: a crash resets the dead node's links; its peers see them close after the
    data in flight and, long before the node is flagged PFAIL (a node timeout of a minute
    here), replace it in the replications that waited for its GOTJOB and no longer send it
    new copies."""
    net = SimCluster(3, seed=11, node_timeout=60_000)
    for i in (1, 2):
        net.meet(0, i)
    assert net.run_until_true(net.full_mesh, 30_000)
    dead = net.nodes[2].id
    link_down = lambda: net.nodes[0].membership.get(dead).out_link is None  # noqa: E731
    before = [net.addjob(0, replicate=2, retry=30, timeout=30_000) for _ in range(40)]
    net.crash(2)  # before any GOTJOB could come back: some of them wait on node 2
    waiting = [rep.job for rep in net.node(0).replication.replicating.values()]
    assert sum(dead in job.delivered for job in waiting) >= 5
    assert net.run_until_true(link_down, 1000, step=1)
    after = [net.addjob(0, replicate=2, retry=30, timeout=30_000) for _ in range(40)]
    assert net.run_until_true(lambda: all(r.done for r in before + after), 1000, step=1)
    assert all(r.ok is not None for r in before + after)
    for r in before + after:
        assert r.ok is not None and net.holders(r.ok) == [0, 1]
    for r in after:
        assert r.ok is not None and dead not in net.node(0).lookup_job(r.ok).delivered
    assert net.flags_of(0, 2) == [] and net.flags_of(1, 2) == []  # never flagged


def test_the_jobs_of_down_holders_are_repaired_and_outlive_the_next_crash() -> None:
    """Issue 25: REPLICATE 3 on 5 nodes, two holders of every job crash one after the other
    (up to REPLICATE-1 down at once): after repair-grace each job is copied to live nodes,
    so a third crash, right after one of them restarted empty (before re-replication can
    refill it), loses nothing."""
    net = formed(5, seed=3, repair_grace=300)
    adds = [net.addjob(0, replicate=3, retry=30, timeout=5000) for _ in range(30)]
    assert net.run_until_true(lambda: all(r.done for r in adds), 5000)
    jobs = [r.ok for r in adds]
    assert all(jobs)
    net.crash(1)
    net.run_for(1000)
    assert all(len(net.holders(j)) == 3 for j in jobs)  # copies of node 1's jobs made again
    net.crash(2)
    net.run_for(1000)
    assert all(len(net.holders(j)) == 3 for j in jobs)
    repaired = sum(net.node(i).repair.repaired for i in (0, 3, 4))
    assert repaired >= sum(1 for j in jobs if set(net.node(0).lookup_job(j).delivered)
                           & {net.nodes[1].id, net.nodes[2].id})
    net.restart(1)
    net.crash(0)  # before node 1 got any copy back
    net.run_for(1000)
    net.restart(0)
    net.restart(2)
    assert net.run_until_true(net.full_mesh, 30_000)
    for i in range(5):
        net.worker(i)
    assert net.run_until_true(lambda: all(net.deliveries[j] for j in jobs), 60_000, step=100)


@pytest.mark.parametrize("seed", [1, 2])
def test_random_kills_of_up_to_two_nodes_lose_no_job(seed: int) -> None:
    """A short run of the schedule `make sim SIM_RANDOM_KILL=...` runs for many seeds."""
    run_random_kills(**random_kill_params(seed, 20))


# ---------------------------------------------------------------------------- partitions
def test_a_job_stuck_in_a_minority_partition_is_requeued_by_the_majority() -> None:
    net = formed(3, seed=8)
    jid = added(net, 2, replicate=3, retry=2)  # queued on 2 only
    net.partition([0, 1], [2])
    w = net.worker(0)
    assert net.run_until_true(lambda: bool(w.got), 10_000, step=10)
    assert w.got[0][1] == jid
    ack_time = net.now
    net.run_for(5000)
    assert net.node(0).lookup_job(jid).state == ACKED  # node 2 has not confirmed yet
    net.heal()
    assert net.run_until_true(lambda: gone_everywhere(net, jid), 120_000, step=100), \
        net.all_jobs()
    net.run_for(30_000)
    # Acknowledged: it never comes back (node 2's own copy was acked by the GC).
    assert [t for t, _ in net.deliveries[jid] if t > ack_time + 100] == []


def test_jobs_added_on_each_side_of_a_partition_are_delivered_after_healing() -> None:
    net = formed(5, seed=9)
    net.partition([0, 1, 2], [3, 4])
    net.run_for(3 * TIMEOUT)  # both sides see the other one failing
    majority = [added(net, 0, replicate=3, retry=3) for _ in range(5)]
    minority = [added(net, 3, replicate=2, retry=3) for _ in range(5)]
    w_min = net.worker(4)  # consumers only on the minority side
    net.run_for(10_000)
    assert {j for _, j in w_min.got} >= set(minority)
    net.heal()
    assert net.run_until_true(lambda: {j for _, j in w_min.got} >= set(majority), 60_000)
    assert net.run_until_true(lambda: net.job_count() == 0, 300_000, step=500), \
        net.all_jobs()


def test_a_node_restarted_after_a_crash_forgets_its_copies_and_the_others_collect() -> None:
    net = formed(3, seed=10)
    jids = [added(net, 0, replicate=2, retry=2) for _ in range(10)]
    net.crash(1)
    w = net.worker(2)
    net.run_for(2000)
    net.restart(1)
    assert net.run_until_true(lambda: {j for _, j in w.got} >= set(jids), 30_000)
    assert net.run_until_true(lambda: net.job_count() == 0, 120_000, step=500), \
        net.all_jobs()


# ---------------------------------------------------------------------------- schedules
N = 3
node_index = st.integers(0, N - 1)
fault = st.one_of(
    st.tuples(st.just("partition"), st.lists(st.integers(0, 1), min_size=N, max_size=N)),
    st.tuples(st.just("heal")),
    st.tuples(st.just("pause"), node_index),
    st.tuples(st.just("resume"), node_index),
    st.tuples(st.just("crash"), node_index),
    st.tuples(st.just("leaving"), node_index, st.booleans()),
    st.tuples(st.just("none")),
)
# ADDJOB on a node: REPLICATE 2 or 3 (RETRY 1..3 s), or an at-most-once job (RETRY 0).
addjobs = st.lists(st.tuples(node_index, st.sampled_from([0, 2, 3])), max_size=3)
# A failing schedule is reported as found: shrinking one costs minutes of simulated time.
NO_SHRINK = (Phase.explicit, Phase.reuse, Phase.generate)
steps = st.lists(st.tuples(st.integers(50, 3000), fault, addjobs), min_size=6, max_size=20)


@settings(max_examples=30, deadline=None, derandomize=True, phases=NO_SHRINK,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(seed=st.integers(0, 2**16), schedule=steps, delay=st.sampled_from([(1, 5), (1, 40)]),
       consumers=st.lists(node_index, min_size=1, max_size=N, unique=True),
       process=st.sampled_from([(5, 100), (300, 4000)]), drop=st.sampled_from([0.0, 0.01]),
       nack_rate=st.sampled_from([0.0, 0.3]), aof=st.booleans(), backlog=st.booleans())
def test_fault_schedules_lose_no_job_and_leave_nothing_behind(
        seed: int, schedule: list, delay: tuple[int, int], consumers: list[int],
        process: tuple[int, int], drop: float, nack_rate: float, aof: bool,
        backlog: bool) -> None:
    """The invariants of tests/sim/schedules.py (`run_schedule`): every at-least-once job
    whose ADDJOB succeeded is delivered; an at-most-once job at most once; nothing is left
    once everything was acked; a job is queued iff it is in its queue. Up to three rolling
    crashes per schedule (restarts empty or, `aof`, with their jobs): re-replication
    restores the copies a restart lost; `make sim` runs many more seeds."""
    run_schedule(seed, schedule, delay, consumers, process, drop, nack_rate, crashes=3,
                 aof=aof, backlog=backlog)


@pytest.mark.parametrize("seed", [0, 6, 16, 19, 8081, 9266])
def test_seeds_found_by_make_sim_lose_no_job(seed: int) -> None:
    """Seeds of `make sim` that lose jobs to their rolling crashes when restarted nodes do
    not get their copies back (rereplicate-rate 0; 8081 and 9266: a restarted node marked
    LEAVING for a while, whose copies were refused until their attempts ran out)."""
    run_schedule(**random_params(seed, crashes=3))


def test_rolling_crashes_of_every_holder_without_aof_lose_no_job() -> None:
    """Issue 13, part 1: each holder of a REPLICATE 2 job crashes in turn and comes back
    empty; the survivor sends the restarted one its copy again (a new incarnation in its
    headers), so after the last crash a copy is still there and the job is delivered. (No
    repair here: it would copy the jobs to the third node while one is down.)"""
    net = formed(3, seed=21, repair_grace=10**9)
    jids = [added(net, k % 3, replicate=2, retry=2) for k in range(12)]
    for i in (0, 1, 2, 0, 1):
        net.crash(i)
        net.run_for(2000)
        net.restart(i)
        assert net.run_until_true(net.full_mesh, 10_000)
        assert net.run_until_true(
            lambda: all(len(net.holders(j)) == 2 for j in jids), 5000, step=10), \
            {j: net.holders(j) for j in jids}
    w = net.worker(0)
    assert net.run_until_true(lambda: {j for _, j in w.got} >= set(jids), 30_000)


def test_every_job_is_delivered_and_collected_under_message_loss() -> None:
    """Connections break (drop) and lose what was in flight: a lost REPLJOB is re-sent, a
    lost YOURJOBS is requeued by the source after RETRY, a lost SETACK / GOTACK is retried
    by the GC."""
    net = formed(3, seed=0, drop=0.03)
    workers = [net.worker(i, process_ms=(5, 100)) for i in range(3)]
    adds = [net.addjob(k % 3, replicate=2 + k % 2, retry=2, ttl=3600, timeout=3000)
            for k in range(40)]
    assert net.run_until_true(lambda: all(a.done for a in adds), 30_000)
    ok = [a.ok for a in adds if a.ok is not None]
    assert len(ok) >= 30
    net.drop = 0.0
    assert net.run_until_true(lambda: all(net.deliveries[j] for j in ok), 60_000, step=500)
    assert net.run_until_true(lambda: net.job_count() == 0, 300_000, step=1000), \
        net.all_jobs()
    net.check_all()
    for w in workers:
        w.stop()


def test_an_acked_copy_whose_deljob_was_lost_is_still_collected() -> None:
    """The GC's last step (DELJOB to every holder) is best effort. A holder that answered
    GOTACK to our SETACK has its copy acked; if the DELJOB is lost with a broken connection,
    that copy must still go (spec: ACK-JOB schedules the GC TIMER, which runs "for every
    acknowledged job in memory"), not stay until its TTL (here an hour)."""
    net = formed(3, seed=14)
    jid = added(net, 0, replicate=2, retry=30, ttl=3600)
    (holder,) = [i for i in net.holders(jid) if i != 0]
    net.lose_next(0, holder, DelJob)
    net.client_ack(0, jid)
    assert net.run_until_true(lambda: net.node(0).lookup_job(jid) is None, 5000, step=10)
    assert not net.to_lose  # the DELJOB was sent, and lost
    assert net.node(holder).lookup_job(jid).state == ACKED
    assert net.run_until_true(lambda: gone_everywhere(net, jid), 600_000, step=1000), \
        [(j, j.qtime, j.awake, j.etime) for j in net.all_jobs()[holder]]


@pytest.mark.parametrize("seed", [12, 13])
def test_the_jobs_simulation_is_deterministic_for_a_seed(seed: int) -> None:
    def trace(s: int) -> list:
        net = formed(3, seed=s, delay=(1, 30))
        for i in range(3):
            net.worker(i)
        for k in range(10):
            net.addjob(k % 3, replicate=2, retry=1)
        net.crash(1)
        net.run_for(3000)
        net.restart(1)
        net.run_for(3000)
        return sorted((t, i, j) for j, d in net.deliveries.items() for t, i in d)

    assert trace(seed) == trace(seed)


# ---------------------------------------------------------------------------- overflow
@pytest.fixture
def overflowing(tmp_path, monkeypatch):  # type: ignore[no-untyped-def]
    """Every node of the schedules overflows to a file past a few jobs (issue 22)."""
    import tests.sim.schedules as schedules
    monkeypatch.setattr(schedules, "OVERFLOW_DIR", str(tmp_path))
    return tmp_path


@pytest.mark.parametrize("seed", [0, 6, 16, 19])
def test_fault_schedules_with_overflow_lose_no_job(overflowing, seed: int) -> None:  # type: ignore[no-untyped-def]
    """`make sim` schedules with every node moving jobs to disk and back all along: no job
    lost, none delivered twice at most once, nothing left anywhere (on disk included)."""
    run_schedule(**random_params(seed, crashes=3))


@pytest.mark.parametrize("seed", [1, 2])
def test_random_kills_with_overflow_lose_no_job(overflowing, seed: int) -> None:  # type: ignore[no-untyped-def]
    run_random_kills(**random_kill_params(seed, 20))
