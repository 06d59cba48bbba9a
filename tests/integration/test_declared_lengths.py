"""Original-Disque report "Code errors discovered by static analysis" (docs/original-bugs.md
row 9). The mapped test sends lengths *over* the limits; the claim that what a client can make
the server allocate is bounded also covers lengths just *under* the limit: a client declaring
a ~500 MB bulk and sending a few bytes (many such clients at once) must not make the server
reserve that memory.
"""

from __future__ import annotations

import socket

from tests.harness import DisqueProcess, wait_for


def _rss(c) -> int:
    return int(c.info("memory")["used_memory_rss"])


def test_declared_bulk_under_the_limit_is_not_preallocated(server: DisqueProcess) -> None:
    c = server.client(decode_responses=True)
    before = _rss(c)
    socks = []
    try:
        for _ in range(20):
            s = socket.create_connection(("127.0.0.1", server.port), timeout=5)
            s.sendall(b"*2\r\n$4\r\nPING\r\n$500000000\r\nabcdefgh")
            socks.append(s)
        wait_for(lambda: int(c.info("clients")["connected_clients"]) >= 21,
                 what="20 clients connected with a pending bulk")
        assert c.ping()
        grown = _rss(c) - before
        assert grown < 64 * 1024 * 1024, f"RSS grew by {grown / 2**20:.0f} MB"
    finally:
        for s in socks:
            s.close()
    assert c.ping()
