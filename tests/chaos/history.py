"""Producer / consumer processes that record a history, and the checker that reads it.

Every worker is its own OS process (multiprocessing, spawn) with its own connection, pinned
to a "home" node; when its node dies it moves to the next node, and goes home again once the
node answers. Workers send their events to the test process in batches through a
multiprocessing queue:

- producers: `add` (job ID, body, node, time), `maybe` (the connection died mid-ADDJOB: the
  job may or may not exist), `norepl` / `error` (refused: never added);
- consumers: `deliver` (job ID, body, node, time), `ack` (job IDs, node, time).

`History` folds the events; `History.check_delivered` is the acceptance: every added job was
delivered at least once with the body it was added with. Duplicates are counted, not failed:
at-least-once delivery allows them.
"""

from __future__ import annotations

import multiprocessing as mp
import queue as queue_mod
import random
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from tests.integration.resp import Conn, ConnectionClosed, Err, Status

QUEUE = "chaos"
FLUSH_EVERY = 0.2  # s between event batches sent to the test process
CONN_ERRORS = (OSError, ConnectionClosed, TimeoutError)
SLOW_ACK = 0.004  # fraction of GETJOB replies acked only after SLOW_ACK_AFTER seconds
SLOW_ACK_AFTER = 6.0  # > the largest RETRY (5 s) + jitter: the job is delivered again
FORGET = 0.002  # fraction of GETJOB replies never acked by the consumer that got them


def connect(ports: list[int], home: int, timeout: float = 10.0) -> tuple[Conn, int] | None:
    """A connection to the home node, else to the next node that answers."""
    n = len(ports)
    for k in range(n):
        i = (home + k) % n
        try:
            return Conn(ports[i], timeout=timeout), i
        except OSError:
            continue
    return None


class Batcher:
    def __init__(self, out: Any, who: str) -> None:
        self.out = out
        self.who = who
        self.events: list[tuple] = []
        self.last = time.monotonic()

    def add(self, *event: Any) -> None:
        self.events.append(event)
        if time.monotonic() - self.last >= FLUSH_EVERY:
            self.flush()

    def flush(self) -> None:
        if self.events:
            self.out.put(self.events)
            self.events = []
        self.last = time.monotonic()


def producer(idx: int, ports: list[int], home: int, count: int, seed: int, out: Any,
             stop: Any, repl: tuple[int, ...] = (2, 3), retry: tuple[int, int] = (2, 5)) -> None:
    """ADDJOB `count` jobs with unique bodies, REPLICATE one of `repl`, RETRY in the range
    `retry` (s); each answered ADDJOB is recorded with its latency."""
    rng = random.Random(seed)
    ev = Batcher(out, f"producer{idx}")
    conn: Conn | None = None
    node = home
    k = 0
    try:
        while k < count and not stop.is_set():
            if conn is None:
                got = connect(ports, home)
                if got is None:
                    time.sleep(0.1)
                    continue
                conn, node = got
            body = f"p{idx}-{k}"
            r = rng.choice(repl)
            rt = rng.randint(*retry)
            t = time.time()
            k += 1
            try:
                reply = conn.cmd("ADDJOB", QUEUE, body, 2000, "REPLICATE", r, "RETRY", rt)
            except CONN_ERRORS:
                ev.add("maybe", body, node, t)
                conn.close()
                conn = None
                continue
            if isinstance(reply, Status):
                ev.add("add", str(reply), body, node, t, time.time() - t)
            elif isinstance(reply, Err) and reply.startswith("NOREPL"):
                ev.add("norepl", body, node, t)
            else:
                ev.add("error", body, node, t, str(reply))
    finally:
        ev.add("done", "producer", idx)
        ev.flush()
        if conn is not None:
            conn.close()


def consumer(idx: int, ports: list[int], home: int, seed: int, out: Any, stop: Any,
             pace: float = 0.0, drain: Any = None) -> None:
    """GETJOB TIMEOUT .. COUNT 10, 'process', ACKJOB; record every delivery and ack.

    A few replies are acked only after their RETRY elapsed (so they are delivered again:
    duplicates by design), and a few are never acked by this consumer (it 'crashed' on
    them): the cluster must deliver those again. `pace` > 0: wait that long between GETJOBs
    (a backlog builds) until the `drain` event is set."""
    rng = random.Random(seed)
    ev = Batcher(out, f"consumer{idx}")
    conn: Conn | None = None
    node = home
    away_since = 0.0
    later: list[tuple[float, list[bytes]]] = []  # (when, ids): deferred ACKs
    try:
        while not stop.is_set():
            if conn is not None and node != home and time.monotonic() - away_since > 2.0:
                conn.close()  # try to go home again
                conn = None
            if conn is None:
                got = connect(ports, home)
                if got is None:
                    time.sleep(0.1)
                    continue
                conn, node = got
                away_since = time.monotonic()
            if pace and not drain.is_set():
                time.sleep(pace)
            try:
                reply = conn.cmd("GETJOB", "TIMEOUT", 500, "COUNT", 10, "FROM", QUEUE)
            except CONN_ERRORS:
                conn.close()
                conn = None
                continue
            if isinstance(reply, Err):
                ev.add("error", "getjob", node, time.time(), str(reply))
                time.sleep(0.05)
                continue
            now = time.time()
            ids = []
            for _, jid, body in reply or []:
                ids.append(jid)
                ev.add("deliver", jid.decode(), body.decode(), node, now)
            if ids:
                if rng.random() < 0.05:
                    time.sleep(0.001)  # some processing takes a little while
                r = rng.random()
                if r < SLOW_ACK:
                    later.append((time.monotonic() + SLOW_ACK_AFTER, ids))
                    ids = []
                elif r < SLOW_ACK + FORGET:
                    ev.add("forget", [i.decode() for i in ids], node, now)
                    ids = []
            while later and later[0][0] <= time.monotonic():
                ids += later.pop(0)[1]
            if not ids:
                ev.flush()
                continue
            for _ in range(len(ports) * 2):  # ACK wherever we can reach
                if conn is None:
                    got = connect(ports, home)
                    if got is None:
                        time.sleep(0.1)
                        continue
                    conn, node = got
                    away_since = time.monotonic()
                try:
                    conn.cmd("ACKJOB", *ids)
                except CONN_ERRORS:
                    conn.close()
                    conn = None
                    continue
                ev.add("ack", [i.decode() for i in ids], node, time.time())
                break
    finally:
        ev.add("done", "consumer", idx)
        ev.flush()
        if conn is not None:
            conn.close()


@dataclass
class History:
    added: dict[str, str] = field(default_factory=dict)  # id -> body
    add_time: dict[str, float] = field(default_factory=dict)
    maybe: set[str] = field(default_factory=set)  # bodies
    refused: list[tuple] = field(default_factory=list)
    unanswered: set[str] = field(default_factory=set)  # bodies of ADDJOBs without an ID
    add_latency: list[float] = field(default_factory=list)  # s, per ADDJOB answered with an ID
    deliver_times: dict[str, list[tuple[float, int]]] = field(default_factory=dict)  # (t, node)
    ack_time: dict[str, float] = field(default_factory=dict)  # first ACKJOB returned
    attempts: int = 0  # ADDJOBs with any outcome: the producers' progress
    deliveries: Counter = field(default_factory=Counter)  # id -> times delivered
    first_delivery: dict[str, float] = field(default_factory=dict)
    delivered_body: dict[str, str] = field(default_factory=dict)
    delivered_by: Counter = field(default_factory=Counter)  # node index -> deliveries
    acked: set[str] = field(default_factory=set)
    forgotten: set[str] = field(default_factory=set)  # consumers dropped them un-acked
    errors: list[tuple] = field(default_factory=list)
    done: set[tuple[str, int]] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def fold(self, events: list[tuple]) -> None:
        with self.lock:
            for e in events:
                kind = e[0]
                if kind == "add":
                    _, jid, body, _node, t, *lat = e
                    self.added[jid] = body
                    self.add_time[jid] = t
                    self.attempts += 1
                    if lat:
                        self.add_latency.append(lat[0])
                elif kind == "deliver":
                    _, jid, body, node, t = e
                    self.deliveries[jid] += 1
                    self.delivered_by[node] += 1
                    self.first_delivery.setdefault(jid, t)
                    self.deliver_times.setdefault(jid, []).append((t, node))
                    prev = self.delivered_body.setdefault(jid, body)
                    if prev != body:
                        self.errors.append(("body changed", jid, prev, body))
                elif kind == "ack":
                    self.acked.update(e[1])
                    t = e[3]
                    for jid in e[1]:
                        self.ack_time.setdefault(jid, t)
                elif kind == "forget":
                    self.forgotten.update(e[1])
                elif kind == "maybe":
                    self.maybe.add(e[1])
                    self.unanswered.add(e[1])
                    self.attempts += 1
                elif kind in ("norepl",):
                    self.refused.append(e)
                    self.unanswered.add(e[1])
                    self.attempts += 1
                elif kind == "error":
                    self.errors.append(e)
                    if e[1] != "getjob":  # an ADDJOB refused with another error
                        self.unanswered.add(e[1])
                        self.attempts += 1
                elif kind == "done":
                    self.done.add((e[1], e[2]))

    # -- the checks --------------------------------------------------------------------------
    def undelivered(self) -> list[str]:
        with self.lock:
            return [j for j in self.added if j not in self.deliveries]

    def unacked(self) -> list[str]:
        with self.lock:
            return [j for j in self.added if j not in self.acked]

    def wrong_bodies(self) -> list[tuple[str, str, str]]:
        with self.lock:
            return [(j, b, self.delivered_body[j]) for j, b in self.added.items()
                    if j in self.delivered_body and self.delivered_body[j] != b]

    def summary(self) -> str:
        with self.lock:
            dups = sum(n - 1 for n in self.deliveries.values() if n > 1)
            dup_jobs = sum(1 for n in self.deliveries.values() if n > 1)
            unknown = [j for j in self.deliveries if j not in self.added]
            lat = sorted(self.first_delivery[j] - self.add_time[j] for j in self.added
                         if j in self.first_delivery)
            p50 = lat[len(lat) // 2] if lat else float("nan")
            p99 = lat[min(len(lat) - 1, len(lat) * 99 // 100)] if lat else float("nan")
            return (f"added {len(self.added)}, refused (NOREPL) {len(self.refused)}, "
                    f"unknown outcome {len(self.maybe)}; delivered {len(self.deliveries)} "
                    f"distinct jobs in {sum(self.deliveries.values())} deliveries; duplicates "
                    f"{dups} extra deliveries of {dup_jobs} jobs; delivered jobs not in the "
                    f"added set {len(unknown)}; acked {len(self.acked)}; dropped un-acked by a "
                    f"consumer {len(self.forgotten)}; per node deliveries "
                    f"{dict(sorted(self.delivered_by.items()))}; add->first delivery p50 "
                    f"{p50 * 1000:.0f} ms, p99 {p99 * 1000:.0f} ms; errors {len(self.errors)}")

    def _acked_then_delivered(self) -> list[tuple[str, float, list[tuple[float, int]]]]:
        """(id, ACKJOB returned, deliveries) of each job delivered after its ACKJOB
        returned; the caller holds the lock."""
        rows = []
        for jid, t_ack in self.ack_time.items():
            times = self.deliver_times.get(jid, [])
            if any(t > t_ack for t, _ in times):
                rows.append((jid, t_ack, times))
        return rows

    def after_ack(self) -> list[dict[str, Any]]:
        """The jobs delivered after an ACKJOB of theirs returned: when each was added and
        acknowledged, and each delivery (time, node index), for a traced run."""
        with self.lock:
            return [{"id": jid, "added": self.add_time.get(jid), "acked": t_ack,
                     "deliveries": times}
                    for jid, t_ack, times in self._acked_then_delivered()]

    def report(self) -> dict[str, Any]:
        """The figures of a chaos run (issue 13's table): an added-ok job is one whose ADDJOB
        returned an ID; `lost`: added-ok, never delivered; `unexpected`: a delivery of a job
        nobody tried to add, or with another body; `recovered`: delivered jobs whose ADDJOB
        got no ID (connection lost, NOREPL: a best-effort delete that lost a race);
        `delivered_after_ack`: deliveries that happened after an ACKJOB of that job had
        returned to a consumer; duplicates: deliveries beyond the first."""
        with self.lock:
            added_bodies = set(self.added.values())
            unexpected = 0
            recovered = 0
            for jid, body in self.delivered_body.items():
                if jid in self.added:
                    if self.added[jid] != body:
                        unexpected += 1
                elif body in self.unanswered and body not in added_bodies:
                    recovered += 1
                else:
                    unexpected += 1
            after_ack = sum(1 for _, t_ack, times in self._acked_then_delivered()
                            for t, _ in times if t > t_ack)
            deliveries = sum(self.deliveries.values())
            dups = deliveries - len(self.deliveries)
            lat = sorted(self.add_latency)

            def pct(p: int) -> float:
                return lat[min(len(lat) - 1, len(lat) * p // 100)] * 1000 if lat else 0.0

            return {
                "added_ok": len(self.added),
                "delivered": len(self.deliveries),
                "lost": sum(1 for j in self.added if j not in self.deliveries),
                "unexpected": unexpected,
                "duplicated": dups,
                "dup_rate": dups / deliveries if deliveries else 0.0,
                "delivered_after_ack": after_ack,
                "recovered": recovered,
                "add_p50_ms": pct(50),
                "add_p99_ms": pct(99),
            }


class Workers:
    """The worker processes and the thread that folds their events into a History."""

    def __init__(self, ports: list[int], jobs: int, producers: int = 4, consumers: int = 4,
                 seed: int = 1, repl: tuple[int, ...] = (2, 3),
                 retry: tuple[int, int] = (2, 5), pace: float = 0.0) -> None:
        ctx = mp.get_context("spawn")
        self.out = ctx.Queue()
        self.drain = ctx.Event()  # consumers stop pacing themselves
        self.stop_producers = ctx.Event()
        self.stop_consumers = ctx.Event()
        self.history = History()
        n = len(ports)
        per = [jobs // producers + (1 if i < jobs % producers else 0) for i in range(producers)]
        self.producers = [ctx.Process(target=producer, daemon=True,
                                      args=(i, ports, i % n, per[i], seed * 1000 + i, self.out,
                                            self.stop_producers, repl, retry))
                          for i in range(producers)]
        # Consumers sit on other nodes than the producers with the same index.
        self.consumers = [ctx.Process(target=consumer, daemon=True,
                                      args=(i, ports, (i + 1) % n, seed * 2000 + i, self.out,
                                            self.stop_consumers, pace, self.drain))
                          for i in range(consumers)]
        self._collecting = True
        self._collector = threading.Thread(target=self._collect, daemon=True)
        self.collector_error: BaseException | None = None

    def _collect(self) -> None:
        try:
            while self._collecting:
                try:
                    events = self.out.get(timeout=0.1)
                except queue_mod.Empty:
                    continue
                self.history.fold(events)
        except BaseException as exc:  # noqa: BLE001 - raised by stop(), in the test
            self.collector_error = exc

    def start(self) -> None:
        self._collector.start()
        for p in self.consumers + self.producers:
            p.start()

    def producers_done(self) -> bool:
        with self.history.lock:
            return sum(1 for role, _ in self.history.done if role == "producer") == len(
                self.producers)

    def stop(self) -> None:
        """Stop every worker (bounded), drain their last events, stop the collector."""
        self.stop_producers.set()
        self.stop_consumers.set()
        deadline = time.monotonic() + 30
        for p in self.producers + self.consumers:
            p.join(timeout=max(0.1, deadline - time.monotonic()))
        for p in self.producers + self.consumers:
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
        # The workers flushed before exiting; give the collector the queue's tail.
        end = time.monotonic() + 5
        while time.monotonic() < end:
            with self.history.lock:
                if len(self.history.done) == len(self.producers) + len(self.consumers):
                    break
            time.sleep(0.05)
        self._collecting = False
        self._collector.join(timeout=5)
        if self.collector_error is not None:  # the history misses events: no verdict
            raise AssertionError("the history collector failed") from self.collector_error
