"""The HTTP side's cost to the RESP path (issue 14): `make bench` rows with the dashboard open.

    flock -o /tmp/bench.lock .venv/bin/python -m benchmarks.dashboard [--rounds 3] \\
        [benchmarks.run options, default: --quick --only addjob,getjob]

Runs benchmarks.run alternately without HTTP ("plain") and with every disque-py node started
with `--http-port` while a poller does what an open dashboard polling every second plus a
Prometheus scrape every second do (/api/node, /api/queues, /api/cluster, /metrics), then
prints each row's disque-py rate per round and the medians. Alternating the modes spreads
the machine's other load over both; on a shared machine compare the medians, not one round.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import statistics
import sys
import tempfile
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from benchmarks import run
from disque.tools.ports import free_port

PATHS = ("/api/node", "/api/queues", "/api/cluster", "/metrics")


@contextlib.contextmanager
def dashboard_polling(port: int) -> Iterator[list[int]]:
    """Poll the node's HTTP port once a second; yields [answered, refused] (refused while no
    node is up, between the benchmark's scenarios)."""
    stop = threading.Event()
    counts = [0, 0]

    def poll() -> None:
        while not stop.is_set():
            for path in PATHS:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}",
                                                timeout=5) as resp:
                        resp.read()
                    counts[0] += 1
                except OSError:
                    counts[1] += 1
            stop.wait(1.0)

    t = threading.Thread(target=poll, daemon=True)
    t.start()
    try:
        yield counts
    finally:
        stop.set()
        t.join(timeout=10)


def one_run(http: bool, bench_args: list[str], results: Path
            ) -> dict[str, tuple[float, float]]:
    """Rows of one benchmarks.run: label -> (disque-py jobs/s, ratio to redis-server in the
    same run: the ratio cancels some of the machine's other load)."""
    base = list(run.DISQUE_CMD)
    port = free_port(bus_offset=0)
    if http:
        run.DISQUE_CMD.extend(["--http-port", str(port)])
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out), (dashboard_polling(port) if http
                                               else contextlib.nullcontext([0, 0])) as counts:
            run.main([*bench_args, "--results-dir", str(results)])
    finally:
        run.DISQUE_CMD[:] = base
    if http and not counts[0]:
        raise SystemExit("the dashboard poller never reached the node: is HTTP on?\n"
                         + out.getvalue())
    [path] = sorted(results.glob("*.json"))
    data = json.loads(path.read_text())
    path.unlink()
    return {row["label"]: (row["disque"]["rps"], row["ratio"] or 0.0) for row in data["rows"]
            if row["disque"].get("rps")}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.dashboard", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    a, rest = ap.parse_known_args(argv)
    bench_args = rest or ["--quick", "--only", "addjob,getjob"]
    rates: dict[str, dict[str, list[tuple[float, float]]]] = {"plain": {}, "http": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(a.rounds):
            for mode in ("plain", "http") if i % 2 == 0 else ("http", "plain"):
                rows = one_run(mode == "http", bench_args, Path(tmp))
                for name, rate in rows.items():
                    rates[mode].setdefault(name, []).append(rate)
                print(f"round {i + 1} {mode:5s} " + "  ".join(
                    f"{name}: {rate:,.0f}/s ({100 * ratio:.0f}% of redis)"
                    for name, (rate, ratio) in rows.items()), flush=True)
    print(f"\n{'median of the rounds':28s} {'plain':>11s} {'dashboard':>11s} {'change':>7s}"
          f"  {'ratio to redis: plain':>22s} {'dashboard':>10s}")
    for name, plain in rates["plain"].items():
        with_http = rates["http"].get(name, [])
        if not with_http:
            continue
        p = statistics.median(r for r, _ in plain)
        h = statistics.median(r for r, _ in with_http)
        pr = statistics.median(x for _, x in plain)
        hr = statistics.median(x for _, x in with_http)
        print(f"{name:28s} {p:>9,.0f}/s {h:>9,.0f}/s {100 * (h - p) / p:>+6.1f}%"
              f"  {100 * pr:>21.0f}% {100 * hr:>9.0f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
