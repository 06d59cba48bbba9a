"""Memory: the levels of `maxmemory`, eviction, and the collection of idle queues.

The node estimates what it holds (`state.mem_used`: a fixed base, each job and queue, DEDUP
keys). Above 75% of maxmemory it takes no copies of other nodes' jobs and replicates its own
externally (`state.above_copy_limit`); above 95% a command that adds memory first evicts
what is safe to drop, under policy `acks` (`ensure_memory`, checklist section 11; with
`overflow yes` it first moves jobs to disk, disque.overflow); above 100% such commands fail. Every QUEUE_GC_PERIOD a sample of the queue table is visited and
empty, idle, unpaused queues with no blocked client are dropped (`queue_gc`), sooner the
fuller memory is (`queue_idle_ms`); expired DEDUP keys go at the same tick (`dedup_expire`,
jobs.dedup's, given at construction).

Eviction never drops what a consumer could still need: acked jobs, and at-most-once jobs
already delivered; each attempt examines a bounded sample, going on from where the last one
stopped (`evict_sample`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Final, TypeVar

from disque.jobs.job import ACKED, F_DELIVERED, QUEUED
from disque.latency import EVICTION_CYCLE
from disque.scan import ScanDict
from disque.state import NodeState
from disque.timers import Timer

QUEUE_GC_PERIOD: Final = 100  # ms between queue eviction samples
QUEUE_GC_SHARDS: Final = 16  # queue-table shards sampled per period
EVICT_SAMPLE: Final = 500  # jobs (then queues) one eviction attempt examines at most

E = TypeVar("E")  # what a table holds: jobs or queues


def _no_spill() -> None:
    pass


class Memory:
    """The memory subsystem of a node (`node.memory`)."""

    def __init__(self, state: NodeState, dedup_expire: Callable[[int], None], *,
                 maxmemory_policy: str = "acks", queue_idle_timeout: int = 300,
                 spill: Callable[[], None] = _no_spill) -> None:
        self.state = state
        self.dedup_expire = dedup_expire
        self.spill = spill  # moves jobs to disk first, with overflow on (disque.overflow)
        self.maxmemory_policy = maxmemory_policy
        self.queue_idle_timeout = queue_idle_timeout  # s
        self._queue_gc_cursor = 0
        self._evict_cursor = 0  # registry shard the next eviction attempt starts from
        self._evict_qcursor = 0
        self._queue_gc_timer = Timer(self.queue_gc)
        state.wheel.schedule(self._queue_gc_timer, state.clock() + QUEUE_GC_PERIOD)

    def memory_level(self) -> int:
        """0 normal; 1 above 75% of maxmemory; 2 above 95%; 3 above 100%."""
        if not self.state.maxmemory:
            return 0
        used = self.state.used_memory()
        if used > self.state.maxmemory:
            return 3
        if used * 100 > self.state.maxmemory * 95:
            return 2
        if used * 100 > self.state.maxmemory * 75:
            return 1
        return 0

    def ensure_memory(self) -> bool:
        """Before a command that adds memory (checklist section 11): above 95% of
        maxmemory, policy `acks` evicts what is safe to drop; the command may run only if
        that brings usage back under 95% (`noeviction`: refused at once)."""
        if self.state.mem_used <= self.state.mem_evict_at:
            return True
        self.spill()
        if self.state.mem_used <= self.state.mem_evict_at:
            return True
        if self.maxmemory_policy == "acks":
            self.evict(self.state.mem_evict_at)
        return self.state.mem_used <= self.state.mem_evict_at

    def evict(self, target: int) -> int:
        """One eviction attempt (see evict_sample), timed as the latency event
        `eviction-cycle`."""
        started = self.state.latency.start()
        freed = self.evict_sample(target)
        self.state.latency.end(EVICTION_CYCLE, started)
        return freed

    def evict_sample(self, target: int) -> int:
        """Free acked jobs and already delivered at-most-once jobs (never anything a consumer
        could still need), then idle empty queues, until used memory <= target.

        Each call examines a bounded sample (EVICT_SAMPLE jobs, then as many queues), going
        on from where the previous call stopped, so successive calls cover the whole
        registry: when nothing is evictable, a refused ADDJOB costs ~0.1 ms, not a walk over
        millions of jobs (the original gives up after a few random samples)."""
        freed = 0
        for job in self.eviction_sample(self.state.jobs, "_evict_cursor"):
            if self.state.used_memory() <= target:
                return freed
            if job.state == ACKED or (job.retry == 0 and job.flags & F_DELIVERED
                                      and job.state != QUEUED):
                self.state.delete_job(job)
                freed += 1
        # Then empty queues idle for the level-2 idle time (2 s), as the original's
        # evictIdleQueues: a queue used a moment ago keeps its counters and sources.
        now = self.state.clock()
        idle_ms = min(self.queue_idle_timeout * 1000, 2000)
        for q in self.eviction_sample(self.state.queues, "_evict_qcursor"):
            if self.state.used_memory() <= target:
                break
            if q.evictable() and now - q.atime >= idle_ms:
                self.state.drop_queue(q)
        return freed

    def eviction_sample(self, table: ScanDict[bytes, E], cursor: str) -> Iterator[E]:
        """Entries of `table`, whole shards from the shard the attribute `cursor` names
        (advanced as they are visited), until EVICT_SAMPLE entries were handed out."""
        n = table.shard_count()
        examined = 0
        for _ in range(n):
            if examined >= EVICT_SAMPLE:
                return
            i = getattr(self, cursor)
            setattr(self, cursor, (i + 1) % n)
            shard = table.shard(i)
            if shard:
                examined += len(shard)
                yield from list(shard.values())

    def queue_idle_ms(self) -> int:
        """How long an empty queue must be idle to be collected: queue-idle-timeout, at
        most 10 s above 75% of maxmemory and 2 s above 95% (checklist section 10)."""
        idle_ms = self.queue_idle_timeout * 1000
        level = self.memory_level()
        if level >= 2:
            return min(idle_ms, 2000)
        if level >= 1:
            return min(idle_ms, 10000)
        return idle_ms

    def queue_gc(self, now: int) -> None:
        """Evict a sample of empty, idle, unpaused queues with no blocked clients, forget
        expired DEDUP keys, and above 95% of maxmemory evict what is safe to drop (the
        original evicts before every command: this frees memory while a full node only
        serves GETJOB / ACKJOB, without a per-command cost)."""
        self.dedup_expire(now)
        if self.state.mem_used > self.state.mem_evict_at and self.maxmemory_policy == "acks":
            self.evict(self.state.mem_evict_at)
        idle_ms = self.queue_idle_ms()
        queues = self.state.queues
        n = queues.shard_count()
        for _ in range(QUEUE_GC_SHARDS):
            shard = queues.shard(self._queue_gc_cursor)
            self._queue_gc_cursor = (self._queue_gc_cursor + 1) % n
            if shard:
                for q in [q for q in shard.values() if q.evictable()
                          and now - q.atime >= idle_ms]:
                    self.state.drop_queue(q)
        self.state.wheel.schedule(self._queue_gc_timer, now + QUEUE_GC_PERIOD)
