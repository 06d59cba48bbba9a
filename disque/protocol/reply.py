"""Reply encoding for RESP2 and RESP3.

Hot commands build their reply bytes with the small functions here (no intermediate
objects); the rest return Python values that `encode` turns into RESP. The only RESP3
differences a Disque client sees are nulls (`_`) and the map of `HELLO 3`: Disque's own
commands keep their flat-array shapes under RESP3, as the original's clients expect.
"""

from __future__ import annotations

from typing import Any, Final

from mypy_extensions import mypyc_attr

OK: Final = b"+OK\r\n"
PONG: Final = b"+PONG\r\n"
EMPTY_ARRAY: Final = b"*0\r\n"
NULL_BULK2: Final = b"$-1\r\n"
NULL_ARRAY2: Final = b"*-1\r\n"
NULL3: Final = b"_\r\n"

_INTS = [b":%d\r\n" % i for i in range(1024)]
_ALENS = [b"*%d\r\n" % i for i in range(64)]


# A marker subclass of a builtin: a plain Python class even where this module is compiled
# (mypyc cannot compile a subclass of str or bytes as a native class).
@mypyc_attr(native_class=False)
class Status(str):
    """A string answered as a status reply (`+text`) instead of a bulk string."""

    __slots__ = ()


class NullArray:
    """Marker for the nil array reply (`*-1` in RESP2, `_` in RESP3)."""

    __slots__ = ()


NIL_ARRAY = NullArray()


class Map(dict):
    """Answered as a RESP3 map, or as a flat key/value array in RESP2."""

    __slots__ = ()


# A marker subclass of a builtin: a plain Python class even where this module is compiled
# (mypyc cannot compile a subclass of str or bytes as a native class).
@mypyc_attr(native_class=False)
class Verbatim(bytes):
    """Pre-encoded RESP bytes, passed through `encode` untouched."""

    __slots__ = ()


def integer(n: int) -> bytes:
    if 0 <= n < 1024:
        return _INTS[n]
    return b":%d\r\n" % n


def bulk(b: bytes) -> bytes:
    return b"$%d\r\n%b\r\n" % (len(b), b)


def status(b: bytes) -> bytes:
    return b"+" + b + b"\r\n"


def array_len(n: int) -> bytes:
    if n < 64:
        return _ALENS[n]
    return b"*%d\r\n" % n


def encode(value: Any, proto: int = 2) -> bytes:
    """Encode a Python value as a RESP reply (RESP3 nulls and maps when proto == 3)."""
    out: list[bytes] = []
    _encode(value, proto, out)
    return b"".join(out)


def _encode(value: Any, proto: int, out: list[bytes]) -> None:
    if value is None:
        out.append(NULL3 if proto == 3 else NULL_BULK2)
    elif isinstance(value, Verbatim):
        out.append(value)
    elif isinstance(value, Status):
        out.append(b"+" + value.encode() + b"\r\n")
    elif isinstance(value, bytes):
        out.append(b"$%d\r\n%b\r\n" % (len(value), value))
    elif isinstance(value, bool):
        out.append(integer(int(value)))
    elif isinstance(value, int):
        out.append(integer(value))
    elif isinstance(value, str):
        b = value.encode()
        out.append(b"$%d\r\n%b\r\n" % (len(b), b))
    elif isinstance(value, float):
        b = repr(value).encode()
        out.append(b"$%d\r\n%b\r\n" % (len(b), b))
    elif isinstance(value, Map):
        if proto == 3:
            out.append(b"%%%d\r\n" % len(value))
        else:
            out.append(array_len(2 * len(value)))
        for k, v in value.items():
            _encode(k, proto, out)
            _encode(v, proto, out)
    elif isinstance(value, (list, tuple)):
        out.append(array_len(len(value)))
        for item in value:
            _encode(item, proto, out)
    elif isinstance(value, NullArray):
        out.append(NULL3 if proto == 3 else NULL_ARRAY2)
    else:
        raise TypeError(f"cannot encode {type(value).__name__} as RESP")
