"""AsyncClient against a slow node (DEBUG SLEEP longer than socket_timeout).

redis-py's asyncio `Connection.read_response(timeout=t)` treats an explicit timeout as a
*user* timeout: it returns None and leaves the connection open with the reply still due.
`AsyncClient._execute` / `_pipeline` always pass an explicit timeout, so a slow node makes a
command "succeed" with None (QLEN/ADDJOB parse None (ADDJOB returns the job ID "None"), GETJOB
returns [] though it may have taken jobs), and the connection goes back to the pool with the late reply still
unread: the next command on it reads the previous command's reply."""

from __future__ import annotations

import asyncio
import socket

from disque.client import AsyncClient, Client, DisqueConnectionError


def addr(p) -> str:
    return f"127.0.0.1:{p.port}"


def debug_sleep(port: int, seconds: float) -> socket.socket:
    """DEBUG SLEEP on a raw connection (it blocks the whole node); returns the socket."""
    s = socket.create_connection(("127.0.0.1", port))
    n = str(seconds).encode()
    s.sendall(b"*3\r\n$5\r\nDEBUG\r\n$5\r\nSLEEP\r\n$%d\r\n%s\r\n" % (len(n), n))
    return s


async def test_async_command_timing_out_on_a_slow_node_raises_and_does_not_desync(server):
    async with AsyncClient([addr(server)], socket_timeout=0.5, retries=0) as c:
        queued = await c.add_job("slowq", b"queued", replicate=1)
        sleeper = debug_sleep(server.port, 1.5)
        await asyncio.sleep(0.1)  # let the node start sleeping (it cannot be polled meanwhile)
        try:
            try:
                got = await c.get_job("slowq", nohang=True)
            except DisqueConnectionError:
                got = None  # what the blocking client does: the reply was lost
            # [] would claim the queue was empty, yet the node hands the job out on waking
            assert got is None or [j.id for j in got] == [queued], (
                f"GETJOB on a sleeping node returned {got!r}")
            await asyncio.get_running_loop().run_in_executor(None, sleeper.recv, 64)  # awake
            # the next command must read its own reply, not the late GETJOB reply
            second = await c.add_job("slowq", b"second", replicate=1)
            assert second.startswith("D-") and len(second) == 40, f"ADDJOB returned {second!r}"
            job = await c.show(second)
            assert job is not None and job["body"] == b"second", job
        finally:
            sleeper.close()


def test_sync_client_same_scenario_raises_connection_error(server):
    """The blocking client (reference behaviour): the timeout is a lost reply."""
    with Client([addr(server)], socket_timeout=0.5, retries=0) as c:
        c.ping()
        sleeper = debug_sleep(server.port, 1.5)
        try:
            import time
            time.sleep(0.1)
            try:
                result = c.qlen("slowq")
            except DisqueConnectionError:
                result = None
            assert result is None
            sleeper.recv(64)  # the node is awake again
            second = c.add_job("slowq", b"second", replicate=1)
            assert c.show(second)["body"] == b"second"
        finally:
            sleeper.close()
