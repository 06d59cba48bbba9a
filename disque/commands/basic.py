"""PING and ECHO: a request each, no state; compiled with the hot path, since a health
check or a PING benchmark pays the handler's call on every request (interpreted, PING was
a tenth of the server's user time per request at one request in flight)."""

from __future__ import annotations

from disque.commands import Caller, command, wrong_arity
from disque.protocol.reply import PONG, bulk


@command("ping", -1, "readonly fast")
def cmd_ping(c: Caller, argv: list[bytes]) -> None:
    if len(argv) > 2:
        raise wrong_arity("ping")
    c.out.append(PONG if len(argv) == 1 else bulk(argv[1]))


@command("echo", 2, "readonly fast")
def cmd_echo(c: Caller, argv: list[bytes]) -> None:
    c.out.append(bulk(argv[1]))
