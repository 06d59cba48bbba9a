"""The Queue object: ordered jobs, blocked GETJOB waiters, pause flags and counters."""

from __future__ import annotations

from typing import Any, Final

from disque.queues.ordered import OrderedJobs

PAUSE_IN: Final = 1
PAUSE_OUT: Final = 2
PAUSE_NAMES: Final = (b"none", b"in", b"out", b"all")


class Queue:
    __slots__ = ("name", "jobs", "ctime", "atime", "paused", "waiters", "jobs_in",
                 "jobs_out", "needjobs_bcast_time", "needjobs_adhoc_time",
                 "needjobs_bcast_attempt", "needjobs_adhoc_attempt", "needjobs_responders",
                 "import_rate", "import_samples", "added", "acked", "nacked", "requeued",
                 "spilled", "disk_first")

    def __init__(self, name: bytes, now_ms: int) -> None:
        self.name = name
        self.jobs = OrderedJobs()
        self.ctime = now_ms  # creation, for QSTAT age
        self.atime = now_ms  # last enqueue / fetch, for QSTAT idle and eviction
        self.paused = 0
        # Blocked clients, in arrival order (a dict keeps order and removes in O(1)).
        self.waiters: dict[Any, None] = {}
        self.jobs_in = 0
        self.jobs_out = 0
        # Totals for /metrics (disque.http), bumped where the event happens; see
        # docs/metrics.md for exactly what each counts.
        self.added = 0
        self.acked = 0
        self.nacked = 0
        self.requeued = 0
        # Federation bookkeeping (NEEDJOBS / YOURJOBS), filled in by the cluster layer.
        self.needjobs_bcast_time = 0
        self.needjobs_adhoc_time = 0
        self.needjobs_bcast_attempt = 0
        self.needjobs_adhoc_attempt = 0
        self.needjobs_responders: dict[bytes, int] = {}
        self.import_rate = 0
        self.import_samples: list[tuple[int, int]] = []
        # Jobs of this queue on disk (disque.overflow), and a lower bound of the ctime of
        # the oldest of them: `jobs` holds the rest, and its head is older than all of them.
        self.spilled = 0
        self.disk_first = 0

    def __len__(self) -> int:
        """Jobs queued, in memory and on disk (QLEN)."""
        return len(self.jobs) + self.spilled

    def pause_name(self) -> bytes:
        return PAUSE_NAMES[self.paused]

    def evictable(self) -> bool:
        return not self.jobs and not self.spilled and not self.waiters and not self.paused
