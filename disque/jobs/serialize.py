"""Job serialization in the original's binary layout (checklist section 9), used by the AOF's
LOADJOB records.

Little-endian: u32 length of the rest, then 68 fixed bytes: id[40], state (low 4 bits) and
GC attempt (high 4 bits) in one byte, flags u8, repl u16, etime u32 (unix seconds), ctime
u64, delay u32, retry u32, nacks u16, additional deliveries u16; then u32 length + queue
name, u32 length + body, u32 count + count x 40-byte node IDs (nodes-delivered).

A job with a dead-letter policy (disque-py only) has one more field after the node IDs:
u32 length + the msgpack array of `DeadLetter.to_wire()`. Jobs without one are laid out
exactly as the original's.

Storage form (the AOF) keeps the state and an absolute etime; message form (the bus) sends
"seconds left + 1" and clears the delivered flag, as the original.
"""

from __future__ import annotations

import struct

import msgpack  # type: ignore[import-untyped]

from disque.jobs.deadletter import DeadLetter
from disque.jobs.job import F_DELIVERED, Job

_FIXED = struct.Struct("<40sBBHIQIIHH")  # 68 bytes
_U32 = struct.Struct("<I")
_PERSISTED_FLAGS = 0x07  # bcast-queued, bcast-willqueue, delivered: the original's flags


class SerializeError(ValueError):
    """A serialized job that cannot be decoded."""


def serialize_job(job: Job, storage: bool = True, now_ms: int = 0,
                  with_body: bool = True) -> bytes:
    """`with_body=False`: an acknowledged job's record (its body is never needed again)."""
    etime_s = job.etime // 1000 if storage else max(0, (job.etime - now_ms) // 1000) + 1
    flags = job.flags & _PERSISTED_FLAGS
    if not storage:
        flags &= ~F_DELIVERED
    queue = job.queue or b""
    body = (job.body or b"") if with_body else b""
    delivered = job.delivered
    fixed = _FIXED.pack(job.id, (job.state & 0x0F) | (min(job.gc_retry, 15) << 4), flags,
                        job.repl & 0xFFFF, etime_s & 0xFFFFFFFF, job.ctime,
                        job.delay & 0xFFFFFFFF, job.retry & 0xFFFFFFFF, min(job.nacks, 0xFFFF),
                        min(job.deliveries, 0xFFFF))
    parts = [fixed, _U32.pack(len(queue)), queue, _U32.pack(len(body)), body,
             _U32.pack(len(delivered)), *delivered]
    if job.dl is not None:
        ext = msgpack.packb(job.dl.to_wire())
        parts += (_U32.pack(len(ext)), ext)
    rest = b"".join(parts)
    return _U32.pack(len(rest)) + rest


def deserialize_job(data: bytes, offset: int = 0, storage: bool = True,
                    now_ms: int = 0) -> tuple[Job, int]:
    """Decode one job at `offset`; returns (job, offset after it). Message form turns the
    relative etime back into an absolute one with `now_ms`."""
    try:
        (rest_len,) = _U32.unpack_from(data, offset)
        end = offset + 4 + rest_len
        if end > len(data) or rest_len < _FIXED.size + 12:
            raise SerializeError("serialized job is truncated")
        pos = offset + 4
        (job_id, state_gc, flags, repl, etime_s, ctime, delay, retry, nacks,
         deliveries) = _FIXED.unpack_from(data, pos)
        pos += _FIXED.size
        (qlen,) = _U32.unpack_from(data, pos)
        queue = bytes(data[pos + 4:pos + 4 + qlen])
        pos += 4 + qlen
        (blen,) = _U32.unpack_from(data, pos)
        body = bytes(data[pos + 4:pos + 4 + blen])
        pos += 4 + blen
        (count,) = _U32.unpack_from(data, pos)
        pos += 4
        ids_end = pos + 40 * count
        if ids_end > end or len(queue) != qlen or len(body) != blen:
            raise SerializeError("serialized job has inconsistent lengths")
        delivered = tuple(bytes(data[pos + 40 * i:pos + 40 * (i + 1)]) for i in range(count))
        dl = None
        if ids_end < end:
            (elen,) = _U32.unpack_from(data, ids_end)
            if ids_end + 4 + elen != end:
                raise SerializeError("serialized job has inconsistent lengths")
            try:
                dl = DeadLetter.from_wire(msgpack.unpackb(bytes(data[ids_end + 4:end])))
            except (ValueError, msgpack.UnpackException) as exc:
                raise SerializeError(f"bad dead-letter field: {exc}") from None
    except struct.error as exc:
        raise SerializeError(f"serialized job is truncated: {exc}") from None
    state = state_gc & 0x0F
    if state > 3:
        raise SerializeError(f"bad job state {state}")
    etime = etime_s * 1000 if storage else now_ms + (etime_s - 1) * 1000
    job = Job(bytes(job_id), queue, body, repl, ctime, etime, delay, retry, delivered)
    job.state = state
    job.gc_retry = state_gc >> 4
    job.flags = flags & _PERSISTED_FLAGS
    job.nacks = nacks
    job.deliveries = deliveries
    job.dl = dl
    return job, end
