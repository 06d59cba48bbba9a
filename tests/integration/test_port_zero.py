"""`port 0` (checklist §8: 0 = no TCP listener; conf/disque.conf: "0 disables the TCP
listener").

With port 0 and no unixsocket the server listens nowhere (no client port, no unix socket, no
cluster bus), yet it starts and runs until killed. redis-server, from which the original
inherits this check, refuses: "Configured to not listen anywhere, exiting.", exit status 1.
"""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

from tests.harness import REPO, wait_for


def test_port_zero_without_unixsocket_refuses_to_start(tmp_path: Path) -> None:
    conf = tmp_path / "disque.conf"
    conf.write_text("port 0\n")
    proc = subprocess.Popen([sys.executable, "-m", "disque", str(conf), "--dir",
                             str(tmp_path / "d")], cwd=str(REPO), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        rc = proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise AssertionError("a server listening nowhere kept running") from None
    assert rc == 1
    assert proc.stdout is not None
    assert "not listen anywhere" in proc.stdout.read()


def test_port_zero_with_unixsocket_serves_on_the_socket(tmp_path: Path) -> None:
    # guard for the fix above: port 0 + unixsocket is a valid, reachable node
    sock = tmp_path / "d.sock"
    proc = subprocess.Popen([sys.executable, "-m", "disque", "--port", "0", "--unixsocket",
                             str(sock), "--dir", str(tmp_path / "d")], cwd=str(REPO),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        def pong() -> bool:
            assert proc.poll() is None, "server exited"
            with socket.socket(socket.AF_UNIX) as s:
                s.settimeout(2)
                s.connect(str(sock))
                s.sendall(b"PING\r\n")
                return s.recv(16) == b"+PONG\r\n"
        wait_for(pong, timeout=20, what="PONG on the unix socket")
    finally:
        proc.kill()
        proc.wait()
