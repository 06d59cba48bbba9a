"""daemonize yes: the starting command returns once the daemon serves (exit 0), or prints why
it could not start and exits 1, so tooling that starts daemonized nodes sees a failed start
(redis-server, and the original, exit 0 at the fork whatever happens next)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

from tests.harness import REPO, free_port, wait_for
from tests.integration.resp import Conn, Status


def start_daemon(tmp_path: Path, port: int, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "disque", "--port", str(port), "--dir",
                           str(tmp_path / "d"), "--daemonize", "yes", "--pidfile", "disque.pid",
                           "--logfile", "log.txt", *extra],
                          capture_output=True, text=True, timeout=60, cwd=str(REPO))


def test_daemonize_returns_once_the_node_serves(tmp_path: Path) -> None:
    port = free_port()
    out = start_daemon(tmp_path, port)
    assert out.returncode == 0, out.stderr
    assert out.stderr == ""
    pid = int((tmp_path / "d" / "disque.pid").read_text())
    try:
        with Conn(port) as c:  # no wait needed: it was serving when the command returned
            assert c.cmd("PING") == Status("PONG")
            c.send_cmd("SHUTDOWN")
            c.wait_closed()
        wait_for(lambda: not (tmp_path / "d" / "disque.pid").exists(), what="pidfile removed")
    finally:
        try:
            os.kill(pid, 9)
        except ProcessLookupError:
            pass


def test_daemonize_reports_a_port_in_use_and_exits_1(tmp_path: Path) -> None:
    port = free_port()
    with socket.socket() as busy:
        busy.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        busy.bind(("127.0.0.1", port))
        busy.listen()
        out = start_daemon(tmp_path, port)
    assert out.returncode == 1
    assert "Could not listen" in out.stderr and "address already in use" in out.stderr
    assert "server.listen_failed" in (tmp_path / "d" / "log.txt").read_text()


def test_daemonize_reports_an_aof_it_cannot_load_and_exits_1(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "disque.aof").write_bytes(b"*2\r\n$7\r\nLOADJOB\r\n$3\r\nbad\r\n" * 3)
    out = start_daemon(tmp_path, free_port(), "--appendonly", "yes")
    assert out.returncode == 1
    assert "disque.aof" in out.stderr or "AOF" in out.stderr, out.stderr
