"""A checking `Job.state` for the in-process suites (tests/unit, tests/sim): every write of a
job's state goes through disque.jobs.states' table, and a transition outside it fails the
test that made it (installed by tests/conftest.py; real servers are unaffected).

Not on a compiled `Job` (disque/compiled.py): its `state` is a native field that no
descriptor can replace, so there `install` does nothing (`CHECKING` is False; the pytest header says so).
The table is still checked by tests/unit/test_states.py, and the pure-Python run of the
same suites checks every transition."""

from __future__ import annotations

from typing import Any

from disque.compiled import is_compiled
from disque.jobs.job import WAIT_REPL, Job
from disque.jobs.states import IllegalTransition, check

# How a Job object is born: in WAIT_REPL, by its constructor (the only way to make one).
BIRTH_STATES = (WAIT_REPL,)

CHECKING = not is_compiled("disque.jobs.job")
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
    if not CHECKING:
        return None
    setattr(Job, "state", property(_get, _set))  # noqa: B010  (a slot, replaced)
    return _SLOT


def uninstall(slot: Any) -> None:
    if slot is None:
        return
    setattr(Job, "state", slot)  # noqa: B010
