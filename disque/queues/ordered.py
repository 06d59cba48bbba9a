"""OrderedJobs: the jobs of one queue sorted by ctime.

The design calls for a skiplist (O(log n) insert and remove-by-job, O(1) pop of the oldest).
In Python a skiplist node is an object per job (~100+ bytes); instead jobs live in a list of
sorted chunks of at most 2 x LOAD pointers, with the max ctime of each chunk in `_maxes`:
inserting is a bisect over the chunk maxima plus a bisect and insert within one chunk (a
bounded memmove); removing a job finds it the same way; popping the oldest takes the head of
the first chunk. The common case, a job newer than every queued one, is an append. Memory is
one pointer per job.

Jobs with equal ctime (possible only for jobs from different nodes) keep insertion order.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Iterator
from operator import attrgetter
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from disque.jobs.job import Job

LOAD = 512
_ctime = attrgetter("ctime")


class OrderedJobs:
    __slots__ = ("_chunks", "_maxes", "size")

    def __init__(self) -> None:
        self._chunks: list[list[Job]] = []
        self._maxes: list[int] = []
        self.size = 0

    def __len__(self) -> int:
        return self.size

    def __bool__(self) -> bool:
        return self.size > 0

    def add(self, job: Job) -> None:
        ct = job.ctime
        maxes = self._maxes
        self.size += 1
        if not maxes:
            self._chunks.append([job])
            maxes.append(ct)
            return
        if ct >= maxes[-1]:
            i = len(maxes) - 1
            chunk = self._chunks[i]
            chunk.append(job)
            maxes[i] = ct
        else:
            i = bisect_right(maxes, ct)
            chunk = self._chunks[i]
            chunk.insert(bisect_right(chunk, ct, key=_ctime), job)
        if len(chunk) > 2 * LOAD:
            self._chunks.insert(i + 1, chunk[LOAD:])
            del chunk[LOAD:]
            maxes.insert(i, chunk[-1].ctime)

    def add_oldest(self, jobs: list[Job]) -> None:
        """Add jobs sorted by ctime, all older than every job here (jobs back from disk at a
        queue's head): whole chunks in front, no bisect per job. Otherwise one at a time."""
        if not jobs:
            return
        maxes = self._maxes
        if maxes and jobs[-1].ctime >= self._chunks[0][0].ctime:
            for job in jobs:
                self.add(job)
            return
        self._chunks[:0] = [jobs[i:i + LOAD] for i in range(0, len(jobs), LOAD)]
        maxes[:0] = [jobs[min(i + LOAD, len(jobs)) - 1].ctime
                     for i in range(0, len(jobs), LOAD)]
        self.size += len(jobs)

    def remove(self, job: Job) -> bool:
        """Remove this exact job object; False if it is not here."""
        ct = job.ctime
        maxes = self._maxes
        chunks = self._chunks
        i = bisect_left(maxes, ct)
        while i < len(chunks):
            chunk = chunks[i]
            j = bisect_left(chunk, ct, key=_ctime)
            n = len(chunk)
            while j < n and chunk[j].ctime == ct:
                if chunk[j] is job:
                    self._delete(i, j)
                    return True
                j += 1
            if j < n:
                return False
            i += 1
        return False

    def _delete(self, i: int, j: int) -> None:
        chunk = self._chunks[i]
        del chunk[j]
        self.size -= 1
        if not chunk:
            del self._chunks[i]
            del self._maxes[i]
        elif j == len(chunk):
            self._maxes[i] = chunk[-1].ctime

    def pop_first(self) -> Job | None:
        """Remove and return the oldest job, or None when empty."""
        if not self.size:
            return None
        chunk = self._chunks[0]
        job = chunk.pop(0)
        self.size -= 1
        if not chunk:
            del self._chunks[0]
            del self._maxes[0]
        return job

    def pop_newest(self, n: int) -> list[Job]:
        """Remove and return the n newest jobs (fewer if there are not as many)."""
        out: list[Job] = []
        chunks = self._chunks
        maxes = self._maxes
        while n > 0 and chunks:
            chunk = chunks[-1]
            if len(chunk) <= n:
                out += chunk
                n -= len(chunk)
                del chunks[-1]
                del maxes[-1]
            else:
                out += chunk[-n:]
                del chunk[-n:]
                maxes[-1] = chunk[-1].ctime
                n = 0
        self.size -= len(out)
        return out

    def first(self) -> Job | None:
        return self._chunks[0][0] if self.size else None

    def __iter__(self) -> Iterator[Job]:
        """Oldest to newest (snapshot per chunk: safe against changes between chunks)."""
        for chunk in list(self._chunks):
            yield from list(chunk)

    def newest(self, n: int) -> list[Job]:
        """The n newest jobs, newest first."""
        out: list[Job] = []
        for chunk in reversed(self._chunks):
            for job in reversed(chunk):
                if len(out) >= n:
                    return out
                out.append(job)
        return out

    def oldest(self, n: int) -> list[Job]:
        """The n oldest jobs, oldest first."""
        out: list[Job] = []
        for chunk in self._chunks:
            if len(out) + len(chunk) <= n:
                out.extend(chunk)
            else:
                out.extend(chunk[: n - len(out)])
                break
        return out

    def clear(self) -> None:
        self._chunks.clear()
        self._maxes.clear()
        self.size = 0
