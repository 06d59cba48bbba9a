"""PAUSE: in/out/all/none/state/bcast on a single node (checklist §4 PAUSE; issue 3)."""

from __future__ import annotations

import pytest

from tests.harness import wait_for
from tests.integration.resp import Conn, add, blocked_on, encode, qstat

PAUSED = b"-PAUSED Queue paused in input, try later\r\n"


@pytest.mark.parametrize(
    ("options", "reply"),
    [
        (("in",), b"+in\r\n"),
        (("out",), b"+out\r\n"),
        (("all",), b"+all\r\n"),
        (("in", "out"), b"+all\r\n"),
        (("IN",), b"+in\r\n"),
        (("all", "none"), b"+none\r\n"),
        (("none", "out"), b"+out\r\n"),
        (("in", "bcast"), b"+in\r\n"),          # bcast: no other node to tell
    ],
)
def test_pause_replies_the_resulting_state(conn: Conn, q: str, options: tuple[str, ...],
                                           reply: bytes) -> None:
    assert conn.call("PAUSE", q, *options) == reply
    st = qstat(conn, q)
    expected = reply[1:-2]
    if expected == b"none":
        assert st is None or st["pause"] == b"none"
    else:
        assert st is not None and st["pause"] == expected


def test_pause_flags_accumulate_and_none_resets(conn: Conn, q: str) -> None:
    assert conn.call("PAUSE", q, "in") == b"+in\r\n"
    assert conn.call("PAUSE", q, "out") == b"+out\r\n"      # replaces, does not add to "in"
    assert conn.call("PAUSE", q, "none", "in", "out") == b"+all\r\n"
    assert conn.call("PAUSE", q, "none") == b"+none\r\n"
    assert qstat(conn, q)["pause"] == b"none"  # type: ignore[index]


def test_pause_state_reports_without_changing(conn: Conn, q: str) -> None:
    conn.cmd("PAUSE", q, "out")
    assert conn.call("PAUSE", q, "state") == b"+out\r\n"
    assert conn.call("PAUSE", q, "STATE") == b"+out\r\n"
    assert qstat(conn, q)["pause"] == b"out"  # type: ignore[index]


def test_pause_none_on_a_missing_queue_does_not_create_it(conn: Conn, q: str) -> None:
    assert conn.call("PAUSE", q, "none") == b"+none\r\n"
    assert conn.call("QSTAT", q) == b"*-1\r\n"
    assert conn.call("PAUSE", q, "state") == b"+none\r\n"
    assert conn.call("QSTAT", q) == b"*-1\r\n"


def test_pause_in_creates_a_missing_queue(conn: Conn, q: str) -> None:
    assert conn.call("PAUSE", q, "in") == b"+in\r\n"
    st = qstat(conn, q)
    assert st is not None and st["len"] == 0 and st["pause"] == b"in"


def test_paused_in_queue_refuses_addjob_but_serves_getjob(conn: Conn, q: str) -> None:
    job_id = add(conn, q)
    conn.cmd("PAUSE", q, "in")
    assert conn.call("ADDJOB", q, "b", "0") == PAUSED
    assert conn.cmd("QLEN", q) == 1
    assert conn.cmd("GETJOB", "NOHANG", "FROM", q)[0][1].decode() == job_id
    conn.cmd("PAUSE", q, "none")
    add(conn, q)


def test_maxlen_is_checked_before_pause(conn: Conn, q: str) -> None:
    add(conn, q)
    conn.cmd("PAUSE", q, "all")
    assert conn.call("ADDJOB", q, "b", "0", "MAXLEN", "1") == (
        b"-MAXLEN Queue is already longer than the specified MAXLEN count\r\n")
    assert conn.call("ADDJOB", q, "b", "0", "MAXLEN", "2") == PAUSED


def test_paused_out_queue_is_skipped_by_getjob(conn: Conn, q: str) -> None:
    other = q + "-other"
    add(conn, q, "held")
    conn.cmd("PAUSE", q, "out")
    add(conn, q, "accepted")                         # input still open
    assert conn.cmd("QLEN", q) == 2
    assert conn.call("GETJOB", "NOHANG", "FROM", q) == b"*-1\r\n"
    other_id = add(conn, other)
    got = conn.cmd("GETJOB", "NOHANG", "COUNT", "5", "FROM", q, other)
    assert [j[1].decode() for j in got] == [other_id]
    assert conn.cmd("GETJOB", "TIMEOUT", "100", "FROM", q) is None


def test_paused_all_refuses_input_and_output(conn: Conn, q: str) -> None:
    add(conn, q)
    conn.cmd("PAUSE", q, "all")
    assert conn.call("ADDJOB", q, "b", "0") == PAUSED
    assert conn.cmd("GETJOB", "NOHANG", "FROM", q) is None


def test_lifting_out_pause_wakes_blocked_clients(node, conn: Conn, q: str) -> None:  # type: ignore[no-untyped-def]
    job_id = add(conn, q)
    conn.cmd("PAUSE", q, "out")
    with Conn(node.port) as waiter:
        waiter.send(encode("GETJOB", "TIMEOUT", "60000", "FROM", q))
        wait_for(lambda: blocked_on(conn, q) == 1, timeout=20, what="client blocked")
        assert waiter.nothing_pending()
        assert conn.call("PAUSE", q, "none") == b"+none\r\n"
        got = waiter.read(timeout=20)
        assert got[0][1].decode() == job_id


@pytest.mark.parametrize("options", [("sideways",), ("in", "maybe"), ("",)])
def test_pause_unknown_option_is_syntax_error(conn: Conn, q: str, options: tuple[str, ...]) -> None:
    assert conn.call("PAUSE", q, *options) == b"-ERR syntax error\r\n"
    assert conn.call("QSTAT", q) == b"*-1\r\n"


def test_pause_without_options_is_wrong_arity(conn: Conn, q: str) -> None:
    assert conn.call("PAUSE", q) == b"-ERR wrong number of arguments for 'pause' command\r\n"
