"""`syslog-enabled` / `syslog-ident` / `syslog-facility` (checklist §8; conf/disque.conf:
"Also log to syslog, with this identity and facility") and `syslog-socket`, the daemon's socket.

End to end: the test plays the syslog daemon on a datagram socket of its own, given to a real
server with `syslog-socket`, and reads what the server sends. It runs the same on a host whose
syslog daemon owns /dev/log and on one (CI, containers) with none.
"""

from __future__ import annotations

import re
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness import DisqueProcess

LOCAL3 = 19  # syslog facility number of local3
INFO = 6


@pytest.fixture
def syslog_socket(tmp_path: Path) -> Iterator[tuple[socket.socket, str]]:
    path = str(tmp_path / "log.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.settimeout(30)
    try:
        yield sock, path
    finally:
        sock.close()


def read_until(sock: socket.socket, event: str) -> list[str]:
    seen: list[str] = []
    while not any(event in m for m in seen):
        seen.append(sock.recv(65536).decode(errors="replace"))
    return seen


def test_syslog_enabled_sends_the_log_to_syslog_with_ident_and_facility(
        syslog_socket: tuple[socket.socket, str], tmp_path: Path) -> None:
    sock, path = syslog_socket
    proc = DisqueProcess(tmp_path / "node", args=[
        "--syslog-enabled", "yes", "--syslog-ident", "disque-test", "--syslog-facility",
        "local3", "--syslog-socket", path])
    proc.start()
    try:
        line = next(m for m in read_until(sock, "server.start") if "server.start" in m)
        m = re.match(r"<(\d+)>disque-test\[(\d+)\]: ", line)
        assert m, line
        assert int(m.group(1)) == LOCAL3 * 8 + INFO
        assert proc.proc is not None and int(m.group(2)) == proc.proc.pid
        assert f"port={proc.port}" in line
        assert not line.endswith("\0"), "glibc's shape: no trailing NUL"
    finally:
        proc.stop()
    # the shutdown lines follow, warnings with their own priority
    assert any("server.exit" in m for m in read_until(sock, "server.exit"))


def test_syslog_disabled_sends_nothing(syslog_socket: tuple[socket.socket, str],
                                       tmp_path: Path) -> None:
    sock, path = syslog_socket
    proc = DisqueProcess(tmp_path / "node", args=["--syslog-socket", path])
    proc.start()
    assert proc.stop() == 0
    assert "server.exit" in proc.output()  # it logged, to its stdout only
    sock.settimeout(0.2)
    with pytest.raises(TimeoutError):
        sock.recv(65536)


def test_syslog_enabled_without_a_daemon_still_starts_and_logs_to_stdout(
        tmp_path: Path) -> None:
    """Nothing listens on the socket: the lines are dropped (as syslog(3) drops them), the
    node serves and its own log is whole, with no traceback from the syslog client."""
    proc = DisqueProcess(tmp_path / "node", args=[
        "--syslog-enabled", "yes", "--syslog-socket", str(tmp_path / "nobody-here.sock")])
    proc.start()
    with proc.client() as r:
        assert r.ping()
    assert proc.stop() == 0
    out = proc.output()
    assert "server.start" in out and "server.exit" in out
    assert "Traceback" not in out, out
