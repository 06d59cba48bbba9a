"""tcp-keepalive acts on client sockets with Redis's timings (conf/disque.conf: "Send TCP
keepalive probes to clients with this period in seconds"), and loglevel verbose / debug show
more than notice (client connections)."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from tests.harness import DisqueProcess, wait_for
from tests.integration.resp import Conn

needs_ss = pytest.mark.skipif(shutil.which("ss") is None, reason="needs ss (iproute2)")


def server_side_timers(port: int) -> list[str]:
    """ss's timer column of the server's end of each established client connection."""
    out = subprocess.run(["ss", "-Htno", "state", "established", f"( sport = :{port} )"],
                         capture_output=True, text=True, check=True, timeout=10).stdout
    return [m.group(0) if (m := re.search(r"timer:\([^)]*\)", line)) else ""
            for line in out.splitlines() if line.strip()]


@needs_ss
def test_tcp_keepalive_probes_clients_after_the_configured_idle_time(make_server) -> None:  # type: ignore[no-untyped-def]
    proc: DisqueProcess = make_server(args=["--tcp-keepalive", "60"])
    with Conn(proc.port) as c:
        assert c.cmd("PING") == "PONG"
        timers = server_side_timers(proc.port)
        assert len(timers) == 1 and timers[0].startswith("timer:(keepalive,"), timers
        # the first probe within 60 s (ss: "keepalive,59sec", or "keepalive,1min" when read
        # within the first second), not the kernel's 7200 s ("keepalive,119min")
        m = re.search(r"keepalive,(\d+)(sec|min)", timers[0])
        assert m, timers[0]
        secs = int(m.group(1)) * (60 if m.group(2) == "min" else 1)
        assert secs <= 60, timers[0]


@needs_ss
def test_tcp_keepalive_0_sends_no_probes(make_server) -> None:  # type: ignore[no-untyped-def]
    proc: DisqueProcess = make_server(args=["--tcp-keepalive", "0"])
    with Conn(proc.port) as c:
        assert c.cmd("PING") == "PONG"
        assert not any("keepalive" in t for t in server_side_timers(proc.port))


@pytest.mark.parametrize("level", ["verbose", "debug"])
def test_loglevel_verbose_and_debug_log_client_connections(make_server, level: str) -> None:  # type: ignore[no-untyped-def]
    proc: DisqueProcess = make_server(args=["--loglevel", level])
    with Conn(proc.port) as c:
        assert c.cmd("PING") == "PONG"
    wait_for(lambda: "client.closed" in proc.output(), what="client.closed logged")
    assert "client.accepted" in proc.output()


def test_loglevel_notice_does_not_log_client_connections(make_server) -> None:  # type: ignore[no-untyped-def]
    proc: DisqueProcess = make_server(args=["--loglevel", "notice"])
    with Conn(proc.port) as c:
        assert c.cmd("PING") == "PONG"
    with Conn(proc.port) as c:  # the first connection's close was handled before this PING
        assert c.cmd("PING") == "PONG"
    assert "client.accepted" not in proc.output()
