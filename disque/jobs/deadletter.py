"""A job's failure policy and dead-letter state: the part of a job that says where it goes
when it keeps failing, whether it is there now, and how long a NACK puts it off (BACKOFF).

A job added with MAXDELIVERIES, MAXNACKS, DEADLETTER or BACKOFF (or under the node-wide
defaults) carries one `DeadLetter`; every other job carries None, so the common job pays one
slot.

The value is immutable: jobs added together share one, and a change of state (dead-lettered,
redriven) makes a new one with `moved`. Its state is the `epoch`, a counter every holder of
the job compares: even = alive in its source queue, odd = dead in its dead-letter queue. A
node only ever moves a job to the next epoch, and a holder that hears of a higher epoch than
its own adopts it, so the holders of a job agree once they have talked, whatever the order
their messages arrived in (see disque.cluster.deadletters).
"""

from __future__ import annotations

import math
from typing import Any

REASON_NONE = 0
REASON_MAX_DELIVERIES = 1
REASON_MAX_NACKS = 2
REASON_EXPIRED = 3  # its TTL ended while it was alive, and it has a DEADTTL
REASON_NAMES = (None, b"max-deliveries", b"max-nacks", b"expired")
MAX_EPOCH = (1 << 32) - 1
MAX_BACKOFF = 315360000  # s (10 years, as every job time)


class DeadLetter:
    __slots__ = ("max_deliveries", "max_nacks", "queue", "source", "deadttl", "epoch",
                 "reason", "dead_at", "backoff")

    def __init__(self, max_deliveries: int, max_nacks: int, queue: bytes, source: bytes,
                 deadttl: int = 0, epoch: int = 0, reason: int = REASON_NONE,
                 dead_at: int = 0, backoff: int = 0) -> None:
        self.max_deliveries = max_deliveries  # 0: no limit
        self.max_nacks = max_nacks  # 0: no limit
        self.queue = queue  # the dead-letter queue
        self.source = source  # the queue the job was added to
        self.deadttl = deadttl  # s: a dead job lives at least this long (0: its TTL only)
        self.epoch = epoch
        self.reason = reason  # why it is dead (REASON_*), when dead
        self.dead_at = dead_at  # unix ms when this node learned it is dead
        self.backoff = backoff  # s: the longest NACK backoff (0: a NACK requeues at once)

    @property
    def dead(self) -> bool:
        return bool(self.epoch & 1)

    def moved(self, epoch: int, reason: int, now: int) -> DeadLetter:
        """This policy in state `epoch` (odd: dead for `reason` since `now`)."""
        if epoch & 1:
            return DeadLetter(self.max_deliveries, self.max_nacks, self.queue, self.source,
                              self.deadttl, epoch, reason, now, self.backoff)
        return DeadLetter(self.max_deliveries, self.max_nacks, self.queue, self.source,
                          self.deadttl, epoch, backoff=self.backoff)

    def dead_on_expiry(self) -> bool:
        """Whether the job goes to its dead-letter queue when its TTL ends while it is still
        alive (queued, or delivered and not acknowledged): with a DEADTTL, and not dead yet
        (a dead job expires)."""
        return bool(self.deadttl) and not self.epoch & 1

    def current_queue(self) -> bytes:
        return self.queue if self.epoch & 1 else self.source

    def over_limit(self, nacks: int, deliveries: int, nack: bool) -> int:
        """The reason the job must not be queued again, or REASON_NONE. `nacks` and
        `deliveries` are its counters before this requeue; the job has been delivered
        1 + nacks + deliveries times (best effort, as the counters are)."""
        if self.epoch & 1:
            return REASON_NONE  # already dead: it is requeued into the dead-letter queue
        if nack and self.max_nacks and nacks + 1 >= self.max_nacks:
            return REASON_MAX_NACKS
        if self.max_deliveries and 1 + nacks + deliveries >= self.max_deliveries:
            return REASON_MAX_DELIVERIES
        return REASON_NONE

    def backoff_delay(self, deliveries: int, random: float) -> int:
        """Seconds a NACK without DELAY puts the job off after its `deliveries`-th delivery
        failed: min(BACKOFF, 2^(deliveries-1)) scaled by 0.5 + random/2 (`random` in
        [0, 1): the jitter that keeps jobs failing together from coming back together),
        rounded up; 0 without BACKOFF."""
        if not self.backoff:
            return 0
        base = min(self.backoff, 1 << min(max(deliveries, 1) - 1, 40))
        return max(1, math.ceil(base * (0.5 + random / 2)))

    def to_wire(self) -> list[Any]:
        wire = [self.max_deliveries, self.max_nacks, self.queue, self.source, self.deadttl,
                self.epoch, self.reason, self.dead_at]
        if self.backoff:
            wire.append(self.backoff)  # 9th field only when set: older records have 8
        return wire

    @classmethod
    def from_wire(cls, v: Any) -> DeadLetter:
        """From `to_wire`'s list; ValueError if it is not one."""
        if type(v) is not list or len(v) not in (8, 9):
            raise ValueError("bad dead-letter record")
        backoff = v[8] if len(v) == 9 else 0
        if type(backoff) is not int or not 0 <= backoff <= MAX_BACKOFF:
            raise ValueError("bad dead-letter backoff")
        md, mn, queue, source, deadttl, epoch, reason, dead_at = v[:8]
        if type(queue) is not bytes or type(source) is not bytes or not queue or not source:
            raise ValueError("bad dead-letter queue names")
        for x in (md, mn, deadttl, epoch, reason, dead_at):
            if type(x) is not int or x < 0 or x > (1 << 64) - 1:
                raise ValueError("bad dead-letter field")
        if epoch > MAX_EPOCH or reason >= len(REASON_NAMES):
            raise ValueError("bad dead-letter state")
        return cls(md, mn, queue, source, deadttl, epoch, reason, dead_at, backoff)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, DeadLetter) and self.to_wire() == other.to_wire()

    def __hash__(self) -> int:
        return hash(tuple(self.to_wire()))

    def __repr__(self) -> str:
        return f"<DeadLetter {self.to_wire()!r}>"
