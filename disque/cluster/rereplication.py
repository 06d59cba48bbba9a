"""Re-replication: the copies a restarted node lost are made again (issue 13, part 1).

The original Disque keeps a job only as long as one of its REPLICATE copies survives and
never restores a lost one, so a rolling restart without AOF wears every copy away. Here a
node that restarts announces a new incarnation in its bus headers (a random number drawn at
start, `messages.INCARNATION_SHIFT`; membership keeps it in `ClusterNode.incarnation`).
Every node holding a job that lists the restarted node among its copies looks at the job
again: if the job has REPLICATE copies without it (this node, and holders linked and not
restarted themselves, whose copies are confirmed: repair made them while the node was
down), the restarted node leaves this node's list of the job (`rereplication_unlisted`),
unless its headers announce an AOF (PERSIST_FLAG: it may have reloaded its copies, and
unlisted it would miss the QUEUED, SETACK and dead-letter exchanges of those);
else the job is sent to it again (REPLJOB, as ADDJOB's replication does), the restarted
node keeps a copy (active, re-queued by its own timer after RETRY unless another holder
queues it or an ACK arrives) and confirms with GOTJOB; it takes the list from the REPLJOB.
So a restart costs copies only for the jobs short of their REPLICATE, not a copy of every
job the node ever held: with a large backlog and nodes restarting every few seconds, the
copies of every restart would starve the repairs that keep jobs alive (a 60 s random-kill
chaos run lost up to a third of 150,000 jobs so). A holder that keeps a copy the others
unlisted is listed again by its WILLQUEUE (`requeue.on_willqueue`).

A node first heard from more than FIRST_SIGHT_MS after this node's first cron counts as
restarted too: it was down when this node started, so its restart could not be seen, and
the copies this node received since may list it as a holder (the simulation's seed 1147;
a chaos run lost jobs to a node first heard from 1.9 s after this node's start, when the
limit was 2 s: counted as a holder without a copy, it was ranked first to repair them).
nodes.conf keeps the incarnation last heard from each node, so after our own restart a
node heard with the one we knew did not restart meanwhile and one heard with another did,
however late either is heard; the rule above serves only the nodes we had not heard from
(a busy cluster answered a restarted node's first PINGs ~500 ms late, and the refilled node
then sent the others a copy of every job it got, which cost them a read from disk each
with overflow on).

Every restart counts, AOF or not: with appendfsync everysec (or a damaged AOF) a reloaded
node may still miss the copies of its last second, and a REPLJOB for a copy it reloaded
only merges node lists.

Each holder of a job decides whether the job is sent (holders' views of who is alive
differ during a restart), but one of them sends it: of the holders listed that are linked
and not being refilled themselves, the one `records.first_sender` ranks first (the job's
creator last: the node its producers talk to, whose loop serves their ADDJOBs). The others
leave it to that one (`_leave`). The restarted node answers a copy of a job created before
it started with GOTJOB to every holder listed, not only the sender (replication's
`tell_holders`), so they learn it holds the job (`got_copy`). A holder sends a copy it
left itself (`_release`) once the one it left it to is no longer a linked holder, once the
restarted node has confirmed nothing to it for STALL_MS (that holder's walk is over, or it
lists the job without holding it), or DEFER_MAX_MS after it left it; until then the walk
for the restarted node is not over (its cursor WALKED), so the node counts as a holder of
a left job only once it confirmed it (repair copies the job if it is short meanwhile).
Every holder sending every job doubled the copies of a restart with REPLICATE 3, and in
`benchmarks.downnode`'s rolling kill node 0, which holds every job, sent all of them.

Rules:
- only jobs that may still be delivered are sent: state active or queued, RETRY > 0
  (an at-most-once job must never get a second copy that could queue it again), not a
  dummy ACK, and not a copy reloaded from the AOF that no other holder confirmed yet
  (F_RELOADED: it may be the ghost of a job acknowledged and collected while this node
  was down; copied, it would look alive to the restarted node and be queued again there);
  acked jobs keep being collected by the ACK GC;
- at most `rate` REPLJOBs per second (directive `rereplicate-rate`, 0: off), so restoring
  millions of copies does not starve clients; the cluster cron (100 ms) notices restarts,
  and the copies go out in steps every STEP_MS, each sending what the rate allows since the
  last (50 at the default rate: one burst of 500 every cron held up, on the node that
  took them, the replies of the ADDJOBs queued behind it; `benchmarks.downnode`, ADDJOB
  p99 once a restarted node is back: 1.8 ms against 4.3 with 3 nodes, 2.7 against 3.0
  with 5, and 5.0 against 6.4 in the rolling kill);
- the registry is walked shard by shard with a cursor per restarted node (the registry's
  shards never change, so no job present for the whole walk is missed), SCAN_PER_STEP
  jobs per step at most; the walk of a node waits while there is no bus link to it,
  and starts over when it restarts again;
- a REPLJOB without a GOTJOB within CONFIRM_MS is sent again (once the node is reachable),
  at most MAX_ATTEMPTS times (a node that refuses copies, e.g. above its memory limit, is
  not asked forever);
- while a node is being refilled, the jobs it confirmed to this node since its restart
  (GOTJOB for a copy of the walk, a recheck or a repair) are kept (`copied`, until the
  walk ends or it restarts again): they are not sent to it again, and repair counts it
  as a holder of those (`has_copy`). Without this, with overflow on, a queued job that
  went to disk and came back every second or so (its other holders' WILLQUEUEs read it
  back) was rechecked and sent to the refilled node each time: ~3 copies a job, up to
  10, and every job listing that node looked one crash from lost to repair; chaos
  random-kill with overflow lost 841-1,620 jobs of ~85,000 in seed 3 so.

Copies that reach this node after its walk for a restarted node went past them would list
that node for good: the holder that sent them (a repair's copy, or a merge) may not have
looked at them for the restarted node yet, and may then unlist it only in its own list.
Counted as a holder, the restarted node hides how few copies the job has (a chaos
random-kill run lost jobs whose last holder counted such a node and did not repair them
first). So for RECHECK_MS after a restart, each copy held or merged from a REPLJOB that
lists the restarted node (not sent by it) and was created before the restart is looked at
again as the walk would (`copies_held`): the node leaves our list, or gets the job. The
sender's walk may send it too (a merge): leaving that to the sender, while it is alive,
lost thousands of jobs in chaos random-kill (it dies before its walk comes to the job).

The same copies serve the replication subsystem's phantom holders (`copy_again`): a node an
ADDJOB listed that never confirmed its copy gets the job this way, until its GOTJOB.

INFO (jobs section): `rereplication_nodes` (restarted nodes whose copies are being
restored), `rereplication_pending` (copies sent, GOTJOB not back yet), `rereplicated_jobs`
(copies confirmed since start), `rereplication_unlisted` (listings of restarted nodes
dropped because the job had its copies elsewhere, since start), `rereplication_rechecks`
(copies received listing a restarted node, waiting to be looked at again),
`rereplication_rechecked` (of those, copies sent again, since start) and
`rereplication_left` (copies left to another holder, waiting for the restarted node's
GOTJOB).
"""

from __future__ import annotations

from typing import Final

from disque.cluster.messages import ReplJob
from disque.cluster.nodes import HANDSHAKE, MYSELF
from disque.cluster.records import (
    CONFIRM_MS,
    CRON_PER_SECOND,
    MAX_ATTEMPTS,
    STEP_MS,
    allowance,
    first_sender,
    job_record,
    overdue,
)
from disque.jobs.job import ACTIVE, F_DUMMY, F_RELOADED, QUEUED, Job
from disque.state import NodeState
from disque.timers import Timer

DEFAULT_RATE: Final = 5000  # copies per second (rereplicate-rate)
_NONE: Final[frozenset[bytes]] = frozenset()  # no confirmed copy yet
# A node first heard from this long after our own first cron was down (or unknown) when
# we started: it may have restarted meanwhile, so it counts as a restarted node. A node
# that was up answers our first PINGs: in the chaos runs, all were heard by the first cron.
FIRST_SIGHT_MS: Final = 500
# Jobs looked at per step and restarted node at most: a walk over a registry of millions
# that finds few jobs to send (a node that joins, or held few of them) goes on over several
# steps instead of pausing the clients for a large part of a second.
SCAN_PER_STEP: Final = 2000
DISK_STEP: Final = 1000  # jobs on disk read at a time (disque.overflow)
DISK_WEIGHT: Final = 8  # rows SQLite looks at for the cost of one job looked at here
# How long after a restart copies received listing the restarted node are looked at again
# (the other holders' walks for it finish within this, at the default rate and backlogs of
# a million jobs). Only jobs created before we noticed the restart, with SKEW_MS of slack
# for the nodes' clocks, are (a job created since lists the node because it took a copy
# after its restart). (Rechecking only the jobs created 500 ms before it lost 600-11,000
# of 90,000-105,000 jobs in three chaos random-kill runs, against 0-588 with this slack.)
RECHECK_MS: Final = 30_000
SKEW_MS: Final = 1000
# A copy that another linked holder sends first (`records.first_sender`) is left to it
# (`_leave`); this node sends it itself once that holder is no longer a linked holder, once
# the restarted node confirmed no copy to us for STALL_MS (that holder's walk is over, or it
# never held the job), or DEFER_MAX_MS after it was left.
STALL_MS: Final = 1000
DEFER_MAX_MS: Final = 10_000
# A walk's cursor once it looked at every job while copies it left to others wait: the
# restarted node is still refilled (counted a holder only of the jobs it confirmed).
WALKED: Final = 1 << 62


class Rereplication:
    """Held by the node (`node.rereplication`); `tick(now)` from the cluster cron,
    `confirmed(sender, job_id)` for a GOTJOB that answers none of ADDJOB's REPLJOBs.

    The node's door: `membership.nodes()`, `jobs.shard_count()` / `jobs.shard(i)`,
    `disk_listing(after, n, nodes)`, `send(node_id, msg)`, `header()`, `linked_others()`, `myself`."""

    __slots__ = ("node", "rate", "seen", "cursors", "inflight", "rereplicated", "unlisted",
                 "since", "recent", "rechecks", "rechecked", "disk_ends", "copied", "timer",
                 "tokens", "last_step", "left", "progress", "recent_before")

    def __init__(self, node: NodeState, rate: int = DEFAULT_RATE) -> None:
        self.node = node
        self.rate = rate  # copies per second; 0: re-replication off
        self.seen: dict[bytes, int] = {}  # node ID -> incarnation last seen
        # restarted node -> next registry shard (past the shard count: the jobs on disk)
        self.cursors: dict[bytes, int] = {}
        # restarted node -> the newest segment on disk when its walk reached the disk (the
        # walk ends there: jobs it brings back that go to disk again land past it)
        self.disk_ends: dict[bytes, int] = {}
        # (node ID, job ID) -> (sent at ms, attempts): REPLJOBs waiting for their GOTJOB
        self.inflight: dict[tuple[bytes, bytes], tuple[int, int]] = {}
        # restarted node being refilled -> the jobs it confirmed a copy of to this node
        # since its restart (re-replication's or repair's): it holds them, so they are not
        # sent to it again and count it as a holder (`has_copy`)
        self.copied: dict[bytes, set[bytes]] = {}
        self.rereplicated = 0
        self.unlisted = 0  # listings of a restarted node dropped: the job had its copies
        self.since = 0  # ms: the first tick (about our start)
        # restarted node -> (ms its restart was noticed, ctime before which its listings
        # may be stale)
        self.recent: dict[bytes, tuple[int, int]] = {}
        # the latest of those ctimes: a copy created since is rechecked for none of them
        self.recent_before = 0
        # (restarted node, job ID): copies received listing a node restarted lately, to
        # look at again (in the order received; a dict: each once)
        self.rechecks: dict[tuple[bytes, bytes], None] = {}
        self.rechecked = 0  # of those, sent by this node (the others: unlisted or moot)
        self.timer = Timer(self.step)  # the next step (awake 0: not scheduled)
        self.tokens = 0.0  # copies the rate allows now
        self.last_step = 0  # ms
        # (restarted node, holder that sends first) -> (ms first left, job IDs): copies
        # left to another holder (`_leave`), sent from here if it does not (`_release`)
        self.left: dict[tuple[bytes, bytes], tuple[int, list[bytes]]] = {}
        # restarted node -> (copies it confirmed to us, ms that count last grew)
        self.progress: dict[bytes, tuple[int, int]] = {}

    # ------------------------------------------------------------------ events
    def tick(self, now: int) -> None:
        """Notice restarts; the first step of the copies they call for."""
        membership = self.node.membership
        if membership is None:
            return
        if not self.since:
            self.since = now
        for n in membership.nodes():
            inc = n.incarnation
            if not inc or n.bits & (MYSELF | HANDSHAKE):
                continue
            before = self.seen.get(n.id)
            if before != inc:
                self.seen[n.id] = inc
                # a node heard from only now, long after our start, was down then: what it
                # held may be lost (a restart we could not see), and the jobs we got since
                # list it (the simulation's seed 1147 lost a job whose last holder had
                # restarted while another holder was down, and never refilled it)
                if before is not None or now - self.since >= FIRST_SIGHT_MS:
                    self.restarted(n.id)
                    # a node first heard late restarted before that, if at all: without
                    # the slack (during a cluster's formation, the first second of its
                    # ADDJOBs looked stale: 9,000 needless copies in a healthy run)
                    slack = SKEW_MS if before is not None else -SKEW_MS
                    self.recent[n.id] = (now, (now + slack) * 1_000_000)
        if self.recent:
            for node_id, (at, _) in list(self.recent.items()):
                if now - at >= RECHECK_MS:
                    del self.recent[node_id]
            self.recent_before = max((b for _, b in self.recent.values()), default=0)
        if not self.rate:
            return
        if self.inflight or self.rechecks or self.left:
            # each cron, as before the steps (few copies; their lists keep what waits for
            # a link, looked at each time): the steps' tokens pay for them
            budget = max(1, self.rate // CRON_PER_SECOND)
            left = budget
            if self.inflight:
                left = self._resend(now, left)
            if self.rechecks:
                left = self._recheck(now, left)
            if self.left:
                left = self._release(now, left)
            self.tokens -= budget - left
        if self.cursors and not self.timer.awake:
            self.tokens = max(self.tokens, self.rate * STEP_MS / 1000, 1.0)  # a step's share
            self.last_step = now
            self.step(now)

    def step(self, now: int) -> None:
        """Walk on for the restarted nodes, sending the copies the rate allows since the
        last step (the timer's callback: the wheel cleared `awake`); the next step while a
        walk is under way."""
        if not (self.rate and self.cursors):
            return
        tokens = allowance(self.tokens, self.rate, now - self.last_step)
        self.last_step = now
        budget = int(tokens)
        left = budget
        for target in list(self.cursors):
            if left <= 0:
                break
            left = self._walk(target, now, left)
        # what a step leaves unspent is not saved up (a walk waiting for its link would
        # then send a burst); what a walk spent past its budget (the rest of a shard) is
        # made up for by the next steps
        self.tokens = min(tokens - (budget - left), 1.0)
        if any(cursor != WALKED for cursor in self.cursors.values()):
            self.node.wheel.schedule(self.timer, now + STEP_MS)

    def restarted(self, node_id: bytes) -> None:
        """`node_id` came back with a new incarnation: walk the registry for its copies
        (from the start again if a walk for it was under way)."""
        self.cursors[node_id] = 0
        self.copied.pop(node_id, None)  # what it held before is gone
        self.disk_ends.pop(node_id, None)
        self.progress.pop(node_id, None)
        for key in [k for k in self.left if k[0] == node_id]:
            del self.left[key]
        for key in [k for k in self.inflight if k[0] == node_id]:
            del self.inflight[key]
        for key in [k for k in self.rechecks if k[0] == node_id]:
            del self.rechecks[key]  # the walk from the start looks at them all

    def copies_held(self, sender: bytes, job_ids: list[bytes], oldest: int) -> None:
        """Copies this node took or merged from `sender`'s REPLJOB: those that list a node
        restarted less than RECHECK_MS ago (not the sender), were created before its
        restart and are not ahead of our walk for it are looked at again (`_recheck`: the
        sender's list may be stale). `oldest`: no copy of the REPLJOB was created before
        this ctime, so a REPLJOB of jobs created since every restart noticed is not
        looked at job by job (the usual case: new jobs; and for RECHECK_MS after any
        restart, or after a cluster forms, every REPLJOB came here)."""
        recent = self.recent
        if not recent or oldest >= self.recent_before:
            return
        lookup = self.node.lookup_job
        cursors = self.cursors
        jobs = self.node.jobs
        rechecks = self.rechecks
        for job_id in job_ids:
            job = lookup(job_id)
            if job is None:
                continue
            for target, (_, before) in recent.items():
                if target == sender or target not in job.delivered or job.ctime >= before:
                    continue
                cursor = cursors.get(target)
                if cursor is not None and jobs.shard_index(job_id) >= cursor:
                    continue  # the walk will come to it
                rechecks[(target, job_id)] = None

    def came_back(self, job: Job, segments: tuple[int, int]) -> None:
        """A job back from disk (disque.overflow; from the segments `segments`, lowest and
        highest ID) into a registry shard a walk may have passed while the job was on disk:
        looked at again for each restarted node it lists (a walk that has not passed its
        shard yet comes to it). Not for a walk of the disk that walked its segment (it
        looked at the job there) or whose end is older than it (the job went to disk after
        the shards were walked): a job read for a walk, or any job read back while a walk
        of the disk goes on, was sent again once per read, and the copies it sent were
        read back from disk on the other side (a refilled node took 4 copies of each job)."""
        cursors = self.cursors
        if not cursors:
            return
        jobs = self.node.jobs
        shard = jobs.shard_index(job.id)
        count = jobs.shard_count()
        lo, hi = segments
        for target, cursor in cursors.items():
            if cursor <= shard or target not in job.delivered or self.has_copy(target, job.id):
                continue
            if cursor >= count:
                end = self.disk_ends.get(target)
                if end is not None and (hi <= cursor - count or lo > end):
                    continue
            self.rechecks[(target, job.id)] = None

    def copy_again(self, target: bytes, job: Job, now: int) -> None:
        """Send `job` to `target`, which is listed for it without having confirmed a copy
        (disque.cluster.replication's phantom holders): now if it is reachable, else once
        its link is back; again until its GOTJOB, as the copies of a walk."""
        if (target, job.id) in self.inflight:
            return
        if self._reachable(target):
            self._send(target, job, now, 1)
        else:
            self.inflight[(target, job.id)] = (now - CONFIRM_MS, 0)  # due once reachable

    def confirmed(self, sender: bytes, job_id: bytes) -> None:
        if self.inflight.pop((sender, job_id), None) is not None:
            self.rereplicated += 1

    def got_copy(self, sender: bytes, job_id: bytes) -> None:
        """`sender` confirmed a copy of `job_id` (a GOTJOB answering no ADDJOB): a node
        being refilled holds it from now on."""
        if sender in self.cursors:
            copied = self.copied.get(sender)
            if copied is None:
                copied = self.copied[sender] = set()
            copied.add(job_id)

    def has_copy(self, node_id: bytes, job_id: bytes) -> bool:
        """Whether `node_id`, being refilled, confirmed a copy of `job_id` since its restart
        (the module's rules: why a refill keeps them)."""
        copied = self.copied.get(node_id)
        return copied is not None and job_id in copied

    # ------------------------------------------------------------------ internals
    def _reachable(self, node_id: bytes) -> bool:
        """Whether copies may go to `node_id` now: it is among the linked nodes ADDJOB
        replicates to (reachable, bus link up). Not a leaving node: it refuses copies (no
        GOTJOB), so sent to it they would only spend their attempts, and a node restarted
        then marked LEAVING for a while would never get its copies back once it stops
        leaving."""
        return node_id in self.node.linked_others()

    def _wanted(self, job: Job, target: bytes) -> bool:
        return (target in job.delivered and job.state in (ACTIVE, QUEUED)
                and job.retry > 0 and not job.flags & (F_DUMMY | F_RELOADED))

    def _copies_without(self, job: Job, target: bytes, holders: set[bytes]) -> int:
        """This node's copy and those of the `holders` listed for `job`, but `target`'s
        and copies sent and not confirmed yet."""
        job_id = job.id
        inflight = self.inflight
        return 1 + sum(1 for n in job.delivered
                       if n != target and (n in holders or self.has_copy(n, job_id))
                       and (n, job_id) not in inflight)

    def _send(self, target: bytes, job: Job, now: int, attempts: int) -> None:
        node = self.node
        node.send(target, ReplJob(node.header(), job_record(job, now), False))
        self.inflight[(target, job.id)] = (now, attempts)

    def _walk(self, target: bytes, now: int, budget: int) -> int:
        """Send the copies of the next shards for `target`; the budget left."""
        cursor = self.cursors[target]
        if cursor == WALKED or not self._reachable(target):
            return budget  # copies left to others wait; or wait for the link
        jobs = self.node.jobs
        count = jobs.shard_count()
        inflight = self.inflight
        empty = self._empty(target)
        holders = self._holders()
        copied = self.copied.get(target, _NONE)
        looked = 0
        while cursor < count and budget > 0 and looked < SCAN_PER_STEP:
            shard = jobs.shard(cursor)
            cursor += 1
            if not shard:
                continue
            looked += len(shard)
            for job in list(shard.values()):
                if self._wanted(job, target) and (target, job.id) not in inflight \
                        and job.id not in copied:
                    budget -= self._restore(job, target, empty, holders, now)
        if cursor >= count and self.node.on_disk:
            # then the jobs on disk (disque.overflow; cursor = shard count + the row to go
            # on after): sent from disk as they are (`_job`)
            listing = (target,)
            if cursor == count:  # the disk phase starts: up to the newest segment now
                self.disk_ends[target] = self.node.disk_last()
            end = self.disk_ends.get(target, 0)
            while budget > 0 and looked < SCAN_PER_STEP:
                after, found = self.node.disk_listing(cursor - count, DISK_STEP, listing, end)
                looked += DISK_STEP // DISK_WEIGHT  # (rows read by SQLite: cheaper)
                # walked: the jobs it brings back below are not looked at again (came_back)
                self.cursors[target] = count + (after or end)
                for job_id, _ in found:
                    if (target, job_id) not in inflight and job_id not in copied:
                        back = self._job(job_id)
                        if back is not None and self._wanted(back, target):
                            budget -= self._restore(back, target, empty, holders, now)
                if not after:
                    cursor = count
                    break
                cursor = count + after
            else:
                self.cursors[target] = cursor
                return budget
        if cursor >= count:
            self._walked(target)
        else:
            self.cursors[target] = cursor
        return budget

    def _walked(self, target: bytes) -> None:
        """The walk for `target` looked at every job: it ends, unless copies it left to
        other holders still wait (`_release` ends it then)."""
        if any(key[0] == target for key in self.left):
            self.cursors[target] = WALKED
            return
        del self.cursors[target]
        self.copied.pop(target, None)  # it counts as a holder of every listed job now
        self.disk_ends.pop(target, None)
        self.progress.pop(target, None)

    def _restore(self, job: Job, target: bytes, empty: bool, holders: set[bytes],
                 now: int, leave: bool = True) -> int:
        """`job` lists the restarted `target`: unlist it, or send it the job (or, with
        `leave`, leave that to the linked holder that sends first); copies sent."""
        if empty and self._copies_without(job, target, holders) >= job.repl:
            # enough copies without the one target lost (repair made them while it was
            # down): it leaves the list instead of taking a copy again
            if self.node.jobs.get(job.id) is not job:  # read from disk: the job itself
                back = self.node.lookup_job(job.id)
                if back is None:
                    return 0
                job = back
            job.delivered = self.node.shared_delivered(
                tuple(n for n in job.delivered if n != target))
            self.unlisted += 1
            return 0
        if leave:
            myself = self.node.myself
            senders = [n for n in job.delivered if n in holders and n != target]
            if senders:
                senders.append(myself)
                sender = first_sender(job.id, senders)
                if sender != myself:
                    self._leave(target, sender, job.id, now)
                    return 0
        self._send(target, job, now, 1)
        return 1

    def _leave(self, target: bytes, sender: bytes, job_id: bytes, now: int) -> None:
        """Leave the copy of `job_id` for `target` to `sender`, which sends it first: the
        target tells us once it holds it (GOTJOB, `got_copy`), else `_release` sends it."""
        key = (target, sender)
        entry = self.left.get(key)
        if entry is None:
            entry = self.left[key] = (now, [])
        entry[1].append(job_id)

    def _release(self, now: int, budget: int) -> int:
        """Send the copies left to a holder that is no longer a linked holder (down,
        restarted, being refilled itself), or whose target confirmed nothing to us for
        STALL_MS, or left DEFER_MAX_MS ago, unless the target confirmed them meanwhile;
        the budget left."""
        holders = self._holders()
        progress = self.progress
        inflight = self.inflight
        for key in list(self.left):
            if budget <= 0:
                break
            target, sender = key
            since, ids = self.left[key]
            copied = self.copied.get(target, _NONE)
            seen = progress.get(target)
            if seen is None or seen[0] != len(copied):
                progress[target] = seen = (len(copied), now)
            if sender in holders and now - seen[1] < STALL_MS and now - since < DEFER_MAX_MS:
                continue  # its copies are coming
            if not self._reachable(target):
                continue  # wait for the link (or for its next restart)
            empty = self._empty(target)
            while ids and budget > 0:
                job_id = ids.pop()
                if (target, job_id) in inflight or job_id in copied:
                    continue
                job = self._job(job_id)
                if job is None or not self._wanted(job, target):
                    continue
                budget -= self._restore(job, target, empty, holders, now, False)
            if not ids:
                del self.left[key]
                if self.cursors.get(target) == WALKED:
                    self._walked(target)
        return budget

    def _job(self, job_id: bytes) -> Job | None:
        """The job in memory, or a copy read from disk and left there (disque.overflow):
        what is sent needs no more, and bringing each job of a walk back to memory cost a
        read, a write when it went back, and came_back's looks."""
        node = self.node
        job = node.jobs.get(job_id)
        if job is None and node.on_disk:
            job = node.disk_job(job_id)
        return job

    def _empty(self, target: bytes) -> bool:
        """Whether the restarted `target` came back without its copies: a target with an
        AOF may hold reloaded copies: it stays listed and gets them all (a REPLJOB for a
        copy it reloaded merges): unlisted, it would miss the QUEUED, SETACK and
        dead-letter exchanges of the copies it holds."""
        membership = self.node.membership
        peer = membership.get(target) if membership is not None else None
        return peer is not None and not peer.persistent

    def _holders(self) -> set[bytes]:
        """The nodes whose listed copies count: linked, and not being refilled themselves."""
        return set(self.node.linked_others()).difference(self.cursors)

    def _recheck(self, now: int, budget: int) -> int:
        """Look at the copies `copies_held` noted again; the budget left. Those of a target
        not reachable now wait for its link, until RECHECK_MS after its restart: a node
        still unreachable then (or forgotten) is not counted as a holder while it is, and
        comes back with a new incarnation if it restarted again."""
        inflight = self.inflight
        holders = self._holders()
        done: list[tuple[bytes, bytes]] = []
        # (a snapshot: a job brought back from disk here adds rechecks, see came_back)
        for key in list(self.rechecks):
            if budget <= 0:
                break
            target, job_id = key
            if not self._reachable(target):
                if target not in self.recent:
                    done.append(key)
                continue
            done.append(key)
            if key in inflight or self.has_copy(target, job_id):
                continue
            job = self._job(job_id)
            if job is None or not self._wanted(job, target):
                continue
            sent = self._restore(job, target, self._empty(target), holders, now, False)
            self.rechecked += sent
            budget -= sent
        for key in done:
            del self.rechecks[key]
        return budget

    def _resend(self, now: int, budget: int) -> int:
        for key, attempts in overdue(self.inflight, now):
            if budget <= 0:
                break
            target, job_id = key
            if not self._reachable(target):
                continue  # kept: sent again once the link is back
            del self.inflight[key]
            job = self._job(job_id)
            if job is None or attempts >= MAX_ATTEMPTS or not self._wanted(job, target):
                continue
            self._send(target, job, now, attempts + 1)
            budget -= 1
        return budget

    # ------------------------------------------------------------------ views
    def info_fields(self) -> list[tuple[str, int]]:
        return [("rereplication_nodes", len(self.cursors)),
                ("rereplication_pending", len(self.inflight)),
                ("rereplicated_jobs", self.rereplicated),
                ("rereplication_unlisted", self.unlisted),
                ("rereplication_rechecks", len(self.rechecks)),
                ("rereplication_rechecked", self.rechecked),
                ("rereplication_left", sum(len(ids) for _, ids in self.left.values()))]
