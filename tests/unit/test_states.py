"""disque.jobs.states: the table of job state transitions, and the writes that follow it."""

from __future__ import annotations

import ast
import itertools
import re
from pathlib import Path

import pytest

from disque.jobs.job import ACKED, ACTIVE, QUEUED, STATE_NAMES, WAIT_REPL, Job
from disque.jobs.states import (
    STATE_BY_TAG,
    TRANSITIONS,
    IllegalTransition,
    allowed,
    check,
)
from tests import statecheck

STATES = range(len(STATE_NAMES))
SOURCE = Path(__file__).resolve().parents[2] / "disque"
TAG = re.compile(r"#\s*state:\s*([A-Z_ |]+?)\s*->\s*([A-Z_ |]+)")


def test_the_table_walked_whole() -> None:
    """Every pair of states: allowed exactly when the table lists it (or nothing changes)."""
    for old, new in itertools.product(STATES, STATES):
        if old == new or (old, new) in TRANSITIONS:
            assert allowed(old, new)
            check(old, new)
        else:
            assert not allowed(old, new)
            with pytest.raises(IllegalTransition):
                check(old, new)


def test_the_table_is_the_spec_lifecycle() -> None:
    assert set(TRANSITIONS) == {(WAIT_REPL, ACTIVE), (WAIT_REPL, ACKED), (WAIT_REPL, QUEUED),
                                (ACTIVE, QUEUED), (QUEUED, ACTIVE), (ACTIVE, ACKED)}
    # an acknowledged job never lives again; a queued job leaves its queue first
    assert not any(old == ACKED for old, _ in TRANSITIONS)
    assert (QUEUED, ACKED) not in TRANSITIONS


def _state_writes() -> list[tuple[Path, int, str]]:
    """Every `<x>.state = <a job state>` in disque/: the value one of the state constants,
    or a variable holding one (the AOF decoder's). Not the subsystems' `self.state = state`
    doors, nor the Job constructor's birth, nor other objects' states (a bus link's)."""
    found = []
    for path in sorted(SOURCE.rglob("*.py")):
        text = path.read_text()
        lines = text.splitlines()
        for node in ast.walk(ast.parse(text)):
            if not isinstance(node, ast.Assign):
                continue
            for target in node.targets:
                if not (isinstance(target, ast.Attribute) and target.attr == "state"):
                    continue
                if isinstance(target.value, ast.Name) and target.value.id == "self":
                    continue
                if not (isinstance(node.value, ast.Name)
                        and (node.value.id in STATE_BY_TAG or node.value.id == "state")):
                    continue
                found.append((path, node.lineno, lines[node.lineno - 1]))
    return found


def test_every_job_state_write_is_tagged_with_allowed_transitions() -> None:
    writes = _state_writes()
    assert len(writes) >= 15  # (the parse found them: the hot paths and the subsystems)
    for path, lineno, line in writes:
        where = f"{path.relative_to(SOURCE.parent)}:{lineno}: {line.strip()}"
        m = TAG.search(line)
        assert m, f"untagged job state write: {where}"
        olds = [STATE_BY_TAG[s.strip()] for s in m.group(1).split("|")]
        news = [STATE_BY_TAG[s.strip()] for s in m.group(2).split("|")]
        for old, new in itertools.product(olds, news):
            assert allowed(old, new), f"{where}: not in the table"
        assigned = line.split("=", 1)[1].split("#", 1)[0].strip()
        if assigned in STATE_BY_TAG:
            assert news == [STATE_BY_TAG[assigned]], f"{where}: the tag names another state"


@pytest.mark.skipif(not statecheck.CHECKING, reason="a compiled Job's state cannot be checked")
def test_the_checking_descriptor_refuses_a_transition_outside_the_table() -> None:
    """tests/conftest.py installs it for the in-process suites: this is what it catches."""
    job = Job(b"D-00000000-" + b"a" * 24 + b"-05a1", b"q", b"x", 1, 0, 1, 0, 1, ())
    job.state = ACTIVE
    job.state = ACKED
    with pytest.raises(IllegalTransition):
        job.state = QUEUED  # an acknowledged job queued again
    fresh = object.__new__(Job)
    with pytest.raises(IllegalTransition):
        fresh.state = QUEUED  # born anywhere but WAIT_REPL
