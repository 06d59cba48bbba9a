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
from tests.waits import wait_unresponsive


def addr(p) -> str:
    return f"127.0.0.1:{p.port}"


SLEEP = 3  # s of DEBUG SLEEP: the probe that sees it begin and a 0.5 s timeout fit well within


def debug_sleep(port: int, seconds: float) -> socket.socket:
    """DEBUG SLEEP on a raw connection (it blocks the whole node) and return the socket
    once the node is inside it (a PING on another connection goes unanswered)."""
    s = socket.create_connection(("127.0.0.1", port))
    n = str(seconds).encode()
    s.sendall(b"*3\r\n$5\r\nDEBUG\r\n$5\r\nSLEEP\r\n$%d\r\n%s\r\n" % (len(n), n))
    wait_unresponsive(port)
    return s


def still_asleep(sleeper: socket.socket) -> bool:
    """No reply to the DEBUG SLEEP yet: the node has not woken up."""
    sleeper.setblocking(False)
    try:
        return not sleeper.recv(64, socket.MSG_PEEK)
    except BlockingIOError:
        return True
    finally:
        sleeper.setblocking(True)


async def test_async_command_timing_out_on_a_slow_node_raises_and_does_not_desync(server):
    async with AsyncClient([addr(server)], socket_timeout=0.5, retries=0) as c:
        # a job for the GETJOB: its late reply (the job) is what a desynced connection
        # would hand to the next command
        await c.add_job("slowq", b"queued", replicate=1)
        sleeper = await asyncio.to_thread(debug_sleep, server.port, SLEEP)
        try:
            try:
                got = await c.get_job("slowq", nohang=True)
            except DisqueConnectionError:
                got = None  # what the blocking client does: the reply was lost
            assert still_asleep(sleeper), "the node woke up before the GETJOB timed out"
            # [] would claim the queue was empty, yet the node hands the job out on waking
            assert got is None, f"GETJOB on a sleeping node returned {got!r}"
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
        sleeper = debug_sleep(server.port, SLEEP)
        try:
            try:
                result = c.qlen("slowq")
            except DisqueConnectionError:
                result = None
            assert still_asleep(sleeper), "the node woke up before QLEN timed out"
            assert result is None
            sleeper.recv(64)  # the node is awake again
            second = c.add_job("slowq", b"second", replicate=1)
            assert c.show(second)["body"] == b"second"
        finally:
            sleeper.close()
