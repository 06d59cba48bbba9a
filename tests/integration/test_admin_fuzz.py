"""The admin surface (CONFIG, CLIENT, DEBUG, HELLO, INFO, COMMAND, CLUSTER, queue
introspection) against real server processes: regressions for what fuzzing found, and a
compact seeded fuzz that asserts no internal error, a live server after every accepted
CONFIG SET, and a restart from every CONFIG REWRITE with the same CONFIG GET values.
"""

from __future__ import annotations

import itertools
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from disque.config import DIRECTIVES
from tests.harness import DisqueProcess, wait_for
from tests.integration.resp import Conn, Err, Status, encode

CONF = "# admin fuzz\nloglevel notice\n"


def restart(proc: DisqueProcess, controlled: bool = False) -> None:
    """Stop the server and start it again from its (possibly rewritten) config file;
    `controlled`: with SHUTDOWN REWRITE-AOF, the documented controlled restart (with
    aof-enqueue-jobs-once yes a start without an AOF is refused)."""
    if controlled:
        with Conn(proc.port, timeout=30) as c:
            c.send_cmd("SHUTDOWN", "REWRITE-AOF")
        assert proc.proc is not None
        proc.proc.wait(timeout=30)
    proc.stop()
    conf = str(proc.workdir / "disque.conf")
    # the file as the server rewrote it (DisqueProcess.start would write config_text over it)
    proc.command = lambda: [sys.executable, "-m", "disque", conf,  # type: ignore[method-assign]
                            "--port", str(proc.port), "--dir", str(proc.workdir)]
    proc.start(wait=False)

    def answers() -> bool:  # any reply will do: with requirepass PING is -NOAUTH
        assert proc.alive(), proc.output()[-3000:]
        with Conn(proc.port, timeout=2) as c:
            return c.cmd("PING") in (Status("PONG"), Err("NOAUTH Authentication required."))

    wait_for(answers, timeout=30, what="the restarted server")


def config_all(c: Conn) -> dict[bytes, bytes]:
    flat = c.cmd("CONFIG", "GET", "*")
    if isinstance(flat, dict):  # RESP3, after a fuzzed HELLO 3
        return flat
    return dict(zip(flat[::2], flat[1::2], strict=True))


def read_exactly(c: Conn, n: int) -> list[Any]:
    return [c.read(timeout=10) for _ in range(n)]


# -- CONFIG REWRITE never writes a file the server cannot start from --------------------------

@pytest.mark.parametrize(("name", "value"), [("cluster-node-timeout", "0"), ("maxmemory", "0")])
def test_config_rewrite_refuses_a_value_the_config_file_cannot_load(
        make_server, name: str, value: str) -> None:  # type: ignore[no-untyped-def]
    proc = make_server(config_text=CONF)
    conf = proc.workdir / "disque.conf"
    with Conn(proc.port) as c:
        assert c.cmd("CONFIG", "SET", name, value) == Status("OK")  # as the original
        reply = c.cmd("CONFIG", "REWRITE")
        assert isinstance(reply, Err)
        assert reply.startswith(f"ERR Rewriting config file: '{name} {value}' would not load")
    assert conf.read_text() == CONF
    restart(proc)
    with Conn(proc.port) as c:
        assert c.cmd("PING") == Status("PONG")


# -- CONFIG SET integers are 64-bit, as the original's long long ---------------------------------

@pytest.mark.parametrize(("name", "value"), [
    ("hz", "99999999999999999999"), ("watchdog-period", "9223372036854775808"),
    ("timeout", "18446744073709551616"), ("slowlog-max-len", "9223372036854775808"),
    ("maxmemory", "8589934592gb"), ("proto-max-bulk-len", "99999999999999999999"),
    ("client-output-buffer-limit", "normal 0 0 9223372036854775808"),
])
def test_config_set_integer_beyond_64_bits_is_an_invalid_argument(
        conn: Conn, name: str, value: str) -> None:
    assert conn.call("CONFIG", "SET", name, value) == (
        b"-ERR Invalid argument '%s' for CONFIG SET '%s'\r\n" % (value.encode(), name.encode()))


def test_config_set_largest_64_bit_values_survive_rewrite_and_restart(
        make_server) -> None:  # type: ignore[no-untyped-def]
    proc = make_server(config_text=CONF)
    big = "9223372036854775807"
    with Conn(proc.port) as c:
        for name in ("timeout", "slowlog-log-slower-than", "cluster-node-timeout",
                     "auto-aof-rewrite-min-size", "maxmemory"):
            assert c.cmd("CONFIG", "SET", name, big) == Status("OK"), name
        assert c.cmd("CONFIG", "SET", "hz", big) == Status("OK")
        assert c.cmd("CONFIG", "GET", "hz") == [b"hz", b"500"]
        assert c.cmd("ADDJOB", "q", "body", "0").startswith("D-")
        assert c.cmd("CONFIG", "REWRITE") == Status("OK")
        before = config_all(c)
    restart(proc)
    with Conn(proc.port) as c:
        assert config_all(c) == before


# -- requirepass with bytes that are not UTF-8 ------------------------------------------------

def test_requirepass_that_is_not_utf8_works_for_auth_hello_and_config_get(
        server: DisqueProcess) -> None:
    with Conn(server.port) as admin:
        assert admin.cmd("CONFIG", "SET", "requirepass", b"p\xffw") == Status("OK")
        assert admin.call("CONFIG", "GET", "requirepass") == (
            b"*2\r\n$11\r\nrequirepass\r\n$3\r\np\xffw\r\n")
        with Conn(server.port) as c:
            assert c.cmd("PING") == Err("NOAUTH Authentication required.")
            assert c.cmd("AUTH", b"p\xfew") == Err("ERR invalid password")
            assert c.cmd("AUTH", b"p\xffw") == Status("OK")
        with Conn(server.port) as c:
            assert c.cmd("HELLO", "2", "AUTH", "default", b"p\xfew") == Err(
                "WRONGPASS invalid username-password pair or user is disabled.")
            assert isinstance(c.cmd("HELLO", "2", "AUTH", "default", b"p\xffw"), list)
            assert c.cmd("PING") == Status("PONG")
        assert admin.cmd("CONFIG", "SET", "requirepass", "") == Status("OK")


def test_requirepass_with_special_bytes_survives_rewrite_and_restart(
        make_server) -> None:  # type: ignore[no-untyped-def]
    proc = make_server(config_text=CONF)
    password = b"a b\"'\\\n\t\x00\xff#x"
    with Conn(proc.port) as c:
        assert c.cmd("CONFIG", "SET", "requirepass", password) == Status("OK")
        assert c.cmd("CONFIG", "REWRITE") == Status("OK")
    restart(proc)
    with Conn(proc.port) as c:
        assert c.cmd("PING") == Err("NOAUTH Authentication required.")
        assert c.cmd("AUTH", password) == Status("OK")
        assert c.cmd("CONFIG", "GET", "requirepass") == [b"requirepass", password]


# -- DEBUG SLEEP ---------------------------------------------------------------------------------

@pytest.mark.parametrize("seconds", ["inf", "-inf", "nan", "1e400", "1e300"])
def test_debug_sleep_non_finite_or_huge_is_an_error(conn: Conn, seconds: str) -> None:
    assert conn.call("DEBUG", "SLEEP", seconds) == b"-ERR value is out of range\r\n"
    assert conn.cmd("PING") == Status("PONG")


def test_debug_sleep_not_a_number_sleeps_zero(conn: Conn) -> None:
    assert conn.cmd("DEBUG", "SLEEP", "abc") == Status("OK")


# -- CLIENT REPLY ------------------------------------------------------------------------------

def test_client_reply_skip_drops_only_the_next_reply_in_a_pipeline(conn: Conn) -> None:
    conn.send(b"".join(encode(*a) for a in [
        ("PING", "before"), ("CLIENT", "REPLY", "SKIP"), ("PING", "skipped"),
        ("PING", "after")]))
    assert read_exactly(conn, 2) == [b"before", b"after"]
    assert conn.nothing_pending()


def test_client_reply_skip_sent_alone_drops_the_next_command_reply(conn: Conn) -> None:
    conn.send_cmd("CLIENT", "REPLY", "SKIP")
    conn.send_cmd("PING", "skipped")
    conn.send_cmd("PING", "after")
    assert conn.read(timeout=10) == b"after"


def test_client_reply_off_then_on_in_one_pipeline(conn: Conn) -> None:
    conn.send(b"".join(encode(*a) for a in [
        ("PING", "a"), ("CLIENT", "REPLY", "OFF"), ("PING", "b"), ("NOSUCHCMD",),
        ("CLIENT", "REPLY", "SKIP"), ("PING", "c"), ("CLIENT", "REPLY", "ON"), ("PING", "d")]))
    assert read_exactly(conn, 3) == [b"a", Status("OK"), b"d"]
    assert conn.nothing_pending()


def test_client_reply_skip_drops_the_reply_of_a_blocked_getjob(conn: Conn, q: str) -> None:
    conn.send_cmd("CLIENT", "REPLY", "SKIP")
    conn.send_cmd("GETJOB", "TIMEOUT", "50", "FROM", q)
    conn.send_cmd("PING", "after")
    assert conn.read(timeout=10) == b"after"
    assert conn.cmd("GETJOB", "NOHANG", "FROM", q) is None  # and SKIP was used up


@pytest.mark.parametrize("mode", ["OFF", "SKIP"])
def test_quit_under_client_reply_off_or_skip_closes_without_a_reply(conn: Conn,
                                                                     mode: str) -> None:
    conn.send(encode("CLIENT", "REPLY", mode) + encode("QUIT"))
    assert conn.wait_closed() == b""  # as Redis: the +OK of QUIT is a reply like any other


# -- CLUSTER MEET ------------------------------------------------------------------------------

@pytest.mark.parametrize("host", ["1.2.3", "127.1", "1.2.3.4.5", "::g", "a\x00b"])
def test_cluster_meet_rejects_what_is_not_an_ip_address_or_host_name(
        conn: Conn, host: str) -> None:
    assert conn.call("CLUSTER", "MEET", host, "7711") == (
        b"-ERR Invalid node address specified: %s:7711\r\n" % host.encode())
    assert host.encode() not in conn.cmd("CLUSTER", "NODES")


# -- CLIENT PAUSE ------------------------------------------------------------------------------

def test_client_pause_holds_clients_that_connect_during_the_pause(node: DisqueProcess) -> None:
    with Conn(node.port) as admin:
        start = time.monotonic()
        assert admin.cmd("CLIENT", "PAUSE", "600") == Status("OK")
        with Conn(node.port) as late:
            assert late.cmd("PING") == Status("PONG")
            assert time.monotonic() - start >= 0.55


def test_client_pause_shorter_pause_does_not_end_a_longer_one(node: DisqueProcess) -> None:
    with Conn(node.port) as admin, Conn(node.port) as other:
        start = time.monotonic()
        assert admin.pipeline([("CLIENT", "PAUSE", "800"), ("CLIENT", "PAUSE", "10")]) == [
            Status("OK"), Status("OK")]
        assert other.cmd("PING") == Status("PONG")
        assert time.monotonic() - start >= 0.75
        assert admin.cmd("PING") == Status("PONG")


# -- log-format --------------------------------------------------------------------------------

def test_config_set_log_format_json_takes_effect_at_once(
        make_server) -> None:  # type: ignore[no-untyped-def]
    proc = make_server(args=["--logfile", "log.txt"])
    log = proc.workdir / "log.txt"
    with Conn(proc.port) as c:
        assert c.cmd("CONFIG", "SET", "log-format", "json") == Status("OK")
        size = log.stat().st_size
        assert c.cmd("BGREWRITEAOF").startswith("Background")

        def json_line() -> bool:
            lines = log.read_bytes()[size:].decode().splitlines()
            return any(json.loads(x).get("event") == "aof.rewrite_started" for x in lines)

        wait_for(json_line, timeout=10, what="a JSON log line")


# -- seeded fuzz -------------------------------------------------------------------------------

SETTABLE = [d.name for d in DIRECTIVES if d.settable]
VALUES = ["0", "1", "-1", "2", "100", "501", "65536", "9223372036854775807",
          "9223372036854775808", "99999999999999999999", "abc", "", " 1", "+5", "1.5", "0x10",
          "1gb", "10mb", "1k", "1kb", "yes", "no", "maybe", "x" * 600, "a b", "a\nb", "a\x00b",
          "\xff", "normal 0 0 0", "normal 1mb 1mb 10",
          "slave 0 0 0", "normal -1 0 0", "normal 1mb 1mb 1 normal 2mb 2mb 2", "debug", "warning", "always", "everysec",
          "noeviction", "acks", "json", "console", "127.0.0.1", "::1", "256.1.1.1"]
WORDS = ["", "\x00", "x" * 300, "a b", "a\nb", "\xff", "0", "-1", "abc", "yes", "no",
         "99999999999999999999", "9223372036854775807", "127.0.0.1", "soft", "hard", "normal",
         "ID", "ADDR", "TYPE", "SKIPME", "AUTH", "SETNAME", "default", "2", "3", "INFO",
         "COUNT", "addjob", "x" * 40, "in", "out", "all", "none", "bcast"]


def admin_command(r: random.Random, myid: str) -> list[str]:
    k = r.randrange(100)
    words = [r.choice(WORDS) for _ in range(r.randrange(4))]
    if k < 45:
        name = r.choice(SETTABLE)
        value = r.choice(VALUES)
        if name in ("timeout", "requirepass", "maxclients", "appendonly", "http-port"):
            # (http-port: a random value would open a listener on whatever port it names)
            value = {"timeout": "0", "requirepass": "", "maxclients": "10000",
                     "appendonly": r.choice(["yes", "no"]), "http-port": "0"}[name]
        return ["CONFIG", "SET", r.choice([name, name.upper()]), value]
    if k < 50:
        return ["CONFIG", "GET", r.choice([*SETTABLE, "*", "[", "*max*", "", "\x00"])]
    if k < 53:
        return ["CONFIG", r.choice(["RESETSTAT", "GET", "SET", "foo"]), *words]
    if k < 60:
        sub = r.choice(["SLEEP", "ERROR", "STRUCTSIZE", "JMAP", "FLUSHALL", "nope"])
        if sub == "SLEEP":
            words = [r.choice(["0", "0.001", "abc", "inf", "nan", "1e400", "", "-1"])]
        return ["DEBUG", sub, *words[:2]]
    if k < 70:
        sub = r.choice(["LIST", "GETNAME", "SETNAME", "ID", "SETINFO", "KILL", "PAUSE", "REPLY",
                        "foo"])
        if sub == "PAUSE":
            return ["CLIENT", "PAUSE", r.choice(["0", "1", "-1", "abc", "99999999999999999999"])]
        if sub == "REPLY":
            return ["CLIENT", "REPLY", r.choice(["ON", "bad", "", "maybe"])]
        if sub == "KILL" and "SKIPME" in words:
            words = [w for w in words if w not in ("no", "SKIPME")]
        return ["CLIENT", sub, *words]
    if k < 76:
        return ["HELLO", *words]
    if k < 84:
        sub = r.choice(["MEET", "FORGET", "LEAVING", "SAVECONFIG", "INFO", "NODES", "MYID",
                        "RESET", "foo"])
        if sub == "FORGET" and r.random() < 0.3:
            words = [myid]
        return ["CLUSTER", sub, *words]
    if k < 88:
        return ["INFO", *words[:2]]
    if k < 91:
        return ["COMMAND", *words]
    if k < 97:
        name = r.choice(["QSCAN", "QSTAT", "QPEEK", "QLEN", "PAUSE"])
        if name == "QPEEK":
            return ["QPEEK", r.choice(["q", "", "\x00"]), r.choice(VALUES[:12])]
        if name in ("QSTAT", "QLEN"):
            return [name, r.choice(["q", "", "\x00"])]
        if name == "PAUSE":
            return ["PAUSE", r.choice(["q", "", "\x00"]), *words]
        return ["QSCAN", *words]
    return ["SLOWLOG", r.choice(["GET", "LEN", "RESET", "x"]), *words[:1]]


_SERVES = itertools.count()


def assert_serves(c: Conn, after: list[str]) -> None:
    assert c.cmd("PING") == Status("PONG"), after
    assert isinstance(c.cmd("INFO"), bytes), after
    # a queue of its own: jobs of earlier calls may be back in theirs (aof-enqueue-jobs-once)
    queue = f"fuzzq-{next(_SERVES)}"
    added = c.cmd("ADDJOB", queue, "body", "0")
    if isinstance(added, Err):  # out of memory, or CLUSTER LEAVING yes on a lone node
        assert added.startswith(("OOM ", "NOREPL ", "LEAVING ")), (after, added)
    else:
        got = c.cmd("GETJOB", "NOHANG", "FROM", queue)
        assert got is not None and got[0][1] == added.encode(), (after, got)


@pytest.mark.parametrize("seed", [1, 2])
def test_admin_fuzz_never_answers_an_internal_error_and_rewrites_restart(
        make_server, seed: int) -> None:  # type: ignore[no-untyped-def]
    r = random.Random(seed)
    proc = make_server(config_text=CONF, name=f"fuzz{seed}")
    c = Conn(proc.port, timeout=10)
    myid = c.cmd("CLUSTER", "MYID").decode()
    try:
        for i in range(400):
            cmd = admin_command(r, myid)
            reply = c.cmd(*cmd)
            assert "internal error" not in repr(reply), (cmd, reply)
            assert proc.alive(), (cmd, proc.output()[-3000:])
            if cmd[:2] == ["CONFIG", "SET"] and reply == Status("OK"):
                assert_serves(c, cmd)
            if cmd[:2] == ["CLUSTER", "RESET"] and reply == Status("OK"):
                myid = c.cmd("CLUSTER", "MYID").decode()
            if i % 100 == 99:
                for name in ("maxmemory", "cluster-node-timeout"):  # 0 does not load back
                    if config_all(c)[name.encode()] == b"0":
                        assert c.cmd("CONFIG", "SET", name, "100000") == Status("OK")
                assert c.cmd("CONFIG", "REWRITE") == Status("OK"), cmd
                before = config_all(c)
                c.close()
                restart(proc, controlled=before[b"aof-enqueue-jobs-once"] == b"yes")
                c = Conn(proc.port, timeout=10)
                after = config_all(c)
                before.pop(b"watchdog-period")  # not a config file directive
                after.pop(b"watchdog-period")
                if before[b"aof-enqueue-jobs-once"] == b"yes":
                    # self-disabling: used by this start, then rewritten to no
                    assert after[b"aof-enqueue-jobs-once"] == b"no"
                    before[b"aof-enqueue-jobs-once"] = b"no"
                assert after == before
                assert_serves(c, ["restart"])
    finally:
        c.close()
    text = proc.output()
    assert "command.crash" not in text and "Traceback" not in text, text[-3000:]


def test_admin_fuzz_config_file_is_kept_readable(make_server) -> None:  # type: ignore[no-untyped-def]
    """Every value CONFIG SET accepts for every settable directive rewrites to a file that
    loads back to the same CONFIG GET value (0 excepted where the file demands > 0)."""
    proc = make_server(config_text=CONF)
    conf: Path = proc.workdir / "disque.conf"
    accepted: dict[str, str] = {}
    with Conn(proc.port) as c:
        for name in SETTABLE:
            if name in ("timeout", "maxclients", "requirepass", "appendonly", "http-port"):
                continue
            for value in VALUES:
                if value == "0" and name in ("maxmemory", "cluster-node-timeout"):
                    continue
                if c.cmd("CONFIG", "SET", name, value) == Status("OK"):
                    accepted[name] = value
            assert name not in accepted or c.cmd("PING") == Status("PONG")
        assert c.cmd("CONFIG", "SET", "maxmemory", "1gb") == Status("OK")
        assert c.cmd("CONFIG", "REWRITE") == Status("OK")
        before = config_all(c)
    assert accepted
    restart(proc)
    with Conn(proc.port) as c:
        after = config_all(c)
    before.pop(b"watchdog-period")
    after.pop(b"watchdog-period")
    assert after == before, conf.read_text()
