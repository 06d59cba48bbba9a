"""ADDJOB: reply shape, job IDs, defaults, every option and every validation error
(checklist §2 and §4 ADDJOB; issue 3)."""

from __future__ import annotations

import time

import pytest

from tests.harness import DisqueProcess
from tests.integration.resp import JOB_ID_RE, Conn, Err, Status, add, node_id, show


def test_addjob_replies_with_a_status_job_id(conn: Conn, q: str) -> None:
    raw = conn.call("ADDJOB", q, "body", "0")
    assert raw.startswith(b"+D-") and raw.endswith(b"\r\n"), raw
    job_id = raw[1:-2].decode()
    assert len(job_id) == 40
    assert JOB_ID_RE.match(job_id), job_id


def test_job_id_embeds_first_8_chars_of_node_id(conn: Conn, q: str) -> None:
    me = node_id(conn)
    assert len(me) == 40 and all(c in "0123456789abcdef" for c in me), me
    job_id = add(conn, q)
    assert job_id[2:10] == me[:8]


@pytest.mark.parametrize(
    ("opts", "suffix"),
    [
        ((), "05a1"),                          # TTL 86400 -> 1440 min, retry > 0 -> odd
        (("RETRY", "0"), "05a0"),              # retry 0 -> even
        (("TTL", "100"), "0001"),
        (("TTL", "5"), "0001"),                # 0 minutes, forced odd by the default retry
        (("TTL", "5", "RETRY", "0"), "0000"),
        (("TTL", "240", "RETRY", "1"), "0005"),
        (("TTL", "180", "RETRY", "0"), "0002"),
        (("TTL", "9999999"), "ffff"),          # capped at 65535 minutes
        (("TTL", "9999999", "RETRY", "0"), "fffe"),
    ],
)
def test_job_id_ttl_field_is_minutes_odd_for_retry_even_for_at_most_once(
        conn: Conn, q: str, opts: tuple[str, ...], suffix: str) -> None:
    job_id = add(conn, q, "body", *opts)
    assert JOB_ID_RE.match(job_id), job_id
    assert job_id[36:] == suffix


def test_job_ids_are_unique(conn: Conn, q: str) -> None:
    replies = conn.pipeline([("ADDJOB", q, f"b{i}", "0") for i in range(1000)])
    assert all(isinstance(r, Status) for r in replies), replies[:3]
    assert len(set(replies)) == 1000
    assert all(JOB_ID_RE.match(r) for r in replies)


def test_addjob_defaults_single_node(conn: Conn, q: str) -> None:
    job_id = add(conn, q, "hello")
    job = show(conn, job_id)
    assert job is not None
    assert job["id"] == job_id.encode()
    assert job["queue"] == q.encode()
    assert job["state"] == b"queued"
    assert job["repl"] == 1
    assert 86390 <= job["ttl"] <= 86400
    assert job["delay"] == 0
    assert job["retry"] == 300
    assert job["nacks"] == 0
    assert job["additional-deliveries"] == 0
    assert job["nodes-delivered"] == [node_id(conn).encode()]
    assert job["nodes-confirmed"] == []
    assert job["body"] == b"hello"
    assert conn.cmd("QLEN", q) == 1


@pytest.mark.parametrize(("ttl", "retry"), [("100", 10), ("20", 2), ("5", 1), ("9", 1),
                                            ("3000", 300), ("86400", 300)])
def test_default_retry_is_ttl_tenth_capped_at_300_and_at_least_1(
        conn: Conn, q: str, ttl: str, retry: int) -> None:
    job = show(conn, add(conn, q, "b", "TTL", ttl))
    assert job is not None
    assert job["retry"] == retry


def test_addjob_options_are_applied(conn: Conn, q: str) -> None:
    job_id = add(conn, q, "b", "TTL", "600", "RETRY", "30", "REPLICATE", "1")
    job = show(conn, job_id)
    assert job is not None
    assert 590 <= job["ttl"] <= 600
    assert job["retry"] == 30
    assert job["repl"] == 1


def test_addjob_options_are_case_insensitive(conn: Conn, q: str) -> None:
    job_id = add(conn, q, "b", "ttl", "100", "retry", "0", "replicate", "1", "maxlen", "10",
                 "async")
    assert job_id.endswith("-0000")
    job = show(conn, job_id)
    assert job is not None and job["retry"] == 0


def test_addjob_repeated_option_last_wins(conn: Conn, q: str) -> None:
    job_id = add(conn, q, "b", "RETRY", "7", "RETRY", "0", "TTL", "50", "TTL", "600")
    assert job_id.endswith("-000a")
    job = show(conn, job_id)
    assert job is not None
    assert job["retry"] == 0
    assert job["ttl"] > 500


def test_addjob_async_on_single_node_queues_at_once(conn: Conn, q: str) -> None:
    job_id = add(conn, q, "b", "ASYNC")
    job = show(conn, job_id)
    assert job is not None and job["state"] == b"queued"


def test_addjob_body_is_binary_safe(conn: Conn, q: str) -> None:
    body = bytes(range(256)) + b"\r\n\x00*1\r\n$-1\r\n"
    add(conn, q, body)
    add(conn, q, b"")
    got = conn.cmd("GETJOB", "COUNT", "2", "FROM", q)
    assert [j[2] for j in got] == [body, b""]


def test_ctime_strictly_increases_and_follows_the_wall_clock(conn: Conn, q: str) -> None:
    before_ms = int(time.time() * 1000)
    ids = conn.pipeline([("ADDJOB", q, "b", "0") for _ in range(300)])
    after_ms = int(time.time() * 1000)
    ctimes = [show(conn, i)["ctime"] for i in ids]  # type: ignore[index]
    assert all(b > a for a, b in zip(ctimes, ctimes[1:], strict=False))
    # ctime = unix ms * 1e6 (plus a tie-breaking counter)
    assert (before_ms - 2000) * 1_000_000 <= ctimes[0]
    assert ctimes[-1] <= (after_ms + 2000) * 1_000_000


# -- validation errors, exact texts (checklist §4 ADDJOB, first failure wins) ---------------------

REPLICATE_ERR = b"-ERR REPLICATE must be between 1 and 65535\r\n"
TTL_ERR = b"-ERR TTL must be a number > 0\r\n"
RETRY_ERR = b"-ERR RETRY time must be a non negative number\r\n"
DELAY_ERR = b"-ERR DELAY time must be a non negative number\r\n"
MAXLEN_ERR = b"-ERR MAXLEN must be a positive number\r\n"
SYNTAX = b"-ERR syntax error\r\n"


@pytest.mark.parametrize(
    ("opts", "expected"),
    [
        (("REPLICATE", "0"), REPLICATE_ERR),
        (("REPLICATE", "-1"), REPLICATE_ERR),
        (("REPLICATE", "65536"), REPLICATE_ERR),
        (("REPLICATE", "abc"), REPLICATE_ERR),
        (("TTL", "0"), TTL_ERR),
        (("TTL", "-5"), TTL_ERR),
        (("TTL", "ten"), TTL_ERR),
        (("TTL", "1.5"), TTL_ERR),
        (("TTL", "99999999999999999999999"), TTL_ERR),
        (("RETRY", "-1"), RETRY_ERR),
        (("RETRY", "x"), RETRY_ERR),
        (("DELAY", "-1"), DELAY_ERR),
        (("DELAY", "soon"), DELAY_ERR),
        (("MAXLEN", "0"), MAXLEN_ERR),
        (("MAXLEN", "-3"), MAXLEN_ERR),
        (("MAXLEN", "many"), MAXLEN_ERR),
        (("TTL",), SYNTAX),
        (("RETRY", "1", "DELAY"), SYNTAX),
        (("NOSUCHOPTION",), SYNTAX),
        (("ASYNC", "extra"), SYNTAX),
        (("TTL", "0", "RETRY", "-1"), TTL_ERR),   # left to right, first failure wins
        (("RETRY", "-1", "TTL", "0"), RETRY_ERR),
    ],
)
def test_addjob_option_errors(conn: Conn, q: str, opts: tuple[str, ...], expected: bytes) -> None:
    assert conn.call("ADDJOB", q, "body", "0", *opts) == expected
    assert conn.cmd("QLEN", q) == 0


def test_addjob_timeout_not_an_integer(conn: Conn, q: str) -> None:
    assert conn.call("ADDJOB", q, "b", "soon") == b"-ERR timeout is not an integer or out of range\r\n"


def test_addjob_timeout_negative(conn: Conn, q: str) -> None:
    assert conn.call("ADDJOB", q, "b", "-1") == b"-ERR timeout is negative\r\n"


def test_addjob_option_errors_come_before_timeout_errors(conn: Conn, q: str) -> None:
    assert conn.call("ADDJOB", q, "b", "soon", "TTL", "0") == TTL_ERR


def test_addjob_retry_zero_with_replicate_above_one_is_refused(conn: Conn, q: str) -> None:
    assert conn.call("ADDJOB", q, "b", "0", "REPLICATE", "2", "RETRY", "0") == (
        b"-ERR With RETRY set to 0 please explicitly set  REPLICATE to 1 "
        b"(at-most-once delivery)\r\n")


@pytest.mark.parametrize(("ttl", "delay"), [("10", "10"), ("10", "11"), ("5", "100")])
def test_addjob_delay_not_smaller_than_ttl_is_refused(
        conn: Conn, q: str, ttl: str, delay: str) -> None:
    assert conn.call("ADDJOB", q, "b", "0", "TTL", ttl, "DELAY", delay) == (
        b"-ERR The specified DELAY is greater than TTL. Job refused since would never be "
        b"delivered\r\n")


def test_addjob_retry_zero_check_comes_before_delay_check(conn: Conn, q: str) -> None:
    reply = conn.cmd("ADDJOB", q, "b", "0", "REPLICATE", "3", "RETRY", "0", "TTL", "5",
                     "DELAY", "10")
    assert isinstance(reply, Err) and reply.startswith("ERR With RETRY set to 0"), reply


@pytest.mark.parametrize("extra", [(), ("ASYNC",)])
def test_replicate_above_one_on_a_single_node_is_norepl(
        conn: Conn, q: str, extra: tuple[str, ...]) -> None:
    raw = conn.call("ADDJOB", q, "b", "0", "REPLICATE", "2", *extra)
    assert raw == b"-NOREPL Not enough reachable nodes for the requested replication level\r\n"
    assert conn.cmd("QLEN", q) == 0


@pytest.mark.parametrize("extra", [(), ("ASYNC",)])
def test_lone_leaving_node_refuses_addjob_with_the_norepl_reason(
        server: DisqueProcess, extra: tuple[str, ...]) -> None:
    """Issue 15 / checklist ADDJOB external replication: a leaving node keeps no copy, so
    alone it cannot hold even REPLICATE 1; disque-py accepted a job it was about to drop."""
    conn = Conn(server.port)
    try:
        assert conn.cmd("CLUSTER", "LEAVING", "yes") == Status("OK")
        raw = conn.call("ADDJOB", "q", "body", "0", "REPLICATE", "1", *extra)
        assert raw == (b"-NOREPL Not enough reachable nodes for the requested replication "
                       b"level, since I'm unable to hold a copy of the message for the "
                       b"following reason: I'm leaving the cluster\r\n")
        assert conn.call("ADDJOB", "q", "body", "0", "REPLICATE", "2") == (
            b"-NOREPL Not enough reachable nodes for the requested replication level\r\n")
        assert conn.cmd("QLEN", "q") == 0
        assert conn.cmd("CLUSTER", "LEAVING", "no") == Status("OK")
        assert JOB_ID_RE.match(conn.cmd("ADDJOB", "q", "body", "0"))
    finally:
        conn.close()


def test_delay_check_comes_before_norepl(conn: Conn, q: str) -> None:
    reply = conn.cmd("ADDJOB", q, "b", "0", "REPLICATE", "5", "TTL", "5", "DELAY", "5")
    assert isinstance(reply, Err) and reply.startswith("ERR The specified DELAY"), reply


def test_maxlen_refuses_when_queue_already_holds_n_jobs(conn: Conn, q: str) -> None:
    maxlen_err = b"-MAXLEN Queue is already longer than the specified MAXLEN count\r\n"
    add(conn, q, "b", "MAXLEN", "1")                 # empty queue: 0 < 1, accepted
    assert conn.call("ADDJOB", q, "b", "0", "MAXLEN", "1") == maxlen_err
    add(conn, q, "b", "MAXLEN", "2")                 # 1 < 2, accepted
    assert conn.call("ADDJOB", q, "b", "0", "MAXLEN", "2") == maxlen_err
    assert conn.cmd("QLEN", q) == 2
    add(conn, q, "b", "MAXLEN", "3")
    assert conn.cmd("QLEN", q) == 3


def test_maxlen_counts_only_queued_jobs(conn: Conn, q: str) -> None:
    add(conn, q)
    conn.cmd("GETJOB", "FROM", q)                    # now active, not queued
    add(conn, q, "b", "MAXLEN", "1")


def test_addjob_wrong_arity(conn: Conn, q: str) -> None:
    assert conn.call("ADDJOB", q, "b") == (
        b"-ERR wrong number of arguments for 'addjob' command\r\n")


def test_redis_cli_quick_tour(node, q: str) -> None:  # type: ignore[no-untyped-def]
    """The README's first commands, through Debian's redis-cli."""
    job_id = node.cli("ADDJOB", q, "body", "0").strip()
    assert JOB_ID_RE.match(job_id), job_id
    assert node.cli("GETJOB", "FROM", q).split() == [q, job_id, "body"]
    assert node.cli("ACKJOB", job_id).strip() == "1"
    assert node.cli("SHOW", job_id).strip() == ""
