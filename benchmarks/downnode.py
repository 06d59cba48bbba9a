"""`make bench`'s downnode scenario (`python -m benchmarks.run --only downnode`): the
replicated write rate while a node is killed under load (issue 25: "a down node is not
waited for").

Fresh clusters (3 nodes with REPLICATE 2, then 5 nodes with REPLICATE 3): redis-benchmark
sends `ADDJOB dq body 5000 REPLICATE n` from 20 connections to node 0, in back-to-back
slices for the whole run (each slice sized from the previous one's rate to last about
SLICE_S: a fixed count would take seconds per slice at a collapsed rate and blur the
phases). Meanwhile: `before_s` seconds healthy, then kill -9 of the last node (SIGKILL,
reaped), `down_s` seconds with it down, then it is started again (same port and
directory: same node ID, empty without AOF) and, once every peer shows it connected with
no failure flag, `after_s` more seconds (the re-replication of its copies runs then).
The default cluster-node-timeout (15 s) is longer than the whole run: the killed node is
never flagged failing, so only the cost of its dead links is measured.

Each slice is put in the phase it ran in: *before* (ended before the kill), *kill* (the
slice the kill fell in), *during* (started after the kill, ended before the restart),
*restart* (overlapping the restart, until the peers see the node again: not in the
table), *after* (started once the peers see it). A phase's rate is its requests over the
time redis-benchmark spent on them (the sum of each slice's own requests / rate, so the
starting of the redis-benchmark processes between slices is not counted); its p50/p99
(and p99.9, max) come from merging the slices' latency distributions ("Latency by percentile
distribution": (latency, cumulative count) points; the merged count at a latency adds,
for each slice, its count at its nearest point below, so a percentile is slightly
overestimated, never under).

Then the rolling kill (issue 25's "rolling kill -9"): 5 fresh nodes, REPLICATE 3, the same
load on node 0; `healthy_s` seconds, then nodes 1 to 4 in turn are killed (kill -9), left
down `down_s` seconds, started again, and once the peers see it, `gap_s` seconds later the
next one goes. *healthy* slices ended before the first kill, *rolling* slices ran between
the first kill and the end of the last gap. Then *control*: the issue's "the same run
without faults", 5 fresh nodes under the same load for as long, no node killed, its slices
between the same two times (the backlog grows as in the rolling run: the first seconds of
a fresh cluster, *healthy*, run on a registry a tenth of the size, and their rate varied
from 13,000 to 26,000/s from run to run on this machine). The target is rolling/control;
rolling/healthy is printed beside it. (ADDJOBs only, where the issue's run has 90%
adds: every operation is then a replicated write, the harder case.)

With --disque-cmd the same runs on the original Disque afterwards (never two clusters at
once). The issue's targets, printed PASS / MISS: with one node of three killed,
REPLICATE 2 keeps >= 0.85x of its healthy rate in the same run, and its p99 while the
node is down is below the original's in the same run; the same for REPLICATE 3 on five
nodes.
"""

from __future__ import annotations

import contextlib
import re
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

SLICE_S = 0.3  # s: the length a slice aims at
SLICE_FIRST, SLICE_MIN, SLICE_MAX = 5000, 300, 20000  # requests per slice
CLIENTS = 20
DURATIONS = (3.0, 5.0, 3.0)  # s: before the kill, while down, after the peers see it again
QUICK_DURATIONS = (2.0, 3.0, 2.0)
CONFIGS = ((3, 2), (5, 3))  # (nodes, REPLICATE)
PHASES = ("before", "kill", "during", "restart", "after")
RATE_TARGET = 0.85  # during / before, disque-py, one node of three (five) killed
ROLLING = (3.0, 2.0, 1.0)  # s: healthy, each node down, after each node is back
QUICK_ROLLING = (2.0, 2.0, 0.5)
ROLLING_RATE_TARGET = 0.8  # rolling / healthy
ROLLING_P99_TARGET = 10.0  # ms

_POINT = re.compile(rb"^\s*([\d.]+)% <= ([\d.]+) milliseconds \(cumulative count (\d+)\)")
_THROUGHPUT = re.compile(rb"throughput summary:\s*([\d.]+) requests per second")


@dataclass(slots=True)
class Slice:
    start: float  # s since the run started
    end: float
    requests: int = 0
    rps: float | None = None
    points: list[tuple[float, int]] = field(default_factory=list)  # (ms, cumulative count)
    error: str | None = None
    phase: str = ""


def parse_slice(out: bytes, sl: Slice) -> None:
    """redis-benchmark 7's full output -> rate and latency distribution of the slice."""
    m = _THROUGHPUT.search(out)
    if m is None:
        sl.error = "no throughput in redis-benchmark output"
        return
    sl.rps = float(m.group(1))
    section = out.replace(b"\r", b"\n").split(b"Latency by percentile distribution:", 1)
    if len(section) == 2:
        for line in section[1].split(b"\n"):
            p = _POINT.match(line)
            if p is None:
                if line.strip():
                    break  # the next section
                continue
            sl.points.append((float(p.group(2)), int(p.group(3))))
    if sl.points:
        sl.requests = sl.points[-1][1]


def run_slice(port: int, command: list[str], t0: float, n: int) -> Slice:
    from benchmarks.run import _redis_benchmark_cmd

    sl = Slice(time.monotonic() - t0, 0.0)
    try:
        cp = subprocess.run(_redis_benchmark_cmd(port, command, n, 1, CLIENTS),
                            capture_output=True, timeout=120, check=False)
        if cp.returncode != 0:
            lines = cp.stderr.decode(errors="replace").strip().splitlines()
            sl.error = f"redis-benchmark exit {cp.returncode}: {lines[-1] if lines else ''}"
        else:
            parse_slice(cp.stdout, sl)
    except subprocess.TimeoutExpired:
        sl.error = "redis-benchmark slice over 120 s"
    sl.end = time.monotonic() - t0
    return sl


def percentile(slices: list[Slice], q: float) -> float | None:
    """The q-th percentile (0..100) of the merged latency distributions of `slices`."""
    total = sum(s.requests for s in slices)
    if not total:
        return None
    need = total * q / 100
    for lat in sorted({ms for s in slices for ms, _ in s.points}):
        count = 0
        for s in slices:
            below = 0
            for ms, cum in s.points:
                if ms > lat:
                    break
                below = cum
            count += below
        if count >= need:
            return lat
    return None


def phase_summary(slices: list[Slice]) -> dict[str, Any]:
    ok = [s for s in slices if s.rps and s.requests]
    busy = sum(s.requests / s.rps for s in ok if s.rps)
    requests = sum(s.requests for s in ok)
    return {"slices": len(slices), "requests": requests,
            "rate": round(requests / busy, 1) if busy else None,
            "p50_ms": percentile(ok, 50), "p99_ms": percentile(ok, 99),
            "p999_ms": percentile(ok, 99.9), "max_ms": percentile(ok, 100),
            "errors": [s.error for s in slices if s.error][:3]}


def classify(sl: Slice, events: dict[str, float]) -> str:
    kill, restart, back = events.get("kill"), events.get("restart"), events.get("back")
    if kill is None or sl.end <= kill:
        return "before"
    if sl.start < kill:
        return "kill"
    if restart is None or sl.end <= restart:
        return "during"
    if back is None or sl.start < back:
        return "restart"
    return "after"


def _load(port: int, command: list[str], t0: float, slices: list[Slice],
          stop: threading.Event) -> threading.Thread:
    """Back-to-back redis-benchmark slices against `port` until `stop`, in a thread."""
    def load() -> None:
        n = SLICE_FIRST
        while not stop.is_set():
            sl = run_slice(port, command, t0, n)
            slices.append(sl)
            if sl.rps:
                n = max(SLICE_MIN, min(SLICE_MAX, int(sl.rps * SLICE_S)))

    # The load runs in a thread; the faults in the caller's, which must outlive the
    # restarted servers: the harness starts servers with PR_SET_PDEATHSIG, and that signal
    # comes when the *thread* that forked the process ends.
    loader = threading.Thread(target=load, daemon=True)
    loader.start()
    return loader


@contextlib.contextmanager
def _loading(port: int, replicate: int) -> Iterator[tuple[float, list[Slice]]]:
    """`ADDJOB dq body 5000 REPLICATE replicate` slices against `port` for the body of the
    `with` (the run's start, its slices); the load stops and its thread ends on the way out."""
    command = ["ADDJOB", "dq", "body", "5000", "REPLICATE", str(replicate)]
    slices: list[Slice] = []
    stop = threading.Event()
    t0 = time.monotonic()
    loader = _load(port, command, t0, slices, stop)
    try:
        yield t0, slices
    finally:
        stop.set()
        loader.join(timeout=180)


def _kill_and_restart(victim: Any, peers: list[Any], down_s: float) -> tuple[float, float]:
    """kill -9 `victim`, start it again `down_s` later, wait until every peer sees it
    connected with no failure flag: (the kill's, the view's) monotonic times."""
    from benchmarks.restart import _myid, _peer_view

    victim_id = _myid(victim.port)
    assert victim.proc is not None
    victim.proc.kill()
    victim.proc.wait()
    killed = time.monotonic()
    time.sleep(down_s)
    victim.start(poll=0.01)
    deadline = time.monotonic() + 60
    while not all(_peer_view(p.port, victim_id)[0] for p in peers):
        if time.monotonic() > deadline:
            raise RuntimeError("the peers did not see the restarted node in 60 s")
        time.sleep(0.01)
    return killed, time.monotonic()


def measure_rolling(servers: list[Any], replicate: int,
                    timing: tuple[float, float, float]) -> dict[str, Any]:
    """The load on servers[0] while servers[1:] are killed and restarted one at a time."""
    healthy_s, down_s, gap_s = timing
    failure: list[str] = []
    first = end = None
    with _loading(servers[0].port, replicate) as (t0, slices):
        try:
            time.sleep(healthy_s)
            for victim in servers[1:]:
                killed, _back = _kill_and_restart(
                    victim, [p for p in servers if p is not victim], down_s)
                first = killed - t0 if first is None else first
                time.sleep(gap_s)
            end = time.monotonic() - t0
        except Exception as exc:  # reported with the run
            failure.append(f"{type(exc).__name__}: {exc}")
    healthy = [s for s in slices if first is None or s.end <= first]
    rolling = [s for s in slices if first is not None and s.start >= first
               and (end is None or s.end <= end)]
    result: dict[str, Any] = {"healthy": phase_summary(healthy),
                              "rolling": phase_summary(rolling)}
    if failure:
        result["error"] = failure[0]
    if first is not None and end is not None:
        result["window_s"] = [round(first, 3), round(end, 3)]
    h, r = result["healthy"]["rate"], result["rolling"]["rate"]
    result["rolling_over_healthy"] = round(r / h, 3) if h and r else None
    return result


def measure_control(servers: list[Any], replicate: int,
                    window: list[float]) -> dict[str, Any]:
    """The rolling kill's load on servers[0], no node killed, for as long as the rolling
    run took: the slices in its window [first kill, end] (`measure_rolling`)."""
    first, end = window
    with _loading(servers[0].port, replicate) as (_, slices):
        time.sleep(end)  # the rolling run's schedule, without its faults
    return {"healthy": phase_summary([s for s in slices if s.end <= first]),
            "control": phase_summary([s for s in slices if s.start >= first and s.end <= end])}


def measure(servers: list[Any], replicate: int,
            durations: tuple[float, float, float]) -> dict[str, Any]:
    """The load on servers[0] while servers[-1] is killed and restarted; phase summaries."""

    before_s, down_s, after_s = durations
    victim, peers = servers[-1], servers[:-1]
    events: dict[str, float] = {}
    failure: list[str] = []
    with _loading(servers[0].port, replicate) as (t0, slices):

        def until(t: float) -> None:
            time.sleep(max(0.0, t - (time.monotonic() - t0)))

        try:
            until(before_s)
            killed, back = _kill_and_restart(victim, peers, down_s)
            events["kill"] = killed - t0
            events["restart"] = killed - t0 + down_s
            events["back"] = back - t0
            until(events["back"] + after_s)
        except Exception as exc:  # reported with the run
            failure.append(f"{type(exc).__name__}: {exc}")
    for sl in slices:
        sl.phase = classify(sl, events)
    result: dict[str, Any] = {p: phase_summary([s for s in slices if s.phase == p])
                              for p in PHASES}
    result["events_s"] = {k: round(v, 3) for k, v in events.items()}
    result["slices"] = [asdict(s) | {"points": None, "p99_ms": percentile([s], 99),
                                     "max_ms": s.points[-1][0] if s.points else None}
                        for s in slices]
    if failure:
        result["error"] = failure[0]
    b, d = result["before"]["rate"], result["during"]["rate"]
    result["during_over_before"] = round(d / b, 3) if b and d else None
    return result


def scenario_downnode(workdir: Path, cpus: set[int] | None, say: Any,
                      original_cmd: list[str] | None = None,
                      quick: bool = False) -> dict[str, Any]:

    durations = QUICK_DURATIONS if quick else DURATIONS
    out: dict[str, Any] = {"durations_s": list(durations), "slice_s": SLICE_S,
                           "clients": CLIENTS, "runs": {}}
    flavors = [("disque", None)] + ([("original", original_cmd)] if original_cmd else [])
    for nodes, replicate in CONFIGS:
        key = f"{nodes}n_r{replicate}"
        out["runs"][key] = {}
        for flavor, cmd in flavors:
            r = _on_cluster(workdir / f"downnode-{key}-{flavor}", cpus, nodes, cmd, flavor,
                            lambda servers, r=replicate: measure(servers, r, durations))
            out["runs"][key][flavor] = r
            say(f"  downnode {nodes} nodes REPLICATE {replicate} {flavor}: "
                + _line(r))
    timing = QUICK_ROLLING if quick else ROLLING
    out["rolling_s"] = list(timing)
    out["rolling"] = {}
    for flavor, cmd in flavors:
        r = _on_cluster(workdir / f"rolling-{flavor}", cpus, 5, cmd, flavor,
                        lambda servers: measure_rolling(servers, 3, timing))
        window = r.get("window_s")
        if window is not None:
            c = _on_cluster(workdir / f"control-{flavor}", cpus, 5, cmd, flavor,
                            lambda servers, w=window: measure_control(servers, 3, w))
            r["control"] = c.get("control", {"rate": None, "error": c.get("error")})
            r["control_healthy"] = c.get("healthy")
            a, b = r["rolling"]["rate"], r["control"]["rate"]
            r["rolling_over_control"] = round(a / b, 3) if a and b else None
        out["rolling"][flavor] = r
        say(f"  downnode rolling kill 5 nodes REPLICATE 3 {flavor}: " + _rolling_line(r))
    out["targets"] = targets(out)
    return out


def _on_cluster(workdir: Path, cpus: set[int] | None, nodes: int, cmd: list[str] | None,
                flavor: str, run: Any) -> dict[str, Any]:
    """`run(servers)` on a fresh cluster, stopped afterwards (an error: {"error": ...})."""
    from benchmarks.run import start_cluster

    servers: list[Any] = []
    try:
        servers = start_cluster(workdir, cpus, size=nodes, cmd=cmd, flavor=flavor)
        result: dict[str, Any] = run(servers)
        return result
    except (OSError, RuntimeError) as exc:
        return {"error": str(exc)}
    finally:
        for s in servers:
            with contextlib.suppress(Exception):
                s.stop()


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


def _cell(phase: dict[str, Any] | None) -> str:
    """rate, p99 / max ms"""
    if not phase or phase.get("rate") is None:
        return "-"
    return f"{phase['rate']:,.0f}/s {_ms(phase.get('p99_ms'))}/{_ms(phase.get('max_ms'))}"


def _line(r: dict[str, Any], phases: tuple[str, ...] = ("before", "during", "after"),
          ratio_key: str = "during_over_before") -> str:
    """One run's phases and ratio (the rolling kill's: `_rolling_line`)."""
    if phases[0] not in r:
        return f"error: {r.get('error')}"
    ratio = r.get(ratio_key)
    over = "/".join(ratio_key.split("_over_"))
    text = " | ".join(f"{p} {_cell(r[p])}" for p in phases)
    text += f" | {over} {'-' if ratio is None else f'{ratio:.2f}'}"
    if r.get("error"):
        text += f"  ERROR {r['error']}"
    return text


def _rolling_line(r: dict[str, Any]) -> str:
    text = _line(r, ("healthy", "rolling"), "rolling_over_healthy")
    if "control" in r:
        ratio = r.get("rolling_over_control")
        text += (f" | control {_cell(r['control'])} | rolling/control "
                 + ("-" if ratio is None else f"{ratio:.2f}"))
    return text


def targets(out: dict[str, Any]) -> list[dict[str, Any]]:
    """Issue 25's targets: during >= 0.85 x before (disque-py), during p99 below the
    original's (when it ran)."""
    res = []
    for key, runs in out["runs"].items():
        ours, orig = runs.get("disque", {}), runs.get("original")
        ratio = ours.get("during_over_before")
        res.append({"target": f"{key}: during/before >= {RATE_TARGET}", "value": ratio,
                    "verdict": "n/a" if ratio is None else
                    ("PASS" if ratio >= RATE_TARGET else "MISS")})
        if orig is not None:
            a = ours.get("during", {}).get("p99_ms")
            b = orig.get("during", {}).get("p99_ms")
            res.append({"target": f"{key}: during p99 below the original's", "value": [a, b],
                        "verdict": "n/a" if a is None or b is None else
                        ("PASS" if a < b else "MISS")})
    rolling = out.get("rolling", {}).get("disque")
    if rolling is not None:
        ratio = rolling.get("rolling_over_control")
        res.append({"target": f"rolling kill: rolling/control >= {ROLLING_RATE_TARGET}",
                    "value": ratio, "verdict": "n/a" if ratio is None else
                    ("PASS" if ratio >= ROLLING_RATE_TARGET else "MISS")})
        p99 = rolling.get("rolling", {}).get("p99_ms")
        res.append({"target": f"rolling kill: ADDJOB p99 <= {ROLLING_P99_TARGET:.0f} ms",
                    "value": p99, "verdict": "n/a" if p99 is None else
                    ("PASS" if p99 <= ROLLING_P99_TARGET else "MISS")})
    return res


def print_downnode(out: dict[str, Any], say: Any = print) -> None:
    before_s, down_s, after_s = out["durations_s"]
    say("")
    say(f"downnode (ADDJOB dq body 5000 REPLICATE n, {out['clients']} connections to node 0; "
        f"kill -9 of the last node after {before_s:.0f} s, restarted {down_s:.0f} s later; "
        f"after: {after_s:.0f} s once its peers see it). Cells: rate, p99/max ms")
    head = (f"  {'run':<18} {'before':>22} {'kill slice':>22} {'during':>22} "
            f"{'after':>22} {'during/before':>14}")
    say(head)
    for key, runs in out["runs"].items():
        for flavor, r in runs.items():
            label = f"{key} {flavor}"
            if "before" not in r:
                say(f"  {label:<18} error: {r.get('error')}")
                continue
            ratio = r.get("during_over_before")
            say(f"  {label:<18} {_cell(r['before']):>22} {_cell(r['kill']):>22} "
                f"{_cell(r['during']):>22} {_cell(r['after']):>22} "
                f"{'-' if ratio is None else f'{ratio:.2f}':>14}"
                + (f"  ERROR {r['error']}" if r.get("error") else ""))
    if out.get("rolling"):
        healthy_s, down_s, gap_s = out["rolling_s"]
        say(f"  rolling kill (5 nodes, REPLICATE 3; {healthy_s:.0f} s healthy, then nodes 1-4 "
            f"killed in turn, each down {down_s:.0f} s, the next {gap_s:.1f} s after the peers "
            "see it back)")
        for flavor, r in out["rolling"].items():
            say(f"  {'rolling ' + flavor:<18} " + _rolling_line(r))
    for t in out.get("targets", []):
        say(f"  {t['verdict']:<5} {t['target']} ({t['value']})")
