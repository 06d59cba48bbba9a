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
went stale in it and the live entries it has left: with none left it is dropped, and once
the stale copies outnumber the live entries by STALE_SLACK it is rebuilt with its live
entries only. A bucket holds fewer than live + STALE_SLACK stale copies, for O(1) amortised
work per reschedule or cancel and no per-entry bookkeeping. (Counting only in buckets due
in more than 2 s cost more: buckets of stale copies then woke the loop for nothing.)
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Any, Final, Protocol

RES: Final = 5  # ms per bucket
NEVER: Final = 1 << 62  # a bucket key no timer reaches: `earliest` of an empty wheel
_STALE_KEYS_MIN: Final = 1024  # bucket keys of dropped buckets tolerated in the heap
# A bucket is rebuilt once its stale copies reach its live entries plus this: at most
# live + STALE_SLACK - 1 stale copies per bucket, and a rebuild (a scan of the bucket) per
# STALE_SLACK stale copies at least. Buckets usually empty whole (dropped, no scan).
STALE_SLACK = 8


class Scheduled(Protocol):
    """What the wheel holds: anything with an `awake` time (ms; 0 = not scheduled)."""

    awake: int


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


class _Bucket:
    """The entries of one RES ms slot; how many of them went stale since it was built, and
    how many are live at most (exact after a rebuild; an entry rescheduled into the bucket
    it is in has two copies, and counts twice until the next rebuild). A class holding a
    list rather than a `list` subclass: mypyc cannot compile a subclass of a builtin."""

    __slots__ = ("entries", "stale", "live")

    def __init__(self, entries: list[Scheduled], live: int) -> None:
        self.entries = entries
        self.stale = 0
        self.live = live


class TimerWheel:
    """Invariant: `earliest` is the smallest key in the heap (NEVER when it is empty).

    The I/O layer reads `earliest` after every read of a client, to re-arm its loop timer
    when a command scheduled something sooner than the timer's instant: an attribute, kept
    up to date where the heap changes (a new bucket, due(), a heap rebuild), so that check
    costs no call. It may be the key of a bucket dropped since (the timer then wakes for
    nothing, once), as the heap's head may."""

    __slots__ = ("_buckets", "_heap", "_fired", "_stale_keys", "earliest")

    def __init__(self) -> None:
        self._buckets: dict[int, _Bucket] = {}
        self._heap: list[int] = []  # bucket keys; some may be of buckets dropped since
        self._fired = -1  # last bucket key handed out by due()
        self._stale_keys = 0  # keys in the heap whose bucket was dropped
        self.earliest = NEVER  # the heap's smallest key (see the class docstring)

    def _key_of(self, awake: int) -> int:
        """The bucket `schedule` puts an entry due at `awake` in, as of now (a bucket
        fires at its end, key * RES >= awake; one handed out already: the next one).
        (Written out inline on the hot paths.)"""
        key = -(-awake // RES)
        return key if key > self._fired else self._fired + 1

    def schedule(self, entry: Scheduled, when_ms: int) -> None:
        """Make `entry` due at `when_ms` (sets entry.awake)."""
        old = entry.awake
        entry.awake = when_ms
        fired = self._fired
        key = -(-when_ms // RES)  # ceil: a bucket fires at key * RES >= when (as _key_of)
        if key <= fired:
            key = fired + 1
        buckets = self._buckets
        if old:
            k = -(-old // RES)
            if k == key:
                return  # (not handed out, so it is in that bucket already)
            if k > fired:
                b = buckets.get(k)
                if b is not None:
                    live = b.live = b.live - 1
                    if live <= 0:
                        self._drop(k)
                    else:
                        stale = b.stale = b.stale + 1
                        if stale >= live + STALE_SLACK:
                            self._rebuild(k, b)
            else:
                self._went_stale_after_fired()
        bucket = buckets.get(key)
        if bucket is None:
            bucket = buckets[key] = _Bucket([], 0)
            heapq.heappush(self._heap, key)
            if key < self.earliest:
                self.earliest = key
        bucket.entries.append(entry)
        bucket.live += 1

    def cancel(self, entry: Scheduled) -> None:
        """Unschedule `entry` (awake = 0): the wheel lets it go with its bucket's next rebuild
        or drop, or when the bucket comes due."""
        old = entry.awake
        if old:
            entry.awake = 0
            key = -(-old // RES)
            if key > self._fired:
                self._went_stale(key)
            else:
                self._went_stale_after_fired()

    def _went_stale(self, key: int) -> None:
        """An entry of bucket `key` (not handed out: it is there) was just moved or
        cancelled (its awake changed already): the bucket is dropped when nothing in it is
        live any more, rebuilt once its stale copies outnumber its live entries by
        STALE_SLACK. (`schedule` has this inline.)"""
        bucket = self._buckets.get(key)
        if bucket is None:
            return
        live = bucket.live = bucket.live - 1
        if live <= 0:
            self._drop(key)
            return
        stale = bucket.stale = bucket.stale + 1
        if stale >= live + STALE_SLACK:
            self._rebuild(key, bucket)

    def _went_stale_after_fired(self) -> None:
        """An entry due before the last bucket handed out was moved or cancelled: it is out
        already, or was put in the bucket after it (see schedule). Counted stale there, not
        as one live entry less (it may not be there)."""
        key = self._fired + 1
        bucket = self._buckets.get(key)
        if bucket is None:
            return
        stale = bucket.stale = bucket.stale + 1
        if stale >= bucket.live + STALE_SLACK:
            self._rebuild(key, bucket)

    def _rebuild(self, key: int, bucket: _Bucket) -> None:
        """Keep the bucket's live entries (those whose awake still puts them here: in its
        RES ms, or before it for the bucket right after the last one handed out), each
        once."""
        hi = key * RES
        lo = 0 if key == self._fired + 1 else hi - RES
        live = list(dict.fromkeys([e for e in bucket.entries if lo < e.awake <= hi]))
        if live:
            self._buckets[key] = _Bucket(live, len(live))
        else:
            self._drop(key)

    def _drop(self, key: int) -> None:
        """Forget a bucket with nothing live in it (its key stays in the heap until due()
        or a heap rebuild)."""
        del self._buckets[key]
        self._stale_keys += 1
        if self._stale_keys > _STALE_KEYS_MIN and self._stale_keys > len(self._buckets):
            heap = self._heap = list(self._buckets)
            heapq.heapify(heap)
            self.earliest = heap[0] if heap else NEVER
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
                out.extend(bucket.entries)
            self._fired = key
        self.earliest = heap[0] if heap else NEVER
        return out

    def entries(self) -> list[Any]:
        """Every entry in the wheel (stale copies included), in no particular order."""
        return [e for b in self._buckets.values() for e in b.entries]

    def __len__(self) -> int:
        """Entries in the wheel, stale copies included."""
        return sum(len(b.entries) for b in self._buckets.values())

    def clear(self) -> None:
        self._buckets.clear()
        self._heap.clear()
        self.earliest = NEVER
        self._stale_keys = 0
