"""Starting the server: --version/--help, config file then command-line directives, fatal
config errors naming file, line and directive, dir/logfile, the startup banner, clean exit on
SIGTERM/SIGINT (issue 3 "Packaging and commands", checklist §8)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

import disque
from tests.harness import REPO, DisqueProcess, connect_at_once, wait_for
from tests.integration.resp import Conn, Err, Status, encode, node_id


def run_server(*args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "disque", *args], capture_output=True,
                          text=True, timeout=timeout, cwd=str(REPO))


def exited(proc: DisqueProcess, timeout: float = 30) -> int:
    assert proc.proc is not None
    return proc.proc.wait(timeout=timeout)


def test_version_flag() -> None:
    out = run_server("--version")
    assert out.returncode == 0
    assert disque.__version__ in out.stdout + out.stderr


def test_help_flag() -> None:
    out = run_server("--help")
    assert out.returncode == 0
    assert "usage" in (out.stdout + out.stderr).lower()


def fatal_config(make_server, config_text: str) -> tuple[DisqueProcess, str]:  # type: ignore[no-untyped-def]
    """Start a server on this config file: it must stop with redis-server's FATAL banner
    and exit 1. The process and its output."""
    proc = make_server(config_text=config_text, start=False)
    proc.start(wait=False)
    assert exited(proc) == 1
    text = proc.output()
    assert "*** FATAL CONFIG FILE ERROR ***" in text
    return proc, text


def test_unknown_directive_in_config_file_stops_startup(make_server) -> None:  # type: ignore[no-untyped-def]
    proc, text = fatal_config(make_server, "loglevel notice\nnosuchdirective 1\n")
    assert str(proc.workdir / "disque.conf") in text
    assert "line 2" in text
    assert "nosuchdirective" in text
    assert "Bad directive or wrong number of arguments" in text


def test_bad_value_in_config_file_stops_startup(make_server) -> None:  # type: ignore[no-untyped-def]
    _, text = fatal_config(make_server, "# comment\n\nmaxmemory lots\n")
    assert "line 3" in text and "maxmemory" in text


def test_bad_value_on_the_command_line_stops_startup(make_server) -> None:  # type: ignore[no-untyped-def]
    proc = make_server(args=["--hz", "fast"], start=False)
    proc.start(wait=False)
    assert exited(proc) != 0
    assert "hz" in proc.output()


def test_command_line_directives_override_the_config_file(make_server) -> None:  # type: ignore[no-untyped-def]
    proc = make_server(config_text="hz 20\nmaxmemory 2mb\ntimeout 7\n", args=["--hz", "30"])
    with Conn(proc.port) as c:
        assert c.cmd("CONFIG", "GET", "hz") == [b"hz", b"30"]
        assert c.cmd("CONFIG", "GET", "maxmemory") == [b"maxmemory", b"2097152"]
        assert c.cmd("CONFIG", "GET", "timeout") == [b"timeout", b"7"]


def test_directive_names_are_case_insensitive_in_the_file(make_server) -> None:  # type: ignore[no-untyped-def]
    proc = make_server(config_text="HZ 25\nMaxMemory 3mb\n")
    with Conn(proc.port) as c:
        assert c.cmd("CONFIG", "GET", "hz") == [b"hz", b"25"]
        assert c.cmd("CONFIG", "GET", "maxmemory") == [b"maxmemory", b"3145728"]


def test_logfile_lands_inside_dir_and_has_the_startup_banner(make_server) -> None:  # type: ignore[no-untyped-def]
    proc = make_server(config_text="logfile log.txt\nloglevel notice\n")
    log = proc.workdir / "log.txt"
    with Conn(proc.port) as c:
        me = node_id(c)
    text = wait_for(lambda: log.exists() and log.read_text(), timeout=20, what="log.txt written")
    for expected in (disque.__version__, str(proc.port), str(proc.proc.pid), me):
        assert expected in text, (expected, text[:2000])


def test_startup_banner_on_stdout(server: DisqueProcess) -> None:
    with Conn(server.port) as c:
        me = node_id(c)
    text = wait_for(lambda: me in server.output() and server.output(), timeout=20,
                    what="banner with the node ID")
    for expected in (disque.__version__, str(server.port), str(server.proc.pid)):  # type: ignore[union-attr]
        assert expected in text


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signals_shut_down_cleanly(server: DisqueProcess, sig: int) -> None:
    with Conn(server.port) as c:
        assert c.call("PING") == b"+PONG\r\n"
    assert server.proc is not None
    server.proc.send_signal(sig)
    assert server.proc.wait(timeout=30) == 0


def test_sigterm_while_the_pidfile_is_written_still_shuts_down(tmp_path: Path) -> None:
    """A SIGTERM that arrives after the node answers but before it settles into serving is
    not lost. uvloop hears signals only while the loop runs: a node that ran the loop once to
    start and again to serve dropped a SIGTERM arriving between the two (CI saw a node that
    logged `server.start` and never exited). The pidfile is a FIFO here, so the node blocks
    opening it, once started, until the test reads it: the signal lands in that gap."""
    fifo = tmp_path / "node.pid"
    os.mkfifo(fifo)
    proc = DisqueProcess(tmp_path / "node", args=["--pidfile", str(fifo)]).start(wait=False)
    try:
        assert proc.proc is not None
        pid = proc.proc.pid
        wait_for(lambda: Path(f"/proc/{pid}/wchan").read_text() == "wait_for_partner",
                 what="the node blocked opening its FIFO pidfile")
        proc.proc.send_signal(signal.SIGTERM)
        with open(fifo) as f:  # unblocks the node's open(); it writes its pid and goes on
            assert f.read().strip() == str(proc.proc.pid)
        assert proc.proc.wait(timeout=30) == 0, proc.output()
        assert "server.shutdown" in proc.output()
    finally:
        proc.kill()


@pytest.mark.parametrize("directive", ["aof-enqueue-jobs-once", "appendonly"])
def test_a_config_set_served_while_the_node_starts_does_not_change_that_start(
        tmp_path: Path, directive: str) -> None:
    """The client port opens before the AOF's start-up step (a loading node answers
    -LOADING); with no AOF to load, a client's commands are served in between. A CONFIG
    SET served there changed that start:
    - aof-enqueue-jobs-once yes (meant for the next start) made it look for an AOF, and the
      node exited (a CI run saw CONFIG REWRITE answered OK, then the port closed);
    - appendonly yes opened the AOF, then the start-up opened it a second time: INFO said
      aof_state:on, and the jobs acknowledged after it never reached the file.
    A client connecting in a tight loop lands in the gap in most starts, so a few starts
    are enough to catch it."""
    for i in range(4):
        set_while_starting(DisqueProcess(tmp_path / f"node{i}", config_text="appendonly no\n"),
                           directive)


def set_while_starting(proc: DisqueProcess, directive: str) -> None:
    proc.start(wait=False)
    try:
        with connect_at_once(proc) as s:
            s.sendall(encode("CONFIG", "SET", directive, "yes"))
            assert s.recv(64) == b"+OK\r\n"
        wait_for(lambda: not proc.alive() or "server.start" in proc.output(),
                 what="the end of the start-up")
        assert proc.alive(), proc.output()[-3000:]
        aof = proc.workdir / "disque.aof"
        with Conn(proc.port) as c:
            assert c.cmd("CONFIG", "GET", directive) == [directive.encode(), b"yes"]
            job_id = c.cmd("ADDJOB", "q", "body", 0).encode()
        if directive == "appendonly":  # (once the first rewrite has made the file)
            wait_for(lambda: aof.exists() and job_id in aof.read_bytes(), timeout=10,
                     what="the job in the AOF")
        else:
            assert not aof.exists()
    finally:
        proc.kill()


# ---------------------------------------------------------------------------- open files limit
class LimitedProcess(DisqueProcess):
    """A server started under `prlimit --nofile=SOFT:HARD`; as root, also without
    CAP_SYS_RESOURCE, so that the hard limit really binds (as for any other user)."""

    def __init__(self, workdir, nofile: str, **kw) -> None:  # type: ignore[no-untyped-def]
        super().__init__(workdir, **kw)
        self.nofile = nofile

    def command(self) -> list[str]:
        prefix = ["prlimit", f"--nofile={self.nofile}"]
        if os.geteuid() == 0:
            prefix += ["setpriv", "--bounding-set", "-sys_resource", "--inh-caps",
                       "-sys_resource", "--"]
        return prefix + super().command()


def max_open_files(pid: int) -> int:
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            return int(line.split()[3])
    raise AssertionError("no 'Max open files' line")


def test_low_ulimit_reduces_maxclients_and_extra_clients_get_the_max_clients_error(
        tmp_path: Path) -> None:
    """As Redis: maxclients 10000 needs 10032 descriptors; with `ulimit -n 128` it is
    reduced to 96 with a warning, and client 97 gets the max-clients error instead of a
    connection reset from a failed accept()."""
    p = LimitedProcess(tmp_path, "128:128").start()
    socks: list[socket.socket] = []
    try:
        assert "maxclients_reduced" in p.output()
        c = Conn(p.port)
        assert c.cmd("CONFIG", "GET", "maxclients") == [b"maxclients", b"96"]
        for _ in range(95):  # + `c` = 96 clients
            s = socket.create_connection(("127.0.0.1", p.port), timeout=10)
            s.sendall(b"PING\r\n")
            assert s.recv(64) == b"+PONG\r\n"
            socks.append(s)
        extra = socket.create_connection(("127.0.0.1", p.port), timeout=10)
        assert extra.recv(64) == b"-ERR max number of clients reached\r\n"
        extra.close()
        assert c.cmd("CONFIG", "SET", "maxclients", "1000") == Err(
            "ERR The operating system is not able to handle the specified number of clients,"
            " try with 96")
        assert c.cmd("CONFIG", "GET", "maxclients") == [b"maxclients", b"96"]
        assert c.cmd("CONFIG", "SET", "maxclients", "9223372036854775807") == Err(
            "ERR The operating system is not able to handle the specified number of clients,"
            " try with 96")
        assert c.cmd("CONFIG", "SET", "maxclients", "50") == Status("OK")
    finally:
        for s in socks:
            s.close()
        p.kill()


def test_startup_raises_a_low_soft_ulimit_up_to_the_hard_one(tmp_path: Path) -> None:
    p = LimitedProcess(tmp_path, "256:20000").start()
    try:
        assert p.proc is not None
        assert max_open_files(p.proc.pid) == 10032
        assert Conn(p.port).cmd("CONFIG", "GET", "maxclients") == [b"maxclients", b"10000"]
        assert "maxclients_reduced" not in p.output()
    finally:
        p.kill()


def test_a_ulimit_too_low_for_any_client_stops_startup(tmp_path: Path) -> None:
    p = LimitedProcess(tmp_path, "24:24").start(wait=False)
    assert p.proc is not None
    try:
        assert p.proc.wait(timeout=30) == 1
        assert "ulimit -n" in p.output()
    finally:
        p.kill()  # a server that wrongly started must not outlive the test
