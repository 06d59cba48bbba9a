"""DEDUP: idempotent production (ADDJOB ... DEDUP <key>).

A producer that retries (a Spark task attempt, a client after a lost reply) sends the same
key; within the job's TTL this node answers with the first job's ID instead of adding a
copy, even after the job was acked and collected. The memory is per node: a retry must reach
the same node. Keys are counted in the node's memory estimate (DEDUP_MEMORY + key) and
forgotten at the job's expiry (`expire`, from the memory subsystem's tick).
"""

from __future__ import annotations

import heapq
from collections.abc import Set

from disque.jobs.job import Job
from disque.state import NodeState

DEDUP_MEMORY = 150


class Dedup:
    """The DEDUP keys of a node (`node.dedup`)."""

    def __init__(self, state: NodeState) -> None:
        self.state = state
        # queue + NUL + key -> (job id, until ms), and the expiry heap
        self.keys: dict[bytes, tuple[bytes, int]] = {}
        self.heap: list[tuple[int, bytes]] = []

    def lookup(self, queue: bytes, key: bytes) -> bytes | None:
        entry = self.keys.get(queue + b"\0" + key)
        if entry is None:
            return None
        if entry[1] <= self.state.clock():
            return None
        return entry[0]

    def remember(self, queue: bytes, key: bytes, job: Job) -> None:
        full = queue + b"\0" + key
        self.keys[full] = (job.id, job.etime)
        heapq.heappush(self.heap, (job.etime, full))
        self.state.mem_used += DEDUP_MEMORY + len(full)

    def forget(self, queue: bytes, key: bytes, job_id: bytes) -> None:
        """The ADDJOB failed (NOREPL): a retry must be able to add the job."""
        full = queue + b"\0" + key
        entry = self.keys.get(full)
        if entry is not None and entry[0] == job_id:
            del self.keys[full]
            self.state.mem_used -= DEDUP_MEMORY + len(full)

    def expire(self, now: int) -> None:
        heap = self.heap
        dedup = self.keys
        while heap and heap[0][0] <= now:
            until, full = heapq.heappop(heap)
            entry = dedup.get(full)
            if entry is not None and entry[1] <= now:
                del dedup[full]
                self.state.mem_used -= DEDUP_MEMORY + len(full)

    def cancel(self, gone: Set[bytes]) -> None:
        """The ADDJOBs of these job IDs failed after all (see Node.cancel_adds): a retry
        must be able to add them."""
        if gone and self.keys:
            for full, (job_id, _) in list(self.keys.items()):
                if job_id in gone:
                    del self.keys[full]
                    self.state.mem_used -= DEDUP_MEMORY + len(full)

    def clear(self) -> None:
        self.keys.clear()
        self.heap.clear()
