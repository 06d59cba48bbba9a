"""Overflow: with `overflow yes`, queued jobs past a memory threshold move to disk and come
back in queue order (the original's FAQ plan; NSQ's diskqueue; RabbitMQ's lazy queues). Sans-I/O apart from the
store (disque.overflow.store, a local SQLite file), driven by the node's timer wheel.

What moves, while the node's memory estimate is above `overflow-threshold` percent of
maxmemory (`spill`, every SPILL_PERIOD ms while overflowing): first jobs QUEUED on this
node, newest first, from the queues holding the most jobs in memory (the oldest KEEP jobs of
each queue stay: they are what GETJOB serves next); then ACTIVE jobs (copies held for other
nodes, jobs delivered and waiting for their ACK or requeue, delayed jobs), but not one a
synchronous ADDJOB still waits on (`pinned`), nor one whose timer wants it back within
ACTIVE_MIN_AWAY ms (a short RETRY: it would be read back before it saved anything). Jobs
waiting for their copies and acked jobs stay in memory. And a new job queued at once in a
queue that has jobs on disk, while memory is at the spill's target (without AOF), goes
straight to disk (`add_fresh`): it would be the next one spilled, so it skips the registry,
the queue's list and the timer wheel it would leave again (a lone node producing into a
backlog spent as long spilling each job as adding it). Such jobs are written together, by
the next tick or before anything reads the disk. A spilled job leaves the registry,
its queue's in-memory list and the timer wheel; a queued one's queue counts it
(`Queue.spilled`) and remembers a lower bound of the ctime of its oldest job on disk
(`Queue.disk_first`).

What comes back, and when:
- the head of a queue (`refill`): before a job is taken from a queue (GETJOB, federation),
  if the queue's oldest job is on disk, the REFILL oldest come back first. So every queue is
  served in ctime order across the boundary: in memory, a queue's jobs are kept sorted, and
  nothing on disk is older than the head served;
- a job asked for by ID (`fault_in`): the registry lookup (`NodeState.lookup_job`) asks the
  store on a miss, so SHOW, ACKJOB, NACK, WORKING, DELJOB, DEQUEUE, ENQUEUE and every bus
  message about the job see it as if it had never left;
- a job whose timer is due (`wake_due`, at most EXPIRE_BATCH per EXPIRE_PERIOD): at its
  expiry (the wheel deletes it, or moves it to its dead-letter queue, as any other), and an
  active job at its requeue (or the WILLQUEUE before it).

A job comes back exactly as it went (disque.overflow.record): the same state, counters,
flags and requeue time. A job on disk is never served, requeued nor collected from there: it
first comes back. While a queue's job is on disk its requeue timer does not run: a queued job
has no requeue to do but to push its time forward, which `schedule_job` does when it is back.

The store is a cache of memory (see disque.overflow.store): deleted at start and when
overflow is turned off (its jobs come back first, as memory allows). With AOF the AOF keeps
every job, overflowed or not; a job that crosses the boundary while an AOF rewrite runs is
logged to the rewrite (`moved`), so the rewritten file misses none.

A full disk or `overflow-max-size`: the write is refused as a whole, nothing is lost, the
node stops spilling for FULL_RETRY_MS and its memory rules apply as without overflow (-OOM at
100% of maxmemory). The cause is kept in `full_error` (INFO overflow_status).
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable, Collection
from typing import Final

import structlog

from disque.jobs.job import ACTIVE, F_DUMMY, F_RELOADED, JOB_MEMORY, QUEUED, Job
from disque.overflow.record import pack_job, unpack_job
from disque.overflow.store import OverflowFull, OverflowStore, Row, fingerprint
from disque.queues.queue import PAUSE_OUT, Queue
from disque.state import NO_SPILL, NodeState
from disque.timers import Timer

log = structlog.get_logger("disque.overflow")

SPILL_PERIOD: Final = 10  # ms between spills while overflowing
IDLE_PERIOD: Final = 100  # ms between looks while nothing is on disk nor needs to go there
KEEP: Final = 512  # a queue's oldest jobs in memory, never spilled
SPILL_BATCH: Final = 2048  # jobs one queue spills at a time (one transaction)
MIN_BATCH: Final = 16  # a refused batch is tried again smaller, down to this
REFILL: Final = 512  # jobs brought back to a queue's head at a time
EXPIRE_BATCH: Final = 1000  # expired jobs brought back per look
EXPIRE_PERIOD: Final = 100  # ms between looks for expired jobs on disk
FULL_RETRY_MS: Final = 1000  # after a refused write, no spill before this
ACTIVE_SHARDS: Final = 512  # registry shards one spill of active jobs looks at, at most
ACTIVE_ROUNDS: Final = 8  # spills of active jobs per tick, at most
# NodeState.arrivals is pruned once it holds this many more IDs than a quarter above the
# jobs in memory
ARRIVALS_SLACK: Final = 4096
# an active job whose timer wants it back sooner than this (ms; its requeue, or the
# WILLQUEUE before it) stays in memory: it would come back before its place on disk paid
# for the write and the read (with RETRY 2, chaos runs wrote each job ~5 times)
ACTIVE_MIN_AWAY: Final = 10_000


class Overflow:
    """The overflow subsystem of a node (`node.overflow`); `store` is None while off."""

    def __init__(self, state: NodeState, moved: Callable[[Job], None],
                 pinned: Callable[[bytes], bool]) -> None:
        self.state = state
        self.moved = moved  # a job crossed the boundary (the AOF rewrite logs it)
        self.pinned = pinned  # a job that must stay in memory (a sync ADDJOB waits on it)
        self.store: OverflowStore | None = None
        self.threshold = 50  # percent of maxmemory
        self.keep = KEEP  # (the simulation keeps fewer, to move its small queues too)
        self.max_bytes = 0
        self.full_until = 0
        self.full_error: str | None = None
        self._refused = ""  # why the store refused the last write
        self.spills = 0  # spill transactions done
        self._cursor = 0  # queue-table shard the next spill starts from
        self._jcursor = 0  # registry shard the next spill of active jobs starts from
        self._last_expire = 0
        self._timer = Timer(self.tick)
        # new jobs on their way straight to disk (`add_fresh`), written together
        self.fresh: list[Job] = []

    # ------------------------------------------------------------------ settings
    def enable(self, path: str, threshold: int, max_bytes: int) -> None:
        """Open (or keep) the store at `path`; jobs go to disk from the next tick."""
        self.threshold = threshold
        self.max_bytes = max_bytes
        self.write_fresh()
        if self.store is not None and self.store.path != path and not self.store.jobs:
            self.store.close()
            self.store = None
        if self.store is None:
            os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
            self.store = OverflowStore(path, max_bytes)
        else:
            self.store.set_max_bytes(max_bytes)
        self.full_until = 0
        self.full_error = None
        self._update_limit()
        if not self._timer.awake:
            self.state.wheel.schedule(self._timer, self.state.clock() + SPILL_PERIOD)

    def disable(self) -> None:
        """Stop spilling; what is on disk comes back as it is asked for, and the store
        closes once empty (at once when nothing is on it)."""
        self._no_spill()
        self.write_fresh()
        if self.store is not None and not self.store.jobs:
            self.store.close()
            self.store = None

    def _update_limit(self) -> None:
        mm = self.state.maxmemory
        if mm and self.store:
            self.state.spill_at = mm * self.threshold // 100
        else:
            self._no_spill()

    def _no_spill(self) -> None:
        """Nothing goes to disk (overflow off, or no maxmemory): no arrival order either."""
        self.state.spill_at = NO_SPILL
        self.state.arrivals.clear()

    # ------------------------------------------------------------------ the tick
    def tick(self, now: int) -> None:
        store = self.store
        state = self.state
        if store is None:
            return
        self.write_fresh()
        if state.mem_used > state.spill_at and now >= self.full_until:
            self.spill(now)
        store.merge_step()
        size = state.jobs.size
        if len(state.arrivals) > size + (size >> 2) + ARRIVALS_SLACK:
            self._prune_arrivals()
        if store.jobs and now - self._last_expire >= EXPIRE_PERIOD:
            self._last_expire = now
            self.wake_due(now)
            store.sweep()
        if not store.jobs and state.spill_at >= NO_SPILL:
            store.close()  # turned off and drained
            self.store = None
            return
        busy = bool(store.jobs) or bool(self.fresh) or state.mem_used > state.spill_at
        state.wheel.schedule(self._timer, now + (SPILL_PERIOD if busy else IDLE_PERIOD))

    def _prune_arrivals(self) -> None:
        """Drop from `NodeState.arrivals` the IDs of jobs gone or no longer active (they
        outnumber the live ones by a quarter: jobs acked while in memory), in order."""
        state = self.state
        table = state.jobs
        live: deque[bytes] = deque()
        for job_id in state.arrivals:
            job = table.get(job_id)
            if job is not None and job.state == ACTIVE:
                live.append(job_id)
        state.arrivals = live

    # ------------------------------------------------------------------ to disk
    def spill(self, now: int) -> int:
        """Move the newest queued jobs of the biggest queues to disk until memory is 1/64
        under the threshold (a little at a time: each transaction holds up the loop); the
        number moved."""
        state = self.state
        target = self._target()
        queues = state.queues
        n = queues.shard_count()
        candidates: list[Queue] = []
        for _ in range(n):
            shard = queues.shard(self._cursor)
            self._cursor = (self._cursor + 1) % n
            for q in shard.values():
                if len(q.jobs) > self.keep:
                    candidates.append(q)
            if len(candidates) >= 64:
                break
        candidates.sort(key=_in_memory, reverse=True)
        moved = 0
        for q in candidates:
            cap = SPILL_BATCH
            while state.mem_used > target and len(q.jobs) > self.keep:
                k = min(len(q.jobs) - self.keep, cap,
                        (state.mem_used - target) // (JOB_MEMORY + 64) + 1)
                done = self._spill_queue(q, k, now)
                if done < 0:
                    if k <= MIN_BATCH:
                        self._full(now)  # not even a few jobs fit
                        return moved
                    cap = max(k // 4, MIN_BATCH)  # a smaller batch may still fit
                    continue
                moved += done
            if state.mem_used <= target:
                return moved
        # then jobs that are not queued here
        for _ in range(ACTIVE_ROUNDS):
            if state.mem_used <= target:
                break
            done = self._spill_active(target, now)
            if done < 0:
                self._full(now)
                break
            if not done:
                break
            moved += done
        return moved

    def spill_if_needed(self) -> None:
        """Spill now if memory is over the threshold (the AOF loader, between steps)."""
        if self.store is not None and self.state.mem_used > self.state.spill_at:
            self.write_fresh()
            now = self.state.clock()
            if now >= self.full_until:
                self.spill(now)

    def _spill_queue(self, q: Queue, k: int, now: int) -> int:
        jobs = q.jobs.pop_newest(k)
        if not self._put(_queued_rows(jobs)):
            for job in jobs:
                q.jobs.add(job)
            return -1
        first = q.disk_first
        for job in jobs:
            if not first or job.ctime < first:
                first = job.ctime
        self._forget(jobs)
        q.disk_first = first
        q.spilled += len(jobs)
        return len(jobs)

    def _spill_active(self, target: int, now: int) -> int:
        """Active jobs (copies held for other nodes, jobs delivered or waiting for their
        requeue or delay): first the oldest of those registered while memory was over the
        threshold (`NodeState.arrivals`), then a bounded walk of the registry from where
        the last one stopped; the number moved, -1 when the store refused them."""
        state = self.state
        table = state.jobs
        n = table.shard_count()
        jobs: list[Job] = []
        rows: list[Row] = []
        want = min(SPILL_BATCH, (state.mem_used - target) // (JOB_MEMORY + 64) + 1)
        pinned = self.pinned
        next_wake = state.next_wake
        soon = now + ACTIVE_MIN_AWAY
        arrivals = state.arrivals
        chosen: set[bytes] = set()  # (an ID can be in `arrivals` twice, or found twice)

        def pick(job: Job) -> None:
            if job.state == ACTIVE and job.id not in chosen and not pinned(job.id):
                wake = next_wake(job)
                if wake >= soon:
                    chosen.add(job.id)
                    jobs.append(job)
                    rows.append(_active_row(job, wake))

        while arrivals and len(jobs) < want:
            # (a job not to move now is dropped from the order: the walk finds it later)
            job = table.get(arrivals.popleft())
            if job is not None:
                pick(job)
        for _ in range(min(ACTIVE_SHARDS, n) if len(jobs) < want else 0):
            # (a shard seen twice: its jobs spilled twice)
            shard = table.shard(self._jcursor)
            self._jcursor = (self._jcursor + 1) % n
            for job in shard.values():
                pick(job)
            if len(jobs) >= want:
                break
        if not jobs:
            return 0
        if not self._put(rows):
            return -1
        self._forget(jobs)
        return len(jobs)

    def _put(self, rows: list[Row]) -> bool:
        store = self.store
        assert store is not None
        try:
            store.put(rows)
        except OverflowFull as exc:
            self._refused = str(exc)
            return False
        self.full_error = None
        self.spills += 1
        self.state.on_disk = store.jobs + len(self.fresh)
        return True

    def _full(self, now: int) -> None:
        """The store refused a write (a full disk, overflow-max-size): no spill for a
        while; logged once per episode."""
        self.full_until = now + FULL_RETRY_MS
        if self.full_error is None:
            store = self.store
            log.warning("overflow.full", error=self._refused,
                        jobs_on_disk=store.jobs if store is not None else 0)
        self.full_error = self._refused

    def _forget(self, jobs: list[Job]) -> None:
        """Jobs written to disk leave the registry and the timer wheel."""
        state = self.state
        table = state.jobs
        wheel = state.wheel
        for job in jobs:
            table.pop(job.id)
            state.mem_used -= JOB_MEMORY + len(job.body or b"")
            wheel.cancel(job)
            self.moved(job)

    # ------------------------------------------------------------------ straight to disk
    def _target(self) -> int:
        """The memory a spill brings the node down to: 1/64 under the threshold."""
        spill_at = self.state.spill_at
        return spill_at - spill_at // 64

    def takes_fresh(self, now: int) -> bool:
        """Whether a new job of a queue with jobs on disk goes straight there (`add_fresh`):
        memory is at the spill's target, and the store is open and not refusing writes."""
        return (self.store is not None and now >= self.full_until
                and self.state.mem_used > self._target())

    def add_fresh(self, job: Job, q: Queue) -> None:
        """A new job queued in `q` while `q` has jobs on disk and memory is at the spill's
        target (Node.add_job; not with AOF): it joins them on disk, with the next write
        (`write_fresh`: the next tick, SPILL_BATCH of them, or whatever reads the disk
        first), instead of entering memory only for the next spill to move it there. It is
        counted on disk from now on (`Queue.spilled`, `on_disk`), so a lookup by ID, GETJOB
        and every walk of the disk write it first and find it there."""
        self.fresh.append(job)
        first = q.disk_first
        if not first or job.ctime < first:
            q.disk_first = job.ctime
        q.spilled += 1
        self.state.on_disk += 1
        if len(self.fresh) >= SPILL_BATCH:
            self.write_fresh()

    def write_fresh(self) -> None:
        """Write the jobs `add_fresh` holds, in one transaction. Refused (a full disk, the
        size cap), they go to memory, where they would have gone without overflow."""
        jobs = self.fresh
        if not jobs:
            return
        self.fresh = []
        if self._put(_queued_rows(jobs)):
            return
        state = self.state
        self._full(state.clock())
        by_queue: dict[bytes, list[Job]] = {}
        for job in jobs:
            queue = job.queue
            assert queue is not None  # (queued jobs have one)
            by_queue.setdefault(queue, []).append(job)
        for queue, group in by_queue.items():  # (each in ctime order: as they were added)
            self._requeue(group, state.create_queue(queue))
        store = self.store
        state.on_disk = store.jobs if store is not None else 0

    # ------------------------------------------------------------------ back to memory
    def _restore(self, job: Job) -> None:
        """A job back from disk, into the registry and, if queued, its queue."""
        state = self.state
        if job.state == QUEUED:
            queue = job.queue
            assert queue is not None
            self._requeue([job], state.create_queue(queue))
            return
        state.register(job)
        state.schedule_job(job)
        self.moved(job)

    def _requeue(self, jobs: list[Job], q: Queue) -> None:
        """Queued jobs back from disk (or refused by it: `write_fresh`), sorted by ctime,
        into the registry and their queue `q` (at its head, in one go, when they are older
        than every job in it)."""
        state = self.state
        for job in jobs:
            state.register(job)
            state.schedule_job(job)
            self.moved(job)
        q.jobs.add_oldest(jobs)
        q.spilled = max(0, q.spilled - len(jobs))
        if q.waiters and not q.paused & PAUSE_OUT:
            state.serve_waiters(q)  # (a client blocked on the queue meanwhile)

    def came_from(self) -> tuple[int, int]:
        """The segments (lowest ID, highest ID) the jobs back last came from: a `moved`
        callback for a job back from disk reads it (re-replication's walk of the disk)."""
        store = self.store
        return store.took if store is not None else (0, 0)

    def holds(self, job_id: bytes, delivered: tuple[bytes, ...]) -> bool:
        """Whether the job is on disk listing the nodes of `delivered`, no more and no
        less: a copy received again that lists them merges to nothing (no read)."""
        self.write_fresh()
        store = self.store
        return store is not None and store.holds(job_id, fingerprint(delivered))

    def get(self, job_id: bytes) -> Job | None:
        """A copy of the job read from disk, left there (not registered: to send it)."""
        self.write_fresh()
        store = self.store
        data = store.get(job_id) if store is not None else None
        return unpack_job(data) if data is not None else None

    def fault_in(self, job_id: bytes) -> Job | None:
        """The job with this ID back from disk, or None if it is not there."""
        self.write_fresh()
        store = self.store
        if store is None:
            return None
        data = store.take(job_id)
        state = self.state
        state.on_disk = store.jobs
        if data is None:
            return None
        job = unpack_job(data)
        self._restore(job)
        return job

    def fault_in_many(self, job_ids: Collection[bytes]) -> None:
        """The jobs with these IDs that are on disk, back (as `fault_in` for each, read
        together)."""
        self.write_fresh()
        store = self.store
        if store is None:
            return
        datas = store.take_many(job_ids)
        self.state.on_disk = store.jobs
        for data in datas:
            self._restore(unpack_job(data))

    def refill(self, q: Queue) -> None:
        """Before a job is taken from `q`: if its oldest job may be on disk, bring back the
        REFILL oldest (see the module docstring)."""
        self.write_fresh()
        store = self.store
        if store is None:
            q.spilled = 0  # (the store is gone)
            return
        if not q.spilled:
            return
        first = q.jobs.first()
        if first is not None and first.ctime < q.disk_first:
            return
        datas, q.disk_first = store.take_oldest(q.name, REFILL)
        self.state.on_disk = store.jobs
        if not datas:
            q.spilled = 0
            return
        # (a queue's segments hold the jobs it had queued)
        self._requeue(sorted((unpack_job(data) for data in datas), key=_ctime), q)

    def wake_due(self, now: int) -> None:
        """Jobs on disk whose timer is due (an expiry; an active job's requeue) come back;
        the wheel does the rest."""
        self.write_fresh()
        store = self.store
        assert store is not None
        for data in store.take_due(now, EXPIRE_BATCH):
            self._restore(unpack_job(data))
        self.state.on_disk = store.jobs

    def peek(self, q: Queue, n: int, newest: bool) -> list[Job]:
        """QPEEK across the boundary: the n oldest (newest) jobs of `q`, in memory or on
        disk (those on disk as read-only copies)."""
        self.write_fresh()
        mem = q.jobs.newest(n) if newest else q.jobs.oldest(n)
        if not q.spilled or self.store is None:
            return mem
        disk = [unpack_job(d) for d in self.store.peek(q.name, n, newest)]
        both = sorted(mem + disk, key=_ctime, reverse=newest)
        return both[:n]

    def scan(self, after: int, count: int) -> tuple[int, list[Job]]:
        """JSCAN's walk of the store: (the rowid to go on after, 0 at the end; jobs)."""
        self.write_fresh()
        if self.store is None:
            return 0, []
        nxt, datas = self.store.scan(after, count)
        return nxt, [unpack_job(d) for d in datas]

    def scan_listing(self, after: int, count: int, nodes: Collection[bytes],
                     end: int) -> tuple[int, list[tuple[bytes, bytes]]]:
        """The walks of re-replication and repair over the disk: the copyable jobs (ID,
        listed nodes' IDs concatenated) listing any of `nodes` among `count` jobs past
        segment `after`, up to segment `end` (the store's scan_listing)."""
        self.write_fresh()
        if self.store is None:
            return 0, []
        return self.store.scan_listing(after, count, nodes, end)

    def last_segment(self) -> int:
        """The newest segment now: a walk over the disk stops there, since a job it brings
        back and that goes to disk again lands past it (else the walk would never end)."""
        self.write_fresh()
        return self.store.last_chunk if self.store is not None else 0

    def drop_all(self) -> None:
        """DEBUG FLUSHALL, CLUSTER RESET: forget every job on disk."""
        self.write_fresh()
        if self.store is not None:
            self.store.drop_all()
        self.state.on_disk = 0

    def info_fields(self) -> list[tuple[str, object]]:
        self.write_fresh()
        store = self.store
        if store is None:
            status = "off"
        else:
            status = "full" if self.full_error is not None else "ok"
        return [
            ("overflow_status", status),
            ("overflow_jobs", store.jobs if store else 0),
            ("overflow_bytes", store.bytes if store else 0),
            ("overflow_file_bytes", store.file_bytes() if store else 0),
            ("overflow_written_jobs", store.written if store else 0),
            ("overflow_read_jobs", store.read if store else 0),
            ("overflow_spills", self.spills),
        ]


def _ctime(job: Job) -> int:
    return job.ctime


def _queued_rows(jobs: list[Job]) -> list[Row]:
    """The store's rows of queued jobs. A queued job wakes only to expire: its requeue
    time is pushed forward when it is back (a queued job's timer does nothing else)."""
    rows: list[Row] = []
    for job in jobs:
        queue = job.queue
        assert queue is not None  # (queued jobs have one)
        rows.append((job.id, queue, job.ctime, job.etime, b"".join(job.delivered),
                     _copyable(job), pack_job(job), _fingerprint(job)))
    return rows


def _active_row(job: Job, wake: int) -> Row:
    """The store's row of an active job (not queued here) whose timer wants it at `wake`."""
    return (job.id, b"", job.ctime, wake, b"".join(job.delivered), _copyable(job),
            pack_job(job), _fingerprint(job))


def _copyable(job: Job) -> int:
    """1 if re-replication and repair may copy the job (at-least-once, not a dummy ACK nor
    a copy reloaded from the AOF that no holder confirmed yet)."""
    return 1 if job.retry and not job.flags & (F_DUMMY | F_RELOADED) else 0


def _fingerprint(job: Job) -> int:
    """Its listed nodes' fingerprint; 0 for a job a copy received again must read to merge
    (a copy reloaded from the AOF: that copy confirms it; an at-most-once job, not
    copyable, is rare enough to be read) and for a job only this node holds (no other
    holder sends it: a frozenset and its hash not made for nothing)."""
    return fingerprint(job.delivered) if len(job.delivered) > 1 and _copyable(job) else 0


def _in_memory(q: Queue) -> int:
    return len(q.jobs)
