"""Original-Disque reports on sync ADDJOB bookkeeping (docs/original-bugs.md rows 21, 27).

Row 21 ("Unknown encoding type" crash): thousands of blocked clients (sync ADDJOBs waiting
for replication + blocked GETJOBs on many queues) while the 50 ms "try one more node" path
re-sends REPLJOB. Row 27 ("Unknown btype in unblockClient()"): a GOTJOB completing the
replication of a sync ADDJOB whose client already closed its socket.

Targets are frozen with SIGSTOP (not killed) so they stay "reachable" and answer late.
"""

from __future__ import annotations

import signal
import socket

from tests.cluster.conftest import cmd, parse_fields
from tests.harness import wait_for
from tests.integration.resp import Conn, Err, Status

Q = "q"


def _blocked(p) -> int:
    return int(parse_fields(cmd(p, "INFO", "clients"))["blocked_clients"])


def _registered(p) -> int:
    return int(parse_fields(cmd(p, "INFO", "jobs"))["registered_jobs"])


def _freeze(p) -> None:
    p.proc.send_signal(signal.SIGSTOP)


def _thaw(p) -> None:
    p.proc.send_signal(signal.SIGCONT)


def _abort(conn: Conn) -> None:
    """Close abruptly (RST), as the reporter's client did."""
    conn.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    conn.close()


def test_late_gotjob_for_an_addjob_whose_client_left_is_ignored(cluster):
    """Row 27: REPLJOB reaches a frozen node; the client closes; the node thaws and answers
    GOTJOB for a job the producer already dropped. No crash, no copy left anywhere."""
    c = cluster(3, node_timeout=5000)
    a, b, late = c.nodes
    for round_ in range(5):
        _freeze(late)
        try:
            conn = Conn(a.port, timeout=30)
            conn.send_cmd("ADDJOB", Q, f"abandoned-{round_}", 10000, "REPLICATE", 3)
            wait_for(lambda: _blocked(a) == 1, timeout=10, what="the ADDJOB client blocked")
            (_abort if round_ % 2 else Conn.close)(conn)
            wait_for(lambda: _blocked(a) == 0, timeout=10, what="the client's state dropped")
        finally:
            _thaw(late)
        # late now handles REPLJOB (+ DELJOB) and answers GOTJOB to a for a deleted job
        wait_for(lambda: all(_registered(p) == 0 for p in c), timeout=15,
                 what="no copy of the abandoned job on any node")
        assert all(p.alive() for p in c), [p.output()[-2000:] for p in c if not p.alive()]
    reply = cmd(a, "ADDJOB", Q, "after", 5000, "REPLICATE", 3)
    assert isinstance(reply, Status), reply
    assert all(cmd(p, "PING") == "PONG" for p in c)


def test_many_waiting_sync_addjobs_and_blocked_getjobs_do_not_crash(cluster):
    """Row 21: hundreds of sync ADDJOBs wait for replication (two of five targets frozen, so
    the extra-node retry keeps re-sending REPLJOB) next to blocked GETJOBs on many queues,
    some clients vanishing meanwhile. Every remaining ADDJOB gets an ID or -NOREPL."""
    c = cluster(5, node_timeout=15000)
    a = c[0]
    frozen = [c[3], c[4]]
    getters = []
    for i in range(200):
        g = Conn(a.port, timeout=60)
        g.send_cmd("GETJOB", "TIMEOUT", 0, "FROM", *[f"gq{(i + k) % 300}" for k in range(5)])
        getters.append(g)
    wait_for(lambda: _blocked(a) == 200, timeout=20, what="200 blocked GETJOBs")
    for p in frozen:
        _freeze(p)
    adders: list[tuple[Conn, int]] = []
    try:
        for i in range(400):
            rep = 3 if i % 2 == 0 else 5  # 3 is reachable via retries, 5 never is
            conn = Conn(a.port, timeout=60)
            conn.send_cmd("ADDJOB", f"aq{i % 50}", f"b{i}", 6000 if rep == 5 else 10000,
                          "REPLICATE", rep)
            adders.append((conn, rep))
        wait_for(lambda: _blocked(a) >= 200 + 200, timeout=20,
                 what="the sync ADDJOB clients blocked")
        for conn, _ in adders[1::7]:  # some clients leave while waiting
            _abort(conn)
        survivors = [(cn, rep) for k, (cn, rep) in enumerate(adders) if k % 7 != 1]
        replies = [(cn.read(timeout=30), rep) for cn, rep in survivors]
    finally:
        for p in frozen:
            _thaw(p)
    assert all(p.alive() for p in c), [p.output()[-2000:] for p in c if not p.alive()]
    bad = [(r, rep) for r, rep in replies
           if not (isinstance(r, Status) or (isinstance(r, Err) and r.startswith("NOREPL")))]
    assert bad == [], bad[:5]
    assert all(isinstance(r, Err) for r, rep in replies if rep == 5)
    got = sum(isinstance(r, Status) for r, rep in replies if rep == 3)
    assert got == sum(1 for _, rep in replies if rep == 3), "REPLICATE 3 reachable via retries"
    for cn, _ in survivors:
        cn.close()
    # the blocked GETJOBs are untouched and still served
    assert _blocked(a) == 200
    cmd(a, "ADDJOB", "gq0", "wake", 0, "REPLICATE", 1)
    wait_for(lambda: _blocked(a) == 199, timeout=10, what="one GETJOB woken by gq0")
    for g in getters:
        g.close()
    wait_for(lambda: _blocked(a) == 0, timeout=10, what="every blocked client gone")
    assert all(cmd(p, "PING") == "PONG" for p in c)
