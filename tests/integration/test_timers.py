"""Timers on a single node: RETRY re-queue, TTL expiry, DELAY, blocked GETJOB timeouts and
client disconnects while blocked (checklist §4, §10; issue 3). Small RETRY/TTL values, and
every wait is a poll with a generous deadline."""

from __future__ import annotations

import time

from tests.harness import wait_for
from tests.integration.resp import Conn, add, blocked_on, encode, info, show


def test_unacked_job_is_requeued_after_retry(conn: Conn, q: str) -> None:
    job_id = add(conn, q, "b", "RETRY", "1", "TTL", "60")
    got = conn.cmd("GETJOB", "WITHCOUNTERS", "FROM", q)
    assert got[0][1].decode() == job_id
    assert got[0][6] == 0
    wait_for(lambda: conn.cmd("QLEN", q) == 1, timeout=20, what="job requeued after RETRY 1")
    got = conn.cmd("GETJOB", "WITHCOUNTERS", "FROM", q)
    assert got[0][1].decode() == job_id
    assert got[0][3:] == [b"nacks", 0, b"additional-deliveries", 1]


def test_acked_job_is_not_requeued(conn: Conn, q: str) -> None:
    job_id = add(conn, q, "b", "RETRY", "1", "TTL", "60")
    other = add(conn, q + "-marker", "b", "RETRY", "1", "TTL", "60")
    conn.cmd("GETJOB", "FROM", q)
    conn.cmd("GETJOB", "FROM", q + "-marker")
    assert conn.cmd("ACKJOB", job_id) == 1
    # once the un-acked marker job (same RETRY) came back, the acked one would have too
    wait_for(lambda: conn.cmd("QLEN", q + "-marker") == 1, timeout=20, what="marker requeued")
    assert conn.cmd("QLEN", q) == 0
    assert conn.cmd("SHOW", job_id) is None
    conn.cmd("ACKJOB", other)


def test_at_most_once_job_has_no_requeue_time(conn: Conn, q: str) -> None:
    job_id = add(conn, q, "b", "RETRY", "0")
    conn.cmd("GETJOB", "FROM", q)
    job = show(conn, job_id)
    assert job is not None
    assert job["state"] == b"active"
    assert job["next-requeue-within"] is None


def test_queued_job_expires_after_ttl(conn: Conn, q: str) -> None:
    job_id = add(conn, q, "b", "TTL", "2")
    assert conn.cmd("QLEN", q) == 1
    wait_for(lambda: conn.cmd("SHOW", job_id) is None, timeout=20, what="job expired")
    assert conn.cmd("QLEN", q) == 0
    assert conn.cmd("QPEEK", q, "10") == []
    assert conn.cmd("GETJOB", "NOHANG", "FROM", q) is None
    assert conn.cmd("JSCAN", "BUSYLOOP", "QUEUE", q)[1] == []


def test_active_job_expires_after_ttl(conn: Conn, q: str) -> None:
    job_id = add(conn, q, "b", "TTL", "2", "RETRY", "0")
    conn.cmd("GETJOB", "FROM", q)
    wait_for(lambda: conn.cmd("SHOW", job_id) is None, timeout=20, what="active job expired")
    assert conn.cmd("ACKJOB", job_id) == 0


def test_expired_jobs_are_unregistered(conn: Conn, q: str) -> None:
    base = int(info(conn, "jobs")["registered_jobs"])
    conn.pipeline([("ADDJOB", q, "b", "0", "TTL", "2") for _ in range(300)])
    assert int(info(conn, "jobs")["registered_jobs"]) >= base + 300
    wait_for(lambda: int(info(conn, "jobs")["registered_jobs"]) <= base, timeout=30,
             what="300 TTL-2 jobs expired")
    assert conn.cmd("QLEN", q) == 0


def test_delayed_job_is_queued_after_delay(conn: Conn, q: str) -> None:
    job_id = add(conn, q, "b", "DELAY", "1", "TTL", "60")
    job = show(conn, job_id)
    assert job is not None
    assert job["state"] == b"active" and job["delay"] == 1
    assert conn.cmd("QLEN", q) == 0
    assert conn.cmd("GETJOB", "NOHANG", "FROM", q) is None
    wait_for(lambda: conn.cmd("QLEN", q) == 1, timeout=20, what="delayed job queued")
    got = conn.cmd("GETJOB", "WITHCOUNTERS", "FROM", q)
    assert got[0][1].decode() == job_id
    assert got[0][6] == 0          # the first queueing is not an additional delivery


def test_delayed_at_most_once_job_is_queued_once(conn: Conn, q: str) -> None:
    job_id = add(conn, q, "b", "DELAY", "1", "RETRY", "0", "TTL", "60")
    wait_for(lambda: conn.cmd("QLEN", q) == 1, timeout=20, what="delayed retry-0 job queued")
    assert conn.cmd("GETJOB", "FROM", q)[0][1].decode() == job_id


def test_delayed_job_wakes_a_blocked_getjob(node, conn: Conn, q: str) -> None:  # type: ignore[no-untyped-def]
    with Conn(node.port) as waiter:
        waiter.send(encode("GETJOB", "TIMEOUT", "60000", "FROM", q))
        wait_for(lambda: blocked_on(conn, q) == 1, timeout=20, what="client blocked")
        job_id = add(conn, q, "b", "DELAY", "1", "TTL", "60")
        assert waiter.read(timeout=30)[0][1].decode() == job_id


def test_blocked_getjob_times_out_with_nil(node, q: str) -> None:  # type: ignore[no-untyped-def]
    with Conn(node.port) as waiter:
        start = time.monotonic()
        waiter.send(encode("GETJOB", "TIMEOUT", "300", "FROM", q))
        assert waiter.read_raw(timeout=20) == b"*-1\r\n"
        assert time.monotonic() - start >= 0.25     # it did block (the timeout is 300 ms)
        assert waiter.call("PING") == b"+PONG\r\n"  # the connection is usable afterwards


def test_blocked_getjob_with_timeout_0_waits_until_a_job_arrives(node, conn: Conn, q: str) -> None:  # type: ignore[no-untyped-def]
    with Conn(node.port) as waiter, Conn(node.port) as short:
        waiter.send(encode("GETJOB", "TIMEOUT", "0", "FROM", q))
        wait_for(lambda: blocked_on(conn, q) == 1, timeout=20, what="client blocked")
        # a client blocked later with a 500 ms timeout is timed out first...
        short.send(encode("GETJOB", "TIMEOUT", "500", "FROM", q + "-short"))
        assert short.read_raw(timeout=20) == b"*-1\r\n"
        # ...while TIMEOUT 0 is still waiting
        assert waiter.nothing_pending()
        assert blocked_on(conn, q) == 1
        job_id = add(conn, q, "late")
        assert waiter.read(timeout=20) == [[q.encode(), job_id.encode(), b"late"]]
        assert blocked_on(conn, q) == 0


def test_getjob_without_timeout_blocks_until_a_job_arrives(node, conn: Conn, q: str) -> None:  # type: ignore[no-untyped-def]
    with Conn(node.port) as waiter, Conn(node.port) as short:
        waiter.send(encode("GETJOB", "FROM", q))
        wait_for(lambda: blocked_on(conn, q) == 1, timeout=20, what="client blocked")
        short.send(encode("GETJOB", "TIMEOUT", "500", "FROM", q + "-short"))
        assert short.read_raw(timeout=20) == b"*-1\r\n"
        assert waiter.nothing_pending()
        job_id = add(conn, q)
        assert waiter.read(timeout=20)[0][1].decode() == job_id


def test_client_disconnect_while_blocked_leaves_no_trace(node, conn: Conn, q: str) -> None:  # type: ignore[no-untyped-def]
    """Regression (original issue): a blocked client going away crashed the server."""
    base_blocked = int(info(conn, "clients")["blocked_clients"])
    leaver = Conn(node.port)
    stayer = Conn(node.port)
    try:
        leaver.send(encode("GETJOB", "TIMEOUT", "0", "FROM", q, q + "-b"))
        wait_for(lambda: blocked_on(conn, q) == 1, timeout=20, what="first client blocked")
        stayer.send(encode("GETJOB", "TIMEOUT", "0", "FROM", q))
        wait_for(lambda: blocked_on(conn, q) == 2, timeout=20, what="second client blocked")
        leaver.close()
        wait_for(lambda: blocked_on(conn, q) == 1 and blocked_on(conn, q + "-b") == 0,
                 timeout=20, what="the closed client unblocked")
        wait_for(lambda: int(info(conn, "clients")["blocked_clients"]) == base_blocked + 1,
                 timeout=20, what="blocked_clients back to one")
        job_id = add(conn, q, "for-the-stayer")
        assert stayer.read(timeout=20)[0][1].decode() == job_id
        assert conn.cmd("QLEN", q) == 0
    finally:
        leaver.close()
        stayer.close()
    wait_for(lambda: int(info(conn, "clients")["blocked_clients"]) == base_blocked, timeout=20)


def test_job_added_after_blocked_client_left_stays_queued(node, conn: Conn, q: str) -> None:  # type: ignore[no-untyped-def]
    with Conn(node.port) as leaver:
        leaver.send(encode("GETJOB", "FROM", q))
        wait_for(lambda: blocked_on(conn, q) == 1, timeout=20, what="client blocked")
    wait_for(lambda: blocked_on(conn, q) == 0, timeout=20, what="client gone")
    job_id = add(conn, q)
    assert conn.cmd("QLEN", q) == 1
    assert conn.cmd("GETJOB", "NOHANG", "FROM", q)[0][1].decode() == job_id


def test_many_blocked_clients_disconnecting_around_their_timeout(node, conn: Conn, q: str) -> None:  # type: ignore[no-untyped-def]
    before = info(conn)
    base_blocked = int(before["blocked_clients"])
    base_connected = int(before["connected_clients"])
    base_accepted = int(before["total_connections_received"])
    for round_ in range(5):
        clients = [Conn(node.port) for _ in range(20)]
        for i, c in enumerate(clients):
            c.send(encode("GETJOB", "TIMEOUT", str(20 + i * 5), "FROM", q, f"{q}-{round_}"))
        for c in clients:
            c.close()

    def all_gone() -> bool:
        now = info(conn)
        # every connection accepted and closed by the server, so none of them can still
        # be handed a job
        return (int(now["total_connections_received"]) >= base_accepted + 100
                and int(now["connected_clients"]) == base_connected
                and int(now["blocked_clients"]) == base_blocked)

    wait_for(all_gone, timeout=30, what="all 100 clients accepted, closed and unblocked")
    for name in [q] + [f"{q}-{r}" for r in range(5)]:
        assert blocked_on(conn, name) == 0, name
    assert conn.call("PING") == b"+PONG\r\n"
    job_id = add(conn, q)
    assert conn.cmd("GETJOB", "NOHANG", "FROM", q)[0][1].decode() == job_id


def test_working_keeps_a_job_from_being_requeued(conn: Conn, q: str) -> None:
    job_id = add(conn, q, "b", "RETRY", "4", "TTL", "60")
    marker = add(conn, q + "-marker", "b", "RETRY", "4", "TTL", "60")
    conn.cmd("GETJOB", "FROM", q)
    conn.cmd("GETJOB", "FROM", q + "-marker")
    assert conn.cmd("WORKING", job_id) == 4
    job = show(conn, job_id)
    assert job is not None and job["next-requeue-within"] >= 3000
    for _ in range(3):
        # keep postponing about once a second; the marker (same RETRY, no WORKING) comes
        # back after ~4 s, ours must not
        wait_for(lambda: show(conn, job_id)["next-requeue-within"] <= 3000,  # type: ignore[index]
                 timeout=20, interval=0.05, what="next requeue approaching")
        assert conn.cmd("QLEN", q) == 0
        assert conn.cmd("WORKING", job_id) == 4
    wait_for(lambda: conn.cmd("QLEN", q + "-marker") == 1, timeout=20, what="marker requeued")
    assert conn.cmd("QLEN", q) == 0
    conn.cmd("ACKJOB", job_id, marker)
