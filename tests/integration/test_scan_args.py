"""QSCAN / JSCAN argument parsing: the original parses options and the cursor in one pass,
left to right, so with several bad tokens the leftmost one decides the error; its cursor is
an unsigned 64-bit number (strtoul, ERANGE refused). Checklist §4 QSCAN/JSCAN."""

from __future__ import annotations

import pytest

from tests.integration.resp import Conn

BAD_CURSOR = b"-ERR invalid cursor or option name\r\n"
NOT_INT = b"-ERR value is not an integer or out of range\r\n"
BAD_STATE = b"-ERR Invalid job state name\r\n"
BAD_REPLY = b"-ERR Invalid REPLY type, try ID or ALL\r\n"
SYNTAX = b"-ERR syntax error\r\n"


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (("QSCAN", "COUNT", "abc", "xyz"), NOT_INT),
        (("QSCAN", "MINLEN", "x", "xyz"), NOT_INT),
        (("QSCAN", "0", "IMPORTRATE", "x", "1"), NOT_INT),     # not the second-cursor error
        (("QSCAN", "xyz", "COUNT", "abc"), BAD_CURSOR),
        (("JSCAN", "STATE", "bogus", "xyz"), BAD_STATE),
        (("JSCAN", "REPLY", "bogus", "xyz"), BAD_REPLY),
        (("JSCAN", "COUNT", "x", "0", "1"), NOT_INT),
        (("JSCAN", "0", "STATE", "bogus", "1"), BAD_STATE),
        (("JSCAN", "xyz", "STATE", "bogus"), BAD_CURSOR),
        (("JSCAN", "0", "1", "STATE", "bogus"), SYNTAX),
    ],
)
def test_scan_errors_follow_argument_order(conn: Conn, args: tuple[str, ...],
                                           expected: bytes) -> None:
    """Checklist: "Any token that is not a recognised option ... is taken as the cursor; bad
    cursor -> -ERR invalid cursor or option name; a second cursor -> -ERR syntax error";
    "COUNT/MINLEN/MAXLEN/IMPORTRATE not integers -> -ERR value is not an integer...; JSCAN bad
    state -> -ERR Invalid job state name; bad REPLY -> ...". The original checks each token as
    it meets it. disque-py collected the options first and validated their values only after
    the whole line, so `QSCAN COUNT abc xyz` answered the cursor error (original: the integer
    error) and `QSCAN 0 IMPORTRATE x 1` the syntax error."""
    assert conn.call(*args) == expected


@pytest.mark.parametrize("cursor", ["18446744073709551616", "99999999999999999999999",
                                    "9" * 5000])  # past int()'s 4300-digit limit
def test_scan_cursor_beyond_64_bits_is_invalid(conn: Conn, cursor: str) -> None:
    """Checklist: the cursor is an unsigned decimal, bad cursor -> `-ERR invalid cursor or
    option name`. The original parses it with strtoul and refuses ERANGE; disque-py accepted
    any length of digits and answered `*2 ["0", []]`."""
    assert conn.call("QSCAN", cursor) == BAD_CURSOR
    assert conn.call("JSCAN", cursor) == BAD_CURSOR


def test_scan_cursor_max_64_bit_value_is_accepted(conn: Conn) -> None:
    reply = conn.cmd("QSCAN", "18446744073709551615")
    assert isinstance(reply, list) and len(reply) == 2


@pytest.mark.parametrize("command", ["QSCAN", "JSCAN"])
@pytest.mark.parametrize("cursor", ["-1", "-18446744073709551615", "+0", "-0", "",
                                    "00000000000000000000000000000"])
def test_scan_cursor_is_read_like_strtoul(conn: Conn, command: str, cursor: str) -> None:
    """Issue 15: the original reads the cursor with strtoul, which takes a sign (a minus
    wraps: `-1` is 2^64-1) and an empty string as 0, so `QSCAN -1` answers a cursor and a
    page; disque-py answered `-ERR invalid cursor or option name`."""
    reply = conn.cmd(command, cursor)
    assert isinstance(reply, list) and len(reply) == 2, reply
    assert isinstance(reply[0], bytes) and reply[0].isdigit() and isinstance(reply[1], list)


def test_scan_cursor_minus_one_is_the_largest_cursor(conn: Conn) -> None:
    assert conn.cmd("QSCAN", "-1") == conn.cmd("QSCAN", "18446744073709551615")
    assert conn.cmd("QSCAN", "-18446744073709551615")[0] == conn.cmd("QSCAN", "1")[0]


@pytest.mark.parametrize("cursor", ["-", "+", "--1", "+-1", " 1", "1 ", "-18446744073709551616",
                                    "0x10", "1e3"])
def test_scan_cursor_strtoul_refuses(conn: Conn, cursor: str) -> None:
    assert conn.call("QSCAN", cursor) == BAD_CURSOR
    assert conn.call("JSCAN", cursor) == BAD_CURSOR
