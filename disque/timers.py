"""The timer wheel: one structure for every timed action of a node.

Job delays, retries, TTL expiry, WORKING postponement, ACK GC retries, blocked-client
timeouts, sync-ADDJOB timeouts and queue eviction all schedule an entry here. Time is
injected: `due(now_ms)` returns what is due and `next_due()` tells the I/O layer when to
wake, so tests drive the wheel with a fake clock.

Entries are objects with an `awake` attribute (ms; 0 = not scheduled). Buckets are RES ms
wide and fire at their end, so an entry never fires early and at most RES ms late.

Rescheduling appends the entry again: the copy left behind is stale, and so is the entry
`cancel` unschedules (awake 0); owners recognise a stale copy that comes out by its
`awake` (`awake and awake <= now`). A deleted job must not stay referenced until its old
time comes (at RETRY 0 that is its TTL, days away), so each bucket counts the copies that
went stale in it, and once they are half of it, it is rebuilt with its live entries only
(or dropped): a bucket holds at most as many stale copies as live entries, plus one, for
O(1) amortised work per reschedule or cancel and no per-entry bookkeeping.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Any

RES = 5  # ms per bucket
_STALE_KEYS_MIN = 1024  # bucket keys of dropped buckets tolerated in the heap


class Timer:
    """A generic timed callback (jobs are scheduled directly, without a Timer)."""

    __slots__ = ("awake", "callback")

    def __init__(self, callback: Callable[[int], None]) -> None:
        self.awake = 0
        self.callback = callback

    def cancel(self) -> None:
        """Mark it dead (it still comes out of the wheel, stale): `TimerWheel.cancel`
        also lets the wheel drop it."""
        self.awake = 0


class _Bucket(list):  # type: ignore[type-arg]
    """The entries of one RES ms slot, and how many of them went stale since it was built."""

    __slots__ = ("stale",)


class TimerWheel:
    __slots__ = ("_buckets", "_heap", "_fired", "_stale_keys")

    def __init__(self) -> None:
        self._buckets: dict[int, _Bucket] = {}
        self._heap: list[int] = []  # bucket keys; some may be of buckets dropped since
        self._fired = -1  # last bucket key handed out by due()
        self._stale_keys = 0  # keys in the heap whose bucket was dropped

    def _key_of(self, awake: int) -> int:
        """The bucket `schedule` puts an entry due at `awake` in, as of now (a bucket
        fires at its end, key * RES >= awake; one handed out already: the next one)."""
        key = -(-awake // RES)
        return key if key > self._fired else self._fired + 1

    def schedule(self, entry: Any, when_ms: int) -> None:
        """Make `entry` due at `when_ms` (sets entry.awake)."""
        old = entry.awake
        entry.awake = when_ms
        if old:
            self._went_stale(old)
        key = self._key_of(when_ms)
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = self._buckets[key] = _Bucket()
            bucket.stale = 0
            heapq.heappush(self._heap, key)
        bucket.append(entry)

    def cancel(self, entry: Any) -> None:
        """Unschedule `entry` (awake = 0): the wheel drops it with its bucket's next rebuild."""
        old = entry.awake
        if old:
            entry.awake = 0
            self._went_stale(old)

    def _went_stale(self, awake: int) -> None:
        """An entry due at `awake` was just moved or cancelled (its awake changed already):
        count it in its bucket (if not handed out), rebuilt once half of it is stale."""
        key = self._key_of(awake)
        bucket = self._buckets.get(key)
        if bucket is None:
            return
        stale = bucket.stale = bucket.stale + 1
        if 2 * stale >= len(bucket):
            self._rebuild(key, bucket)

    def _rebuild(self, key: int, bucket: _Bucket) -> None:
        """Keep the bucket's live entries (those whose awake still puts them here), each
        once."""
        key_of = self._key_of
        live = _Bucket(dict.fromkeys(e for e in bucket if e.awake and key_of(e.awake) == key))
        if live:
            live.stale = 0
            self._buckets[key] = live
            return
        del self._buckets[key]
        self._stale_keys += 1
        if self._stale_keys > _STALE_KEYS_MIN and self._stale_keys > len(self._buckets):
            self._heap = list(self._buckets)
            heapq.heapify(self._heap)
            self._stale_keys = 0

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
            else:
                out.extend(bucket)
            self._fired = key
        return out

    def entries(self) -> list[Any]:
        """Every entry in the wheel (stale copies included), in no particular order."""
        return [e for b in self._buckets.values() for e in b]

    def __len__(self) -> int:
        """Entries in the wheel, stale copies included."""
        return sum(len(b) for b in self._buckets.values())

    def clear(self) -> None:
        self._buckets.clear()
        self._heap.clear()
        self._stale_keys = 0
