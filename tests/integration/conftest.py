"""Fixtures shared by the single-node integration tests.

`node` is one server per test module (tests that don't interfere share it and use distinct
queue names via `q`); tests that change global state use the function-scoped `server` or
`make_server` fixtures of tests/conftest.py instead.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator

import pytest

from tests.harness import DisqueProcess
from tests.integration.resp import Conn

_counter = itertools.count()


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DisqueProcess]:
    proc = DisqueProcess(tmp_path_factory.mktemp("node")).start()
    try:
        yield proc
    finally:
        proc.kill()


@pytest.fixture
def conn(node: DisqueProcess) -> Iterator[Conn]:
    """A raw RESP connection to the module's node (fails loudly if the node died earlier)."""
    if not node.alive():
        pytest.fail(f"server died earlier in this module:\n{node.output()[-3000:]}")
    c = Conn(node.port)
    try:
        yield c
    finally:
        c.close()


@pytest.fixture
def q(request: pytest.FixtureRequest) -> str:
    """A queue name no other test uses."""
    base = re.sub(r"[^A-Za-z0-9_]", "_", request.node.name)[:60]
    return f"{base}-{next(_counter)}"
