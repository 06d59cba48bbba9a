"""Free loopback ports for local nodes (tests, benchmarks): a node needs its client port p
and its cluster bus port p + offset."""

from __future__ import annotations

import socket


def free_port(bus_offset: int = 10000) -> int:
    """A loopback port p that is free now, with p + bus_offset free too."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port + bus_offset > 65535:
            continue
        try:
            with socket.socket() as s2:
                s2.bind(("127.0.0.1", port + bus_offset))
        except OSError:
            continue
        return port
    raise RuntimeError("no free loopback port pair found")
