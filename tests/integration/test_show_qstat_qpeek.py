"""SHOW, QLEN, QSTAT, QPEEK: exact shapes, field names and order, errors (checklist §4, §5)."""

from __future__ import annotations

import time

import pytest

from tests.harness import wait_for
from tests.integration.resp import (
    JOB_ID_RE,
    QSTAT_FIELDS,
    SHOW_FIELDS,
    Conn,
    add,
    blocked_on,
    encode,
    keys_of,
    node_id,
    pairs,
    parse,
    show,
)

UNKNOWN_ID = "D-00000000-AAAAAAAAAAAAAAAAAAAAAAAA-05a1"


# -- SHOW ------------------------------------------------------------------------------------------

def test_show_is_a_flat_30_element_array_with_fields_in_order(conn: Conn, q: str) -> None:
    job_id = add(conn, q, "the body", "RETRY", "100", "TTL", "1000")
    raw = conn.call("SHOW", job_id)
    assert raw.startswith(b"*30\r\n$2\r\nid\r\n$40\r\n" + job_id.encode() + b"\r\n"), raw[:80]
    flat = parse(raw)[0]  # type: ignore[index]
    assert keys_of(flat) == SHOW_FIELDS
    job = pairs(flat)
    assert job["queue"] == q.encode()
    assert job["state"] == b"queued"
    for field in ("repl", "ttl", "ctime", "delay", "retry", "nacks", "additional-deliveries"):
        assert isinstance(job[field], int), (field, job[field])
    assert job["repl"] == 1 and job["delay"] == 0 and job["retry"] == 100
    assert 990 <= job["ttl"] <= 1000
    assert job["nodes-delivered"] == [node_id(conn).encode()]
    assert job["nodes-confirmed"] == []
    assert isinstance(job["next-requeue-within"], int)
    assert 0 <= job["next-requeue-within"] <= 100_250
    assert job["next-awake-within"] is None or job["next-awake-within"] >= 0
    assert job["body"] == b"the body"


def test_show_field_types_on_the_wire(conn: Conn, q: str) -> None:
    job_id = add(conn, q, "b", "RETRY", "0")
    raw = conn.call("SHOW", job_id)
    # state is a bulk, counters are integers, nodes-confirmed is an empty array
    assert b"$5\r\nstate\r\n$6\r\nqueued\r\n$4\r\nrepl\r\n:1\r\n" in raw
    assert b"$15\r\nnodes-confirmed\r\n*0\r\n" in raw
    # a retry-0 job that was already queued is never requeued: nil
    assert b"$19\r\nnext-requeue-within\r\n$-1\r\n" in raw


def test_show_of_active_job_after_getjob(conn: Conn, q: str) -> None:
    job_id = add(conn, q, "b", "RETRY", "50")
    conn.cmd("GETJOB", "FROM", q)
    job = show(conn, job_id)
    assert job is not None
    assert job["state"] == b"active"
    assert 0 <= job["next-requeue-within"] <= 50_250


def test_show_ctime_is_unix_ms_times_a_million(conn: Conn, q: str) -> None:
    now_ms = time.time() * 1000
    job = show(conn, add(conn, q))
    assert job is not None
    assert abs(job["ctime"] / 1_000_000 - now_ms) < 5000


def test_show_unknown_job_is_nil_bulk(conn: Conn) -> None:
    assert conn.call("SHOW", UNKNOWN_ID) == b"$-1\r\n"


def test_show_arity(conn: Conn) -> None:
    err = b"-ERR wrong number of arguments for 'show' command\r\n"
    assert conn.call("SHOW") == err
    assert conn.call("SHOW", UNKNOWN_ID, UNKNOWN_ID) == err


# -- QLEN ------------------------------------------------------------------------------------------

def test_qlen_unknown_queue_is_zero(conn: Conn, q: str) -> None:
    assert conn.call("QLEN", q) == b":0\r\n"


def test_qlen_counts_queued_jobs(conn: Conn, q: str) -> None:
    for i in range(7):
        add(conn, q, f"b{i}")
    assert conn.call("QLEN", q) == b":7\r\n"
    conn.cmd("GETJOB", "COUNT", "3", "FROM", q)
    assert conn.call("QLEN", q) == b":4\r\n"


def test_qlen_arity(conn: Conn) -> None:
    assert conn.call("QLEN") == b"-ERR wrong number of arguments for 'qlen' command\r\n"


# -- QPEEK -----------------------------------------------------------------------------------------

def test_qpeek_positive_count_oldest_first(conn: Conn, q: str) -> None:
    ids = [add(conn, q, f"b{i}") for i in range(5)]
    got = conn.cmd("QPEEK", q, "3")
    assert [j[1].decode() for j in got] == ids[:3]
    assert [j[2] for j in got] == [b"b0", b"b1", b"b2"]
    assert all(j[0] == q.encode() for j in got)


def test_qpeek_negative_count_newest_first(conn: Conn, q: str) -> None:
    ids = [add(conn, q, f"b{i}") for i in range(5)]
    got = conn.cmd("QPEEK", q, "-2")
    assert [j[1].decode() for j in got] == [ids[4], ids[3]]


def test_qpeek_count_larger_than_queue_returns_all(conn: Conn, q: str) -> None:
    ids = [add(conn, q, f"b{i}") for i in range(3)]
    assert [j[1].decode() for j in conn.cmd("QPEEK", q, "100")] == ids
    assert [j[1].decode() for j in conn.cmd("QPEEK", q, "-100")] == ids[::-1]


def test_qpeek_item_is_queue_id_body_with_bulk_id(conn: Conn, q: str) -> None:
    job_id = add(conn, q, "xyz")
    qb = q.encode()
    assert conn.call("QPEEK", q, "1") == (
        b"*1\r\n*3\r\n$%d\r\n%s\r\n$40\r\n%s\r\n$3\r\nxyz\r\n" % (len(qb), qb, job_id.encode()))


def test_qpeek_zero_and_unknown_queue_are_empty_arrays(conn: Conn, q: str) -> None:
    assert conn.call("QPEEK", q, "5") == b"*0\r\n"
    add(conn, q)
    assert conn.call("QPEEK", q, "0") == b"*0\r\n"


def test_qpeek_does_not_change_state(conn: Conn, q: str) -> None:
    job_id = add(conn, q)
    conn.cmd("QPEEK", q, "1")
    conn.cmd("QPEEK", q, "-1")
    assert conn.cmd("QLEN", q) == 1
    job = show(conn, job_id)
    assert job is not None and job["state"] == b"queued"
    assert pairs(conn.cmd("QSTAT", q))["jobs-out"] == 0


@pytest.mark.parametrize("count", ["abc", "1.0", " 1", "99999999999999999999"])
def test_qpeek_count_not_an_integer(conn: Conn, q: str, count: str) -> None:
    assert conn.call("QPEEK", q, count) == b"-ERR value is not an integer or out of range\r\n"


def test_qpeek_arity(conn: Conn, q: str) -> None:
    assert conn.call("QPEEK", q) == b"-ERR wrong number of arguments for 'qpeek' command\r\n"


# -- QSTAT -----------------------------------------------------------------------------------------

def test_qstat_unknown_queue_is_nil_array(conn: Conn, q: str) -> None:
    assert conn.call("QSTAT", q) == b"*-1\r\n"


def test_qstat_fields_in_order_and_types(conn: Conn, q: str) -> None:
    add(conn, q)
    add(conn, q)
    raw = conn.call("QSTAT", q)
    qb = q.encode()
    assert raw.startswith(b"*20\r\n$4\r\nname\r\n$%d\r\n%s\r\n$3\r\nlen\r\n:2\r\n" % (len(qb), qb))
    assert b"$11\r\nimport-from\r\n*0\r\n" in raw
    assert raw.endswith(b"$5\r\npause\r\n$4\r\nnone\r\n")
    flat = parse(raw)[0]  # type: ignore[index]
    assert keys_of(flat) == QSTAT_FIELDS
    st = pairs(flat)
    assert 0 <= st["age"] <= 60 and 0 <= st["idle"] <= 60
    assert st["blocked"] == 0
    assert st["import-rate"] == 0
    assert st["jobs-in"] == 2 and st["jobs-out"] == 0


def test_qstat_counts_jobs_in_and_out(conn: Conn, q: str) -> None:
    ids = [add(conn, q) for _ in range(3)]
    conn.cmd("GETJOB", "FROM", q)
    st = pairs(conn.cmd("QSTAT", q))
    assert (st["len"], st["jobs-in"], st["jobs-out"]) == (2, 3, 1)
    conn.cmd("NACK", ids[0])                      # back into the queue: one more in
    st = pairs(conn.cmd("QSTAT", q))
    assert (st["len"], st["jobs-in"], st["jobs-out"]) == (3, 4, 1)


def test_qstat_counts_blocked_clients(node, conn: Conn, q: str) -> None:  # type: ignore[no-untyped-def]
    waiters = [Conn(node.port) for _ in range(2)]
    try:
        for w in waiters:
            w.send(encode("GETJOB", "TIMEOUT", "60000", "FROM", q))
        wait_for(lambda: blocked_on(conn, q) == 2, timeout=20,
                 what="two clients blocked on the queue")
    finally:
        for w in waiters:
            w.close()
    wait_for(lambda: blocked_on(conn, q) == 0, timeout=20,
             what="blocked count back to 0 after the clients left")


def test_qstat_arity(conn: Conn) -> None:
    assert conn.call("QSTAT") == b"-ERR wrong number of arguments for 'qstat' command\r\n"


def test_ids_listed_everywhere_are_well_formed(conn: Conn, q: str) -> None:
    job_id = add(conn, q)
    assert JOB_ID_RE.match(conn.cmd("QPEEK", q, "1")[0][1].decode())
    assert show(conn, job_id)["id"].decode() == job_id  # type: ignore[index]
