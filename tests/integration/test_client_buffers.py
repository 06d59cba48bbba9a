"""CLIENT LIST's qbuf / qbuf-free / obl / oll / omem and INFO's client_biggest_input_buf show
a connection's real buffers: half a request sent on a raw socket is `qbuf`, replies a client
does not read pile up in `obl` / `omem`."""

from __future__ import annotations

import socket

from tests.harness import DisqueProcess, wait_for
from tests.integration.resp import Conn, Status, encode

QUERY_BUFFER_LIMIT = 1024 * 1024 * 1024  # client-query-buffer-limit's default


def line_of(watcher: Conn, sock: socket.socket) -> dict[str, str]:
    """The CLIENT LIST fields of the connection `sock` (seen from the server)."""
    addr = "127.0.0.1:%d" % sock.getsockname()[1]
    for line in watcher.cmd("CLIENT", "LIST").decode().split("\n"):
        fields = dict(kv.split("=", 1) for kv in line.split(" ") if "=" in kv)
        if fields.get("addr") == addr:
            return fields
    raise AssertionError(f"{addr} not in CLIENT LIST")


def biggest_input_buf(watcher: Conn) -> int:
    info = watcher.cmd("INFO", "clients").decode()
    return int(info.split("client_biggest_input_buf:")[1].split("\r\n")[0])


def test_half_a_request_is_qbuf_until_it_is_complete(server: DisqueProcess) -> None:
    request = encode("ADDJOB", "qbufq", "0123456789", "0")
    half = request[:request.index(b"0123456789") + 5]  # half of the body's bulk string
    with Conn(server.port) as sender, Conn(server.port) as watcher:
        assert line_of(watcher, sender.sock)["qbuf"] == "0"
        sender.send(half)
        fields = wait_for(lambda: (f := line_of(watcher, sender.sock))["qbuf"] != "0" and f,
                          what="qbuf of the half request")
        assert int(fields["qbuf"]) == len(half)
        assert int(fields["qbuf-free"]) == QUERY_BUFFER_LIMIT - len(half)
        assert biggest_input_buf(watcher) == len(half)

        sender.send(request[len(half):])
        assert sender.read().startswith("D-")
        fields = line_of(watcher, sender.sock)
        assert fields["qbuf"] == "0" and int(fields["qbuf-free"]) == QUERY_BUFFER_LIMIT
        assert biggest_input_buf(watcher) == 0


def test_a_partial_inline_command_is_qbuf(server: DisqueProcess) -> None:
    with Conn(server.port) as sender, Conn(server.port) as watcher:
        sender.send(b"PIN")
        wait_for(lambda: line_of(watcher, sender.sock)["qbuf"] == "3", what="inline qbuf")
        sender.send(b"G\r\n")
        assert sender.read() == Status("PONG")
        assert line_of(watcher, sender.sock)["qbuf"] == "0"


def test_what_a_blocked_client_sends_is_qbuf_until_it_is_unblocked(
        server: DisqueProcess) -> None:
    with Conn(server.port) as blocked, Conn(server.port) as watcher:
        blocked.send_cmd("GETJOB", "TIMEOUT", "0", "FROM", "emptyq")
        wait_for(lambda: line_of(watcher, blocked.sock)["flags"] == "b", what="blocked")
        ping = encode("PING")
        blocked.send(ping)
        wait_for(lambda: line_of(watcher, blocked.sock)["qbuf"] == str(len(ping)),
                 what="qbuf of the request sent while blocked")
        watcher.cmd("ADDJOB", "emptyq", "body", "0")
        assert blocked.read()[0][0] == b"emptyq"
        assert blocked.read() == Status("PONG")
        assert line_of(watcher, blocked.sock)["qbuf"] == "0"


def test_replies_a_client_does_not_read_are_obl_and_omem(server: DisqueProcess) -> None:
    body = "x" * (1024 * 1024)
    with Conn(server.port) as producer:
        producer.cmd("ADDJOB", "bigq", body, "0")
    with Conn(server.port, rcvbuf=4096) as lazy, Conn(server.port) as watcher:
        lazy.send(encode("QPEEK", "bigq", "1") * 24)  # ~24 MB of replies, none read yet

        def backed_up() -> dict[str, str] | None:
            fields = line_of(watcher, lazy.sock)
            return fields if int(fields["obl"]) > 0 else None

        fields = wait_for(backed_up, what="replies waiting in the output buffer")
        obl, oll, omem = int(fields["obl"]), int(fields["oll"]), int(fields["omem"])
        assert oll == 0 and omem == obl  # written to the transport, nothing queued before it

        for _ in range(24):  # reading them drains the buffer
            assert lazy.read()[0][2] == body.encode()
        wait_for(lambda: line_of(watcher, lazy.sock)["obl"] == "0", what="drained")
        assert line_of(watcher, lazy.sock)["omem"] == "0"
