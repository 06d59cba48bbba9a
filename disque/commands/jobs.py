"""Job commands: ADDJOB, GETJOB, ACKJOB, FASTACK, DELJOB, ENQUEUE, NACK, DEQUEUE, WORKING,
SHOW, JSCAN, LOADJOB. Validation order and texts follow the checklist (section 4)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from disque.cluster.jobs import ReplWaiter
from disque.commands import command, int_arg, parse_int, timeout_arg
from disque.jobs.ids import is_valid_id
from disque.jobs.job import (
    ACKED,
    F_DUMMY,
    MAX_JOB_SECONDS,
    STATE_BY_NAME,
    STATE_NAMES,
    WAIT_REPL,
    Job,
)
from disque.node import Waiter
from disque.protocol.errors import CommandError, badid, err, syntax
from disque.protocol.reply import Status, array_len, encode, integer


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
        n = len(body)
        return b"".join((b"*1\r\n", _QUEUE_HEADS.get(q) or _queue_head(q), job.id,
                         _BODY_HEADS[n] if n < 4096 else b"\r\n$%d\r\n" % n, body,
                         b"\r\n"))
    parts = [array_len(len(jobs))]
    for job in jobs:
        parts.append(job_entry(job, withcounters))
    return b"".join(parts)


# ---------------------------------------------------------------------------- ADDJOB
def _opt_value(argv: list[bytes], i: int) -> bytes:
    if i + 1 >= len(argv):
        raise syntax()
    return argv[i + 1]


def _ranged(value: bytes, lo: int, hi: int | None, message: str) -> int:
    try:
        v = parse_int(value)
    except ValueError:
        raise err(message) from None
    if v < lo or (hi is not None and v > hi):
        raise err(message)
    return v


@command("addjob", -4, "write denyoom fast")
def cmd_addjob(c: Any, argv: list[bytes]) -> None:
    replicate = ttl = retry = maxlen = dedup = None
    delay = 0
    async_ = False
    n = len(argv)
    i = 4
    while i < n:
        opt = argv[i].lower()
        if opt == b"async":
            async_ = True
            i += 1
            continue
        if opt == b"replicate":
            replicate = _ranged(_opt_value(argv, i), 1, 65535,
                                "REPLICATE must be between 1 and 65535")
        elif opt == b"ttl":
            ttl = _ranged(_opt_value(argv, i), 1, None, "TTL must be a number > 0")
            if ttl > MAX_JOB_SECONDS:
                raise err(f"TTL must be at most {MAX_JOB_SECONDS} seconds (10 years)")
        elif opt == b"retry":
            retry = _ranged(_opt_value(argv, i), 0, None,
                            "RETRY time must be a non negative number")
            if retry > MAX_JOB_SECONDS:
                raise err(f"RETRY time must be at most {MAX_JOB_SECONDS} seconds (10 years)")
        elif opt == b"delay":
            delay = _ranged(_opt_value(argv, i), 0, None,
                            "DELAY time must be a non negative number")
        elif opt == b"maxlen":
            maxlen = _ranged(_opt_value(argv, i), 1, None, "MAXLEN must be a positive number")
        elif opt == b"dedup":
            dedup = _opt_value(argv, i)
            if not dedup or len(dedup) > 512:
                raise err("DEDUP key must be 1 to 512 bytes")
        else:
            raise syntax()
        i += 2
    timeout = 0 if argv[3] == b"0" else timeout_arg(argv[3])
    node = c.node
    if dedup is not None:
        known = node.dedup_lookup(argv[1], dedup)
        if known is not None:  # a retry of an ADDJOB this node already took
            waiter = BlockedAddJob(c, argv[1], dedup)
            if node.join_replication(known, waiter):  # still waiting for its copies
                c.block(waiter)
                return
            c.out.append(b"+%b\r\n" % known)
            return
    job = node.add_job(argv[1], argv[2], timeout, replicate, ttl, retry, delay, maxlen, async_)
    if dedup is not None:
        node.dedup_remember(argv[1], dedup, job)
    if job.state == WAIT_REPL:
        waiter = BlockedAddJob(c, argv[1], dedup)
        node.wait_replication(job, waiter, timeout)
        c.block(waiter)
        return
    c.out.append(b"+%b\r\n" % job.id)


class BlockedAddJob(ReplWaiter):
    """A synchronous ADDJOB waiting for its copies (GOTJOB from enough nodes)."""

    def __init__(self, client: Any, queue: bytes, dedup: bytes | None) -> None:
        self.client = client
        self.queue = queue
        self.dedup = dedup

    def on_added(self, job_id: bytes) -> None:
        self.client.unblocked(b"+%b\r\n" % job_id)

    def on_error(self, error: CommandError) -> None:
        if self.dedup is not None and self.node is not None:
            self.node.dedup_forget(self.queue, self.dedup, self.job_id)
        self.client.unblocked(error.resp())

    def cancel(self) -> None:
        node = self.node
        if node is not None and node.cancel_replication(self.job_id, self) \
                and self.dedup is not None:
            node.dedup_forget(self.queue, self.dedup, self.job_id)


# ---------------------------------------------------------------------------- GETJOB
class BlockedGetJob(Waiter):
    """A GETJOB client waiting for a job: the node calls back, we answer the client."""

    __slots__ = ("client",)

    def __init__(self, client: Any, queues: list[bytes], count: int,
                 withcounters: bool) -> None:
        super().__init__(queues, count, withcounters)
        self.client = client

    def on_jobs(self, jobs: list[Job]) -> None:
        self.client.unblocked(jobs_reply(jobs, self.withcounters))

    def on_timeout(self) -> None:
        self.client.unblocked(self.client.null_array)

    def on_error(self, error: CommandError) -> None:
        self.client.unblocked(error.resp())


@command("getjob", -2, "write fast")
def cmd_getjob(c: Any, argv: list[bytes]) -> None:
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
            timeout = timeout_arg(_opt_value(argv, i))
            i += 1
        elif opt == b"count":
            count = _ranged(_opt_value(argv, i), 1, None,
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
def cmd_ackjob(c: Any, argv: list[bytes]) -> None:
    c.out.append(integer(c.node.ackjob(job_ids(argv))))


@command("fastack", -1, "write fast")
def cmd_fastack(c: Any, argv: list[bytes]) -> None:
    c.out.append(integer(c.node.fastack(job_ids(argv))))


@command("deljob", -1, "write fast")
def cmd_deljob(c: Any, argv: list[bytes]) -> None:
    c.out.append(integer(c.node.deljob(job_ids(argv))))


@command("enqueue", -1, "write denyoom fast")
def cmd_enqueue(c: Any, argv: list[bytes]) -> None:
    c.out.append(integer(c.node.enqueue_jobs(job_ids(argv), nack=False)))


@command("nack", -1, "write denyoom fast")
def cmd_nack(c: Any, argv: list[bytes]) -> None:
    c.out.append(integer(c.node.enqueue_jobs(job_ids(argv), nack=True)))


@command("dequeue", -1, "write fast")
def cmd_dequeue(c: Any, argv: list[bytes]) -> None:
    c.out.append(integer(c.node.dequeue_jobs(job_ids(argv))))


@command("working", 2, "write fast")
def cmd_working(c: Any, argv: list[bytes]) -> None:
    job_ids(argv)
    c.out.append(integer(c.node.working(argv[1])))


@command("loadjob", 2, "write")
def cmd_loadjob(c: Any, argv: list[bytes]) -> None:
    raise err("LOADJOB is a special command only processed from AOF")


# ---------------------------------------------------------------------------- SHOW / JSCAN
def show_fields(node: Any, job: Job) -> list[Any]:
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
    ]


@command("show", 2, "readonly fast")
def cmd_show(c: Any, argv: list[bytes]) -> None:
    job_ids(argv)
    job = c.node.lookup_job(argv[1])
    if job is None:
        c.out.append(c.null_bulk)
        return
    c.out.append(encode(show_fields(c.node, job), c.proto))


_CURSOR_LIMIT = 1 << 64


def parse_cursor(token: bytes, cursor: int | None) -> int:
    """A token that is no option is the cursor (unsigned 64-bit decimal), once."""
    if cursor is not None:
        raise syntax()
    # (a length check first: int() refuses more than 4300 digits with a ValueError)
    if not token.isdigit() or len(token) > 20 or int(token) >= _CURSOR_LIMIT:
        raise err("invalid cursor or option name")
    return int(token)


def scan_args(argv: list[bytes], valued: dict[bytes, Callable[[bytes], Any]]
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
def cmd_jscan(c: Any, argv: list[bytes]) -> None:
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
    nxt, jobs = node.jobs.scan(cursor, count, keep, busyloop)
    if reply_all:
        items: list[Any] = [show_fields(node, job) for job in jobs]
    else:
        items = [Status(job.id.decode()) for job in jobs]
    c.out.append(encode([str(nxt).encode(), items], c.proto))
