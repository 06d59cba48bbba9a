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
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from disque.protocol.errors import CommandError, err, not_integer

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


Handler = Callable[[Caller, list[bytes]], None]

# Flag names in the order COMMAND lists them.
FLAG_ORDER = ("write", "readonly", "denyoom", "admin", "random", "loading", "skip_monitor",
              "fast")


class Command:
    __slots__ = ("name", "arity", "flags", "handler", "denyoom", "loading", "noauth",
                 "write", "logs", "calls", "usec", "failed", "rejected")

    def __init__(self, name: str, arity: int, flags: str, handler: Handler,
                 noauth: bool = False, logs: bool = False) -> None:
        self.name = name
        self.arity = arity
        self.flags = tuple(f for f in FLAG_ORDER if f in flags.split())
        self.handler = handler
        self.denyoom = "denyoom" in self.flags
        self.loading = "loading" in self.flags
        self.write = "write" in self.flags
        self.noauth = noauth  # may run before AUTH (AUTH, HELLO)
        # Adds jobs, which the AOF must log: refused with -MISCONF while it cannot be
        # written. Other commands run; a reply confirming a change waits for its record.
        self.logs = logs
        self.calls = 0
        self.usec = 0
        self.failed = 0  # the handler answered an error (CommandError or a crash)
        self.rejected = 0  # refused before the handler: arity, NOAUTH, OOM, LOADING, MISCONF


TABLE: dict[bytes, Command] = {}


def command(name: str, arity: int, flags: str, noauth: bool = False,
            logs: bool = False) -> Callable[[Handler], Handler]:
    """Register a handler in TABLE."""
    def register(fn: Handler) -> Handler:
        TABLE[name.encode()] = Command(name, arity, flags, fn, noauth, logs)
        return fn
    return register


_INT = re.compile(rb"[+-]?[0-9]+")
_I64_MIN = -(1 << 63)
_I64_MAX = (1 << 63) - 1


def parse_int(b: bytes) -> int:
    """Signed 64-bit base-10, whole string, no spaces; the empty string is 0 (as the
    original's parser). Raises ValueError."""
    if b.isdigit() and len(b) < 19:
        return int(b)
    if not b:
        return 0
    if _INT.fullmatch(b) is None:
        raise ValueError(b)
    v = int(b)
    if v < _I64_MIN or v > _I64_MAX:
        raise ValueError(b)
    return v


def int_arg(b: bytes) -> int:
    """An integer argument, with the shared `value is not an integer` error."""
    try:
        return parse_int(b)
    except ValueError:
        raise not_integer() from None


def timeout_arg(b: bytes) -> int:
    """Milliseconds timeout: 0 = forever; errors as the checklist's timeout rules."""
    try:
        v = parse_int(b)
    except ValueError:
        raise err("timeout is not an integer or out of range") from None
    if v < 0:
        raise err("timeout is negative")
    return v


def wrong_arity(name: str) -> CommandError:
    return err(f"wrong number of arguments for '{name}' command")


def load_all() -> dict[bytes, Command]:
    """Import every command module (each registers its handlers) and return TABLE."""
    from disque.commands import admin, jobs, queues  # noqa: F401

    return TABLE
