"""`dir` as a parse-time chdir (checklist §8: "`dir` performs chdir at parse time ... files are
all opened relative to the resulting working directory").

In the original each `dir` line changes directory while the file is read, so a later relative
`dir` (or `--dir` on the command line after a file that sets `dir`) and a later relative
`include` are resolved from the previous `dir`. disque-py resolves every one of them against
the directory the server was started from, and conf/disque.conf documents that, but the
difference is not in docs/commands.md "Differences from the original Disque".
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness import free_port, wait_for
from tests.integration.resp import Conn


@pytest.fixture
def start(tmp_path: Path) -> Iterator:
    procs: list[subprocess.Popen[bytes]] = []

    def factory(*args: str) -> int:
        port = free_port()
        # started from its own directory: relative paths must not land in the repo
        p = subprocess.Popen([sys.executable, "-m", "disque", *args, "--port", str(port)],
                             cwd=str(tmp_path / "start"), stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
        procs.append(p)

        def up() -> bool:
            assert p.poll() is None, f"server exited with {p.returncode}"
            with Conn(port) as c:
                return c.cmd("PING") == "PONG"
        wait_for(up, what="server up")
        return port

    (tmp_path / "start").mkdir()
    try:
        yield factory
    finally:
        for p in procs:
            p.kill()
            p.wait()


def config_get(port: int, name: str) -> str:
    with Conn(port) as c:
        reply = c.cmd("CONFIG", "GET", name)
    return reply[1].decode()


def test_second_relative_dir_is_relative_to_the_first(start, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "start" / "n.conf").write_text("dir ../a\ndir b\n")
    port = start("n.conf")
    assert config_get(port, "dir") == str(tmp_path / "a" / "b")


def test_include_after_dir_is_relative_to_that_dir(start, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "extra.conf").write_text("hz 33\n")
    (tmp_path / "start" / "extra.conf").write_text("hz 44\n")
    (tmp_path / "start" / "n.conf").write_text("dir ../a\ninclude extra.conf\n")
    port = start("n.conf")
    assert config_get(port, "hz") == "33"
