"""`make bench`: disque-py against redis-server as a queue, same loads, same run, same machine.

Scenarios (pick with `--only`):

- addjob: redis-benchmark, 50 connections, `ADDJOB q body 0` vs `LPUSH q body`, unpipelined
  and `-P 16`.
- getjob: the queue is filled with `-n` jobs first, then `GETJOB NOHANG FROM q` vs `RPOP q`
  with `-P 16`, so every request takes a job.
- e2e: our multi-process generator (loadgen.py): producers ADDJOB, consumers GETJOB + ACKJOB,
  against LPUSH / BRPOP, unpipelined and 16 in flight per connection.
- cluster: 3 fresh disque-py nodes joined with CLUSTER MEET: `ADDJOB ... REPLICATE 3` sync
  and ASYNC, and REPLICATE 2, from 50 connections spread over the nodes (one
  redis-benchmark per node, run in parallel), and produce-on-one-node / consume-on-another (GETJOB + ACKJOB) with loadgen.py,
  so every job crosses the cluster bus. There is no redis-server equivalent. Then a soak
  row, disque-py only: produce on one node / consume on another for `--soak-jobs` jobs
  (default 300000, quick 150000: past the 100,000 IDs of acked jobs a node remembers), with
  each node's RSS growth per acked job in its note: a cost or a memory that grows with the
  jobs a node has seen, not with those it holds, shows here and in no short row.
- sizes: `ADDJOB ... REPLICATE 3` from 20 connections spread over every node of fresh
  clusters of 3, 10 and 20 nodes (the cost of a larger cluster), each node's CPU per job in
  the note. The cluster rows print each node's CPU per job too (user + sys from /proc).
- restart: a node of 3 killed and restarted, ms until both peers see it again (benchmarks/restart.py).
- downnode: ADDJOB REPLICATE 2 (3 nodes) and REPLICATE 3 (5 nodes) against node 0 while the
  last node is killed -9 and restarted: rate and p99 before, during, after
  (benchmarks/downnode.py).
- memory: a fresh node gets `--jobs-for-memory` jobs with 16-byte bodies; the growth of INFO
  `used_memory` and `used_memory_rss` over the empty node, per job (and the same for a fresh
  redis-server list, for scale).
- overflow: a backlog 5x larger than maxmemory with `overflow yes`, produced then drained
  in order, against the same load in memory; then 3 nodes, REPLICATE 3, with a kill -9 and
  restart halfway, against the same 3 nodes in memory (benchmarks/overflow.py).
- spark: rows/s of `disque.spark.write_jobs`, the `disque` data source and the plain client's
  pipelined add_jobs from a local[2] Spark job into 3 fresh nodes, REPLICATE 1 and 3
  (benchmarks/spark_bench.py).

`--disque-cmd PATH` adds the original C Disque server (antirez/disque's disque-server) as a
reference column: the ping, addjob, getjob, e2e and memory loads also run against one original
node, and the cluster loads against three original nodes, started only after the disque-py
nodes were stopped (never two clusters at once). disque-py is always the server under test.

All servers are started here on free loopback ports and always stopped, even on errors or
Ctrl-C. The issue's targets are ratios to redis-server in the same run; each is printed as
PASS or MISS. A MISS never fails the run: the exit status is non-zero only when the harness
itself could not do its job (a server that does not start, a crash in this code).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import platform
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.loadgen import Client, E2EConfig, E2EResult, run_e2e
from disque.tools.ports import free_port  # noqa: F401 - also used by benchmarks.aof

REPO = Path(__file__).resolve().parent.parent
SCENARIOS = ("ping", "addjob", "getjob", "e2e", "cluster", "sizes", "restart", "downnode",
             "memory", "spark", "aof", "tls", "overflow")
BODY16 = "0123456789abcdef"


# -- servers ------------------------------------------------------------------------------



def _child_setup(cpus: set[int] | None) -> Callable[[], None]:
    """Runs in the forked server before exec: die with the harness, optionally pin CPUs."""
    def setup() -> None:
        with contextlib.suppress(Exception):
            libc = ctypes.CDLL("libc.so.6", use_errno=True)
            libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: no orphans if we are killed
        if cpus:
            os.sched_setaffinity(0, cpus)
    return setup


class Server:
    """One server process we own: started on a free port, waited for, always stopped."""

    def __init__(self, name: str, cmd: list[str], port: int, workdir: Path,
                 cpus: set[int] | None = None) -> None:
        self.name = name
        self.cmd = cmd
        self.port = port
        self.workdir = workdir
        self.cpus = cpus
        self.log = workdir / f"{name}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 30.0, poll: float = 0.05) -> Server:
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(self.cmd, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, cwd=str(REPO), env=env,
                                         start_new_session=True,
                                         preexec_fn=_child_setup(self.cpus))
        deadline = time.monotonic() + timeout
        last: Exception | None = None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode} at start:\n"
                                   f"{self.log_tail()}")
            try:
                with Client(self.port, timeout=2) as c:
                    if c.call("PING") in (b"PONG", "PONG"):
                        return self
            except (OSError, RuntimeError) as exc:
                last = exc
            time.sleep(poll)
        raise RuntimeError(f"{self.name} did not answer PING on port {self.port} within "
                           f"{timeout}s (last error {last!r}):\n{self.log_tail()}")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)


DISQUE_CMD = [sys.executable, "-m", "disque"]


def disque_server(workdir: Path, cpus: set[int] | None, cmd: list[str] | None = None,
                  flavor: str = "disque", extra: list[str] | None = None) -> Server:
    """A disque-py node, or with `cmd` the original disque-server (flavor "original"): both
    take the same --port / --dir / --maxmemory options; `extra`: more options."""
    port = free_port()
    d = workdir / f"{flavor}-{port}"
    d.mkdir(parents=True)
    argv = [*(cmd or DISQUE_CMD), "--port", str(port), "--dir", str(d), "--maxmemory", "4gb",
            *(extra or [])]
    return Server(flavor, argv, port, d, cpus)


def redis_server(workdir: Path, cpus: set[int] | None) -> Server:
    port = free_port()
    d = workdir / f"redis-{port}"
    d.mkdir(parents=True)
    exe = shutil.which("redis-server") or "redis-server"
    cmd = [exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
           "--dir", str(d), "--daemonize", "no"]
    return Server("redis", cmd, port, d, cpus)


# -- redis-benchmark ----------------------------------------------------------------------

@dataclass(slots=True)
class Load:
    """One measured load on one server."""
    rps: float | None = None
    p50_ms: float | None = None
    p99_ms: float | None = None
    seconds: float = 0.0
    partial: bool = False  # hit the time limit; rps is the running average so far
    error: str | None = None
    note: str | None = None
    # CPU (user + sys, /proc) per request of each server under the load, in microseconds
    cpu_us: list[float] | None = None

    @property
    def ok(self) -> bool:
        return self.rps is not None and self.error is None


_THROUGHPUT = re.compile(rb"throughput summary:\s*([\d.]+) requests per second")
_OVERALL = re.compile(rb"overall:\s*([\d.]+)\)")


def parse_redis_benchmark(out: bytes) -> Load:
    """Parse redis-benchmark 7's full output: the summary, or the last progress line."""
    load = Load()
    if m := _THROUGHPUT.search(out):
        load.rps = float(m.group(1))
        lines = out.replace(b"\r", b"\n").splitlines()
        for i, line in enumerate(lines):
            if b"latency summary" in line and i + 2 < len(lines):
                names = lines[i + 1].split()
                values = lines[i + 2].split()
                stats = dict(zip(names, values, strict=False))
                with contextlib.suppress(KeyError, ValueError):
                    load.p50_ms = float(stats[b"p50"])
                    load.p99_ms = float(stats[b"p99"])
                break
    elif progress := _OVERALL.findall(out):
        load.rps = float(progress[-1])
        load.partial = True
    return load


def _redis_benchmark_cmd(port: int, command: list[str], n: int, pipeline: int,
                         clients: int, tls: list[str] | None = None) -> list[str]:
    exe = shutil.which("redis-benchmark") or "redis-benchmark"
    return [exe, "-h", "127.0.0.1", "-p", str(port), "-c", str(clients), "-n", str(n),
            "-P", str(pipeline), *(tls or []), *command]


def redis_benchmark(port: int, command: list[str], n: int, pipeline: int, clients: int,
                    time_limit: float, tls: list[str] | None = None) -> Load:
    """One redis-benchmark run; `tls`: its TLS options (--tls --cacert ...)."""
    cmd = _redis_benchmark_cmd(port, command, n, pipeline, clients, tls)
    t0 = time.monotonic()
    try:
        cp = subprocess.run(cmd, capture_output=True, timeout=time_limit, check=False)
        out, err, rc = cp.stdout, cp.stderr, cp.returncode
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout or b""
        err = exc.stderr or b""
        rc = None
    load = parse_redis_benchmark(out)
    load.seconds = time.monotonic() - t0
    if rc is None:
        load.partial = True
        load.note = f"stopped at the {time_limit:.0f}s time limit"
    elif rc != 0:
        msg = err.decode(errors="replace").strip().splitlines()
        load.error = f"redis-benchmark exit {rc}: " + (msg[-1] if msg else "")
    if load.rps is None and load.error is None:
        load.error = "no throughput in redis-benchmark output"
    return load


# -- scenarios ----------------------------------------------------------------------------

def _rate_ratio(ours: Load, theirs: Load | None) -> float | None:
    if theirs is not None and ours.ok and theirs.ok and theirs.rps:
        return (ours.rps or 0.0) / theirs.rps
    return None


@dataclass(slots=True)
class Row:
    """One line of the table: the same load on disque-py, on redis and (with --disque-cmd)
    on the original Disque."""
    key: str
    label: str
    disque: Load = field(default_factory=Load)
    redis: Load = field(default_factory=Load)
    original: Load | None = None

    @property
    def ratio(self) -> float | None:
        return _rate_ratio(self.disque, self.redis)

    @property
    def original_ratio(self) -> float | None:
        return _rate_ratio(self.disque, self.original)


# The servers of one single-node run, in the order they are measured: (flavor, server),
# server None when it did not start. "original" speaks disque's commands.
Lineup = list[tuple[str, Server | None]]


@dataclass(slots=True)
class Options:
    n: int
    clients: int
    time_limit: float
    e2e_jobs: int
    e2e_time_limit: float
    e2e_procs: int
    memory_jobs: int
    cluster_n: int = 30_000
    cluster_e2e_jobs: int = 20_000
    n_pipelined: int = 1_000_000
    soak_jobs: int = 300_000

    def requests(self, pipeline: int) -> int:
        """Requests per load: pipelined loads get more, so redis-server's run lasts about a
        second instead of a fifth (a 0.2 s run measured connection set-up as much as LPUSH,
        and swung by 30% run to run). Both servers always get the same count."""
        return self.n_pipelined if pipeline > 1 else self.n


def _qlen(port: int, flavor: str, queue: str) -> int:
    with Client(port) as c:
        return int(c.call("LLEN", queue) if flavor == "redis" else c.call("QLEN", queue))


def _counted(server: Server | None, flavor: str, queue: str, expect: int, command: list[str],
             pipeline: int, o: Options) -> Load:
    """redis-benchmark a command that should add (expect > 0) or take (expect < 0) one job per
    request, and check it did: redis-benchmark counts error replies as answers, so the queue
    length is the only proof."""
    if server is None or not server.alive():
        return Load(error=f"{flavor} server not running")
    try:
        before = _qlen(server.port, flavor, queue)
        load = redis_benchmark(server.port, command, abs(expect), pipeline, o.clients,
                               o.time_limit)
        after = _qlen(server.port, flavor, queue)
    except (OSError, RuntimeError) as exc:
        return Load(error=f"{exc!r}")
    moved = after - before
    if load.error is None and not load.partial and abs(moved) < abs(expect) * 0.99:
        load.note = f"only {abs(moved)} of {abs(expect)} requests moved a job"
    return load


def _say(msg: str) -> None:
    print(msg, flush=True)


def _fmt_rate(x: float | None) -> str:
    return "-" if x is None else f"{x:,.0f}"


def _fmt_lat(load: Load) -> str:
    if load.p50_ms is None:
        return "-"
    p99 = "-" if load.p99_ms is None else f"{load.p99_ms:.2f}"
    return f"{load.p50_ms:.2f}/{p99}"


def _report(label: str, flavor: str, load: Load) -> None:
    extra = ""
    if load.error:
        extra = f"  ERROR {load.error}"
    elif load.note:
        extra = f"  ({load.note})"
    _say(f"  {label:<27} {flavor:<8} {_fmt_rate(load.rps):>12}/s  p50/p99 {_fmt_lat(load)} ms"
         f"  [{load.seconds:.1f}s]{extra}")


def _set_load(row: Row, flavor: str, load: Load) -> None:
    setattr(row, flavor, load)
    _report(row.label, flavor, load)


def scenario_addjob(lineup: Lineup, o: Options) -> list[Row]:
    rows = []
    for p in (1, 16):
        row = Row(f"addjob_p{p}", f"ADDJOB vs LPUSH P{p}")
        q = f"add{p}"
        for flavor, server in lineup:
            cmd = ["LPUSH", q, "body"] if flavor == "redis" else ["ADDJOB", q, "body", "0"]
            _set_load(row, flavor, _counted(server, flavor, q, o.requests(p), cmd, p, o))
        rows.append(row)
    return rows


def scenario_ping(lineup: Lineup, o: Options) -> list[Row]:
    """PING on every server: the request path's ceiling (event loop, parsing, dispatch,
    reply, syscalls) with no command work at all. A ratio target above PING's own ratio
    cannot be met by making the command cheaper."""
    rows = []
    for p in (1, 16):
        row = Row(f"ping_p{p}", f"PING vs PING P{p} (ceiling)")
        for flavor, server in lineup:
            if server is None or not server.alive():
                load = Load(error=f"{flavor} server not running")
            else:
                load = redis_benchmark(server.port, ["PING"], o.requests(p), p, o.clients,
                                       o.time_limit)
            _set_load(row, flavor, load)
        rows.append(row)
    return rows


def scenario_getjob(lineup: Lineup, o: Options) -> list[Row]:
    row = Row("getjob_p16", "GETJOB NOHANG vs RPOP P16")
    q = "get16"
    for flavor, server in lineup:
        if flavor == "redis":
            fill, take = ["LPUSH", q, "body"], ["RPOP", q]
        else:
            fill, take = ["ADDJOB", q, "body", "0"], ["GETJOB", "NOHANG", "FROM", q]
        if server is None or not server.alive():
            _set_load(row, flavor, Load(error=f"{flavor} server not running"))
            continue
        n = o.requests(16)
        pre = _counted(server, flavor, q, n, fill, 16, o)
        if not pre.ok or pre.note or pre.partial:
            _set_load(row, flavor, Load(error=f"pre-fill failed: {pre.error or pre.note}"))
        else:
            _set_load(row, flavor, _counted(server, flavor, q, -n, take, 16, o))
    return [row]


def _e2e_load(res: E2EResult) -> Load:
    load = Load(rps=res.jobs_per_s, p50_ms=res.p50_ms, p99_ms=res.p99_ms,
                seconds=res.elapsed_s, partial=res.time_limited)
    if res.errors:
        load.error = "; ".join(res.errors[:3])
    if res.acked < res.jobs_target:
        load.note = f"{res.acked} of {res.jobs_target} jobs done"
    return load


def scenario_e2e(lineup: Lineup, o: Options) -> tuple[list[Row], dict[str, Any]]:
    rows = []
    raw: dict[str, Any] = {}
    for depth in (1, 16):
        row = Row(f"e2e_p{depth}", f"produce->consume P{depth}")
        for flavor, server in lineup:
            if server is None or not server.alive():
                setattr(row, flavor, Load(error=f"{flavor} server not running"))
            else:
                cfg = E2EConfig(port=server.port,
                                flavor="redis" if flavor == "redis" else "disque",
                                depth=depth, jobs=o.e2e_jobs, connections=o.clients,
                                procs=o.e2e_procs, time_limit=o.e2e_time_limit,
                                queue=f"e2e{depth}")
                res = run_e2e(cfg)
                raw[f"{row.key}_{flavor}"] = res.as_dict()
                setattr(row, flavor, _e2e_load(res))
            _report(row.label, flavor, getattr(row, flavor))
        rows.append(row)
    return rows, raw


# -- the 3-node cluster -------------------------------------------------------------------

CLUSTER_SIZE = 3


def _split(total: int, parts: int) -> list[int]:
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


def _reachable(port: int) -> int:
    with Client(port) as c:
        raw = c.call("CLUSTER", "INFO")
    text = raw.decode() if isinstance(raw, bytes) else str(raw)
    for line in text.splitlines():
        if line.startswith("cluster_reachable_nodes:"):
            return int(line.split(":", 1)[1])
    return -1


def start_cluster(workdir: Path, cpus: set[int] | None, size: int = CLUSTER_SIZE,
                  timeout: float = 30.0, cmd: list[str] | None = None,
                  flavor: str = "disque", extra: list[str] | None = None) -> list[Server]:
    """`size` fresh nodes (disque-py, or the original with `cmd`: both answer CLUSTER MEET
    and CLUSTER INFO's cluster_reachable_nodes); every node meets the first, gossip completes
    the mesh. Returns once every node sees size - 1 reachable nodes. The caller stops the
    servers."""
    servers: list[Server] = []
    try:
        for _ in range(size):  # started one by one: each picks its free port pair while free
            servers.append(disque_server(workdir, cpus, cmd, flavor, extra).start())
        for s in servers[1:]:
            with Client(s.port) as c:
                c.call("CLUSTER", "MEET", "127.0.0.1", servers[0].port)
        deadline = time.monotonic() + timeout
        while not all(_reachable(s.port) == size - 1 for s in servers):
            if time.monotonic() > deadline:
                raise RuntimeError(f"no full mesh of {size} nodes within {timeout}s")
            time.sleep(0.05)
    except BaseException:
        for s in servers:
            s.stop()
        raise
    return servers


def _flushall(servers: list[Server]) -> None:
    for s in servers:
        with Client(s.port) as c:
            c.call("DEBUG", "FLUSHALL")


def parallel_redis_benchmark(servers: list[Server], command: list[str], n: int, pipeline: int,
                             clients: int, time_limit: float) -> Load:
    """One redis-benchmark per node, all at once, `clients` connections and `n` requests
    split over them. Throughput: all requests over the wall time until the last finished
    (running averages summed if one hit the time limit); p50/p99: the worst node's."""
    procs = []
    cpu0 = [_cpu_seconds(s) for s in servers]
    t0 = time.monotonic()
    for s, c, k in zip(servers, _split(clients, len(servers)), _split(n, len(servers)),
                       strict=True):
        procs.append(subprocess.Popen(_redis_benchmark_cmd(s.port, command, k, pipeline, c),
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    loads: list[Load] = []
    for p in procs:
        try:
            out, err = p.communicate(timeout=max(0.1, time_limit - (time.monotonic() - t0)))
            rc: int | None = p.returncode
        except subprocess.TimeoutExpired:
            p.kill()
            out, err = p.communicate()
            rc = None
        load = parse_redis_benchmark(out)
        if rc is None:
            load.partial = True
        elif rc != 0:
            msg = err.decode(errors="replace").strip().splitlines()
            load.error = f"redis-benchmark exit {rc}: " + (msg[-1] if msg else "")
        elif load.rps is None:
            load.error = "no throughput in redis-benchmark output"
        loads.append(load)
    total = Load(seconds=time.monotonic() - t0)
    total.cpu_us = [(_cpu_seconds(s) - c0) * 1e6 / n for s, c0 in zip(servers, cpu0,
                                                                         strict=True)]
    errors = [ld.error for ld in loads if ld.error]
    if errors:
        total.error = errors[0]
        return total
    total.partial = any(ld.partial for ld in loads)
    if total.partial:
        total.rps = sum(ld.rps or 0.0 for ld in loads)
        total.note = f"stopped at the {time_limit:.0f}s time limit"
    else:
        total.rps = n / total.seconds
    p50 = [ld.p50_ms for ld in loads if ld.p50_ms is not None]
    p99 = [ld.p99_ms for ld in loads if ld.p99_ms is not None]
    total.p50_ms = max(p50) if p50 else None
    total.p99_ms = max(p99) if p99 else None
    return total


_TICK = os.sysconf("SC_CLK_TCK")


def _cpu_seconds(server: Server) -> float:
    """User + system CPU a running server has used so far (/proc/PID/stat), 0 if unknown."""
    try:
        with open(f"/proc/{server.proc.pid}/stat") as f:  # type: ignore[union-attr]
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _TICK  # utime, stime
    except (OSError, AttributeError, IndexError, ValueError):
        return 0.0


def _qlen_sum(servers: list[Server], queue: str) -> int:
    return sum(_qlen(s.port, "disque", queue) for s in servers)


CLUSTER_ADDJOB_LOADS = [  # key, label, ADDJOB options, redis-benchmark -P
    ("cluster_add_sync_p1", "3 nodes ADDJOB R3 P1", ["REPLICATE", "3"], 1),
    ("cluster_add_async_p1", "3 nodes ADDJOB R3 ASYNC P1", ["REPLICATE", "3", "ASYNC"], 1),
    ("cluster_add_sync_p16", "3 nodes ADDJOB R3 P16", ["REPLICATE", "3"], 16),
    ("cluster_add_async_p16", "3 nodes ADDJOB R3 ASYNC P16", ["REPLICATE", "3", "ASYNC"], 16),
    ("cluster_add_r2_p16", "3 nodes ADDJOB R2 P16", ["REPLICATE", "2"], 16),
]
CLUSTER_E2E_LOADS = [  # key, label, requests in flight per connection
    ("cluster_e2e_p1", "3 nodes add A->get B P1", 1),
    ("cluster_e2e_p16", "3 nodes add A->get B P16", 16),
]
SOAK_KEY, SOAK_LABEL = "cluster_soak_p16", "3 nodes A->B P16 soak"


def _rss_bytes(server: Server) -> int:
    """A running server's resident set (0 when unknown)."""
    try:
        with open(f"/proc/{server.proc.pid}/status") as f:  # type: ignore[union-attr]
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except (OSError, AttributeError, ValueError):
        pass
    return 0


def scenario_cluster(workdir: Path, cpus: set[int] | None, o: Options, raw: dict[str, Any],
                     original_cmd: list[str] | None = None) -> list[Row]:
    """3 nodes: ADDJOB REPLICATE 3 (sync, ASYNC) and REPLICATE 2 over all nodes; produce on
    node 0, consume (GETJOB + ACKJOB) on node 1. Each load starts from empty nodes (DEBUG
    FLUSHALL). With `original_cmd` the same loads then run on three original nodes, started
    once the disque-py nodes are stopped: two clusters never share the machine."""
    rows = [Row(key, label) for key, label, *_ in CLUSTER_ADDJOB_LOADS + CLUSTER_E2E_LOADS]
    rows.append(Row(SOAK_KEY, SOAK_LABEL))
    run_cluster_loads(rows, "disque", workdir, cpus, o, raw)
    if original_cmd:
        run_cluster_loads(rows[:-1], "original", workdir, cpus, o, raw, original_cmd)
    return rows


CLUSTER_SIZES = (3, 10, 20)
SIZE_CLIENTS = 20


def scenario_sizes(workdir: Path, cpus: set[int] | None, o: Options,
                   original_cmd: list[str] | None = None,
                   sizes: tuple[int, ...] = CLUSTER_SIZES) -> list[Row]:
    """How the cost grows with the cluster: `ADDJOB ... REPLICATE 3` from 20 connections
    spread over every node of a fresh cluster of 3, 10 and 20 nodes on this machine (the
    replicas spread over more links, so each bus frame carries fewer jobs), then the same on
    the original's. One cluster at a time."""
    rows = [Row(f"size_{n}", f"{n} nodes ADDJOB R3 c{SIZE_CLIENTS}") for n in sizes]
    flavors: list[tuple[str, list[str] | None]] = [("disque", None)]
    if original_cmd:
        flavors.append(("original", original_cmd))
    for row, size in zip(rows, sizes, strict=True):
        for flavor, cmd in flavors:
            try:
                servers = start_cluster(workdir, cpus, size=size, timeout=60.0, cmd=cmd,
                                        flavor=flavor)
            except (OSError, RuntimeError) as exc:
                _set_load(row, flavor, Load(error=f"cluster did not start: {exc}"))
                continue
            try:
                q = row.key
                load = parallel_redis_benchmark(servers, ["ADDJOB", q, "body", "5000",
                                                          "REPLICATE", "3"],
                                                o.cluster_n, 1, SIZE_CLIENTS, o.time_limit)
                moved = _qlen_sum(servers, q)
                if load.ok and not load.partial and moved < o.cluster_n * 0.99:
                    load.note = f"only {moved} of {o.cluster_n} requests queued a job"
                if load.cpu_us:  # per node, over many nodes: the mean and the busiest
                    per = load.cpu_us
                    load.note = ((load.note + "; ") if load.note else "") + (
                        f"CPU per job per node: mean {sum(per) / len(per):.1f} us, "
                        f"max {max(per):.1f} us, all nodes {sum(per):.1f} us")
                    load.cpu_us = None
                _set_load(row, flavor, load)
            finally:
                for s in servers:
                    s.stop()
    return rows


def run_cluster_loads(rows: list[Row], flavor: str, workdir: Path, cpus: set[int] | None,
                      o: Options, raw: dict[str, Any], cmd: list[str] | None = None) -> None:
    """Every cluster load on one fresh cluster of `flavor`, stored in each row's `flavor`
    column; the nodes are stopped before returning."""
    try:
        servers = start_cluster(workdir, cpus, cmd=cmd, flavor=flavor)
    except (OSError, RuntimeError) as exc:
        for row in rows:
            _set_load(row, flavor, Load(error=f"cluster did not start: {exc}"))
        return
    try:
        _say(f"{flavor} cluster of {len(servers)} nodes on ports {[s.port for s in servers]}")
        for row, (_, _, opts, pipeline) in zip(rows, CLUSTER_ADDJOB_LOADS, strict=False):
            q = row.key
            _flushall(servers)
            before = _qlen_sum(servers, q)
            load = parallel_redis_benchmark(servers, ["ADDJOB", q, "body", "5000", *opts],
                                            o.cluster_n, pipeline, o.clients, o.time_limit)
            moved = _qlen_sum(servers, q) - before
            if load.ok and not load.partial and moved < o.cluster_n * 0.99:
                load.note = f"only {moved} of {o.cluster_n} requests queued a job"
            _set_load(row, flavor, load)
        e2e_rows = rows[len(CLUSTER_ADDJOB_LOADS):len(CLUSTER_ADDJOB_LOADS)
                        + len(CLUSTER_E2E_LOADS)]
        for row, (_, _, depth) in zip(e2e_rows, CLUSTER_E2E_LOADS, strict=True):
            _flushall(servers)
            if not all(s.alive() for s in servers):
                _set_load(row, flavor, Load(error="a cluster node died"))
                continue
            cfg = E2EConfig(port=servers[0].port, consume_port=servers[1].port,
                            flavor="disque", depth=depth, jobs=o.cluster_e2e_jobs,
                            connections=o.clients, procs=o.e2e_procs,
                            time_limit=o.e2e_time_limit, queue=row.key,
                            add_args=("REPLICATE", "3"))
            res = run_e2e(cfg)
            raw[row.key if flavor == "disque" else f"{row.key}_{flavor}"] = res.as_dict()
            _set_load(row, flavor, _e2e_load(res))
        soak = [r for r in rows if r.key == SOAK_KEY]
        if soak:
            _flushall(servers)
            before = [_rss_bytes(s) for s in servers]
            cfg = E2EConfig(port=servers[0].port, consume_port=servers[1].port,
                            flavor="disque", depth=16, jobs=o.soak_jobs,
                            connections=o.clients, procs=o.e2e_procs,
                            time_limit=max(o.e2e_time_limit, 120.0), queue=SOAK_KEY,
                            add_args=("REPLICATE", "3"))
            res = run_e2e(cfg)
            load = _e2e_load(res)
            growth = [(_rss_bytes(s) - b) / max(1, res.acked) for s, b in zip(servers, before,
                                                                               strict=True)]
            raw[SOAK_KEY] = {**res.as_dict(), "rss_growth_per_acked_job": growth}
            if load.ok:
                load.note = ("RSS +" + "/".join(f"{g:.0f}" for g in growth)
                             + f" B per acked job on the 3 nodes, {res.acked:,} jobs")
            _set_load(soak[0], flavor, load)
        dead = [s for s in servers if not s.alive()]
        if dead:
            _say(f"{flavor} cluster node(s) died during the run:\n{dead[0].log_tail()}")
    finally:
        for s in servers:
            s.stop()


def _memory_fields(port: int) -> dict[str, int]:
    with Client(port) as c:
        info = c.info("memory")
    return {k: int(info[k]) for k in ("used_memory", "used_memory_rss") if k in info}


def measure_memory(server: Server, flavor: str, o: Options) -> dict[str, Any]:
    """Fill a fresh server with o.memory_jobs 16-byte jobs; per-job growth of INFO memory."""
    q = "mem"
    cmd = ["LPUSH", q, BODY16] if flavor == "redis" else ["ADDJOB", q, BODY16, "0"]
    out: dict[str, Any] = {"flavor": flavor, "target": o.memory_jobs}
    base = _memory_fields(server.port)
    t0 = time.monotonic()
    load = redis_benchmark(server.port, cmd, o.memory_jobs, 16, o.clients,
                           max(o.time_limit, 4 * o.time_limit * o.memory_jobs / 1e6))
    out["fill_seconds"] = time.monotonic() - t0
    out["fill_rps"] = load.rps
    if load.error:
        out["error"] = load.error
    jobs = _qlen(server.port, flavor, q)
    after = _memory_fields(server.port)
    out["jobs"] = jobs
    out["baseline"] = base
    out["after"] = after
    for k in ("used_memory", "used_memory_rss"):
        if k in base and k in after and jobs:
            out[f"{k}_per_job"] = (after[k] - base[k]) / jobs
    missing = {"used_memory", "used_memory_rss"} - set(after)
    if missing:
        out["note"] = f"INFO memory lacks {sorted(missing)}"
    return out


def scenario_memory(workdir: Path, cpus: set[int] | None, o: Options,
                    want_disque: bool, original_cmd: list[str] | None = None) -> dict[str, Any]:
    """One fresh server at a time: disque-py, redis-server, and the original if given."""
    results: dict[str, Any] = {}
    makers: list[tuple[str, Callable[[], Server]]] = [
        ("redis", lambda: redis_server(workdir, cpus))]
    if want_disque:
        makers.insert(0, ("disque", lambda: disque_server(workdir, cpus)))
    if original_cmd:
        makers.append(("original",
                       lambda: disque_server(workdir, cpus, original_cmd, "original")))
    for flavor, make in makers:
        server = make()
        try:
            server.start()
            m = measure_memory(server, flavor, o)
        except (OSError, RuntimeError) as exc:
            m = {"flavor": flavor, "error": f"{exc!r}"}
        finally:
            server.stop()
        results[flavor] = m
        per = m.get("used_memory_rss_per_job")
        used = m.get("used_memory_per_job")
        _say(f"  {'memory':<27} {flavor:<8} {m.get('jobs', 0):,} jobs in "
             f"{m.get('fill_seconds', 0):.1f}s: used_memory "
             f"{'-' if used is None else f'{used:.0f}'} B/job, RSS "
             f"{'-' if per is None else f'{per:.0f}'} B/job"
             + (f"  ERROR {m['error']}" if "error" in m else ""))
    return results


# -- report -------------------------------------------------------------------------------

TARGETS: list[tuple[str, str, float]] = [
    ("addjob_p16", "ADDJOB P16 >= 30% of LPUSH P16", 0.30),
    ("getjob_p16", "GETJOB NOHANG P16 >= 20% of RPOP P16", 0.20),
    ("addjob_p1", "ADDJOB P1 >= 90% of LPUSH P1", 0.90),
]
RSS_TARGET = 600.0


def check_targets(rows: dict[str, Row], memory: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for key, text, need in TARGETS:
        ratio = rows[key].ratio if key in rows else None
        verdict = "n/a" if ratio is None else ("PASS" if ratio >= need else "MISS")
        out.append({"target": text, "value": ratio, "verdict": verdict,
                    "shown": "-" if ratio is None else f"{ratio:.0%}"})
    rss = memory.get("disque", {}).get("used_memory_rss_per_job")
    verdict = "n/a" if rss is None else ("PASS" if rss <= RSS_TARGET else "MISS")
    out.append({"target": f"RSS <= {RSS_TARGET:.0f} bytes per queued job", "value": rss,
                "verdict": verdict, "shown": "-" if rss is None else f"{rss:.0f} B"})
    return out


def _fmt_pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.0%}"


def memory_ratios(memory: dict[str, Any], other: str) -> dict[str, float]:
    """disque-py's bytes per job over `other`'s, for used_memory and used_memory_rss."""
    ours, theirs = memory.get("disque", {}), memory.get(other, {})
    out = {}
    for k in ("used_memory", "used_memory_rss"):
        a, b = ours.get(f"{k}_per_job"), theirs.get(f"{k}_per_job")
        if a is not None and b:
            out[k] = a / b
    return out


def print_table(rows: list[Row], memory: dict[str, Any], targets: list[dict[str, Any]],
                cpus: int, pinned: bool) -> None:
    with_original = "original" in memory or any(row.original is not None for row in rows)
    flavors = ("disque", "redis", "original") if with_original else ("disque", "redis")
    _say("")
    head = (f"{'scenario':<27} {'disque jobs/s':>14} {'p50/p99 ms':>13} "
            f"{'redis ops/s':>14} {'p50/p99 ms':>13} {'ratio':>7}")
    if with_original:
        head += f" {'original jobs/s':>16} {'p50/p99 ms':>13} {'py/orig':>8}"
    _say(head)
    _say("-" * len(head))
    for row in rows:
        line = f"{row.label:<27}"
        for flavor in flavors:
            load = getattr(row, flavor) or Load()
            rate = _fmt_rate(load.rps) + ("*" if load.partial else "")
            line += f" {rate:>{16 if flavor == 'original' else 14}} {_fmt_lat(load):>13}"
            if flavor == "redis":
                line += f" {_fmt_pct(row.ratio):>7}"
        if with_original:
            line += f" {_fmt_pct(row.original_ratio):>8}"
        _say(line)
        for flavor in flavors:
            load = getattr(row, flavor)
            if load is not None and (load.error or load.note):
                _say(f"    {flavor}: {load.error or load.note}")
            if load is not None and load.ok and load.cpu_us:
                _say(f"    {flavor}: CPU per job per node "
                     + "/".join(f"{us:.1f}" for us in load.cpu_us) + " us")
    for flavor in flavors:
        m = memory.get(flavor)
        if not m:
            continue
        used = m.get("used_memory_per_job")
        rss = m.get("used_memory_rss_per_job")
        unit = "list item" if flavor == "redis" else "job"
        ratios = memory_ratios(memory, "original") if flavor == "original" else {}
        _say(f"memory {flavor:<8} {m.get('jobs', 0):>9,} x 16B: used_memory "
             f"{'-' if used is None else f'{used:.0f}'} B/{unit}, RSS "
             f"{'-' if rss is None else f'{rss:.0f}'} B/{unit}, filled in "
             f"{m.get('fill_seconds', 0):.1f}s ({_fmt_rate(m.get('fill_rps'))}/s)"
             + (f"; py/orig used_memory {_fmt_pct(ratios.get('used_memory'))}, RSS "
                f"{_fmt_pct(ratios.get('used_memory_rss'))}" if ratios else "")
             + (f"  {m['error']}" if "error" in m else "")
             + (f"  {m['note']}" if "note" in m else ""))
    _say("")
    _say("targets (ratios to redis-server in this run):")
    for t in targets:
        _say(f"  {t['verdict']:<5} {t['target']:<42} {t['shown']}")
    _say("")
    _say("* = stopped at the time limit. Latencies: redis-benchmark's per-request latency "
         "(with -P 16, per pipeline batch); e2e rows: produce -> consume of each job. "
         "e2e redis has no ack step (BRPOP only).")
    if any(row.key.startswith("cluster_") for row in rows):
        _say("3 nodes rows: three disque-py nodes on this machine, 50 connections spread over "
             "them (p50/p99: the worst node's); add A->get B: producers on one node, "
             "consumers (GETJOB + ACKJOB) on another. No redis-server equivalent.")
    if with_original:
        _say("original: the C Disque server of --disque-cmd under the same loads (its 3 nodes "
             "start after disque-py's were stopped); py/orig = disque-py / original, of the "
             "rates and of the bytes per job.")
    _say(f"Caveat: this machine has {cpus} CPU(s); the load generators and the server under test "
         f"share them{' (servers pinned to CPU 0, load elsewhere)' if pinned else ''}, so "
         f"absolute numbers understate both servers: compare the ratios.")


# -- main ---------------------------------------------------------------------------------

def cpu_busy(interval: float = 0.5) -> float | None:
    """Fraction of all CPUs busy over `interval`, from /proc/stat (None if unavailable)."""
    def sample() -> tuple[int, int]:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
        return sum(fields), idle
    try:
        t0, i0 = sample()
        time.sleep(interval)
        t1, i1 = sample()
    except (OSError, ValueError, IndexError):
        return None
    return 1.0 - (i1 - i0) / max(1, t1 - t0)


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM unwinds like Ctrl-C: servers stopped by the `finally` blocks, partial results
    still printed and saved."""
    def handler(signum: int, frame: object) -> None:
        raise KeyboardInterrupt
    old = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def _server_version(server: Server | None, keys: tuple[str, ...]) -> str | None:
    if server is None or not server.alive():
        return None
    with contextlib.suppress(OSError, RuntimeError), Client(server.port) as c:
        info = c.info("server")
        for k in keys:
            if k in info:
                return info[k]
    return None


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.run",
                                 description="disque-py vs redis-server as a queue (make bench)")
    ap.add_argument("--quick", action="store_true",
                    help="fewer requests and 100k jobs for memory, for development")
    ap.add_argument("--only", default=",".join(SCENARIOS),
                    help=f"comma-separated scenarios among {','.join(SCENARIOS)}")
    ap.add_argument("-n", "--requests", type=int, default=None,
                    help="requests per unpipelined redis-benchmark run (default 200000, "
                         "quick 50000)")
    ap.add_argument("--pipelined-requests", type=int, default=None,
                    help="requests per -P 16 redis-benchmark run and jobs pre-filled for "
                         "GETJOB (default 1000000, quick 250000)")
    ap.add_argument("-c", "--clients", type=int, default=50, help="connections per load")
    ap.add_argument("--jobs-for-memory", type=int, default=None,
                    help="jobs queued for the memory scenario (default 1000000, quick 100000)")
    ap.add_argument("--e2e-jobs", type=int, default=None,
                    help="jobs per end-to-end run (default 100000, quick 20000)")
    ap.add_argument("--cluster-requests", type=int, default=None,
                    help="ADDJOB requests per 3-node load (default 30000, quick 6000)")
    ap.add_argument("--cluster-e2e-jobs", type=int, default=None,
                    help="jobs per 3-node produce/consume run (default 20000, quick 5000)")
    ap.add_argument("--soak-jobs", type=int, default=None,
                    help="jobs of the 3-node soak row (default 300000, quick 150000)")
    ap.add_argument("--spark-rows", type=int, default=None,
                    help="rows per Spark write at REPLICATE 1 (default 500000, quick 100000; "
                         "REPLICATE 3 writes a tenth); see benchmarks/spark_bench.py")
    ap.add_argument("--aof-jobs", type=int, default=None,
                    help="jobs in the AOF rewrite / reload scenario (default 1000000, quick "
                         "100000); the aof ADDJOB loads use -n (default 100000, quick 20000)")
    ap.add_argument("--overflow-jobs", type=int, default=None,
                    help="jobs in the overflow scenario's backlog (default 5000000, quick "
                         "1000000); see benchmarks/overflow.py")
    ap.add_argument("--e2e-procs", type=int, default=4,
                    help="load generator processes for e2e (half produce, half consume)")
    ap.add_argument("--time-limit", type=float, default=None,
                    help="seconds any single load may run (default 60, quick 20)")
    ap.add_argument("--pin", action="store_true",
                    help="pin the servers to CPU 0 and the load generators to the other CPUs")
    ap.add_argument("--disque-cmd", default=None, metavar="PATH",
                    help="the original C Disque server (e.g. disque/src/disque-server; "
                         "started with --port/--dir/--maxmemory): the ping, addjob, getjob, "
                         "e2e, cluster and memory loads also run against it, as an "
                         "'original' column next to disque-py (always the server under test)")
    ap.add_argument("--results-dir", default=str(REPO / "bench-results"))
    a = ap.parse_args(argv)
    a.only = [s.strip() for s in a.only.split(",") if s.strip()]
    bad = [s for s in a.only if s not in SCENARIOS]
    if bad:
        ap.error(f"unknown scenario(s) {bad}; choose among {list(SCENARIOS)}")
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    original_cmd = shlex.split(a.disque_cmd) if a.disque_cmd else None
    if original_cmd and shutil.which(original_cmd[0]) is None:
        _say(f"--disque-cmd: {original_cmd[0]} is not an executable")
        return 2
    o = Options(
        n=a.requests or (50_000 if a.quick else 200_000),
        clients=a.clients,
        time_limit=a.time_limit or (20.0 if a.quick else 60.0),
        e2e_jobs=a.e2e_jobs or (20_000 if a.quick else 100_000),
        e2e_time_limit=10.0 if a.quick else 20.0,
        e2e_procs=a.e2e_procs,
        memory_jobs=a.jobs_for_memory or (100_000 if a.quick else 1_000_000),
        cluster_n=a.cluster_requests or (6_000 if a.quick else 30_000),
        cluster_e2e_jobs=a.cluster_e2e_jobs or (5_000 if a.quick else 20_000),
        soak_jobs=a.soak_jobs or (150_000 if a.quick else 300_000),
        n_pipelined=a.pipelined_requests or (250_000 if a.quick else 1_000_000),
    )
    for tool in ("redis-server", "redis-benchmark"):
        if shutil.which(tool) is None:
            _say(f"{tool} not found: install Debian's redis-server and redis-tools "
                 f"(`make system-deps`)")
            return 2
    ncpu = os.cpu_count() or 1
    server_cpus: set[int] | None = None
    if a.pin and ncpu >= 2:
        server_cpus = {0}
        os.sched_setaffinity(0, set(range(1, ncpu)))  # inherited by redis-benchmark, loadgen
    started = time.time()
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(started))
    _say(f"disque-py benchmark {stamp}: {ncpu} CPU(s), python {platform.python_version()}, "
         f"{o.clients} connections, -n {o.n} (P16: {o.n_pipelined}), mode {'quick' if a.quick else 'full'}")
    _say(f"note: load generator and servers share the {ncpu} CPU(s) of this machine")
    load_start = os.getloadavg()
    busy = cpu_busy()
    if busy is not None and busy > 0.25:
        _say(f"warning: the machine is already {busy:.0%} busy before the benchmark starts; "
             f"other processes will skew the numbers")
    rows: list[Row] = []
    e2e_raw: dict[str, Any] = {}
    memory: dict[str, Any] = {}
    spark: dict[str, Any] = {}
    aof: dict[str, Any] = {}
    restart: dict[str, Any] = {}
    downnode: dict[str, Any] = {}
    tls: dict[str, Any] = {}
    overflow: dict[str, Any] = {}
    harness_error: str | None = None
    disque_error: str | None = None
    original_error: str | None = None
    versions: dict[str, str | None] = {}
    with tempfile.TemporaryDirectory(prefix="disque-bench-") as tmp, _sigterm_as_interrupt():
        work = Path(tmp)
        try:
            load_scenarios = [s for s in a.only
                              if s not in ("memory", "cluster", "restart", "downnode",
                                           "spark", "aof", "tls", "overflow")]
            if load_scenarios:
                r = redis_server(work, server_cpus)
                lineup: Lineup = [("disque", disque_server(work, server_cpus)), ("redis", r)]
                if original_cmd:
                    lineup.append(("original", disque_server(work, server_cpus, original_cmd,
                                                             "original")))
                try:
                    r.start()
                    for i, (flavor, server) in enumerate(lineup):
                        if server is None or flavor == "redis":
                            continue
                        try:
                            server.start()
                        except RuntimeError as exc:
                            if flavor == "disque":
                                disque_error = str(exc)
                            else:
                                original_error = str(exc)
                            _say(f"{flavor} did not start; running without it:\n{exc}")
                            server.stop()
                            lineup[i] = (flavor, None)
                    servers = dict(lineup)
                    versions = {flavor: _server_version(server, ("disque_version",
                                                                 "redis_version"))
                                for flavor, server in lineup}
                    _say(", ".join(f"{flavor} {versions[flavor] or '?'} on port "
                                   f"{server.port if server else '-'}"
                                   for flavor, server in lineup))
                    if "ping" in load_scenarios:
                        rows += scenario_ping(lineup, o)
                    if "addjob" in load_scenarios:
                        rows += scenario_addjob(lineup, o)
                    if "getjob" in load_scenarios:
                        rows += scenario_getjob(lineup, o)
                    if "e2e" in load_scenarios:
                        e2e_rows, e2e_raw = scenario_e2e(lineup, o)
                        rows += e2e_rows
                    d = servers["disque"]
                    if d is not None and not d.alive():
                        disque_error = f"disque-py died during the run:\n{d.log_tail()}"
                        _say(disque_error)
                finally:
                    for _, server in lineup:
                        if server is not None:
                            server.stop()
            if "cluster" in a.only:
                rows += scenario_cluster(work, server_cpus, o, e2e_raw, original_cmd)
            if "sizes" in a.only:
                rows += scenario_sizes(work, server_cpus, o, original_cmd)
            if "memory" in a.only:
                memory = scenario_memory(work, server_cpus, o, want_disque=disque_error is None,
                                         original_cmd=original_cmd)
                if "error" in memory.get("disque", {}) and disque_error is None:
                    disque_error = memory["disque"]["error"]
                if "error" in memory.get("original", {}) and original_error is None:
                    original_error = memory["original"]["error"]
                if "original" in memory:
                    memory["py_over_original"] = memory_ratios(memory, "original")
            if "restart" in a.only:
                from benchmarks.restart import scenario_restart
                restart = scenario_restart(work, server_cpus, _say, original_cmd)
            if "downnode" in a.only:
                from benchmarks.downnode import scenario_downnode
                downnode = scenario_downnode(work, server_cpus, _say, original_cmd, a.quick)
            if "overflow" in a.only:
                from benchmarks.overflow import scenario_overflow
                overflow = scenario_overflow(work, server_cpus, _say, a.quick, a.overflow_jobs)
                from benchmarks.overflow import scenario_overflow_cluster
                overflow["cluster"] = scenario_overflow_cluster(work, server_cpus, _say,
                                                                a.quick)
            if "tls" in a.only:
                from benchmarks.tls import scenario_tls
                tls = scenario_tls(work, server_cpus, o, a.quick, _say)
            if "aof" in a.only:
                from benchmarks.aof import AofOptions, scenario_aof
                aof_rows, aof = scenario_aof(work, server_cpus, o, AofOptions(
                    n=a.requests or (20_000 if a.quick else 100_000),
                    jobs=a.aof_jobs or (100_000 if a.quick else 1_000_000),
                    disque_cmd=list(DISQUE_CMD)))
                rows += aof_rows
            if "spark" in a.only:
                from benchmarks.spark_bench import scenario_spark
                spark = scenario_spark(work, server_cpus,
                                       a.spark_rows or (100_000 if a.quick else 500_000), _say)
        except KeyboardInterrupt:
            harness_error = "interrupted"
            _say("interrupted; servers stopped")
        except Exception:  # the harness broke: say where, still write what we have
            harness_error = traceback.format_exc()
            _say(harness_error)
    by_key = {row.key: row for row in rows}
    targets = check_targets(by_key, memory)
    print_table(rows, memory, targets, ncpu, server_cpus is not None)
    if spark:
        from benchmarks.spark_bench import print_spark
        print_spark(spark, _say)
    if restart:
        from benchmarks.restart import print_restart
        print_restart(restart, _say)
    if downnode:
        from benchmarks.downnode import print_downnode
        print_downnode(downnode, _say)
    if aof:
        from benchmarks.aof import print_aof
        print_aof(aof)
    if tls:
        from benchmarks.tls import print_tls
        print_tls(tls, _say)
    if overflow:
        from benchmarks.overflow import print_overflow, print_overflow_cluster
        print_overflow(overflow, _say)
        if "cluster" in overflow:
            print_overflow_cluster(overflow["cluster"], _say)
    if disque_error and not any(row.disque.ok for row in rows):
        _say("disque-py numbers are pending: the server did not run (see above).")
    doc = {
        "timestamp": stamp,
        "duration_s": round(time.time() - started, 1),
        "machine": {"cpus": ncpu, "platform": platform.platform(),
                    "python": platform.python_version(), "pinned": server_cpus is not None,
                    "cpu_busy_before": busy, "loadavg_start": load_start,
                    "loadavg_end": os.getloadavg()},
        "versions": versions,
        "options": asdict(o) | {"only": a.only, "quick": a.quick,
                                "disque_cmd": original_cmd},
        "rows": [{"key": row.key, "label": row.label, "ratio": row.ratio,
                  "disque": asdict(row.disque), "redis": asdict(row.redis)}
                 | ({"original": asdict(row.original), "original_ratio": row.original_ratio}
                    if row.original is not None else {}) for row in rows],
        "e2e": e2e_raw,
        "memory": memory,
        "spark": spark,
        "aof": aof,
        "restart": restart,
        "downnode": downnode,
        "tls": tls,
        "overflow": overflow,
        "targets": targets,
        "disque_error": disque_error,
        "original_error": original_error,
        "harness_error": harness_error,
    }
    out_dir = Path(a.results_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{stamp}.json"
    path.write_text(json.dumps(doc, indent=2) + "\n")
    _say(f"results written to {path} ({doc['duration_s']}s)")
    if harness_error == "interrupted":
        return 130
    return 1 if (harness_error or disque_error or original_error) else 0


if __name__ == "__main__":
    raise SystemExit(main())
