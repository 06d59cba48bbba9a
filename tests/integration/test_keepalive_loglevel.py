"""tcp-keepalive acts on client sockets with Redis's timings (conf/disque.conf: "Send TCP
keepalive probes to clients with this period in seconds"), and loglevel verbose / debug show
more than notice (client connections)."""

from __future__ import annotations

import time

import pytest

from tests.harness import DisqueProcess, wait_for
from tests.integration.resp import Conn
from tests.waits import (
    CLOCK_TICKS,
    PROC_NET_TCP,
    TIMER_KEEPALIVE,
    TIMER_NONE,
    TIMER_RETRANSMIT,
    TcpSocket,
    server_end,
)

SLACK = 0.05 + 1 / CLOCK_TICKS  # s: a jiffy (at most 10 ms) and a tick of /proc's unit
needs_proc = pytest.mark.skipif(not PROC_NET_TCP.exists(), reason="needs /proc/net/tcp (Linux)")


def quiet_server_end(port: int, client: Conn) -> TcpSocket:
    """The server's end of `client`'s connection once no sent data waits for its ACK: the
    kernel then reports the keepalive timer if the socket has one (while a retransmit
    timer is pending, that one is reported instead)."""
    return wait_for(lambda: (s := server_end(port, client.sock)).timer != TIMER_RETRANSMIT
                    and s, timeout=10, what="the server's end of the connection quiet")


@needs_proc
def test_tcp_keepalive_probes_clients_after_the_configured_idle_time(make_server) -> None:  # type: ignore[no-untyped-def]
    proc: DisqueProcess = make_server(args=["--tcp-keepalive", "60"])
    t0 = time.monotonic()  # before the connection exists: its keepalive timer starts later
    with Conn(proc.port) as c:
        assert c.cmd("PING") == "PONG"
        end = quiet_server_end(proc.port, c)
        waited = time.monotonic() - t0
        # The kernel's keepalive timer on the server's end is armed for the first probe
        # 60 s after the last traffic (not the kernel's default of 7200 s): what is left
        # of it is at most 60 s, and at least 60 s minus the time since we connected (less
        # the kernel's clock granularity: jiffies, reported in CLOCK_TICKS).
        assert end.timer == TIMER_KEEPALIVE, end
        assert 60 - waited - SLACK <= end.timer_left <= 60, (end, waited)


@needs_proc
def test_tcp_keepalive_0_sends_no_probes(make_server) -> None:  # type: ignore[no-untyped-def]
    proc: DisqueProcess = make_server(args=["--tcp-keepalive", "0"])
    with Conn(proc.port) as c:
        assert c.cmd("PING") == "PONG"
        end = quiet_server_end(proc.port, c)
        assert end.timer == TIMER_NONE, end  # no keepalive timer on the socket


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
