"""Server-level commands: INFO, HELLO, PING, ECHO, TIME, COMMAND, CLIENT, CONFIG, DEBUG,
SLOWLOG, MONITOR, SHUTDOWN (checklist §1, §4, §6, §8; issue 3)."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import pytest

from tests.harness import DisqueProcess, wait_for
from tests.integration.resp import Conn, Status, add, blocked_on, info, node_id

# Issue 4 adds a Cluster section (the original had none).
SECTIONS = ["Server", "Clients", "Memory", "Jobs", "Queues", "Cluster", "Persistence", "Stats",
            "CPU"]
FIELDS = {
    "Server": ["disque_version", "disque_py_version", "disque_git_sha1", "disque_git_dirty", "disque_build_id", "os",
               "arch_bits", "multiplexing_api", "gcc_version", "process_id", "run_id",
               "tcp_port", "uptime_in_seconds", "uptime_in_days", "hz", "executable",
               "config_file", "compiled", "compiled_modules"],
    "Clients": ["connected_clients", "client_longest_output_list", "client_biggest_input_buf",
                "blocked_clients"],
    "Memory": ["used_memory", "used_memory_human", "used_memory_rss", "used_memory_peak",
               "used_memory_peak_human", "mem_fragmentation_ratio", "mem_allocator"],
    "Jobs": ["registered_jobs", "rereplication_nodes", "rereplication_pending",
             "rereplicated_jobs", "rereplication_unlisted", "rereplication_rechecks", "rereplication_rechecked", "rereplication_left", "underreplicated_jobs", "repaired_jobs", "deadlettered_jobs", "redriven_jobs", "redrive_pending",
             "overflow_status", "overflow_jobs", "overflow_bytes", "overflow_file_bytes", "overflow_written_jobs", "overflow_read_jobs", "overflow_spills"],
    "Queues": ["registered_queues"],
    # a lone node has no bus traffic, so no per-message-type lines yet
    "Cluster": ["cluster_nodes", "cluster_reachable_nodes", "cluster_failing_nodes",
                "cluster_leaving_nodes", "cluster_handshake_nodes", "bus_messages_sent",
                "bus_messages_received", "bus_bytes_sent", "bus_bytes_received"],
    "Persistence": ["loading", "aof_enabled", "aof_state", "aof_rewrite_in_progress",
                    "aof_rewrite_scheduled", "aof_last_rewrite_time_sec",
                    "aof_current_rewrite_time_sec", "aof_last_bgrewrite_status",
                    "aof_rewrites_consecutive_failures", "aof_last_write_status",
                    "aof_last_write_error", "aof_write_errors"],
    "Stats": ["total_connections_received", "total_commands_processed",
              "instantaneous_ops_per_sec", "total_net_input_bytes", "total_net_output_bytes",
              "instantaneous_input_kbps", "instantaneous_output_kbps", "rejected_connections",
              "tls_handshakes", "tls_handshake_failures", "latest_fork_usec"],
    "CPU": ["used_cpu_sys", "used_cpu_user", "used_cpu_sys_children", "used_cpu_user_children"],
}


def sections(raw: bytes) -> list[tuple[str, list[tuple[str, str]]]]:
    """INFO text as [(section name, [(key, value), ...]), ...] in order."""
    text = raw.decode()
    assert "\n" not in text.replace("\r\n", ""), "INFO lines must end in CRLF"
    out: list[tuple[str, list[tuple[str, str]]]] = []
    for line in text.split("\r\n"):
        if not line:
            continue
        if line.startswith("# "):
            out.append((line[2:], []))
        else:
            assert out, f"field before any section header: {line!r}"
            key, sep, value = line.partition(":")
            assert sep, f"not a key:value line: {line!r}"
            out[-1][1].append((key, value))
    return out


# -- INFO ------------------------------------------------------------------------------------------

def test_info_default_sections_in_order(conn: Conn) -> None:
    raw = conn.cmd("INFO")
    assert isinstance(raw, bytes)
    assert [name for name, _ in sections(raw)] == SECTIONS
    assert [name for name, _ in sections(conn.cmd("INFO", "default"))] == SECTIONS


def test_info_sections_are_separated_by_an_empty_line(conn: Conn) -> None:
    text = conn.cmd("INFO").decode()
    assert text.startswith("# Server\r\n")
    for name in SECTIONS[1:]:
        assert f"\r\n\r\n# {name}\r\n" in text


@pytest.mark.parametrize("section", SECTIONS)
def test_info_section_fields_in_order(conn: Conn, section: str) -> None:
    got = sections(conn.cmd("INFO", section.lower()))
    assert [name for name, _ in got] == [section]
    assert [k for k, _ in got[0][1]] == FIELDS[section]


def test_info_all_adds_commandstats(conn: Conn) -> None:
    conn.cmd("PING")
    got = sections(conn.cmd("INFO", "all"))
    assert [name for name, _ in got] == SECTIONS + ["Commandstats"]
    stats = dict(got[-1][1])
    assert "cmdstat_ping" in stats
    for key, value in got[-1][1]:
        assert re.match(r"^cmdstat_[a-z]+$", key), key
        assert re.match(r"^calls=\d+,usec=\d+,usec_per_call=\d+\.\d{2}$", value), value


def test_info_commandstats_counts_calls(conn: Conn, q: str) -> None:
    def calls() -> int:
        stats = dict(sections(conn.cmd("INFO", "commandstats"))[0][1])
        m = re.match(r"calls=(\d+),", stats.get("cmdstat_qlen", "calls=0,"))
        assert m
        return int(m.group(1))

    before = calls()
    for _ in range(3):
        conn.cmd("QLEN", q)
    assert calls() == before + 3


def test_info_section_name_is_case_insensitive(conn: Conn) -> None:
    assert [n for n, _ in sections(conn.cmd("INFO", "MeMoRy"))] == ["Memory"]


def test_info_unknown_section_is_empty_bulk(conn: Conn) -> None:
    assert conn.call("INFO", "nosuchsection") == b"$0\r\n\r\n"


def test_info_with_two_arguments_is_syntax_error(conn: Conn) -> None:
    assert conn.call("INFO", "server", "memory") == b"-ERR syntax error\r\n"


def test_info_server_values(node: DisqueProcess, conn: Conn) -> None:
    s = info(conn, "server")
    assert s["process_id"] == str(node.proc.pid)  # type: ignore[union-attr]
    assert s["tcp_port"] == str(node.port)
    assert re.match(r"^[0-9a-f]{40}$", s["run_id"]), s["run_id"]
    assert s["hz"] == "10"
    assert s["arch_bits"] in ("32", "64")
    assert s["config_file"] == ""               # started without a config file
    assert os.path.isabs(s["executable"]), s["executable"]
    assert int(s["uptime_in_seconds"]) >= 0 and int(s["uptime_in_days"]) == 0
    assert s["disque_git_dirty"] in ("0", "1")


def test_info_persistence_values_with_aof_off(conn: Conn) -> None:
    p = info(conn, "persistence")
    assert p["loading"] == "0"
    assert p["aof_enabled"] == "0"
    assert p["aof_state"] == "off"
    assert p["aof_last_rewrite_time_sec"] == "-1"
    assert p["aof_last_bgrewrite_status"] == "ok"
    assert p["aof_last_write_status"] == "ok"


def test_info_jobs_and_queues_count(conn: Conn, q: str) -> None:
    jobs = int(info(conn, "jobs")["registered_jobs"])
    queues = int(info(conn, "queues")["registered_queues"])
    add(conn, q)
    add(conn, q)
    assert int(info(conn, "jobs")["registered_jobs"]) == jobs + 2
    assert int(info(conn, "queues")["registered_queues"]) == queues + 1


def test_info_stats_count_commands_and_connections(node: DisqueProcess, conn: Conn) -> None:
    before = info(conn, "stats")
    with Conn(node.port) as other:
        other.cmd("PING")
    after = info(conn, "stats")
    assert int(after["total_connections_received"]) >= int(before["total_connections_received"]) + 1
    assert int(after["total_commands_processed"]) >= int(before["total_commands_processed"]) + 2
    assert int(after["total_net_input_bytes"]) > int(before["total_net_input_bytes"])
    assert int(after["total_net_output_bytes"]) > int(before["total_net_output_bytes"])
    for key in ("instantaneous_input_kbps", "instantaneous_output_kbps"):
        assert re.match(r"^\d+\.\d{2}$", after[key]), (key, after[key])
    cpu = info(conn, "cpu")
    for key in FIELDS["CPU"]:
        assert re.match(r"^\d+\.\d{2}$", cpu[key]), (key, cpu[key])


def test_config_resetstat_clears_commandstats(conn: Conn, q: str) -> None:
    conn.cmd("QLEN", q)
    assert conn.call("CONFIG", "RESETSTAT") == b"+OK\r\n"
    assert b"cmdstat_qlen:" not in conn.cmd("INFO", "commandstats")
    assert int(info(conn, "stats")["total_commands_processed"]) < 10


# -- HELLO -----------------------------------------------------------------------------------------

def test_hello_shape(node: DisqueProcess, conn: Conn) -> None:
    raw = conn.call("HELLO")
    m = re.fullmatch(
        rb"\*3\r\n:1\r\n\$40\r\n([0-9a-f]{40})\r\n"
        rb"\*4\r\n\$40\r\n([0-9a-f]{40})\r\n\$(\d+)\r\n([0-9.]*)\r\n\$(\d+)\r\n(\d+)\r\n"
        rb"\$1\r\n1\r\n", raw)
    assert m, raw
    assert m.group(1) == m.group(2)
    assert int(m.group(3)) == len(m.group(4)) and m.group(4) in (b"", b"127.0.0.1")
    assert m.group(6) == str(node.port).encode()


def test_hello_node_id_is_stable(conn: Conn) -> None:
    assert node_id(conn) == node_id(conn)


# -- PING / ECHO / TIME ----------------------------------------------------------------------------

def test_ping(conn: Conn) -> None:
    assert conn.call("PING") == b"+PONG\r\n"
    assert conn.call("ping") == b"+PONG\r\n"
    assert conn.call("PING", "hello") == b"$5\r\nhello\r\n"
    assert conn.call("PING", "") == b"$0\r\n\r\n"


def test_echo(conn: Conn) -> None:
    assert conn.call("ECHO", "hello world") == b"$11\r\nhello world\r\n"
    assert conn.call("ECHO", b"\x00\r\n") == b"$3\r\n\x00\r\n\r\n"
    assert conn.call("ECHO") == b"-ERR wrong number of arguments for 'echo' command\r\n"
    assert conn.call("ECHO", "a", "b") == b"-ERR wrong number of arguments for 'echo' command\r\n"


def test_time_is_two_bulk_strings(conn: Conn) -> None:
    raw = conn.call("TIME")
    m = re.fullmatch(rb"\*2\r\n\$\d+\r\n(\d+)\r\n\$\d+\r\n(\d+)\r\n", raw)
    assert m, raw
    assert abs(int(m.group(1)) - time.time()) < 10
    assert 0 <= int(m.group(2)) < 1_000_000


# -- COMMAND ---------------------------------------------------------------------------------------

ISSUE_COMMANDS = {
    "addjob", "getjob", "ackjob", "fastack", "working", "nack", "qlen", "qstat", "qpeek",
    "enqueue", "dequeue", "deljob", "show", "qscan", "jscan", "pause", "info", "hello", "ping",
    "echo", "time", "config", "client", "command", "debug", "shutdown", "monitor", "auth",
}


def test_command_lists_every_command_and_count_matches(conn: Conn) -> None:
    entries = conn.cmd("COMMAND")
    names = {e[0].decode() for e in entries}
    assert names >= ISSUE_COMMANDS
    assert conn.call("COMMAND", "COUNT") == b":%d\r\n" % len(entries)
    for e in entries:
        assert len(e) == 6 and isinstance(e[1], int) and isinstance(e[2], list)
        assert all(isinstance(f, Status) for f in e[2])
        assert e[3:] == [0, 0, 0]


def test_command_info_addjob_exact(conn: Conn) -> None:
    assert conn.call("COMMAND", "INFO", "addjob") == (
        b"*1\r\n*6\r\n$6\r\naddjob\r\n:-4\r\n*3\r\n+write\r\n+denyoom\r\n+fast\r\n"
        b":0\r\n:0\r\n:0\r\n")


@pytest.mark.parametrize(
    ("name", "arity", "flags"),
    [
        ("getjob", -2, ["write", "fast"]),
        ("ackjob", -1, ["write", "fast"]),
        ("fastack", -1, ["write", "fast"]),
        ("deljob", -1, ["write", "fast"]),
        ("show", 2, ["readonly", "fast"]),
        ("qlen", 2, ["readonly", "fast"]),
        ("qpeek", 3, ["readonly"]),
        ("qstat", 2, ["readonly", "fast"]),
        ("qscan", -1, ["readonly"]),
        ("jscan", -1, ["readonly"]),
        ("enqueue", -1, ["write", "denyoom", "fast"]),
        ("nack", -1, ["write", "denyoom", "fast"]),
        ("dequeue", -1, ["write", "fast"]),
        ("working", 2, ["write", "fast"]),
        ("pause", -3, ["readonly", "fast"]),
        ("ping", -1, ["readonly", "fast"]),
        ("info", -1, ["readonly", "loading"]),
        ("time", 1, ["readonly", "fast"]),
        ("auth", 2, ["readonly", "loading", "fast"]),
        ("monitor", 1, ["readonly", "admin"]),
        ("debug", -2, ["admin"]),
        ("config", -2, ["readonly", "admin"]),
        ("client", -2, ["readonly", "admin"]),
        ("shutdown", -1, ["readonly", "admin", "loading"]),
        ("command", 0, ["readonly", "loading"]),
    ],
)
def test_command_info_arity_and_flags(conn: Conn, name: str, arity: int, flags: list[str]) -> None:
    entry = conn.cmd("COMMAND", "INFO", name.upper())[0]
    assert entry[0] == name.encode()
    assert entry[1] == arity
    assert entry[2] == flags


def test_command_info_unknown_is_nil(conn: Conn) -> None:
    assert conn.call("COMMAND", "INFO", "nosuch") == b"*1\r\n$-1\r\n"
    got = conn.cmd("COMMAND", "INFO", "qlen", "nosuch")
    assert got[0][0] == b"qlen" and got[1] is None


def test_command_unknown_subcommand(conn: Conn) -> None:
    assert conn.call("COMMAND", "FOO") == b"-ERR Unknown subcommand or wrong number of arguments.\r\n"


# -- CLIENT ----------------------------------------------------------------------------------------

# the original's fields, then Redis 7.2's lib-name and lib-ver (set by CLIENT SETINFO)
CLIENT_LIST_FIELDS = ["id", "addr", "fd", "name", "age", "idle", "flags", "qbuf", "qbuf-free",
                      "obl", "oll", "omem", "events", "cmd", "lib-name", "lib-ver"]


def client_lines(conn: Conn) -> list[dict[str, str]]:
    raw = conn.cmd("CLIENT", "LIST")
    assert isinstance(raw, bytes)
    out = []
    for line in raw.decode().split("\n"):
        if line:
            out.append(dict(kv.split("=", 1) for kv in line.split(" ")))
    return out


def test_client_list_fields_in_order(conn: Conn) -> None:
    raw = conn.cmd("CLIENT", "LIST").decode()
    assert raw.endswith("\n")
    local = "127.0.0.1:%d" % conn.sock.getsockname()[1]
    mine = [line for line in raw.split("\n") if f"addr={local} " in line]
    assert len(mine) == 1, raw
    assert [kv.split("=", 1)[0] for kv in mine[0].split(" ")] == CLIENT_LIST_FIELDS
    fields = dict(kv.split("=", 1) for kv in mine[0].split(" "))
    assert fields["cmd"] == "client"
    assert fields["name"] == ""


def fields_of(line: str) -> dict[str, str]:
    return dict(kv.split("=", 1) for kv in line.split(" "))


def test_client_setinfo_shows_in_client_list_and_client_info(conn: Conn) -> None:
    local = "127.0.0.1:%d" % conn.sock.getsockname()[1]
    [mine] = [c for c in client_lines(conn) if c["addr"] == local]
    assert (mine["lib-name"], mine["lib-ver"]) == ("", "")
    assert conn.cmd("CLIENT", "SETINFO", "LIB-NAME", "my-lib") == "OK"
    assert conn.cmd("CLIENT", "SETINFO", "lib-ver", "1.2.3") == "OK"
    [mine] = [c for c in client_lines(conn) if c["addr"] == local]
    assert (mine["lib-name"], mine["lib-ver"]) == ("my-lib", "1.2.3")
    # CLIENT INFO: this connection's CLIENT LIST line
    raw = conn.cmd("CLIENT", "INFO")
    assert isinstance(raw, bytes) and raw.endswith(b"\n") and raw.count(b"\n") == 1, raw
    line = raw.decode().rstrip("\n")
    assert [kv.split("=", 1)[0] for kv in line.split(" ")] == CLIENT_LIST_FIELDS
    me = fields_of(line)
    assert me["id"] == str(conn.cmd("CLIENT", "ID")) and me["addr"] == local
    assert (me["lib-name"], me["lib-ver"], me["cmd"]) == ("my-lib", "1.2.3", "client")
    # a refused value (it would split the line) keeps the previous one
    assert conn.cmd("CLIENT", "SETINFO", "lib-ver", "2.0 flags=O") == \
        "ERR lib-ver cannot contain spaces, newlines or special characters."
    assert conn.cmd("CLIENT", "SETINFO", "lib-color", "red") == \
        "ERR Unrecognized option 'lib-color'"
    assert fields_of(conn.cmd("CLIENT", "INFO").decode().rstrip("\n"))["lib-ver"] == "1.2.3"
    assert conn.cmd("CLIENT", "INFO", "x") == \
        "ERR Syntax error, try CLIENT (LIST | KILL ip:port | GETNAME | SETNAME connection-name)"


def test_redis_py_announces_its_library_and_client_info_shows_it(node: DisqueProcess) -> None:
    import redis

    r = node.client()  # redis-py sends CLIENT SETINFO LIB-NAME / LIB-VER when it connects
    try:
        info = r.client_info()
        assert (info["lib-name"], info["lib-ver"]) == ("redis-py", redis.__version__)
    finally:
        r.close()


def test_client_id_is_an_integer_unique_per_connection(node: DisqueProcess, conn: Conn) -> None:
    my_id = conn.cmd("CLIENT", "ID")
    assert isinstance(my_id, int)
    with Conn(node.port) as other:
        assert other.cmd("CLIENT", "ID") != my_id
    local = "127.0.0.1:%d" % conn.sock.getsockname()[1]
    assert [c["id"] for c in client_lines(conn) if c["addr"] == local] == [str(my_id)]


def test_client_setname_getname(conn: Conn) -> None:
    assert conn.call("CLIENT", "GETNAME") == b"$-1\r\n"
    assert conn.call("CLIENT", "SETNAME", "worker-1") == b"+OK\r\n"
    assert conn.call("CLIENT", "GETNAME") == b"$8\r\nworker-1\r\n"
    assert any(c["name"] == "worker-1" for c in client_lines(conn))
    assert conn.call("CLIENT", "SETNAME", "") == b"+OK\r\n"
    assert conn.call("CLIENT", "GETNAME") == b"$-1\r\n"


@pytest.mark.parametrize("name", ["has space", "new\nline", "tab\t"])
def test_client_setname_rejects_special_characters(conn: Conn, name: str) -> None:
    assert conn.call("CLIENT", "SETNAME", name) == (
        b"-ERR Client names cannot contain spaces, newlines or special characters.\r\n")


def test_client_kill_by_address(node: DisqueProcess, conn: Conn) -> None:
    with Conn(node.port) as victim:
        victim.cmd("PING")
        addr = "127.0.0.1:%d" % victim.sock.getsockname()[1]
        assert conn.call("CLIENT", "KILL", addr) == b"+OK\r\n"
        victim.wait_closed(timeout=10)
    assert conn.call("CLIENT", "KILL", "1.2.3.4:5") == b"-ERR No such client\r\n"


@pytest.mark.parametrize("how", ["addr", "filter"])
def test_client_kill_of_itself_answers_then_closes(node: DisqueProcess, how: str) -> None:
    """As Redis: the killing connection gets its reply, then the close (the old-style
    `CLIENT KILL <own addr>` closed it without the +OK)."""
    with Conn(node.port) as me:
        addr = "127.0.0.1:%d" % me.sock.getsockname()[1]
        if how == "addr":
            me.send_cmd("CLIENT", "KILL", addr)
            assert me.wait_closed(timeout=10) == b"+OK\r\n"
        else:
            me.send_cmd("CLIENT", "KILL", "ADDR", addr, "SKIPME", "no")
            assert me.wait_closed(timeout=10) == b":1\r\n"


def test_client_kill_by_id(node: DisqueProcess, conn: Conn) -> None:
    with Conn(node.port) as victim:
        victim_id = victim.cmd("CLIENT", "ID")
        assert conn.call("CLIENT", "KILL", "ID", str(victim_id)) == b":1\r\n"
        victim.wait_closed(timeout=10)
    assert conn.call("CLIENT", "KILL", "ID", str(victim_id)) == b":0\r\n"


def test_client_kill_unknown_type(conn: Conn) -> None:
    assert conn.call("CLIENT", "KILL", "TYPE", "pubsub-ish") == (
        b"-ERR Unknown client type 'pubsub-ish'\r\n")


def test_client_kill_blocked_client_leaves_no_trace(node: DisqueProcess, conn: Conn, q: str) -> None:
    with Conn(node.port) as victim:
        victim_id = victim.cmd("CLIENT", "ID")
        victim.send_cmd("GETJOB", "FROM", q)
        wait_for(lambda: blocked_on(conn, q) == 1, timeout=20, what="client blocked")
        assert conn.cmd("CLIENT", "KILL", "ID", str(victim_id)) == 1
        victim.wait_closed(timeout=10)
    wait_for(lambda: blocked_on(conn, q) == 0, timeout=20, what="blocked count cleared")
    job_id = add(conn, q)
    assert conn.cmd("QLEN", q) == 1
    assert conn.cmd("GETJOB", "NOHANG", "FROM", q)[0][1].decode() == job_id


def test_client_unknown_subcommand(conn: Conn) -> None:
    assert conn.call("CLIENT", "FOO") == (
        b"-ERR Syntax error, try CLIENT (LIST | KILL ip:port | GETNAME | SETNAME "
        b"connection-name)\r\n")


# -- CONFIG ----------------------------------------------------------------------------------------

# the directives issue 3 names, in the order the original lists them for CONFIG GET *
CONFIG_ORDER = ["requirepass", "logfile", "pidfile", "maxmemory", "timeout", "port", "maxclients",
                "hz", "cluster-node-timeout", "tcp-keepalive", "aof-enqueue-jobs-once",
                "loglevel", "appendfsync", "appendonly", "dir", "client-output-buffer-limit",
                "bind"]


def config_get(conn: Conn, pattern: str) -> dict[str, str]:
    flat = conn.cmd("CONFIG", "GET", pattern)
    assert isinstance(flat, list) and len(flat) % 2 == 0, flat
    return {k.decode(): v.decode() for k, v in zip(flat[::2], flat[1::2], strict=True)}


def test_config_get_star_lists_parameters_in_the_original_order(conn: Conn) -> None:
    flat = conn.cmd("CONFIG", "GET", "*")
    names = [k.decode() for k in flat[::2]]
    assert all(isinstance(v, bytes) for v in flat)
    positions = [names.index(n) for n in CONFIG_ORDER]   # ValueError if one is missing
    assert positions == sorted(positions), names


def test_config_get_defaults(node: DisqueProcess, conn: Conn) -> None:
    got = config_get(conn, "*")
    assert got["port"] == str(node.port)
    assert got["bind"] == "127.0.0.1"
    assert got["maxmemory"] == "1073741824"
    assert got["hz"] == "10"
    assert got["timeout"] == "0"
    assert got["maxclients"] == "10000"
    assert got["loglevel"] == "notice"
    assert got["appendonly"] == "no"
    assert got["appendfsync"] == "everysec"
    assert got["requirepass"] == ""
    assert got["cluster-node-timeout"] == "15000"
    assert got["client-output-buffer-limit"] == "normal 0 0 0"
    assert got["aof-enqueue-jobs-once"] == "no"
    assert Path(got["dir"]) == node.workdir.resolve()


def test_config_get_single_and_glob(conn: Conn) -> None:
    assert conn.call("CONFIG", "GET", "maxmemory") == b"*2\r\n$9\r\nmaxmemory\r\n$10\r\n1073741824\r\n"
    assert {"maxmemory", "maxclients"} <= set(config_get(conn, "max*"))
    assert all(k.startswith("max") for k in config_get(conn, "max*"))
    assert conn.call("CONFIG", "GET", "nosuchparam") == b"*0\r\n"
    assert conn.call("CONFIG", "GET", "MAXMEMORY") == b"*0\r\n"    # the glob is case-sensitive


def test_config_set_then_get(conn: Conn) -> None:
    try:
        assert conn.call("CONFIG", "SET", "loglevel", "warning") == b"+OK\r\n"
        assert config_get(conn, "loglevel") == {"loglevel": "warning"}
        assert conn.call("CONFIG", "SET", "timeout", "300") == b"+OK\r\n"
        assert config_get(conn, "timeout") == {"timeout": "300"}
        assert conn.call("CONFIG", "SET", "maxmemory", "2mb") == b"+OK\r\n"
        assert config_get(conn, "maxmemory") == {"maxmemory": "2097152"}
    finally:
        conn.cmd("CONFIG", "SET", "loglevel", "notice")
        conn.cmd("CONFIG", "SET", "timeout", "0")
        conn.cmd("CONFIG", "SET", "maxmemory", "1gb")


def test_config_set_hz_is_clamped(conn: Conn) -> None:
    try:
        assert conn.call("CONFIG", "SET", "hz", "1000") == b"+OK\r\n"
        assert config_get(conn, "hz") == {"hz": "500"}
        assert conn.call("CONFIG", "SET", "hz", "0") == b"+OK\r\n"
        assert config_get(conn, "hz") == {"hz": "1"}
    finally:
        conn.cmd("CONFIG", "SET", "hz", "10")


@pytest.mark.parametrize(
    ("name", "value"),
    [("maxmemory-policy", "bogus"), ("timeout", "-1"), ("hz", "abc"), ("loglevel", "loud"),
     ("maxclients", "0"), ("appendfsync", "sometimes"), ("maxmemory", "lots")],
)
def test_config_set_invalid_value(conn: Conn, name: str, value: str) -> None:
    assert conn.call("CONFIG", "SET", name, value) == (
        b"-ERR Invalid argument '%s' for CONFIG SET '%s'\r\n" % (value.encode(), name.encode()))


@pytest.mark.parametrize("name", ["nosuch", "port", "bind"])
def test_config_set_unsupported_parameter(conn: Conn, name: str) -> None:
    assert conn.call("CONFIG", "SET", name, "1") == (
        b"-ERR Unsupported CONFIG parameter: %s\r\n" % name.encode())


@pytest.mark.parametrize(
    ("args", "typed"),
    [(("GET",), "GET"), (("get",), "get"), (("SET", "hz"), "SET"),
     (("set", "hz", "10", "x"), "set"), (("RESETSTAT", "x"), "RESETSTAT"),
     (("REWRITE", "x"), "REWRITE")],
)
def test_config_wrong_number_of_arguments(conn: Conn, args: tuple[str, ...], typed: str) -> None:
    assert conn.call("CONFIG", *args) == (
        b"-ERR Wrong number of arguments for CONFIG %s\r\n" % typed.encode())


def test_config_unknown_subcommand(conn: Conn) -> None:
    assert conn.call("CONFIG", "FLUSH") == (
        b"-ERR CONFIG subcommand must be one of GET, SET, RESETSTAT, REWRITE\r\n")


def test_config_rewrite_without_config_file(conn: Conn) -> None:
    assert conn.call("CONFIG", "REWRITE") == b"-ERR The server is running without a config file\r\n"


def test_config_set_rewrite_restart_round_trip(make_server) -> None:  # type: ignore[no-untyped-def]
    original = "# written by the test\nloglevel notice\ntimeout 0\n# keep me\n"
    first = make_server(config_text=original, name="rewrite")
    conf = first.workdir / "disque.conf"
    with Conn(first.port) as c:
        assert c.call("CONFIG", "SET", "timeout", "123") == b"+OK\r\n"
        assert c.call("CONFIG", "SET", "maxmemory-policy", "noeviction") == b"+OK\r\n"
        assert c.call("CONFIG", "SET", "loglevel", "warning") == b"+OK\r\n"
        assert c.call("CONFIG", "REWRITE") == b"+OK\r\n"
        assert info(c, "server")["config_file"] == str(conf.resolve())
    text = conf.read_text()
    lines = text.splitlines()
    assert "# written by the test" in lines and "# keep me" in lines
    assert "timeout 123" in lines
    assert "maxmemory-policy noeviction" in lines
    assert "loglevel warning" in lines
    assert "loglevel notice" not in lines and "timeout 0" not in lines
    first.kill()
    again = DisqueProcess(first.workdir, port=first.port, config_text=text)
    again.start()
    try:
        with Conn(again.port) as c:
            got = config_get(c, "*")
            assert got["timeout"] == "123"
            assert got["maxmemory-policy"] == "noeviction"
            assert got["loglevel"] == "warning"
    finally:
        again.kill()


# -- DEBUG -----------------------------------------------------------------------------------------

def test_debug_sleep_blocks_then_replies_ok(conn: Conn) -> None:
    start = time.monotonic()
    assert conn.call("DEBUG", "SLEEP", "0.3") == b"+OK\r\n"
    assert time.monotonic() - start >= 0.25
    assert conn.call("DEBUG", "SLEEP", "0") == b"+OK\r\n"


def test_debug_error_replies_the_message_verbatim(conn: Conn) -> None:
    assert conn.call("DEBUG", "ERROR", "CUSTOM something broke") == b"-CUSTOM something broke\r\n"
    assert conn.call("DEBUG", "ERROR", "two\r\nlines") == b"-two  lines\r\n"


def test_debug_unknown_subcommand(conn: Conn) -> None:
    assert conn.call("DEBUG", "NOSUCH") == (
        b"-ERR Unknown DEBUG subcommand or wrong number of arguments for 'NOSUCH'\r\n")


def test_debug_flushall_deletes_all_jobs_and_queues(server: DisqueProcess) -> None:
    with Conn(server.port) as c:
        ids = c.pipeline([("ADDJOB", f"fq{i % 5}", "b", "0") for i in range(50)])
        c.cmd("GETJOB", "COUNT", "3", "FROM", "fq0")
        assert int(info(c, "jobs")["registered_jobs"]) == 50
        assert c.call("DEBUG", "FLUSHALL") == b"+OK\r\n"
        assert info(c, "jobs")["registered_jobs"] == "0"
        assert info(c, "queues")["registered_queues"] == "0"
        assert c.cmd("QLEN", "fq1") == 0
        assert c.cmd("SHOW", ids[0]) is None
        assert c.cmd("QSCAN", "BUSYLOOP") == [b"0", []]
        add(c, "fq0")                                # still usable afterwards


# -- SLOWLOG ---------------------------------------------------------------------------------------

def test_slowlog_records_and_resets(conn: Conn, q: str) -> None:
    try:
        assert conn.call("CONFIG", "SET", "slowlog-log-slower-than", "0") == b"+OK\r\n"
        assert conn.call("SLOWLOG", "RESET") == b"+OK\r\n"
        conn.cmd("QLEN", q)
        assert conn.cmd("SLOWLOG", "LEN") >= 1
        entries = conn.cmd("SLOWLOG", "GET", "1")
        assert len(entries) == 1
        entry = entries[0]
        assert len(entry) >= 4
        assert all(isinstance(x, int) for x in entry[:3])
        assert abs(entry[1] - time.time()) < 60
        assert isinstance(entry[3], list)
        assert conn.call("SLOWLOG", "RESET") == b"+OK\r\n"
        assert conn.cmd("SLOWLOG", "LEN") <= 1
    finally:
        conn.cmd("CONFIG", "SET", "slowlog-log-slower-than", "10000")


def test_slowlog_get_returns_args_of_slow_command(conn: Conn, q: str) -> None:
    try:
        conn.cmd("CONFIG", "SET", "slowlog-log-slower-than", "0")
        conn.cmd("SLOWLOG", "RESET")
        conn.cmd("QLEN", q)
        entries = conn.cmd("SLOWLOG", "GET", "10")
        assert [b"QLEN", q.encode()] in [e[3] for e in entries]
    finally:
        conn.cmd("CONFIG", "SET", "slowlog-log-slower-than", "10000")


def test_slowlog_unknown_subcommand(conn: Conn) -> None:
    assert conn.call("SLOWLOG", "FOO") == (
        b"-ERR Unknown SLOWLOG subcommand or wrong # of args. Try GET, RESET, LEN.\r\n")


# -- MONITOR ---------------------------------------------------------------------------------------

def test_monitor_streams_executed_commands(node: DisqueProcess, q: str) -> None:
    with Conn(node.port) as mon, Conn(node.port) as producer:
        assert mon.call("MONITOR") == b"+OK\r\n"
        producer.cmd("ADDJOB", q, "body", "0")
        line = mon.read_raw(timeout=20)
        port = producer.sock.getsockname()[1]
        assert re.fullmatch(
            rb'\+\d+\.\d{6} \[127\.0\.0\.1:%d\] "ADDJOB" "%s" "body" "0"\r\n'
            % (port, re.escape(q.encode())), line), line
        producer.cmd("QLEN", q)
        line = mon.read_raw(timeout=20)
        assert line.endswith(b'"QLEN" "%s"\r\n' % q.encode()), line


# -- SHUTDOWN --------------------------------------------------------------------------------------

@pytest.mark.parametrize("args", [("ABORT",), ("REWRITE-AOF", "x"), ("now",)])
def test_shutdown_with_bad_arguments_is_syntax_error(server: DisqueProcess,
                                                     args: tuple[str, ...]) -> None:
    with Conn(server.port) as c:
        assert c.call("SHUTDOWN", *args) == b"-ERR syntax error\r\n"
        assert c.call("PING") == b"+PONG\r\n"
    assert server.alive()


@pytest.mark.parametrize("args", [(), ("NOSAVE",), ("SAVE",)])
def test_shutdown_exits_without_a_reply(server: DisqueProcess, args: tuple[str, ...]) -> None:
    # Issue 6: SHUTDOWN [NOSAVE|SAVE|REWRITE-AOF] (the original refused NOSAVE and SAVE).
    with Conn(server.port) as c:
        c.send_cmd("SHUTDOWN", *args)
        assert c.wait_closed(timeout=20) == b""
    wait_for(lambda: not server.alive(), timeout=30, what="server process exited")
    assert server.proc.returncode == 0  # type: ignore[union-attr]


def test_sigterm_shuts_down_cleanly(server: DisqueProcess) -> None:
    assert server.stop() == 0
