"""`make bench`'s overflow scenario (`python -m benchmarks.run --only overflow`): a backlog
larger than memory (issue 22).

A fresh node with `maxmemory` (default 128mb; --quick 32mb) and `overflow yes` gets `jobs`
jobs of 100 bytes (default 5,000,000; --quick 1,000,000) and no consumer: PRODUCERS
processes, each one connection pipelining PIPELINE ADDJOBs to its own queue, every body
starting with its sequence number. The node's RSS is sampled every 100 ms throughout (the
peak is reported against maxmemory); INFO's overflow fields at the end of the produce phase
give the bytes on disk per job. Then the backlog is drained, one consumer per queue (GETJOB
NOHANG COUNT 64 then ACKJOB of what it got): every job must come back once, in its queue's
order (`order_errors`, `missing`, `duplicates` are 0 when it does).

Then (`scenario_overflow_cluster`) three nodes with overflow on against three without: REPLICATE
3 from node 0, whose copies on the two others overflow too, node 2 killed -9 halfway and started
again (the second half is produced while it refills); every acknowledged job must come out of
the cluster.

The reference, in the same run: a fresh node without overflow and with room for everything
gets `base_jobs` jobs the same way (default 1,000,000; --quick 200,000), then drained the same
way. The issue's targets, printed PASS / MISS: produce rate while overflowing >= 0.5x the
in-memory one, drain rate >= 0.5x, 0 errors, peak RSS <= 1.2x maxmemory. The p99 of an ADDJOB
is the p99 of a pipeline's round trip (PIPELINE requests sent together, the last reply back).
"""

from __future__ import annotations

import multiprocessing
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import hiredis

from benchmarks.loadgen import Client, encode

PRODUCERS = 2
PIPELINE = 16
BODY_LEN = 100
GET_COUNT = 64


def _body(seq: int) -> bytes:
    head = b"%012d" % seq
    return head + b"." * (BODY_LEN - len(head))


def _produce(port: int, queue: str, n: int, opts: tuple[bytes, ...], first: int,
             result: Any) -> None:
    """One producer process: n ADDJOBs (sequence numbers from `first`, more ADDJOB options
    `opts`), PIPELINE at a time; puts (ok, errors, seconds, batch round trips in ns, the
    sequence numbers acknowledged) on `result`."""
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    reader = hiredis.Reader()
    ok = errors = 0
    lat: list[int] = []
    t0 = time.perf_counter()
    acked: list[int] = []
    seq = first
    end = first + n
    q = queue.encode()
    while seq < end:
        k = min(PIPELINE, end - seq)
        payload = b"".join(encode(b"ADDJOB", q, _body(seq + i), b"5000", *opts)
                           for i in range(k))
        sent = time.perf_counter_ns()
        sock.sendall(payload)
        got = 0
        while got < k:
            reply = reader.gets()
            if reply is False:
                data = sock.recv(1 << 16)
                if not data:
                    raise ConnectionError("server closed the connection")
                reader.feed(data)
                continue
            if isinstance(reply, hiredis.ReplyError):
                errors += 1
            else:
                ok += 1
                acked.append(seq + got)
            got += 1
        lat.append(time.perf_counter_ns() - sent)
        seq += k
    result.put((ok, errors, time.perf_counter() - t0, lat, acked))
    sock.close()


def _drain(port: int, queue: str, expect: int, result: Any) -> None:
    """One consumer process: GETJOB + ACKJOB until the queue is empty; checks the order."""
    c = Client(port)
    nxt = 0
    order_errors = duplicates = got = 0
    seen: set[int] = set()
    t0 = time.perf_counter()
    while True:
        jobs = c.call("GETJOB", "NOHANG", "COUNT", GET_COUNT, "FROM", queue)
        if not jobs:
            break
        for j in jobs:
            seq = int(j[2][:12])
            if seq in seen:
                duplicates += 1
            seen.add(seq)
            if seq != nxt:
                order_errors += 1
            nxt = seq + 1
        got += len(jobs)
        c.call("ACKJOB", *[j[1] for j in jobs])
    seconds = time.perf_counter() - t0
    result.put((got, order_errors, duplicates, expect - len(seen), seconds))
    c.close()


def _rss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


class _RssWatch:
    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.wait(0.1):
            self.peak = max(self.peak, _rss(self.pid))

    def done(self) -> int:
        self.stop.set()
        self.thread.join()
        return self.peak


def _phase(target: Callable[..., None], argsets: list[tuple[Any, ...]]) -> list[Any]:
    ctx = multiprocessing.get_context("fork")
    result = ctx.Queue()
    procs = [ctx.Process(target=target, args=(*a, result)) for a in argsets]
    for p in procs:
        p.start()
    out = [result.get() for _ in procs]
    for p in procs:
        p.join()
    return out


def _load(port: int, jobs: int, tag: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """Produce then drain `jobs` on the node at `port`: the two phases' figures."""
    queues = [f"{tag}{i}" for i in range(PRODUCERS)]
    share = [jobs // PRODUCERS + (1 if i < jobs % PRODUCERS else 0) for i in range(PRODUCERS)]
    t0 = time.perf_counter()
    prod = _phase(_produce, [(port, q, n, (), 0) for q, n in zip(queues, share, strict=True)])
    wall = time.perf_counter() - t0
    lat = sorted(x for r in prod for x in r[3])
    produced = {
        "ok": sum(r[0] for r in prod), "errors": sum(r[1] for r in prod),
        "rate": sum(r[0] + r[1] for r in prod) / wall,
        "p50_ms": lat[len(lat) // 2] / 1e6 if lat else None,
        "p99_ms": lat[min(len(lat) - 1, len(lat) * 99 // 100)] / 1e6 if lat else None,
        "max_ms": lat[-1] / 1e6 if lat else None,
    }
    with Client(port) as c:
        produced["info"] = c.info("jobs")
    t0 = time.perf_counter()
    drained = _phase(_drain, [(port, q, n) for q, n in zip(queues, share, strict=True)])
    wall = time.perf_counter() - t0
    got = sum(r[0] for r in drained)
    return produced, {
        "jobs": got, "rate": got / wall,
        "order_errors": sum(r[1] for r in drained), "duplicates": sum(r[2] for r in drained),
        "missing": sum(r[3] for r in drained),
    }


def scenario_overflow(workdir: Path, cpus: set[int] | None, say: Callable[[str], None],
                      quick: bool, jobs: int | None = None) -> dict[str, Any]:
    from benchmarks.run import disque_server

    maxmemory = (32 if quick else 128) * 1024 * 1024
    jobs = jobs or (1_000_000 if quick else 5_000_000)
    base_jobs = min(jobs, 200_000 if quick else 1_000_000)
    out: dict[str, Any] = {"maxmemory": maxmemory, "jobs": jobs, "base_jobs": base_jobs}
    say(f"overflow: in-memory reference, {base_jobs:,} jobs")
    server = disque_server(workdir, cpus).start()
    try:
        out["memory_produce"], out["memory_drain"] = _load(server.port, base_jobs, "m")
    finally:
        server.stop()
    say(f"overflow: {jobs:,} jobs into maxmemory {maxmemory >> 20} MB with overflow")
    server = disque_server(workdir, cpus, extra=[
        "--maxmemory", str(maxmemory), "--overflow", "yes"]).start()
    try:
        assert server.proc is not None
        watch = _RssWatch(server.proc.pid)
        try:
            out["overflow_produce"], out["overflow_drain"] = _load(server.port, jobs, "o")
        finally:
            out["peak_rss"] = watch.done()
    finally:
        server.stop()
    info = out["overflow_produce"].pop("info")
    on_disk = int(info.get("overflow_jobs", 0))
    out["on_disk_at_end"] = on_disk
    out["file_bytes"] = int(info.get("overflow_file_bytes", 0))
    out["disk_bytes_per_job"] = out["file_bytes"] / on_disk if on_disk else None
    out["memory_produce"].pop("info", None)
    return out


def _drain_cluster(ports: list[int], queue: str,
                   stall_s: float = 15.0) -> tuple[list[int], float]:
    """GETJOB + ACKJOB on every node in turn until every node is empty for a while: the
    sequence numbers delivered (duplicates included) and the seconds until the last one."""
    clients = [Client(p) for p in ports]
    seqs: list[int] = []
    t0 = idle_since = time.monotonic()
    last = t0
    while time.monotonic() - idle_since < stall_s:
        got_any = False
        for c in clients:
            jobs = c.call("GETJOB", "NOHANG", "COUNT", GET_COUNT, "FROM", queue)
            if jobs:
                got_any = True
                seqs += [int(j[2][:12]) for j in jobs]
                c.call("ACKJOB", *[j[1] for j in jobs])
        if got_any:
            idle_since = last = time.monotonic()
        else:
            time.sleep(0.1)
    for c in clients:
        c.close()
    return seqs, last - t0


def _rate(r: Any, wall: float) -> dict[str, Any]:
    """One _produce result as a row: acknowledged, refused, rate, p99 of a pipeline."""
    lat = sorted(r[3])
    return {"acked": r[0], "refused": r[1], "rate": (r[0] + r[1]) / wall,
            "p99_ms": lat[min(len(lat) - 1, len(lat) * 99 // 100)] / 1e6 if lat else None}


def scenario_overflow_cluster(workdir: Path, cpus: set[int] | None,
                              say: Callable[[str], None], quick: bool,
                              jobs: int | None = None) -> dict[str, Any]:
    """3 nodes, REPLICATE 3 from node 0. The reference: the same cluster without overflow and
    with room for everything gets `ref` jobs. Then 3 nodes with overflow (the copies on 1 and
    2 overflow too) get half the jobs; node 2 is killed -9 and started again 3 s later (no AOF:
    it comes back empty, re-replication refills it) and the other half is produced while it
    refills; then every node is drained. Every acknowledged job must be delivered (at least
    once: a requeue may deliver one twice). With REPLICATE 3 on 3 nodes no job can be
    acknowledged while a node is down (NOREPL once it is flagged, the 5 s timeout before, as
    the original), so nothing is produced then."""
    from benchmarks.run import start_cluster

    maxmemory = (32 if quick else 64) * 1024 * 1024
    jobs = jobs or (200_000 if quick else 1_000_000)
    ref = min(jobs, 100_000 if quick else 300_000)
    opts = (b"REPLICATE", b"3", b"RETRY", b"300")
    out: dict[str, Any] = {"maxmemory": maxmemory, "jobs": jobs, "ref_jobs": ref}
    say(f"overflow cluster: in-memory reference, {ref:,} jobs")
    servers = start_cluster(workdir, cpus, 3)
    try:
        t0 = time.perf_counter()
        [r] = _phase(_produce, [(servers[0].port, "c", ref, opts, 0)])
        out["reference"] = _rate(r, time.perf_counter() - t0)
        seqs, seconds = _drain_cluster([s.port for s in servers], "c", 3.0)
        out["reference_drain"] = {"delivered": len(seqs),
                                  "rate": len(seqs) / max(seconds, 1e-9)}
    finally:
        for srv in servers:
            srv.stop()
    say(f"overflow cluster: {jobs:,} jobs, maxmemory {maxmemory >> 20} MB each, with overflow")
    servers = start_cluster(workdir, cpus, 3, extra=[
        "--maxmemory", str(maxmemory), "--overflow", "yes"])
    try:
        half = jobs // 2
        t0 = time.perf_counter()
        [r1] = _phase(_produce, [(servers[0].port, "c", half, opts, 0)])
        out["before"] = _rate(r1, time.perf_counter() - t0)
        with Client(servers[1].port) as c:
            out["info_node1"] = c.info("jobs")
        say("overflow cluster: kill -9 of node 2, started again 3 s later")
        victim = servers[2]
        assert victim.proc is not None
        victim.proc.kill()
        victim.proc.wait()
        time.sleep(3)
        victim.start()
        t0 = time.perf_counter()
        [r2] = _phase(_produce, [(servers[0].port, "c", jobs - half, opts, half)])
        out["after"] = _rate(r2, time.perf_counter() - t0)
        acked = r1[4] + r2[4]
        with Client(servers[0].port) as c:
            out["info_node0"] = c.info("jobs")
        with Client(servers[2].port) as c:
            out["info_node2"] = c.info("jobs")
        seqs, seconds = _drain_cluster([s.port for s in servers], "c")
        delivered = set(seqs)
        out["drain"] = {"delivered": len(delivered), "duplicates": len(seqs) - len(delivered),
                        "lost": len(set(acked) - delivered), "acked": len(acked),
                        "rate": len(seqs) / max(seconds, 1e-9)}
    finally:
        for srv in servers:
            srv.stop()
    return out


def print_overflow_cluster(res: dict[str, Any], say: Callable[[str], None]) -> None:
    ref, d = res["reference"], res["drain"]
    say("")
    say(f"overflow, 3 nodes (issue 22): {res['jobs']:,} ADDJOB REPLICATE 3 to node 0, maxmemory "
        f"{res['maxmemory'] >> 20} MB each, kill -9 of node 2 halfway; in memory: "
        f"{res['ref_jobs']:,} jobs")
    say(f"  in memory           {ref['rate']:>9,.0f}/s  p99 {ref['p99_ms']:.2f} ms")
    for k, what in (("before", "overflowing"), ("after", "node 2 refilling")):
        p = res[k]
        say(f"  {what:<19} {p['rate']:>9,.0f}/s  ratio {p['rate'] / ref['rate']:.2f}  "
            f"p99 {p['p99_ms']:.2f} ms  refused {p['refused']:,}")
    for k in ("info_node0", "info_node1", "info_node2"):
        i = res[k]
        say(f"  {k[5:]}: jobs {int(i.get('registered_jobs', 0)):,}, on disk "
            f"{int(i.get('overflow_jobs', 0)):,}")
    rd = res["reference_drain"]
    say(f"  drain    in memory {rd['rate']:,.0f}/s  overflowing {d['rate']:,.0f}/s  ratio "
        f"{d['rate'] / rd['rate']:.2f}  delivered {d['delivered']:,} of {d['acked']:,} "
        f"acknowledged  duplicates {d['duplicates']:,}  lost {d['lost']:,}")
    say(f"  {'PASS' if d['lost'] == 0 else 'MISS'} no acknowledged job lost")
    ok = res["before"]["rate"] >= 0.5 * ref["rate"]
    say(f"  {'PASS' if ok else 'MISS'} overflowing >= 0.5x in memory")


def print_overflow(res: dict[str, Any], say: Callable[[str], None]) -> None:
    mp, md = res["memory_produce"], res["memory_drain"]
    op, od = res["overflow_produce"], res["overflow_drain"]
    say("")
    say(f"overflow (issue 22): {res['jobs']:,} jobs of {BODY_LEN} B, maxmemory "
        f"{res['maxmemory'] >> 20} MB; in memory: {res['base_jobs']:,} jobs")
    say(f"  produce  in memory {mp['rate']:,.0f}/s  overflowing {op['rate']:,.0f}/s  "
        f"ratio {op['rate'] / mp['rate']:.2f}  errors {op['errors']}  "
        f"p99 {op['p99_ms']:.2f} ms (in memory {mp['p99_ms']:.2f})  max {op['max_ms']:.1f} ms")
    say(f"  drain    in memory {md['rate']:,.0f}/s  overflowing {od['rate']:,.0f}/s  "
        f"ratio {od['rate'] / md['rate']:.2f}  delivered {od['jobs']:,}  order errors "
        f"{od['order_errors']}  duplicates {od['duplicates']}  missing {od['missing']}")
    rss = res["peak_rss"]
    say(f"  peak RSS {rss / 2**20:.1f} MB = {rss / res['maxmemory']:.2f}x maxmemory; on disk at "
        f"the end of produce {res['on_disk_at_end']:,} jobs, file "
        f"{res['file_bytes'] / 2**20:.1f} MB = "
        + (f"{res['disk_bytes_per_job']:.0f} B per job ({BODY_LEN} B body)"
           if res["disk_bytes_per_job"] else "n/a"))
    checks = [
        ("produce >= 0.5x in memory", op["rate"] >= 0.5 * mp["rate"]),
        ("drain >= 0.5x in memory", od["rate"] >= 0.5 * md["rate"]),
        ("0 errors", op["errors"] == 0),
        ("every job once, in order", od["order_errors"] == 0 and od["duplicates"] == 0
         and od["missing"] == 0),
        ("peak RSS <= 1.2x maxmemory", rss <= 1.2 * res["maxmemory"]),
    ]
    for name, ok in checks:
        say(f"  {'PASS' if ok else 'MISS'} {name}")
