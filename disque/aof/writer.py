"""AppendOnlyFile: buffers records, writes them before a reply or a GOTJOB confirms them
(else once per loop iteration), fsyncs by policy, and rewrites the file from the live state.

fsync policies:
- `always`: replies of commands that logged something are held until the records are
  written and fsynced; one write + one fsync per loop iteration serves every client of that
  iteration (group commit).
- `everysec`: a background thread fsyncs once a second. A write that something waits for
  (a reply, a GOTJOB) is done at once, even while that fsync runs; any other write waits
  for it, up to 2 s (a slow disk), then goes ahead and `aof_delayed_fsync` counts it, as
  Redis does. A killed process loses nothing confirmed; a machine crash, at most ~1-2 s.
- `no`: the kernel decides.

Write errors (a full disk: ENOSPC, EFBIG under a file-size limit, EIO): nothing that is not
written is confirmed. A write that stopped in the middle of a record is cut back to the
last whole record (`ftruncate` to `current_size`, as Redis does; if even that fails, the
written part is dropped from the buffer so the retry completes the record), the records stay
in the buffer, and every later attempt writes them again (with the fsync the policy owes)
until one succeeds. Meanwhile `last_write_error` is set: the server refuses new jobs with
-MISCONF. Jobs this node added (`addjob`) whose record was not written are handed to
`on_failed`, which cancels them: their clients are answered -MISCONF, never with an ID. Who
needs to know that what was logged so far is written registers with `confirm`. The cause is
logged at most once a second. A failed fsync is retried the same way and, as in Redis, its
later success counts as recovery, although after an I/O error Linux may have dropped pages
the failed fsync did not write: an EIO is worth a look at the disk and disque-check-aof.

Rewrite: the registry is walked shard by shard in small steps on the event loop, each job
written as a LOADJOB to `temp-rewriteaof-bg-<pid>.aof`; records logged meanwhile go to both
the live AOF and a rewrite buffer, appended to the new file at the end; then fsync, rename
over the AOF, fsync of the directory, and the live file handle switches to the new file.
"""

from __future__ import annotations

import fcntl
import os
import threading
import time
from collections.abc import Callable, Mapping
from typing import Protocol

import structlog

from disque.aof.format import ackjob_record, deljob_record, loadjob_record
from disque.jobs.job import ACKED, ACTIVE, F_DUMMY, QUEUED, Job
from disque.latency import AOF_FSYNC_ALWAYS, AOF_WRITE, OFF, LatencyMonitor

log = structlog.get_logger("disque.aof")

REWRITE_JOBS_PER_STEP = 2000  # a step writes whole shards until this many jobs are done
INCREMENTAL_FSYNC_BYTES = 32 * 1024 * 1024  # aof-rewrite-incremental-fsync


def fsync_dir(path: str) -> None:
    fd = os.open(os.path.dirname(os.path.abspath(path)) or ".", os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_all(fd: int, data: bytes | bytearray | memoryview) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


class PartialWrite(Exception):
    """os.write failed after `written` bytes of the buffer had reached the file."""

    def __init__(self, error: OSError, written: int) -> None:
        super().__init__(str(error))
        self.error = error
        self.written = written


def write_counted(fd: int, data: bytes | bytearray) -> None:
    """write_all, telling on failure how much was written (PartialWrite)."""
    total = len(data)
    try:
        written = os.write(fd, data)
    except OSError as exc:
        raise PartialWrite(exc, 0) from None
    if written == total:
        return
    view = memoryview(data)  # (released before the caller may resize a bytearray)
    try:
        while written < total:
            written += os.write(fd, view[written:])
    except OSError as exc:
        raise PartialWrite(exc, written) from None
    finally:
        view.release()


ERROR_LOG_INTERVAL = 1.0  # seconds between two log lines about the same failing AOF


class AppendOnlyFile:
    """The node's `persist` sink while appendonly is on (or while a rewrite runs)."""

    def __init__(self, path: str, policy: str, call_soon: Callable[[Callable[[], None]], object],
                 on_flushed: Callable[[], None], wait_rewrite: bool = False,
                 latency: LatencyMonitor | None = None,
                 on_failed: Callable[[list[Job]], None] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.path = path
        # slow writes and `always` fsyncs are recorded there
        self.latency = latency if latency is not None else LatencyMonitor.disabled()
        self.policy = policy
        self.call_soon = call_soon
        self.on_flushed = on_flushed  # releases replies held for `always`
        # cancels the jobs added here whose LOADJOB could not be written (see flush)
        self.on_failed = on_failed
        self.clock = clock  # for the once-a-second error log
        # None while the first rewrite creates the file (CONFIG SET appendonly yes): records
        # then only go to the rewrite buffer.
        self.fd: int | None = (None if wait_rewrite else
                               os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644))
        self.buf = bytearray()
        self.flush_scheduled = False
        self.current_size = os.fstat(self.fd).st_size if self.fd is not None else 0
        self.base_size = self.current_size
        # The last write (or fsync) failed and was not retried with success yet.
        self.write_error: str | None = None
        self.fsync_error: str | None = None
        # either of them (read on every command: a plain attribute, see set_write_error)
        self.last_write_error: str | None = None
        self.error_lock = threading.Lock()
        self.write_errors = 0  # failed write or fsync attempts since start (INFO)
        self.error_logged_at = -ERROR_LOG_INTERVAL
        self.appended = 0  # records logged so far: a command compares it to see if it logged
        # Jobs added by this node (`addjob`) whose record is not confirmed yet (written, and
        # fsynced under `always`): cancelled if that fails, as their clients are told.
        self.unconfirmed: list[Job] = []
        self.waiters: list[Callable[[bool], None]] = []  # see confirm()
        self.delayed_fsync = 0
        self.postponed_since = 0.0
        # rewrite state
        self.rewrite_buf: bytearray | None = None
        self.rewrite: Rewrite | None = None
        self.last_rewrite_time = -1
        self.last_rewrite_ok = True
        # everysec fsync thread
        self.fd_lock = threading.Lock()
        self.fsync_running = False
        self.dirty = False
        self.dirty_since = 0.0  # monotonic time of the oldest write not yet fsynced (metrics)
        self.no_fsync_on_rewrite = False  # no-appendfsync-on-rewrite
        self.stopping = threading.Event()
        self.thread: threading.Thread | None = None
        if policy == "everysec":
            self.start_fsync_thread()

    # ------------------------------------------------------------------ records
    def loadjob(self, job: Job) -> None:
        self.append(loadjob_record(job))

    def addjob(self, job: Job) -> None:
        """A job this node just created for a client (ADDJOB, ADDJOBS): its LOADJOB, and
        the job is cancelled if that record cannot be written."""
        self.unconfirmed.append(job)
        self.append(loadjob_record(job))

    def deljob(self, job_id: bytes) -> None:
        self.append(deljob_record(job_id))

    def ackjob(self, job: Job) -> None:
        self.append(ackjob_record(job))

    def rewrite_note(self, job: Job) -> None:
        """While a rewrite runs, the job's current record goes to the rewritten file only
        (a job that moved between memory and disk, disque.overflow: the rewrite's walk
        may have missed it; the live file has it already)."""
        if self.rewrite_buf is not None and job.state in (ACTIVE, QUEUED):
            self.rewrite_buf += loadjob_record(job)

    def append(self, record: bytes) -> None:
        self.appended += 1
        if self.fd is not None:
            self.buf += record
        if self.rewrite_buf is not None:
            self.rewrite_buf += record
        if not self.flush_scheduled:
            self.flush_scheduled = True
            self.call_soon(self.flush_and_release)

    @property
    def hold_replies(self) -> bool:
        return self.policy == "always"

    def set_write_error(self, error: str | None) -> None:
        """Why the last write failed; None once a retry succeeded."""
        with self.error_lock:
            self.write_error = error
            self.last_write_error = error or self.fsync_error

    def set_fsync_error(self, error: str | None) -> None:
        """The same for the last fsync (also set by the everysec thread)."""
        with self.error_lock:
            self.fsync_error = error
            self.last_write_error = self.write_error or error

    def pending(self) -> bool:
        """Whether something logged is not confirmed yet (see confirm)."""
        return bool(self.buf) or self.last_write_error is not None or (
            self.policy == "always" and self.dirty and not self.skip_fsync())

    def confirm(self, waiter: Callable[[bool], None]) -> None:
        """Call `waiter(True)` once everything logged so far is written (and fsynced under
        `always`), `waiter(False)` if that fails (the records then wait for a retry)."""
        if not self.pending():
            waiter(True)
            return
        self.waiters.append(waiter)
        if not self.flush_scheduled:
            self.flush_scheduled = True
            self.call_soon(self.flush_and_release)

    # ------------------------------------------------------------------ writing
    def flush_and_release(self) -> None:
        self.flush_scheduled = False
        # someone waits for these records (a reply, a GOTJOB): no postponing behind a fsync
        self.flush(fsync=self.policy == "always", force=bool(self.waiters))
        self.on_flushed()

    def flush(self, fsync: bool = False, force: bool = False) -> bool:
        """Write the buffer (and fsync if asked); False (buffer kept) if writing failed.

        While a previous attempt failed, every attempt is a full retry: the write and the
        fsync the failure left owing; only its success clears the error."""
        failing = self.last_write_error is not None
        if failing:
            force = True
            fsync = fsync or self.fsync_error is not None
        if self.buf and self.fd is not None:
            if (self.policy == "everysec" and self.fsync_running and not force
                    and not fsync):
                # A background fsync is in progress: a write() now could block on it.
                now = time.monotonic()
                if not self.postponed_since:
                    self.postponed_since = now
                if now - self.postponed_since < 2.0:
                    return True  # kept; the cron flushes again shortly
                self.delayed_fsync += 1
            self.postponed_since = 0.0
            started = self.latency.start()
            try:
                write_counted(self.fd, self.buf)
            except PartialWrite as exc:
                self.set_write_error(exc.error.strerror or str(exc.error))
                self.cut_partial(exc.written)
                self.failed("write", exc.error, exc.written)
                return False
            self.latency.end(AOF_WRITE, started)
            if self.write_error is not None:
                self.set_write_error(None)
            self.current_size += len(self.buf)
            self.buf.clear()
            if not self.dirty:
                self.dirty_since = time.monotonic()
            self.dirty = True
        if fsync and self.dirty and self.fd is not None and not self.skip_fsync():
            started = self.latency.start() if self.policy == "always" else OFF
            try:
                os.fsync(self.fd)
            except OSError as exc:
                self.set_fsync_error(exc.strerror or str(exc))
                self.failed("fsync", exc)
                return False
            self.latency.end(AOF_FSYNC_ALWAYS, started)
            self.dirty = False
            if self.fsync_error is not None:
                self.set_fsync_error(None)
        if failing and self.last_write_error is None:
            log.warning("aof.write_recovered", path=self.path, failed_attempts=self.write_errors)
        if not self.buf and (self.policy != "always" or not self.dirty or self.skip_fsync()):
            self.confirmed()
        return True

    def cut_partial(self, written: int) -> None:
        """A write failed after `written` bytes: take the file back to its last whole record
        so that the retry does not leave half a record in the middle of the AOF."""
        if not written or self.fd is None:
            return
        try:
            os.ftruncate(self.fd, self.current_size)
            # (the rewritten file's descriptor is not O_APPEND everywhere: without this the
            # next write would land past the end, leaving a hole of NULs in the AOF)
            os.lseek(self.fd, self.current_size, os.SEEK_SET)
        except OSError as exc:
            # Cannot cut it (Redis does the same): keep what was written and retry with the
            # rest only, so the record still ends whole.
            log.warning("aof.truncate_failed", path=self.path, error=exc.strerror,
                        kept_bytes=written)
            self.current_size += written
            del self.buf[:written]
            if not self.dirty:
                self.dirty_since = time.monotonic()
            self.dirty = True

    def failed(self, op: str, exc: OSError, cut: int = 0) -> None:
        """A write or fsync failed: log it (once a second at most), cancel the jobs added
        here that were not confirmed, tell the waiters."""
        self.write_errors += 1
        now = self.clock()
        if now - self.error_logged_at >= ERROR_LOG_INTERVAL:
            self.error_logged_at = now
            log.warning("aof.write_failed", op=op, error=exc.strerror or str(exc),
                        errno=exc.errno, path=self.path, pending_bytes=len(self.buf),
                        partial_write_bytes=cut, failed_attempts=self.write_errors)
        jobs = self.unconfirmed
        if jobs:
            self.unconfirmed = []
            if self.on_failed is not None:
                self.on_failed(jobs)
        self._wake_waiters(False)

    def confirmed(self) -> None:
        if self.unconfirmed:
            self.unconfirmed.clear()
        self._wake_waiters(True)

    def _wake_waiters(self, written: bool) -> None:
        waiters = self.waiters
        if waiters:
            self.waiters = []
            for w in waiters:
                w(written)

    def start_fsync_thread(self) -> None:
        self.thread = threading.Thread(target=self._fsync_loop, name="aof-fsync",
                                       daemon=True)
        self.thread.start()

    def _fsync_loop(self) -> None:
        while not self.stopping.wait(1.0):
            if not self.dirty or self.skip_fsync():
                continue
            with self.fd_lock:
                fd = self.fd
                if fd is None:
                    continue
                self.fsync_running = True
                self.dirty = False
                try:
                    os.fsync(fd)
                    if self.fsync_error is not None:
                        self.set_fsync_error(None)
                except OSError as exc:
                    # owed again: the loop's next flush retries it (see flush)
                    self.dirty = True
                    if self.fsync_error is None:
                        log.warning("aof.fsync_failed", error=exc.strerror, errno=exc.errno,
                                    path=self.path)
                    self.set_fsync_error(exc.strerror or str(exc))
                    self.write_errors += 1
                finally:
                    self.fsync_running = False

    def skip_fsync(self) -> bool:
        """no-appendfsync-on-rewrite: while a rewrite writes its big file, do not compete
        for the disk with fsyncs of the live AOF (at the price of durability meanwhile)."""
        return self.no_fsync_on_rewrite and self.rewrite is not None

    def set_policy(self, policy: str) -> None:
        self.flush(fsync=True, force=True)
        self.policy = policy
        if policy == "everysec" and self.thread is None:
            self.start_fsync_thread()

    def close(self) -> None:
        """Write and fsync what is buffered, stop the thread, close the file."""
        self.flush(fsync=True, force=True)
        self.stopping.set()
        if self.thread is not None:
            self.thread.join(timeout=5)
        if self.rewrite is not None:
            self.rewrite.abort()
        with self.fd_lock:
            if self.fd is not None:
                os.close(self.fd)
                self.fd = None

    # ------------------------------------------------------------------ rewrite
    def switch_to(self, new_fd: int, size: int) -> None:
        """The rewritten file replaced ours: append to it from now on. It holds the live
        state plus every record logged during the rewrite and is fsynced, so whatever the
        buffer still held after a failed write is in it: done, and the error with it."""
        # appends from now on, as the file it replaces (see cut_partial)
        fcntl.fcntl(new_fd, fcntl.F_SETFL, fcntl.fcntl(new_fd, fcntl.F_GETFL) | os.O_APPEND)
        with self.fd_lock:
            old = self.fd
            self.fd = new_fd
            if old is not None:
                os.close(old)
        self.current_size = self.base_size = size
        self.dirty = False
        self.buf.clear()
        if self.last_write_error is not None:
            log.warning("aof.write_recovered", path=self.path, by="rewrite",
                        failed_attempts=self.write_errors)
        self.set_write_error(None)
        self.set_fsync_error(None)
        self.confirmed()


class JobShards(Protocol):
    """The registry as a rewrite walks it: a shard at a time (see disque.scan.ScanDict)."""

    def shard_count(self) -> int: ...

    def shard(self, index: int) -> Mapping[bytes, Job]: ...


def write_snapshot(jobs: JobShards, fd: int, start: int, budget: int) -> tuple[int, int]:
    """Write a LOADJOB for every active, queued or acked job (acked: without its body; not
    dummy ACKs) of the registry shards from `start` until `budget` jobs were looked at;
    returns (next shard, bytes written)."""
    out = bytearray()
    n = jobs.shard_count()
    i = start
    seen = 0
    while i < n and seen < budget:
        shard = jobs.shard(i)
        seen += len(shard) + 1
        for job in shard.values():
            state = job.state
            if state in (ACTIVE, QUEUED):
                out += loadjob_record(job)
            elif state == ACKED and not job.flags & F_DUMMY:
                out += ackjob_record(job)
        i += 1
    if out:
        write_all(fd, out)
    return i, len(out)


DiskWalk = Callable[[int, int], tuple[int, list[Job]]]


class Rewrite:
    """One AOF rewrite from the live registry, in steps on the event loop."""

    def __init__(self, jobs: JobShards, path: str, temp_path: str, aof: AppendOnlyFile | None,
                 done: Callable[[bool, str], None], incremental_fsync: bool = True,
                 disk: DiskWalk | None = None) -> None:
        self.jobs = jobs
        # the jobs on disk (disque.overflow), walked after the registry: (row to go on
        # after, 0 at the end; jobs) from a row
        self.disk = disk
        self.disk_after = -1  # -1: the registry's walk is not over
        # absolute: a CONFIG SET dir meanwhile must not make the final rename miss the file
        self.path = os.path.abspath(path)
        self.temp_path = os.path.abspath(temp_path)
        self.aof = aof
        self.done = done
        self.cursor = 0
        self.started = time.monotonic()
        self.fd = os.open(temp_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        self.size = 0
        self.synced_size = 0
        self.incremental_fsync = incremental_fsync
        self.finished = False
        if aof is not None:
            aof.rewrite = self
            aof.rewrite_buf = bytearray()

    def step(self) -> bool:
        """Write the next batch of shards; True when the rewrite is complete."""
        n = self.jobs.shard_count()
        if self.cursor < n:
            end, written = write_snapshot(self.jobs, self.fd, self.cursor,
                                          REWRITE_JOBS_PER_STEP)
            self.cursor = end
        else:
            end, written = n, self._disk_step()
        self.size += written
        if self.incremental_fsync and self.size - self.synced_size >= INCREMENTAL_FSYNC_BYTES:
            os.fsync(self.fd)  # many small fsyncs instead of one huge one at the end
            self.synced_size = self.size
        if end >= n:
            if self.disk is not None and self.disk_after != 0:
                return False  # the jobs on disk next
            self.finish()
            return True
        return False

    def _disk_step(self) -> int:
        """Write the next batch of jobs on disk; bytes written."""
        assert self.disk is not None
        after, jobs = self.disk(max(self.disk_after, 0), REWRITE_JOBS_PER_STEP)
        self.disk_after = after
        out = bytearray()
        for job in jobs:
            if job.state in (ACTIVE, QUEUED):
                out += loadjob_record(job)
        if out:
            write_all(self.fd, out)
        return len(out)

    def run_to_end(self) -> None:
        while not self.finished and not self.step():
            pass

    def finish(self) -> None:
        aof = self.aof
        try:
            if aof is not None:
                aof.flush(force=True)  # the old file gets everything logged so far
                tail = aof.rewrite_buf or b""
                write_all(self.fd, tail)
                self.size += len(tail)
            os.fsync(self.fd)
            os.rename(self.temp_path, self.path)
            fsync_dir(self.path)
        except OSError as exc:
            self.fail(exc.strerror or str(exc))
            return
        self.finished = True
        if aof is not None:
            aof.rewrite_buf = None
            aof.rewrite = None
            aof.switch_to(self.fd, self.size)
            aof.last_rewrite_time = int(time.monotonic() - self.started)
            aof.last_rewrite_ok = True
        else:
            os.close(self.fd)
        self.done(True, "")

    def fail(self, reason: str) -> None:
        self.abort()
        self.done(False, reason)

    def abort(self) -> None:
        if self.finished:
            return
        self.finished = True
        if self.aof is not None:
            self.aof.rewrite_buf = None
            self.aof.rewrite = None
            self.aof.last_rewrite_ok = False
        try:
            os.close(self.fd)
        except OSError:
            pass
        try:
            os.unlink(self.temp_path)
        except OSError:
            pass
