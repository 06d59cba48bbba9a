"""Job commands: GETJOB, ACKJOB, FASTACK, DELJOB, ENQUEUE, NACK, DEQUEUE, WORKING, SHOW,
JSCAN, REDRIVE, LOADJOB (ADDJOB and ADDJOBS: disque.commands.addjob, registered first).
Validation order and texts follow the checklist (section 4)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Final

from disque.commands import Caller, command, int_arg, timeout_arg
from disque.commands.addjob import opt_value, ranged
from disque.jobs.deadletter import REASON_NAMES, DeadLetter
from disque.jobs.ids import is_valid_id
from disque.jobs.job import (
    ACKED,
    F_DUMMY,
    MAX_JOB_SECONDS,
    STATE_BY_NAME,
    STATE_NAMES,
    Job,
)
from disque.node import Waiter
from disque.protocol.errors import CommandError, badid, err, syntax
from disque.protocol.reply import Status, array_len, encode, integer

if TYPE_CHECKING:
    from disque.node import Node


def job_ids(argv: list[bytes], start: int = 1) -> list[bytes]:
    """Every ID validated before anything is done (one bad ID: -BADID, nothing changes)."""
    ids = argv[start:]
    for job_id in ids:
        if not is_valid_id(job_id):
            raise badid()
    return ids


# `$<n>\r\n` headers of short bodies, and the fixed `*3 queue $40` head of each queue's
# entries: a GETJOB reply is then a join of ready pieces (the % formatting cost 2x more).
_BODY_HEADS = [b"\r\n$%d\r\n" % n for n in range(4096)]
_QUEUE_HEADS: dict[bytes, bytes] = {}


def _queue_head(q: bytes) -> bytes:
    head = _QUEUE_HEADS.get(q)
    if head is None:
        if len(_QUEUE_HEADS) >= 4096:
            _QUEUE_HEADS.clear()
        head = _QUEUE_HEADS[q] = b"*3\r\n$%d\r\n%b\r\n$40\r\n" % (len(q), q)
    return head


def job_entry(job: Job, withcounters: bool) -> bytes:
    q = job.queue
    body = job.body
    assert q is not None and body is not None  # (a job handed out or peeked is queued)
    if withcounters:
        return (b"*7\r\n$%d\r\n%b\r\n$40\r\n%b\r\n$%d\r\n%b\r\n$5\r\nnacks\r\n:%d\r\n"
                b"$21\r\nadditional-deliveries\r\n:%d\r\n"
                % (len(q), q, job.id, len(body), body, job.nacks, job.deliveries))
    n = len(body)
    return b"".join((_QUEUE_HEADS.get(q) or _queue_head(q), job.id,
                     _BODY_HEADS[n] if n < 4096 else b"\r\n$%d\r\n" % n, body, b"\r\n"))


def jobs_reply(jobs: list[Job], withcounters: bool) -> bytes:
    if len(jobs) == 1 and not withcounters:  # GETJOB's usual reply: one join, no frames
        job = jobs[0]
        q = job.queue
        body = job.body
        assert q is not None and body is not None  # (a job handed out is queued)
        n = len(body)
        return b"".join((b"*1\r\n", _QUEUE_HEADS.get(q) or _queue_head(q), job.id,
                         _BODY_HEADS[n] if n < 4096 else b"\r\n$%d\r\n" % n, body,
                         b"\r\n"))
    parts = [array_len(len(jobs))]
    for job in jobs:
        parts.append(job_entry(job, withcounters))
    return b"".join(parts)


# ---------------------------------------------------------------------------- GETJOB
class BlockedGetJob(Waiter):
    """A GETJOB client waiting for a job: the node calls back, we answer the client."""

    __slots__ = ("client",)

    def __init__(self, client: Caller, queues: list[bytes], count: int,
                 withcounters: bool) -> None:
        super().__init__(queues, count, withcounters)
        self.client: Caller | None = client

    # (the node calls these only while the client waits: it unblocks a client that leaves)
    def on_jobs(self, jobs: list[Job]) -> None:
        c = self.client
        if c is not None:
            c.unblocked(jobs_reply(jobs, self.withcounters))

    def on_timeout(self) -> None:
        c = self.client
        if c is not None:
            c.unblocked(c.null_array)

    def on_error(self, error: CommandError) -> None:
        c = self.client
        if c is not None:
            c.unblocked(error.resp())


@command("getjob", -2, "write fast")
def cmd_getjob(c: Caller, argv: list[bytes]) -> None:
    nohang = withcounters = False
    timeout = 0
    count = 1
    queues = None
    n = len(argv)
    i = 1
    while i < n:
        opt = argv[i].lower()
        if opt == b"from":
            queues = argv[i + 1:]
            break
        if opt == b"nohang":
            nohang = True
        elif opt == b"withcounters":
            withcounters = True
        elif opt == b"timeout":
            timeout = timeout_arg(opt_value(argv, i))
            i += 1
        elif opt == b"count":
            count = ranged(opt_value(argv, i), 1, None,
                            "COUNT must be a number greater than zero")
            i += 1
        else:
            raise syntax()
        i += 1
    if not queues:
        raise syntax()
    node = c.node
    jobs = node.get_jobs(queues, count)
    if jobs:
        c.out.append(jobs_reply(jobs, withcounters))
        return
    if nohang:
        c.out.append(c.null_array)
        return
    waiter = BlockedGetJob(c, queues, count, withcounters)
    node.block(waiter, timeout)  # raises -LEAVING on a leaving node
    c.block(waiter)


# ---------------------------------------------------------------------------- ACK family
@command("ackjob", -1, "write fast")
def cmd_ackjob(c: Caller, argv: list[bytes]) -> None:
    node = c.node
    c.out.append(integer(node.ackjob(job_ids(argv))))
    if node.out:
        c.server.shared.ack_sent = True  # the SETACKs go before the reply (Client.process)


@command("fastack", -1, "write fast")
def cmd_fastack(c: Caller, argv: list[bytes]) -> None:
    c.out.append(integer(c.node.fastack(job_ids(argv))))


@command("deljob", -1, "write fast")
def cmd_deljob(c: Caller, argv: list[bytes]) -> None:
    c.out.append(integer(c.node.deljob(job_ids(argv))))


@command("enqueue", -1, "write denyoom fast")
def cmd_enqueue(c: Caller, argv: list[bytes]) -> None:
    c.out.append(integer(c.node.enqueue_jobs(job_ids(argv), nack=False)))


@command("nack", -1, "write denyoom fast")
def cmd_nack(c: Caller, argv: list[bytes]) -> None:
    """NACK job-id ... [DELAY seconds]: the option may stand anywhere among the IDs (no job ID
    can be mistaken for it)."""
    delay: int | None = None
    if len(argv) > 2 and b"delay" in (a.lower() for a in argv if len(a) == 5):
        ids: list[bytes] = []
        i = 1
        while i < len(argv):
            if argv[i].lower() == b"delay":
                delay = ranged(opt_value(argv, i), 0, MAX_JOB_SECONDS,
                                "DELAY time must be a non negative number")
                i += 2
            else:
                ids.append(argv[i])
                i += 1
        argv = [argv[0], *ids]
    c.out.append(integer(c.node.nack_jobs(job_ids(argv), delay)))


@command("dequeue", -1, "write fast")
def cmd_dequeue(c: Caller, argv: list[bytes]) -> None:
    c.out.append(integer(c.node.dequeue_jobs(job_ids(argv))))


@command("working", 2, "write fast")
def cmd_working(c: Caller, argv: list[bytes]) -> None:
    job_ids(argv)
    c.out.append(integer(c.node.working(argv[1])))


@command("loadjob", 2, "write", logs=True)
def cmd_loadjob(c: Caller, argv: list[bytes]) -> None:
    raise err("LOADJOB is a special command only processed from AOF")


# ---------------------------------------------------------------------------- SHOW / JSCAN
def show_fields(node: Node, job: Job) -> list[Any]:
    """The 30-element SHOW description (checklist section 5)."""
    now = node.clock()
    dummy = job.flags & F_DUMMY
    ctime = 0 if dummy else job.ctime
    return [
        b"id", job.id,
        b"queue", job.queue,
        b"state", STATE_NAMES[job.state],
        b"repl", job.repl,
        b"ttl", max(0, (job.etime - now) // 1000),
        b"ctime", ctime,
        b"delay", job.delay,
        b"retry", job.retry,
        b"nacks", job.nacks,
        b"additional-deliveries", job.deliveries,
        b"nodes-delivered", list(job.delivered),
        b"nodes-confirmed", list(job.confirmed),
        b"next-requeue-within",
        max(0, job.qtime - now) if job.qtime and job.state != ACKED else None,
        b"next-awake-within", max(0, job.awake - now) if job.awake else None,
        b"body", job.body,
    ] + (deadletter_fields(job.dl) if job.dl is not None else [])


def deadletter_fields(dl: DeadLetter) -> list[Any]:
    """SHOW's fields for a job with a dead-letter policy (after the original's 30)."""
    dead = dl.dead
    return [
        b"max-deliveries", dl.max_deliveries,
        b"max-nacks", dl.max_nacks,
        b"deadletter-queue", dl.queue,
        b"source-queue", dl.source,
        b"deadletter-reason", REASON_NAMES[dl.reason] if dead else None,
        b"deadletter-time", dl.dead_at if dead else None,
        b"redrives", dl.epoch // 2,
        b"backoff", dl.backoff,
    ]


# ---------------------------------------------------------------------------- REDRIVE
@command("redrive", -2, "write denyoom", logs=True)
def cmd_redrive(c: Caller, argv: list[bytes]) -> None:
    """REDRIVE dead-letter-queue [COUNT n] [RATE jobs-per-second] [RESET] [ID id ...]:
    dead jobs queued here back to their source queues, by a task moving RATE a second
    (reply: how many it will move), or the IDs given, at once (reply: how many moved)."""
    node = c.node
    count: int | None = None
    rate = node.redrive_rate
    reset = False
    ids: list[bytes] | None = None
    i = 2
    while i < len(argv):
        opt = argv[i].lower()
        if opt == b"reset":
            reset = True
            i += 1
        elif opt == b"id":
            ids = job_ids(argv, i + 1)
            if not ids:
                raise syntax()
            break
        elif opt == b"count":
            count = ranged(opt_value(argv, i), 1, None, "COUNT must be a positive number")
            i += 2
        elif opt == b"rate":
            rate = ranged(opt_value(argv, i), 1, None, "RATE must be a positive number")
            i += 2
        else:
            raise syntax()
    if ids is not None:
        c.out.append(integer(node.deadletters.redrive_ids(argv[1], ids, reset)))
    else:
        c.out.append(integer(node.deadletters.redrive(argv[1], count, rate, reset)))


@command("show", 2, "readonly fast")
def cmd_show(c: Caller, argv: list[bytes]) -> None:
    job_ids(argv)
    job = c.node.lookup_job(argv[1])
    if job is None:
        c.out.append(c.null_bulk)
        return
    c.out.append(encode(show_fields(c.node, job), c.proto))


_CURSOR_LIMIT: Final = 1 << 64


def parse_cursor(token: bytes, cursor: int | None) -> int:
    """A token that is no option is the cursor, once. It is read as the original's strtoul
    does: an unsigned 64-bit decimal with an optional sign, a minus wrapping around (`-1` is
    2^64-1), and an empty token meaning 0; anything else, or a value past 64 bits, is bad."""
    if cursor is not None:
        raise syntax()
    if not token:
        return 0
    digits = token[1:] if token[:1] in (b"+", b"-") else token
    # (a length check first: int() refuses more than 4300 digits with a ValueError)
    if not digits.isdigit() or len(digits.lstrip(b"0")) > 20 or int(digits) >= _CURSOR_LIMIT:
        raise err("invalid cursor or option name")
    value = int(digits)
    return (_CURSOR_LIMIT - value) % _CURSOR_LIMIT if token[:1] == b"-" else value


def scan_args(argv: list[bytes], valued: Mapping[bytes, Callable[[bytes], Any]]
              ) -> tuple[int, list[tuple[bytes, Any]], bool]:
    """QSCAN/JSCAN arguments: BUSYLOOP, `name value` options (in order, repeatable) and one
    cursor: any other token, or an option keyword with no value after it, is the cursor.
    Each value is parsed as soon as it is met, so with several bad tokens the leftmost one
    gives the error (as the original, which parses in one pass)."""
    cursor = None
    busyloop = False
    opts: list[tuple[bytes, Any]] = []
    n = len(argv)
    i = 1
    while i < n:
        opt = argv[i].lower()
        if opt == b"busyloop":
            busyloop = True
        elif opt in valued and i + 1 < n:
            opts.append((opt, valued[opt](argv[i + 1])))
            i += 1
        else:
            cursor = parse_cursor(argv[i], cursor)
        i += 1
    return cursor or 0, opts, busyloop


def _job_state(value: bytes) -> int:
    state = STATE_BY_NAME.get(value.lower())
    if state is None:
        raise err("Invalid job state name")
    return state


def _reply_all(value: bytes) -> bool:
    kind = value.lower()
    if kind not in (b"all", b"id"):
        raise err("Invalid REPLY type, try ID or ALL")
    return kind == b"all"


_JSCAN_OPTS: dict[bytes, Callable[[bytes], Any]] = {
    b"count": int_arg, b"queue": bytes, b"state": _job_state, b"reply": _reply_all,
}


@command("jscan", -1, "readonly")
def cmd_jscan(c: Caller, argv: list[bytes]) -> None:
    cursor, opts, busyloop = scan_args(argv, _JSCAN_OPTS)
    count = 100
    queue = None
    states: set[int] = set()
    reply_all = False
    for opt, value in opts:
        if opt == b"count":
            count = value
        elif opt == b"queue":
            queue = value
        elif opt == b"state":
            states.add(value)
        else:
            reply_all = value
    if count < 1:
        count = 1

    def keep(job: Job) -> bool:
        return (not job.flags & F_DUMMY and (queue is None or job.queue == queue)
                and (not states or job.state in states))

    node = c.node
    nxt, jobs = scan_jobs(node, cursor, count, keep, busyloop)
    if reply_all:
        items: list[Any] = [show_fields(node, job) for job in jobs]
    else:
        items = [Status(job.id.decode()) for job in jobs]
    c.out.append(encode([str(nxt).encode(), items], c.proto))


def scan_jobs(node: Node, cursor: int, count: int, keep: Callable[[Job], bool],
              busyloop: bool) -> tuple[int, list[Job]]:
    """JSCAN's walk: the registry's shards (cursors below their count), then the jobs on
    disk (disque.overflow; cursor = shard count + the store's row to go on after)."""
    shards = node.jobs.shard_count()
    jobs: list[Job] = []
    nxt = cursor
    if cursor < shards:
        nxt, jobs = node.jobs.scan(cursor, count, keep, busyloop)
        if nxt == 0 and node.on_disk:
            nxt = shards  # the registry is done: the disk next
    while nxt >= shards and (busyloop or len(jobs) < count):
        after, found = node.overflow.scan(nxt - shards, count)
        jobs += [job for job in found if keep(job)]
        nxt = shards + after if after else 0
        if not busyloop:
            break
    return nxt, jobs
