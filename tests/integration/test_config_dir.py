"""CONFIG SET dir (checklist §4 CONFIG, §8 `dir`): the node's files follow the working
directory, errors read `-ERR Changing directory: <reason>`, and a node moved this way comes
back from the rewritten config with its jobs and its identity."""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.harness import DisqueProcess, wait_for
from tests.integration.resp import Conn, Err, Status, add, info, node_id, show


class FromConfig(DisqueProcess):
    """Started from its config file alone (no --dir flag), as an operator restarts it."""

    def command(self) -> list[str]:
        conf = self.workdir / "disque.conf"
        if conf.exists():  # a restart: the file as CONFIG REWRITE left it
            self.config_text = conf.read_text()
        cmd = super().command()
        i = cmd.index("--dir")
        return cmd[:i] + cmd[i + 2:]


@pytest.fixture
def start() -> Iterator[Callable[..., FromConfig]]:
    """start(workdir, extra_config): a node started from its config file alone; every node
    started is stopped at teardown."""
    procs: list[FromConfig] = []

    def factory(workdir: Path, extra: str = "") -> FromConfig:
        workdir.mkdir(parents=True, exist_ok=True)
        proc = FromConfig(workdir, config_text=f"dir {workdir}\nlogfile log.txt\n{extra}")
        procs.append(proc)
        return proc.start()

    try:
        yield factory
    finally:
        for proc in procs:
            proc.stop()


Moving = Callable[[str], tuple[Path, Path, FromConfig]]


@pytest.fixture
def moving(tmp_path: Path, start: Callable[..., FromConfig]) -> Moving:
    """moving(extra_config): a node in tmp_path/a, and an empty tmp_path/b to move it to."""
    def factory(extra: str) -> tuple[Path, Path, FromConfig]:
        (tmp_path / "b").mkdir()
        return tmp_path / "a", tmp_path / "b", start(tmp_path / "a", extra)
    return factory


def config_dir(c: Conn) -> str:
    return c.cmd("CONFIG", "GET", "dir")[1].decode()


def test_config_set_dir_to_a_missing_directory_is_refused(
        tmp_path: Path, start: Callable[..., FromConfig]) -> None:
    proc = start(tmp_path / "a")
    with Conn(proc.port) as c:
        assert c.cmd("CONFIG", "SET", "dir", str(tmp_path / "nope")) == \
            Err("ERR Changing directory: No such file or directory")
        assert c.cmd("CONFIG", "SET", "dir", "") == \
            Err("ERR Changing directory: No such file or directory")
        assert c.cmd("CONFIG", "SET", "dir", "a\x00b") == \
            Err("ERR Changing directory: Invalid argument")
        assert config_dir(c) == str(tmp_path / "a")


def test_config_set_dir_to_a_file_is_not_a_directory(
        tmp_path: Path, start: Callable[..., FromConfig]) -> None:
    proc = start(tmp_path / "a")
    with Conn(proc.port) as c:
        assert c.cmd("CONFIG", "SET", "dir", str(tmp_path / "a" / "disque.conf")) == \
            Err("ERR Changing directory: Not a directory")
        assert config_dir(c) == str(tmp_path / "a")


def test_config_set_dir_moves_the_aof_nodes_conf_and_log_and_survives_a_restart(
        moving: Moving) -> None:
    a, b, proc = moving("appendonly yes\nappendfsync always\n")
    with Conn(proc.port) as c:
        me = node_id(c)
        before = add(c, "q", "before")
        # relative to the current working directory, as chdir(2)
        assert c.cmd("CONFIG", "SET", "dir", "../b") == Status("OK")
        assert config_dir(c) == str(b)
        wait_for(lambda: info(c, "persistence")["aof_rewrite_in_progress"] == "0"
                 and (b / "disque.aof").exists(), what="the AOF rewritten in the new dir")
        after = add(c, "q", "after")
        assert c.cmd("CONFIG", "REWRITE") == Status("OK")
    assert f"dir {b}" in (a / "disque.conf").read_text()
    assert me in (b / "nodes.conf").read_text()
    assert "server.dir_changed" in (b / "log.txt").read_text()
    proc.kill(signal.SIGKILL)
    proc.start()  # the same config file: now says dir b
    with Conn(proc.port) as c:
        assert config_dir(c) == str(b)
        assert node_id(c) == me
        # both jobs are back (not queued: a restart requeues only with
        # aof-enqueue-jobs-once)
        assert show(c, before)["body"] == b"before"
        assert show(c, after)["body"] == b"after"


def test_config_set_dir_during_an_aof_rewrite_writes_the_aof_again_in_the_new_dir(
        moving: Moving) -> None:
    a, b, proc = moving("appendonly yes\n")
    with Conn(proc.port) as c:
        # enough jobs for the rewrite to take several loop iterations
        c.pipeline([["ADDJOB", "q", "x" * 10, "0"] for _ in range(20_000)])
        # one read: the rewrite is still running when CONFIG SET dir comes
        replies = c.pipeline([["BGREWRITEAOF"], ["CONFIG", "SET", "dir", str(b)]])
        assert replies[1] == Status("OK")
        wait_for(lambda: (b / "disque.aof").exists()
                 and info(c, "persistence")["aof_rewrite_in_progress"] == "0"
                 and info(c, "persistence")["aof_rewrite_scheduled"] == "0",
                 what="the scheduled rewrite in the new dir", timeout=60)
        c.cmd("ADDJOB", "q", "last", "0")
        assert c.cmd("CONFIG", "REWRITE") == Status("OK")
    proc.stop()  # SIGTERM: the AOF is flushed and fsynced
    proc.start()
    with Conn(proc.port) as c:
        assert config_dir(c) == str(b)
        assert c.cmd("QLEN", "q") == 0  # a restart does not requeue (aof-enqueue-jobs-once)
        assert info(c, "jobs")["registered_jobs"] == "20001"


def test_config_set_dir_refuses_a_directory_with_another_nodes_files(
        tmp_path: Path, start: Callable[..., FromConfig]) -> None:
    a, b, c_dir = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    proc = start(a)
    other = start(b)
    with Conn(proc.port) as c:
        # a running node's directory: its nodes.conf is locked
        reply = c.cmd("CONFIG", "SET", "dir", str(b))
        assert isinstance(reply, Err)
        assert reply.startswith("ERR Changing directory: Sorry, the cluster configuration "
                                "file nodes.conf is already used by a different Disque node")
        assert config_dir(c) == str(a)
    other.stop()
    with Conn(proc.port) as c:
        # a stopped node's directory: its identity and data are not ours to overwrite
        text = (b / "nodes.conf").read_text()
        reply = c.cmd("CONFIG", "SET", "dir", str(b))
        assert isinstance(reply, Err)
        assert reply.startswith("ERR Changing directory: nodes.conf there belongs to node ")
        other_id = reply.split()[-1]
        assert other_id in text
        assert (b / "nodes.conf").read_text() == text
        # an AOF without a nodes.conf is somebody's data too
        c_dir.mkdir()
        (c_dir / "disque.aof").write_bytes(b"")
        assert c.cmd("CONFIG", "SET", "dir", str(c_dir)) == \
            Err("ERR Changing directory: disque.aof there belongs to another node")
        assert not (c_dir / "nodes.conf").exists()
        assert config_dir(c) == str(a)
        # still this node's own files: the lock on a/nodes.conf is held
        assert c.cmd("CONFIG", "SET", "dir", str(a)) == Status("OK")
    assert refused_start(a)


def test_config_set_dir_takes_the_nodes_conf_lock_along(
        moving: Moving) -> None:
    a, b, proc = moving("pidfile disque.pid\n")
    assert (a / "disque.pid").exists()
    with Conn(proc.port) as c:
        me = node_id(c)
        assert c.cmd("CONFIG", "SET", "dir", str(b)) == Status("OK")
        assert refused_start(b)  # a second server cannot take this node's identity
        # our own files were left in a: moving back is allowed
        assert c.cmd("CONFIG", "SET", "dir", str(a)) == Status("OK")
        assert config_dir(c) == str(a)
        assert node_id(c) == me
        assert refused_start(a)
        assert c.cmd("CONFIG", "SET", "dir", str(b)) == Status("OK")
    assert proc.stop() == 0
    assert not (a / "disque.pid").exists()  # removed where it was written


def refused_start(workdir: Path) -> bool:
    """Does a server started on `workdir` exit because nodes.conf is locked?"""
    probe = FromConfig(workdir / "probe", config_text=f"dir {workdir}\n")
    probe.start(wait=False)
    assert probe.proc is not None
    try:
        code = probe.proc.wait(timeout=30)
    except Exception:
        probe.kill()
        raise
    return code != 0 and "already used by a different Disque node" in probe.output()
