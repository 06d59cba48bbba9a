"""The timer wheel: one structure for every timed action of a node.

Job delays, retries, TTL expiry, WORKING postponement, ACK GC retries, blocked-client
timeouts, sync-ADDJOB timeouts and queue eviction all schedule an entry here. Time is
injected: `due(now_ms)` returns what is due and `next_due()` tells the I/O layer when to
wake, so tests drive the wheel with a fake clock.

Entries are objects with an `awake` attribute (ms; 0 = not scheduled). Rescheduling does
not search for the old entry: the entry is simply added again and an old copy that comes
due is recognised as stale by its owner (its `awake` no longer matches). Buckets are RES ms
wide and fire at their end, so an entry never fires early and at most RES ms late.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Any

RES = 5  # ms per bucket


class Timer:
    """A generic timed callback (jobs are scheduled directly, without a Timer)."""

    __slots__ = ("awake", "callback")

    def __init__(self, callback: Callable[[int], None]) -> None:
        self.awake = 0
        self.callback = callback

    def cancel(self) -> None:
        self.awake = 0


class TimerWheel:
    __slots__ = ("_buckets", "_heap", "_fired")

    def __init__(self) -> None:
        self._buckets: dict[int, list[Any]] = {}
        self._heap: list[int] = []
        self._fired = -1  # last bucket key handed out by due()

    def schedule(self, entry: Any, when_ms: int) -> None:
        """Make `entry` due at `when_ms` (sets entry.awake)."""
        entry.awake = when_ms
        key = -(-when_ms // RES)  # ceil: a bucket fires at key * RES >= when
        if key <= self._fired:
            key = self._fired + 1
        bucket = self._buckets.get(key)
        if bucket is None:
            self._buckets[key] = [entry]
            heapq.heappush(self._heap, key)
        else:
            bucket.append(entry)

    def next_due(self) -> int | None:
        """Earliest time (ms) at which due() may return something, or None if empty."""
        return self._heap[0] * RES if self._heap else None

    def due(self, now_ms: int) -> list[Any]:
        """Pop every entry whose bucket has come due (callers skip stale entries)."""
        heap = self._heap
        out: list[Any] = []
        limit = now_ms // RES
        while heap and heap[0] <= limit:
            key = heapq.heappop(heap)
            out.extend(self._buckets.pop(key))
            self._fired = key
        return out

    def __len__(self) -> int:
        return sum(len(b) for b in self._buckets.values())

    def clear(self) -> None:
        self._buckets.clear()
        self._heap.clear()
