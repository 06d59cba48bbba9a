"""Original-Disque report "Possible data loss following node restart" (docs/original-bugs.md
row 2): 5 nodes, short node timeout, AOF everysec, REPLICATE 3, RETRY 1; nodes restarted one
at a time (SIGKILL, down, up again with the same dir) during ADDJOB / GETJOB+ACKJOB traffic.
Every job whose ADDJOB returned an ID must be delivered at least once once things heal.
The mapped chaos test kills one node once, without AOF; this one does the rolling restarts
(DISQUE_ROLLING_ROUNDS rounds, 1 by default).
"""

from __future__ import annotations

import os
import random
import time

import pytest

from tests.cluster.conftest import cmd
from tests.harness import wait_for
from tests.integration.resp import Status

Q = "jepsen"
# Rounds of restarting every node once: make test runs one, a release check more.
ROUNDS = int(os.environ.get("DISQUE_ROLLING_ROUNDS", "1"))


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_rolling_restarts_lose_no_acknowledged_job(cluster):
    c = cluster(5, node_timeout=500, args=["--appendonly", "yes", "--appendfsync", "everysec"])
    rnd = random.Random(7)
    added: set[str] = set()
    delivered: set[str] = set()
    down: set[int] = set()
    seq = 0

    def live() -> list[int]:
        return [i for i in range(len(c)) if i not in down]

    def safe(i: int, *args):
        try:
            return cmd(c[i], *args, timeout=5)
        except (OSError, ConnectionError, EOFError):
            return None
        except Exception as exc:  # ConnectionClosed from resp.py
            if type(exc).__name__ == "ConnectionClosed":
                return None
            raise

    def traffic(seconds: float) -> None:
        nonlocal seq
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            i = rnd.choice(live())
            if rnd.random() < 0.5:
                seq += 1
                r = safe(i, "ADDJOB", Q, f"j{seq}", 1000, "REPLICATE", 3, "RETRY", 1)
                if isinstance(r, Status):
                    added.add(str(r))
            else:
                r = safe(i, "GETJOB", "NOHANG", "COUNT", 3, "FROM", Q)
                if isinstance(r, list):
                    ids = [jid.decode() for _, jid, _ in r]
                    delivered.update(ids)
                    safe(i, "ACKJOB", *ids)

    traffic(2)
    for _rnd_round in range(ROUNDS):
        for i in range(len(c)):
            c[i].kill()  # SIGKILL
            down.add(i)
            traffic(2.5)  # down long enough to be flagged failed (node timeout 500 ms)
            c[i].start()
            down.discard(i)
            c.wait_mesh()
            traffic(2.5)
    assert all(p.alive() for p in c)

    def drained() -> bool:
        for i in range(len(c)):
            r = safe(i, "GETJOB", "NOHANG", "COUNT", 100, "FROM", Q)
            if isinstance(r, list):
                ids = [jid.decode() for _, jid, _ in r]
                delivered.update(ids)
                safe(i, "ACKJOB", *ids)
        return added <= delivered

    try:
        wait_for(drained, timeout=60, interval=0.2, what="every added job delivered")
    except AssertionError:
        lost = sorted(added - delivered)
        views = {jid: [cmd(p, "SHOW", jid) is not None for p in c] for jid in lost[:5]}
        raise AssertionError(f"{len(lost)} of {len(added)} acknowledged jobs never delivered: "
                             f"{lost[:5]} held by {views}") from None
    assert len(added) > 100, len(added)
