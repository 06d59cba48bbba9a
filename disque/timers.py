"""The timer wheel: one structure for every timed action of a node.

Job delays, retries, TTL expiry, WORKING postponement, ACK GC retries, blocked-client
timeouts, sync-ADDJOB timeouts and queue eviction all schedule an entry here. Time is
injected: `due(now_ms)` returns what is due and `next_due()` tells the I/O layer when to
wake, so tests drive the wheel with a fake clock.

Entries are objects with `awake` (ms; 0 = not scheduled) and `wpos` attributes. Buckets are
RES ms wide and fire at their end, so an entry never fires early and at most RES ms late.
An entry is in at most one bucket: rescheduling moves it and `cancel` takes it out, in O(1)
(`wpos` is its index in its bucket; the slot is cleared, and a bucket mostly cleared is
compacted or dropped). A deleted job must not stay referenced until its time comes: at
RETRY 0 that is its TTL, days away. The owner still checks `awake` when an entry comes out
(`awake and awake <= now`): an entry moved while a due batch is being run, or one whose
`awake` was cleared without `cancel`, comes out stale.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Any

RES = 5  # ms per bucket
_COMPACT_MIN = 32  # a bucket this long or more is compacted once half of it is cleared
_STALE_KEYS_MIN = 1024  # bucket keys of dropped buckets tolerated in the heap


class Timer:
    """A generic timed callback (jobs are scheduled directly, without a Timer)."""

    __slots__ = ("awake", "wpos", "callback")

    def __init__(self, callback: Callable[[int], None]) -> None:
        self.awake = 0
        self.wpos = 0
        self.callback = callback

    def cancel(self) -> None:
        """Mark it dead (it still comes out of the wheel, stale): `TimerWheel.cancel`
        also takes it out."""
        self.awake = 0


class _Bucket(list):  # type: ignore[type-arg]
    """The entries of one RES ms slot (None where one was taken out), and how many."""

    __slots__ = ("holes",)


class TimerWheel:
    __slots__ = ("_buckets", "_heap", "_fired", "_stale_keys")

    def __init__(self) -> None:
        self._buckets: dict[int, _Bucket] = {}
        self._heap: list[int] = []  # bucket keys; some may be of buckets dropped since
        self._fired = -1  # last bucket key handed out by due()
        self._stale_keys = 0  # keys in the heap whose bucket was dropped

    def schedule(self, entry: Any, when_ms: int) -> None:
        """Make `entry` due at `when_ms` (sets entry.awake), moving it if it was scheduled."""
        if entry.awake:
            self._take_out(entry)
        entry.awake = when_ms
        key = -(-when_ms // RES)  # ceil: a bucket fires at key * RES >= when
        if key <= self._fired:  # (its bucket was handed out: the next one, as _key_of)
            key = self._fired + 1
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = self._buckets[key] = _Bucket()
            bucket.holes = 0
            heapq.heappush(self._heap, key)
        entry.wpos = len(bucket)
        bucket.append(entry)

    def cancel(self, entry: Any) -> None:
        """Unschedule `entry` (awake = 0) and drop the wheel's reference to it."""
        if entry.awake:
            self._take_out(entry)
            entry.awake = 0

    def _key_of(self, awake: int) -> int:
        """The bucket `schedule` puts an entry due at `awake` in, as of now."""
        key = -(-awake // RES)
        return key if key > self._fired else self._fired + 1

    def _take_out(self, entry: Any) -> None:
        key = self._key_of(entry.awake)
        bucket = self._buckets.get(key)
        pos = entry.wpos
        if bucket is None or pos >= len(bucket) or bucket[pos] is not entry:
            # handed out already (due() ran its bucket), or not where its awake says
            # (cleared without cancel, then rescheduled): nothing to take out
            return
        bucket[pos] = None
        holes = bucket.holes = bucket.holes + 1
        n = len(bucket)
        if holes == n:
            del self._buckets[key]
            self._stale_keys += 1
            if self._stale_keys > _STALE_KEYS_MIN and self._stale_keys > len(self._buckets):
                self._heap = list(self._buckets)
                heapq.heapify(self._heap)
                self._stale_keys = 0
        elif n >= _COMPACT_MIN and 2 * holes >= n:
            self._compact(key, bucket)

    def _compact(self, key: int, bucket: _Bucket) -> None:
        """Rebuild a bucket without its cleared slots (amortised: it took n/2 removals)."""
        kept = _Bucket(e for e in bucket if e is not None)
        kept.holes = 0
        key_of = self._key_of
        for i, e in enumerate(kept):
            if e.awake and key_of(e.awake) == key:  # (not a stale copy)
                e.wpos = i
        self._buckets[key] = kept

    def next_due(self) -> int | None:
        """Earliest time (ms) at which due() may return something, or None if empty."""
        return self._heap[0] * RES if self._heap else None

    def due(self, now_ms: int) -> list[Any]:
        """Pop every entry whose bucket has come due (callers skip stale entries)."""
        heap = self._heap
        buckets = self._buckets
        out: list[Any] = []
        limit = now_ms // RES
        while heap and heap[0] <= limit:
            key = heapq.heappop(heap)
            bucket = buckets.pop(key, None)
            if bucket is None:
                self._stale_keys -= 1
            elif bucket.holes:
                out.extend([e for e in bucket if e is not None])
            else:
                out.extend(bucket)
            self._fired = key
        return out

    def entries(self) -> list[Any]:
        """Every entry in the wheel, in no particular order."""
        return [e for b in self._buckets.values() for e in b if e is not None]

    def __len__(self) -> int:
        return sum(len(b) - b.holes for b in self._buckets.values())

    def clear(self) -> None:
        self._buckets.clear()
        self._heap.clear()
        self._stale_keys = 0
