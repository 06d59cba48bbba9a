"""`unixsocket` at shutdown: redis-server (and so the original) unlinks its unix socket when it
shuts down, as it removes its pidfile. disque-py removes the pidfile but leaves the socket
file behind, so `ls`/monitoring sees a socket nobody listens on (connect: ECONNREFUSED).
"""

from __future__ import annotations

import signal
import socket
from pathlib import Path

from tests.harness import wait_for


def _pong(sock: Path) -> bool:
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(2)
        s.connect(str(sock))
        s.sendall(b"PING\r\n")
        return s.recv(16) == b"+PONG\r\n"


def test_unixsocket_is_removed_on_sigterm(make_server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    sock = tmp_path / "disque.sock"
    proc = make_server(args=["--unixsocket", str(sock), "--unixsocketperm", "700"])
    wait_for(lambda: _pong(sock), what="PONG on the unix socket")
    assert oct(sock.stat().st_mode & 0o777) == oct(0o700)
    proc.kill(signal.SIGTERM)
    assert proc.proc is not None and proc.proc.returncode == 0
    assert not sock.exists(), "the unix socket file was left behind"


def test_unixsocket_is_removed_on_shutdown_command(make_server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    sock = tmp_path / "disque.sock"
    proc = make_server(args=["--unixsocket", str(sock)])
    wait_for(lambda: _pong(sock), what="PONG on the unix socket")
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(str(sock))
        s.sendall(b"SHUTDOWN\r\n")
        s.settimeout(10)
        try:
            s.recv(16)
        except OSError:
            pass
    assert proc.proc is not None
    proc.proc.wait(timeout=20)
    assert not sock.exists(), "the unix socket file was left behind"
