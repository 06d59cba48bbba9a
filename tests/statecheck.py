"""A checking `Job.state` for the in-process suites (tests/unit, tests/sim): every write of a
job's state goes through disque.jobs.states' table, and a transition outside it fails the
test that made it (installed by tests/conftest.py; real servers are unaffected)."""

from __future__ import annotations

from typing import Any

from disque.jobs.job import ACTIVE, WAIT_REPL, Job
from disque.jobs.states import IllegalTransition, check

# How a Job object is born: in WAIT_REPL by its constructor, or ACTIVE when a replica builds
# a copy without the constructor (disque.cluster.replication.hold_copies).
BIRTH_STATES = (WAIT_REPL, ACTIVE)

_SLOT = Job.__dict__["state"]


def _get(job: Job) -> int:
    value: int = _SLOT.__get__(job, Job)
    return value


def _set(job: Job, new: int) -> None:
    try:
        old = _SLOT.__get__(job, Job)
    except AttributeError:
        if new not in BIRTH_STATES:
            raise IllegalTransition(f"a job born in state {new}") from None
    else:
        check(old, new)
    _SLOT.__set__(job, new)


def install() -> Any:
    """Put the checking descriptor in place; returns what to restore."""
    setattr(Job, "state", property(_get, _set))  # noqa: B010  (a slot, replaced)
    return _SLOT


def uninstall(slot: Any) -> None:
    setattr(Job, "state", slot)  # noqa: B010
