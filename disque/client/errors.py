"""Typed exceptions for the client: one class per error prefix a node can answer.

A node answers a failed command with `-PREFIX message` (docs/commands.md lists them). redis-py
turns that line into a `redis.ResponseError` (sometimes a subclass, with the prefix cut off);
`error_from_reply` / `error_from_redis` turn either form back into exactly one of the classes
below, so callers catch `NoReplicationError` rather than parse strings. Every class derives from
`DisqueError`, which carries the prefix and the message separately.
"""

from __future__ import annotations

from redis._parsers.base import BaseParser  # its EXCEPTION_CLASSES: the codes it cuts off


class DisqueError(Exception):
    """Any error reply from a node (prefix `ERR` and unknown prefixes land here)."""

    prefix: str = "ERR"

    def __init__(self, message: str = "", prefix: str | None = None) -> None:
        if prefix is not None:
            self.prefix = prefix
        self.message = message
        super().__init__(f"{self.prefix} {message}".strip() if self.prefix else message)


class NoReplicationError(DisqueError):
    """-NOREPL: not enough reachable nodes, or the ADDJOB timeout expired before replication."""

    prefix = "NOREPL"


class PausedError(DisqueError):
    """-PAUSED: the queue is paused for input."""

    prefix = "PAUSED"


class LeavingError(DisqueError):
    """-LEAVING: the node is leaving the cluster; connect to another one."""

    prefix = "LEAVING"


class MaxLenError(DisqueError):
    """-MAXLEN: ADDJOB's MAXLEN was reached on this node's queue."""

    prefix = "MAXLEN"


class NoJobError(DisqueError):
    """-NOJOB: the job is not known to this node (WORKING)."""

    prefix = "NOJOB"


class BadIdError(DisqueError):
    """-BADID: a malformed job ID; the whole command was refused."""

    prefix = "BADID"


class TooLateError(DisqueError):
    """-TOOLATE: WORKING after half of the job's TTL."""

    prefix = "TOOLATE"


class OutOfMemoryError(DisqueError):
    """-OOM: the node is above maxmemory; ADDJOB, ENQUEUE and NACK are refused."""

    prefix = "OOM"


class AuthError(DisqueError):
    """-NOAUTH / -WRONGPASS / AUTH's -ERR invalid password: a password is required (none
    was given) or the one given was refused. Raised by the first command, not retried."""

    prefix = "NOAUTH"


class DisqueConnectionError(DisqueError, ConnectionError):
    """No node could be reached, or the connection was lost where a retry was not safe.
    `unreachable` is True when no connection could be made at all (nothing was sent)."""

    prefix = ""

    def __init__(self, message: str = "", prefix: str | None = None,
                 unreachable: bool = False) -> None:
        super().__init__(message, prefix)
        self.unreachable = unreachable


ERRORS_BY_PREFIX: dict[str, type[DisqueError]] = {
    cls.prefix: cls
    for cls in (NoReplicationError, PausedError, LeavingError, MaxLenError, NoJobError,
                BadIdError, TooLateError, OutOfMemoryError, AuthError)
}
ERRORS_BY_PREFIX["WRONGPASS"] = AuthError


def error_from_reply(line: str) -> DisqueError:
    """`"NOREPL Not enough ..."` (an error line without its `-`) -> the typed exception."""
    prefix, _, message = line.partition(" ")
    if prefix and prefix.isupper() and prefix.isalpha():
        cls = ERRORS_BY_PREFIX.get(prefix, DisqueError)
        return cls(message, prefix)
    return DisqueError(line)


def error_from_redis(exc: BaseException) -> DisqueError:
    """A `redis.ResponseError` (or subclass) raised for an error reply -> typed exception.

    redis-py cuts the prefix off the codes it knows (`ERR`, `OOM`, `NOAUTH`, `WRONGPASS`...:
    its parser's `EXCEPTION_CLASSES`), keeping it in `status_code` (redis-py >= 7.2) and in the
    exception class; unknown codes (`NOREPL`, `LEAVING`...) stay at the start of the text
    (and redis-py >= 8 gives them a `status_code` too)."""
    text = str(exc.args[0]) if exc.args else ""
    code = getattr(exc, "status_code", None)
    if code and code not in BaseParser.EXCEPTION_CLASSES:
        code = None  # not cut off: the text starts with it
    if not code:
        code = _REDIS_CLASS_CODES.get(type(exc).__name__)
    error = error_from_reply(f"{code} {text}" if code else text)
    if not isinstance(error, AuthError) and any(
            cls.__name__ == "AuthenticationError" for cls in type(exc).__mro__):
        # a refused password without an auth prefix: AUTH's `-ERR invalid password` (the
        # original's answer, and what a RESP2 client gets)
        return AuthError(error.message, error.prefix)
    return error


# redis-py exception classes whose prefix it strips, for versions without `status_code`.
_REDIS_CLASS_CODES = {
    "OutOfMemoryError": "OOM",
    "AuthenticationError": "NOAUTH",
    "AuthenticationRequiredError": "NOAUTH",
    "AuthenticationWrongNumberOfArgsError": "ERR",
    "BusyLoadingError": "LOADING",
    "NoPermissionError": "NOPERM",
}
