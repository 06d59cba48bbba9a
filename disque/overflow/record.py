"""An overflowed job's row data: every field of the in-memory Job, so that a job that comes
back from disk is the job that went (the AOF's LOADJOB layout keeps only what survives a
restart: no requeue time, second-granular expiry, three of the flags).

Two layouts; the first byte tells them apart (the file is a cache of memory, never read
by another version: disque.overflow.store):
- FIXED (nearly every job): one `struct` header of the numbers and lengths, then the ID,
  queue, body and the listed and confirmed node IDs (40 bytes each) as they are. Under
  callgrind a queued 100-byte job costs 5,000 instructions to write and 4,600 to read,
  against 7,200 and 6,200 for the msgpack array, whose packer looks at each of the 17
  fields' type in turn; it takes 8 bytes more (msgpack's small numbers take one byte each:
  233 against 225 bytes).
- msgpack (first byte 0xdc, an array of 17): a job with a dead-letter policy, a node ID
  that is not 40 bytes, a queue name of 65,535 bytes or more, or a number out of its
  header field's range.
"""

from __future__ import annotations

import struct
from typing import Final

import msgpack

from disque.jobs.deadletter import DeadLetter
from disque.jobs.job import Job

# one Packer for every job: packb makes a Packer per call (1.26 against 0.47 us a job)
_packb: Final = msgpack.Packer(autoreset=True).pack
_unpackb: Final = msgpack.unpackb

FIXED: Final = 1  # the first byte of the FIXED layout (msgpack's array16 starts 0xdc)
NODE_ID_LEN: Final = 40  # bytes of a node ID
NO_QUEUE: Final = 0xFFFF  # the queue length of a job without one (a longer queue: msgpack)
NO_BODY: Final = 0xFFFFFFFF  # the body length of a job without one
# layout, state, flags, repl, ctime, etime, qtime (ms), delay, retry (s), nacks,
# deliveries, gc_retry; then the lengths of the ID, queue and body, the counts of listed and
# confirmed node IDs: 51 bytes (msgpack takes ~43 for the same numbers, its small ints in
# one byte; a number out of a field's range takes the msgpack layout)
_HEAD: Final = struct.Struct("<BBBBqqqIIHHHBHIBB")
_HEAD_LEN: Final = _HEAD.size
# its fields as read (typed: the compiled build then slices and adds with native ints)
_Head = tuple[int, int, int, int, int, int, int, int, int, int, int, int, int, int, int, int,
              int]
_pack_head: Final = _HEAD.pack  # (bound once: a method call by name costs a lookup a job)
_unpack_head: Final = _HEAD.unpack_from


def _node_ids(nodes: tuple[bytes, ...]) -> bool:
    return all(len(n) == NODE_ID_LEN for n in nodes)


def pack_job(job: Job) -> bytes:
    queue = job.queue
    body = job.body
    delivered = job.delivered
    confirmed = job.confirmed
    dl = job.dl
    queue_len = NO_QUEUE if queue is None else len(queue)
    if dl is None and (queue is None or queue_len < NO_QUEUE) \
            and _node_ids(delivered) and _node_ids(confirmed):
        try:
            head = _pack_head(FIXED, job.state, job.flags, job.repl, job.ctime, job.etime,
                              job.qtime, job.delay, job.retry, job.nacks, job.deliveries,
                              job.gc_retry, len(job.id), queue_len,
                              NO_BODY if body is None else len(body),
                              len(delivered), len(confirmed))
        except struct.error:
            pass  # a number out of its field's range: the msgpack layout
        else:
            return b"".join([head, job.id, queue or b"", body or b"", *delivered, *confirmed])
    data: bytes = _packb((job.id, queue, body, job.state, job.flags, job.repl,
                          job.ctime, job.etime, job.delay, job.retry, job.nacks,
                          job.deliveries, delivered, confirmed, job.qtime,
                          job.gc_retry, dl.to_wire() if dl is not None else None))
    return data


def job_id_of(data: bytes) -> bytes:
    """The job ID in a record (the store checks it: two IDs may share a hash)."""
    if data[0] == FIXED:
        id_len: int = _unpack_head(data)[12]
        return data[_HEAD_LEN:_HEAD_LEN + id_len]
    job_id: bytes = _unpackb(data, use_list=False)[0]
    return job_id


def node_list(data: bytes, at: int, count: int) -> tuple[bytes, ...]:
    """`count` node IDs written one after another from `at` (a record's listed and
    confirmed nodes; a segment's `meta` lists each job's nodes so too, read by repair)."""
    if count == 1:  # (most jobs: one node, or REPLICATE's few)
        return (data[at:at + NODE_ID_LEN],)
    if not count:
        return ()
    return tuple([data[i:i + NODE_ID_LEN]
                  for i in range(at, at + count * NODE_ID_LEN, NODE_ID_LEN)])


def unpack_job(data: bytes) -> Job:
    if data[0] == FIXED:
        head: _Head = _unpack_head(data)
        (_, state, flags, repl, ctime, etime, qtime, delay, retry, nacks, deliveries,
         gc_retry, id_len, queue_len, body_len, n_delivered, n_confirmed) = head
        at = _HEAD_LEN + id_len
        job_id = data[_HEAD_LEN:at]
        queue: bytes | None = None
        if queue_len != NO_QUEUE:
            queue = data[at:at + queue_len]
            at += queue_len
        body: bytes | None = None
        if body_len != NO_BODY:
            body = data[at:at + body_len]
            at += body_len
        job = Job(job_id, queue, body, repl, ctime, etime, delay, retry,
                  node_list(data, at, n_delivered))
        job.confirmed = node_list(data, at + n_delivered * NODE_ID_LEN, n_confirmed)
    else:
        (job_id, queue, body, state, flags, repl, ctime, etime, delay, retry, nacks,
         deliveries, delivered, confirmed, qtime, gc_retry, dl) = _unpackb(data, use_list=False)
        job = Job(job_id, queue, body, repl, ctime, etime, delay, retry, delivered)
        job.confirmed = confirmed
        if dl is not None:
            job.dl = DeadLetter.from_wire(list(dl))
    job.state = state  # state: WAIT_REPL -> ACTIVE | QUEUED (restore: back from disk as it went)
    job.flags = flags
    job.nacks = nacks
    job.deliveries = deliveries
    job.qtime = qtime
    job.gc_retry = gc_retry
    return job
