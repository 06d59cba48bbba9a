"""In-process cost of one node's job operations, without the request path (issue 21).

A `Node` on a fixed clock: N `add_job` (one node, no replication), N `get_jobs` of one job,
then one `ackjob` per ID; microseconds per operation for each phase. What the compiled hot
set gains below the command layer. `python -m benchmarks.node [N]` (PYTHONHASHSEED fixed
for run-to-run comparisons: the registry's layout follows the hash seed).
"""

from __future__ import annotations

import gc
import random
import sys
import time

from disque import compiled
from disque.node import Node


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 300_000
    now = [1_700_000_000_000]
    node = Node(b"0123abcd" + b"e" * 32, lambda: now[0], rng=random.Random(1),
                maxmemory=1 << 40)
    gc.collect()
    gc.disable()
    add_job, get_jobs, ackjob = node.add_job, node.get_jobs, node.ackjob
    body = b"x" * 20
    t0 = time.perf_counter()
    ids = [add_job(b"q", body, 0, None, None, None, 0, None, False).id for _ in range(n)]
    t1 = time.perf_counter()
    for _ in range(n):
        get_jobs([b"q"], 1)
    t2 = time.perf_counter()
    for job_id in ids:
        ackjob((job_id,))
    t3 = time.perf_counter()
    gc.enable()
    build = "compiled" if compiled.compiled_modules() else "interpreted"
    print(f"{build} add_job {(t1 - t0) * 1e6 / n:.3f} get_jobs {(t2 - t1) * 1e6 / n:.3f} "
          f"ackjob {(t3 - t2) * 1e6 / n:.3f} us/op")


if __name__ == "__main__":
    main()
