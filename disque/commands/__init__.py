"""Commands: one module per family; each handler parses arguments, calls the node, and
appends reply bytes to the client's output.

`TABLE` maps lowercase names to `Command` records (arity and flags as the original's
command table, which COMMAND reports). A handler has the signature `handler(client, argv)`;
it raises `CommandError` for failures and may block the client (GETJOB).

`Caller` is the one door a handler has: what it may use of the client that sent the command
(the RESP connection, `disque.connection.Client`, or the HTTP side's `InternalClient`), and
through it the server and the node. `Blocker` is what a client needs of the object a blocked
command parks on it.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Protocol

from disque.commands.registry import (
    FLAG_ORDER,
    TABLE,
    Command,
    Handler,
    command,
    int_arg,
    parse_int,
    timeout_arg,
    wrong_arity,
)

if TYPE_CHECKING:
    from disque.node import Node
    from disque.server import Server


class Blocker(Protocol):
    """What a blocked command parks on its client (`Caller.block`): the client calls
    `cancel` when it goes away, then forgets it (`client = None`); until then the blocker
    answers through `client.unblocked`."""

    client: Caller | None

    def cancel(self) -> None: ...


class Caller(Protocol):
    """What a command handler needs of the client that sent the command."""

    server: Server
    node: Node
    id: int
    out: list[bytes]  # reply chunks, in command order
    proto: int  # 2 or 3 (HELLO)
    null_bulk: bytes
    null_array: bytes
    authenticated: bool
    name: bytes
    addr: str
    ctime: float
    last_interaction: float
    waiter: Blocker | None
    closing: bool
    monitor: bool
    last_cmd: Command | None
    reply_mode: int  # disque.connection.REPLY_*
    lib_name: bytes
    lib_ver: bytes
    aof_marks: list[tuple[int, int]]
    transport: asyncio.Transport | None

    def block(self, waiter: Blocker) -> None: ...

    def unblocked(self, reply: bytes) -> None: ...

    def set_proto(self, proto: int) -> None: ...

    def flush(self) -> None: ...

    def close(self) -> None: ...

    def close_after_reply(self) -> None: ...

    def forget_marks(self, mark: int) -> None: ...

    def query_buffer(self) -> int: ...

    def query_limit(self) -> int: ...

    def output_buffer(self) -> tuple[int, int, int]: ...


__all__ = ["FLAG_ORDER", "TABLE", "Blocker", "Caller", "Command", "Handler", "command",
           "int_arg", "load_all", "parse_int", "timeout_arg", "wrong_arity"]


def load_all() -> dict[bytes, Command]:
    """Import every command module (each registers its handlers) and return TABLE."""
    from disque.commands import admin, basic, jobs, queues  # noqa: F401

    return TABLE
