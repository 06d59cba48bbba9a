"""Starting the server: --version/--help, config file then command-line directives, fatal
config errors naming file, line and directive, dir/logfile, the startup banner, clean exit on
SIGTERM/SIGINT (issue 3 "Packaging and commands", checklist §8)."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

import disque
from tests.harness import REPO, DisqueProcess, wait_for
from tests.integration.resp import Conn, node_id


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


def test_unknown_directive_in_config_file_stops_startup(make_server) -> None:  # type: ignore[no-untyped-def]
    proc = make_server(config_text="loglevel notice\nnosuchdirective 1\n", start=False)
    proc.start(wait=False)
    assert exited(proc) == 1
    text = proc.output()
    assert "*** FATAL CONFIG FILE ERROR ***" in text
    assert str(proc.workdir / "disque.conf") in text
    assert "line 2" in text
    assert "nosuchdirective" in text
    assert "Bad directive or wrong number of arguments" in text


def test_bad_value_in_config_file_stops_startup(make_server) -> None:  # type: ignore[no-untyped-def]
    proc = make_server(config_text="# comment\n\nmaxmemory lots\n", start=False)
    proc.start(wait=False)
    assert exited(proc) == 1
    text = proc.output()
    assert "*** FATAL CONFIG FILE ERROR ***" in text
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
