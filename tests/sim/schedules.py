"""Randomized fault schedules on the simulated cluster, and `make sim SEEDS=N`.

`run_schedule` is the one body behind the hypothesis test of test_jobs_sim.py and the seed
runner here: 3 full nodes on the simulated network, consumers, ADDJOBs (REPLICATE 2 or 3,
or at-most-once) interleaved with faults (partitions, pauses, LEAVING, crashes), then
everything heals and the invariants are checked:

- every at-least-once job whose ADDJOB returned an ID is delivered at least once;
- an at-most-once job is never delivered twice;
- once everything was acked and collected, no node holds any job;
- (after every event that reaches the job layer) a job is queued iff it is in its queue.

Crashes are rolling: up to `crashes` per schedule, one node down at a time, each restarted
2 s later (with `aof`, reloading its jobs; without, empty), and the next crash only after
REREPLICATION_GAP with every node up, none paused or leaving and no partition (a crash that
comes earlier in the schedule heals, resumes, ends LEAVING and waits first): the time a
restarted node needs to get its copies back (issue 13's condition; a holder that cannot
reach the restarted node cannot send it anything, a leaving node accepts no copy, and a
paused node counts as down). With REPLICATE >= 2 at least
one copy of every job then survives each crash.

    python -m tests.sim.schedules --seeds 1000 [--start 0] [--crashes 3]
    python -m tests.sim.schedules --seed 1234          # one seed, verbose: a reproduction
    python -m tests.sim.schedules --seeds 200 --overflow  # every node overflows to a file
    python -m tests.sim.schedules --seeds 10000 --random-kill 30 --jobs 2  # on two cores

A failing seed prints its one-line reproduction command; failing seeds found this way are
kept as explicit examples in test_jobs_sim.py.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import random
import sys
import tempfile
import time
import traceback
from collections.abc import Iterable
from typing import Any

from disque.jobs.job import Job
from tests.sim.cluster import SimCluster

N = 3
TIMEOUT = 1000  # cluster-node-timeout of these clusters (ms)
RESTART_AFTER = 2000  # ms a crashed node stays down
REREPLICATION_GAP = 3000  # ms after a restart before the next crash
KILL_NODES = 5  # the random-kill schedule (run_random_kills)
KILL_MAX_DOWN = 2  # REPLICATE 3 - 1
KILL_GRACE = 300  # repair-grace (ms), well under TIMEOUT
# copies/s of re-replication and repair: the backlog here is small, so a low rate stands in
# for a large one (restoring a restarted node's copies takes seconds, as with 100,000s)
KILL_COPY_RATE = 100


OVERFLOW_DIR: str | None = None  # --overflow: every node overflows to a file in this directory


def formed(n: int = 3, seed: int = 0, **kw: object) -> SimCluster:
    if OVERFLOW_DIR is not None and "overflow_dir" not in kw:
        kw["overflow_dir"] = OVERFLOW_DIR
    net = SimCluster(n, seed=seed, node_timeout=TIMEOUT, **kw)  # type: ignore[arg-type]
    for i in range(1, n):
        net.meet(0, i)
    assert net.run_until_true(net.full_mesh, 30_000), "no full mesh"
    return net


def run_schedule(seed: int, schedule: list[Any], delay: tuple[int, int], consumers: list[int],
                 process: tuple[int, int], drop: float, nack_rate: float, crashes: int = 1,
                 aof: bool = False, backlog: bool = False) -> None:
    """One schedule: `schedule` is a list of (gap ms, fault, [(node, repl), ...]); a fault
    is ("partition", sides), ("heal",), ("pause", i), ("resume", i), ("crash", i),
    ("leaving", i, flag) or ("none",). With `backlog` the consumers start only after the
    faults: every job has to survive all of them. AssertionError names the violated
    invariant."""
    net = formed(N, seed=seed, delay=delay)
    net.drop = drop  # connections break now and then (after the mesh formed)
    workers = [] if backlog else [net.worker(i, process_ms=process, nack_rate=nack_rate)
                                  for i in consumers]
    adds = []
    retry: dict[int, int] = {}

    def add(i: int, repl: int) -> None:
        if net.nodes[i].state != "up":
            return
        k = len(adds)
        r = 1 + k % 3 if repl else 0
        # An at-most-once copy nobody will queue (its ADDJOB failed and the DELJOB was lost;
        # or the node that delivered it crashed before collecting the others) can only
        # expire: those jobs get a TTL the final wait covers.
        res = net.addjob(i, body=b"job%d" % k, replicate=repl or 1, retry=r,
                         ttl=3600 if repl else 120, timeout=2000)
        retry[id(res)] = r
        adds.append(res)

    for k in range(8):  # some jobs before any fault
        add(k % N, (2, 3, 0)[k % 3])
    crashed = 0
    restarted_at = 0  # when the last crashed node starts again
    partitioned = False
    clean_since: int | None = net.now  # since when every node is up and connected
    for gap, op, jobs in schedule:
        net.run_for(gap)
        if partitioned or any(sn.state != "up" or sn.membership.leaving for sn in net.nodes):
            clean_since = None
        elif clean_since is None:
            clean_since = net.now
        kind = op[0]
        if kind == "partition":
            sides = op[1]
            net.partition(*[[i for i in range(N) if sides[i] == s] for s in (0, 1)])
            partitioned = 0 < sum(sides) < N
        elif kind == "heal":
            net.heal()
            partitioned = False
        elif kind == "pause":
            net.pause(op[1])
        elif kind == "resume":
            net.resume(op[1])
        elif kind == "leaving" and net.nodes[op[1]].state == "up":
            net.run_on(op[1], lambda n, flag=op[2]: n.set_leaving(flag))
        elif kind == "crash" and crashed < crashes:
            if clean_since is None or net.now - clean_since < REREPLICATION_GAP:
                # The crash waits for its precondition: the previous restart done, then
                # REREPLICATION_GAP with every node up (none paused) and no partition.
                net.heal()
                partitioned = False
                for i in range(N):
                    net.resume(i)
                net.run_until(max(net.now, restarted_at))
                for i in range(N):  # a leaving node accepts no copy
                    net.run_on(i, lambda n: n.set_leaving(False))
                net.run_for(REREPLICATION_GAP)
            crashed += 1
            net.crash(op[1])
            restarted_at = net.now + RESTART_AFTER
            net.schedule(restarted_at, net.restart, op[1], aof)
            clean_since = None
        for i, repl in jobs:
            add(i, repl)
    heal_and_check(net, adds, retry, workers, aof=aof, consumers=consumers if backlog else [],
                   process=process, nack_rate=nack_rate)


def heal_and_check(net: SimCluster, adds: list[Any], retry: dict[int, int], workers: list[Any],
                   *, aof: bool, consumers: list[int], process: tuple[int, int],
                   nack_rate: float) -> None:
    """Everything heals (consumers start on `consumers` now, for a backlog), then the
    invariants of the module docstring are checked."""
    net.heal()
    net.drop = 0.0
    workers = workers + [net.worker(i, process_ms=process, nack_rate=nack_rate)
                         for i in consumers]
    size = len(net.nodes)
    for i in range(size):
        net.resume(i)
        net.restart(i, aof)
        net.run_on(i, lambda n: n.set_leaving(False))
    assert net.run_until_true(net.full_mesh, 30_000), "no full mesh after healing"
    assert net.run_until_true(lambda: all(a.done for a in adds), 10_000), "ADDJOB unanswered"
    at_least_once = [a.ok for a in adds if a.ok is not None and retry[id(a)]]
    at_most_once = [a.ok for a in adds if a.ok is not None and not retry[id(a)]]
    assert net.run_until_true(lambda: all(net.deliveries[j] for j in at_least_once), 120_000,
                              step=500), \
        ("lost", [j for j in at_least_once if not net.deliveries[j]], net.all_jobs())
    assert net.run_until_true(lambda: net.job_count() == 0, 300_000, step=1000), \
        ("left behind", net.all_jobs())
    for j in at_most_once:
        assert len(net.deliveries[j]) <= 1, ("at-most-once delivered twice", j,
                                             net.deliveries[j])
    net.check_all()
    # And no deleted job left in a timer wheel: once the buckets of the nodes' own timers
    # (its only live entries now) have come due, no stale copy of a job is left either.
    net.run_for(10_000)
    for i in range(size):
        node = net.live_node(i)
        if node is not None:
            kept = [e for e in node.wheel.entries() if isinstance(e, Job)]
            assert not kept, ("deleted jobs in the timer wheel", i, kept[:3])
    for w in workers:
        w.stop()


def run_random_kills(seed: int, seconds: int, aof: bool, backlog: bool, delay: tuple[int, int],
                     consumers: list[int], process: tuple[int, int], drop: float) -> None:
    """Issue 25's schedule on KILL_NODES simulated nodes, on the clock: every 2-4 s a crash
    of a random running node while fewer than KILL_MAX_DOWN are down, each restarted 2-6 s
    after its crash (empty, or reloading with `aof`); REPLICATE 3 jobs (and a few
    at-most-once ones) added all along. No job may be lost: re-replication refills a
    restarted node and the repair (`repair-grace` KILL_GRACE ms) copies the jobs of a down
    node elsewhere."""
    rng = random.Random(seed)
    net = formed(KILL_NODES, seed=seed, delay=delay, repair_grace=KILL_GRACE,
                 copy_rate=KILL_COPY_RATE)
    net.drop = drop
    workers = [] if backlog else [net.worker(i, process_ms=process) for i in consumers]
    adds: list[Any] = []
    retry: dict[int, int] = {}

    def add(i: int) -> None:
        if net.nodes[i].state != "up":
            return
        k = len(adds)
        once = k % 10 == 9
        res = net.addjob(i, body=b"job%d" % k, replicate=1 if once else 3,
                         retry=0 if once else 1 + k % 3, ttl=120 if once else 3600,
                         timeout=2000)
        retry[id(res)] = 0 if once else 1
        adds.append(res)

    down: dict[int, int] = {}  # node -> when it restarts
    end = net.now + seconds * 1000
    next_kill = net.now + rng.randint(500, 2000)
    while net.now < end:
        net.run_for(100)
        for i, at in sorted(down.items(), key=lambda kv: kv[1]):
            if net.now >= at:
                net.restart(i, aof)
                del down[i]
        if net.now >= next_kill:
            if len(down) < KILL_MAX_DOWN:
                i = rng.choice([k for k in range(KILL_NODES) if k not in down])
                net.crash(i)
                down[i] = net.now + rng.randint(2000, 6000)
            next_kill = net.now + rng.randint(2000, 4000)
        for _ in range(rng.randint(0, 2)):
            add(rng.randrange(KILL_NODES))
    heal_and_check(net, adds, retry, workers, aof=aof, consumers=consumers if backlog else [],
                   process=process, nack_rate=0.0)


def random_kill_params(seed: int, seconds: int = 30) -> dict[str, Any]:
    rng = random.Random(seed)
    return {"seed": seed, "seconds": seconds, "aof": rng.random() < 0.5,
            "backlog": rng.random() < 0.5, "delay": rng.choice([(1, 5), (1, 40)]),
            "consumers": rng.sample(range(KILL_NODES), rng.randint(1, KILL_NODES)),
            "process": rng.choice([(5, 100), (300, 4000)]), "drop": rng.choice([0.0, 0.01])}


def random_params(seed: int, crashes: int) -> dict[str, Any]:
    """The schedule of `seed`: what hypothesis draws in test_jobs_sim.py, from a plain RNG
    (one seed is one reproducible schedule), with crashes more frequent."""
    rng = random.Random(seed)
    node = lambda: rng.randrange(N)  # noqa: E731

    def fault() -> tuple:
        kind = rng.choice(("partition", "heal", "pause", "resume", "crash", "crash",
                           "leaving", "none"))
        if kind == "partition":
            return (kind, [rng.randint(0, 1) for _ in range(N)])
        if kind in ("pause", "resume", "crash"):
            return (kind, node())
        if kind == "leaving":
            return (kind, node(), rng.random() < 0.5)
        return (kind,)

    schedule = [(rng.randint(50, 3000), fault(),
                 [(node(), rng.choice((0, 2, 3))) for _ in range(rng.randint(0, 3))])
                for _ in range(rng.randint(6, 30))]
    return {"seed": seed, "schedule": schedule, "delay": rng.choice([(1, 5), (1, 40)]),
            "consumers": rng.sample(range(N), rng.randint(1, N)),
            "process": rng.choice([(5, 100), (300, 4000)]),
            "drop": rng.choice([0.0, 0.01]), "nack_rate": rng.choice([0.0, 0.3]),
            "crashes": crashes, "aof": rng.random() < 0.5, "backlog": rng.random() < 0.5}


def run_one(seed: int, random_kill: int, crashes: int) -> None:
    """One seed's schedule (AssertionError: what it violated)."""
    if random_kill:
        run_random_kills(**random_kill_params(seed, random_kill))
    else:
        run_schedule(**random_params(seed, crashes))


def run_seed(job: tuple[int, int, int], trace: bool = False) -> tuple[int, str | None]:
    """One (seed, random_kill, crashes) schedule: the seed, and None if it ran clean, else
    what it violated (a pool's worker function); `trace`: print the traceback too."""
    try:
        run_one(*job)
    except AssertionError as e:
        if trace:
            traceback.print_exc()
        return job[0], str(e)[:300]
    return job[0], None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="randomized fault schedules of the simulation")
    ap.add_argument("--seeds", type=int, default=100, help="how many schedules")
    ap.add_argument("--start", type=int, default=0, help="first seed")
    ap.add_argument("--seed", type=int, help="run this one seed, with the traceback")
    ap.add_argument("--crashes", type=int, default=3, help="rolling crashes per schedule")
    ap.add_argument("--random-kill", type=int, metavar="SECONDS", default=0,
                    help="run issue 25's random-kill schedule for SECONDS of simulated time "
                         "instead (5 nodes, up to 2 down at once)")
    ap.add_argument("--overflow", action="store_true",
                    help="every node with overflow on, past a few jobs (issue 22)")
    ap.add_argument("--jobs", type=int, default=1,
                    help="processes running seeds side by side (0: one per CPU)")
    args = ap.parse_args(argv)
    global OVERFLOW_DIR
    if args.overflow:
        OVERFLOW_DIR = tempfile.mkdtemp(prefix="disque-sim-overflow-")
    what = (f"random kills for {args.random_kill}s" if args.random_kill
            else f"{args.crashes} rolling crashes max")
    again = (f"--random-kill {args.random_kill}" if args.random_kill
             else f"--crashes {args.crashes}") + (" --overflow" if args.overflow else "")
    what += ", overflow on" if args.overflow else ""
    seeds = [args.seed] if args.seed is not None else range(args.start,
                                                             args.start + args.seeds)
    failed = []
    t0 = time.monotonic()
    pool = None
    jobs = [(seed, args.random_kill, args.crashes) for seed in seeds]
    reproduce = args.seed is not None  # one seed: in this process, with the traceback
    procs = 1 if reproduce else args.jobs or os.cpu_count() or 1
    results: Iterable[tuple[int, str | None]]
    if procs > 1:  # (forked: the workers inherit OVERFLOW_DIR)
        pool = multiprocessing.get_context("fork").Pool(procs)
        results = pool.imap_unordered(run_seed, jobs)
    else:
        results = (run_seed(job, reproduce) for job in jobs)
    for k, (seed, error) in enumerate(results, 1):
        if error is not None:
            failed.append(seed)
            print(f"seed {seed} FAILED: {error}\n  reproduce: .venv/bin/python -m "
                  f"tests.sim.schedules --seed {seed} {again}", flush=True)
        if k % 500 == 0:
            print(f"{k} schedules, {len(failed)} failed, {time.monotonic() - t0:.0f}s",
                  file=sys.stderr, flush=True)
    if pool is not None:
        pool.close()
        pool.join()
    failed.sort()
    total = len(seeds)
    print(f"{total - len(failed)} of {total} schedules clean ({what} each), "
          f"{time.monotonic() - t0:.0f}s; failing seeds: {failed}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
