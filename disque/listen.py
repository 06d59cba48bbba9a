"""Listening sockets made before a server uses them (the HTTP side, the TLS port)."""

from __future__ import annotations

import socket


def bind_sockets(addrs: list[str], port: int, backlog: int) -> list[socket.socket]:
    """Listening sockets on every `bind` address, made at once (so CONFIG SET http-port can
    answer a port in use); OSError if any address fails (the others are closed)."""
    socks: list[socket.socket] = []
    try:
        for addr in addrs:
            host = None if addr in ("*", "") else addr
            for family, type_, proto, _, sockaddr in socket.getaddrinfo(
                    host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE):
                s = socket.socket(family, type_, proto)
                socks.append(s)
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                if family == socket.AF_INET6:
                    s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                s.bind(sockaddr)
                s.listen(backlog)
                s.setblocking(False)
                if host is None:
                    break  # one wildcard socket is enough
    except OSError:
        for s in socks:
            s.close()
        raise
    return socks
