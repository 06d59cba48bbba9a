"""Queue commands: QLEN, QPEEK, QSTAT, QSCAN, PAUSE."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from disque.commands import Caller, command, int_arg
from disque.commands.jobs import job_entry, scan_args
from disque.protocol.errors import syntax
from disque.protocol.reply import EMPTY_ARRAY, array_len, encode, integer
from disque.queues.queue import PAUSE_IN, PAUSE_OUT, Queue

if TYPE_CHECKING:
    from disque.node import Node


@command("qlen", 2, "readonly fast")
def cmd_qlen(c: Caller, argv: list[bytes]) -> None:
    q = c.node.lookup_queue(argv[1])
    c.out.append(integer(len(q) if q is not None else 0))


@command("qpeek", 3, "readonly")
def cmd_qpeek(c: Caller, argv: list[bytes]) -> None:
    count = int_arg(argv[2])
    q = c.node.lookup_queue(argv[1])
    if q is None or count == 0:
        c.out.append(EMPTY_ARRAY)
        return
    jobs = c.node.overflow.peek(q, abs(count), count < 0)
    c.out.append(array_len(len(jobs)) + b"".join(job_entry(j, False) for j in jobs))


def queue_stats(node: Node, q: Queue) -> list[Any]:
    now = node.clock()
    dead = node.deadletters.by_queue.get(q.name, 0)
    return [
        b"name", q.name,
        b"len", len(q),
        b"age", (now - q.ctime) // 1000,
        b"idle", (now - q.atime) // 1000,
        b"blocked", len(q.waiters),
        b"import-from", list(node.import_sources(q)),
        b"import-rate", q.import_rate,
        b"jobs-in", q.jobs_in,
        b"jobs-out", q.jobs_out,
        b"pause", q.pause_name(),
    ] + ([b"deadlettered", dead] if dead else []) + (  # (the original's 20 elements otherwise)
        [b"overflow-jobs", q.spilled] if node.overflow.store is not None else [])


@command("qstat", 2, "readonly fast")
def cmd_qstat(c: Caller, argv: list[bytes]) -> None:
    q = c.node.lookup_queue(argv[1])
    if q is None:
        c.out.append(c.null_array)
        return
    c.out.append(encode(queue_stats(c.node, q), c.proto))


_QSCAN_OPTS = {b"count": int_arg, b"minlen": int_arg, b"maxlen": int_arg,
               b"importrate": int_arg}


@command("qscan", -1, "readonly")
def cmd_qscan(c: Caller, argv: list[bytes]) -> None:
    cursor, opts, busyloop = scan_args(argv, _QSCAN_OPTS)
    count = 100
    limits: dict[bytes, int] = {}
    for opt, value in opts:
        if opt == b"count":
            count = value
        else:
            limits[opt] = value
    minlen = limits.get(b"minlen")
    maxlen = limits.get(b"maxlen")
    importrate = limits.get(b"importrate")
    if count < 1:
        count = 1

    def keep(q: Queue) -> bool:
        n = len(q)
        return ((minlen is None or n >= minlen) and (maxlen is None or n <= maxlen)
                and (importrate is None or q.import_rate >= importrate))

    nxt, queues = c.node.queues.scan(cursor, count, keep, busyloop)
    c.out.append(encode([str(nxt).encode(), [q.name for q in queues]], c.proto))


_PAUSE_OPTS = {b"none": 0, b"in": PAUSE_IN, b"out": PAUSE_OUT, b"all": PAUSE_IN | PAUSE_OUT}


@command("pause", -3, "readonly fast")
def cmd_pause(c: Caller, argv: list[bytes]) -> None:
    flags = 0
    changed = False
    bcast = False
    for opt in argv[2:]:
        opt = opt.lower()
        if opt in _PAUSE_OPTS:
            value = _PAUSE_OPTS[opt]
            flags = 0 if value == 0 else flags | value
            changed = True
        elif opt == b"bcast":
            bcast = True
        elif opt != b"state":
            raise syntax()
    node = c.node
    state = node.pause(argv[1], flags if changed else None)
    if bcast:
        node.broadcast_pause(argv[1])
    c.out.append(b"+" + state + b"\r\n")
