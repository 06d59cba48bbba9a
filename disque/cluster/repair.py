"""Repair of under-replicated jobs: a copy lost with a down node is made on another node
(issue 25, part 2).

Re-replication (disque.cluster.rereplication) restores the copies of a node that comes
back; while it is down, its jobs have one copy fewer, and if their other holders crash
before it returns, the jobs are gone. HDFS re-replicates the blocks of a dead datanode and
quorum queues replace a lost member for the same reason. Here, when a holder of a job has
been unreachable (no bus link, or flagged failing) for longer than a grace (`repair-grace`,
1000 ms by default, well under `cluster-node-timeout`), the job is copied to other nodes
until it has REPLICATE reachable copies again:

- each surviving holder walks its registry (shard by shard, in steps: below) when a node
  passes its grace, or when the set of linked nodes changes while some node is past it (a
  node came back, another went down: a target may have appeared);
- a job counts its reachable copies: this node, holders with a bus link, and holders still
  within their grace; not a holder that restarted empty and that this node's re-replication
  has not refilled with this job yet (its walk for that node under way and the node not
  having confirmed this job's copy since its restart, or that copy not confirmed yet:
  `Rereplication.has_copy`): counted, it would hide the job's shortage until its refill,
  which takes seconds with a large backlog, and a second crash in those seconds would lose
  the job.
  Fewer than REPLICATE, and the job gets new copies: first on the nodes it lists that
  restarted empty and were not refilled with it yet (the copy their refill would send
  anyway: no list grows, no other holder needs telling, no extra copy to collect later;
  once confirmed it counts, `has_copy`), then on linked nodes not listed, each group
  ranked for this job (node IDs XORed with the job ID's random chars, as `sender_wins`
  does, so the new copies spread over the cluster). In a rolling restart the node killed
  next shares a sixth of the jobs with the one still being refilled, and these are most
  of the urgent copies (~90,000 in `benchmarks.downnode`'s rolling kill); ranked with the
  others, two in three went to a third node, whose copy every holder then learned (a
  merge) and the ACK GC later collected, while the refill still sent the listed node its
  own (before `has_copy`, preferring the refilled node made the job look short until its
  refill reached it: copied there again and again, chaos random-kill lost 3,521 of 73,219
  jobs);
- the reachable holders are ranked as re-replication ranks its senders
  (`records.first_sender`: the node that created the job last, it serves the producers'
  ADDJOBs; in `benchmarks.downnode`'s rolling kill node 0 made every job, and ranked by
  `rank` alone it made half of the repairs, on the loop the clients wait on) and the one
  ranked first makes the copies; the others leave the job (`deferred`) and walk again
  DEFER_MS after their walk ends, copying what is still short then. Every holder copying
  at once doubled the copies a crash costs, and with a large backlog and a crash every few
  seconds the repairs fell behind (chaos random-kill lost jobs so); the others still copy,
  a second later, because a job's list can name a node that never got its copy (an
  ADDJOB's REPLJOB lost with a dropped connection, the job re-targeted): the only one to
  copy, that node would repair nothing, and the job, one crash from lost, would wait (the
  simulation's seed 468);
- the jobs of which this node holds the one copy counted go first: on every change an
  urgent walk (`urgent`) copies only those, one new copy each, before the other walk goes
  on, and not held to `repair-rate` (only to URGENT_PER_STEP copies a step): a second crash
  would lose them, one that the rest can survive. At four times the rate (20,000 copies a
  second by default) chaos random-kill still lost 5,348 of 113,737 jobs with a backlog of
  ~100,000 (a third of the backlog is left with one copy when two nodes are down, and the
  next kill can come two seconds later); not held to the rate, 0, the clients' rate within
  the run-to-run spread. A single node down leaves no such job, unless a node restarted
  empty is still being refilled (the last two nodes of a rolling restart);
- the repairer adds the new nodes to its node list of the job first, then sends them the
  job (REPLJOB, GOTJOB back); once a new copy is confirmed, the other reachable holders
  learn the grown list (REPLJOB without reply: a merge, or a copy for a holder that never
  got one). The list grows here before the copy exists so that an ACK racing with the
  repair reaches the new copy too (a SETACK with a shorter list makes the holder with the
  longer one run the GC). The others learn it only once the copy exists: a copy lost with
  a broken link would otherwise be a phantom on every holder's list, counted as a copy
  when its node is back, and the node could not be chosen again (the simulation's seed
  1147 lost a job so). A copy that is not confirmed leaves the list;
- ACK GC, requeues, dead letters and federation follow the node list, so they reach the new
  copy; when the old holder comes back, re-replication sends it the job with the grown list,
  and the extra copy is collected with the others once the job is acknowledged;
- only jobs that may still be delivered are copied (as re-replication: active or queued,
  RETRY > 0, no dummy ACK, no copy reloaded from the AOF that no holder confirmed yet); an
  at-most-once job (RETRY 0) never gets a second copy;
- the walk goes in steps every STEP_MS, each looking at SCAN_PER_STEP jobs at most and
  sending the copies the rate allows since the last step (the urgent walk: every
  URGENT_STEP_MS, URGENT_SCAN times as many jobs, URGENT_PER_STEP copies), so a walk
  through millions of jobs pauses the clients for a millisecond or two at a time, not
  for tens;
- at most `repair-rate` copies per second (0: off); a copy not
  confirmed within CONFIRM_MS is sent again while its target stays linked, at most
  MAX_ATTEMPTS times (then the target leaves the job's list here); both as re-replication.
  Such a copy is not counted meanwhile, and a job one crash from lost whose new copies all
  wait that long gets one on another node too, from the urgent walk that its resend starts
  (a node above its memory limit refuses copies without a word: the simulation's random
  kills at five times the load, seed 60024, lost jobs whose one new copy went, five times
  over 5 s, to such a node while their last holder crashed);
- a target that let MAX_ATTEMPTS copies go unanswered while linked (one above its memory
  limit) is asked for no copy for REFUSED_MS, and the walks run again at once, so the jobs
  it refused go to another node; once the pause is over they run again and may ask it
  again. Before, the next walk came only with a change of the nodes linked or down, and
  it ranked the same node first: with one node down and one refusing, a job could stay
  short of a copy as long as nothing changed;

INFO (jobs section): `underreplicated_jobs` (jobs held here that the last walk found with
fewer reachable copies than REPLICATE and did not repair from here, plus the repairs waiting
for their GOTJOB; 0 once every node is reachable again) and `repaired_jobs` (copies made on
new nodes and confirmed, since start).
"""

from __future__ import annotations

from typing import Final

from disque.cluster.messages import ReplJob
from disque.cluster.nodes import HANDSHAKE, LEAVING, MYSELF
from disque.cluster.records import (
    CONFIRM_MS,
    CRON_PER_SECOND,
    MAX_ATTEMPTS,
    STEP_MS,
    allowance,
    first_sender,
    job_record,
    overdue,
    rank,
)
from disque.cluster.rereplication import Rereplication
from disque.jobs.job import ACTIVE, F_DUMMY, F_RELOADED, QUEUED, Job
from disque.overflow.record import NODE_ID_LEN, node_list
from disque.state import NodeState
from disque.timers import Timer

DEFAULT_RATE: Final = 5000  # copies per second (repair-rate)
DEFAULT_GRACE_MS: Final = 1000  # a holder unreachable this long has its copies made again
SCAN_PER_STEP: Final = 2000  # jobs looked at per step
URGENT_SCAN: Final = 2  # the urgent walk looks at this many times more (its test per job is short)
# copies the urgent walk makes per step (it is not held to repair-rate), its steps
# URGENT_STEP_MS apart: up to 50,000 a second, in pauses of a millisecond or two (2,000
# a step every 10 ms made a rolling restart's p99 3-4 ms worse; 500 every 10 ms, p99
# 7.4-8.2 ms against 6.4-6.7 ms for 250 every 5 ms, at the same rolling rate)
URGENT_PER_STEP: Final = 250
URGENT_STEP_MS: Final = 5
DISK_STEP: Final = 1000  # jobs on disk read at a time (disque.overflow)
DISK_WEIGHT: Final = 8  # rows SQLite looks at for the cost of one job looked at here
DISK_DONE: Final = 1 << 62  # a walk's cursor once past the jobs on disk too
# A job short of copies is left to the reachable holder ranked first; this long after the
# walk that left it, the others walk again and copy what is still short (that holder may
# list the job without holding it)
DEFER_MS: Final = 1000
# a target that let MAX_ATTEMPTS copies go unanswered while linked is asked for none this long
REFUSED_MS: Final = 10_000


# what one walk step works out for a node list (`Repair._view_of`): whether it names a
# node past its grace, its reachable holders, the copies counted, the listed nodes this
# node is refilling; per distinct list
NodeView = tuple[bool, list[bytes], int, list[bytes]]
NodeLists = dict[tuple[bytes, ...], NodeView]


class Repair:
    """Held by the node (`node.repair`); `tick(now)` from the cluster cron,
    `confirmed(sender, job_id)` for a GOTJOB that answers neither ADDJOB nor
    re-replication.

    The node's door: `membership.nodes()`, `linked_others()`, `jobs.shard_count()` /
    `jobs.shard(i)`, `disk_listing(after, n, nodes)`, `lookup_job(id)`, `send(node_id, msg)`, `header()`,
    `myself`, `rng`."""

    __slots__ = ("node", "rate", "grace", "down", "stale_seen", "linked_seen", "view",
                 "cursor", "urgent", "urgent_again", "again", "timer", "tokens", "last_step", "inflight", "pending",
                 "deferred", "deferred_seen", "rewalk_at", "refused",
                 "repaired", "under", "found", "refilling", "disk_end", "hedged")

    def __init__(self, node: NodeState, refilling: Rereplication, rate: int = DEFAULT_RATE,
                 grace: int = DEFAULT_GRACE_MS) -> None:
        self.node = node
        self.refilling = refilling
        self.rate = rate  # copies per second; 0: repair off
        self.grace = grace  # ms a holder may be unreachable before its copies are made
        self.down: dict[bytes, int] = {}  # unreachable node -> since (ms)
        self.stale_seen: frozenset[bytes] = frozenset()  # past their grace at the last tick
        self.linked_seen: tuple[bytes, ...] | None = None  # the linked tuple of the last tick
        # what the last tick saw, for the steps: (linked, alive, spared, stale)
        self.view: tuple[tuple[bytes, ...], set[bytes], set[bytes], frozenset[bytes]] = (
            (), set(), set(), frozenset())
        # next registry shard of the walk under way (-1: none; past the shard count: the
        # jobs on disk)
        self.cursor = -1
        self.disk_end: dict[bool, int] = {}  # (urgent walk?) -> its last segment on disk
        # next shard of the urgent walk (-1: none): the jobs only this node holds among
        # the reachable ones, one crash from lost, go before the others on every change
        self.urgent = -1
        # a change while the urgent walk is under way: walk again once it ends. Restarted at
        # every change, a walk slower than the changes (a loaded node's steps come late; its
        # jobs on disk) never reached its end: chaos random-kill lost 375 of 110,143 jobs
        # (seed 5) so, and 2,720 of 81,260 with overflow on (seed 2)
        self.urgent_again = False
        self.again = False  # walk again once the walk under way ends
        self.timer = Timer(self.step)  # the walk's next step (awake 0: not scheduled)
        self.tokens = 0.0  # copies the rate allows now
        self.last_step = 0  # ms
        # (target, job ID) -> (sent at ms, attempts): copies waiting for their GOTJOB
        self.inflight: dict[tuple[bytes, bytes], tuple[int, int]] = {}
        self.pending: dict[bytes, int] = {}  # job ID -> its entries in `inflight`
        # jobs the urgent walk copied whose copy is not confirmed yet: one of them sent
        # again (`_resend`) walks the urgent walk again, which copies it elsewhere too
        self.hedged: set[bytes] = set()
        # short jobs left to the holder ranked first (this walk's, the last walk's)
        self.deferred: set[bytes] = set()
        self.deferred_seen: set[bytes] = set()
        self.rewalk_at = 0  # ms: walk again then, for the jobs deferred (0: no need)
        self.refused: dict[bytes, int] = {}  # target -> ms until which it is asked for no copy
        self.repaired = 0
        self.under = 0  # found by the last finished walk
        self.found = 0  # found so far by the walk under way

    # ------------------------------------------------------------------ events
    def tick(self, now: int) -> None:
        node = self.node
        membership = node.membership
        if membership is None or not self.rate:
            return
        linked = node.linked_others()
        down = self.down
        alive = set(linked)
        spared: set[bytes] = set()  # counted as holders: leaving (linked) or within grace
        known = set()
        for n in membership.nodes():
            if n.bits & (MYSELF | HANDSHAKE):
                continue
            known.add(n.id)
            if n.id in alive:
                down.pop(n.id, None)
            elif n.bits & LEAVING and n.out_link is not None:
                down.pop(n.id, None)
                spared.add(n.id)
            elif n.id not in down:
                down[n.id] = now
        for n_id in [n for n in down if n not in known]:
            del down[n_id]  # forgotten: its copies count as lost
        refused = self.refused
        if refused:
            over = [n for n, until in refused.items() if until <= now]
            for n_id in over:
                del refused[n_id]
            if over and self.stale_seen:
                self.walk_again()  # the jobs it refused may go to it now
        grace = self.grace
        stale = frozenset(n for n, since in down.items() if now - since >= grace)
        spared.update(n for n in down if n not in stale)
        if not stale:
            self.under = self.found = 0
            self.deferred = set()
            self.deferred_seen = set()
            self.rewalk_at = 0
            self.cursor = self.urgent = -1
            self.again = self.urgent_again = False
        elif stale != self.stale_seen or linked is not self.linked_seen or (
                self.rewalk_at and now >= self.rewalk_at and self.cursor < 0):
            self.rewalk_at = 0
            self.walk_again()
        self.stale_seen = stale
        self.linked_seen = linked
        self.view = (linked, alive, spared, stale)
        if self.inflight:
            self._resend(now, max(1, self.rate // CRON_PER_SECOND), alive)
        if (self.cursor >= 0 or self.urgent >= 0) and not self.timer.awake:
            self.tokens = 1.0
            self.last_step = now
            self.node.wheel.schedule(self.timer, now)

    def step(self, now: int) -> None:
        """One step of the walk (the timer's callback; the wheel cleared `awake`)."""
        if (self.cursor < 0 and self.urgent < 0) or not self.rate:
            return
        self.tokens = allowance(self.tokens, self.rate, now - self.last_step)
        self.last_step = now
        if self.urgent >= 0:
            # one crash from lost: not held to the rate, only to a step's size
            self._walk(now, URGENT_PER_STEP, True)
        if self.urgent < 0 and self.cursor >= 0 and self.tokens >= 1:
            budget = int(self.tokens)
            self.tokens -= budget - self._walk(now, budget, False)
        if self.urgent >= 0:
            self.node.wheel.schedule(self.timer, now + URGENT_STEP_MS)
        elif self.cursor >= 0:
            self.node.wheel.schedule(self.timer, now + STEP_MS)

    def walk_again(self) -> None:
        self.urgent_walk_again()
        if self.cursor < 0:
            self.cursor = 0
            self.found = 0
        else:
            self.again = True

    def urgent_walk_again(self) -> None:
        if self.urgent < 0:
            self.urgent = 0
        else:
            self.urgent_again = True  # under way: it reaches its end first

    def confirmed(self, sender: bytes, job_id: bytes) -> None:
        if self._settled((sender, job_id)):
            self.repaired += 1
            job = self.node.lookup_job(job_id)
            if job is not None and (job.state == ACTIVE or job.state == QUEUED):
                self._tell_holders(job, sender)

    def _tell_holders(self, job: Job, target: bytes) -> None:
        """A new copy is confirmed: the other reachable holders learn the grown list (a
        REPLJOB without reply: a merge, or a copy for a holder that never got one)."""
        node = self.node
        myself = node.myself
        link_up = node.link_up
        merge: ReplJob | None = None
        for n in job.delivered:
            if n != myself and n != target and link_up(n):
                if merge is None:
                    merge = ReplJob(node.header(), job_record(job, node.clock()), True)
                node.send(n, merge)

    def _settled(self, key: tuple[bytes, bytes]) -> bool:
        """Forget a copy waiting for its GOTJOB; whether it was waiting."""
        if self.inflight.pop(key, None) is None:
            return False
        pending = self.pending
        left = pending[key[1]] - 1
        if left:
            pending[key[1]] = left
        else:
            del pending[key[1]]
            self.hedged.discard(key[1])
        return True

    # ------------------------------------------------------------------ internals
    def _walk(self, now: int, budget: int, urgent: bool) -> int:
        """Look at the next shards' jobs (as the last tick saw the cluster: `view`),
        copying those this node repairs: the budget left. The `urgent` walk copies only
        the jobs of which this node holds the one copy counted."""
        linked, _, _, stale = self.view
        refused = self.refused
        if refused:
            linked = tuple(n for n in linked if n not in refused)
        node = self.node
        jobs = node.jobs
        count = jobs.shard_count()
        pending = self.pending
        deferred = self.deferred
        # restarted nodes this node's re-replication is still refilling, and its copies
        # sent but not confirmed: not counted as holders yet (`_counted`), so they may
        # take a copy
        refilling = self.refilling.cursors
        unconfirmed = self.refilling.inflight
        has_copy = self.refilling.has_copy
        cursor = self.urgent if urgent else self.cursor
        looked = 0
        # per distinct node list (jobs added together share one tuple)
        lists: NodeLists = {}
        scan = SCAN_PER_STEP * URGENT_SCAN if urgent else SCAN_PER_STEP
        while looked < scan and budget > 0:
            if cursor < count:
                shard = jobs.shard(cursor)
                cursor += 1
                if not shard:
                    continue
                batch = list(shard.values())
            elif cursor < DISK_DONE and node.on_disk:
                # then the jobs on disk (disque.overflow; cursor = shard count + the
                # segment to go on after, up to the newest segment when the disk phase
                # began): those this node may copy (`_may_copy`) come back to memory
                if cursor == count:
                    self.disk_end[urgent] = node.disk_last()
                after, found = node.disk_listing(cursor - count, DISK_STEP, stale,
                                                 self.disk_end.get(urgent, 0))
                cursor = count + after if after else DISK_DONE
                # rows read by SQLite, a fraction of the cost of jobs looked at here
                looked += DISK_STEP // DISK_WEIGHT
                batch = []
                for job_id, listed in found:
                    if self._may_copy(job_id, listed, urgent, lists, now):
                        back = node.lookup_job(job_id)
                        if back is not None:
                            batch.append(back)
            else:
                cursor = DISK_DONE
                break
            looked += len(batch)
            for job in batch:
                delivered = job.delivered
                seen = lists.get(delivered)
                if seen is None:
                    seen = self._view_of(delivered, lists)
                if not seen[0] or (job.state != ACTIVE and job.state != QUEUED) \
                        or not job.retry or job.flags & (F_DUMMY | F_RELOADED):
                    continue  # (seen[0]: the list names a node past its grace)
                job_id = job.id
                live, counted = self._counted(job_id, seen, now)
                short = job.repl - counted
                if short <= 0 or (urgent and counted > 1):
                    continue
                hedge = job_id in pending
                if hedge and not (urgent and self._overdue(job, now)):
                    # a repair of it is under way (its copies counted) and it is still
                    # short (the urgent walk's one copy): the next walk makes the rest.
                    # But a job one crash from lost whose new copies all wait past
                    # CONFIRM_MS for their GOTJOB (a target above its memory limit refuses
                    # copies without a word) gets one elsewhere now, not after the
                    # MAX_ATTEMPTS sends to the same node (5 s)
                    if not urgent:
                        deferred.add(job_id)
                    continue
                if not urgent and self._left_to_another(job_id, live):
                    deferred.add(job_id)
                    continue
                # linked nodes without a copy: not listed, or listed but restarted empty and
                # not refilled with it yet (the copy goes to them first: no list grows)
                candidates = [n for n in linked if n not in delivered or (
                    n in refilling and (n, job_id) not in unconfirmed
                    and not has_copy(n, job_id))]
                if hedge:  # (not to a node its copy waits on)
                    candidates = [n for n in candidates if (n, job_id) not in self.inflight]
                if not candidates:
                    if not urgent:
                        self.found += 1  # nowhere to copy it now (walked again on a change)
                    continue
                if urgent:
                    short = 1  # a second copy first; the other walk makes the rest
                if len(candidates) > short:  # the same choice on every holder
                    candidates.sort(key=lambda n: (n not in delivered, rank(n, job_id)))
                targets = candidates[:short]
                self._copy(job, targets, now)  # (job.delivered is a new tuple now)
                if urgent:
                    self.hedged.add(job_id)
                budget -= len(targets)
        if urgent:
            if cursor < DISK_DONE:
                self.urgent = cursor
            else:
                self.urgent = 0 if self.urgent_again else -1
                self.urgent_again = False
        elif cursor >= DISK_DONE:
            self.under = self.found
            self.found = 0
            self.deferred_seen = self.deferred
            self.deferred = set()
            if self.deferred_seen:
                self.rewalk_at = now + DEFER_MS
            if self.again:
                self.again = False
                self.cursor = 0
            else:
                self.cursor = -1
        else:
            self.cursor = cursor
        return budget

    def _view_of(self, delivered: tuple[bytes, ...], lists: NodeLists) -> NodeView:
        """What a walk step works out once for a node list (`NodeView`), as the last tick
        saw the cluster (`view`); kept in `lists` (jobs with the same list share one tuple,
        `shared_delivered`)."""
        _, alive, spared, stale = self.view
        myself = self.node.myself
        refilling = self.refilling.cursors
        live = [n for n in delivered if n == myself or (n in alive and n not in refilling)]
        seen = lists[delivered] = (
            not stale.isdisjoint(delivered), live,
            len(live) + sum(1 for n in delivered if n in spared),
            [n for n in delivered if n in alive and n in refilling])
        return seen

    def _counted(self, job_id: bytes, seen: NodeView, now: int) -> tuple[list[bytes], int]:
        """The job's reachable holders (this node, and linked holders that are not being
        refilled by this node's re-replication, or were and confirmed this job's copy
        since, nor waiting for its copy of this job) and its copies counted (those, and
        the holders within their grace), from its node list's `seen` (`_view_of`)."""
        _, live, counted, being_refilled = seen
        if being_refilled:
            has_copy = self.refilling.has_copy
            refilled = [n for n in being_refilled if has_copy(n, job_id)]
            if refilled:
                live = live + refilled
                counted += len(refilled)
        unconfirmed = self.refilling.inflight
        if unconfirmed and len(live) > 1:
            waiting = [n for n in live if (n, job_id) in unconfirmed]
            if waiting:
                live = [n for n in live if n not in waiting]
                counted -= len(waiting)
        if job_id in self.pending and len(live) > 1:
            # a copy of ours still unconfirmed CONFIRM_MS after it was sent is not counted
            # (its target may be refusing it): the job may be one crash from lost
            inflight = self.inflight
            late = [n for n in live if _late(inflight.get((n, job_id)), now)]
            if late:
                live = [n for n in live if n not in late]
                counted -= len(late)
        return live, counted

    def _overdue(self, job: Job, now: int) -> bool:
        """Whether every copy of the job this node sent waits for its GOTJOB since
        CONFIRM_MS or more."""
        inflight = self.inflight
        for n in job.delivered:
            sent = inflight.get((n, job.id))
            if sent is not None and not _late(sent, now):
                return False
        return True

    def _left_to_another(self, job_id: bytes, live: list[bytes]) -> bool:
        """Another reachable holder ranks first (`first_sender`: the job's creator last)
        and copies the job; this node does only if the next walk finds it still short
        (that holder may list it without holding it)."""
        myself = self.node.myself
        return len(live) > 1 and job_id not in self.deferred_seen and myself in live and \
            first_sender(job_id, live) != myself

    def _may_copy(self, job_id: bytes, listed: bytes, urgent: bool, lists: NodeLists,
                  now: int) -> bool:
        """Whether `_walk` may copy a job on disk from here, by its listed nodes (IDs
        concatenated) as the disk has them: the jobs it would skip or leave to another
        holder are not read back (a read by ID costs ~30 us, and a job brought back takes
        memory the overflow then writes out again). The disk does not keep REPLICATE, so
        the jobs that may be short are read back and `_walk` decides."""
        nodes = node_list(listed, 0, -(-len(listed) // NODE_ID_LEN))
        seen = lists.get(nodes)
        if seen is None:
            seen = self._view_of(nodes, lists)
        live, counted = self._counted(job_id, seen, now)
        if urgent:
            return counted <= 1
        if job_id in self.pending or self._left_to_another(job_id, live):
            self.deferred.add(job_id)  # (as `_walk` does)
            return False
        return True

    def _copy(self, job: Job, targets: list[bytes], now: int) -> None:
        """Grow the job's node list here and send the job to `targets`; the other holders
        learn the grown list once a new copy is confirmed (`confirmed`)."""
        node = self.node
        job.delivered = job.delivered + tuple(t for t in targets if t not in job.delivered)
        node.log_holders(job)
        msg = ReplJob(node.header(), job_record(job, now), False)
        for t in targets:
            node.send(t, msg)
            self.inflight[(t, job.id)] = (now, 1)
        self.pending[job.id] = self.pending.get(job.id, 0) + len(targets)

    def _resend(self, now: int, budget: int, alive: set[bytes]) -> int:
        node = self.node
        hedged = self.hedged
        for key, attempts in overdue(self.inflight, now):
            if budget <= 0:
                break
            target, job_id = key
            urgent = job_id in hedged
            self._settled(key)
            job = node.lookup_job(job_id)
            if job is None or job.state not in (ACTIVE, QUEUED):
                continue
            if urgent and self.stale_seen:
                # a copy the urgent walk made is not confirmed: the urgent walk looks at
                # the job again, and copies it elsewhere if it is still one crash from lost
                self.urgent_walk_again()
            if target not in alive or attempts >= MAX_ATTEMPTS:
                # down too, or refusing (e.g. above its memory limit): not a copy. Only
                # this node lists it (the others learn a new copy once it is confirmed),
                # so it leaves the list: listed, it would count as a copy when it comes
                # back and could not be chosen again; the next walk finds the job short
                job.delivered = tuple(n for n in job.delivered if n != target)
                if target in alive:  # refusing: another node, from a walk now
                    self.refused[target] = now + REFUSED_MS
                    if self.stale_seen:
                        self.walk_again()
                continue
            node.send(target, ReplJob(node.header(), job_record(job, now), False))
            self.inflight[key] = (now, attempts + 1)
            self.pending[job_id] = self.pending.get(job_id, 0) + 1
            if urgent:
                hedged.add(job_id)  # (`_settled` let go of it)
            budget -= 1
        return budget

    # ------------------------------------------------------------------ views
    def info_fields(self) -> list[tuple[str, int]]:
        return [("underreplicated_jobs", max(self.under, self.found) + len(self.inflight)),
                ("repaired_jobs", self.repaired)]


def _late(sent: tuple[int, int] | None, now: int) -> bool:
    """Whether a copy in `inflight` ((sent at, attempts), or None) waits for its GOTJOB
    since CONFIRM_MS or more: sent again already, or sent that long ago."""
    return sent is not None and (sent[1] > 1 or now - sent[0] >= CONFIRM_MS)
