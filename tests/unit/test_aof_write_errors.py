"""AppendOnlyFile when the disk is full (issue 25): the writer alone, on a real small
filesystem (tests/smalldisk.py), no server and no event loop (`call_soon` only collects).

A write that stops in the middle of a record is cut back to the last whole record; the
records stay in the buffer and a later attempt writes them whole; the jobs added meanwhile
are handed to `on_failed`, the `confirm` waiters are told; the cause is logged at most once
a second (the clock is injected). Under `always` nothing is confirmed before its fsync.
After failed rewrites in a row, automatic ones back off (`rewrite_backoff`).

Under a file-size limit (the fallback kind) the limit is set on this process for the length
of a test: structlog output is captured (`capture_logs`), so nothing else writes meanwhile.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from disque.aof import check
from disque.aof.format import parse_record
from disque.aof.manager import rewrite_backoff
from disque.aof.writer import AppendOnlyFile, Rewrite
from disque.jobs.job import ACTIVE, Job
from disque.jobs.serialize import deserialize_job
from disque.node import Node
from tests.smalldisk import SmallDisk, small_disk

MYID = b"0123abcd" + b"e" * 32
T0 = 1_700_000_000_000


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[SmallDisk]:
    with small_disk(tmp_path / "disk", size_mb=1) as d:
        d.attach(os.getpid())
        try:
            yield d
        finally:
            d.free()


def job(i: int, size: int = 3001) -> Job:
    """A job whose record is ~3 KB and no multiple of a block: a full disk cuts it."""
    return Job(b"D-0123abcd-%024d-05a1" % i, b"q", b"x" * size, 1, T0 * 1_000_000,
               T0 + 3_600_000, 0, 30, (MYID,))


def new_aof(path: Path, policy: str = "no", **kw: Any) -> AppendOnlyFile:
    scheduled: list[Callable[[], None]] = []
    return AppendOnlyFile(str(path / "disque.aof"), policy, scheduled.append, lambda: None,
                          **kw)


def ids_in(path: str) -> list[bytes]:
    data = Path(path).read_bytes()
    out, pos = [], 0
    while pos < len(data):
        argv, pos = parse_record(data, pos, pos)
        out.append(deserialize_job(argv[1])[0].id)
    return out


def error_of(disk: SmallDisk) -> str:
    return "File too large" if disk.kind == "fsize" else "No space left on device"


def test_a_write_stopped_mid_record_is_cut_back_and_later_written_whole(
        disk: SmallDisk) -> None:
    aof = new_aof(disk.path)
    disk.fill(leave=10_000)
    jobs = []
    with capture_logs() as logs:
        for i in range(40):  # 120 KB of records for 10 KB of room
            jobs.append(job(i))
            aof.loadjob(jobs[-1])
            if not aof.flush():
                break
        else:
            raise AssertionError("the disk never filled")
        assert aof.last_write_error == error_of(disk)
        (failure,) = [e for e in logs if e["event"] == "aof.write_failed"]
        assert failure["partial_write_bytes"] > 0  # it did stop in the middle of a record
        size = os.path.getsize(aof.path)
        assert size == aof.current_size
        records, end, reason = check.scan(aof.path)
        assert (reason, end) == (None, size)  # ... and that half record is gone
        assert ids_in(aof.path) == [j.id for j in jobs[:-1]]

        assert not aof.flush()  # still full: the retry fails the same way, cut again
        assert check.scan(aof.path) == (records, size, None)

        disk.free()
        assert aof.flush()
        assert aof.last_write_error is None
        assert [e["event"] for e in logs][-1] == "aof.write_recovered"
    assert ids_in(aof.path) == [j.id for j in jobs]  # each once, in order
    aof.close()


def test_jobs_added_whose_record_was_not_written_are_cancelled_and_waiters_told(
        disk: SmallDisk) -> None:
    cancelled: list[Job] = []
    aof = new_aof(disk.path, on_failed=cancelled.extend)
    disk.fill(leave=0)
    told: list[bool] = []
    with capture_logs():
        added = job(1)
        aof.addjob(added)
        aof.loadjob(job(2))  # a copy held for another node: not this node's to cancel
        aof.confirm(told.append)
        assert not aof.flush()
        assert cancelled == [added] and told == [False]
        assert aof.pending()  # the records wait for the retry

        again: list[bool] = []
        aof.confirm(again.append)
        assert not aof.flush()
        assert again == [False] and cancelled == [added]  # cancelled once
        disk.free()
        aof.confirm(again.append)
        assert aof.flush() and again == [False, True]
        assert not aof.pending()
        told.clear()
        aof.confirm(told.append)  # nothing pending: at once
        assert told == [True]
    aof.close()


def test_a_failing_aof_is_logged_at_most_once_a_second(disk: SmallDisk) -> None:
    now = [0.0]
    aof = new_aof(disk.path, clock=lambda: now[0])
    disk.fill(leave=0)
    with capture_logs() as logs:
        aof.loadjob(job(1))
        for _ in range(5):
            assert not aof.flush()
        now[0] = 0.99
        assert not aof.flush()
        now[0] = 1.0
        assert not aof.flush()
        failed = [e for e in logs if e["event"] == "aof.write_failed"]
        assert [e["failed_attempts"] for e in failed] == [1, 7]
        assert aof.write_errors == 7
        disk.free()
        assert aof.flush()
        assert [e["event"] for e in logs].count("aof.write_recovered") == 1
    aof.close()


def test_under_always_nothing_is_confirmed_before_its_fsync(tmp_path: Path) -> None:
    aof = new_aof(tmp_path, "always")
    told: list[bool] = []
    aof.addjob(job(1))
    aof.confirm(told.append)
    assert aof.flush(fsync=False)  # written, not fsynced
    assert told == [] and aof.pending() and aof.unconfirmed
    assert aof.flush(fsync=True)
    assert told == [True] and not aof.pending() and not aof.unconfirmed
    aof.close()


def test_a_cut_write_after_a_rewrite_leaves_no_hole_in_the_aof(disk: SmallDisk) -> None:
    """The rewritten file's descriptor replaces the AOF's: a write cut back there must not
    leave the next one past the end of the file (a hole of NULs: a corrupt AOF)."""
    node = Node(MYID, lambda: T0)
    for i in range(10):
        kept = job(1000 + i)
        kept.state = ACTIVE
        node.register(kept)
    aof = new_aof(disk.path)
    outcome: list[bool] = []
    Rewrite(node.jobs, aof.path, str(disk.path / "temp.aof"), aof,
            lambda ok, why: outcome.append(ok)).run_to_end()
    assert outcome == [True]
    assert len(ids_in(aof.path)) == 10
    disk.fill(leave=10_000)
    jobs = []
    with capture_logs():
        for i in range(40):
            jobs.append(job(i))
            aof.loadjob(jobs[-1])
            if not aof.flush():
                break
        assert not aof.flush()
        disk.free()
        assert aof.flush()
    data = Path(aof.path).read_bytes()
    assert check.scan(aof.path)[1:] == (len(data), None)
    assert ids_in(aof.path)[10:] == [j.id for j in jobs]
    aof.close()


def test_automatic_rewrites_back_off_after_three_failures_in_a_row() -> None:
    assert [rewrite_backoff(n) for n in range(11)] == [
        0, 0, 0, 60, 120, 240, 480, 960, 1920, 3600, 3600]
