"""The command table: `Command` records, the `command` decorator that fills `TABLE`, and
the integer argument parsers every family shares.

A module of its own so that it compiles with the request path (disque.compiled): the
dispatcher reads a command's arity and flags, and counts its calls, on every request.
`disque.commands` re-exports all of it.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Final

from disque.protocol.errors import CommandError, err, not_integer

if TYPE_CHECKING:
    from disque.commands import Caller

Handler = Callable[["Caller", list[bytes]], None]  # a string: Caller is for type checks only

# Flag names in the order COMMAND lists them.
FLAG_ORDER: Final = ("write", "readonly", "denyoom", "admin", "random", "loading", "skip_monitor",
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
_I64_MIN: Final = -(1 << 63)
_I64_MAX: Final = (1 << 63) - 1


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


