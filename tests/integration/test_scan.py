"""QSCAN and JSCAN: reply shapes, every option and error, and the cursor guarantee: an element
present for the whole iteration is returned even while the set grows and shrinks
(checklist §4 QSCAN/JSCAN, §13.16-17; issue 3)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from tests.harness import DisqueProcess
from tests.integration.resp import SHOW_FIELDS, Conn, Status, add, keys_of, pairs, parse


def scan_all(conn: Conn, command: str, *opts: Any,
             between: Callable[[int], None] | None = None, max_calls: int = 100_000) -> list[Any]:
    """Iterate a cursor to the end; `between(n)` runs after the n-th call."""
    cursor = "0"
    seen: list[Any] = []
    for calls in range(1, max_calls + 1):
        reply = conn.cmd(command, cursor, *opts)
        assert isinstance(reply, list) and len(reply) == 2, reply
        next_cursor, items = reply
        assert isinstance(next_cursor, bytes), next_cursor      # cursor is a bulk string
        assert next_cursor.isdigit(), next_cursor
        seen.extend(items)
        cursor = next_cursor.decode()
        if cursor == "0":
            return seen
        if between is not None:
            between(calls)
    raise AssertionError(f"{command} cursor did not finish in {max_calls} calls")


def names(items: list[Any], prefix: str) -> set[str]:
    return {i.decode() for i in items if i.decode().startswith(prefix)}


# -- QSCAN -----------------------------------------------------------------------------------------

def test_qscan_busyloop_returns_every_queue_in_one_call(conn: Conn, q: str) -> None:
    expected = {f"{q}:{i}" for i in range(512)}
    conn.pipeline([("ADDJOB", name, "b", "0") for name in expected])
    reply = conn.cmd("QSCAN", "BUSYLOOP")
    assert reply[0] == b"0"
    assert names(reply[1], q + ":") == expected
    assert len(reply[1]) == len(set(reply[1]))   # BUSYLOOP: unique elements


def test_qscan_reply_shape(conn: Conn, q: str) -> None:
    add(conn, q)
    raw = conn.call("QSCAN", "BUSYLOOP", "MINLEN", "1")
    assert raw.startswith(b"*2\r\n$1\r\n0\r\n*")
    items = parse(raw)[0][1]  # type: ignore[index]
    assert q.encode() in items


def test_qscan_cursor_iteration_returns_every_queue(conn: Conn, q: str) -> None:
    expected = {f"{q}:{i}" for i in range(512)}
    conn.pipeline([("ADDJOB", name, "b", "0") for name in expected])
    seen = scan_all(conn, "QSCAN", "COUNT", "10")
    assert names(seen, q + ":") == expected


def test_qscan_returns_stable_queues_while_many_are_created(conn: Conn, q: str) -> None:
    stable = {f"{q}:s{i}" for i in range(512)}
    conn.pipeline([("ADDJOB", name, "b", "0") for name in stable])
    created: list[str] = []

    def grow(call: int) -> None:
        # bursts early in the iteration (several table doublings), then none, so that the
        # cursor is guaranteed to reach the end
        if call in (1, 2, 4, 7, 11):
            batch = [f"{q}:n{call}-{k}" for k in range(600)]
            created.extend(batch)
            conn.pipeline([("ADDJOB", name, "b", "0") for name in batch])

    seen = scan_all(conn, "QSCAN", "COUNT", "7", between=grow)
    assert len(created) == 3000, "the iteration was too short to exercise growth"
    assert stable <= names(seen, q + ":s")


def test_qscan_minlen_maxlen_filter_inclusively(conn: Conn, q: str) -> None:
    for length in (1, 2, 3):
        for _ in range(length):
            add(conn, f"{q}:{length}")

    def scan(*opts: str) -> set[str]:
        return names(conn.cmd("QSCAN", "BUSYLOOP", *opts)[1], q + ":")

    assert scan("MINLEN", "2") == {f"{q}:2", f"{q}:3"}
    assert scan("MAXLEN", "2") == {f"{q}:1", f"{q}:2"}
    assert scan("MINLEN", "2", "MAXLEN", "2") == {f"{q}:2"}
    assert scan("minlen", "3") == {f"{q}:3"}


def test_qscan_importrate_filter_on_single_node_matches_nothing(conn: Conn, q: str) -> None:
    add(conn, q)
    assert q.encode() not in conn.cmd("QSCAN", "BUSYLOOP", "IMPORTRATE", "1")[1]
    assert q.encode() in conn.cmd("QSCAN", "BUSYLOOP", "IMPORTRATE", "0")[1]


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (("abc",), b"-ERR invalid cursor or option name\r\n"),
        (("COUNT",), b"-ERR invalid cursor or option name\r\n"),
        (("-",), b"-ERR invalid cursor or option name\r\n"),
        (("0", "0"), b"-ERR syntax error\r\n"),
        (("COUNT", "x"), b"-ERR value is not an integer or out of range\r\n"),
        (("MINLEN", "x"), b"-ERR value is not an integer or out of range\r\n"),
        (("MAXLEN", "1.5"), b"-ERR value is not an integer or out of range\r\n"),
        (("IMPORTRATE", "fast"), b"-ERR value is not an integer or out of range\r\n"),
    ],
)
def test_qscan_errors(conn: Conn, args: tuple[str, ...], expected: bytes) -> None:
    assert conn.call("QSCAN", *args) == expected


# -- JSCAN -----------------------------------------------------------------------------------------

def test_jscan_items_are_status_job_ids(conn: Conn, q: str) -> None:
    job_id = add(conn, q)
    raw = conn.call("JSCAN", "BUSYLOOP", "QUEUE", q)
    assert raw == b"*2\r\n$1\r\n0\r\n*1\r\n+%s\r\n" % job_id.encode()


def test_jscan_busyloop_returns_every_job(conn: Conn, q: str) -> None:
    ids = set(conn.pipeline([("ADDJOB", q, "b", "0") for _ in range(512)]))
    reply = conn.cmd("JSCAN", "BUSYLOOP", "QUEUE", q)
    assert reply[0] == b"0"
    assert all(isinstance(i, Status) for i in reply[1])
    assert set(reply[1]) == ids and len(reply[1]) == 512


def test_jscan_cursor_iteration_returns_every_job(conn: Conn, q: str) -> None:
    ids = set(conn.pipeline([("ADDJOB", q, "b", "0") for _ in range(512)]))
    seen = scan_all(conn, "JSCAN", "COUNT", "10")
    assert ids <= set(seen)


def test_jscan_returns_stable_jobs_while_others_are_added_and_removed(conn: Conn, q: str) -> None:
    stable = set(conn.pipeline([("ADDJOB", q, "s", "0") for _ in range(512)]))
    doomed = list(conn.pipeline([("ADDJOB", q, "d", "0") for _ in range(2000)]))
    added: list[str] = []

    def churn(call: int) -> None:
        if doomed:
            batch, doomed[:] = doomed[:150], doomed[150:]
            assert conn.cmd("DELJOB", *batch) == len(batch)
        if call <= 20:   # bounded growth, so that the cursor is guaranteed to reach the end
            added.extend(conn.pipeline([("ADDJOB", q, "n", "0") for _ in range(100)]))

    seen = scan_all(conn, "JSCAN", "COUNT", "10", between=churn)
    assert not doomed, "the iteration was too short to remove every doomed job"
    assert len(added) == 2000
    assert stable <= set(seen)


def test_jscan_reply_all_gives_show_arrays(conn: Conn, q: str) -> None:
    ids = {add(conn, q, f"body{i}") for i in range(3)}
    reply = conn.cmd("JSCAN", "BUSYLOOP", "QUEUE", q, "REPLY", "all")
    assert reply[0] == b"0"
    assert len(reply[1]) == 3
    for item in reply[1]:
        assert keys_of(item) == SHOW_FIELDS
        job = pairs(item)
        assert job["queue"] == q.encode() and job["body"].startswith(b"body")
    assert {pairs(i)["id"].decode() for i in reply[1]} == ids


def test_jscan_reply_id_is_the_default(conn: Conn, q: str) -> None:
    job_id = add(conn, q)
    assert conn.cmd("JSCAN", "BUSYLOOP", "QUEUE", q, "REPLY", "ID")[1] == [job_id]


def test_jscan_queue_filter_is_exact(conn: Conn, q: str) -> None:
    mine = add(conn, q)
    add(conn, q + "x")
    assert conn.cmd("JSCAN", "BUSYLOOP", "QUEUE", q)[1] == [mine]


def test_jscan_of_a_missing_queue_answers_cursor_zero(server: DisqueProcess) -> None:
    """Issue 15: `JSCAN 0 QUEUE <no such queue>` answered cursor 1000 where the original,
    scanning a table sized to its few jobs, is done in one call (cursor 0)."""
    conn = Conn(server.port)
    try:
        for _ in range(20):
            add(conn, "present")
        assert conn.cmd("JSCAN", "0", "QUEUE", "absent") == [b"0", []]
        assert conn.cmd("QSCAN", "0", "MINLEN", "1000") == [b"0", []]
        assert len(conn.cmd("JSCAN", "0", "QUEUE", "present", "COUNT", "1000")[1]) == 20
    finally:
        conn.close()


def test_jscan_state_filter(conn: Conn, q: str) -> None:
    queued, active = add(conn, q), add(conn, q)
    conn.cmd("DEQUEUE", active)

    def scan(*opts: str) -> set[str]:
        return set(conn.cmd("JSCAN", "BUSYLOOP", "QUEUE", q, *opts)[1])

    assert scan("STATE", "queued") == {queued}
    assert scan("STATE", "active") == {active}
    assert scan("STATE", "ACTIVE") == {active}
    assert scan("STATE", "queued", "STATE", "active") == {queued, active}
    assert scan("STATE", "acked") == set()
    assert scan("STATE", "wait-repl") == set()


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (("STATE", "sleeping"), b"-ERR Invalid job state name\r\n"),
        (("REPLY", "some"), b"-ERR Invalid REPLY type, try ID or ALL\r\n"),
        (("abc",), b"-ERR invalid cursor or option name\r\n"),
        (("COUNT",), b"-ERR invalid cursor or option name\r\n"),
        (("0", "0"), b"-ERR syntax error\r\n"),
        (("COUNT", "many"), b"-ERR value is not an integer or out of range\r\n"),
    ],
)
def test_jscan_errors(conn: Conn, args: tuple[str, ...], expected: bytes) -> None:
    assert conn.call("JSCAN", *args) == expected
