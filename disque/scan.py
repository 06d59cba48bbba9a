"""ScanDict: a dict split into a fixed number of shards, so SCAN-style cursors work.

QSCAN and JSCAN promise that every element present for the whole iteration is returned
(duplicates allowed) while the set changes between calls. A plain dict cannot resume an
iteration, so keys are spread over 2^bits shard dicts by hash, and the cursor is the index
of the next shard to visit. The shard count never changes, so no element can move behind
the cursor. Lookups cost one extra list index.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from mypy_extensions import i64

K = TypeVar("K")
V = TypeVar("V")


class ScanDict(Generic[K, V]):
    """`shards`, `mask` and `size` are public: the hot paths of the node insert into a
    shard directly (`shards[hash(key) & mask][key] = value`) and count it (`size += 1`),
    saving a method call per job. `mask` is a native 64-bit int in the compiled build: a
    string's hash is one, and half of them are too large for the compiled code's small
    ints, so `hash(key) & mask` with a plain int `mask` made a new int object each time."""

    __slots__ = ("shards", "mask", "size")

    def __init__(self, bits: int = 12) -> None:
        self.shards: list[dict[K, V]] = [{} for _ in range(1 << bits)]
        self.mask: i64 = (1 << bits) - 1
        self.size = 0

    def get(self, key: K) -> V | None:
        return self.shards[hash(key) & self.mask].get(key)

    def add(self, key: K, value: V) -> None:
        shard = self.shards[hash(key) & self.mask]
        if key not in shard:
            self.size += 1
        shard[key] = value

    def pop(self, key: K) -> V | None:
        value = self.shards[hash(key) & self.mask].pop(key, None)
        if value is not None:
            self.size -= 1
        return value

    def __len__(self) -> int:
        return self.size

    def __contains__(self, key: object) -> bool:
        return key in self.shards[hash(key) & self.mask]

    def values(self) -> Iterator[V]:
        for shard in self.shards:
            yield from list(shard.values())

    def clear(self) -> None:
        for shard in self.shards:
            shard.clear()
        self.size = 0

    def shard_count(self) -> int:
        return self.mask + 1

    def shard_index(self, key: K) -> int:
        """The index of the shard that holds `key` (what a cursor is compared with)."""
        return hash(key) & self.mask

    def shard(self, index: int) -> dict[K, V]:
        return self.shards[index & self.mask]

    def scan(self, cursor: int, count: int, keep: Callable[[V], bool],
             busyloop: bool = False) -> tuple[int, list[V]]:
        """Visit shards from `cursor`; stop after `count` matches or 10 x count elements.

        Returns (next cursor, values kept); next cursor 0 means the iteration is complete.
        The bound counts elements, not shards: the original bounds the work by 10 x count
        buckets of a table sized to its element count, so a filter matching nothing among
        few elements ends in one call there. Counting our fixed, mostly empty shards instead
        made e.g. `JSCAN 0 QUEUE <no such queue>` answer cursor 1000 on an idle node.
        """
        shards = self.shards
        n = len(shards)
        if cursor < 0 or cursor >= n:
            return 0, []
        found: list[V] = []
        limit = count * 10
        examined = 0
        while cursor < n:
            shard = shards[cursor]
            cursor += 1
            if shard:
                for value in shard.values():
                    if keep(value):
                        found.append(value)
                examined += len(shard)
                if not busyloop and (len(found) >= count or examined >= limit):
                    break
        return (cursor if cursor < n else 0), found
