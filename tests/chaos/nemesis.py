"""Chaos runs: a real cluster, producer and consumer processes recording a history
(tests/chaos/history.py), and one nemesis disturbing the cluster for a given time.

The workload follows issue 13's measurement: 5 nodes, 3 producers and 3 consumers (6
clients), REPLICATE 3, RETRY 2, consumers pacing themselves so that a backlog builds while
the nemesis runs. Then everything heals (stopped nodes continue, killed ones start again,
cut links come back), the producers stop, the consumers drain every node, and the history
checker reports (History.report): added-ok, delivered, lost, unexpected, duplicated,
delivered-after-ACK, recovered, ADDJOB latency p50/p99.

The nemeses (`NEMESES`):
- `kill`: kill -9 one node at a time, no AOF: it comes back empty;
- `kill-aof`: the same with `appendonly yes`, `appendfsync everysec`;
- `pause`: SIGSTOP one node at a time, SIGCONT later (no AOF);
- `partition`: bus links cut by the proxies of tests/chaos/partition.py: random halves and
  one-node isolations, healed in between;
- `random-kill`: issue 25's schedule, on a clock rather than on conditions: a kill -9 of a
  random running node every 2-4 s, each killed node restarted 2-6 s later (empty, no AOF),
  with up to REPLICATE-1 (2) nodes down at once; the survivors repair the copies of a down
  node after `repair-grace` (disque.cluster.repair) and re-replicate to a restarted one;
- `random-kill-aof`: the same with `appendonly yes`, `appendfsync everysec`;
- `kill-tls`: `kill` on a cluster whose bus is mutual TLS (`tls-cluster yes`, certificates
  from a throwaway CA made for the run).

Except for the random kills, a fault lasts until the cluster has noticed it (the others see the node unreachable) and
the producers made progress; after healing, the next fault waits for the full mesh and more
progress (and, where the nodes report it, for copies lost by a restart to be restored). No
fixed sleeps: every step polls a condition, bounded by a deadline. Only a fault the cluster
noticed within that deadline counts (`faults`); the others are counted apart
(`ineffective`) and named in the report, so a run cannot pass on faults that never bit.

`python -m tests.chaos.run` (`make chaos`) runs them and prints the table; the short tests
in test_nemeses.py run each for ~20 s.
"""

from __future__ import annotations

import json
import random
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from disque.tools.certs import make_ca, make_cert
from tests.chaos.history import Workers
from tests.chaos.partition import BusProxies
from tests.cluster.conftest import Cluster, cluster_nodes, cmd, myid, ok, parse_fields
from tests.harness import DisqueProcess, free_port, wait_for

NEMESES = ("kill", "kill-aof", "pause", "partition", "random-kill", "random-kill-aof",
           "kill-tls")
NODES = 5
NODE_TIMEOUT = 1000  # ms
REPAIR_GRACE = 300  # ms: well under NODE_TIMEOUT (disque.cluster.repair)
MAX_DOWN = 2  # random kills: nodes down at once (REPLICATE - 1)
PROGRESS = 150  # ADDJOB outcomes between two steps of a nemesis
STEP_DEADLINE = 15.0  # s: a step waits at most this long for its condition
DRAIN_DEADLINE = 120.0  # s after healing for every added job to be delivered
TRACE_EVERY = 0.25  # s between two INFO samples of a traced run
TRACE_SHOW = 200  # lost jobs a traced run asks every node about
DRAIN_STALL = 30.0  # s without a new delivery: the rest is lost


@dataclass
class RunResult:
    nemesis: str
    seconds: float
    faults: int  # faults that took effect: the other nodes saw them
    report: dict[str, Any]
    notes: list[str] = field(default_factory=list)
    ineffective: int = 0  # faults the cluster did not notice within STEP_DEADLINE


def settle(cond: Callable[[], Any], timeout: float = STEP_DEADLINE) -> bool:
    """Poll `cond` until true or `timeout`; a workload step that did not settle goes on."""
    try:
        wait_for(cond, timeout=timeout, interval=0.05)
        return True
    except AssertionError:
        return False


class ChaosCluster:
    """NODES real nodes; with `proxied`, every bus link goes through BusProxies."""

    def __init__(self, workdir: Path, aof: bool = False, proxied: bool = False,
                 n: int = NODES, node_args: tuple[str, ...] = ()) -> None:
        args = ["--cluster-node-timeout", str(NODE_TIMEOUT), "--repair-grace", str(REPAIR_GRACE),
                *node_args]
        if aof:
            args += ["--appendonly", "yes", "--appendfsync", "everysec"]
        self.proxies = BusProxies() if proxied else None
        self.announce: list[int] = []
        self.nodes: list[DisqueProcess] = []
        self.ids: list[str] = []  # node IDs, by index (read at start, and after a restart)
        self.timeline: list[tuple[float, str, int]] = []  # (time.time(), "kill"/"start", node)
        for i in range(n):
            node_args = list(args)
            if self.proxies is not None:
                a = free_port()  # nothing listens on a; the proxy on a + 10000
                self.announce.append(a)
                node_args += ["--cluster-announce-port", str(a)]
            self.nodes.append(DisqueProcess(workdir / f"node{i}", args=node_args))
        self.cluster = Cluster(self.nodes)

    def start(self) -> None:
        for p in self.nodes:
            p.start(wait=False)
        for p in self.nodes:
            p.wait_ready()
        first_port = self.nodes[0].port
        if self.proxies is not None:
            for i, p in enumerate(self.nodes):
                self.proxies.add(i, self.announce[i] + 10000, p.port + 10000)
                self.proxies.set_node_id(i, cmd(p, "CLUSTER", "MYID"))
            first_port = self.announce[0]
        for p in self.nodes[1:]:
            ok(p, "CLUSTER", "MEET", "127.0.0.1", first_port)
        self.cluster.wait_mesh()
        self.ids = [myid(p) for p in self.nodes]

    @property
    def ports(self) -> list[int]:
        return [p.port for p in self.nodes]

    def killed(self, i: int) -> None:
        self.nodes[i].kill()
        self.timeline.append((time.time(), "kill", i))

    def restarted(self, i: int) -> None:
        self.nodes[i].start()
        self.ids[i] = myid(self.nodes[i])
        self.timeline.append((time.time(), "start", i))

    def flags_failing(self, j: int, others: list[int]) -> bool:
        """Does node j flag every node of `others` failing (fail? or fail), or not know
        it any more? (Counting node j's reachable nodes would also count a node flagged
        for another reason, e.g. starved for a node timeout by the load.)"""
        view = cluster_nodes(self.nodes[j])
        return all((e := view.get(self.ids[i])) is None or {"fail?", "fail"} & set(e.flags)
                   for i in others)

    def sees_unreachable(self, i: int) -> bool:
        """Every other running node flags node i failing."""
        return all(self.flags_failing(j, [i])
                   for j, p in enumerate(self.nodes) if j != i and p.alive())

    def sees_cut(self, groups: list[list[int]]) -> bool:
        """Every node flags failing every node outside its group."""
        return all(self.flags_failing(j, [i for i in range(len(self.nodes)) if i not in g])
                   for g in groups for j in g)

    def rereplication_done(self) -> bool:
        """No node restoring copies (nodes without the INFO field count as done)."""
        for p in self.nodes:
            info = parse_fields(cmd(p, "INFO", "jobs"))
            if int(info.get("rereplication_nodes", "0")) or int(
                    info.get("rereplication_pending", "0")):
                return False
        return True

    def heal_all(self) -> None:
        if self.proxies is not None:
            self.proxies.heal()
        for p in self.nodes:
            if p.alive():
                p.proc.send_signal(signal.SIGCONT)  # type: ignore[union-attr]
            else:
                p.start()
        self.cluster.wait_mesh(timeout=60)

    def close(self) -> None:
        for p in self.nodes:
            if p.alive():
                p.proc.send_signal(signal.SIGCONT)  # type: ignore[union-attr]
            p.kill()
        if self.proxies is not None:
            self.proxies.close()


# ---------------------------------------------------------------------------- nemeses
class Nemesis:
    """One fault after another until `seconds` passed. `faults` counts those that took
    effect (the other nodes saw them within STEP_DEADLINE), `ineffective` the others."""

    def __init__(self, c: ChaosCluster, workers: Workers, rng: random.Random) -> None:
        self.c = c
        self.workers = workers
        self.rng = rng
        self.faults = 0
        self.ineffective = 0

    def progress(self, n: int = PROGRESS) -> None:
        h = self.workers.history
        start = h.attempts
        settle(lambda: h.attempts >= start + n)

    def recovered(self) -> None:
        self.c.cluster.wait_mesh(timeout=60)
        settle(self.c.rereplication_done, timeout=30)
        self.progress()

    def run(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        i = 0
        while time.monotonic() < end:
            if self.fault(i):
                self.faults += 1
            else:
                self.ineffective += 1
            i += 1

    def fault(self, i: int) -> bool:
        """Inject fault number i, let the workload go on, heal: did it take effect?"""
        raise NotImplementedError


class KillNemesis(Nemesis):
    """kill -9 node i mod N; it stays down until the others see it unreachable and the
    producers moved on; then it starts again with the same directory."""

    def fault(self, i: int) -> bool:
        c = self.c
        k = i % len(c.nodes)
        c.killed(k)
        noticed = settle(lambda: c.sees_unreachable(k))
        self.progress()
        c.restarted(k)
        self.recovered()
        return noticed


class PauseNemesis(Nemesis):
    """SIGSTOP a random node until the others see it unreachable, then SIGCONT."""

    def fault(self, i: int) -> bool:
        c = self.c
        k = self.rng.randrange(len(c.nodes))
        p = c.nodes[k]
        p.proc.send_signal(signal.SIGSTOP)  # type: ignore[union-attr]
        try:
            noticed = settle(lambda: c.sees_unreachable(k))
            self.progress()
        finally:
            p.proc.send_signal(signal.SIGCONT)  # type: ignore[union-attr]
        self.recovered()
        return noticed


class PartitionNemesis(Nemesis):
    """Alternately random halves and one-node isolations of the bus, healed in between."""

    def fault(self, i: int) -> bool:
        c = self.c
        n = len(c.nodes)
        assert c.proxies is not None
        if i % 2:
            k = self.rng.randrange(n)
            c.proxies.isolate(k, n)
            noticed = settle(lambda: c.sees_unreachable(k))
        else:
            order = list(range(n))
            self.rng.shuffle(order)
            cut = self.rng.randint(1, n // 2)
            groups = [order[:cut], order[cut:]]
            c.proxies.cut(groups)
            noticed = settle(lambda: c.sees_cut(groups))
        self.progress()
        c.proxies.heal()
        self.recovered()
        return noticed


class RandomKillNemesis(Nemesis):
    """On a clock: every 2-4 s a kill -9 of a random running node (while fewer than
    MAX_DOWN are down); each comes back 2-6 s after its kill. Every kill takes effect (the
    process is gone), so all count as faults."""

    def run(self, seconds: float) -> None:
        c, rng = self.c, self.rng
        down: dict[int, float] = {}  # node -> when it starts again
        now = time.monotonic()
        end = now + seconds
        next_kill = now
        while now < end:
            for k, at in sorted(down.items(), key=lambda kv: kv[1]):
                if now >= at:
                    c.restarted(k)
                    del down[k]
            if now >= next_kill:
                if len(down) < MAX_DOWN:
                    k = rng.choice([i for i in range(len(c.nodes)) if i not in down])
                    c.killed(k)
                    down[k] = time.monotonic() + rng.uniform(2.0, 6.0)
                    self.faults += 1
                next_kill = time.monotonic() + rng.uniform(2.0, 4.0)
            time.sleep(0.05)
            now = time.monotonic()
        for k in sorted(down, key=down.__getitem__):
            time.sleep(max(0.0, down[k] - time.monotonic()))
            c.restarted(k)


NEMESIS_CLASSES: dict[str, type[Nemesis]] = {
    "kill": KillNemesis, "kill-aof": KillNemesis, "pause": PauseNemesis,
    "partition": PartitionNemesis, "random-kill": RandomKillNemesis,
    "random-kill-aof": RandomKillNemesis, "kill-tls": KillNemesis,
}


class Tracer:
    """With `--trace` (tests/chaos/run.py): what a lost job's story needs, written into the
    run's directory, which is kept: `info.jsonl` (every TRACE_EVERY s, each running node's
    INFO jobs and overflow fields), `timeline.jsonl` (kills and starts), and at the end
    `lost.jsonl` (each lost job: when and where it was added, and what SHOW says of it on
    every node, for the first TRACE_SHOW of them) and `after_ack.jsonl` (each job delivered
    after its ACKJOB returned: when it was added and acknowledged, and its deliveries)."""

    FIELDS = ("registered_jobs", "underreplicated_jobs", "repaired_jobs", "overflow_jobs",
              "rereplication_nodes", "rereplication_pending", "overflow_written_jobs",
              "overflow_read_jobs")

    def __init__(self, c: ChaosCluster, workdir: Path) -> None:
        self.c = c
        self.workdir = workdir
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._sample, daemon=True)

    def start(self) -> None:
        self.thread.start()

    def _sample(self) -> None:
        with open(self.workdir / "info.jsonl", "w") as out:
            while not self.stop.wait(TRACE_EVERY):
                row: dict[str, Any] = {"t": time.time()}
                for i, p in enumerate(self.c.nodes):
                    try:
                        info = parse_fields(cmd(p, "INFO", "all")) if p.alive() else {}
                    except Exception:  # noqa: BLE001 - a node killed between the two calls
                        info = {}
                    row[str(i)] = {k: info[k] for k in self.FIELDS if k in info}
                out.write(json.dumps(row) + "\n")
                out.flush()

    def finish(self, h: Any) -> None:
        self.stop.set()
        self.thread.join()
        with open(self.workdir / "timeline.jsonl", "w") as out:
            for t, what, i in self.c.timeline:
                out.write(json.dumps({"t": t, "what": what, "node": i}) + "\n")
        with open(self.workdir / "after_ack.jsonl", "w") as out:
            for row in h.after_ack():
                out.write(json.dumps(row) + "\n")
        lost = h.undelivered()
        with open(self.workdir / "lost.jsonl", "w") as out:
            for n, jid in enumerate(lost):
                row = {"id": jid, "t": h.add_time.get(jid), "body": h.added.get(jid)}
                if n < TRACE_SHOW:
                    row["show"] = {str(i): str(cmd(p, "SHOW", jid))
                                   for i, p in enumerate(self.c.nodes) if p.alive()}
                out.write(json.dumps(row) + "\n")


def run_chaos(nemesis: str, seconds: float, workdir: Path, seed: int = 1,
              node_args: tuple[str, ...] = (), trace: bool = False) -> RunResult:
    """One chaos run; the cluster and the workers are gone when it returns. `node_args`:
    more options for every node (e.g. `--repair-rate 0` to compare); `trace`: a Tracer
    writes into `workdir`."""
    if nemesis.endswith("-tls"):
        node_args = (*tls_cluster_args(workdir / "tls"), *node_args)
    c = ChaosCluster(workdir, aof=nemesis.endswith("-aof"), proxied=nemesis == "partition",
                     node_args=node_args)
    workers: Workers | None = None
    tracer = Tracer(c, workdir) if trace else None
    notes: list[str] = []
    try:
        c.start()
        if tracer is not None:
            tracer.start()
        workers = Workers(c.ports, 10**9, producers=3, consumers=3, seed=seed, repl=(3,),
                          retry=(2, 2), pace=0.05)
        h = workers.history
        workers.start()
        settle(lambda: h.attempts >= PROGRESS, timeout=60)
        nem = NEMESIS_CLASSES[nemesis](c, workers, random.Random(seed))
        t0 = time.monotonic()
        nem.run(seconds)
        elapsed = time.monotonic() - t0
        c.heal_all()
        workers.stop_producers.set()
        wait_for(workers.producers_done, timeout=60, interval=0.1, what="producers done")
        workers.drain.set()
        drain(h)
        if tracer is not None:
            tracer.finish(h)
        if c.proxies is not None:
            notes.append(f"bus links cut: {c.proxies.cuts}")
        if nem.ineffective:
            notes.append(f"{nem.ineffective} faults not noticed by the cluster within "
                         f"{STEP_DEADLINE:.0f} s (not counted)")
        return RunResult(nemesis, elapsed, nem.faults, h.report(), notes, nem.ineffective)
    finally:
        if workers is not None:
            workers.stop()
        c.close()


def tls_cluster_args(where: Path) -> tuple[str, ...]:
    """A throwaway CA and one node certificate (every node presents the same one: the bus
    checks the chain, not the name) for `tls-cluster yes`."""
    ca, _ = make_ca(where, "ca")
    crt, key = make_cert(where, "node", "ca", "node")
    return ("--tls-cluster", "yes", "--tls-cert-file", str(crt), "--tls-key-file", str(key),
            "--tls-ca-cert-file", str(ca))


def drain(h: Any) -> None:
    """Wait until every added job was delivered, or deliveries stall (the rest is lost)."""
    end = time.monotonic() + DRAIN_DEADLINE
    last = (-1, time.monotonic())
    while time.monotonic() < end and h.undelivered():
        seen = len(h.deliveries)
        if seen != last[0]:
            last = (seen, time.monotonic())
        elif time.monotonic() - last[1] > DRAIN_STALL:
            return
        time.sleep(0.2)


COLUMNS = (("added_ok", "added-ok", "{:d}"), ("delivered", "delivered", "{:d}"),
           ("lost", "lost", "{:d}"), ("unexpected", "unexpected", "{:d}"),
           ("duplicated", "duplicated", "{:d}"), ("dup_rate", "dup-rate", "{:.2%}"),
           ("delivered_after_ack", "after-ACK", "{:d}"), ("recovered", "recovered", "{:d}"),
           ("add_p50_ms", "add-p50-ms", "{:.1f}"), ("add_p99_ms", "add-p99-ms", "{:.1f}"))


def table(results: list[RunResult]) -> str:
    head = ["nemesis", "seconds", "faults", "no-effect"] + [title for _, title, _ in COLUMNS]
    rows = [[r.nemesis, f"{r.seconds:.0f}", str(r.faults), str(r.ineffective)]
            + [fmt.format(r.report[key]) for key, _, fmt in COLUMNS] for r in results]
    widths = [max(len(x) for x in col) for col in zip(head, *rows, strict=True)]
    lines = ["  ".join(x.rjust(w) for x, w in zip(row, widths, strict=True))
             for row in [head, *rows]]
    return "\n".join(lines)
