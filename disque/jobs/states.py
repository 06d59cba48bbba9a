"""The job state machine: the table of allowed transitions, in one place.

A `Job` object is born in WAIT_REPL (disque.jobs.job). From there:

    WAIT_REPL --activate / hold_copies / restore--> ACTIVE
    WAIT_REPL --ACK while waiting for copies, a dummy ACK, restore--> ACKED
    WAIT_REPL --restore (a job read from the AOF, saved queued)--> QUEUED
    ACTIVE    --enqueue--> QUEUED
    QUEUED    --dequeue / fetch (GETJOB) / give_jobs (YOURJOBS)--> ACTIVE
    ACTIVE    --ack_job--> ACKED

and nothing else: an acknowledged job never lives again (a job the ACK GC collected is
remembered, `state.collected`, so a late copy cannot bring it back either), and a queued job
leaves its queue (ACTIVE) before anything else happens to it. Deletion (`unregister`) is
not a state: the object simply leaves the registry, whatever its state.

Every write of `job.state` in disque/ is one of these transitions. The hot paths write the
field inline (a call per job would cost), each write tagged with a comment `# state: FROM ->
TO`; tests/unit/test_states.py checks that every write in the source carries a tag naming
allowed transitions, walks the whole table, and runs the unit and simulation suites with a
checking descriptor on `Job.state` that refuses any other transition at run time.
"""

from __future__ import annotations

from disque.jobs.job import ACKED, ACTIVE, QUEUED, STATE_NAMES, WAIT_REPL

# (from, to) -> the procedures that make it
TRANSITIONS: dict[tuple[int, int], str] = {
    (WAIT_REPL, ACTIVE): "activate, hold_copies, job_from_record, on_enqueue, on_yourjobs, "
                         "replication_achieved (external), restore",
    (WAIT_REPL, ACKED): "ack_job (SETACK / GOTACK while waiting for copies), dummy_ack, "
                        "restore",
    (WAIT_REPL, QUEUED): "restore (a job saved queued)",
    (ACTIVE, QUEUED): "enqueue",
    (QUEUED, ACTIVE): "dequeue, fetch, give_jobs",
    (ACTIVE, ACKED): "ack_job, ackjob of a job only this node held",
}

STATE_BY_TAG = {name.decode().upper().replace("-", "_"): i
                for i, name in enumerate(STATE_NAMES)}


class IllegalTransition(Exception):
    """A job was moved between two states the table does not connect (a bug)."""


def allowed(old: int, new: int) -> bool:
    """Whether `old` -> `new` is a transition of the table (writing the same state again
    is no transition, and allowed)."""
    return old == new or (old, new) in TRANSITIONS


def check(old: int, new: int) -> None:
    if not allowed(old, new):
        raise IllegalTransition(f"job state {STATE_NAMES[old].decode()} -> "
                                f"{STATE_NAMES[new].decode()} is not in the table")
