"""Typed command errors: every layer raises `CommandError(prefix, message)`; the dispatcher is
the one place that turns it into `-PREFIX message\\r\\n`."""

from __future__ import annotations

from typing import Final


class CommandError(Exception):
    """A failure that is answered to the client as a RESP error reply."""

    __slots__ = ("prefix", "message")

    def __init__(self, prefix: str, message: str = "") -> None:
        super().__init__(f"{prefix} {message}".strip())
        self.prefix = prefix
        self.message = message

    def resp(self) -> bytes:
        text = f"{self.prefix} {self.message}" if self.message else self.prefix
        # An error line must not contain CR/LF (DEBUG ERROR relies on this, as Redis).
        text = text.replace("\r", " ").replace("\n", " ")
        return b"-" + text.encode("utf-8", "replace") + b"\r\n"


def err(message: str) -> CommandError:
    """The common `-ERR ...` error."""
    return CommandError("ERR", message)


def syntax() -> CommandError:
    return err("syntax error")


def not_integer() -> CommandError:
    return err("value is not an integer or out of range")


def badid() -> CommandError:
    return CommandError("BADID", "Invalid Job ID format.")


def leaving() -> CommandError:
    return CommandError("LEAVING",
                        "This node is leaving the cluster, please connect to a different one")


def aof_write_failed(error: str) -> CommandError:
    """A change the AOF could not log (a full disk): Redis's reply for a failed AOF write,
    with the cause as strerror() words it."""
    return CommandError("MISCONF", "Errors writing to the AOF file: " + error)


# Fixed error replies, pre-encoded for the dispatcher's hot checks.
NOAUTH_REPLY: Final = b"-NOAUTH Authentication required.\r\n"
OOM_REPLY: Final = b"-OOM command not allowed when used memory > 'maxmemory'.\r\n"
LOADING_REPLY: Final = b"-LOADING Disque is loading the dataset in memory\r\n"


class ProtocolError(Exception):
    """Malformed request bytes: answered with `-ERR Protocol error: ...` and the link closed."""
