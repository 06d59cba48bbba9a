"""Multi-process end-to-end load generator: producers add jobs, consumers fetch and ack them.

One run spreads `connections` loopback connections over `procs` worker processes, half
producers and half consumers (in a cluster, the consumers may use another node than the
producers: `consume_port`, so every job crosses the bus):

- disque: producers send `ADDJOB q <body> 0 [add_args]`, consumers send `GETJOB TIMEOUT 1000 FROM q` and,
  for every job they get, `ACKJOB <id>`. A job counts once its ACKJOB answered 1.
- redis (the "Redis as a queue" baseline): producers `LPUSH q <body>`, consumers `BRPOP q 1`.
  There is no ack step, so a job counts as soon as BRPOP returns it.

Each connection keeps up to `depth` requests in flight (1 = unpipelined: GETJOB, then ACKJOB,
then the next GETJOB; 16 = pipelined). Pipelined, each disque consumer process sends its acks
on one connection of its own (out of the same 50), because an ACKJOB queued behind blocked
GETJOBs on the same connection would wait for them to time out. The
body is the producer's CLOCK_MONOTONIC in nanoseconds, a clock all processes of the machine
share, so the consumer measures produce -> consume latency without any clock sync.

The loop is closed: producers stop sending while more than `max_backlog` jobs are produced but
not yet consumed (counted through shared memory), so the queue stays short and the latency
measures the service, not an ever-growing backlog. Every run is bounded by a job count and a
time limit. Workers are plain `selectors` loops over raw sockets with hiredis parsing: cheap
enough per request that the generator does not hide the server's cost, although on a 2-core
machine it still competes with the server for CPU (see README.md).

`Client` is also the tiny synchronous RESP client the harness uses for PING/INFO/QLEN.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import queue
import selectors
import signal
import socket
import sys
import time
from array import array
from dataclasses import asdict, dataclass, field
from multiprocessing.sharedctypes import RawArray, RawValue
from typing import Any, Literal

import hiredis

Flavor = Literal["disque", "redis"]
HOST = "127.0.0.1"


def encode(*args: bytes | str | int) -> bytes:
    """One RESP multibulk request."""
    parts = [b"*%d\r\n" % len(args)]
    for a in args:
        if isinstance(a, int):
            b = b"%d" % a
        elif isinstance(a, str):
            b = a.encode()
        else:
            b = a
        parts.append(b"$%d\r\n%s\r\n" % (len(b), b))
    return b"".join(parts)


class Client:
    """A blocking RESP2 client for the harness's control commands (not for load)."""

    def __init__(self, port: int, timeout: float = 30.0) -> None:
        self.sock = socket.create_connection((HOST, port), timeout=timeout)
        self.reader = hiredis.Reader()

    def call(self, *args: bytes | str | int) -> Any:
        self.sock.sendall(encode(*args))
        while True:
            reply = self.reader.gets()
            if reply is not False:
                if isinstance(reply, hiredis.ReplyError):
                    raise RuntimeError(f"{args[0]!r}: {reply}")
                return reply
            data = self.sock.recv(1 << 16)
            if not data:
                raise ConnectionError("server closed the connection")
            self.reader.feed(data)

    def info(self, section: str | None = None) -> dict[str, str]:
        raw = self.call("INFO", section) if section else self.call("INFO")
        text = raw.decode() if isinstance(raw, bytes) else str(raw)
        out: dict[str, str] = {}
        for line in text.splitlines():
            if ":" in line and not line.startswith("#"):
                k, _, v = line.partition(":")
                out[k.strip()] = v.strip()
        return out

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass(frozen=True, slots=True)
class E2EConfig:
    port: int
    flavor: Flavor
    depth: int = 1
    jobs: int = 100_000
    connections: int = 50
    procs: int = 4
    time_limit: float = 20.0
    queue: str = "e2e"
    max_backlog: int = 0  # 0: two full windows of the consumer connections
    consume_port: int = 0  # consumers' node (0: the producers' `port`); a cluster's other node
    add_args: tuple[str, ...] = ()  # extra ADDJOB options, e.g. ("REPLICATE", "3", "ASYNC")

    @property
    def consumer_port(self) -> int:
        return self.consume_port or self.port

    @property
    def producer_procs(self) -> int:
        return max(1, self.procs // 2)

    @property
    def consumer_procs(self) -> int:
        return max(1, self.procs - self.producer_procs)

    @property
    def backlog(self) -> int:
        return self.max_backlog or 2 * (self.connections // 2) * self.depth


@dataclass(slots=True)
class E2EResult:
    flavor: str
    depth: int
    jobs_target: int
    produced: int = 0
    consumed: int = 0
    acked: int = 0
    elapsed_s: float = 0.0
    jobs_per_s: float = 0.0
    p50_ms: float | None = None
    p99_ms: float | None = None
    time_limited: bool = False
    errors: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class _Shared:
    """Counters in shared memory; each worker writes only its own slot (no locks needed)."""

    def __init__(self, cfg: E2EConfig) -> None:
        self.produced = RawArray("q", cfg.producer_procs)
        self.consumed = RawArray("q", cfg.consumer_procs)
        self.acked = RawArray("q", cfg.consumer_procs)
        self.ready = RawArray("b", cfg.producer_procs + cfg.consumer_procs)
        self.go = RawValue("b", 0)
        self.stop = RawValue("b", 0)


def _split(total: int, parts: int) -> list[int]:
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


class _Conn:
    __slots__ = ("sock", "reader", "inflight", "out")  # inflight: producers' window only

    def __init__(self, port: int, timeout: float) -> None:
        self.sock = socket.create_connection((HOST, port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.reader = hiredis.Reader()
        self.inflight = 0
        self.out: list[bytes] = []

    def flush(self) -> None:
        if self.out:
            self.sock.sendall(b"".join(self.out))
            self.out.clear()


def _connect(cfg: E2EConfig, n: int, port: int) -> tuple[selectors.DefaultSelector, list[_Conn]]:
    sel = selectors.DefaultSelector()
    conns = [_Conn(port, cfg.time_limit + 10) for _ in range(n)]
    for c in conns:
        sel.register(c.sock, selectors.EVENT_READ, c)
    return sel, conns


def _wait_go(sh: _Shared, slot: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C: the parent sets `stop` for us
    sh.ready[slot] = 1
    while not sh.go.value and not sh.stop.value:
        time.sleep(0.001)


def _producer(cfg: E2EConfig, sh: _Shared, idx: int, nconns: int, quota: int,
              results: Any) -> None:
    out: dict[str, Any] = {"role": "producer", "produced": 0, "errors": []}
    try:
        sel, conns = _connect(cfg, nconns, cfg.port)
        q = cfg.queue.encode()
        if cfg.flavor == "disque":
            extra = [a.encode() for a in cfg.add_args]
            head = b"*%d\r\n$6\r\nADDJOB\r\n$%d\r\n%s\r\n" % (4 + len(extra), len(q), q)
            tail = b"$1\r\n0\r\n" + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in extra)
        else:
            head = b"*3\r\n$5\r\nLPUSH\r\n$%d\r\n%s\r\n" % (len(q), q)
            tail = b""
        depth = cfg.depth
        backlog = cfg.backlog
        sent = 0
        answered = 0
        errors: list[str] = out["errors"]
        produced_slot = sh.produced
        consumed = sh.consumed
        stop = sh.stop
        clock = time.monotonic_ns
        _wait_go(sh, idx)
        while not stop.value and answered < quota:
            room = backlog - (sum(produced_slot) - sum(consumed))
            for c in conns:
                while c.inflight < depth and sent < quota and room > 0:
                    body = b"%d" % clock()
                    c.out.append(b"%s$%d\r\n%s\r\n%s" % (head, len(body), body, tail))
                    c.inflight += 1
                    sent += 1
                    room -= 1
                c.flush()
            for key, _ in sel.select(timeout=0.002):
                c = key.data
                data = c.sock.recv(1 << 16)
                if not data:
                    raise ConnectionError("server closed a producer connection")
                c.reader.feed(data)
                while (r := c.reader.gets()) is not False:
                    c.inflight -= 1
                    answered += 1
                    if isinstance(r, hiredis.ReplyError) and len(errors) < 5:
                        errors.append(str(r))
            produced_slot[idx] = answered
        out["produced"] = answered
        for c in conns:
            c.sock.close()
    except Exception as exc:  # report, never hang the parent
        out["errors"].append(f"producer {idx}: {exc!r}")
    results.put(out)


def _consumer(cfg: E2EConfig, sh: _Shared, idx: int, slot: int, nconns: int,
              results: Any) -> None:
    out: dict[str, Any] = {"role": "consumer", "consumed": 0, "acked": 0, "errors": [],
                           "last_ns": 0, "lat": b""}
    try:
        disque = cfg.flavor == "disque"
        depth = cfg.depth
        # Unpipelined means one request at a time on each connection: GETJOB, wait, ACKJOB,
        # wait, GETJOB. With a window, an ACKJOB sent behind queued GETJOBs would wait for them
        # to be served (or to time out, if the queue is momentarily empty), so the acks of a
        # process go out pipelined on one connection of their own, taken from the budget.
        strict = disque and depth == 1
        ack_conn: _Conn | None = None
        if disque and not strict and nconns > 1:
            nconns -= 1
            ack_conn = _Conn(cfg.consumer_port, cfg.time_limit + 10)
        sel, conns = _connect(cfg, nconns, cfg.consumer_port)
        if ack_conn is not None:
            sel.register(ack_conn.sock, selectors.EVENT_READ, ack_conn)
        q = cfg.queue.encode()
        if disque:
            get = encode("GETJOB", "TIMEOUT", 1000, "FROM", q)
            ack_head = b"*2\r\n$6\r\nACKJOB\r\n"
        else:
            get = encode("BRPOP", q, 1)
            ack_head = b""
        consumed = 0
        acked = 0
        last_ns = 0
        lat = array("q")
        errors: list[str] = out["errors"]
        stop = sh.stop
        clock = time.monotonic_ns
        _wait_go(sh, slot)
        for c in conns:
            c.out.append(get * depth)
            c.flush()
        while not stop.value:
            for key, _ in sel.select(timeout=0.005):
                c = key.data
                data = c.sock.recv(1 << 16)
                if not data:
                    raise ConnectionError("server closed a consumer connection")
                c.reader.feed(data)
                acks = ack_conn or c
                while (r := c.reader.gets()) is not False:
                    if isinstance(r, int):  # ACKJOB's reply
                        if r == 1:
                            acked += 1
                            last_ns = clock()
                        if strict:
                            c.out.append(get)
                        continue
                    if isinstance(r, hiredis.ReplyError):
                        if len(errors) < 5:
                            errors.append(str(r))
                        if c is not ack_conn:
                            c.out.append(get)
                        continue
                    if r is None:  # GETJOB/BRPOP timed out: ask again
                        c.out.append(get)
                        continue
                    now = clock()
                    if disque:
                        _queue, jid, body = r[0][:3]
                        acks.out.append(b"%s$%d\r\n%s\r\n" % (ack_head, len(jid), jid))
                    else:
                        body = r[1]
                        acked += 1
                        last_ns = now
                    consumed += 1
                    lat.append(now - int(body))
                    if not strict:
                        c.out.append(get)
                c.flush()
            if ack_conn is not None:
                ack_conn.flush()
            sh.consumed[idx] = consumed
            sh.acked[idx] = acked
        out.update(consumed=consumed, acked=acked, last_ns=last_ns, lat=lat.tobytes())
        for c in conns:
            c.sock.close()
        if ack_conn is not None:
            ack_conn.sock.close()
    except Exception as exc:
        out["errors"].append(f"consumer {idx}: {exc!r}")
    results.put(out)


def _percentile(sorted_ns: array, p: float) -> float | None:
    if not sorted_ns:
        return None
    i = min(len(sorted_ns) - 1, max(0, round(p / 100.0 * len(sorted_ns)) - 1))
    return sorted_ns[i] / 1e6


def run_e2e(cfg: E2EConfig) -> E2EResult:
    """Run one bounded produce -> consume (-> ack) load and return what it measured."""
    ctx = mp.get_context("spawn")
    sh = _Shared(cfg)
    results = ctx.Queue()
    res = E2EResult(flavor=cfg.flavor, depth=cfg.depth, jobs_target=cfg.jobs)
    half = cfg.connections // 2
    pconns = _split(half, cfg.producer_procs)
    cconns = _split(cfg.connections - half, cfg.consumer_procs)
    quotas = _split(cfg.jobs, cfg.producer_procs)
    procs: list[Any] = []
    for i in range(cfg.producer_procs):
        procs.append(ctx.Process(target=_producer, args=(cfg, sh, i, pconns[i], quotas[i],
                                                         results), daemon=True))
    for i in range(cfg.consumer_procs):
        procs.append(ctx.Process(target=_consumer, args=(cfg, sh, i, cfg.producer_procs + i,
                                                         cconns[i], results), daemon=True))
    outs: list[dict[str, Any]] = []
    try:
        for p in procs:
            p.start()
        deadline = time.monotonic() + 30
        while not all(sh.ready) and time.monotonic() < deadline:
            if any(p.exitcode is not None for p in procs):
                break
            time.sleep(0.005)
        t0 = time.monotonic_ns()
        sh.go.value = 1
        limit = t0 + int(cfg.time_limit * 1e9)
        while time.monotonic_ns() < limit:
            if sum(sh.acked) >= cfg.jobs or all(p.exitcode is not None for p in procs):
                break
            time.sleep(0.01)
        else:
            res.time_limited = True
        t_end = time.monotonic_ns()
    finally:
        # Workers exit only once their result is read off the queue, so collect while waiting,
        # whether the run ended or was interrupted; then make sure nothing outlives us.
        sh.stop.value = 1
        collect_deadline = time.monotonic() + 15
        while len(outs) < len(procs) and time.monotonic() < collect_deadline:
            try:
                outs.append(results.get(timeout=0.2))
            except queue.Empty:
                if all(p.exitcode is not None for p in procs):
                    break
        for p in procs:
            p.join(timeout=2)
            if p.is_alive():
                p.terminate()
                p.join(timeout=5)
    lat = array("q")
    last_ns = 0
    for o in outs:
        res.errors.extend(o["errors"])
        if o["role"] == "producer":
            res.produced += o["produced"]
        else:
            res.consumed += o["consumed"]
            res.acked += o["acked"]
            last_ns = max(last_ns, o["last_ns"])
            chunk = array("q")
            chunk.frombytes(o["lat"])
            lat.extend(chunk)
    if len(outs) < len(procs):
        res.errors.append(f"only {len(outs)} of {len(procs)} workers reported")
    end = last_ns if last_ns else t_end
    res.elapsed_s = max(1e-9, (end - t0) / 1e9)
    res.jobs_per_s = res.acked / res.elapsed_s
    srt = array("q", sorted(lat))
    res.p50_ms = _percentile(srt, 50)
    res.p99_ms = _percentile(srt, 99)
    return res


def main(argv: list[str] | None = None) -> int:
    """Ad-hoc runs against an already running server: `python -m benchmarks.loadgen -p 7711`."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-p", "--port", type=int, default=7711)
    ap.add_argument("--flavor", choices=["disque", "redis"], default="disque")
    ap.add_argument("-P", "--depth", type=int, default=1)
    ap.add_argument("-n", "--jobs", type=int, default=100_000)
    ap.add_argument("-c", "--connections", type=int, default=50)
    ap.add_argument("--procs", type=int, default=min(4, max(2, os.cpu_count() or 2)))
    ap.add_argument("--time-limit", type=float, default=20.0)
    ap.add_argument("--queue", default="e2e")
    ap.add_argument("--max-backlog", type=int, default=0)
    ap.add_argument("--consume-port", type=int, default=0,
                    help="consumers use this node (another node of the producers' cluster)")
    ap.add_argument("--add-args", default="",
                    help="extra ADDJOB options, space-separated, e.g. 'REPLICATE 3 ASYNC'")
    a = ap.parse_args(argv)
    cfg = E2EConfig(port=a.port, flavor=a.flavor, depth=a.depth, jobs=a.jobs,
                    connections=a.connections, procs=a.procs, time_limit=a.time_limit,
                    queue=a.queue, max_backlog=a.max_backlog, consume_port=a.consume_port,
                    add_args=tuple(a.add_args.split()))
    json.dump(run_e2e(cfg).as_dict(), sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
