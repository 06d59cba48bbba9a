"""The Job record and its states."""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from disque.jobs.deadletter import DeadLetter

WAIT_REPL: Final = 0
ACTIVE: Final = 1
QUEUED: Final = 2
ACKED: Final = 3
STATE_NAMES: Final = (b"wait-repl", b"active", b"queued", b"acked")
STATE_BY_NAME = {name: i for i, name in enumerate(STATE_NAMES)}

# The longest TTL and RETRY a job may have, in seconds (10 years). The original took any
# 64-bit value and wrapped it into the 32-bit fields of its job layout (an absolute etime in
# seconds, the retry); here such a job broke the bus encoding (a sync ADDJOB then never
# returned) and came back from the AOF with another expiry. ADDJOB refuses more.
MAX_JOB_SECONDS: Final = 10 * 365 * 86400

# The measured Python cost of a queued job besides its body (object, ID, registry and queue
# slots), for INFO used_memory and the maxmemory rules (see disque.node).
JOB_MEMORY: Final = 480

# flags
F_BCAST_QUEUED: Final = 1  # queued at least once on this node: a later queueing counts a delivery
F_BCAST_WILLQUEUE: Final = 2  # WILLQUEUE already sent for the current requeue cycle
F_DELIVERED: Final = 4  # handed to a consumer at least once
F_DUMMY: Final = 8  # a dummy ACK: an ACKJOB for an ID this node never held
F_NACK_DELAYED: Final = 16  # NACK DELAY: the next timer requeue is that NACK's, not a new delivery
F_RELOADED: Final = 32  # read from the AOF: no requeue before another holder confirms it is alive
F_RESTORED: Final = 64  # this object came from an AOF record (not persisted; see jobs.restore)


class Job:
    """One job as this node knows it. `delivered` / `confirmed` are tuples of node IDs."""

    __slots__ = ("id", "queue", "body", "state", "flags", "repl", "ctime", "etime", "delay",
                 "retry", "nacks", "deliveries", "delivered", "confirmed", "qtime", "awake",
                 "gc_retry", "dl")

    def __init__(self, job_id: bytes, queue: bytes | None, body: bytes | None, repl: int,
                 ctime: int, etime: int, delay: int, retry: int,
                 delivered: tuple[bytes, ...]) -> None:
        self.id = job_id
        self.queue = queue
        self.body = body
        self.state = WAIT_REPL
        self.flags = 0
        self.repl = repl
        self.ctime = ctime
        self.etime = etime  # ms: expiry
        self.delay = delay  # s
        self.retry = retry  # s
        self.nacks = 0
        self.deliveries = 0
        self.delivered = delivered
        self.confirmed: tuple[bytes, ...] = ()
        self.qtime = 0  # ms: next (re)queue on this node, 0 = never
        self.awake = 0  # ms: when the timer wheel looks at the job next, 0 = not scheduled
        self.gc_retry = 0
        self.dl: DeadLetter | None = None  # the failure policy, if the job has one

    def __repr__(self) -> str:
        return f"<Job {self.id.decode()} {STATE_NAMES[self.state].decode()}>"
