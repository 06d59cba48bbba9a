"""The worker's decisions, without I/O: what to send for each job and when, and when to stop.

`WorkerCore` is fed what happened (jobs fetched, a handler returned or raised, a command
failed, a signal came) and answers with `Command` values (ACKJOB, NACK [DELAY], WORKING) or
with yes/no (may this job start, may this fetcher go on). The drivers (`threads`, `aio`) only
move those to and from `disque.client`. No sockets, no sleeps; the clock and the random
source are injected, so every rule below is unit-tested by feeding events.

Rules and their reasons:
- Success -> ACKJOB (not FASTACK) on the node that delivered the job. ACKJOB is the spec's
  reliable acknowledgement: the job is kept as acked until every node holding a copy has
  confirmed, so a node that was partitioned or restarting cannot requeue it later and run it
  twice. FASTACK only broadcasts a best-effort delete; it saves the node work, not the
  worker (both answer at once), so the worker has no reason to give up the guarantee.
- Failure -> NACK with a delay computed from the job's counters (GETJOB WITHCOUNTERS):
  attempt = 1 + nacks + additional deliveries, delay = min(max_backoff, base x
  2^(attempt-1)) x uniform(0.5, 1), rounded up to whole seconds (NACK DELAY's unit). The
  jitter spreads the retries of jobs that failed together (an outage of what they call).
  With base 0 the NACK carries no DELAY and the job is back at once (as with the
  original Disque, which has no NACK DELAY). Giving up after N failures is the node's job
  (dead-letter limits on the job), not the worker's: the worker only reports the failure.
- A job is *held* from the GETJOB that delivered it until its ACK/NACK: the node requeues
  it when its RETRY elapses, so held jobs get WORKING heartbeats, waiting ones of a batch
  too. The schedule is the client's `Heartbeats` with fraction 0.5: a SHOW after
  `first_check` seconds tells the job's RETRY and time to requeue, then WORKING at half of
  it, and again at half of the RETRY each WORKING returns. Jobs done sooner cost nothing.
- Stop (first SIGTERM/SIGINT): no new GETJOB, running handlers finish and are acked or
  nacked as usual, jobs fetched but not started are NACKed without delay so that another
  worker gets them at once. A second signal forces the exit: running jobs are left to their
  RETRY.
- Burst: a fetcher whose GETJOB (which waits up to the GETJOB timeout, long enough for the
  node to import jobs from the others) returns nothing ends; the worker exits when every
  fetcher has ended and the jobs it holds are done.
- A command the delivering node cannot take because it is unreachable or leaving goes to any
  other node instead: ACKJOB and WORKING always (idempotent, and any holder spreads them),
  NACK only if nothing was sent (a resent NACK could count twice). What still fails is left
  to the job's RETRY.

Two drivers run this policy, each around its own client (`threads` with `Client`, `aio`
with `AsyncClient`), for `disque-worker` and for the client's own `consume()`. The settings
where the two differ are the core's constructor arguments, each with the worker's default:
- `backoff_base` 0: a plain NACK, back at once (`consume()`);
- `give_back` False: jobs fetched before a stop are still run (`consume()`), not given back;
- `forcible` False: a second stop request is no forced exit (`consume()` has none);
- `max_jobs`: stop after exactly that many jobs. Each fetch reserves the jobs it asks for
  (`fetch_count`), so concurrent fetchers never receive more than `max_jobs` together;
- `follow_every` N: every N jobs, when most recent jobs were created by another node, name
  that node's ID prefix (`producers_prefix`) so the driver moves the client there (the
  spec's "consume where the producers produce", `nodes.PrefixStats`);
- `heartbeats` False: no SHOW / WORKING; `fraction` of the requeue time at which WORKING
  goes (0.5; `consume()` 0.8); `fetch_retry_first` / `fetch_retry_max`, the waits after a
  failed GETJOB (doubling from the first; `consume()` waits `error_backoff` each time);
  `max_notes`, how many error texts are kept for the report.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

# (submodules, not the `disque.client` package: the client's consume() imports this module)
from disque.client.errors import DisqueConnectionError, LeavingError
from disque.client.nodes import Node, PrefixStats
from disque.client.replies import Job

ACK = "ack"
NACK = "nack"
ENQUEUE = "enqueue"  # a job given back at stop: it did not fail (no nack, no backoff)
WORKING = "working"
SHOW = "show"  # the first heartbeat step: learn the job's RETRY and time to requeue


Reply = int | dict[str, Any] | None  # ACKJOB / NACK / ENQUEUE / WORKING: int; SHOW: a dict


@dataclass(slots=True)
class InFlight:
    """A held job's heartbeat: when it is due, and on which node."""

    job_id: str
    node: Node | None
    due: float
    checked: bool = False  # SHOW done: `due` now comes from the node's requeue time


class Heartbeats:
    """When each held job needs its next WORKING. Pure: the caller sends SHOW/WORKING and
    reports the answers. A SHOW after `first_check` seconds tells the job's RETRY and time
    to requeue; WORKING goes at `fraction` of that, then at `fraction` of each RETRY that
    WORKING answers."""

    def __init__(self, first_check: float = 0.2, fraction: float = 0.8) -> None:
        self.first_check = first_check
        self.fraction = fraction
        self.jobs: dict[str, InFlight] = {}

    def add(self, job_id: str, node: Node | None, now: float) -> None:
        self.jobs[job_id] = InFlight(job_id, node, now + self.first_check)

    def remove(self, job_id: str) -> None:
        self.jobs.pop(job_id, None)

    def due(self, now: float) -> list[InFlight]:
        return [e for e in self.jobs.values() if e.due <= now]

    def next_due(self) -> float | None:
        return min((e.due for e in self.jobs.values()), default=None)

    def on_show(self, entry: InFlight, show: dict[str, Any] | None, now: float) -> bool:
        """After SHOW: schedule the first WORKING before the node's requeue time. False (and
        the job is dropped) when there is nothing to postpone: unknown or RETRY 0 job."""
        retry = int(show.get("retry") or 0) if show else 0
        requeue_ms = show.get("next-requeue-within") if show else None
        if not retry or requeue_ms is None:
            self.remove(entry.job_id)
            return False
        entry.checked = True
        entry.due = now + self.fraction * min(int(requeue_ms) / 1000.0, float(retry))
        return True

    def on_working(self, entry: InFlight, retry: int | None, now: float) -> bool:
        """After WORKING answered `retry` seconds (None: it failed with NOJOB/TOOLATE)."""
        if not retry:
            self.remove(entry.job_id)
            return False
        entry.due = now + self.fraction * retry
        return True


@dataclass(slots=True, frozen=True)
class Command:
    """One command for the driver to send: `kind` ACK / NACK / ENQUEUE / WORKING / SHOW for
    `job_id`, to `node` (None: any node, the client's current one), NACK with `delay`
    seconds (0: none). `given_back` marks the ENQUEUE of a job fetched but never started."""

    kind: str
    job_id: str
    node: Node | None = None
    delay: int = 0
    given_back: bool = False


@dataclass(slots=True)
class WorkerStats:
    """What the worker did; `summary()` of the core reports it on exit."""

    received: int = 0    # jobs GETJOB delivered
    processed: int = 0   # handlers that ran to the end, returning or raising
    failed: int = 0      # of those, the ones that raised
    acked: int = 0       # ACKJOBs a node took
    nacked: int = 0      # NACKs a node took (failures)
    given_back: int = 0  # fetched but not started because the worker stopped
    working: int = 0     # WORKING heartbeats sent
    errors: int = 0      # commands no node took (the job comes back after its RETRY)
    fetch_errors: int = 0
    switches: int = 0    # moves of the client next to the producers
    started: float = 0.0
    handler_seconds: float = 0.0
    errors_seen: list[str] = field(default_factory=list)


def attempt_of(job: Job) -> int:
    """The delivery this is, 1 for the first: counters from GETJOB WITHCOUNTERS (best-effort,
    as the spec says; missing counters count as 0)."""
    return 1 + (job.nacks or 0) + (job.additional_deliveries or 0)


def backoff_seconds(attempt: int, base: float, max_backoff: float, jitter: float) -> int:
    """NACK delay after failed `attempt`: min(max_backoff, base x 2^(attempt-1)) scaled by
    `jitter` (drawn from [0.5, 1]), rounded up to whole seconds; 0 when base is 0."""
    if base <= 0:
        return 0
    exponent = min(max(attempt, 1) - 1, 62)  # 2^62 x base is past any max_backoff
    return max(1, math.ceil(min(max_backoff, base * 2.0 ** exponent) * jitter))


class WorkerCore:
    """See the module docstring. Not thread-safe: the threaded driver calls it under a lock."""

    RUNNING, STOPPING, FORCED = "running", "stopping", "forced"

    def __init__(self, *, burst: bool = False, backoff_base: float = 1.0,
                 max_backoff: float = 300.0, first_check: float = 0.2,
                 fetch_retry_max: float = 5.0, rng: random.Random | None = None,
                 clock: Callable[[], float] = time.monotonic, count: int = 1,
                 max_jobs: int | None = None, give_back: bool = True, forcible: bool = True,
                 heartbeats: bool = True, fraction: float = 0.5,
                 fetch_retry_first: float = 0.1, follow_every: int | None = None,
                 max_notes: int = 20) -> None:
        if backoff_base < 0 or max_backoff < 0:
            raise ValueError("backoff values must be >= 0")
        self.burst = burst
        self.backoff_base = backoff_base
        self.max_backoff = max_backoff
        self.fetch_retry_first = fetch_retry_first
        self.fetch_retry_max = fetch_retry_max
        self.rng = rng or random.Random()
        self.clock = clock
        self.count = count
        self.max_jobs = max_jobs
        self.give_back = give_back
        self.forcible = forcible
        self.heartbeating = heartbeats
        self.follow_every = follow_every
        self.max_notes = max_notes
        self.state = self.RUNNING
        self.stop_reason = ""
        self.heartbeats = Heartbeats(first_check=first_check, fraction=fraction)
        self.held: dict[str, Job] = {}
        self.running: dict[str, float] = {}  # job ID -> when its handler started
        self.fetch_failures = 0
        self.reserved = 0  # jobs asked for by GETJOBs in flight (with max_jobs)
        self.prefixes = PrefixStats() if follow_every else None
        self.since_follow = 0
        self.stats = WorkerStats(started=clock())

    # -- stopping --------------------------------------------------------------------------
    def stop(self, reason: str) -> bool:
        """A stop request (signal, or the caller's). True when it forces the exit now: the
        second request, given while the first still waits for running jobs (if `forcible`)."""
        if self.state == self.RUNNING:
            self.state = self.STOPPING
            self.stop_reason = reason
            return False
        if not self.forcible or self.state == self.FORCED:
            return self.state == self.FORCED
        self.state = self.FORCED
        self.stop_reason = f"{self.stop_reason}, then {reason}: forced"
        return True

    @property
    def fetching(self) -> bool:
        """Whether a fetch loop may send another GETJOB."""
        return self.state == self.RUNNING

    # -- fetching --------------------------------------------------------------------------
    def fetch_count(self) -> int:
        """How many jobs the next GETJOB asks for (its COUNT), reserved until `fetched` or
        `fetch_failed` says how many came. 0: this fetch loop ends; once `max_jobs` jobs
        were received the core stops (reason "max_jobs"). A loop whose share is 0 while
        another still waits for reserved jobs ends without stopping the others."""
        if not self.fetching:
            return 0
        if self.max_jobs is None:
            return self.count
        want = min(self.count, self.max_jobs - self.reserved - self.stats.received)
        if want <= 0:
            if self.stats.received >= self.max_jobs:
                self.stop("max_jobs")
            return 0
        self.reserved += want
        return want

    def fetched(self, jobs: list[Job], node: Node | None, asked: int = 0) -> bool:
        """A GETJOB for `asked` jobs answered `jobs` (from `node`). Returns whether this
        fetch loop goes on after handling them: False in burst mode when the queues were
        empty."""
        self.fetch_failures = 0
        self.reserved -= asked if self.max_jobs is not None else 0
        self.stats.received += len(jobs)
        now = self.clock()
        for job in jobs:
            self.held[job.id] = job
            if self.heartbeating:
                self.heartbeats.add(job.id, node, now)
        if self.prefixes is not None:
            for job in jobs:
                self.prefixes.observe(job.id)
            self.since_follow += len(jobs)
        return bool(jobs) or not self.burst

    def fetch_failed(self, error: BaseException, asked: int = 0) -> float:
        """A GETJOB for `asked` jobs failed (no node reachable, ...): seconds to wait before
        the next one, doubling from `fetch_retry_first` up to `fetch_retry_max` while
        failures go on."""
        self.reserved -= asked if self.max_jobs is not None else 0
        self.stats.fetch_errors += 1
        self.fetch_failures += 1
        self._note(f"GETJOB: {error}")
        return min(self.fetch_retry_max,
                   self.fetch_retry_first * 2.0 ** min(self.fetch_failures - 1, 30))

    def producers_prefix(self, current: Node | None) -> str | None:
        """Every `follow_every` jobs: the ID prefix of the node that created most recent
        jobs, when it is not `current` (the node the client is on); else None."""
        if self.prefixes is None or self.follow_every is None:
            return None
        if self.since_follow < self.follow_every:
            return None
        self.since_follow = 0
        prefix = self.prefixes.preferred()
        if prefix is None or current is None or current.prefix == prefix:
            return None
        return prefix

    def followed(self, addr: str, error: BaseException | None) -> None:
        """The driver moved the client to the producers' node `addr` (or failed: `error`)."""
        if error is None:
            self.stats.switches += 1
        else:
            self._note(f"moving to {addr}: {error}")

    def may_start(self, job: Job) -> bool:
        """Whether to run the handler on `job` now; if not, give it back (`given_back`)."""
        if self.state == self.FORCED or (self.give_back and self.state != self.RUNNING):
            return False
        self.running[job.id] = self.clock()
        return True

    # -- outcomes --------------------------------------------------------------------------
    def succeeded(self, job: Job, node: Node | None) -> Command:
        self._ran(job)
        return Command(ACK, job.id, node)

    def failed(self, job: Job, node: Node | None) -> Command:
        """The handler raised: NACK with the backoff of this attempt."""
        self._ran(job)
        self.stats.failed += 1
        delay = backoff_seconds(attempt_of(job), self.backoff_base, self.max_backoff,
                                self.rng.uniform(0.5, 1.0))
        return Command(NACK, job.id, node, delay)

    def given_back(self, job: Job, node: Node | None) -> Command:
        """A job fetched but not started (stopping): ENQUEUE now, for another worker. Not a
        NACK: it did not fail, so it must not count toward MAXNACKS (a worker restart would
        otherwise send jobs to their dead-letter queue); like any redelivery it counts as
        an additional delivery."""
        return Command(ENQUEUE, job.id, node, 0, given_back=True)

    def _ran(self, job: Job) -> None:
        self.stats.processed += 1
        started = self.running.pop(job.id, None)
        if started is not None:
            self.stats.handler_seconds += self.clock() - started

    def sent(self, command: Command, reply: Reply) -> None:
        """A node answered `command`: ACKJOB / NACK how many jobs it knew, WORKING the
        seconds until the job would be requeued, SHOW the job (None: unknown there)."""
        kind = command.kind
        if kind in (SHOW, WORKING):
            entry = self.heartbeats.jobs.get(command.job_id)
            if kind == WORKING:
                self.stats.working += 1
            if entry is not None:
                if kind == SHOW:
                    self.heartbeats.on_show(entry, reply if isinstance(reply, dict) else None,
                                            self.clock())
                else:
                    self.heartbeats.on_working(entry, reply if isinstance(reply, int) else None,
                                               self.clock())
            return
        if kind == ACK:
            self.stats.acked += 1
        elif not reply:  # the node held no copy to put back: the job comes back by its RETRY
            self._note(f"{kind.upper()} {command.job_id}: the node did not hold it")
        elif kind == NACK:
            self.stats.nacked += 1
        if command.given_back:
            self.stats.given_back += 1
        self.release(command.job_id)

    def not_sent(self, command: Command, error: BaseException) -> Command | None:
        """`command` failed with `error`: the same command for another node, or None (give
        up: the job is left to its RETRY; a failed ACK/NACK is counted in `errors`)."""
        if command.node is not None and (
                isinstance(error, LeavingError) or (isinstance(error, DisqueConnectionError)
                                                    and (command.kind != NACK
                                                         or error.unreachable))):
            return Command(command.kind, command.job_id, None, command.delay,
                           command.given_back)
        if command.kind in (SHOW, WORKING):
            entry = self.heartbeats.jobs.get(command.job_id)
            if entry is not None:  # nothing to postpone any more (NOJOB, TOOLATE, ...)
                self.heartbeats.on_working(entry, None, self.clock())
            return None
        self.stats.errors += 1
        self._note(f"{command.kind.upper()} {command.job_id}: {error}")
        if command.given_back:
            self.stats.given_back += 1
        self.release(command.job_id)
        return None

    def release(self, job_id: str) -> None:
        """The job is no longer ours (acked, nacked, or given up)."""
        self.held.pop(job_id, None)
        self.running.pop(job_id, None)
        self.heartbeats.remove(job_id)

    # -- heartbeats ------------------------------------------------------------------------
    def heartbeats_due(self) -> list[Command]:
        """The SHOW (first time) or WORKING of each held job due for one now. The entry is
        pushed back meanwhile, so that a slow answer does not make it due twice."""
        now = self.clock()
        out: list[Command] = []
        for entry in self.heartbeats.due(now):
            out.append(Command(WORKING if entry.checked else SHOW, entry.job_id, entry.node))
            entry.due = now + self.heartbeats.first_check
        return out

    def next_heartbeat_in(self, idle: float = 0.5) -> float:
        """Seconds until the next heartbeat is due (at most `idle`)."""
        nxt = self.heartbeats.next_due()
        return idle if nxt is None else max(0.0, min(idle, nxt - self.clock()))

    # -- reporting -------------------------------------------------------------------------
    def _note(self, text: str) -> None:
        if len(self.stats.errors_seen) < self.max_notes:
            self.stats.errors_seen.append(text)

    def summary(self) -> dict[str, Any]:
        s = self.stats
        return {
            "processed": s.processed, "succeeded": s.processed - s.failed, "failed": s.failed,
            "acked": s.acked, "nacked": s.nacked, "given_back": s.given_back,
            "working": s.working, "errors": s.errors, "fetch_errors": s.fetch_errors,
            "seconds": round(self.clock() - s.started, 3),
            "handler_seconds": round(s.handler_seconds, 3),
            "stop": self.stop_reason or "burst: queues empty",
            "notes": s.errors_seen[:5],  # the first commands that failed, and why
        }
