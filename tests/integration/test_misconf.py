"""Checklist §0 dispatch errors that no test asserted yet (behaviour already correct)."""

from __future__ import annotations

import resource

from tests.harness import wait_for
from tests.integration.resp import Conn

MISCONF = b"-MISCONF Errors writing to the AOF file: File too large\r\n"


def test_misconf_after_a_failed_aof_write_for_write_commands_and_ping(make_server) -> None:  # type: ignore[no-untyped-def]
    """`-MISCONF Errors writing to the AOF file: <strerror>` when the last AOF write failed
    and the command is a write command or PING; read-only commands still run; unknown
    command and arity come first. The write is made to fail with RLIMIT_FSIZE (EFBIG)."""
    proc = make_server(args=["--appendonly", "yes"])
    assert proc.proc is not None
    resource.prlimit(proc.proc.pid, resource.RLIMIT_FSIZE, (4096, 4096))
    with Conn(proc.port) as c:
        def failing() -> bool:
            return c.call("ADDJOB", "q", "x" * 1000, "0") == MISCONF
        wait_for(failing, timeout=20, what="an AOF write error")
        assert c.call("PING") == MISCONF
        assert c.call("GETJOB", "NOHANG", "FROM", "q") == MISCONF
        assert c.call("ACKJOB") == MISCONF
        assert c.call("QLEN", "q") != MISCONF          # readonly: not refused
        assert c.call("NOSUCH") == b"-ERR unknown command 'NOSUCH'\r\n"
        assert c.call("ADDJOB", "q") == b"-ERR wrong number of arguments for 'addjob' command\r\n"
