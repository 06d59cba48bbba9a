"""Command dispatch: the command table and the checks around every call.

`Dispatcher.execute` runs one request of a client in the checklist's order (section 0):
QUIT, unknown command, arity, AUTH, OOM, LOADING, a failing AOF (-MISCONF), then the
handler, with the MONITOR feed before it and the command statistics, SLOWLOG and latency
samples after it. The lookup table is built once from the command table and the config's
rename-command directives (both cases of every name, so most lookups hit at once).

A handler raises `CommandError` for an error reply; anything else it raises is answered as
an internal error and logged, and the server keeps serving.
"""

from __future__ import annotations

import time
from collections import deque
from typing import TYPE_CHECKING, Any, Final

import structlog

from disque.aof.manager import misconf_reply
from disque.commands import Caller, Command, wrong_arity
from disque.config import Config
from disque.connection import REPLY_ON
from disque.latency import NEVER, LatencyMonitor
from disque.protocol.errors import LOADING_REPLY, NOAUTH_REPLY, OOM_REPLY, CommandError
from disque.protocol.reply import OK

if TYPE_CHECKING:
    from disque.aof.manager import AofManager
    from disque.node import Node

log = structlog.get_logger("disque")

_perf_ns: Final = time.perf_counter_ns


class Dispatcher:
    """The command lookup table, the MONITOR clients, the slow log and the command
    counters; `loading` is set while the AOF loads (commands without the `loading` flag
    answer -LOADING)."""

    __slots__ = ("cfg", "node", "latency", "aofm", "table", "lookup", "monitors", "slowlog",
                 "slowlog_id", "loading", "stat_commands", "stat_unknown_commands",
                 "sample_usec")

    def __init__(self, cfg: Config, node: Node, latency: LatencyMonitor, aofm: AofManager,
                 table: dict[bytes, Command]) -> None:
        self.cfg = cfg
        self.node = node
        self.latency = latency
        self.aofm = aofm
        self.table = table
        names = dict(table)
        for old, new in cfg.renamed_commands.items():  # rename-command, in file order
            cmd = names.pop(old.encode(), None)
            if cmd is not None and new:
                names[new.encode()] = cmd
        self.lookup: dict[bytes, Command] = {}
        for name, cmd in names.items():
            self.lookup[name] = cmd
            self.lookup[name.upper()] = cmd
        self.monitors: set[Caller] = set()
        self.slowlog: deque[list[Any]] = deque()
        self.slowlog_id = 0
        self.loading = False
        self.stat_commands = 0
        self.stat_unknown_commands = 0
        self.sample_usec = 0
        self.thresholds_changed()

    def thresholds_changed(self) -> None:
        """slowlog-log-slower-than or latency-monitor-threshold changed (config hook): the
        shortest duration either keeps, so that a command shorter than both costs one test
        of a field, not two reads of interpreted objects' attributes."""
        slow = self.cfg.slowlog_log_slower_than
        self.sample_usec = min(slow + 1 if slow >= 0 else NEVER, self.latency.min_usec)

    def execute(self, c: Caller, argv: list[bytes]) -> None:
        """Run one command: QUIT, unknown, arity, auth, OOM, LOADING checks, then the
        handler (checklist section 0 order)."""
        name = argv[0]
        cmd = self.lookup.get(name)
        if cmd is None:
            cmd = self.lookup.get(name.lower())
            if cmd is None:
                if name.lower() == b"quit":
                    if c.reply_mode == REPLY_ON:  # under CLIENT REPLY OFF/SKIP: no +OK
                        c.out.append(OK)
                    c.flush()
                    c.close()
                    return
                self.stat_unknown_commands += 1
                c.out.append(b"-ERR unknown command '" + name.replace(b"\r", b" ")
                             .replace(b"\n", b" ") + b"'\r\n")
                return
        arity = cmd.arity
        n = len(argv)
        if (arity > 0 and n != arity) or n < -arity:
            cmd.rejected += 1
            c.out.append(wrong_arity(cmd.name).resp())
            return
        if not c.authenticated and not cmd.noauth:
            cmd.rejected += 1
            c.out.append(NOAUTH_REPLY)
            return
        node = self.node
        if cmd.denyoom and node.mem_used > node.mem_evict_at and not node.ensure_memory():
            cmd.rejected += 1
            c.out.append(OOM_REPLY)
            return
        if self.loading and not cmd.loading:
            cmd.rejected += 1
            c.out.append(LOADING_REPLY)
            return
        aof = self.aofm.aof
        if aof is not None:
            if aof.last_write_error is not None and (cmd.logs or cmd.name == "ping"):
                # a new job now could only be refused after the fact; PING tells health
                # checks, as in Redis and the original (checklist section 0)
                cmd.rejected += 1
                c.out.append(misconf_reply(aof.last_write_error))
                return
            mark = len(c.out)
            logged = aof.appended
        if self.monitors:
            self.feed_monitors(c, argv)
        c.last_cmd = cmd
        t0 = _perf_ns()
        try:
            cmd.handler(c, argv)
        except CommandError as exc:
            cmd.failed += 1
            c.out.append(exc.resp())
        except Exception as crash:  # never let one command take the server down
            # (its own name: compiled, one name bound by two `except ... as` clauses has the
            # first clause's type, and a RuntimeError bound to it is a TypeError)
            cmd.failed += 1
            log.exception("command.crash", command=cmd.name)
            c.out.append(b"-ERR internal error while running '" + cmd.name.encode()
                         + b"': " + type(crash).__name__.encode() + b"\r\n")
        if (aof is not None and aof.appended != logged and c.waiter is None
                and len(c.out) > mark and self.aofm.aof is aof):
            c.aof_marks.append((mark, len(c.out)))  # its reply waits for the write
        usec = (_perf_ns() - t0) // 1000
        cmd.calls += 1
        cmd.usec += usec
        self.stat_commands += 1
        if usec >= self.sample_usec:
            self.sample(cmd, argv, usec)

    def sample(self, cmd: Command, argv: list[bytes], usec: int) -> None:
        """A command long enough for the slow log or the latency monitor (or both)."""
        if usec > self.cfg.slowlog_log_slower_than >= 0:
            self.slowlog_add(argv, usec)
        if usec >= self.latency.min_usec:  # never while latency-monitor-threshold is 0
            self.latency.add_command_sample("fast" in cmd.flags, usec)

    def feed_monitors(self, c: Caller, argv: list[bytes]) -> None:
        now = time.time()
        line = b"+%d.%06d [%s] %s\r\n" % (int(now), int((now % 1) * 1e6), c.addr.encode(),
                                          b" ".join(_repr_arg(a) for a in argv))
        for m in list(self.monitors):
            if m is not c and not m.closing and m.transport is not None:
                m.transport.write(line)

    def slowlog_add(self, argv: list[bytes], usec: int) -> None:
        self.slowlog_id += 1
        args = [a if len(a) <= 128 else a[:128] + b"... (%d more bytes)" % (len(a) - 128)
                for a in argv[:32]]
        if len(argv) > 32:
            args[-1] = b"... (%d more arguments)" % (len(argv) - 31)
        self.slowlog.appendleft([self.slowlog_id, int(time.time()), usec, args])
        while len(self.slowlog) > max(0, self.cfg.slowlog_max_len):
            self.slowlog.pop()


def _repr_arg(a: bytes) -> bytes:
    """Quote an argument as Redis's MONITOR does (sdscatrepr)."""
    out = bytearray(b'"')
    for ch in a:
        if ch in (34, 92):
            out += b"\\" + bytes([ch])
        elif ch == 10:
            out += b"\\n"
        elif ch == 13:
            out += b"\\r"
        elif ch == 9:
            out += b"\\t"
        elif 32 <= ch < 127:
            out.append(ch)
        else:
            out += b"\\x%02x" % ch
    out += b'"'
    return bytes(out)
