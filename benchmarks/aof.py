"""The `aof` scenario of `make bench` (issue 6): what the append-only file costs.

1. ADDJOB throughput with `--appendonly yes --appendfsync no | everysec | always`: a fresh
   node per policy, redis-benchmark with 50 connections, unpipelined and `-P 16`; the redis
   column is a fresh redis-server with `--appendonly yes` and the same fsync policy running
   `LPUSH`, for scale.
2. Rewrite: a fresh node (everysec) is filled with `--aof-jobs` 16-byte jobs (pipelined
   ADDJOB), then BGREWRITEAOF while a probe thread sends PING about every millisecond on a
   connection of its own and records each round trip: the longest one during the rewrite is
   the longest event-loop stall a client sees. Rewrite time is the wall time from the
   command's reply to INFO `aof_rewrite_in_progress:0`; file sizes before and after.
3. Reload: that node is stopped with SIGTERM and restarted on the same directory: time from
   the process start to the first PING answered with PONG rather than -LOADING, and the
   server's own `aof.loaded` log line (seconds, jobs), as jobs/s.

Every wait has a deadline; the nodes are always stopped. Imported lazily by run.py's main
(this module imports run.py's helpers).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import socket
import subprocess
import threading
import time
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Any

from benchmarks.loadgen import Client
from benchmarks.run import (
    BODY16,
    REPO,
    Options,
    Row,
    Server,
    _child_setup,
    _counted,
    _report,
    _say,
    free_port,
    redis_benchmark,
)

POLICIES = ("no", "everysec", "always")
PING = b"*1\r\n$4\r\nPING\r\n"


@dataclass(slots=True)
class AofOptions:
    n: int  # requests per ADDJOB load
    jobs: int  # jobs in the rewritten / reloaded AOF
    probe_interval: float = 0.001  # seconds between probe PINGs
    disque_cmd: list[str] = field(default_factory=list)


# -- servers ------------------------------------------------------------------------------

def disque_aof_server(workdir: Path, cpus: set[int] | None, policy: str,
                      disque_cmd: list[str]) -> Server:
    port = free_port()
    d = workdir / f"disque-aof-{policy}-{port}"
    d.mkdir(parents=True)
    cmd = [*disque_cmd, "--port", str(port), "--dir", str(d), "--maxmemory", "4gb",
           "--appendonly", "yes", "--appendfsync", policy]
    return Server("disque", cmd, port, d, cpus)


def redis_aof_server(workdir: Path, cpus: set[int] | None, policy: str) -> Server:
    port = free_port()
    d = workdir / f"redis-aof-{policy}-{port}"
    d.mkdir(parents=True)
    exe = shutil.which("redis-server") or "redis-server"
    cmd = [exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "yes",
           "--appendfsync", policy, "--dir", str(d), "--daemonize", "no"]
    return Server("redis", cmd, port, d, cpus)


def _spawn(server: Server) -> None:
    """Start the process only (Server.start also waits for PONG, which a reload must time)."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    with open(server.log, "ab") as log:
        server.proc = subprocess.Popen(server.cmd, stdout=log, stderr=subprocess.STDOUT,
                                       stdin=subprocess.DEVNULL, cwd=str(REPO), env=env,
                                       start_new_session=True,
                                       preexec_fn=_child_setup(server.cpus))


def _persistence(port: int) -> dict[str, str]:
    with Client(port) as c:
        return c.info("persistence")


def _aof_file(server: Server) -> Path:
    name = "disque.aof"
    with contextlib.suppress(OSError, RuntimeError, IndexError), Client(server.port) as c:
        reply = c.call("CONFIG", "GET", "appendfilename")
        name = reply[1].decode() if isinstance(reply[1], bytes) else str(reply[1])
    return server.workdir / name


def _size(path: Path) -> int | None:
    try:
        return path.stat().st_size
    except OSError:
        return None


# -- 1. throughput per fsync policy -------------------------------------------------------

def scenario_throughput(workdir: Path, cpus: set[int] | None, o: Options,
                        ao: AofOptions) -> tuple[list[Row], dict[str, Any]]:
    oo = replace(o, n=ao.n)
    rows: list[Row] = []
    raw: dict[str, Any] = {}
    for policy in POLICIES:
        servers = {"disque": disque_aof_server(workdir, cpus, policy, ao.disque_cmd),
                   "redis": redis_aof_server(workdir, cpus, policy)}
        policy_rows = [Row(f"aof_{policy}_p{p}", f"ADDJOB AOF {policy} P{p}") for p in (1, 16)]
        try:
            up: dict[str, Server | None] = {}
            for flavor, s in servers.items():
                try:
                    up[flavor] = s.start()
                except RuntimeError as exc:
                    up[flavor] = None
                    _say(f"{flavor} (appendfsync {policy}) did not start:\n{exc}")
            for row, p in zip(policy_rows, (1, 16), strict=True):
                q = f"aof{p}"
                for flavor, cmd in (("disque", ["ADDJOB", q, "body", "0"]),
                                    ("redis", ["LPUSH", q, "body"])):
                    load = _counted(up[flavor], flavor, q, ao.n, cmd, p, oo)
                    setattr(row, flavor, load)
                    _report(row.label, flavor, load)
            d = up["disque"]
            if d is not None and d.alive():
                with contextlib.suppress(OSError, RuntimeError):
                    info = _persistence(d.port)
                    raw[policy] = {k: info.get(k) for k in (
                        "aof_current_size", "aof_delayed_fsync", "aof_last_write_status")}
            elif d is not None:
                for row in policy_rows:
                    row.disque.error = row.disque.error or "disque died during the load"
                _say(f"disque (appendfsync {policy}) died:\n{d.log_tail()}")
        finally:
            for s in servers.values():
                s.stop()
        rows += policy_rows
    return rows, raw


# -- the probe ----------------------------------------------------------------------------

class Probe(threading.Thread):
    """PING about every `interval` seconds on one connection; every round trip recorded
    as (send time, round trip, reply kind). Connects (retrying) first, so it also serves
    to time a server coming up."""

    def __init__(self, port: int, interval: float, deadline: float) -> None:
        super().__init__(daemon=True)
        self.port = port
        self.interval = interval
        self.deadline = deadline  # time.monotonic() after which the probe gives up
        self.samples: list[tuple[float, float, str]] = []
        self.connected_at: float | None = None
        self.error: str | None = None
        self.halt = threading.Event()

    def _connect(self) -> socket.socket:
        while True:
            try:
                s = socket.create_connection(("127.0.0.1", self.port), timeout=5)
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                s.settimeout(max(1.0, self.deadline - time.monotonic()))
                self.connected_at = time.monotonic()
                return s
            except OSError:
                if self.halt.is_set() or time.monotonic() > self.deadline:
                    raise
                time.sleep(0.002)

    def run(self) -> None:
        try:
            sock = self._connect()
        except OSError as exc:
            self.error = f"connect: {exc!r}"
            return
        buf = b""
        with sock:
            try:
                while not self.halt.is_set() and time.monotonic() < self.deadline:
                    t0 = time.monotonic()
                    sock.sendall(PING)
                    while b"\r\n" not in buf:
                        data = sock.recv(4096)
                        if not data:
                            raise ConnectionError("server closed the connection")
                        buf += data
                    t1 = time.monotonic()
                    line, _, buf = buf.partition(b"\r\n")
                    kind = "pong" if line == b"+PONG" else line[1:].split(b" ", 1)[0].decode()
                    self.samples.append((t0, t1 - t0, kind))
                    time.sleep(max(0.0, t0 + self.interval - time.monotonic()))
            except (OSError, ConnectionError, UnicodeDecodeError) as exc:
                self.error = f"{exc!r}"

    def stop(self) -> None:
        self.halt.set()
        self.join(timeout=10)


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def _rtt_stats(samples: list[tuple[float, float, str]], origin: float) -> dict[str, Any]:
    """Round trips in ms; the 5 longest with their send time relative to `origin`."""
    rtts = [r * 1000 for _, r, _ in samples]
    worst = sorted(samples, key=lambda s: s[1], reverse=True)[:5]
    return {"pings": len(rtts), "p50_ms": _pct(rtts, 0.50), "p99_ms": _pct(rtts, 0.99),
            "max_ms": max(rtts) if rtts else None,
            "longest": [{"at_s": round(t - origin, 3), "ms": round(r * 1000, 2), "reply": k}
                        for t, r, k in worst]}


# -- 2. rewrite, 3. reload ----------------------------------------------------------------

_KV = re.compile(r"(\w+)=(\S+)")


def _wait_flushed(port: int, timeout: float) -> None:
    """Until the AOF buffer is written and no background fsync runs (everysec)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        info = _persistence(port)
        if info.get("aof_buffer_length") == "0" and info.get("aof_pending_bio_fsync") == "0":
            return
        time.sleep(0.05)


def _idle_probe(port: int, interval: float, seconds: float) -> dict[str, Any]:
    probe = Probe(port, interval, time.monotonic() + seconds)
    probe.start()
    probe.join(timeout=seconds + 10)
    probe.stop()
    stats = _rtt_stats(probe.samples, probe.samples[0][0] if probe.samples else 0.0)
    if probe.error:
        stats["error"] = probe.error
    return stats


def measure_rewrite(server: Server, o: Options, ao: AofOptions) -> dict[str, Any]:
    out: dict[str, Any] = {"jobs_target": ao.jobs}
    q = "aofbig"
    fill_limit = max(o.time_limit, 4 * o.time_limit * ao.jobs / 1e6)
    fill = redis_benchmark(server.port, ["ADDJOB", q, BODY16, "0"], ao.jobs, 16, o.clients,
                           fill_limit)
    out["fill_seconds"] = round(fill.seconds, 2)
    out["fill_rps"] = fill.rps
    if fill.error or fill.partial:
        out["error"] = f"fill: {fill.error or fill.note or 'stopped at the time limit'}"
        return out
    with Client(server.port) as c:
        out["jobs"] = int(c.call("QLEN", q))
    _wait_flushed(server.port, 10.0)
    path = _aof_file(server)
    out["file"] = path.name
    before = _persistence(server.port)
    out["size_before"] = _size(path)
    out["aof_current_size_before"] = int(before.get("aof_current_size", -1))
    out["idle_ping"] = _idle_probe(server.port, ao.probe_interval, 1.0)

    limit = max(o.time_limit, 4 * o.time_limit * ao.jobs / 1e6)
    probe = Probe(server.port, ao.probe_interval, time.monotonic() + limit + 5)
    probe.start()
    time.sleep(0.1)  # a few PINGs before the command
    polls = 0
    try:
        with Client(server.port) as c:
            t0 = time.monotonic()
            reply = c.call("BGREWRITEAOF")
            t_reply = time.monotonic()
            out["reply"] = reply.decode() if isinstance(reply, bytes) else str(reply)
            done = False
            while time.monotonic() - t0 < limit:
                info = c.info("persistence")
                polls += 1
                if info.get("aof_rewrite_in_progress") == "0":
                    done = True
                    break
                time.sleep(0.02)
            t1 = time.monotonic()
            info = c.info("persistence")
    finally:
        time.sleep(0.1)
        probe.stop()
    out["command_reply_ms"] = round((t_reply - t0) * 1000, 2)
    out["rewrite_seconds"] = round(t1 - t0, 3)
    out["done"] = done
    if not done:
        out["error"] = f"rewrite still in progress after the {limit:.0f}s time limit"
    out["info_polls"] = polls
    out["aof_last_rewrite_time_sec"] = int(info.get("aof_last_rewrite_time_sec", -1))
    out["aof_last_bgrewrite_status"] = info.get("aof_last_bgrewrite_status")
    out["aof_current_size_after"] = int(info.get("aof_current_size", -1))
    out["size_after"] = _size(path)
    during = [s for s in probe.samples if t0 <= s[0] <= t1]
    out["ping"] = _rtt_stats(during, t0)
    if probe.error:
        out["probe_error"] = probe.error
    if during:
        # the wall time the probe spent without an answer: a stall that started while the
        # probe slept is cut short in its round trip, not in the gap between replies
        ends = sorted(t + r for t, r, _ in during)
        out["ping"]["longest_gap_ms"] = round(
            max((b - a for a, b in zip(ends, ends[1:], strict=False)), default=0.0) * 1000, 2)
    return out


def _log_events_since(server: Server, offset: int, event: str) -> dict[str, str] | None:
    """key=value pairs (and the timestamp as `ts`) of the first `event` line of the server's
    console log written after byte `offset`."""
    try:
        with open(server.log, "rb") as f:
            f.seek(offset)
            text = f.read().decode(errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        parts = line.split()
        if event in parts:
            ev = dict(_KV.findall(line))
            ev["ts"] = parts[0]
            return ev
    return None


def _iso_to_epoch(ts: str) -> float | None:
    try:
        return datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _pong_streak(samples: list[tuple[float, float, str]]) -> float:
    """Seconds since the first of the PONGs that end `samples` uninterrupted."""
    i = len(samples)
    while i > 0 and samples[i - 1][2] == "pong":
        i -= 1
    return 0.0 if i == len(samples) else time.monotonic() - samples[i][0]


def measure_reload(server: Server, o: Options, ao: AofOptions, jobs: int) -> dict[str, Any]:
    """SIGTERM, restart on the same dir, PING every ~1 ms from the first possible connect
    until the server logs `aof.loaded` (and a little after). Ready = the first PONG after
    the last -LOADING reply; PONGs seen *before* a -LOADING are counted separately: they
    mean the listener answered before the load had begun."""
    out: dict[str, Any] = {"jobs_expected": jobs}
    path = _aof_file(server)
    t = time.monotonic()
    server.stop()  # SIGTERM, SIGKILL after 10 s
    out["sigterm_exit_seconds"] = round(time.monotonic() - t, 3)
    out["exit_code"] = server.proc.returncode if server.proc else None
    out["file_size"] = _size(path)
    limit = max(o.time_limit, 5 * o.time_limit * jobs / 1e6)
    log_offset = _size(server.log) or 0
    wall0 = time.time()
    t0 = time.monotonic()
    _spawn(server)
    probe = Probe(server.port, ao.probe_interval, t0 + limit)
    probe.start()
    ev = None
    try:
        while time.monotonic() - t0 < limit and server.alive() and probe.is_alive():
            ev = _log_events_since(server, log_offset, "aof.loaded")
            if ev is not None:
                time.sleep(0.05)  # a few PONGs after the load
                break
            last = probe.samples[-1] if probe.samples else None
            if last is not None and last[2] == "pong" and _pong_streak(probe.samples) > 2.0:
                break  # serving for 2 s and no aof.loaded line: a server that logs otherwise
            time.sleep(0.05)
    finally:
        probe.stop()
    samples = probe.samples
    last_loading = max((i for i, s in enumerate(samples) if s[2] == "LOADING"), default=-1)
    ready = next((s for s in samples[last_loading + 1:] if s[2] == "pong"), None)
    early = [s for s in samples[:max(last_loading, 0)] if s[2] == "pong"]
    loading = [s for s in samples if s[2] == "LOADING"]
    if probe.connected_at is not None:
        out["first_connect_seconds"] = round(probe.connected_at - t0, 3)
    out["loading_replies"] = len(loading)
    out["loading_ping"] = _rtt_stats(loading, t0)
    out["pongs_before_loading"] = len(early)
    if early:
        out["pongs_before_loading_at_s"] = [round(s[0] + s[1] - t0, 3) for s in early[:5]]
        out["warning"] = (f"{len(early)} PING(s) answered PONG before the AOF load began "
                          f"(first at {early[0][0] + early[0][1] - t0:.3f}s, first -LOADING at "
                          f"{loading[0][0] + loading[0][1] - t0:.3f}s): the listener serves "
                          f"commands before loading starts")
    if ready is not None:
        out["first_pong_seconds"] = round(ready[0] + ready[1] - t0, 3)
        out["jobs_per_s_to_pong"] = jobs / out["first_pong_seconds"]
    if ev is None:
        out["error"] = (probe.error or "no aof.loaded line in the server log") + (
            "" if server.alive() else f"; server exited:\n{server.log_tail()}")
        return out
    out["log"] = ev
    if (at := _iso_to_epoch(ev.get("ts", ""))) is not None:
        out["loaded_logged_at_seconds"] = round(at - wall0, 3)
    with contextlib.suppress(KeyError, ValueError):
        secs = float(ev["seconds"])
        n = int(ev["jobs"])
        out["loaded_seconds"] = secs
        out["loaded_jobs"] = n
        out["jobs_per_s"] = n / secs if secs > 0 else None
    if ready is None:
        out["error"] = probe.error or "no PONG after the load"
    with contextlib.suppress(OSError, RuntimeError), Client(server.port) as c:
        info = c.info()
        out["registered_jobs"] = int(info.get("registered_jobs", -1))
        out["used_memory_rss"] = int(info.get("used_memory_rss", -1))
    if out.get("registered_jobs") not in (None, jobs):
        out["note"] = f"{out['registered_jobs']} jobs registered after reload, {jobs} expected"
    return out


def scenario_rewrite_reload(workdir: Path, cpus: set[int] | None, o: Options,
                            ao: AofOptions) -> dict[str, Any]:
    server = disque_aof_server(workdir, cpus, "everysec", ao.disque_cmd)
    res: dict[str, Any] = {}
    try:
        try:
            server.start()
        except RuntimeError as exc:
            res["rewrite"] = {"error": f"disque did not start: {exc}"}
            return res
        rw = res["rewrite"] = measure_rewrite(server, o, ao)
        _say_rewrite(rw)
        if "error" in rw and not rw.get("done"):
            return res
        rl = res["reload"] = measure_reload(server, o, ao, rw.get("jobs", ao.jobs))
        _say_reload(rl)
    except (OSError, RuntimeError) as exc:
        res.setdefault("rewrite", {}).setdefault("error", f"{exc!r}")
        _say(f"  aof rewrite/reload ERROR {exc!r}")
    finally:
        server.stop()
    return res


def scenario_aof(workdir: Path, cpus: set[int] | None, o: Options,
                 ao: AofOptions) -> tuple[list[Row], dict[str, Any]]:
    _say(f"aof: fresh node per fsync policy, -n {ao.n} per ADDJOB load; rewrite and reload "
         f"of {ao.jobs:,} jobs")
    rows, raw = scenario_throughput(workdir, cpus, o, ao)
    doc: dict[str, Any] = {"options": {"n": ao.n, "jobs": ao.jobs,
                                       "probe_interval_s": ao.probe_interval},
                           "info_after_loads": raw}
    doc |= scenario_rewrite_reload(workdir, cpus, o, ao)
    return rows, doc


# -- report -------------------------------------------------------------------------------

def _mb(x: int | None) -> str:
    return "-" if x is None or x < 0 else f"{x / 1e6:.1f} MB"


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


def _rewrite_line(rw: dict[str, Any]) -> str:
    if "rewrite_seconds" not in rw:
        return f"rewrite: {rw.get('error', 'not run')}"
    p = rw.get("ping", {})
    idle = rw.get("idle_ping", {})
    s = (f"rewrite of {rw.get('jobs', 0):,} jobs: {rw['rewrite_seconds']:.2f}s "
         f"(INFO aof_last_rewrite_time_sec {rw.get('aof_last_rewrite_time_sec')}), "
         f"{_mb(rw.get('size_before'))} -> {_mb(rw.get('size_after'))}; "
         f"PING during it: {p.get('pings', 0)} sent, p50 {_ms(p.get('p50_ms'))} / "
         f"p99 {_ms(p.get('p99_ms'))} / max {_ms(p.get('max_ms'))} ms "
         f"(idle before: p99 {_ms(idle.get('p99_ms'))} / max {_ms(idle.get('max_ms'))} ms)")
    if rw.get("aof_last_bgrewrite_status") not in (None, "ok"):
        s += f"  status {rw['aof_last_bgrewrite_status']}"
    if "error" in rw:
        s += f"  ERROR {rw['error']}"
    return s


def _reload_line(rl: dict[str, Any]) -> str:
    if "loaded_seconds" not in rl and "first_pong_seconds" not in rl:
        return f"reload: {rl.get('error', 'not run')}"
    jps = rl.get("jobs_per_s")
    lp = rl.get("loading_ping", {})
    pong = rl.get("first_pong_seconds")
    s = (f"reload of {rl.get('loaded_jobs', rl['jobs_expected']):,} jobs "
         f"({_mb(rl.get('file_size'))}): ready (first PONG after the last -LOADING) "
         f"{'-' if pong is None else f'{pong:.2f}'}s after process start; aof.loaded "
         f"{rl.get('loaded_seconds', '-')}s = {'-' if jps is None else f'{jps:,.0f}'} jobs/s; "
         f"{rl.get('loading_replies', 0)} -LOADING replies meanwhile, p99 "
         f"{_ms(lp.get('p99_ms'))} / max {_ms(lp.get('max_ms'))} ms")
    for k in ("warning", "note", "error"):
        if k in rl:
            s += f"  {k.upper()} {rl[k]}"
    return s


def _say_rewrite(rw: dict[str, Any]) -> None:
    _say(f"  {_rewrite_line(rw)}")


def _say_reload(rl: dict[str, Any]) -> None:
    _say(f"  {_reload_line(rl)}")


def print_aof(doc: dict[str, Any]) -> None:
    """The rewrite and reload lines under the results table."""
    if not doc:
        return
    if "rewrite" in doc:
        _say(f"aof {_rewrite_line(doc['rewrite'])}")
    if "reload" in doc:
        _say(f"aof {_reload_line(doc['reload'])}")

