"""A tiny byte-exact RESP client for the integration tests.

redis-py hides the reply type (status vs bulk, `$-1` vs `*-1`) and rewrites error texts, so the
tests that pin exact replies from the compatibility checklist talk to the server through `Conn`:
`call()` returns the raw bytes of exactly one reply, `cmd()` the decoded value with the RESP type
kept (`Status`, `Err`, bytes for bulk strings, int, list, None for any null).
"""

from __future__ import annotations

import re
import socket
import time
from typing import Any

JOB_ID_RE = re.compile(r"^D-[0-9a-f]{8}-[A-Za-z0-9+/]{24}-[0-9a-f]{4}$")
SHOW_FIELDS = [
    "id", "queue", "state", "repl", "ttl", "ctime", "delay", "retry", "nacks",
    "additional-deliveries", "nodes-delivered", "nodes-confirmed", "next-requeue-within",
    "next-awake-within", "body",
]
QSTAT_FIELDS = [
    "name", "len", "age", "idle", "blocked", "import-from", "import-rate", "jobs-in", "jobs-out",
    "pause",
]


class Status(str):
    """A RESP simple string (`+...`)."""


class Err(str):
    """A RESP error (`-...`), kept as a value so tests can compare the exact text."""


class ConnectionClosed(Exception):
    """The server closed the connection before a complete reply arrived."""


def encode(*args: Any) -> bytes:
    """Encode one request as a RESP multibulk."""
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        if isinstance(a, bytes):
            b = a
        elif isinstance(a, str):
            b = a.encode()
        else:
            b = str(a).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(b), b))
    return b"".join(out)


def _line(buf: bytes, pos: int) -> tuple[bytes, int] | None:
    end = buf.find(b"\r\n", pos)
    if end < 0:
        return None
    return buf[pos:end], end + 2


def parse(buf: bytes, pos: int = 0) -> tuple[Any, int] | None:
    """Decode one reply starting at `pos`; None if the buffer does not hold a complete one."""
    if pos >= len(buf):
        return None
    kind = buf[pos:pos + 1]
    got = _line(buf, pos + 1)
    if got is None:
        return None
    head, pos = got
    if kind == b"+":
        return Status(head.decode(errors="replace")), pos
    if kind == b"-":
        return Err(head.decode(errors="replace")), pos
    if kind in (b":", b"("):
        return int(head), pos
    if kind == b"_":
        return None, pos
    if kind == b",":
        return float(head), pos
    if kind == b"#":
        return head == b"t", pos
    if kind in (b"$", b"=", b"!"):
        n = int(head)
        if n < 0:
            return None, pos
        if len(buf) < pos + n + 2:
            return None
        data = buf[pos:pos + n]
        if kind == b"=":
            data = data[4:]  # drop the "txt:" format prefix of a verbatim string
        if kind == b"!":
            return Err(data.decode(errors="replace")), pos + n + 2
        return data, pos + n + 2
    if kind in (b"*", b"~", b">", b"%", b"|"):
        n = int(head)
        if n < 0:
            return None, pos
        count = n * 2 if kind in (b"%", b"|") else n
        items = []
        for _ in range(count):
            got2 = parse(buf, pos)
            if got2 is None:
                return None
            item, pos = got2
            items.append(item)
        if kind == b"|":  # attributes precede the real reply
            return parse(buf, pos)
        if kind == b"%":
            return {items[i]: items[i + 1] for i in range(0, len(items), 2)}, pos
        return items, pos
    raise ValueError(f"not a RESP reply: {buf[pos - 1:pos + 40]!r}")


class Conn:
    """One client connection to the server, speaking RESP byte for byte."""

    def __init__(self, port: int, timeout: float = 30.0, rcvbuf: int | None = None) -> None:
        self.port = port
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if rcvbuf is not None:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.settimeout(timeout)
        self.sock.connect(("127.0.0.1", port))
        self.timeout = timeout
        self.buf = b""

    # -- sending ------------------------------------------------------------------------------
    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def send_cmd(self, *args: Any) -> None:
        self.sock.sendall(encode(*args))

    # -- receiving ----------------------------------------------------------------------------
    def _fill(self, deadline: float) -> None:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("no complete reply before the deadline")
        self.sock.settimeout(remaining)
        try:
            data = self.sock.recv(1 << 20)
        except ConnectionResetError as exc:
            raise ConnectionClosed(f"reset; buffered {self.buf[:200]!r}") from exc
        finally:
            self.sock.settimeout(self.timeout)
        if not data:
            raise ConnectionClosed(f"closed; buffered {self.buf[:200]!r}")
        self.buf += data

    def read_raw(self, timeout: float | None = None) -> bytes:
        """The exact bytes of the next complete reply."""
        deadline = time.monotonic() + (timeout if timeout is not None else self.timeout)
        while True:
            got = parse(self.buf) if self.buf else None
            if got is not None:
                _, end = got
                raw, self.buf = self.buf[:end], self.buf[end:]
                return raw
            self._fill(deadline)

    def read(self, timeout: float | None = None) -> Any:
        raw = self.read_raw(timeout)
        got = parse(raw)
        assert got is not None
        return got[0]

    def call(self, *args: Any) -> bytes:
        self.send_cmd(*args)
        return self.read_raw()

    def cmd(self, *args: Any) -> Any:
        self.send_cmd(*args)
        return self.read()

    def pipeline(self, cmds: list[tuple[Any, ...]]) -> list[Any]:
        """Send every request in one write, then read one reply per request, in order."""
        self.sock.sendall(b"".join(encode(*c) for c in cmds))
        return [self.read() for _ in cmds]

    def nothing_pending(self) -> bool:
        """True if no reply bytes have arrived (non-blocking check)."""
        if self.buf:
            return False
        self.sock.setblocking(False)
        try:
            data = self.sock.recv(65536)
        except BlockingIOError:
            return True
        finally:
            self.sock.setblocking(True)
            self.sock.settimeout(self.timeout)
        self.buf += data
        return False

    def wait_closed(self, timeout: float = 10.0) -> bytes:
        """Read until the server closes the connection; return what arrived before the close.
        Fails (TimeoutError) if the connection is still open after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                self._fill(deadline)
            except ConnectionClosed:
                data, self.buf = self.buf, b""
                return data

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass

    def __enter__(self) -> Conn:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def pairs(flat: list[Any]) -> dict[str, Any]:
    """A flat [key, value, ...] array (SHOW, QSTAT) as a dict with str keys."""
    assert isinstance(flat, list) and len(flat) % 2 == 0, flat
    return {(k.decode() if isinstance(k, bytes) else str(k)): v for k, v in zip(flat[::2], flat[1::2], strict=True)}


def keys_of(flat: list[Any]) -> list[str]:
    return [k.decode() if isinstance(k, bytes) else str(k) for k in flat[::2]]


def info(conn: Conn, section: str | None = None) -> dict[str, str]:
    """INFO as a flat dict of key -> value (str)."""
    raw = conn.cmd("INFO", section) if section else conn.cmd("INFO")
    assert isinstance(raw, bytes), raw
    out = {}
    for line in raw.decode().split("\r\n"):
        if line and not line.startswith("#") and ":" in line:
            k, v = line.split(":", 1)
            out[k] = v
    return out


def node_id(conn: Conn) -> str:
    hello = conn.cmd("HELLO")
    return hello[1].decode()


def add(conn: Conn, queue: str, body: Any = "body", *opts: Any, timeout: int = 0) -> str:
    """ADDJOB that must succeed; returns the job ID."""
    reply = conn.cmd("ADDJOB", queue, body, timeout, *opts)
    assert isinstance(reply, Status), reply
    return str(reply)


def show(conn: Conn, job_id: str) -> dict[str, Any] | None:
    reply = conn.cmd("SHOW", job_id)
    if reply is None:
        return None
    return pairs(reply)


def qstat(conn: Conn, queue: str) -> dict[str, Any] | None:
    reply = conn.cmd("QSTAT", queue)
    return None if reply is None else pairs(reply)


def blocked_on(conn: Conn, queue: str) -> int:
    """Clients blocked on `queue` per QSTAT (0 when the queue does not exist)."""
    st = qstat(conn, queue)
    return 0 if st is None else st["blocked"]
