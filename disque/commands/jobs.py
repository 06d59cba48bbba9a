"""Job commands: ADDJOB, GETJOB, ACKJOB, FASTACK, DELJOB, ENQUEUE, NACK, DEQUEUE, WORKING,
SHOW, JSCAN, LOADJOB. Validation order and texts follow the checklist (section 4)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from disque.cluster.jobs import ReplWaiter
from disque.commands import Caller, command, int_arg, parse_int, timeout_arg
from disque.jobs.deadletter import REASON_NAMES, DeadLetter
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
from disque.protocol.errors import CommandError, aof_write_failed, badid, err, syntax
from disque.protocol.reply import Status, array_len, encode, integer

if TYPE_CHECKING:
    from disque.aof.writer import AppendOnlyFile
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


class AddJobOptions:
    """ADDJOB's options after the timeout (ADDJOBS: the same, before JOBS)."""

    __slots__ = ("replicate", "ttl", "retry", "delay", "maxlen", "dedup", "async_",
                 "with_dedup", "max_deliveries", "max_nacks", "deadletter", "deadttl", "backoff",
                 "dl")

    def __init__(self) -> None:
        self.replicate: int | None = None
        self.ttl: int | None = None
        self.retry: int | None = None
        self.delay = 0
        self.maxlen: int | None = None
        self.dedup: bytes | None = None
        self.async_ = False
        self.with_dedup = False  # ADDJOBS WITHDEDUP: a DEDUP key before every body
        # dead-letter policy (None: the node's default); `dl`: the policy built from them
        # for the batch's queue (ADDJOBS: one shared by all its jobs)
        self.max_deliveries: int | None = None
        self.max_nacks: int | None = None
        self.deadletter: bytes | None = None
        self.deadttl = 0
        self.backoff = 0  # s: the longest NACK backoff (0: none)
        self.dl: DeadLetter | None = None


def parse_addjob_options(argv: list[bytes], i: int, end: int, batch: bool = False
                         ) -> AddJobOptions:
    """Options argv[i:end], in the checklist's order of checks and texts."""
    o = AddJobOptions()
    while i < end:
        opt = argv[i].lower()
        if opt == b"async":
            o.async_ = True
            i += 1
            continue
        if batch and opt == b"withdedup":
            o.with_dedup = True
            i += 1
            continue
        if i + 1 >= end:
            raise syntax()
        value = argv[i + 1]
        if opt == b"replicate":
            o.replicate = _ranged(value, 1, 65535, "REPLICATE must be between 1 and 65535")
        elif opt == b"ttl":
            o.ttl = _ranged(value, 1, None, "TTL must be a number > 0")
            if o.ttl > MAX_JOB_SECONDS:
                raise err(f"TTL must be at most {MAX_JOB_SECONDS} seconds (10 years)")
        elif opt == b"retry":
            o.retry = _ranged(value, 0, None, "RETRY time must be a non negative number")
            if o.retry > MAX_JOB_SECONDS:
                raise err(f"RETRY time must be at most {MAX_JOB_SECONDS} seconds (10 years)")
        elif opt == b"delay":
            o.delay = _ranged(value, 0, None, "DELAY time must be a non negative number")
        elif opt == b"maxlen":
            o.maxlen = _ranged(value, 1, None, "MAXLEN must be a positive number")
        elif opt == b"dedup" and not batch:
            if not value or len(value) > 512:
                raise err("DEDUP key must be 1 to 512 bytes")
            o.dedup = value
        elif opt == b"maxdeliveries":
            o.max_deliveries = _ranged(value, 0, 65535, "MAXDELIVERIES must be between 0 and "
                                                        "65535")
        elif opt == b"maxnacks":
            o.max_nacks = _ranged(value, 0, 65535, "MAXNACKS must be between 0 and 65535")
        elif opt == b"deadletter":
            if not value:
                raise err("DEADLETTER queue name must not be empty")
            o.deadletter = value
        elif opt == b"deadttl":
            o.deadttl = _ranged(value, 0, MAX_JOB_SECONDS, "DEADTTL must be a number of "
                                f"seconds from 0 to {MAX_JOB_SECONDS}")
        elif opt == b"backoff":
            o.backoff = _ranged(value, 0, MAX_JOB_SECONDS, "BACKOFF must be a number of "
                                f"seconds from 0 to {MAX_JOB_SECONDS}")
        else:
            raise syntax()
        i += 2
    return o


def add_one_job(c: Caller, queue: bytes, body: bytes, timeout: int, o: AddJobOptions,
                dedup: bytes | None, unqueued: int = 0) -> bytes | BlockedAddJob:
    """One ADDJOB: its reply, or the waiter of a synchronous replication in flight (the
    caller parks the client on it). CommandError for a refused job. `unqueued`: jobs of
    the same ADDJOBS still waiting for their copies, which MAXLEN counts as queued."""
    node = c.node
    if dedup is not None:
        known = node.dedup_lookup(queue, dedup)
        if known is not None:  # a retry of an ADDJOB this node already took
            waiter = BlockedAddJob(c, queue, dedup)
            if node.join_replication(known, waiter):  # still waiting for its copies
                return waiter
            return b"+%b\r\n" % known
    if unqueued and o.maxlen is not None:
        q = node.lookup_queue(queue)
        if (len(q.jobs) if q is not None else 0) + unqueued >= o.maxlen:
            raise CommandError("MAXLEN", "Queue is already longer than the specified "
                                         "MAXLEN count")
    dl = o.dl
    if dl is None and (node.deadletter_defaults_on or o.max_deliveries or o.max_nacks
                       or o.deadletter is not None or o.backoff or o.deadttl):
        dl = deadletter_policy(node, queue, o)
    job = node.add_job(queue, body, timeout, o.replicate, o.ttl, o.retry, o.delay, o.maxlen,
                       o.async_, dl)
    if dedup is not None:
        node.dedup_remember(queue, dedup, job)
    if job.state == WAIT_REPL:
        waiter = BlockedAddJob(c, queue, dedup)
        node.wait_replication(job, waiter, timeout)
        return waiter
    return b"+%b\r\n" % job.id


def deadletter_policy(node: Node, queue: bytes, o: AddJobOptions) -> DeadLetter | None:
    """The job's dead-letter policy from its options and the node's defaults
    (default-max-deliveries, default-max-nacks, deadletter-queue); None without a limit
    and without DEADLETTER."""
    md = node.default_max_deliveries if o.max_deliveries is None else o.max_deliveries
    mn = node.default_max_nacks if o.max_nacks is None else o.max_nacks
    if not md and not mn and o.deadletter is None and not o.backoff and not o.deadttl:
        return None
    dlq = node.deadletter_queue if o.deadletter is None else o.deadletter
    if dlq == queue:
        raise err("DEADLETTER queue must differ from the job's queue")
    return DeadLetter(md, mn, dlq, queue, o.deadttl, backoff=o.backoff)


_NO_OPTIONS = AddJobOptions()  # shared, never modified: plain `ADDJOB q body timeout`


@command("addjob", -4, "write denyoom fast", logs=True)
def cmd_addjob(c: Caller, argv: list[bytes]) -> None:
    o = _NO_OPTIONS if len(argv) == 4 else parse_addjob_options(argv, 4, len(argv))
    timeout = 0 if argv[3] == b"0" else timeout_arg(argv[3])
    res = add_one_job(c, argv[1], argv[2], timeout, o, o.dedup)
    # (`type(res) is bytes` costs no call, isinstance does; mypy narrows only the first
    # branch of it)
    if type(res) is bytes:
        c.out.append(res)
    else:
        c.block(res)  # type: ignore[arg-type]


@command("addjobs", -5, "write denyoom", logs=True)
def cmd_addjobs(c: Caller, argv: list[bytes]) -> None:
    """ADDJOBS queue ms-timeout [options] [WITHDEDUP] JOBS body [body ...]: many jobs with
    the same options, replicated together; one reply per job, in order (its ID, or its
    error). With WITHDEDUP the arguments after JOBS are `dedup-key body` pairs."""
    n = len(argv)
    jobs_at = 3
    while jobs_at < n and argv[jobs_at].lower() != b"jobs":
        jobs_at += 1  # (an option value equal to JOBS is not supported: none can be)
    if jobs_at >= n - 1:
        raise syntax()
    o = parse_addjob_options(argv, 3, jobs_at, batch=True)
    timeout = 0 if argv[2] == b"0" else timeout_arg(argv[2])
    items = argv[jobs_at + 1:]
    if o.with_dedup:
        if len(items) % 2:
            raise err("WITHDEDUP needs a DEDUP key before every body")
        for key in items[0::2]:
            if not key or len(key) > 512:
                raise err("DEDUP key must be 1 to 512 bytes")
    queue = argv[1]
    node = c.node
    # contradicting options are an error of the command, not of each job
    node.job_options(o.replicate, o.ttl, o.retry, o.delay)
    o.dl = deadletter_policy(node, queue, o)  # one policy object shared by the batch
    group = AddJobGroup(c, array_len(len(items) // 2 if o.with_dedup else len(items)))
    replicating = node.replicating
    persist = node.persist
    unqueued = 0  # new jobs of this batch waiting for their copies (MAXLEN counts them)
    for k in range(0, len(items), 2 if o.with_dedup else 1):
        before = len(replicating)
        logged = persist.appended if persist is not None else 0
        try:
            if o.with_dedup:
                res = add_one_job(c, queue, items[k + 1], timeout, o, items[k], unqueued)
            else:
                res = add_one_job(c, queue, items[k], timeout, o, None, unqueued)
        except CommandError as exc:
            res = exc.resp()
        if type(res) is bytes:
            group.add_reply(res, persist is not None and persist.appended != logged)
        else:
            group.add_waiter(res)  # type: ignore[arg-type]
            if len(replicating) > before:
                unqueued += 1
    group.seal(c, persist)


class BlockedAddJob(ReplWaiter):
    """A synchronous ADDJOB waiting for its copies (GOTJOB from enough nodes). Its reply
    goes to the client, or to its slot of an `AddJobGroup`."""

    def __init__(self, client: Caller, queue: bytes, dedup: bytes | None) -> None:
        self.client: Caller | None = client
        self.queue = queue
        self.dedup = dedup
        self.group: AddJobGroup | None = None
        self.slot = 0

    def answer(self, reply: bytes) -> None:
        group = self.group
        if group is not None:
            group.fill(self.slot, reply)
        elif self.client is not None:
            self.client.unblocked(reply)

    def on_added(self, job_id: bytes) -> None:
        persist = self.node.persist if self.node is not None else None
        if persist is not None and persist.pending():
            persist.confirm(self.written)  # its LOADJOB is not in the AOF yet
            return
        self.answer(b"+%b\r\n" % job_id)

    def written(self, ok: bool) -> None:
        """The job's LOADJOB reached the AOF, or could not (the job was then cancelled,
        see Node.cancel_adds): only now is the client told."""
        if ok:
            self.answer(b"+%b\r\n" % self.job_id)
        else:
            persist = self.node.persist if self.node is not None else None
            error = persist.last_write_error if persist is not None else None
            self.on_error(aof_write_failed(error or "unknown error"))

    def on_error(self, error: CommandError) -> None:
        if self.dedup is not None and self.node is not None:
            self.node.dedup_forget(self.queue, self.dedup, self.job_id)
        self.answer(error.resp())

    def cancel(self) -> None:
        node = self.node
        if node is not None and node.cancel_replication(self.job_id, self) \
                and self.dedup is not None:
            node.dedup_forget(self.queue, self.dedup, self.job_id)

    def absorb(self, c: Caller, reqs: list[list[bytes]]) -> list[list[bytes]]:
        """The client pipelined more ADDJOBs behind this blocked one: start them now, so
        that their copies travel in the same bus frames, and answer them all together, in
        order, once every one is answered. What they reply is what one-by-one execution
        would reply, with one exception, excluded here: MAXLEN counts queued jobs, and a
        job waiting for its copies is not queued yet, so an ADDJOB with MAXLEN (and what
        follows it) still waits its turn. Returns the requests left for later."""
        dispatch = c.server.dispatch
        lookup = dispatch.lookup
        group: AddJobGroup | None = None
        marks = c.aof_marks
        k = 0
        for argv in reqs:
            cmd = lookup.get(argv[0]) or lookup.get(argv[0].lower())
            if cmd is None or cmd.handler is not cmd_addjob or _has_maxlen(argv):
                break
            if group is None:
                group = AddJobGroup(c, b"")
                group.add_waiter(self)
            c.waiter = None
            mark = len(c.out)
            dispatch.execute(c, argv)
            waiter = c.waiter
            if waiter is not None:
                group.add_waiter(waiter)
            else:
                # its job's LOADJOB, if it logged one, is confirmed with the group's reply
                logged = bool(marks) and marks[-1][0] >= mark
                group.add_reply(b"".join(c.out[mark:]), logged)
                del c.out[mark:]
                c.forget_marks(mark)
            k += 1
        if group is not None:
            c.waiter = None
            group.seal(c, c.node.persist)
        return reqs[k:]


def _has_maxlen(argv: list[bytes]) -> bool:
    return any(len(a) == 6 and a.lower() == b"maxlen" for a in argv[4:])


class AddJobGroup:
    """The replies of several synchronous ADDJOBs of one client (ADDJOBS, or pipelined
    ADDJOBs), in order: the client is answered once, when the last one is decided."""

    __slots__ = ("client", "head", "slots", "waiters", "waiting", "logged", "persist")

    def __init__(self, client: Caller, head: bytes) -> None:
        self.client: Caller | None = client
        self.head = head  # ADDJOBS: the array header
        self.slots: list[bytes | None] = []
        self.waiters: list[BlockedAddJob] = []
        self.waiting = 0
        self.logged: list[int] = []  # slots answered at once whose job the AOF logged
        self.persist: AppendOnlyFile | None = None

    def add_reply(self, reply: bytes, logged: bool = False) -> None:
        if logged:
            self.logged.append(len(self.slots))
        self.slots.append(reply)

    def add_waiter(self, waiter: BlockedAddJob) -> None:
        waiter.group = self
        waiter.slot = len(self.slots)
        self.slots.append(None)
        self.waiters.append(waiter)
        self.waiting += 1

    def seal(self, c: Caller, persist: AppendOnlyFile | None) -> None:
        """Every job of the group is in: answer now (the dispatcher holds the reply until
        the AOF has what it logged), or park the client until the last copy is confirmed,
        and the AOF write of the jobs answered at once, if any."""
        if self.waiting:
            if self.logged and persist is not None and persist.pending():
                self.persist = persist
                self.waiting += 1
                persist.confirm(self.written)
            c.block(self)
        else:
            c.out.append(self.head + b"".join(self.slots))  # type: ignore[arg-type]

    def written(self, ok: bool) -> None:
        """The AOF write of the `logged` slots' jobs is done; failed: they were cancelled
        (Node.cancel_adds) and answer -MISCONF."""
        if not ok:
            error = self.persist.last_write_error if self.persist is not None else None
            refused = aof_write_failed(error or "unknown error").resp()
            for slot in self.logged:
                self.slots[slot] = refused
        self.persist = None
        self.done_one()

    def fill(self, slot: int, reply: bytes) -> None:
        if self.slots[slot] is not None:
            return
        self.slots[slot] = reply
        self.done_one()

    def done_one(self) -> None:
        self.waiting -= 1
        if not self.waiting:
            self.release()
            if self.client is not None:
                self.client.unblocked(self.head + b"".join(self.slots))  # type: ignore[arg-type]

    def release(self) -> None:
        """Break the group <-> waiter cycles (the collector only runs on young objects,
        see Cron.gc_tick)."""
        for w in self.waiters:
            w.group = None
        self.waiters = []

    def cancel(self) -> None:
        """The client went away: every job still waiting for its copies is deleted."""
        for w in self.waiters:
            if self.slots[w.slot] is None:
                w.cancel()
        self.release()


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
def cmd_ackjob(c: Caller, argv: list[bytes]) -> None:
    node = c.node
    c.out.append(integer(node.ackjob(job_ids(argv))))
    if node.out:
        c.server.ack_sent = True  # the SETACKs go before the reply (Client.process)


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
                delay = _ranged(_opt_value(argv, i), 0, MAX_JOB_SECONDS,
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
            count = _ranged(_opt_value(argv, i), 1, None, "COUNT must be a positive number")
            i += 2
        elif opt == b"rate":
            rate = _ranged(_opt_value(argv, i), 1, None, "RATE must be a positive number")
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


_CURSOR_LIMIT = 1 << 64


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
    nxt, jobs = node.jobs.scan(cursor, count, keep, busyloop)
    if reply_all:
        items: list[Any] = [show_fields(node, job) for job in jobs]
    else:
        items = [Status(job.id.decode()) for job in jobs]
    c.out.append(encode([str(nxt).encode(), items], c.proto))
