from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings

from tests import statecheck
from tests.harness import (
    ORIGINAL_ENV,
    DisqueProcess,
    OriginalDisqueProcess,
    original_server_path,
)
from tests.hypothesis_profile import SUITE_PROFILE
from tests.smalldisk import SmallDisk
from tests.smalldisk import small_disk as make_small_disk

settings.load_profile(SUITE_PROFILE)  # no per-example deadline: a stall is not a failure


# The long groups first, so that no worker starts one while the other runs out of work.
_FIRST = ("tests/spark/", "tests/chaos/", "tests/cluster/test_rolling_restarts.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> int:
        return next((i for i, p in enumerate(_FIRST) if item.nodeid.startswith(p)),
                    len(_FIRST))
    items.sort(key=rank)  # stable: collection order within each rank


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """pytest-xdist: one test module per work unit (its module-scoped node or cluster is
    started once), and every Spark test in one unit, so one worker starts one JVM.
    (`--dist loadgroup` would do the Spark part, but xdist 3.8 cannot set the group on
    pytest 9.2's node IDs.)"""
    from xdist.scheduler import LoadScopeScheduling

    config.option.loadscopereorder = False  # keep _FIRST's order, not the largest first

    class ModulesAndSpark(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            if nodeid.startswith("tests/spark/"):
                return "tests/spark"
            return super()._split_scope(nodeid)

    return ModulesAndSpark(config, log)  # type: ignore[arg-type]


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist (`make test` runs four workers), each worker and every server or tool
    it starts draws ports from its own share (disque/tools/ports.py), so two workers never
    hand out the same port between a check and a server's bind."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    # DISQUE_PORT_SLICES=n: n shares however many workers, so that another run beside this
    # one can take a share of its own (make test runs the pure-Python build's tests in share
    # 4 of 5 alongside the four workers of the compiled build's)
    count = os.environ.get("DISQUE_PORT_SLICES") or os.environ.get("PYTEST_XDIST_WORKER_COUNT", "")
    if worker.startswith("gw") and count.isdigit():
        os.environ["DISQUE_PORT_SLICE"] = f"{int(worker[2:])}/{count}"


def pytest_report_header() -> list[str]:
    """Which build the in-process suites run: the compiled hot path or pure Python."""
    from disque import compiled

    mods = compiled.compiled_modules()
    build = f"compiled ({len(mods)} of {len(compiled.HOT_MODULES)} hot modules)" if mods \
        else f"pure Python{' (' + compiled.refused + ')' if compiled.refused else ''}"
    check = "on" if statecheck.CHECKING else "off (disque.jobs.job is compiled)"
    return [f"disque build: {build}; job state checker: {check}"]


@pytest.fixture(autouse=True, scope="session")
def _checked_job_states() -> Iterator[None]:
    """Every job state change made in this process (the unit and simulation suites) must be
    a transition of disque.jobs.states' table (see tests/statecheck.py)."""
    slot = statecheck.install()
    yield
    statecheck.uninstall(slot)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[DisqueProcess]:
    """A fresh single node on a free port, in its own directory, killed after the test."""
    proc = DisqueProcess(tmp_path / "node").start()
    try:
        yield proc
    finally:
        proc.kill()


@pytest.fixture
def original(tmp_path: Path) -> Iterator[OriginalDisqueProcess]:
    """A fresh node of antirez's original Disque ($DISQUE_ORIGINAL: the path of its
    `disque-server`), killed after the test; the test is skipped when it is not set."""
    path = original_server_path()
    if path is None:
        pytest.skip(f"${ORIGINAL_ENV} does not name the original Disque's disque-server "
                    "(built from antirez/disque): nothing to test the RESP2 fallback against")
    proc = OriginalDisqueProcess(tmp_path / "original", path)
    try:
        proc.start()
        yield proc
    finally:
        proc.kill()


@pytest.fixture
def make_server(tmp_path: Path) -> Iterator:
    """Factory for nodes with extra flags or a config file: make_server(args=[...])."""
    started: list[DisqueProcess] = []

    def factory(args: list[str] | None = None, config_text: str | None = None,
                start: bool = True, name: str | None = None) -> DisqueProcess:
        proc = DisqueProcess(tmp_path / (name or f"node{len(started)}"), args=args,
                             config_text=config_text)
        started.append(proc)
        if start:
            proc.start()
        return proc

    try:
        yield factory
    finally:
        for p in started:
            p.kill()


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[SmallDisk]:
    """A small filesystem (2 MB) to fill up: tmpfs, a loop-mounted ext4 image, or a file-size
    limit on the attached process (tests/smalldisk.py). Request it before make_server or
    cluster, so that it is unmounted after their processes are killed."""
    with make_small_disk(tmp_path / "disk") as disk:
        yield disk
