"""`make chaos`: run each nemesis of tests/chaos/nemesis.py for CHAOS_SECONDS (default 60)
against a fresh 5-node cluster and print the history checker's table.

    python -m tests.chaos.run --seconds 60 [--nemesis kill,pause] [--seed 1]
                              [--node-args "--repair-rate 0"]
"""

from __future__ import annotations

import argparse
import shlex
import sys
import tempfile
from pathlib import Path

from tests.chaos.nemesis import NEMESES, run_chaos, table


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=60.0, help="nemesis time per run")
    ap.add_argument("--nemesis", default=",".join(NEMESES),
                    help=f"comma-separated, from {', '.join(NEMESES)}")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--node-args", default="", help="more options for every node")
    ap.add_argument("--trace", metavar="DIR",
                    help="keep each run's directory (node logs) in DIR, with a trace of the "
                         "run (INFO samples, kills, the lost jobs: tests/chaos/nemesis.py)")
    args = ap.parse_args(argv)
    chosen = [n for n in args.nemesis.split(",") if n]
    bad = [n for n in chosen if n not in NEMESES]
    if bad:
        ap.error(f"unknown nemesis {', '.join(bad)}")
    results = []
    with tempfile.TemporaryDirectory(prefix="disque-chaos-") as tmp:
        top = Path(args.trace) if args.trace else Path(tmp)
        for name in chosen:
            print(f"running {name} for {args.seconds:.0f}s ...", file=sys.stderr, flush=True)
            r = run_chaos(name, args.seconds, top / name, seed=args.seed,
                          node_args=tuple(shlex.split(args.node_args)),
                          trace=bool(args.trace))
            results.append(r)
            print(table([r]).splitlines()[1], file=sys.stderr, flush=True)
    print(table(results))
    return 1 if any(r.report["lost"] or r.report["unexpected"] for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
