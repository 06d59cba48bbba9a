"""Request reader: RESP2 multibulk (parsed by hiredis) and inline commands (telnet/nc).

hiredis parses complete requests fast but buffers whatever a request declares, so on its
own a client could make us buffer a 4 GB bulk or keep a 1 GB query half-sent. The
`HeaderGuard` walks the headers of the one request that is still incomplete (only while one
is: whole requests never pay for it) and refuses oversized counts and lengths as soon as the
header arrives, as Redis does, and caps the bytes a partial request may hold.

Errors carry Redis's texts (`invalid bulk length`, `expected '$', got 'x'`, ...); the caller
answers `-ERR Protocol error: <text>` and closes the connection.
"""

from __future__ import annotations

import hiredis

from disque.protocol.errors import ProtocolError

INLINE_MAX = 64 * 1024
MBULK_MAX = 1024 * 1024
_STAR = 42  # b"*"


# _ENC[n]: bytes a bulk of length n takes on the wire: `$<n>\r\n` + payload + `\r\n`.
_ENC = [n + len(str(n)) + 5 for n in range(1 << 16)]
_enc = _ENC.__getitem__


def encoded_size(req: list[bytes]) -> int:
    """Bytes a request takes in canonical multibulk form (C-level map: this runs once per
    request to find where whole requests end)."""
    try:
        return 3 + len(str(len(req))) + sum(map(_enc, map(len, req)))
    except IndexError:  # a bulk of 64 KiB or more
        return 3 + len(str(len(req))) + sum(len(a) + len(str(len(a))) + 5 for a in req)


class HeaderGuard:
    """Walks the headers of the one request hiredis holds incomplete.

    `feed` returns the offset just past the end of that request, or -1 while it is still
    incomplete; it raises ProtocolError for a header Redis would refuse.
    """

    __slots__ = ("max_bulk", "max_query", "line", "started", "args_left", "bulk_left",
                 "req_bytes")

    def __init__(self, max_bulk: int, max_query: int) -> None:
        self.max_bulk = max_bulk
        self.max_query = max_query
        self.line = b""  # partial header line carried across reads
        self.started = False  # the `*<count>` header was seen
        self.args_left = 0  # bulk headers still expected
        self.bulk_left = 0  # payload bytes (incl. CRLF) still expected in the current bulk
        self.req_bytes = 0  # bytes of this request seen so far

    def feed(self, data: bytes) -> int:
        pos = 0
        end = len(data)
        while pos < end:
            if self.bulk_left:
                take = min(self.bulk_left, end - pos)
                self.bulk_left -= take
                pos += take
                if self.bulk_left == 0 and self.args_left == 0:
                    return pos
                continue
            nl = data.find(b"\n", pos)
            if nl < 0:
                self.line += data[pos:]
                if len(self.line) > INLINE_MAX:
                    raise ProtocolError("too big bulk count string" if self.started
                                        else "too big mbulk count string")
                break
            line = self.line + data[pos:nl]
            self.line = b""
            pos = nl + 1
            if line.endswith(b"\r"):
                line = line[:-1]
            if self._header(line):
                return pos
        self.req_bytes += end
        if self.req_bytes > self.max_query:
            raise ProtocolError("query buffer limit exceeded")
        return -1

    def _header(self, line: bytes) -> bool:
        """Check one header line; True when it completes the request (empty multibulk)."""
        if not self.started:
            if not line or line[0] != _STAR:
                raise ProtocolError("expected '*', got '%s'" % (chr(line[0]) if line else " "))
            try:
                count = int(line[1:])
            except ValueError:
                raise ProtocolError("invalid multibulk length") from None
            if count > MBULK_MAX:
                raise ProtocolError("invalid multibulk length")
            self.started = True
            self.args_left = max(count, 0)
            return self.args_left == 0
        if not line or line[0] != 36:  # b"$"
            raise ProtocolError("expected '$', got '%s'" % (chr(line[0]) if line else " "))
        try:
            n = int(line[1:])
        except ValueError:
            raise ProtocolError("invalid bulk length") from None
        if n < 0 or n > self.max_bulk:
            raise ProtocolError("invalid bulk length")
        self.args_left -= 1
        self.bulk_left = n + 2
        return False


def split_inline(line: bytes) -> list[bytes] | None:
    """Split an inline command like Redis's sdssplitargs; None on unbalanced quotes."""
    args: list[bytes] = []
    i = 0
    n = len(line)
    while True:
        while i < n and line[i] in b" \t\r\n\v\f":
            i += 1
        if i >= n:
            return args
        cur = bytearray()
        inq = insq = False
        while True:
            if inq:
                if i >= n:
                    return None
                c = line[i]
                if c == 92 and i + 3 < n and line[i + 1] == 120 and _ishex(line[i + 2]) \
                        and _ishex(line[i + 3]):  # \xHH
                    cur.append(int(line[i + 2:i + 4], 16))
                    i += 3
                elif c == 92 and i + 1 < n:
                    i += 1
                    e = line[i]
                    cur.append({110: 10, 114: 13, 116: 9, 98: 8, 97: 7}.get(e, e))
                elif c == 34:  # closing "
                    if i + 1 < n and line[i + 1] not in b" \t\r\n\v\f":
                        return None
                    i += 1
                    break
                else:
                    cur.append(c)
            elif insq:
                if i >= n:
                    return None
                c = line[i]
                if c == 92 and i + 1 < n and line[i + 1] == 39:
                    i += 1
                    cur.append(39)
                elif c == 39:
                    if i + 1 < n and line[i + 1] not in b" \t\r\n\v\f":
                        return None
                    i += 1
                    break
                else:
                    cur.append(c)
            else:
                if i >= n:
                    break
                c = line[i]
                if c in b" \t\r\n\v\f":
                    break
                if c == 34:
                    inq = True
                elif c == 39:
                    insq = True
                else:
                    cur.append(c)
            i += 1
        args.append(bytes(cur))


def _ishex(c: int) -> bool:
    return c in b"0123456789abcdefABCDEF"


def _bad_element(a: object) -> str:
    """Redis's text for a request element hiredis parsed as something other than a bulk."""
    if a is None:
        return "invalid bulk length"
    kind = ":" if isinstance(a, int) else "*" if isinstance(a, list) else \
        "-" if isinstance(a, Exception) else "+"
    return f"expected '$', got '{kind}'"


class RequestReader:
    """Turns the bytes of one connection into complete requests (lists of bytes)."""

    __slots__ = ("_reader", "_guard", "_inline", "max_bulk", "max_query")

    def __init__(self, max_bulk: int = 512 * 1024 * 1024,
                 max_query: int = 1024 * 1024 * 1024) -> None:
        self._reader = hiredis.Reader()
        self._guard: HeaderGuard | None = None
        self._inline = b""
        self.max_bulk = max_bulk
        self.max_query = max_query

    def feed(self, data: bytes, reqs: list) -> None:
        """Append the complete requests in `data` to `reqs`; raise ProtocolError if malformed.

        Requests parsed before a malformed one are still appended, so the caller can answer
        them before the protocol error, as Redis does.
        """
        while data:
            if self._guard is None and not self._inline and data[0] != _STAR:
                data = self._feed_inline(data, reqs)
            elif self._inline:
                data = self._feed_inline(data, reqs)
            else:
                data = self._feed_multibulk(data, reqs)

    def _feed_multibulk(self, data: bytes, reqs: list) -> bytes:
        r = self._reader
        guard = self._guard
        first = len(reqs)
        r.feed(data)
        try:
            while True:
                req = r.gets()
                if req is False:
                    break
                if req.__class__ is not list:
                    if req is None:  # `*-1`: an empty request, ignored as Redis does
                        continue
                    raise ProtocolError("expected '*', got '%s'" % chr(data[0]))
                for a in req:
                    if a.__class__ is not bytes:
                        raise ProtocolError(_bad_element(a))
                reqs.append(req)
        except hiredis.ProtocolError:
            self._reader = hiredis.Reader()
            self._guard = None
            if guard is not None:
                guard.feed(data)  # raises with Redis's text for the bad header
                raise ProtocolError("invalid bulk length") from None
            rest = data[sum(map(encoded_size, reqs[first:])):]
            if rest and rest[0] != _STAR:
                return rest  # an inline command after pipelined multibulk ones
            HeaderGuard(self.max_bulk, self.max_query).feed(rest)
            raise ProtocolError("invalid multibulk length") from None
        # Where did whole requests end? Either the guard knows (it was walking the request
        # left incomplete by the previous read) or the sizes of the requests parsed tell.
        try:
            if guard is not None:
                done = guard.feed(data)
                if done < 0:
                    return b""
                first += 1
            else:
                done = 0
            done += sum(map(encoded_size, reqs[first:])) if len(reqs) > first else 0
            if done < len(data):
                guard = self._guard = HeaderGuard(self.max_bulk, self.max_query)
                if guard.feed(data[done:]) >= 0:  # non-canonical encoding: trust hiredis
                    self._guard = None
            else:
                self._guard = None
        except ProtocolError:
            self._reader = hiredis.Reader()
            self._guard = None
            raise
        return b""

    def _feed_inline(self, data: bytes, reqs: list) -> bytes:
        buf = self._inline + data if self._inline else data
        while buf and buf[0] != _STAR:
            nl = buf.find(b"\n")
            if nl < 0:
                if len(buf) > INLINE_MAX:
                    self._inline = b""
                    raise ProtocolError("too big inline request")
                self._inline = buf
                return b""
            line = buf[:nl]
            buf = buf[nl + 1:]
            args = split_inline(line)
            if args is None:
                self._inline = b""
                raise ProtocolError("unbalanced quotes in request")
            if args:
                reqs.append(args)
        self._inline = b""
        return buf
