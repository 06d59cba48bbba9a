"""OverflowStore: the jobs a node moved to disk, in one SQLite file, in segments.

Jobs go to disk in segments ("chunks"): up to CHUNK jobs of one queue (or of no queue: active
jobs) written together, in ctime order, as one row: their data concatenated, and per job its
length (`lens`), the fingerprint of its listed nodes (`fps`, see `fingerprint`) and its ID,
listed nodes and whether it may be copied (`meta`, for the walks of re-replication and
repair). A segment comes back whole: the oldest of a queue when the queue's head is needed
(`take_oldest`), or when its earliest wake time (an expiry, an active job's requeue) is due
(`take_due`). One job can come back alone, by ID (`take`): an index `ids` maps a 64-bit hash
of each job ID to its place, segment * CHUNK + position in the segment (its bytes are found
from `lens`; the segments read last are kept, `cached`, as jobs are most often looked up by
ID in about the order they were written: a replica's copies as their SETACKs come, from the
consumers of each node), and its place is
a hole of the segment (`holes`, in memory: the file is a cache, and a job taken alone then
writes nothing) so the segment does not bring it back twice. A copy received again for a job
on disk that lists the same nodes (re-replication sends each job from every holder) is known
held from its entry and its segment's `fps`, without being read (`holds`); and a job is read
by ID without being taken (`get`: a re-replication walk sends it from disk).

Why segments: one row and two small index entries per segment instead of a row and three
index entries per job. The cost that stays per job is the `ids` entry, a B-tree insert at a
random place, and the page it lands on written at the commit: about a page written per job
once the index outgrows SQLite's cache. So an entry is two integers (about 19 bytes in a
page: the more a page holds, the fewer pages a merge writes), and new entries go first to
`new`, dicts in memory (one per 1/MERGE_SLICES of the hash space); once they hold MERGE_AT
entries they move to `ids` one dict per step (`merge_step`), in key order, so each page
of `ids` takes many entries for one write. (A keyed table in memory in their place, as
before, cost 1.4 us per entry against 0.15: SQLite's B-tree inserts at random places; the
dicts take ~13 MB at MERGE_AT.) A lookup reads `new` first. An entry is not deleted when
its segment comes back whole (an entry whose segment is gone is stale: a lookup skips it),
and the stale entries are swept in the background (`sweep`, one slice of the hash space at
a time) once they outnumber the live ones, and all at once whenever the store is empty (a
new file, see `_reset`).

Why SQLite rather than hand-written segment files: a job on disk must be found by ID, by
queue order and by wake time, within a memory budget, consistently after a failed write:
that is what SQLite's B-trees and rollback journal are. The file lives in the page cache (no
fsync, no memory map: its pages are not the node's RSS); SQLite's own cache is capped
(`CACHE_KIB`).

What the file is: a cache of memory, never the source of truth. It is deleted when the store
opens (at start, and when overflow is turned on): without AOF a restarted node starts empty
(as it always does; re-replication refills it), with AOF every job comes back from the AOF
and overflows again as it loads. So a torn file after a kill -9, or one deleted by hand, is
never read. A file deleted by hand while the node runs keeps working (the node holds it
open) and its space is freed when the store closes.

A full disk or the size cap (`max_bytes`, SQLite's max_page_count) makes a write fail with
SQLITE_FULL: the batch is rolled back (the rollback journal is kept in memory) and
`OverflowFull` is raised; nothing in the file changes.

Two job IDs with the same 64-bit hash (about one chance in 10^7 among 5 million jobs): the
later one's entry replaces the other's, which is then found only when its segment comes back.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from array import array
from collections import Counter
from collections.abc import Collection
from operator import itemgetter
from typing import Any

import msgpack

from disque.overflow.record import job_id_of

CACHE_KIB = 8192  # SQLite's page cache, KiB
# jobs per segment at most: a segment's data is one blob on a chain of overflow pages that a
# read by ID walks from its start (a job read alone: 14,800/s at 512, 33,800/s at 64; writes
# 4% slower)
CHUNK = 64
SWEEP_SLICES = 1024  # a sweep of stale ID entries covers 1/SWEEP_SLICES of the hash space
SWEEP_SLACK = 10_000  # stale ID entries swept only while they outnumber the live by this
MERGE_AT = 131072  # entries in `new` that start a merge into ids
MERGE_SLICES = 16  # a merge step moves 1/MERGE_SLICES of the hash space
# the slice of a (signed 64-bit) hash h: (h >> SLICE_SHIFT) + SLICE_BIAS, 0 to MERGE_SLICES - 1
SLICE_SHIFT = 64 - (MERGE_SLICES.bit_length() - 1)
SLICE_BIAS = MERGE_SLICES // 2
MERGE_ROWS = 512  # entries per statement of a merge step
# segments kept in memory after a job of theirs was looked up by ID (`cached`): the next
# lookups are most often in the same ones; and their data, once two of their jobs are read,
# if no larger than CACHED_BYTES
CACHED_SEGMENTS = 8
CACHED_BYTES = 256 * 1024
WHOLE_AT = 4  # jobs of a segment taken together that read its data whole (take_many)
# an ID entry: the hash of a job ID, and the job's place (segment * CHUNK + position)
_IDS_COLUMNS = "(h INTEGER PRIMARY KEY, at INTEGER NOT NULL)"

_SCHEMA = (
    "CREATE TABLE chunks (id INTEGER PRIMARY KEY AUTOINCREMENT, queue BLOB NOT NULL,"
    " first INTEGER NOT NULL, wake INTEGER NOT NULL, count INTEGER NOT NULL,"
    " lens BLOB NOT NULL, fps BLOB NOT NULL, meta BLOB NOT NULL, data BLOB NOT NULL)",
    "CREATE INDEX chunks_queue ON chunks (queue, first)",
    "CREATE INDEX chunks_wake ON chunks (wake)",
    "CREATE TABLE ids " + _IDS_COLUMNS,
)

# id, queue (empty: a job not queued here), ctime (the queue order), wake (ms: when the job's
# timer wants it back), nodes (the listed nodes' IDs, concatenated), copyable (1: re-
# replication and repair may copy it), data (the job, disque.overflow.record), fp (the
# `fingerprint` of its listed nodes; 0: a copy received again must be read to be merged)
Row = tuple[bytes, bytes, int, int, bytes, int, bytes, int]
# a segment as read back: id, count, lens (array("I") bytes), data
Segment = tuple[int, int, bytes, bytes]

# one Packer for every segment's meta: packb makes a Packer per call
_packb = msgpack.Packer(autoreset=True).pack
_unpackb = msgpack.unpackb


def fingerprint(nodes: Collection[bytes]) -> int:
    """A number that stands for a set of node IDs in this process (never 0)."""
    return hash(frozenset(nodes)) or 1


class OverflowFull(Exception):
    """The disk is full, the size cap is reached, or the write failed: it did not happen."""


class OverflowStore:
    """The on-disk part of a node's jobs (see the module docstring)."""

    def __init__(self, path: str, max_bytes: int = 0) -> None:
        self.path = path
        self.max_bytes = max_bytes
        self.db = self._open(0)
        self.last_chunk = 0  # the ID of the newest segment written (IDs only grow)
        self.jobs = 0  # jobs here now
        self.bytes = 0  # their data bytes
        self.written = 0  # jobs written since start
        self.read = 0  # jobs read back since start
        self.chunks = 0  # segments here now
        # the places of the jobs taken alone out of a segment still here (its holes), by
        # segment: in memory, so a job taken by ID costs no write
        self.holes: dict[int, set[int]] = {}
        self.stale = 0  # ID entries whose segment is gone (about)
        self._sweep = 0  # the next slice of the hash space to sweep
        # the new ID entries (hash -> place), a dict per slice of the hash space
        self.new: list[dict[int, int]] = [{} for _ in range(MERGE_SLICES)]
        self.fresh = 0  # entries in `new`
        self._merge = -1  # the next slice of a merge under way (-1: none)
        # the segments jobs were looked up in last (jobs are most often looked up by ID in
        # about the order they were written: a replica's copies as their SETACKs come)
        self.cached: dict[int, _Segment] = {}  # by ID, the oldest first (CACHED_SEGMENTS)
        # the segments (lowest ID, highest ID) the jobs taken last came from
        self.took: tuple[int, int] = (0, 0)

    def _open(self, last_chunk: int) -> sqlite3.Connection:
        """A new, empty file at `path` (whatever was there is deleted); segment IDs go on
        after `last_chunk`, so the cursor of a walk under way never names a new one."""
        _remove(self.path)
        db = sqlite3.connect(self.path, isolation_level=None)
        # the node is the file's only user: one lock for the life of the connection, not a
        # lock, unlock and a check of the file header per transaction (a job read back by
        # ID cost 1.8x as much with them)
        db.execute("PRAGMA locking_mode=EXCLUSIVE")
        db.execute("PRAGMA journal_mode=MEMORY")
        db.execute("PRAGMA synchronous=OFF")
        db.execute("PRAGMA temp_store=MEMORY")
        db.execute(f"PRAGMA cache_size=-{CACHE_KIB}")
        for statement in _SCHEMA:
            db.execute(statement)
        if last_chunk:
            db.execute("INSERT INTO sqlite_sequence (name, seq) VALUES ('chunks', ?)",
                       (last_chunk,))
        self.page_size: int = db.execute("PRAGMA page_size").fetchone()[0]
        self.db = db
        self.set_max_bytes(self.max_bytes)
        return db

    def _reset(self) -> None:
        """Empty the store by starting a new file: deleting millions of stale ID entries
        in a transaction would hold their pages in the in-memory journal (100+ MB at 5
        million) and keep the file at its largest."""
        row = self.db.execute("SELECT seq FROM sqlite_sequence WHERE name = 'chunks'").fetchone()
        with contextlib.suppress(sqlite3.Error):
            self.db.close()
        self._open(int(row[0]) if row else 0)
        self.jobs = self.bytes = self.chunks = self.stale = self.fresh = 0
        self.holes.clear()
        self._merge = -1
        self.cached.clear()
        for part in self.new:
            part.clear()

    def set_max_bytes(self, max_bytes: int) -> None:
        """0: no cap (SQLite's own maximum)."""
        self.max_bytes = max_bytes
        pages = max_bytes // self.page_size if max_bytes else 0xFFFFFFFE
        self.db.execute(f"PRAGMA max_page_count={max(pages, 16)}")

    def file_bytes(self) -> int:
        pages: int = self.db.execute("PRAGMA page_count").fetchone()[0]
        return pages * self.page_size

    def close(self) -> None:
        with contextlib.suppress(sqlite3.Error):
            self.db.close()
        _remove(self.path)

    # ------------------------------------------------------------------ writes
    def put(self, rows: list[Row]) -> None:
        """Add jobs in one transaction, as segments of one queue each; OverflowFull (and
        nothing added) when they do not fit."""
        queue = rows[0][1] if rows else b""
        if all(r[1] == queue for r in rows):  # (a spill: one queue; new jobs may mix queues)
            groups = [rows]
        else:
            by_queue: dict[bytes, list[Row]] = {}
            for r in rows:
                group = by_queue.get(r[1])
                if group is None:
                    by_queue[r[1]] = [r]
                else:
                    group.append(r)
            groups = list(by_queue.values())
        db = self.db
        added = chunks = 0
        size = 0
        placed: list[tuple[int, list[int]]] = []  # (first place, each job's ID hash) a segment
        try:
            db.execute("BEGIN")
            for group in groups:
                group = sorted(group, key=_ctime_of)
                for start in range(0, len(group), CHUNK):
                    # (one transpose: the columns of the segment's jobs)
                    ids, queues, ctimes, wakes, listed, copyable, datas, fps = zip(
                        *group[start:start + CHUNK], strict=True)
                    data = b"".join(datas)
                    cur = db.execute(
                        "INSERT INTO chunks (queue, first, wake, count, lens, fps, meta, data)"
                        " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                        (queues[0], ctimes[0], min(wakes), len(ids),
                         array("I", map(len, datas)).tobytes(), array("q", fps).tobytes(),
                         _packb(list(zip(ids, listed, copyable, strict=True))), data))
                    chunk = self.last_chunk = int(cur.lastrowid or 0)
                    placed.append((chunk * CHUNK, list(map(hash, ids))))
                    added += len(ids)
                    size += len(data)
                    chunks += 1
            db.execute("COMMIT")
        except sqlite3.Error as exc:
            # a full disk (SQLITE_FULL), a file-size limit or an I/O error (SQLITE_IOERR):
            # the same for the caller, nothing was added
            with contextlib.suppress(sqlite3.Error):
                db.execute("ROLLBACK")
            raise OverflowFull(str(exc)) from exc
        new = self.new
        for at, hashes in placed:
            for h in hashes:  # (`_new_of`'s slice, inline: a method call per job cost more)
                new[(h >> SLICE_SHIFT) + SLICE_BIAS][h] = at
                at += 1
        self.jobs += added
        self.bytes += size
        self.written += added
        self.chunks += chunks
        self.fresh += added

    def merge_step(self) -> None:
        """Move one slice of `new` into ids, in key order (sorted here: through a temporary
        table sorted by SQLite, a merge cost 10% more), when a merge is under way or `new`
        is full enough to start one. A failed step (a full disk) leaves its entries in
        `new`, where lookups find them as well."""
        if self._merge < 0:
            if self.fresh < MERGE_AT:
                return
            self._merge = 0
        part = self.new[self._merge]
        db = self.db
        if part:
            try:
                db.execute("BEGIN")
                keys = sorted(part)  # (sorting the (h, at) pairs cost twice as much)
                flat = [0] * (2 * len(keys))  # h, at, h, at...
                flat[0::2] = keys
                flat[1::2] = map(part.__getitem__, keys)
                rows = 2 * MERGE_ROWS
                for i in range(0, len(flat), rows):
                    values = flat[i:i + rows]
                    db.execute(_insert_ids(len(values) // 2), values)
                db.execute("COMMIT")
            except sqlite3.Error:
                with contextlib.suppress(sqlite3.Error):
                    db.execute("ROLLBACK")
                self._merge = -1
                return
            self.fresh = max(0, self.fresh - len(part))
            part.clear()
        self._merge += 1
        if self._merge == MERGE_SLICES:
            self._merge = -1

    def _load(self, found: list[Segment]) -> list[bytes]:
        """Delete the segments found (id, count, lens, data); the data of their jobs not
        taken already."""
        if not found:
            return []
        db = self.db
        out: list[bytes] = []
        size = 0
        stale = 0
        for row in found:
            jobs = self._split(row)
            out += jobs
            size += sum(map(len, jobs))
            stale += len(jobs)
        gone = [row[0] for row in found]
        db.execute(f"DELETE FROM chunks WHERE id IN ({_marks(len(gone))})", gone)
        self._forget(gone)
        if self.holes:
            for chunk in gone:
                self.holes.pop(chunk, None)
        self.jobs -= len(out)
        self.bytes -= size
        self.read += len(out)
        self.chunks -= len(found)
        self.took = (min(row[0] for row in found), max(row[0] for row in found))
        self.stale += stale
        self._emptied()
        return out

    def _emptied(self) -> None:
        if not self.jobs and not self.chunks and self.stale:
            self._reset()  # every ID entry is stale: all at once

    def _new_of(self, h: int) -> dict[int, int]:
        """The dict of `new` for hash h (its slice of the hash space)."""
        return self.new[(h >> SLICE_SHIFT) + SLICE_BIAS]

    def _segment(self, chunk: int) -> _Segment | None:
        """A segment's job count, job lengths and fingerprints, from `cached` or read; None
        when the segment is gone."""
        seg = self.cached.get(chunk)
        if seg is not None:
            return seg
        row = self.db.execute("SELECT count, lens, fps FROM chunks WHERE id = ?",
                              (chunk,)).fetchone()
        return self._keep(chunk, row) if row is not None else None

    def _keep(self, chunk: int, row: tuple[int, bytes, bytes]) -> _Segment:
        """A segment read (count, lens, fps) is kept in `cached`, in place of the oldest."""
        cached = self.cached
        if len(cached) >= CACHED_SEGMENTS:
            del cached[next(iter(cached))]
        seg = cached[chunk] = _Segment(chunk, *row)
        return seg

    def _forget(self, chunks: Collection[int]) -> None:
        """Segments deleted: not in `cached` any more."""
        cached = self.cached
        if cached:
            for chunk in chunks:
                cached.pop(chunk, None)

    def _entry(self, h: int) -> tuple[int, bool, _Segment] | None:
        """The live ID entry of hash h: place in its segment, whether it is in `new`
        (looked at first), and the segment (`_segment`); or None. An entry whose segment
        came back whole, or whose job was taken alone (a hole), is stale and skipped (the
        sweep removes the first kind)."""
        at = self._new_of(h).get(h)
        seg = self._segment(at // CHUNK) if at is not None else None
        fresh = seg is not None
        if seg is None:
            # (one statement: the entry and its segment's count, lens and fps, read in the
            # segment's first page)
            row = self.db.execute("SELECT i.at, c.count, c.lens, c.fps FROM ids AS i, chunks AS c"
                                  " WHERE i.h = ? AND c.id = i.at / ?", (h, CHUNK)).fetchone()
            if row is None:
                return None
            at = int(row[0])
            chunk = at // CHUNK
            seg = self.cached.get(chunk)
            if seg is None:
                seg = self._keep(chunk, row[1:])
        assert at is not None
        pos = at % CHUNK
        holes = self.holes.get(seg.id)
        if holes is not None and pos in holes:
            return None
        return pos, fresh, seg

    def _find(self, job_id: bytes) -> tuple[int, int, int, bytes, bool, int] | None:
        """Where a job is (segment, place, length), its data, whether its ID entry is in
        `new`, and its segment's job count; or None."""
        entry = self._entry(hash(job_id))
        if entry is None:
            return None
        pos, fresh, seg = entry
        lens = seg.lens
        off = sum(lens[:pos])
        n = lens[pos]
        if seg.data:
            data = seg.data[off:off + n]
        elif seg.reads and sum(lens) <= CACHED_BYTES:
            # a second job read from the segment: the next ones are likely to be too
            seg.data = self.db.execute("SELECT data FROM chunks WHERE id = ?",
                                       (seg.id,)).fetchone()[0]
            data = seg.data[off:off + n]
        else:
            data = self._read_alone(seg.id, off, n)
        seg.reads += 1
        # (a hash shared with another job's)
        if job_id_of(data) != job_id:
            return None
        return seg.id, pos, n, data, fresh, seg.count

    def get(self, job_id: bytes) -> bytes | None:
        """One job's data by ID, left on disk; None when it is not here."""
        found = self._find(job_id)
        return found[3] if found is not None else None

    def holds(self, job_id: bytes, fp: int) -> bool:
        """Whether the job is here listing the nodes `fp` stands for (`fingerprint`)."""
        entry = self._entry(hash(job_id))
        return entry is not None and entry[2].fps[entry[0]] == fp

    def take(self, job_id: bytes) -> bytes | None:
        """Remove one job by ID; its data, or None when it is not here."""
        found = self._find(job_id)
        if found is None:
            return None
        chunk, pos, n, data, fresh, count = found
        if self._taken(chunk, pos, count, hash(job_id), fresh):
            self.db.execute("DELETE FROM chunks WHERE id = ?", (chunk,))
            self._forget((chunk,))
        self.bytes -= n
        self.took = (chunk, chunk)
        self._emptied()
        return data

    def take_many(self, job_ids: Collection[bytes]) -> list[bytes]:
        """Remove the jobs with these IDs that are here; their data, in no given order. As
        `take` for each, with a statement for their ID entries and one for their segments
        (a replica's SETACKs come a bus frame's worth at a time)."""
        db = self.db
        new = self.new
        at_of: dict[bytes, int] = {}  # job ID -> place
        fresh: set[bytes] = set()  # (their entry is in `new`)
        by_hash: dict[int, bytes] = {}  # the others, to look up in ids
        for job_id in job_ids:
            h = hash(job_id)
            at = new[(h >> SLICE_SHIFT) + SLICE_BIAS].get(h)
            if at is None:
                by_hash[h] = job_id
            else:
                at_of[job_id] = at
                fresh.add(job_id)
        hashes = list(by_hash)
        for i in range(0, len(hashes), MERGE_ROWS):
            part = hashes[i:i + MERGE_ROWS]
            for h, at in db.execute(f"SELECT h, at FROM ids WHERE h IN ({_marks(len(part))})",
                                    part):
                at_of[by_hash[h]] = at
        if not at_of:
            return []
        wanted = Counter(at // CHUNK for at in at_of.values())
        chunks = sorted(wanted)
        # a segment's data is read whole for WHOLE_AT of its jobs (if no larger than
        # CACHED_BYTES), else each job's bytes alone (jobs named together can lie in as
        # many segments: those a spill found by walking the registry, or a random mix)
        segs: dict[int, tuple[int, array[int], bytes | None]] = {}  # id: count, lens, data
        for i in range(0, len(chunks), MERGE_ROWS):
            part = chunks[i:i + MERGE_ROWS]
            whole = [c for c in part if wanted[c] >= WHOLE_AT]
            for chunk, count, lens_raw, data in db.execute(
                    "SELECT id, count, lens, CASE WHEN length(data) <= ?"
                    f" AND id IN ({_marks(len(whole))}) THEN data END"
                    f" FROM chunks WHERE id IN ({_marks(len(part))})",
                    (CACHED_BYTES, *whole, *part)):
                segs[chunk] = (count, _lens(lens_raw), data)
        out: list[bytes] = []
        gone: list[int] = []
        stale: list[bytes] = []  # found in `new`, in a segment that is gone
        size = 0
        for job_id, at in at_of.items():
            chunk, pos = divmod(at, CHUNK)
            seg = segs.get(chunk)
            if seg is None:
                if job_id in fresh and chunk not in gone:
                    stale.append(job_id)
                continue
            holes = self.holes.get(chunk)
            if holes is not None and pos in holes:
                continue  # (taken already)
            count, lens, blob = seg
            off = sum(lens[:pos])
            n = lens[pos]
            data = blob[off:off + n] if blob is not None else self._read_alone(chunk, off, n)
            if job_id_of(data) != job_id:
                continue  # (a hash shared with another job's)
            if self._taken(chunk, pos, count, hash(job_id), job_id in fresh):
                gone.append(chunk)  # (its last job: its other entries are stale)
                del segs[chunk]
            out.append(data)
            size += n
        if gone:
            db.execute(f"DELETE FROM chunks WHERE id IN ({_marks(len(gone))})", gone)
            self._forget(gone)
        self.bytes -= size
        self._emptied()
        lo, hi = chunks[0], chunks[-1]
        for job_id in stale:  # (as `take` does, looked up in ids: once the rest is done)
            data = self.take(job_id)
            if data is not None:
                out.append(data)
                lo, hi = min(lo, self.took[0]), max(hi, self.took[1])
        self.took = (lo, hi)  # (every job's segment is in the range: see `took`)
        return out

    def _read_alone(self, chunk: int, off: int, n: int) -> bytes:
        """n bytes at `off` of a segment's data, and only those (SQLite's incremental blob
        I/O)."""
        with self.db.blobopen("chunks", "data", chunk, readonly=True) as blob:
            blob.seek(off)
            return blob.read(n)

    def _taken(self, chunk: int, pos: int, count: int, h: int, fresh: bool) -> bool:
        """A job taken alone out of its segment (of `count` jobs), its ID entry (hash h)
        found in `new` or not: it is a hole of the segment; True when it was the segment's
        last job (the caller deletes the segment)."""
        holes = self.holes.get(chunk)
        if holes is None:
            holes = self.holes[chunk] = set()
        holes.add(pos)
        last = len(holes) >= count
        if last:
            del self.holes[chunk]
            self.chunks -= 1
        if fresh:
            del self._new_of(h)[h]
            self.fresh -= 1
        else:
            self.stale += 1  # (its entry in ids goes with the segment's)
        self.jobs -= 1
        self.read += 1
        return last

    def _segments(self, where: str, params: tuple[object, ...],
                  n: int) -> tuple[list[Segment], tuple[Any, ...] | None]:
        """Segments in the order `where` gives, until they hold n jobs; and the next
        segment's row (id, count, lens, data, first), None if there is none."""
        rows: list[Segment] = []
        jobs = 0
        for row in self.db.execute(f"SELECT id, count, lens, data, first FROM chunks {where}",
                                   params):
            if jobs >= n:
                return rows, row
            rows.append((row[0], row[1], row[2], row[3]))
            jobs += row[1]
        return rows, None

    def take_oldest(self, queue: bytes, n: int) -> tuple[list[bytes], int]:
        """Remove the oldest segments of a queue, at least n jobs if it has as many; their
        data, and the first ctime of the queue's next segment (0: none)."""
        rows, nxt = self._segments("WHERE queue = ? ORDER BY first", (queue,), n)
        return self._load(rows), int(nxt[4]) if nxt is not None else 0

    def take_due(self, now_ms: int, n: int) -> list[bytes]:
        """Remove the segments holding a job whose wake time is at or before now (about n
        jobs at most: whole segments)."""
        return self._load(self._segments("WHERE wake <= ? ORDER BY wake", (now_ms,), n)[0])

    def drop_all(self) -> None:
        self._reset()

    def sweep(self) -> None:
        """Remove the stale ID entries of one slice of the hash space, while they outnumber
        the live ones (a long backlog that never empties)."""
        if self.stale <= self.jobs + SWEEP_SLACK:
            return
        lo, hi = _slice(self._sweep, SWEEP_SLICES)
        self._sweep = (self._sweep + 1) % SWEEP_SLICES
        cur = self.db.execute("DELETE FROM ids WHERE h BETWEEN ? AND ? AND at / ? NOT IN"
                              " (SELECT id FROM chunks)", (lo, hi, CHUNK))
        self.stale = max(0, self.stale - max(cur.rowcount, 0))
        if self._sweep == 0:
            self.stale = 0  # (a whole pass: none left, whatever the count said)

    # ------------------------------------------------------------------ reads
    def _split(self, row: Segment) -> list[bytes]:
        """The data of the jobs of a segment (id, count, lens, data) not taken already."""
        chunk, count, lens_raw, data = row
        taken = self.holes.get(chunk, ())
        lens = _lens(lens_raw)
        out: list[bytes] = []
        off = 0
        for pos in range(count):
            n = lens[pos]
            if pos not in taken:
                out.append(data[off:off + n])
            off += n
        return out

    def _jobs_of(self, rows: list[Segment]) -> list[bytes]:
        """The data of the jobs of segments not taken, left in place."""
        return [d for row in rows for d in self._split(row)]

    def peek(self, queue: bytes, n: int, newest: bool = False) -> list[bytes]:
        """At least the n oldest (or newest) jobs of a queue if it has as many, left in
        place (whole segments: the caller sorts and cuts)."""
        order = "DESC" if newest else "ASC"
        return self._jobs_of(self._segments(f"WHERE queue = ? ORDER BY first {order}",
                                            (queue,), n)[0])

    def scan(self, after: int, n: int) -> tuple[int, list[bytes]]:
        """The jobs of the segments past segment `after` (at least n if there are as
        many), and the segment to go on after (0: the end): a resumable walk (JSCAN, the
        AOF rewrite)."""
        rows, nxt = self._segments("WHERE id > ? ORDER BY id", (after,), n)
        return (rows[-1][0] if nxt is not None else 0), self._jobs_of(rows)

    def scan_listing(self, after: int, n: int, nodes: Collection[bytes],
                     end: int) -> tuple[int, list[tuple[bytes, bytes]]]:
        """Walk the segments past segment `after`, up to segment `end` (about n jobs): the
        copyable jobs that list any of `nodes` (each its ID and its listed nodes' IDs,
        concatenated), and the segment to go on after (0: the end). A job taken alone (a
        hole) is named too: it is in memory, where the walk looks it up; a walk that
        passed its registry shard before it came back finds it only here (repair)."""
        ids: list[tuple[bytes, bytes]] = []
        jobs = 0
        last = after
        for chunk, count, meta in self.db.execute(
                "SELECT id, count, meta FROM chunks WHERE id > ? AND id <= ? ORDER BY id",
                (after, end)):
            if jobs >= n:
                return last, ids
            for job_id, listed, copyable in _unpackb(meta, use_list=False):
                if copyable and any(node in listed for node in nodes):
                    ids.append((job_id, listed))
            jobs += count
            last = chunk
        return 0, ids


_INSERTS: dict[int, str] = {}


class _Segment:
    """A segment looked up in by ID (`OverflowStore.cached`)."""

    __slots__ = ("count", "data", "fps", "id", "lens", "reads")

    def __init__(self, chunk: int, count: int, lens_raw: bytes, fps_raw: bytes) -> None:
        self.id = chunk
        self.count = count
        self.lens = _lens(lens_raw)  # the lengths of its jobs' data
        self.fps = array("q")  # the fingerprints of its jobs' listed nodes
        self.fps.frombytes(fps_raw)
        self.data = b""  # read once a second job of it is (if no more than CACHED_BYTES)
        self.reads = 0  # jobs read from it by ID


def _lens(raw: bytes) -> array[int]:
    """A segment's `lens` column: the lengths of its jobs' data."""
    lens = array("I")
    lens.frombytes(raw)
    return lens


def _marks(n: int) -> str:
    """n comma-separated SQL parameters."""
    return ", ".join("?" * n)


def _insert_ids(n: int) -> str:
    """The statement adding (or replacing) n entries of ids (made once for each n)."""
    sql = _INSERTS.get(n)
    if sql is None:
        sql = _INSERTS[n] = "INSERT OR REPLACE INTO ids VALUES " + ", ".join(["(?, ?)"] * n)
    return sql


def _slice(i: int, slices: int) -> tuple[int, int]:
    """The bounds (both in) of slice i of the signed 64-bit hash space cut in `slices`
    (the last one ends at the largest hash: 2**63 itself is no SQLite integer)."""
    width = (1 << 64) // slices
    lo = -(1 << 63) + i * width
    return lo, (lo + width - 1 if i < slices - 1 else (1 << 63) - 1)


_ctime_of = itemgetter(2)  # a Row's ctime


def _remove(path: str) -> None:
    for p in (path, path + "-journal", path + "-wal", path + "-shm"):
        with contextlib.suppress(FileNotFoundError):
            os.remove(p)
