"""ADDJOBS on a single node: many bodies, one set of options, one array reply with an element
per job in order (its ID as a status reply, or that job's error). Command-level errors are
one error reply and add nothing. WITHDEDUP pairs every body with a DEDUP key."""

from __future__ import annotations

import pytest

from tests.harness import DisqueProcess
from tests.integration.resp import JOB_ID_RE, Conn, Err, Status, add, show

MAXLEN_ERR = "MAXLEN Queue is already longer than the specified MAXLEN count"
PAUSED_ERR = "PAUSED Queue paused in input, try later"


def addjobs(conn: Conn, queue: str, *args: object, timeout: int = 0) -> list:
    """ADDJOBS queue timeout *args: the array reply (asserted to be one)."""
    reply = conn.cmd("ADDJOBS", queue, timeout, *args)
    assert isinstance(reply, list), reply
    return reply


def bodies_of(conn: Conn, queue: str, count: int) -> list[bytes]:
    jobs = conn.cmd("GETJOB", "NOHANG", "COUNT", count, "FROM", queue)
    return [] if jobs is None else [j[2] for j in jobs]


# ---------------------------------------------------------------------------- reply shape
def test_addjobs_replies_one_status_id_per_body_in_order(conn: Conn, q: str) -> None:
    raw = conn.call("ADDJOBS", q, 0, "JOBS", "a", "b", "c")
    assert raw.startswith(b"*3\r\n+D-"), raw
    ids = addjobs(conn, q, "JOBS", "d", "e")
    assert all(isinstance(i, Status) and JOB_ID_RE.match(i) for i in ids), ids
    for job_id, body in zip(ids, [b"d", b"e"], strict=True):
        job = show(conn, job_id)
        assert job is not None
        assert (job["queue"], job["body"], job["state"]) == (q.encode(), body, b"queued")
    assert conn.cmd("QLEN", q) == 5
    assert bodies_of(conn, q, 10) == [b"a", b"b", b"c", b"d", b"e"]


def test_addjobs_gives_every_job_the_options(conn: Conn, q: str) -> None:
    ids = addjobs(conn, q, "TTL", 600, "RETRY", 30, "DELAY", 5, "REPLICATE", 1, "JOBS",
                  "x", "y")
    assert len(ids) == 2 and len(set(ids)) == 2
    for job_id in ids:
        assert job_id.endswith("-000b")  # TTL 600 -> 10 minutes, forced odd by RETRY > 0
        job = show(conn, job_id)
        assert job is not None
        assert 590 <= job["ttl"] <= 600
        assert (job["retry"], job["delay"], job["repl"]) == (30, 5, 1)
        assert job["state"] == b"active"  # DELAY: not queued yet
    assert conn.cmd("QLEN", q) == 0


def test_addjobs_body_equal_to_the_jobs_keyword_is_a_body(conn: Conn, q: str) -> None:
    ids = addjobs(conn, q, "JOBS", "JOBS", "jobs")
    assert len(ids) == 2
    assert bodies_of(conn, q, 2) == [b"JOBS", b"jobs"]


def test_addjobs_async_on_a_single_node_queues_at_once(conn: Conn, q: str) -> None:
    ids = addjobs(conn, q, "ASYNC", "JOBS", "a", "b")
    assert [show(conn, i)["state"] for i in ids] == [b"queued", b"queued"]  # type: ignore[index]


def test_addjobs_bodies_are_binary_safe(conn: Conn, q: str) -> None:
    body = bytes(range(256)) + b"\r\n*1\r\n"
    addjobs(conn, q, "JOBS", body, b"")
    assert bodies_of(conn, q, 2) == [body, b""]


# ---------------------------------------------------------------------------- per-job errors
def test_addjobs_on_a_queue_paused_in_input_fails_every_job(conn: Conn, q: str) -> None:
    add(conn, q, "before")
    assert conn.cmd("PAUSE", q, "in") == "in"
    try:
        assert addjobs(conn, q, "JOBS", "a", "b", "c") == [PAUSED_ERR] * 3
        assert all(isinstance(e, Err) for e in addjobs(conn, q, "JOBS", "d"))
    finally:
        conn.cmd("PAUSE", q, "none")
    assert conn.cmd("QLEN", q) == 1


def test_addjobs_reaching_maxlen_mid_batch_gives_ids_then_maxlen_errors(
        conn: Conn, q: str) -> None:
    add(conn, q, "old1")
    add(conn, q, "old2")
    reply = addjobs(conn, q, "MAXLEN", 4, "JOBS", "a", "b", "c", "d")
    assert [type(r) for r in reply] == [Status, Status, Err, Err], reply
    assert reply[2:] == [MAXLEN_ERR, MAXLEN_ERR]
    assert conn.cmd("QLEN", q) == 4
    assert bodies_of(conn, q, 10) == [b"old1", b"old2", b"a", b"b"]


def test_addjobs_replicate_beyond_a_lone_node_is_norepl_for_every_job(
        conn: Conn, q: str) -> None:
    reply = addjobs(conn, q, "REPLICATE", 2, "JOBS", "a", "b")
    assert reply == ["NOREPL Not enough reachable nodes for the requested replication "
                     "level"] * 2
    assert all(isinstance(r, Err) for r in reply)
    assert conn.cmd("QLEN", q) == 0


# ---------------------------------------------------------------------------- command errors
REPLICATE_ERR = "ERR REPLICATE must be between 1 and 65535"
SYNTAX_ERR = "ERR syntax error"
ARITY_ERR = "ERR wrong number of arguments for 'addjobs' command"


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (("0", "a", "b"), SYNTAX_ERR),                        # no JOBS
        (("0", "JOBS"), ARITY_ERR),                           # no body
        (("0", "a"), ARITY_ERR),
        (("0", "FOO", "JOBS", "a"), SYNTAX_ERR),
        (("0", "REPLICATE", "JOBS", "a", "b"), SYNTAX_ERR),   # value option without a value
        (("0", "DEDUP", "k", "JOBS", "a"), SYNTAX_ERR),       # ADDJOB's DEDUP: use WITHDEDUP
        (("0", "REPLICATE", "0", "JOBS", "a"), REPLICATE_ERR),
        (("0", "REPLICATE", "65536", "JOBS", "a"), REPLICATE_ERR),
        (("0", "TTL", "0", "JOBS", "a"), "ERR TTL must be a number > 0"),
        (("0", "RETRY", "-1", "JOBS", "a"), "ERR RETRY time must be a non negative number"),
        (("0", "DELAY", "x", "JOBS", "a"), "ERR DELAY time must be a non negative number"),
        (("0", "MAXLEN", "0", "JOBS", "a"), "ERR MAXLEN must be a positive number"),
        (("x", "JOBS", "a"), "ERR timeout is not an integer or out of range"),
        (("-1", "JOBS", "a"), "ERR timeout is negative"),
        (("0", "WITHDEDUP", "JOBS", "k1", "a", "k2"),
         "ERR WITHDEDUP needs a DEDUP key before every body"),
        (("0", "WITHDEDUP", "JOBS", "k1", "a", "", "b"), "ERR DEDUP key must be 1 to 512 bytes"),
        (("0", "WITHDEDUP", "JOBS", "k" * 513, "a"), "ERR DEDUP key must be 1 to 512 bytes"),
    ],
)
def test_addjobs_command_errors_are_one_reply_and_add_nothing(
        conn: Conn, q: str, args: tuple[str, ...], error: str) -> None:
    add(conn, q, "before")
    reply = conn.cmd("ADDJOBS", q, *args)
    assert isinstance(reply, Err) and reply == error, reply
    assert conn.cmd("QLEN", q) == 1
    assert conn.cmd("PING") == "PONG"  # the connection is still in step


def test_addjobs_without_arguments_is_an_arity_error(conn: Conn) -> None:
    assert conn.cmd("ADDJOBS") == ARITY_ERR
    assert conn.cmd("ADDJOBS", "q") == ARITY_ERR


@pytest.mark.parametrize(
    ("opts", "error"),
    [
        (("DELAY", "10", "TTL", "5"), "ERR The specified DELAY is greater than TTL. Job "
                                      "refused since would never be delivered"),
        (("RETRY", "0", "REPLICATE", "2"), "ERR With RETRY set to 0 please explicitly set  "
                                           "REPLICATE to 1 (at-most-once delivery)"),
    ],
)
def test_addjobs_inconsistent_options_are_one_command_error(
        conn: Conn, q: str, opts: tuple[str, ...], error: str) -> None:
    reply = conn.cmd("ADDJOBS", q, 0, *opts, "JOBS", "a", "b")
    assert conn.cmd("QLEN", q) == 0
    assert reply == error, reply


# ---------------------------------------------------------------------------- WITHDEDUP
def test_addjobs_withdedup_repeated_key_in_a_batch_answers_the_first_id(
        conn: Conn, q: str) -> None:
    reply = addjobs(conn, q, "WITHDEDUP", "JOBS", "k1", "a", "k2", "b", "k1", "again")
    assert len(set(reply)) == 2 and reply[0] == reply[2] != reply[1], reply
    assert conn.cmd("QLEN", q) == 2
    assert bodies_of(conn, q, 10) == [b"a", b"b"]


def test_addjobs_withdedup_key_of_an_earlier_batch_or_addjob_answers_its_id(
        conn: Conn, q: str) -> None:
    first = addjobs(conn, q, "WITHDEDUP", "JOBS", "k1", "a", "k2", "b")
    second = addjobs(conn, q, "WITHDEDUP", "JOBS", "k2", "b", "k3", "c", "k1", "a")
    assert second[0] == first[1] and second[2] == first[0]
    assert second[1] not in first
    assert conn.cmd("QLEN", q) == 3
    # ADDJOB ... DEDUP shares the keys, both ways
    assert conn.cmd("ADDJOB", q, "c", 0, "DEDUP", "k3") == second[1]
    single = add(conn, q, "d", "DEDUP", "k4")
    assert addjobs(conn, q, "WITHDEDUP", "JOBS", "k4", "d") == [single]
    # keys are per queue
    other = addjobs(conn, q + "-other", "WITHDEDUP", "JOBS", "k1", "a")
    assert other[0] not in first
    assert conn.cmd("QLEN", q) == 4


def test_addjobs_withdedup_repeated_key_answers_its_id_even_at_maxlen(
        conn: Conn, q: str) -> None:
    reply = addjobs(conn, q, "MAXLEN", 1, "WITHDEDUP", "JOBS", "k1", "a", "k1", "a")
    assert conn.cmd("QLEN", q) == 1
    later = addjobs(conn, q, "MAXLEN", 1, "WITHDEDUP", "JOBS", "k1", "a")
    assert reply == [reply[0], reply[0]] and isinstance(reply[0], Status), reply
    assert later == [reply[0]], later


# ---------------------------------------------------------------------------- RESP3, size
def test_addjobs_under_resp3_is_an_array_of_statuses_and_errors(
        node: DisqueProcess, q: str) -> None:
    with Conn(node.port) as c3:
        assert isinstance(c3.cmd("HELLO", 3), dict)
        add(c3, q, "before")
        raw = c3.call("ADDJOBS", q, 0, "MAXLEN", 2, "JOBS", "a", "b")
        assert raw.startswith(b"*2\r\n+D-"), raw
        assert raw.endswith(b"\r\n-" + MAXLEN_ERR.encode() + b"\r\n"), raw
    client = node.client()  # redis-py's defaults: RESP3
    try:
        got = client.execute_command("ADDJOBS", q, 0, "JOBS", "c", "d")
        assert len(got) == 2 and all(JOB_ID_RE.match(i.decode()) for i in got), got
        assert client.execute_command("QLEN", q) == 4
    finally:
        client.close()


def test_addjobs_with_ten_thousand_bodies(conn: Conn, q: str) -> None:
    n = 10_000
    ids = addjobs(conn, q, "JOBS", *(f"b{i}" for i in range(n)))
    assert len(ids) == n and len(set(ids)) == n
    assert all(isinstance(i, Status) for i in ids)
    assert conn.cmd("QLEN", q) == n
    assert bodies_of(conn, q, n) == [f"b{i}".encode() for i in range(n)]
    assert show(conn, ids[-1])["body"] == f"b{n - 1}".encode()  # type: ignore[index]
