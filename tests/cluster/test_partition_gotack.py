"""Original-Disque crashes in the GOTACK handler (docs/original-bugs.md rows 24, 36): under
partitions (Jepsen) and after long uptime the node crashed handling GOTACK / adding the sender
to a job's node set. The mapped tests are sans-I/O unit tests plus a chaos test that does not
exist; this drives real processes: holders frozen (SIGSTOP, a partition from everyone's view)
while jobs are ACKed / FASTACKed / DELJOBed / WORKINGed elsewhere, then healed, several rounds.
Late SETACK / GOTACK / DELJOB / QUEUED then meet jobs that are unknown, acked, deleted or
dummy ACKs on the receivers. Nothing may crash and the acked jobs must be collected.
"""

from __future__ import annotations

import signal

from tests.cluster.conftest import cmd, parse_fields
from tests.harness import wait_for
from tests.integration.resp import Status

Q = "pq"


def _registered(p) -> int:
    return int(parse_fields(cmd(p, "INFO", "jobs"))["registered_jobs"])


def test_partitions_during_ack_gc_do_not_crash_and_leave_nothing(cluster):
    c = cluster(5, node_timeout=1000)
    for rnd in range(3):
        producer = c[rnd % 5]
        ids = []
        for i in range(60):
            r = cmd(producer, "ADDJOB", Q, f"r{rnd}-{i}", 5000, "REPLICATE", 3, "RETRY", 1)
            assert isinstance(r, Status), r
            ids.append(str(r))
        frozen = [c[(rnd + 3) % 5], c[(rnd + 4) % 5]]
        others = [p for p in c if p not in frozen]
        for p in frozen:
            p.proc.send_signal(signal.SIGSTOP)
        try:
            acker = others[1]
            cmd(acker, "ACKJOB", *ids[0:20])          # dummy ACKs where unknown, GC via SETACK
            cmd(others[2], "FASTACK", *ids[20:35])
            for jid in ids[35:45]:
                cmd(producer, "DELJOB", jid)
            cmd(others[0], "WORKING", *ids[45:46])
            # let the frozen nodes be flagged failed: a partition from everyone's view
            wait_for(lambda side=others: all(
                int(parse_fields(cmd(p, "CLUSTER", "INFO"))["cluster_reachable_nodes"]) == 2
                for p in side), timeout=15, what="frozen nodes flagged unreachable")
            cmd(others[1], "ACKJOB", *ids[45:60])   # acks issued during the partition
        finally:
            for p in frozen:
                p.proc.send_signal(signal.SIGCONT)
        c.wait_mesh()
        # the frozen nodes wake with stale copies and stale bus messages; ack again from them
        cmd(frozen[0], "ACKJOB", *ids[0:10])
        cmd(frozen[1], "ACKJOB", *ids[45:60])
        assert all(p.alive() for p in c), [p.output()[-3000:] for p in c if not p.alive()]
        # FASTACK / DELJOB are best effort: a frozen holder may keep and re-queue its copy;
        # ACK whatever is still around from any node until everything is collected
        def collected() -> bool:
            for p in c:
                r = cmd(p, "GETJOB", "NOHANG", "COUNT", 100, "FROM", Q)
                if isinstance(r, list) and r:
                    cmd(p, "ACKJOB", *[jid.decode() for _, jid, _ in r])
            return all(_registered(p) == 0 for p in c)
        wait_for(collected, timeout=60, interval=0.2, what=f"round {rnd}: every job collected")
        assert all(cmd(p, "PING") == "PONG" for p in c)
