"""OverflowStore: the jobs a node moved to disk, in one SQLite file.

Why SQLite rather than hand-written segment files: an overflowed job must still be found by
its ID (SHOW, ACKJOB, DELJOB, a SETACK from another node), by its queue in FIFO order (the
refill), and by its expiry (TTL). Segment files read back in order serve the second only; an
ID index and an expiry index over millions of jobs, kept within a memory budget and
consistent on a failed write, is what SQLite's B-trees already are. The file lives in the
page cache (no fsync, no memory map: its pages are not the node's RSS); SQLite's own cache is
capped (`CACHE_KIB`).

What the file is: a cache of memory, never the source of truth. It is deleted when the store
opens (at start, and when overflow is turned on): without AOF a restarted node starts empty
(as it always does; re-replication refills it), with AOF every job comes back from the AOF
and overflows again as it loads. So a torn file after a kill -9, or one deleted by hand, is
never read. A file deleted by hand while the node runs keeps working (the node holds it
open) and its space is freed when the store closes.

A full disk or the size cap (`max_bytes`, SQLite's max_page_count) makes a write fail with
SQLITE_FULL: the batch is rolled back (the rollback journal is kept in memory) and
`OverflowFull` is raised; nothing in the file changes.

Rows: id, queue (empty for a job not queued here: never part of a queue's order), ctime (the
queue order), wake (ms: when the job's timer wants it back: its expiry, or for an active job
its requeue), nodes (the IDs of the nodes listed for the job, concatenated) and copyable (1 if
re-replication and repair may copy it), for the walks that look for the jobs listing a node
without reading every job (`scan_listing`), data (the job, disque.overflow.record).
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from collections.abc import Collection, Iterable

CACHE_KIB = 8192  # SQLite's page cache, KiB

_SCHEMA = (
    "CREATE TABLE jobs (id BLOB NOT NULL, queue BLOB NOT NULL, ctime INTEGER NOT NULL,"
    " wake INTEGER NOT NULL, nodes BLOB NOT NULL, copyable INTEGER NOT NULL,"
    " data BLOB NOT NULL)",
    "CREATE UNIQUE INDEX jobs_id ON jobs (id)",
    "CREATE INDEX jobs_queue ON jobs (queue, ctime)",
    "CREATE INDEX jobs_wake ON jobs (wake)",
)

# id, queue, ctime, wake, nodes, copyable, data
Row = tuple[bytes, bytes, int, int, bytes, int, bytes]


class OverflowFull(Exception):
    """The disk is full or the size cap is reached: the write did not happen."""


class OverflowStore:
    """The on-disk part of a node's jobs (see the module docstring)."""

    def __init__(self, path: str, max_bytes: int = 0) -> None:
        self.path = path
        _remove(path)
        self.db = sqlite3.connect(path, isolation_level=None)
        self.db.execute("PRAGMA journal_mode=MEMORY")
        self.db.execute("PRAGMA synchronous=OFF")
        self.db.execute("PRAGMA temp_store=MEMORY")
        self.db.execute(f"PRAGMA cache_size=-{CACHE_KIB}")
        for statement in _SCHEMA:
            self.db.execute(statement)
        self.page_size: int = self.db.execute("PRAGMA page_size").fetchone()[0]
        self.set_max_bytes(max_bytes)
        self.jobs = 0  # rows now
        self.bytes = 0  # their data bytes
        self.written = 0  # jobs written since start
        self.read = 0  # jobs read back since start

    def set_max_bytes(self, max_bytes: int) -> None:
        """0: no cap (SQLite's own maximum)."""
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
        """Add jobs in one transaction; OverflowFull (and nothing added) when it does not
        fit."""
        db = self.db
        try:
            db.execute("BEGIN")
            db.executemany("INSERT INTO jobs VALUES (?, ?, ?, ?, ?, ?, ?)", rows)
            db.execute("COMMIT")
        except sqlite3.Error as exc:
            with contextlib.suppress(sqlite3.Error):
                db.execute("ROLLBACK")
            if _is_full(exc):
                raise OverflowFull(str(exc)) from exc
            raise
        self.jobs += len(rows)
        self.bytes += sum(len(r[6]) for r in rows)
        self.written += len(rows)

    def _take(self, found: list[tuple[int, bytes]]) -> list[bytes]:
        """Delete the rows found (rowid, data); their data."""
        if not found:
            return []
        db = self.db
        db.execute("BEGIN")
        try:
            db.executemany("DELETE FROM jobs WHERE rowid = ?", [(r[0],) for r in found])
            db.execute("COMMIT")
        except sqlite3.Error:
            with contextlib.suppress(sqlite3.Error):
                db.execute("ROLLBACK")
            raise
        data = [r[1] for r in found]
        self.jobs -= len(data)
        self.bytes -= sum(len(d) for d in data)
        self.read += len(data)
        return data

    def take(self, job_id: bytes) -> bytes | None:
        """Remove one job by ID; its data, or None when it is not here."""
        found = self.db.execute("SELECT rowid, data FROM jobs WHERE id = ?",
                                (job_id,)).fetchall()
        taken = self._take(found)
        return taken[0] if taken else None

    def take_oldest(self, queue: bytes, n: int) -> tuple[list[bytes], int]:
        """Remove the n oldest jobs of a queue (ctime order); their data, and the ctime of
        the queue's oldest job left here (0: none)."""
        found = self.db.execute(
            "SELECT rowid, data, ctime FROM jobs WHERE queue = ? ORDER BY ctime LIMIT ?",
            (queue, n + 1)).fetchall()
        next_ctime = found[n][2] if len(found) > n else 0
        return self._take([(r[0], r[1]) for r in found[:n]]), next_ctime

    def take_due(self, now_ms: int, n: int) -> list[bytes]:
        """Remove up to n jobs whose wake time is at or before now."""
        found = self.db.execute("SELECT rowid, data FROM jobs WHERE wake <= ? LIMIT ?",
                                (now_ms, n)).fetchall()
        return self._take(found)

    def drop_all(self) -> None:
        self.db.execute("DELETE FROM jobs")
        self.jobs = self.bytes = 0

    # ------------------------------------------------------------------ reads
    def has(self, job_id: bytes) -> bool:
        return self.db.execute("SELECT 1 FROM jobs WHERE id = ?", (job_id,)).fetchone() \
            is not None

    def peek(self, queue: bytes, n: int, newest: bool = False) -> list[bytes]:
        """The n oldest (or newest) jobs of a queue, left in place."""
        order = "DESC" if newest else "ASC"
        rows = self.db.execute(
            f"SELECT data FROM jobs WHERE queue = ? ORDER BY ctime {order} LIMIT ?",
            (queue, n)).fetchall()
        return [r[0] for r in rows]

    def first_ctime(self, queue: bytes) -> int:
        row = self.db.execute("SELECT min(ctime) FROM jobs WHERE queue = ?",
                              (queue,)).fetchone()
        return int(row[0]) if row and row[0] is not None else 0

    def scan(self, after: int, n: int) -> list[tuple[int, bytes]]:
        """Up to n rows (rowid, data) past rowid `after`, in rowid order: a resumable walk
        (JSCAN, the AOF rewrite)."""
        rows = self.db.execute("SELECT rowid, data FROM jobs WHERE rowid > ? ORDER BY rowid"
                               " LIMIT ?", (after, n)).fetchall()
        return [(int(r[0]), r[1]) for r in rows]

    def scan_listing(self, after: int, n: int,
                     nodes: Collection[bytes]) -> tuple[int, list[bytes]]:
        """Walk up to n rows past rowid `after`: the IDs of the copyable jobs that list
        any of `nodes`, and the rowid to go on after (0: the end)."""
        listing = " OR ".join(["instr(nodes, ?) > 0"] * len(nodes)) or "0"
        rows = self.db.execute(
            f"SELECT rowid, CASE WHEN copyable AND ({listing}) THEN id END FROM jobs"
            " WHERE rowid > ? ORDER BY rowid LIMIT ?", (*nodes, after, n)).fetchall()
        nxt = int(rows[-1][0]) if len(rows) >= n else 0
        return nxt, [r[1] for r in rows if r[1] is not None]

    def queues(self) -> Iterable[tuple[bytes, int]]:
        """(queue, jobs here) for every queue with jobs here."""
        return [(r[0], int(r[1])) for r in
                self.db.execute("SELECT queue, count(*) FROM jobs GROUP BY queue")]


def _is_full(exc: sqlite3.Error) -> bool:
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None:
        return int(code) & 0xFF == sqlite3.SQLITE_FULL
    return "full" in str(exc)


def _remove(path: str) -> None:
    for p in (path, path + "-journal", path + "-wal", path + "-shm"):
        with contextlib.suppress(FileNotFoundError):
            os.remove(p)
