"""`tcp-backlog` (conf/disque.conf: "Backlog of the listen() calls. Default: 511"; the original
listens on the cluster bus port with the same server.tcp_backlog as the client port).

disque-py passes tcp-backlog to the client listeners only; the bus listener gets asyncio's
default of 100, whatever tcp-backlog says. The kernel shows a listening socket's backlog as
its Send-Q in `ss -ltn`.
"""

from __future__ import annotations

import shutil
import subprocess

import pytest

from tests.harness import DisqueProcess


def listen_backlog(port: int) -> int:
    out = subprocess.run(["ss", "-Hltn", f"sport = :{port}"], capture_output=True, text=True,
                         check=True, timeout=10).stdout
    lines = [line.split() for line in out.splitlines() if line.strip()]
    assert lines, f"nothing listens on {port}"
    return int(lines[0][2])  # State Recv-Q Send-Q ...: Send-Q is the backlog


@pytest.mark.skipif(shutil.which("ss") is None, reason="needs ss (iproute2)")
def test_cluster_bus_listens_with_tcp_backlog(make_server) -> None:  # type: ignore[no-untyped-def]
    proc: DisqueProcess = make_server(args=["--tcp-backlog", "256"])
    assert listen_backlog(proc.port) == 256
    assert listen_backlog(proc.port + 10000) == 256
