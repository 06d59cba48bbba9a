"""In-process cost of the replicated write path per job (issue 12).

No sockets: three `Node`s, each with a `Membership` that knows the other two (reachable,
outbound bus links up, as Membership's Connect effects answered by the I/O layer), share one
fake clock. ADDJOBs go into the origin the way the command layer calls it
(`add_job`, then `wait_replication` for a synchronous one); the bus is the real codec: each
node's outbox is split per destination, encoded with `encode_many` (frames shared between
links, as `Bus.flush` does) and fed to the receiver's `FrameDecoder`, whose messages go to
`node.on_message`, as `Server.route_out` and `Server.on_job_message` do. Every round the
clock moves on and every node's timer wheel runs what is due; every few thousand jobs the
young objects are collected and frozen, as `Cron.gc_tick` does.

A round is `batch` ADDJOBs taken in one loop iteration (1: an unpipelined client; 16: a
client pipelining 16, absorbed into one group; 500: ADDJOBS or many clients at once), then
the bus runs until it is quiet: origin -> replicas (REPLJOB) -> origin (GOTJOB). What is
timed is the Python work of all three nodes together per job, which is what bounds the
CPU-bound rows of the 3-node benchmark (every node is an origin and a replica there) and
the latency of the P1 rows (each hop waits behind the others' work). A sync ADDJOB counts
only when its client was answered, which happens only after REPLICATE copies exist.

Before the timed jobs, `--warm` jobs (untimed, frozen by the collector) fill the nodes, as
a node of the 3-node benchmark holds the jobs of its earlier rows: the registry's shards
are then allocated and tracked already, as in a running server (on empty nodes every
first job of a shard paid for that, and the young collections for the shard).

`python -m benchmarks.replication [-n JOBS] [-r REPEATS] [--warm JOBS] [--only ...]`
"""

from __future__ import annotations

import argparse
import gc
import random
import time
from typing import Any

from disque.cluster.membership import Connect, Membership
from disque.cluster.messages import BusStats, FrameDecoder, encode_many
from disque.cluster.nodes import ClusterNode
from disque.cluster.replication import ReplWaiter
from disque.jobs.job import WAIT_REPL
from disque.node import Node
from disque.protocol.errors import CommandError

T0 = 1_700_000_000_000
NODE_IDS = tuple(bytes([c]) * 40 for c in b"abc")
JOB_US = 20  # simulated time per job: about the rate of the 3-node benchmark
GC_EVERY = 3000  # jobs between young-object collections (Cron.gc_tick every 100 ms)
BODY = b"0123456789abcdef"


class Answer(ReplWaiter):
    """A synchronous ADDJOB's client: counts the answers."""

    __slots__ = ("counter",)

    def __init__(self, counter: list[int]) -> None:
        self.counter = counter

    def on_added(self, job_id: bytes) -> None:
        self.counter[0] += 1

    def on_error(self, error: CommandError) -> None:
        raise AssertionError(f"ADDJOB failed: {error}")


class Cluster:
    """Three nodes wired through the real bus codec, one fake clock."""

    def __init__(self, seed: int = 1) -> None:
        self.now_f = float(T0)
        self.nodes: dict[bytes, Node] = {}
        self.decoders: dict[tuple[bytes, bytes], FrameDecoder] = {}
        self.stats: dict[bytes, BusStats] = {}
        for i, me in enumerate(NODE_IDS):
            rng = random.Random(seed + i)
            node = Node(me, self.clock, rng=rng, randbytes=rng.randbytes)
            m = Membership(me, 7711 + i, clock=self.clock, rng=random.Random(seed + 10 + i))
            m.load([ClusterNode(p, b"127.0.0.1", 7711 + k)
                    for k, p in enumerate(NODE_IDS) if p != me])
            m.tick()  # copies go only over a link: connect to both peers
            for e in m.drain():
                if type(e) is Connect:
                    m.link_connected(object(), e.token)
            m.drain()
            node.membership = m
            self.nodes[me] = node
            self.stats[me] = BusStats()
        for src in NODE_IDS:
            for dst in NODE_IDS:
                if src != dst:
                    self.decoders[(src, dst)] = FrameDecoder(stats=self.stats[dst])

    def clock(self) -> int:
        return int(self.now_f)

    def route(self, src: bytes) -> bool:
        """Deliver one node's outbox (Server.route_out + Bus.flush + BusLink.data_received);
        False if it was empty."""
        node = self.nodes[src]
        out = node.out
        if not out:
            return False
        node.out = []
        queues: dict[bytes, list[Any]] = {}
        for dst, msg in out:
            q = queues.get(dst)
            if q is None:
                queues[dst] = [msg]
            else:
                q.append(msg)
        shared: dict[tuple[Any, ...], bytes] = {}
        stats = self.stats[src]
        frames = [(dst, encode_many(q, stats, shared)) for dst, q in queues.items()]
        for dst, data in frames:
            receiver = self.nodes[dst]
            for msg in self.decoders[(src, dst)].feed(data):
                receiver.on_message(src, msg)
        return True

    def settle(self) -> None:
        moved = True
        while moved:
            moved = False
            for src in NODE_IDS:
                moved = self.route(src) or moved

    def advance(self, ms: float) -> None:
        self.now_f += ms
        now = int(self.now_f)
        for node in self.nodes.values():
            nd = node.next_due()
            if nd is not None and nd <= now:
                node.tick(now)


def add_jobs(cluster: Cluster, n: int, batch: int, replicate: int, async_: bool) -> int:
    """n jobs added on node A in rounds of `batch`; how many sync clients were answered."""
    origin = cluster.nodes[NODE_IDS[0]]
    add_job = origin.add_job
    wait_replication = origin.wait_replication
    settle = cluster.settle
    advance = cluster.advance
    answered = [0]
    step_ms = batch * JOB_US / 1000
    gc_rounds = max(1, GC_EVERY // batch)
    for r in range(max(1, n // batch)):
        for _ in range(batch):
            job = add_job(b"q", BODY, 5000, replicate, None, None, 0, None, async_)
            if job.state == WAIT_REPL:
                wait_replication(job, Answer(answered), 5000)
        settle()
        advance(step_ms)
        if r % gc_rounds == 0:
            gc.collect(1)
            gc.freeze()
    return answered[0]


def run(n: int, batch: int, replicate: int, async_: bool, seed: int, warm: int) -> float:
    """µs per job for n jobs added on node A in rounds of `batch`, after `warm` jobs."""
    cluster = Cluster(seed)
    if warm:
        add_jobs(cluster, warm, 500, replicate, async_)
    gc.collect()
    gc.freeze()
    t0 = time.perf_counter()
    answered = add_jobs(cluster, n, batch, replicate, async_)
    elapsed = time.perf_counter() - t0
    total = max(1, n // batch) * batch
    if not async_ and answered != total:
        raise AssertionError(f"{answered} of {total} sync ADDJOBs answered")
    copies = sum(len(node.jobs) for node in cluster.nodes.values())
    if copies != (total + (max(1, warm // 500) * 500 if warm else 0)) * replicate:
        raise AssertionError(f"{copies} copies of {total} jobs, REPLICATE {replicate}")
    gc.unfreeze()
    return elapsed * 1e6 / total


SCENARIOS = {
    "sync-r3": (3, False),
    "async-r3": (3, True),
    "r2": (2, False),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-n", type=int, default=10_000, help="jobs per repeat (default 10000)")
    ap.add_argument("-r", "--repeats", type=int, default=5, help="best of (default 5)")
    ap.add_argument("--only", default=",".join(SCENARIOS),
                    help="scenarios: " + ",".join(SCENARIOS))
    ap.add_argument("--batches", default="1,16,500", help="jobs per round (default 1,16,500)")
    ap.add_argument("--warm", type=int, default=30_000,
                    help="jobs on the nodes before the timed ones (default 30000)")
    args = ap.parse_args()
    gc.disable()
    batches = [int(b) for b in args.batches.split(",")]
    for name in args.only.split(","):
        replicate, async_ = SCENARIOS[name]
        for batch in batches:
            best = min(run(args.n, batch, replicate, async_, seed, args.warm)
                       for seed in range(args.repeats))
            label = f"{name} x{batch}"
            print(f"{label:<16} {best:7.2f} us/job  {1e6 / best:>9,.0f} jobs/s", flush=True)


if __name__ == "__main__":
    main()
