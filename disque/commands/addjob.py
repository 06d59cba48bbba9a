"""ADDJOB and ADDJOBS: option parsing, the dead-letter policy of a new job, and the
clients waiting for synchronous replication.

A synchronous ADDJOB parks its client on a `BlockedAddJob` until enough nodes confirmed a
copy (GOTJOB) or the timeout; ADDJOBS, and ADDJOBs pipelined behind a blocked one
(`BlockedAddJob.absorb`), answer together through an `AddJobGroup`, in order, once the last
of them is decided. A reply that confirms a job the AOF logged waits for that write.
Validation order and texts follow the checklist (section 4).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from disque.cluster.replication import ReplWaiter
from disque.commands import Caller, command, parse_int, timeout_arg
from disque.jobs.deadletter import DeadLetter
from disque.jobs.job import MAX_JOB_SECONDS, WAIT_REPL
from disque.protocol.errors import CommandError, aof_write_failed, err, syntax
from disque.protocol.reply import array_len

if TYPE_CHECKING:
    from disque.node import Node
    from disque.state import Persistence


# ---------------------------------------------------------------------------- ADDJOB
def opt_value(argv: list[bytes], i: int) -> bytes:
    if i + 1 >= len(argv):
        raise syntax()
    return argv[i + 1]


def ranged(value: bytes, lo: int, hi: int | None, message: str) -> int:
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
            o.replicate = ranged(value, 1, 65535, "REPLICATE must be between 1 and 65535")
        elif opt == b"ttl":
            o.ttl = ranged(value, 1, None, "TTL must be a number > 0")
            if o.ttl > MAX_JOB_SECONDS:
                raise err(f"TTL must be at most {MAX_JOB_SECONDS} seconds (10 years)")
        elif opt == b"retry":
            o.retry = ranged(value, 0, None, "RETRY time must be a non negative number")
            if o.retry > MAX_JOB_SECONDS:
                raise err(f"RETRY time must be at most {MAX_JOB_SECONDS} seconds (10 years)")
        elif opt == b"delay":
            o.delay = ranged(value, 0, None, "DELAY time must be a non negative number")
        elif opt == b"maxlen":
            o.maxlen = ranged(value, 1, None, "MAXLEN must be a positive number")
        elif opt == b"dedup" and not batch:
            if not value or len(value) > 512:
                raise err("DEDUP key must be 1 to 512 bytes")
            o.dedup = value
        elif opt == b"maxdeliveries":
            o.max_deliveries = ranged(value, 0, 65535, "MAXDELIVERIES must be between 0 and "
                                                        "65535")
        elif opt == b"maxnacks":
            o.max_nacks = ranged(value, 0, 65535, "MAXNACKS must be between 0 and 65535")
        elif opt == b"deadletter":
            if not value:
                raise err("DEADLETTER queue name must not be empty")
            o.deadletter = value
        elif opt == b"deadttl":
            o.deadttl = ranged(value, 0, MAX_JOB_SECONDS, "DEADTTL must be a number of "
                                f"seconds from 0 to {MAX_JOB_SECONDS}")
        elif opt == b"backoff":
            o.backoff = ranged(value, 0, MAX_JOB_SECONDS, "BACKOFF must be a number of "
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
        if (len(q) if q is not None else 0) + unqueued >= o.maxlen:
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
    replicating = node.replication.replicating
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
        self.node: Node = client.node
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
            _unpark(c)
            mark = len(c.out)
            dispatch.execute(c, argv)
            waiter = c.waiter
            if waiter is not None:
                assert isinstance(waiter, BlockedAddJob)  # (an ADDJOB parks nothing else)
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


def _unpark(c: Caller) -> None:
    """`c.waiter = None`, out of line: written inline before `dispatch.execute(c, ...)`,
    mypy narrows `c.waiter` to None past the call (which may park a waiter there), takes the
    branch that reads the waiter back for dead code, and a compiled build checks the value
    against None (found compiling this module: TypeError on pipelined sync ADDJOBs)."""
    c.waiter = None


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
        self.persist: Persistence | None = None

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

    def seal(self, c: Caller, persist: Persistence | None) -> None:
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
