"""Jobs as they travel on the bus: a `JobRecord` from a job, a job from a record, a job's
dead-letter state as QUEUED / WILLQUEUE carry it.

Used by every subsystem that sends or receives whole jobs (replication, federation,
re-replication, repair); below them all, so none has to import another for it.
"""

from __future__ import annotations

from typing import Final
from zlib import crc32

from disque.cluster.messages import (
    STATE_EPOCH_SHIFT,
    STATE_REASON_SHIFT,
    JobRecord,
    new_record,
)
from disque.jobs.job import ACTIVE, Job

HOLDERS_COUNT_MASK: Final = 0xFFFF  # SETACK's aux: the count below, the digest above


def holders_aux(delivered: tuple[bytes, ...]) -> int:
    """SETACK's aux ("may have"): how many nodes the sender lists for the job, as in the
    original, and above the low 16 bits a digest of which ones (their IDs' CRC-32 XORed,
    never 0; 0 there: no digest, as in a SETACK that is an answer, `tell_collected`). The
    count alone told a holder whose list was longer to collect the job over its own; but
    lists here also shrink (re-replication unlists a restarted node that has its copies
    elsewhere), and two of the same length can name different nodes: a holder only one of
    them named was never asked (chaos random-kill seed 9: a copy delivered 2.8 s after its
    ACK). With the digest a holder whose list differs collects the job over its own."""
    digest = 0
    for n in delivered:
        digest ^= crc32(n)
    return ((digest or 1) << 16) | min(len(delivered), HOLDERS_COUNT_MASK)


def other_holders(aux: int, delivered: tuple[bytes, ...]) -> bool:
    """Whether a SETACK's or DELJOB's `aux` names a list of holders other than
    `delivered` (False when it carries no digest: an answer, a dummy ACK, FASTACK)."""
    return aux > HOLDERS_COUNT_MASK and holders_aux(delivered) != aux


def job_record(job: Job, now: int) -> JobRecord:
    """A job as it travels on the bus (expiry relative to the sender's clock)."""
    ttl = job.etime - now
    return new_record(JobRecord, (job.id, job.queue or b"", job.body or b"", job.repl,
                                  ttl if ttl > 0 else 0, job.ctime, job.delay, job.retry,
                                  job.nacks, job.deliveries, job.delivered, job.dl))


def job_from_record(rec: JobRecord, now: int, queue: bytes | None = None,
                    delivered: tuple[bytes, ...] | None = None) -> Job:
    """An active job from a record; `queue` / `delivered` replace the record's (a queue
    name object already held, a list with this node added)."""
    job = Job(rec.id, queue or rec.queue, rec.body, rec.repl, rec.ctime, now + rec.ttl_ms,
              rec.delay, rec.retry, rec.delivered if delivered is None else delivered)
    job.nacks = rec.nacks
    job.deliveries = rec.deliveries
    job.dl = rec.dl
    job.state = ACTIVE  # state: WAIT_REPL -> ACTIVE (a new Job object)
    return job


def state_bits(job: Job) -> int:
    """The job's dead-letter state as QUEUED / WILLQUEUE carry it in `aux` (see
    disque.cluster.deadletters)."""
    dl = job.dl
    if dl is None:
        return 0
    return (dl.epoch << STATE_EPOCH_SHIFT) | (dl.reason << STATE_REASON_SHIFT)


# ---------------------------------------------------------------------- copies in flight
# Re-replication and repair send copies (REPLJOB) and wait for their GOTJOB the same way.
CONFIRM_MS: Final = 1000  # a REPLJOB unconfirmed for this long is sent again (lost with a link)
MAX_ATTEMPTS: Final = 5


def overdue(inflight: dict[tuple[bytes, bytes], tuple[int, int]],
            now: int) -> list[tuple[tuple[bytes, bytes], int]]:
    """The copies in `inflight` ((node ID, job ID) -> (sent at, attempts)) still without
    their GOTJOB CONFIRM_MS after they were sent: [(key, attempts)]. Entries are inserted
    when sent (a copy sent again is removed first), so they are in the order of their
    send times: the walk stops at the first one not due."""
    due = []
    for key, (sent, attempts) in inflight.items():
        if now - sent < CONFIRM_MS:
            break
        due.append((key, attempts))
    return due


# ---------------------------------------------------------------------- paced walks
# Re-replication's and repair's walks send their copies in steps, paced by a rate.
CRON_PER_SECOND: Final = 10  # the cluster cron runs every 100 ms
STEP_MS: Final = 10  # a walk goes on in steps this far apart (short pauses for the clients)


# node ID -> its first 8 bytes as an int (`rank`): a cluster has a few nodes, the walks of
# re-replication and repair rank them for every job they look at (cleared if ever large)
_PREFIXES: dict[bytes, int] = {}


def _prefix(node_id: bytes) -> int:
    p = _PREFIXES.get(node_id)
    if p is None:
        if len(_PREFIXES) >= 1024:
            _PREFIXES.clear()
        p = _PREFIXES[node_id] = int.from_bytes(node_id[:8], "big")
    return p


def _salt(job_id: bytes) -> int:
    return int.from_bytes(job_id[11:19], "big")  # 8 of the job ID's random chars


def rank(node_id: bytes, job_id: bytes) -> int:
    """The order in which nodes are chosen to take a new copy of `job_id`: the first 8
    bytes of the node ID XORed with 8 of the job ID's random chars (lowest first)."""
    return _prefix(node_id) ^ _salt(job_id)


def first_sender(job_id: bytes, senders: list[bytes]) -> bytes:
    """Which of `senders` (holders of `job_id`, none of them the target) sends a copy of
    it that any of them could send: the node that created the job (its ID names the
    node's first 8 chars) last, the producers' node, whose loop serves their ADDJOBs
    (in a rolling restart, node 0 of `benchmarks.downnode` holds every job), then by
    `rank`. (One pass, no key tuples: the walks ask it for most jobs they look at.)"""
    creator = job_id[2:10]
    salt = _salt(job_id)
    best = b""
    best_rank = -1
    best_created = False
    for n in senders:
        created = n.startswith(creator)
        r = _prefix(n) ^ salt
        if best_rank < 0 or (best_created and not created) or (
                created == best_created and r < best_rank):
            best, best_rank, best_created = n, r, created
    return best


def allowance(tokens: float, rate: int, elapsed: int) -> float:
    """The copies `rate` (per second) allows after `elapsed` more ms, `tokens` left from
    before: never more than one cron's share (a late step makes no larger burst)."""
    return min(tokens + rate * elapsed / 1000, rate / CRON_PER_SECOND + 1)
