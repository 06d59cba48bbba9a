"""Free loopback ports for local nodes (tests, benchmarks): a node needs its client port p
and its cluster bus port p + offset.

Ports are drawn below the kernel's ephemeral range: a port the kernel handed out through
bind(0) is also what it hands to the next outgoing connection, so between the check here and
the server's own bind another process's client socket can take it (EADDRINUSE at start-up).
"""

from __future__ import annotations

import os
import random
import socket

_EPHEMERAL_DEFAULT = (32768, 60999)
_LOWEST = 10000  # stay clear of well-known and commonly configured ports (7711, 6379, ...)


def _ephemeral_range() -> tuple[int, int]:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            lo, hi = (int(x) for x in f.read().split())
        return lo, hi
    except (OSError, ValueError):
        return _EPHEMERAL_DEFAULT


def _bindable(port: int) -> bool:
    try:
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))
        return True
    except OSError:
        return False


def _slice(candidates: list[int], bus_offset: int) -> list[int]:
    """DISQUE_PORT_SLICE=i/n (set per pytest-xdist worker by the tests' conftest): the i-th of
    n disjoint shares, so that parallel processes, and the servers and tools they start,
    never draw the same port. Client ports stay below the lowest candidate + bus_offset, so
    that no share's bus port is another share's client port."""
    spec = os.environ.get("DISQUE_PORT_SLICE", "")
    i_text, _, n_text = spec.partition("/")
    try:
        i, n = int(i_text), int(n_text)
    except ValueError:
        return candidates
    if not candidates or not 0 <= i < n:
        return candidates
    low = [p for p in candidates if p < candidates[0] + bus_offset]
    size = len(low) // n
    return low[i * size:(i + 1) * size]


_handed_out: set[int] = set()  # ports free_port returned in this process, and their bus ports


def free_port(bus_offset: int = 10000) -> int:
    """A loopback port p that is free now, with p + bus_offset free too, both outside the
    ephemeral range when the range leaves room for that."""
    lo, hi = _ephemeral_range()
    candidates = [p for p in range(_LOWEST, 65536 - bus_offset)
                  if not lo <= p <= hi and not lo <= p + bus_offset <= hi]
    candidates = _slice(candidates, bus_offset)
    rng = random.SystemRandom()
    for _ in range(200 if candidates else 0):
        port = rng.choice(candidates)
        # Not one this process handed out already (as a client or a bus port): callers
        # such as a test's cluster take several ports before any server binds them.
        if ({port, port + bus_offset} & _handed_out) or not (
                _bindable(port) and _bindable(port + bus_offset)):
            continue
        _handed_out.update((port, port + bus_offset))
        return port
    for _ in range(200):  # no room outside the ephemeral range: the old way
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port + bus_offset <= 65535 and _bindable(port + bus_offset):
            return port
    raise RuntimeError("no free loopback port pair found")
