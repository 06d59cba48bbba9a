"""Conditions the tests poll for instead of sleeping: a node that does not answer (inside
DEBUG SLEEP, or stopped), and what the kernel says about a server's TCP sockets.

- `wait_unresponsive(port)`: returns once a PING on a fresh connection is not answered
  within a short probe time. A node inside DEBUG SLEEP blocks its whole loop; the kernel
  still accepts the probe's connection and buffers its PING, so "no answer" is the
  observable sign that the sleep has begun (a fixed sleep after sending DEBUG SLEEP only
  guesses it).
- `request_waiting(port)`: a request has reached a node that does not read it (asleep or
  stopped): the kernel holds its bytes in the connection's receive queue.
- `tcp_sockets(port)`: the kernel's table of TCP sockets (/proc/net/tcp) for one local
  port, with each socket's queues and its pending timer. Its fixed hex columns do not
  change form with the timer's value, as `ss`'s rendering does ("59sec", "1min"...).
"""

from __future__ import annotations

import os
import socket
import struct
from dataclasses import dataclass
from pathlib import Path

from tests.harness import wait_for

PING = b"*1\r\n$4\r\nPING\r\n"


def answers_within(port: int, seconds: float) -> bool:
    """Does the node on `port` answer a PING on a fresh connection within `seconds`?
    Unanswered, the probe is reset as it closes, so that its PING does not stay in the
    kernel as an established connection's unread request (see `request_waiting`)."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(PING)
        s.settimeout(seconds)
        try:
            return s.recv(64).startswith(b"+PONG")
        except TimeoutError:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            return False


def wait_unresponsive(port: int, timeout: float = 20.0, probe: float = 0.25) -> None:
    """Poll until the node on `port` leaves a PING unanswered for `probe` seconds: it is
    inside a command that blocks it (DEBUG SLEEP) or stopped. The probes' PINGs stay
    queued on their closed connections and are answered into the void when it wakes."""
    wait_for(lambda: not answers_within(port, probe), timeout=timeout, interval=0.01,
             what=f"the node on port {port} to stop answering")


def wait_stopped(pid: int, timeout: float = 10.0) -> None:
    """Poll until process `pid` is stopped (SIGSTOP delivered: state T in /proc)."""
    def stopped() -> bool:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat[stat.rindex(")") + 2] in "Tt"
    wait_for(stopped, timeout=timeout, interval=0.01, what=f"process {pid} stopped")


# ---------------------------------------------------------------------------- /proc/net/tcp
ESTABLISHED = 0x01
TIMER_NONE, TIMER_RETRANSMIT, TIMER_KEEPALIVE = 0, 1, 2  # the `tr` column's values
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")  # the unit of the `tm->when` column
PROC_NET_TCP = Path("/proc/net/tcp")


@dataclass(frozen=True)
class TcpSocket:
    """One row of /proc/net/tcp (IPv4). `timer` is the pending timer the kernel reports
    (TIMER_RETRANSMIT while sent data waits for its ACK, else TIMER_KEEPALIVE if the socket
    has keepalive on), `timer_left` the time until it fires, in seconds."""

    local_port: int
    remote_port: int
    state: int
    tx_queue: int
    rx_queue: int
    timer: int
    timer_left: float


def tcp_sockets(port: int) -> list[TcpSocket]:
    """The IPv4 TCP sockets whose local port is `port` (a server's listener and the ends
    of its accepted connections)."""
    out = []
    for line in PROC_NET_TCP.read_text().splitlines()[1:]:
        f = line.split()
        local_port = int(f[1].rpartition(":")[2], 16)
        if local_port != port:
            continue
        tx, _, rx = f[4].partition(":")
        timer, _, left = f[5].partition(":")
        out.append(TcpSocket(local_port, int(f[2].rpartition(":")[2], 16), int(f[3], 16),
                             int(tx, 16), int(rx, 16), int(timer, 16),
                             int(left, 16) / CLOCK_TICKS))
    return out


def server_end(port: int, client: socket.socket) -> TcpSocket:
    """The server's end (local port `port`) of the established connection `client`."""
    mine = client.getsockname()[1]
    ends = [s for s in tcp_sockets(port) if s.remote_port == mine and s.state == ESTABLISHED]
    assert len(ends) == 1, (port, mine, tcp_sockets(port))
    return ends[0]


def request_waiting(port: int) -> bool:
    """Has an established connection to the server on `port` received bytes that the
    server has not read yet (a request sent to a node that is asleep or stopped)?"""
    return any(s.state == ESTABLISHED and s.rx_queue > 0 for s in tcp_sockets(port))
