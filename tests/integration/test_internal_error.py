"""A handler that fails unexpectedly (DEBUG RAISE does so on purpose) answers
`-ERR internal error while running '<cmd>': <exception type>`, logs the traceback, and the
connection and the node go on serving."""

from __future__ import annotations

from tests.harness import DisqueProcess, wait_for
from tests.integration.resp import JOB_ID_RE, Conn, Status

INTERNAL_ERROR = b"-ERR internal error while running 'debug': RuntimeError\r\n"


def test_debug_raise_answers_the_internal_error_and_the_node_keeps_serving(
        server: DisqueProcess) -> None:
    with Conn(server.port) as c:
        assert c.call("DEBUG", "RAISE") == INTERNAL_ERROR
        assert c.cmd("PING") == Status("PONG")
        job_id = c.cmd("ADDJOB", "afterq", "body", "0")
        assert JOB_ID_RE.match(job_id), job_id
        assert c.cmd("GETJOB", "NOHANG", "FROM", "afterq") == [
            [b"afterq", job_id.encode(), b"body"]]
        # in a pipeline, the requests after the failing one are answered in order
        assert c.pipeline([("PING",), ("DEBUG", "raise"), ("ECHO", "still here")]) == [
            Status("PONG"), INTERNAL_ERROR[1:-2].decode(), b"still here"]
    with Conn(server.port) as other:
        assert other.cmd("PING") == Status("PONG")
    assert server.alive()

    log = wait_for(lambda: (out := server.output()).count("command.crash") >= 2 and out,
                   what="the crash events in the server log")
    assert "command=debug" in log
    assert "Traceback (most recent call last)" in log
    assert "RuntimeError: DEBUG RAISE: a deliberate failure" in log


def test_debug_raise_takes_no_argument(server: DisqueProcess) -> None:
    with Conn(server.port) as c:
        assert c.call("DEBUG", "RAISE", "x") == (
            b"-ERR Unknown DEBUG subcommand or wrong number of arguments for 'RAISE'\r\n")
        assert "command.crash" not in server.output()
