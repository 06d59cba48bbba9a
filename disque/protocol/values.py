"""Decoded RESP values as text, for the server's own readers of a reply (the HTTP side runs
commands and reads their replies as a client would).

What hiredis and redis-py hand back for a reply is bytes for bulk and status strings, ints,
lists and None; `decode` turns the strings into `str` and leaves the rest. The client library
may use this module; nothing here imports the client library.
"""

from __future__ import annotations

from typing import Any


def decode(value: Any) -> Any:
    """bytes -> str (UTF-8, undecodable bytes replaced); lists recursively; others as is."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, list):
        return [decode(v) for v in value]
    return value
