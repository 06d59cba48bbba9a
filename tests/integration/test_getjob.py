"""GETJOB: reply shapes, COUNT, WITHCOUNTERS, FROM several queues, blocking across queues and
every argument error (checklist §4 GETJOB; issue 3)."""

from __future__ import annotations

import pytest

from tests.harness import wait_for
from tests.integration.resp import Conn, add, encode, pairs, show


def test_getjob_reply_is_array_of_queue_id_body_with_bulk_id(conn: Conn, q: str) -> None:
    job_id = add(conn, q, "payload")
    raw = conn.call("GETJOB", "FROM", q)
    qb = q.encode()
    assert raw == (b"*1\r\n*3\r\n$%d\r\n%s\r\n$40\r\n%s\r\n$7\r\npayload\r\n"
                   % (len(qb), qb, job_id.encode()))


def test_getjob_nohang_on_empty_queue_is_nil_array(conn: Conn, q: str) -> None:
    assert conn.call("GETJOB", "NOHANG", "FROM", q) == b"*-1\r\n"


def test_getjob_makes_the_job_active_and_shrinks_the_queue(conn: Conn, q: str) -> None:
    job_id = add(conn, q)
    add(conn, q)
    assert conn.cmd("QLEN", q) == 2
    got = conn.cmd("GETJOB", "FROM", q)
    assert got[0][1] == job_id.encode()
    assert conn.cmd("QLEN", q) == 1
    job = show(conn, job_id)
    assert job is not None and job["state"] == b"active"


def test_qlen_never_exceeds_jobs_really_available(conn: Conn, q: str) -> None:
    """Regression (original issue): QLEN reported jobs GETJOB could not return."""
    for _ in range(5):
        add(conn, q)
    fetched = 0
    while True:
        n = conn.cmd("QLEN", q)
        got = conn.cmd("GETJOB", "NOHANG", "COUNT", "2", "FROM", q)
        if got is None:
            assert n == 0
            break
        assert len(got) == min(2, n)
        fetched += len(got)
    assert fetched == 5


def test_getjob_returns_jobs_in_fifo_order(conn: Conn, q: str) -> None:
    ids = conn.pipeline([("ADDJOB", q, f"b{i}", "0") for i in range(100)])
    got = []
    for _ in range(100):
        got.append(conn.cmd("GETJOB", "TIMEOUT", "5000", "FROM", q)[0][1].decode())
    assert got == [str(i) for i in ids]


def test_getjob_count_returns_up_to_count_oldest_first(conn: Conn, q: str) -> None:
    ids = [add(conn, q, f"b{i}") for i in range(3)]
    got = conn.cmd("GETJOB", "COUNT", "2", "FROM", q)
    assert [j[1].decode() for j in got] == ids[:2]
    got = conn.cmd("GETJOB", "COUNT", "10", "FROM", q)
    assert [j[1].decode() for j in got] == ids[2:]


def test_getjob_from_several_queues_takes_one_per_queue_per_pass(conn: Conn, q: str) -> None:
    qa, qb = q + "-a", q + "-b"
    a1, a2, a3 = (add(conn, qa, f"a{i}") for i in range(3))
    b1 = add(conn, qb, "b1")
    got = conn.cmd("GETJOB", "COUNT", "3", "FROM", qa, qb)
    assert [j[1].decode() for j in got] == [a1, b1, a2]
    assert [j[0].decode() for j in got] == [qa, qb, qa]
    assert conn.cmd("GETJOB", "NOHANG", "COUNT", "5", "FROM", qb, qa)[0][1].decode() == a3


def test_getjob_same_queue_listed_twice_is_visited_twice_per_pass(conn: Conn, q: str) -> None:
    qa, qb = q + "-a", q + "-b"
    a1, a2 = add(conn, qa, "a1"), add(conn, qa, "a2")
    b1 = add(conn, qb, "b1")
    got = conn.cmd("GETJOB", "COUNT", "3", "FROM", qa, qb, qa)
    assert [j[1].decode() for j in got] == [a1, b1, a2]


def test_getjob_withcounters_shape(conn: Conn, q: str) -> None:
    job_id = add(conn, q, "body")
    raw = conn.call("GETJOB", "WITHCOUNTERS", "FROM", q)
    qb = q.encode()
    assert raw == (b"*1\r\n*7\r\n$%d\r\n%s\r\n$40\r\n%s\r\n$4\r\nbody\r\n"
                   b"$5\r\nnacks\r\n:0\r\n$21\r\nadditional-deliveries\r\n:0\r\n"
                   % (len(qb), qb, job_id.encode()))


def test_getjob_withcounters_reports_nacks(conn: Conn, q: str) -> None:
    job_id = add(conn, q)
    conn.cmd("GETJOB", "FROM", q)
    assert conn.cmd("NACK", job_id) == 1
    conn.cmd("GETJOB", "FROM", q)
    assert conn.cmd("NACK", job_id) == 1
    got = conn.cmd("GETJOB", "WITHCOUNTERS", "FROM", q)[0]
    assert got[3:] == [b"nacks", 2, b"additional-deliveries", 0]


def test_getjob_options_in_any_order_and_case_insensitive(conn: Conn, q: str) -> None:
    add(conn, q)
    add(conn, q)
    got = conn.cmd("getjob", "withcounters", "count", "2", "nohang", "timeout", "100", "from", q)
    assert len(got) == 2 and all(len(j) == 7 for j in got)


def test_getjob_every_token_after_from_is_a_queue_name(conn: Conn) -> None:
    add(conn, "WITHCOUNTERS", "odd-name")
    got = conn.cmd("GETJOB", "NOHANG", "FROM", "NOHANG", "WITHCOUNTERS")
    assert len(got) == 1
    assert got[0][0] == b"WITHCOUNTERS" and got[0][2] == b"odd-name"
    assert len(got[0]) == 3


def test_getjob_count_zero_is_an_error(conn: Conn, q: str) -> None:
    """Regression (original issue): COUNT 0 used to return a job."""
    add(conn, q)
    assert conn.call("GETJOB", "COUNT", "0", "FROM", q) == (
        b"-ERR COUNT must be a number greater than zero\r\n")
    assert conn.cmd("QLEN", q) == 1


@pytest.mark.parametrize("count", ["-1", "abc", "1.5", "99999999999999999999999"])
def test_getjob_bad_count(conn: Conn, q: str, count: str) -> None:
    assert conn.call("GETJOB", "COUNT", count, "FROM", q) == (
        b"-ERR COUNT must be a number greater than zero\r\n")


def test_getjob_timeout_not_an_integer(conn: Conn, q: str) -> None:
    assert conn.call("GETJOB", "TIMEOUT", "soon", "FROM", q) == (
        b"-ERR timeout is not an integer or out of range\r\n")


def test_getjob_timeout_negative(conn: Conn, q: str) -> None:
    assert conn.call("GETJOB", "TIMEOUT", "-10", "FROM", q) == b"-ERR timeout is negative\r\n"


@pytest.mark.parametrize(
    "args",
    [
        ("FROM",),                       # FROM without queues
        ("NOHANG",),                     # missing FROM
        ("COUNT", "1"),
        ("TIMEOUT",),                    # value option as last token
        ("COUNT",),
        ("BADOPTION", "FROM", "q"),
        ("myqueue",),
    ],
)
def test_getjob_syntax_errors(conn: Conn, args: tuple[str, ...]) -> None:
    assert conn.call("GETJOB", *args) == b"-ERR syntax error\r\n"


def test_getjob_without_arguments_is_wrong_arity(conn: Conn) -> None:
    assert conn.call("GETJOB") == b"-ERR wrong number of arguments for 'getjob' command\r\n"


def test_getjob_pops_update_qstat_jobs_out(conn: Conn, q: str) -> None:
    add(conn, q)
    add(conn, q)
    conn.cmd("GETJOB", "COUNT", "2", "FROM", q)
    st = pairs(conn.cmd("QSTAT", q))
    assert st["jobs-in"] == 2 and st["jobs-out"] == 2 and st["len"] == 0


def test_blocked_getjob_is_served_by_a_job_on_any_of_its_queues(node, q: str) -> None:  # type: ignore[no-untyped-def]
    qa, qb, qc = q + "-a", q + "-b", q + "-c"
    with Conn(node.port) as waiter, Conn(node.port) as producer:
        waiter.send(encode("GETJOB", "TIMEOUT", "60000", "FROM", qa, qb, qc))
        wait_for(lambda: pairs(producer.cmd("QSTAT", qb))["blocked"] == 1,
                 timeout=20, what="client blocked on qb")
        assert waiter.nothing_pending()
        job_id = add(producer, qb, "for-b")
        got = waiter.read(timeout=20)
        assert got == [[qb.encode(), job_id.encode(), b"for-b"]]
        assert producer.cmd("QLEN", qb) == 0
        for name in (qa, qb, qc):
            wait_for(lambda n=name: pairs(producer.cmd("QSTAT", n))["blocked"] == 0,
                     timeout=20, what=f"no client left blocked on {name}")


def test_blocked_getjob_gets_one_job_even_with_count(node, q: str) -> None:  # type: ignore[no-untyped-def]
    with Conn(node.port) as waiter, Conn(node.port) as producer:
        waiter.send(encode("GETJOB", "COUNT", "5", "WITHCOUNTERS", "FROM", q))
        wait_for(lambda: pairs(producer.cmd("QSTAT", q))["blocked"] == 1,
                 timeout=20, what="client blocked")
        producer.pipeline([("ADDJOB", q, f"b{i}", "0") for i in range(3)])
        got = waiter.read(timeout=20)
        assert len(got) == 1
        assert len(got[0]) == 7 and got[0][2] == b"b0"
        assert producer.cmd("QLEN", q) == 2


def test_blocked_getjobs_are_served_first_come_first_served(node, q: str) -> None:  # type: ignore[no-untyped-def]
    with Conn(node.port) as w1, Conn(node.port) as w2, Conn(node.port) as producer:
        w1.send(encode("GETJOB", "FROM", q))
        wait_for(lambda: pairs(producer.cmd("QSTAT", q))["blocked"] == 1, timeout=20,
                 what="first waiter blocked")
        w2.send(encode("GETJOB", "FROM", q))
        wait_for(lambda: pairs(producer.cmd("QSTAT", q))["blocked"] == 2, timeout=20,
                 what="second waiter blocked")
        first = add(producer, q, "one")
        assert w1.read(timeout=20)[0][1].decode() == first
        second = add(producer, q, "two")
        assert w2.read(timeout=20)[0][1].decode() == second
