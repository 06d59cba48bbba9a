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

from typing import Final

import hiredis

from disque.protocol.errors import ProtocolError

INLINE_MAX: Final = 64 * 1024
MBULK_MAX: Final = 1024 * 1024
_STAR: Final = 42  # b"*"


# _ENC[n]: bytes a bulk of length n takes on the wire: `$<n>\r\n` + payload + `\r\n`.
_ENC: Final[list[int]] = [n + len(str(n)) + 5 for n in range(1 << 16)]

# _HEAD[n]: bytes the `*<n>\r\n` header of a request of n arguments takes.
_HEAD: Final[list[int]] = [len(str(n)) + 3 for n in range(1 << 10)]


# has_big_count's map: each digit to `0`, `*` to itself, any other byte to `x`
_COUNT_MAP: Final = bytes(48 if 48 <= b <= 57 else 42 if b == 42 else 120 for b in range(256))


def has_big_count(data: bytes) -> bool:
    """Whether `data` holds a `*` followed by 7 or more digits: a count that may exceed
    MBULK_MAX. hiredis allocates a list of the declared size as soon as it reads
    `*<count>` (a count of a billion is a MemoryError, of a hundred million an 800 MB
    spike), so such bytes make the reader walk the headers first (rare: only a payload
    holding them pays for it). What the regular expression `\\*[0-9]{7,}` would find, in
    two C passes (a translation, a substring search) instead of its per-call cost (about
    1,500 instructions for a one-request read). `find`, not `in`: bytes' `in` tries its
    argument as an integer first, and formats the TypeError it then drops (147 against 71
    ns a call; under perf on a PING P1 load, 158 of 688 user-time samples of the server
    were in this check with `in`, 108 of 632 with `find`: cold, each request's first pass
    over the bytes costs more than in a loop)."""
    return data.translate(_COUNT_MAP).find(b"*0000000") >= 0


def request_size(req: list[bytes]) -> int:
    """Bytes one request takes in canonical multibulk form, to find where whole requests
    end (a loop over table lookups: compiled, a few instructions per argument)."""
    try:
        size = _HEAD[len(req)]
        for a in req:
            size += _ENC[len(a)]
        return size
    except IndexError:  # a bulk of 64 KiB or more, or a request of 1024+ arguments
        return len(str(len(req))) + 3 + sum(len(a) + len(str(len(a))) + 5 for a in req)


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

    def copy(self) -> HeaderGuard:
        """A guard in the same state, to probe ahead without moving this one."""
        probe = HeaderGuard(self.max_bulk, self.max_query)
        probe.line = self.line
        probe.started = self.started
        probe.args_left = self.args_left
        probe.bulk_left = self.bulk_left
        probe.req_bytes = self.req_bytes
        return probe

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

    def diagnose(self) -> str:
        """Redis's text for the header line this guard is still waiting to complete."""
        line = self.line
        if self.started and self.args_left and line and line[0] != 36:
            return "expected '$', got '%s'" % chr(line[0])
        return "invalid bulk length" if self.started else "invalid multibulk length"

    def _header(self, line: bytes) -> bool:
        """Check one header line; True when it completes the request (empty multibulk)."""
        if not self.started:
            if not line or line[0] != _STAR:
                raise ProtocolError("expected '*', got '%s'" % (chr(line[0]) if line else " "))
            try:
                count = strict_int(line[1:])
            except ValueError:
                raise ProtocolError("invalid multibulk length") from None
            if count > MBULK_MAX:
                raise ProtocolError("invalid multibulk length")
            self.started = True
            self.args_left = max(count, 0)
            return self.args_left == 0
        if line[:1] == b"+":
            # hiredis takes a status line as an element (it cannot tell it from a bulk), so
            # the guard does too: the same request must not be refused or run depending on
            # how it was split into reads.
            self.args_left -= 1
            return self.args_left == 0
        if not line or line[0] != 36:  # b"$"
            raise ProtocolError("expected '$', got '%s'" % (chr(line[0]) if line else " "))
        try:
            n = strict_int(line[1:])
        except ValueError:
            raise ProtocolError("invalid bulk length") from None
        if n < 0 or n > self.max_bulk:
            raise ProtocolError("invalid bulk length")
        self.args_left -= 1
        self.bulk_left = n + 2
        return False


def strict_int(b: bytes) -> int:
    """Redis's string2ll: optional '-', digits, no leading zeros, no '+' or spaces."""
    digits = b[1:] if b[:1] == b"-" else b
    if not digits.isdigit() or len(digits) > 19 or (len(digits) > 1 and digits[0] == 48):
        raise ValueError(b)
    return int(b)


def split_inline(line: bytes) -> list[bytes] | None:
    """Split an inline command like Redis's sdssplitargs; None on unbalanced quotes.

    sdssplitargs reads a C string: a NUL byte ends the input (and must, here: a NUL token
    separator that the whitespace skip does not step over would loop forever)."""
    nul = line.find(b"\0")
    if nul >= 0:
        line = line[:nul]
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
                if c in b" \n\r\t":  # sdssplitargs: \v and \f do not end a token
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


class RequestReader:
    """Turns the bytes of one connection into complete requests (lists of bytes)."""

    __slots__ = ("_reader", "_guard", "_inline_line", "max_bulk", "max_query")

    def __init__(self, max_bulk: int = 512 * 1024 * 1024,
                 max_query: int = 1024 * 1024 * 1024) -> None:
        self._reader = hiredis.Reader()
        self._guard: HeaderGuard | None = None
        self._inline_line = b""
        self.max_bulk = max_bulk
        self.max_query = max_query

    def buffered(self) -> int:
        """Bytes received and not yet parsed into a request: the one incomplete request held
        (a multibulk one, whose bytes the guard counts, or an inline line). Read only by
        CLIENT LIST and INFO, never on the request path."""
        guard = self._guard
        return len(self._inline_line) + (guard.req_bytes if guard is not None else 0)

    def feed(self, data: bytes, reqs: list) -> None:
        """Append the complete requests in `data` to `reqs`; raise ProtocolError if malformed.

        Requests parsed before a malformed one are still appended, so the caller can answer
        them before the protocol error, as Redis does.
        """
        while data:
            if self._guard is None and not self._inline_line and data[0] != _STAR:
                data = self._feed_inline(data, reqs)
            elif self._inline_line:
                data = self._feed_inline(data, reqs)
            else:
                data = self._feed_multibulk(data, reqs)

    def _feed_multibulk(self, data: bytes, reqs: list) -> bytes:
        r = self._reader
        guard = self._guard
        first = len(reqs)
        if has_big_count(data):
            bad = self._check_counts(data)
            if bad is not None:
                # Whole requests before the bad one still run, as Redis does.
                if bad[0]:
                    self._feed_multibulk(data[:bad[0]], reqs)
                self._reset()
                raise ProtocolError(bad[1])
        r.feed(data)
        # odd: hiredis met something that is not a whole multibulk request of bulks. The
        # error text then comes from the bytes themselves (the guard walks them), not from
        # what hiredis made of them: it builds RESP3 aggregates (`%`, `~`, `>`) as lists, and
        # raises TypeError, not its ProtocolError, on a map or set whose key is an array.
        odd = False
        try:
            while True:
                req = r.gets()
                if req is False:
                    break
                if isinstance(req, list) and req:
                    for a in req:
                        if not isinstance(a, bytes):
                            break  # an element that is not a bulk
                    else:
                        reqs.append(req)
                        continue
                # `*0`, `*-1`, a reply-like line such as `+x` / `:1`, a bad element
                odd = True
                break
        except (hiredis.ProtocolError, TypeError):
            odd = True
        # Where do whole requests end? The guard knows for the request the previous read
        # left incomplete; the sizes of the requests parsed tell for the rest.
        try:
            if guard is not None:
                done = guard.feed(data)
                if done < 0:
                    if odd:
                        raise ProtocolError(guard.diagnose())
                    return b""
                if len(reqs) == first:  # hiredis refused what the guard found well formed
                    raise ProtocolError("invalid bulk length")
                first += 1
            else:
                done = 0
            for k in range(first, len(reqs)):
                done += request_size(reqs[k])
            if odd:
                self._reset()
                return self._at_boundary(data[done:])
            if done < len(data):
                guard = self._guard = HeaderGuard(self.max_bulk, self.max_query)
                if guard.feed(data[done:]) >= 0:  # non-canonical encoding: trust hiredis
                    self._guard = None
            else:
                self._guard = None
        except ProtocolError:
            self._reset()
            raise
        return b""

    def _check_counts(self, data: bytes) -> tuple[int, str] | None:
        """Walk every header in `data` (from the request boundary the reader is at) before
        hiredis allocates for oversized counts; (offset of the bad request, error) or None."""
        pos = 0
        guard = self._guard
        try:
            if guard is not None:
                end = guard.copy().feed(data)
                if end < 0:
                    return None
                pos = end
        except ProtocolError as exc:
            return 0, str(exc)
        while pos < len(data):
            if data[pos] != _STAR:
                return None  # inline: hiredis will not see it
            try:
                end = HeaderGuard(self.max_bulk, self.max_query).feed(data[pos:])
            except ProtocolError as exc:
                return pos, str(exc)
            if end < 0:
                return None
            pos += end
        return None

    def _reset(self) -> None:
        self._reader = hiredis.Reader()
        self._guard = None

    def _at_boundary(self, rest: bytes) -> bytes:
        """Bytes at a request boundary that hiredis did not take as a multibulk request:
        an inline command, an empty multibulk (ignored, as Redis does), or an error."""
        if not rest or rest[0] != _STAR:
            return rest
        nl = rest.find(b"\n")
        if nl < 0:
            raise ProtocolError("invalid multibulk length")
        line = rest[1:nl]
        if line.endswith(b"\r"):
            line = line[:-1]
        try:
            count = strict_int(line)
        except ValueError:
            raise ProtocolError("invalid multibulk length") from None
        if count > MBULK_MAX:
            raise ProtocolError("invalid multibulk length")
        if count <= 0:
            return rest[nl + 1:]
        HeaderGuard(self.max_bulk, self.max_query).feed(rest)
        raise ProtocolError("invalid bulk length")

    def _feed_inline(self, data: bytes, reqs: list) -> bytes:
        buf = self._inline_line + data if self._inline_line else data
        while buf and buf[0] != _STAR:
            nl = buf.find(b"\n")
            if nl < 0:
                if len(buf) > INLINE_MAX:
                    self._inline_line = b""
                    raise ProtocolError("too big inline request")
                self._inline_line = buf
                return b""
            line = buf[:nl]
            buf = buf[nl + 1:]
            args = split_inline(line)
            if args is None:
                self._inline_line = b""
                raise ProtocolError("unbalanced quotes in request")
            if args:
                reqs.append(args)
        self._inline_line = b""
        return buf
