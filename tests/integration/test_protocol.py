"""The wire: inline commands, pipelining, generic dispatch errors, malformed RESP, protocol
limits, the output buffer limit, maxclients and idle timeout (checklist §0; issue 3 "Server")."""

from __future__ import annotations

import socket

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tests.harness import DisqueProcess, wait_for
from tests.integration.resp import Conn, ConnectionClosed, add, blocked_on, encode, info
from tests.threads import Background


def assert_still_serving(node: DisqueProcess) -> None:
    assert node.alive(), node.output()[-3000:]
    with Conn(node.port, timeout=10) as c:
        assert c.call("PING") == b"+PONG\r\n"


def send_and_wait_close(node: DisqueProcess, payload: bytes, timeout: float = 15.0) -> bytes:
    """Send `payload` and return everything the server wrote before closing the connection."""
    with Conn(node.port) as c:
        c.send(payload)
        return c.wait_closed(timeout=timeout)


# -- inline commands -------------------------------------------------------------------------------

def test_inline_ping(conn: Conn) -> None:
    conn.send(b"PING\r\n")
    assert conn.read_raw() == b"+PONG\r\n"


def test_inline_with_bare_newline(conn: Conn) -> None:
    conn.send(b"PING\n")
    assert conn.read_raw() == b"+PONG\r\n"


def test_inline_empty_lines_are_ignored(conn: Conn) -> None:
    conn.send(b"\r\n\r\nPING\r\n")
    assert conn.read_raw() == b"+PONG\r\n"
    assert conn.nothing_pending()


def test_inline_quoted_arguments(conn: Conn, q: str) -> None:
    conn.send(b'ADDJOB ' + q.encode() + b' "hello world" 0 TTL 100\r\n')
    assert conn.read_raw().startswith(b"+D-")
    conn.send(b'PING "a\\x41b\\n"\r\n')
    assert conn.read_raw() == b"$4\r\naAb\n\r\n"
    conn.send(b"PING 'single quoted'\r\n")
    assert conn.read_raw() == b"$13\r\nsingle quoted\r\n"
    got = conn.cmd("GETJOB", "FROM", q)
    assert got[0][2] == b"hello world"


def test_inline_command_split_across_writes(conn: Conn) -> None:
    for part in (b"PI", b"NG hel", b"lo", b"\r", b"\n"):
        conn.send(part)
    assert conn.read_raw() == b"$5\r\nhello\r\n"


def test_multibulk_sent_one_byte_at_a_time(conn: Conn) -> None:
    for byte in encode("PING", "hi"):
        conn.send(bytes([byte]))
    assert conn.read_raw() == b"$2\r\nhi\r\n"


def test_inline_and_multibulk_mixed_in_one_write(conn: Conn) -> None:
    conn.send(b"PING a\r\n" + encode("PING", "b") + b"PING c\r\n")
    assert [conn.read_raw() for _ in range(3)] == [b"$1\r\na\r\n", b"$1\r\nb\r\n", b"$1\r\nc\r\n"]


# -- pipelining ------------------------------------------------------------------------------------

def test_pipelined_1000_commands_are_answered_in_order(conn: Conn) -> None:
    conn.send(b"".join(encode("PING", str(i)) for i in range(1000)))
    for i in range(1000):
        s = str(i).encode()
        assert conn.read_raw() == b"$%d\r\n%s\r\n" % (len(s), s)


def test_pipelined_job_commands_see_each_others_effects(conn: Conn, q: str) -> None:
    cmds = [("ADDJOB", q, f"b{i}", "0") for i in range(500)]
    cmds += [("QLEN", q), ("GETJOB", "COUNT", "500", "FROM", q), ("QLEN", q)]
    replies = conn.pipeline(cmds)
    assert replies[500] == 500
    assert [j[2] for j in replies[501]] == [f"b{i}".encode() for i in range(500)]
    assert replies[502] == 0


# -- dispatch errors -------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["FOO", "fOo", "SELECT", "MULTI", "LPUSH"])
def test_unknown_command(conn: Conn, name: str) -> None:
    assert conn.call(name, "x") == b"-ERR unknown command '%s'\r\n" % name.encode()
    assert conn.call("PING") == b"+PONG\r\n"     # the connection stays usable


def test_unknown_inline_command(conn: Conn) -> None:
    conn.send(b"NOPE a b\r\n")
    assert conn.read_raw() == b"-ERR unknown command 'NOPE'\r\n"


@pytest.mark.parametrize(
    ("args", "name"),
    [
        (("ADDJOB", "q", "b"), "addjob"),
        (("addjob",), "addjob"),
        (("GETJOB",), "getjob"),
        (("Qlen",), "qlen"),
        (("QLEN", "a", "b"), "qlen"),
        (("QPEEK", "q"), "qpeek"),
        (("QSTAT",), "qstat"),
        (("SHOW",), "show"),
        (("WORKING",), "working"),
        (("PAUSE", "q"), "pause"),
        (("TIME", "now"), "time"),
        (("MONITOR", "x"), "monitor"),
        (("PING", "a", "b"), "ping"),
        (("AUTH",), "auth"),
        (("CONFIG",), "config"),
        (("DEBUG",), "debug"),
        (("CLIENT",), "client"),
    ],
)
def test_wrong_arity(conn: Conn, args: tuple[str, ...], name: str) -> None:
    assert conn.call(*args) == b"-ERR wrong number of arguments for '%s' command\r\n" % name.encode()


def test_quit_replies_ok_and_closes(node: DisqueProcess) -> None:
    assert send_and_wait_close(node, encode("QUIT")) == b"+OK\r\n"
    assert send_and_wait_close(node, b"quit\r\n") == b"+OK\r\n"


# -- malformed requests ----------------------------------------------------------------------------

BIG = 70_000   # over the 64 KB inline / count-line limit


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        (b"*abc\r\n", b"invalid multibulk length"),
        (b"*3000000\r\n", b"invalid multibulk length"),
        (b"*1\r\nx\r\n", b"expected '$', got 'x'"),
        (b"*2\r\n$4\r\nPING\r\n:1\r\n", b"expected '$', got ':'"),
        (b"*1\r\n%1\r\n*0\r\n:1\r\n", b"expected '$', got '%'"),  # hiredis: TypeError
        (b"*1\r\n~1\r\n*1\r\n$1\r\na\r\n", b"expected '$', got '~'"),
        (b"*1\r\n$abc\r\n", b"invalid bulk length"),
        (b"*1\r\n$-3\r\n", b"invalid bulk length"),
        (b"*1\r\n$99999999999\r\n", b"invalid bulk length"),
        (b"*1\r\n$99999999999999999999999\r\n", b"invalid bulk length"),
        (b"*" + b"1" * BIG, b"too big mbulk count string"),
        (b"*1\r\n$" + b"1" * BIG, b"too big bulk count string"),
        (b"A" * BIG, b"too big inline request"),
        (b'PING "unbalanced\r\n', b"unbalanced quotes in request"),
        (b"PING 'x\r\n", b"unbalanced quotes in request"),
    ],
    ids=lambda v: repr(v[:24]),
)
def test_malformed_request_is_a_protocol_error_and_closes(
        node: DisqueProcess, payload: bytes, message: bytes) -> None:
    assert send_and_wait_close(node, payload) == b"-ERR Protocol error: " + message + b"\r\n"
    assert_still_serving(node)


def test_commands_before_a_protocol_error_are_answered(node: DisqueProcess) -> None:
    got = send_and_wait_close(node, encode("PING", "one") + b"*1\r\n$x\r\n" + encode("PING"))
    assert got == b"$3\r\none\r\n-ERR Protocol error: invalid bulk length\r\n"


def test_negative_multibulk_count_does_not_break_the_server(node: DisqueProcess) -> None:
    with Conn(node.port) as c:
        c.send(b"*-1\r\n*-10\r\n")
        c.send(encode("PING"))
        try:
            reply = c.read_raw(timeout=10)
        except ConnectionClosed:  # closing is also acceptable (a timeout is not)
            reply = b""
        assert reply in (b"+PONG\r\n", b"") or reply.startswith(b"-ERR Protocol error: ")
    assert_still_serving(node)


@pytest.mark.parametrize("empty", [b"*0\r\n", b"*0\r\n*0\r\n"])
def test_empty_multibulk_request_is_ignored(node: DisqueProcess, empty: bytes) -> None:
    """Redis skips a `*0` request and goes on with the next one."""
    with Conn(node.port) as c:
        c.send(empty + encode("PING", "after") + b"PING\r\n")
        assert c.read_raw(timeout=10) == b"$5\r\nafter\r\n"
        assert c.read_raw(timeout=10) == b"+PONG\r\n"
    assert_still_serving(node)


def test_unterminated_requests_wait_for_more_and_do_not_block_others(node: DisqueProcess) -> None:
    partials = [b"PING", b"*1\r\n$4\r\nPI", b"*2\r\n$4\r\nPING\r\n", b"*2\r", b"*1\r\n$4"]
    conns = [Conn(node.port) for _ in partials]
    try:
        for c, p in zip(conns, partials, strict=True):
            c.send(p)
        assert_still_serving(node)
        for c in conns:
            assert c.nothing_pending()
        # completing one of them works
        conns[0].send(b"\r\n")
        assert conns[0].read_raw() == b"+PONG\r\n"
        conns[1].send(b"NG\r\n")
        assert conns[1].read_raw() == b"+PONG\r\n"
    finally:
        for c in conns:
            c.close()
    assert_still_serving(node)


def _structured(n: int, m: int, body: bytes) -> bytes:
    return b"*%d\r\n$%d\r\n" % (n, m) + body


requests = st.one_of(
    st.binary(max_size=300),
    st.binary(max_size=200).map(lambda b: b"*" + b),
    st.binary(max_size=200).map(lambda b: b"*1\r\n$" + b),
    st.builds(_structured, st.integers(-5, 5_000_000_000), st.integers(-5, 10**12),
              st.binary(max_size=60)),
    st.lists(st.sampled_from([b"*", b"$", b"\r\n", b"\r", b"\n", b"-1", b"0", b"3", b"PING",
                              b"\"", b"'", b" ", b"\\x", b"\x00", b"99999999999"]),
             max_size=30).map(b"".join),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(payload=requests)
@example(payload=b"*0\r\n")          # found by this test: an empty multibulk broke the link
def test_random_bytes_never_crash_the_server(node: DisqueProcess, payload: bytes) -> None:
    log_before = len(node.output())
    with socket.create_connection(("127.0.0.1", node.port), timeout=30) as s:
        s.sendall(payload)
        s.shutdown(socket.SHUT_WR)
        received = b""
        try:
            while True:
                data = s.recv(65536)
                if not data:
                    break
                received += data
        except ConnectionResetError:
            pass
    if b"-ERR Protocol error: " in received:
        # the protocol error is the last thing written before the close
        tail = received[received.rindex(b"-ERR Protocol error: "):]
        assert tail.endswith(b"\r\n") and tail.count(b"\r\n") == 1, received[-300:]
    assert_still_serving(node)
    new_log = node.output()[log_before:]
    assert "Traceback" not in new_log, new_log[-3000:]


# -- limits ----------------------------------------------------------------------------------------

def test_proto_max_bulk_len_refuses_on_the_header(make_server) -> None:  # type: ignore[no-untyped-def]
    node = make_server(args=["--proto-max-bulk-len", "1048576"])
    with Conn(node.port) as c:
        payload = b"x" * 1048576
        c.send_cmd("PING", payload)
        assert c.read_raw() == b"$1048576\r\n" + payload + b"\r\n"
    # only the header is sent: the refusal must not wait for (or buffer) the body
    got = send_and_wait_close(node, b"*2\r\n$4\r\nPING\r\n$1048577\r\n")
    assert got == b"-ERR Protocol error: invalid bulk length\r\n"
    assert_still_serving(node)


def _stream_until_refused(node: DisqueProcess, header: bytes, total: int) -> tuple[bytes, int]:
    """Send `header` then up to `total` body bytes; return (reply, bytes sent)."""
    c = Conn(node.port)
    sent = 0
    try:
        c.send(header)
        chunk = b"y" * 65536
        try:
            while sent < total:
                c.sock.sendall(chunk)
                sent += len(chunk)
        except OSError:
            pass
        try:
            reply = c.wait_closed(timeout=20)
        except TimeoutError:
            reply = c.buf
        return reply, sent
    finally:
        c.close()


def test_client_query_buffer_limit_refuses_without_buffering_everything(make_server) -> None:  # type: ignore[no-untyped-def]
    node = make_server(args=["--client-query-buffer-limit", "1048576"])
    total = 64 * 1024 * 1024
    reply, sent = _stream_until_refused(node, b"*2\r\n$4\r\nPING\r\n$%d\r\n" % total, total)
    assert reply.startswith(b"-ERR Protocol error: "), reply[:200]
    assert sent < total, "the server kept reading a request far above client-query-buffer-limit"
    assert_still_serving(node)
    with Conn(node.port) as c:       # requests below the limit still work
        c.send_cmd("PING", b"z" * 500_000)
        assert c.read_raw() == b"$500000\r\n" + b"z" * 500_000 + b"\r\n"


def test_client_that_stops_reading_is_disconnected_at_output_limit(make_server) -> None:  # type: ignore[no-untyped-def]
    node = make_server(config_text="client-output-buffer-limit normal 1mb 0 0\n")
    with Conn(node.port) as admin:
        assert admin.cmd("CONFIG", "GET", "client-output-buffer-limit") == [
            b"client-output-buffer-limit", b"normal 1048576 0 0"]
        admin.pipeline([("ADDJOB", "bigq", b"j" * 100_000, "0") for _ in range(30)])
        accepted = int(info(admin, "stats")["total_connections_received"])
        slow = Conn(node.port, rcvbuf=4096)
        try:
            # 10 x 3 MB of replies, never read
            slow.send(b"".join(encode("QPEEK", "bigq", "30") for _ in range(10)))
            wait_for(lambda: int(info(admin, "stats")["total_connections_received"]) > accepted
                     and int(info(admin, "clients")["connected_clients"]) == 1, timeout=30,
                     what="the non-reading client disconnected")
            try:
                leftover = slow.wait_closed(timeout=20)
            except TimeoutError:
                pytest.fail("server side of the slow client is still open")
            assert len(leftover) < 10 * 30 * 100_000
        finally:
            slow.close()
        assert admin.cmd("QLEN", "bigq") == 30
    assert_still_serving(node)


def test_maxclients_refuses_extra_connections(make_server) -> None:  # type: ignore[no-untyped-def]
    node = make_server(args=["--maxclients", "2"])
    with Conn(node.port) as a:
        # the harness' readiness probe must be gone before the slots are counted
        wait_for(lambda: info(a, "clients")["connected_clients"] == "1", timeout=20)
        b = Conn(node.port)
        assert b.call("PING") == b"+PONG\r\n"
        with Conn(node.port) as c:
            assert c.wait_closed(timeout=10) == b"-ERR max number of clients reached\r\n"
        assert a.call("PING") == b"+PONG\r\n"
        b.close()
    wait_for(lambda: _ping_ok(node), timeout=20, what="a slot free again")


def _ping_ok(node: DisqueProcess) -> bool:
    with Conn(node.port, timeout=5) as c:
        return c.call("PING") == b"+PONG\r\n"


def test_idle_timeout_closes_idle_clients_but_not_blocked_ones(make_server) -> None:  # type: ignore[no-untyped-def]
    node = make_server(args=["--timeout", "1"])
    with Conn(node.port) as idle, Conn(node.port) as blocked:
        assert idle.call("PING") == b"+PONG\r\n"
        blocked.send(encode("GETJOB", "TIMEOUT", "0", "FROM", "tq"))
        idle.wait_closed(timeout=30)
        assert blocked.nothing_pending()
        with Conn(node.port) as c:
            wait_for(lambda: blocked_on(c, "tq") == 1, timeout=20, what="GETJOB still blocked")
            job_id = add(c, "tq")
        assert blocked.read(timeout=20)[0][1].decode() == job_id


def test_server_survives_many_connections_opened_and_dropped(node: DisqueProcess) -> None:
    def churn() -> None:
        for _ in range(50):
            with socket.create_connection(("127.0.0.1", node.port), timeout=10) as s:
                s.sendall(encode("PING") + b"*3\r\n$6\r\nADDJOB")
    churners = [Background(churn) for _ in range(4)]
    for t in churners:
        t.result(timeout=60)
    assert_still_serving(node)
