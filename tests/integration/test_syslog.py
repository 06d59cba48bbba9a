"""`syslog-enabled` / `syslog-ident` / `syslog-facility` (checklist §8; conf/disque.conf:
"Also log to syslog, with this identity and facility").

End to end: the test plays the syslog daemon. glibc's syslog() sends datagrams to /dev/log; on
a machine without a syslog daemon (CI, containers) the test binds that socket itself, starts a
real server with syslog enabled and reads what it sends.
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness import DisqueProcess

DEV_LOG = "/dev/log"
LOCAL3 = 19  # syslog facility number of local3
INFO = 6


@pytest.fixture
def syslog_socket() -> Iterator[socket.socket]:
    if os.path.exists(DEV_LOG):
        pytest.skip("a syslog daemon owns /dev/log here: its messages cannot be read back")
    if not os.access(os.path.dirname(DEV_LOG), os.W_OK):
        pytest.skip("cannot create /dev/log (not root)")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(DEV_LOG)
    sock.settimeout(30)
    try:
        yield sock
    finally:
        sock.close()
        os.unlink(DEV_LOG)


def test_syslog_enabled_sends_the_log_to_syslog_with_ident_and_facility(
        syslog_socket: socket.socket, tmp_path: Path) -> None:
    proc = DisqueProcess(tmp_path, args=["--syslog-enabled", "yes", "--syslog-ident",
                                         "disque-test", "--syslog-facility", "local3"])
    proc.start()
    try:
        seen = []
        while not any("server.start" in m for m in seen):
            seen.append(syslog_socket.recv(65536).decode(errors="replace"))
        line = next(m for m in seen if "server.start" in m)
        m = re.match(r"<(\d+)>.*?disque-test\[(\d+)\]: ", line)
        assert m, line
        assert int(m.group(1)) == LOCAL3 * 8 + INFO
        assert proc.proc is not None and int(m.group(2)) == proc.proc.pid
        assert f"port={proc.port}" in line
    finally:
        proc.stop()


def test_syslog_disabled_sends_nothing(syslog_socket: socket.socket, tmp_path: Path) -> None:
    proc = DisqueProcess(tmp_path)
    proc.start()
    proc.stop()
    assert "server.exit" in proc.output()  # it logged, to its stdout only
    syslog_socket.settimeout(0.2)
    with pytest.raises(TimeoutError):
        syslog_socket.recv(65536)
