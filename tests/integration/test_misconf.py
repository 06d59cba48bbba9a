"""Checklist §0: -MISCONF while the AOF cannot be written, and what still runs (issue 25).

The original refused every write command and PING; here only the commands that add jobs
(ADDJOB, ADDJOBS, LOADJOB, REDRIVE) and PING are refused before they run: GETJOB and the
other commands that log nothing run, and a command that logs a change (ACKJOB, DELJOB...)
runs and answers -MISCONF when its record cannot be written. tests/integration/
test_aof_full_disk.py has the full story on a real small filesystem."""

from __future__ import annotations

import resource

from tests.harness import wait_for
from tests.integration.resp import Conn

MISCONF = b"-MISCONF Errors writing to the AOF file: File too large\r\n"


def test_misconf_after_a_failed_aof_write_for_commands_adding_jobs_and_ping(make_server) -> None:  # type: ignore[no-untyped-def]
    """`-MISCONF Errors writing to the AOF file: <strerror>` when the last AOF write failed
    and the command adds jobs, or is PING; commands logging nothing still run; unknown
    command and arity come first. The write is made to fail with RLIMIT_FSIZE (EFBIG)."""
    proc = make_server(args=["--appendonly", "yes"])
    assert proc.proc is not None
    with Conn(proc.port) as c:
        first = c.cmd("ADDJOB", "q", "x" * 1000, "0")
        resource.prlimit(proc.proc.pid, resource.RLIMIT_FSIZE, (4096, resource.RLIM_INFINITY))

        def failing() -> bool:
            return c.call("ADDJOB", "q", "x" * 1000, "0") == MISCONF
        wait_for(failing, timeout=20, what="an AOF write error")
        assert c.call("PING") == MISCONF
        assert c.call("ADDJOBS", "q", "0", "JOBS", "a") == MISCONF
        assert c.call("REDRIVE", "dlq") == MISCONF
        assert c.call("QLEN", "q") != MISCONF           # readonly: not refused
        assert c.call("ACKJOB") == b":0\r\n"            # logs nothing: runs
        assert c.cmd("GETJOB", "NOHANG", "FROM", "q")[0][1] == first.encode()
        assert c.call("ACKJOB", first) == MISCONF       # its record cannot be written
        assert c.call("NOSUCH") == b"-ERR unknown command 'NOSUCH'\r\n"
        assert c.call("ADDJOB", "q") == b"-ERR wrong number of arguments for 'addjob' command\r\n"
