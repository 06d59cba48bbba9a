"""NACK ... DELAY seconds on one node: the job goes back to its queue only after the delay,
counting one nack and no additional delivery; the option's errors change nothing."""

from __future__ import annotations

import time

from tests.harness import wait_for
from tests.integration.resp import Conn, Err, show


def fetch_one(conn: Conn, q: str) -> str:
    jobs = conn.cmd("GETJOB", "NOHANG", "FROM", q)
    assert jobs, f"no job in {q}"
    return jobs[0][1].decode() if isinstance(jobs[0][1], bytes) else jobs[0][1]


def test_nack_delay_requeues_after_the_delay_counting_one_nack(conn: Conn, q: str) -> None:
    job_id = conn.cmd("ADDJOB", q, "body", 0, "RETRY", 60)
    assert fetch_one(conn, q) == job_id
    nacked_at = time.monotonic()
    assert conn.cmd("NACK", job_id, "DELAY", 2) == 1
    job = show(conn, job_id)
    assert job is not None and job["state"] == b"active"
    assert job["nacks"] == 1 and job["additional-deliveries"] == 0
    assert 1000 <= job["next-requeue-within"] <= 2000
    assert conn.cmd("QLEN", q) == 0
    wait_for(lambda: conn.cmd("QLEN", q) == 1, timeout=10)
    assert time.monotonic() - nacked_at >= 1.9
    job = show(conn, job_id)
    assert job["state"] == b"queued"
    assert (job["nacks"], job["additional-deliveries"]) == (1, 0)


def test_nack_delay_option_may_come_first_and_zero_means_now(conn: Conn, q: str) -> None:
    a = conn.cmd("ADDJOB", q, "a", 0)
    b = conn.cmd("ADDJOB", q, "b", 0)
    conn.cmd("GETJOB", "NOHANG", "COUNT", 2, "FROM", q)
    assert conn.cmd("NACK", "delay", 0, a, b) == 2
    assert conn.cmd("QLEN", q) == 2
    assert show(conn, a)["nacks"] == 1


def test_nack_delay_bad_values_are_errors_and_change_nothing(conn: Conn, q: str) -> None:
    job_id = conn.cmd("ADDJOB", q, "body", 0)
    fetch_one(conn, q)
    for args in (("DELAY", -1), ("DELAY", "abc"), ("DELAY",), ("DELAY", 10**12)):
        reply = conn.cmd("NACK", job_id, *args)
        assert isinstance(reply, Err) and reply.startswith("ERR"), (args, reply)
    assert conn.cmd("NACK", job_id, "DELAY", 5, "not-an-id") == Err("BADID Invalid Job ID format.")
    job = show(conn, job_id)
    assert job["nacks"] == 0 and job["state"] == b"active"


def test_nack_delay_of_an_at_most_once_or_queued_job_does_nothing(conn: Conn, q: str) -> None:
    once = conn.cmd("ADDJOB", q, "once", 0, "RETRY", 0)
    fetch_one(conn, q)
    assert conn.cmd("NACK", once, "DELAY", 3) == 0
    queued = conn.cmd("ADDJOB", q, "queued", 0)
    assert conn.cmd("NACK", queued, "DELAY", 3) == 0
    assert show(conn, queued)["state"] == b"queued"


def test_a_nack_of_a_backoff_job_puts_it_off_longer_each_time(conn: Conn, q: str) -> None:
    # BACKOFF 3: the k-th failed delivery waits min(3, 2^(k-1)) s x [0.5, 1), rounded up:
    # 1 s, then 1-2 s, then 2-3 s (capped); a NACK ... DELAY 0 still requeues at once
    job_id = conn.cmd("ADDJOB", q, "body", 0, "RETRY", 60, "BACKOFF", 3)
    assert show(conn, job_id)["backoff"] == 3
    for k, (low, high) in enumerate([(1, 1), (1, 2), (2, 3)], start=1):
        assert fetch_one(conn, q) == job_id
        assert conn.cmd("NACK", job_id) == 1
        job = show(conn, job_id)
        assert job["state"] == b"active" and job["nacks"] == k
        assert (low - 1) * 1000 < job["next-requeue-within"] <= high * 1000, (k, job)
        assert conn.cmd("QLEN", q) == 0
        wait_for(lambda: conn.cmd("QLEN", q) == 1, timeout=10)
    assert fetch_one(conn, q) == job_id
    assert conn.cmd("NACK", job_id, "DELAY", 0) == 1
    assert conn.cmd("QLEN", q) == 1 and show(conn, job_id)["nacks"] == 4
    assert show(conn, job_id)["additional-deliveries"] == 0
