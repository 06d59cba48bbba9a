"""disque.config: loading disque.conf and flags, CONFIG GET / SET / REWRITE. No sockets."""

from __future__ import annotations

import dataclasses
import io
import os
import re
import stat
import sys
from pathlib import Path

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from disque.config import (
    DIRECTIVES,
    Config,
    ConfigError,
    ConfigSetError,
    config_get,
    config_rewrite,
    config_set,
    load_config,
    on_set,
    parse_memory,
    render_value,
    split_args,
)
from disque.config import _quote as quote

REPO = Path(__file__).resolve().parents[2]
SHIPPED_CONF = REPO / "conf" / "disque.conf"
GB = 1024**3
MB = 1024**2


def load_text(tmp_path: Path, text: str, *flags: str) -> Config:
    conf = tmp_path / "disque.conf"
    conf.write_text(text)
    return load_config([str(conf), *flags], cwd=str(tmp_path))


def load_error(tmp_path: Path, text: str, *flags: str) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load_text(tmp_path, text, *flags)
    return info.value


def directive_values(cfg: Config) -> dict[str, object]:
    return {d.name: getattr(cfg, d.attr) for d in DIRECTIVES if d.name != "dir"}


# -- defaults and the table ---------------------------------------------------------------------

def test_defaults_without_arguments(tmp_path: Path) -> None:
    cfg = load_config([], cwd=str(tmp_path))
    assert cfg.config_file is None
    assert cfg.dir == str(tmp_path)
    assert cfg.port == 7711
    assert cfg.bind == ["127.0.0.1"]
    assert cfg.tcp_backlog == 511
    assert cfg.unixsocket == "" and cfg.unixsocketperm == 0
    assert cfg.timeout == 0 and cfg.tcp_keepalive == 0
    assert cfg.daemonize is False and cfg.pidfile == ""
    assert cfg.loglevel == "notice" and cfg.logfile == "" and cfg.log_format == "console"
    assert (cfg.syslog_enabled, cfg.syslog_ident, cfg.syslog_facility) == (False, "disque",
                                                                           "local0")
    assert cfg.databases == 16
    assert cfg.requirepass == "" and cfg.maxclients == 10000
    assert cfg.maxmemory == GB and cfg.maxmemory_policy == "acks"
    assert cfg.maxmemory_samples == 5 and cfg.activerehashing is True and cfg.hz == 10
    assert cfg.appendonly is False and cfg.appendfilename == "disque.aof"
    assert cfg.appendfsync == "everysec" and cfg.no_appendfsync_on_rewrite is False
    assert cfg.auto_aof_rewrite_percentage == 100 and cfg.auto_aof_rewrite_min_size == 64 * MB
    assert cfg.aof_rewrite_incremental_fsync is True and cfg.aof_load_truncated is True
    assert cfg.aof_enqueue_jobs_once is False
    assert cfg.cluster_config_file == "nodes.conf" and cfg.cluster_node_timeout == 15000
    assert cfg.cluster_announce_ip == "" and cfg.cluster_announce_port == 0
    assert cfg.cluster_password == "" and cfg.cluster_port_offset == 10000
    assert cfg.slowlog_log_slower_than == 10000 and cfg.slowlog_max_len == 128
    assert cfg.latency_monitor_threshold == 0 and cfg.watchdog_period == 0
    assert cfg.client_output_buffer_limit == (0, 0, 0)
    assert cfg.proto_max_bulk_len == 512 * MB and cfg.client_query_buffer_limit == GB
    assert cfg.queue_idle_timeout == 300
    assert cfg.renamed_commands == {}


def test_directive_table_covers_every_config_field() -> None:
    fields = {f.name for f in dataclasses.fields(Config)}
    assert fields - {"config_file", "renamed_commands", "hooks"} == {d.attr for d in DIRECTIVES}
    assert len({d.name for d in DIRECTIVES}) == len(DIRECTIVES)


def test_shipped_conf_loads_to_defaults(tmp_path: Path) -> None:
    cfg = load_config([str(SHIPPED_CONF)], cwd=str(tmp_path))
    assert cfg.config_file == str(SHIPPED_CONF)
    assert cfg.dir == str(tmp_path)
    assert directive_values(cfg) == directive_values(Config())
    assert cfg.renamed_commands == {}


def test_shipped_conf_documents_every_file_directive() -> None:
    text = SHIPPED_CONF.read_text()
    for d in DIRECTIVES:
        if d.in_file:
            assert re.search(rf"^#? ?{re.escape(d.name)} ", text, re.M), d.name
    assert "watchdog-period" in text


def test_shipped_conf_commented_examples_are_valid(tmp_path: Path) -> None:
    names = {d.name for d in DIRECTIVES if d.in_file} | {"rename-command"}
    examples = [line[2:] for line in SHIPPED_CONF.read_text().splitlines()
                if line.startswith("# ") and line[2:].split(" ")[0] in names]
    assert len(examples) > 30
    for line in examples:
        if line.startswith("dir "):
            continue  # relative to the cwd, checked elsewhere
        load_text(tmp_path, line + "\n")


# -- loading: files, flags, order ----------------------------------------------------------------

def test_flags_override_the_file(tmp_path: Path) -> None:
    cfg = load_text(tmp_path, "port 1000\nloglevel debug\n", "--port", "2000")
    assert cfg.port == 2000
    assert cfg.loglevel == "debug"


def test_later_lines_override_earlier_ones(tmp_path: Path) -> None:
    cfg = load_text(tmp_path, "port 1000\nport 1001\n", "--port", "3000", "--port", "3001")
    assert cfg.port == 3001
    assert load_text(tmp_path, "port 1000\nport 1001\n").port == 1001


def test_flags_without_a_config_file(tmp_path: Path) -> None:
    cfg = load_config(["--port", "1234", "--bind", "127.0.0.1", "::1"], cwd=str(tmp_path))
    assert cfg.config_file is None
    assert cfg.port == 1234
    assert cfg.bind == ["127.0.0.1", "::1"]


def test_flag_values_with_spaces_stay_one_argument(tmp_path: Path) -> None:
    cfg = load_config(["--requirepass", "a b 'c\""], cwd=str(tmp_path))
    assert cfg.requirepass == "a b 'c\""


def test_flag_with_empty_value(tmp_path: Path) -> None:
    cfg = load_text(tmp_path, "requirepass secret\n", "--requirepass", "")
    assert cfg.requirepass == ""


def test_directive_names_are_case_insensitive(tmp_path: Path) -> None:
    cfg = load_text(tmp_path, "PORT 1234\nMaxMemory 2mb\n", "--LogLevel", "WARNING")
    assert (cfg.port, cfg.maxmemory, cfg.loglevel) == (1234, 2 * MB, "warning")


def test_comments_blank_lines_and_indentation(tmp_path: Path) -> None:
    cfg = load_text(tmp_path, "# a comment\n\n   \n\t# indented comment\n  port 1234  \r\n")
    assert cfg.port == 1234


def test_relative_config_path_is_made_absolute(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "d.conf").write_text("port 1234\n")
    cfg = load_config(["sub/d.conf"], cwd=str(tmp_path))
    assert cfg.config_file == str(tmp_path / "sub" / "d.conf")
    assert cfg.port == 1234


def test_dash_reads_the_config_from_stdin(tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "stdin", io.StringIO("port 1234\nmaxmemory 5mb\n"))
    cfg = load_config(["-", "--port", "4321"], cwd=str(tmp_path))
    assert cfg.config_file is None
    assert (cfg.port, cfg.maxmemory) == (4321, 5 * MB)


def test_stdin_errors_name_standard_input(tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "stdin", io.StringIO("\nport x\n"))
    with pytest.raises(ConfigError) as info:
        load_config(["-"], cwd=str(tmp_path))
    assert "Reading the configuration from standard input, at line 2" in str(info.value)


def test_relative_dir_is_resolved_against_cwd(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    assert load_text(tmp_path, "dir data\n").dir == str(tmp_path / "data")
    assert load_text(tmp_path, "dir ./\n").dir == str(tmp_path)
    assert load_text(tmp_path, "", "--dir", str(tmp_path / "data")).dir == str(tmp_path / "data")


def test_missing_dir_is_accepted_for_the_server_to_create(tmp_path: Path) -> None:
    assert load_text(tmp_path, "dir nope\n").dir == str(tmp_path / "nope")
    assert not (tmp_path / "nope").exists()  # loading has no side effects


def test_dir_that_is_a_file_is_fatal(tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("")
    assert load_error(tmp_path, "dir afile\n").reason == "Can't chdir to 'afile': Not a directory"


def test_include_loads_in_place_relative_to_cwd(tmp_path: Path) -> None:
    (tmp_path / "inc").mkdir()
    (tmp_path / "inc" / "common.conf").write_text("port 1111\nmaxmemory 3mb\n")
    cfg = load_text(tmp_path, "maxmemory 2mb\ninclude inc/common.conf\nport 2222\n")
    assert cfg.port == 2222          # after the include: wins
    assert cfg.maxmemory == 3 * MB   # before the include: overridden by it
    assert cfg.config_file == str(tmp_path / "disque.conf")


def test_error_inside_an_include_names_the_included_file(tmp_path: Path) -> None:
    inc = tmp_path / "inc.conf"
    inc.write_text("# c\nhz banana\n")
    err = load_error(tmp_path, "include inc.conf\n")
    assert (err.source, err.lineno, err.line) == (str(inc), 2, "hz banana")


def test_missing_include_is_reported_at_the_include_line(tmp_path: Path) -> None:
    err = load_error(tmp_path, "port 1\ninclude missing.conf\n")
    assert err.lineno == 2 and err.line == "include missing.conf"
    assert err.reason == (f"Can't open the included file '{tmp_path / 'missing.conf'}': "
                          "No such file or directory")


def test_circular_include_is_refused(tmp_path: Path) -> None:
    (tmp_path / "a.conf").write_text("include b.conf\n")
    (tmp_path / "b.conf").write_text("include a.conf\n")
    err = load_error(tmp_path, "include a.conf\n")
    assert err.reason == "Include nesting too deep (circular include?)"


def test_rename_command_is_stored_lowercase(tmp_path: Path) -> None:
    cfg = load_text(tmp_path, 'rename-command DEBUG ""\nrename-command config MyConfig\n')
    assert cfg.renamed_commands == {"debug": "", "config": "myconfig"}


# -- split_args and quoting ----------------------------------------------------------------------

@pytest.mark.parametrize(("line", "args"), [
    ("", []),
    ("   ", []),
    ("port 7711", ["port", "7711"]),
    ("  a\tb   c  ", ["a", "b", "c"]),
    ('requirepass "a b"', ["requirepass", "a b"]),
    ("requirepass 'a b'", ["requirepass", "a b"]),
    ('x ""', ["x", ""]),
    ("x ''", ["x", ""]),
    (r'x "\n\r\t\b\a"', ["x", "\n\r\t\b\a"]),
    (r'x "\x41\x7a\x00"', ["x", "Az\x00"]),
    (r'x "\xZZ"', ["x", "xZZ"]),
    (r'x "a\"b\\c"', ["x", 'a"b\\c']),
    (r"x 'it\'s'", ["x", "it's"]),
    (r"x 'a\nb'", ["x", "a\\nb"]),
    ('x "it\'s"', ["x", "it's"]),
    ('x foo"bar baz"', ["x", "foobar baz"]),
    ("x a#b #c", ["x", "a#b", "#c"]),
])
def test_split_args(line: str, args: list[str]) -> None:
    assert split_args(line) == args


@pytest.mark.parametrize("line", [
    'x "abc', "x 'abc", 'x "abc"def', "x 'abc'def", 'x "abc\\"', 'x "a\\',
])
def test_split_args_unbalanced_quotes(line: str) -> None:
    assert split_args(line) is None


@given(st.lists(st.text(alphabet=st.characters(blacklist_categories=("Cs",))), min_size=1))
@example(["", " ", "\"'\\", "#x", "\x00\x85\xff", "\u2028", "\v\f"])
def test_quote_round_trips_through_split_args(tokens: list[str]) -> None:
    assert split_args(" ".join(quote(t) for t in tokens)) == tokens


# -- memory sizes --------------------------------------------------------------------------------

@pytest.mark.parametrize(("text", "n"), [
    ("0", 0), ("12345", 12345), ("10b", 10), ("1k", 1000), ("1K", 1000), ("1kb", 1024),
    ("2KB", 2048), ("3m", 3_000_000), ("3mb", 3 * MB), ("1g", 10**9), ("1gb", GB),
    ("4Gb", 4 * GB),
])
def test_parse_memory(text: str, n: int) -> None:
    assert parse_memory(text) == n


@pytest.mark.parametrize("text", ["", "gb", "1.5gb", "-1", "1 gb", "1tb", "1kib", "0x10", "+1"])
def test_parse_memory_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        parse_memory(text)


# -- error messages ------------------------------------------------------------------------------

def test_error_message_names_file_line_text_and_reason(tmp_path: Path) -> None:
    err = load_error(tmp_path, "# comment\nport 7711\n  maxmemory banana  \n")
    conf = tmp_path / "disque.conf"
    assert str(err) == (
        "*** FATAL CONFIG FILE ERROR ***\n"
        f"Reading the configuration file '{conf}', at line 3\n"
        ">>> 'maxmemory banana'\n"
        "Invalid value for maxmemory: 'banana' is not a memory size (bytes, or a number "
        "followed by k, kb, m, mb, g or gb)")
    assert (err.source, err.lineno, err.line) == (str(conf), 3, "maxmemory banana")


def test_error_on_the_command_line(tmp_path: Path) -> None:
    err = load_error(tmp_path, "port 1\n", "--port", "2", "--loglevel", "loud")
    assert str(err) == (
        "*** FATAL CONFIG FILE ERROR ***\n"
        "Reading the command line, at line 2\n"
        ">>> 'loglevel loud'\n"
        "Invalid value for loglevel: must be one of debug, verbose, notice, warning")


def test_missing_config_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(["nope.conf"], cwd=str(tmp_path))
    assert str(info.value) == (
        "*** FATAL CONFIG FILE ERROR ***\n"
        f"Reading the configuration file '{tmp_path / 'nope.conf'}'\n"
        "Can't open the configuration file: No such file or directory")


@pytest.mark.parametrize("line", [
    "nosuchdirective 1",
    "port",
    "port 1 2",
    "maxmemory",
    "include",
    "include a b",
    "rename-command a",
    "client-output-buffer-limit normal 0 0",
    "watchdog-period 10",   # CONFIG SET only
    "bind",
])
def test_bad_directive_or_wrong_number_of_arguments(tmp_path: Path, line: str) -> None:
    err = load_error(tmp_path, f"\n{line}\n")
    assert (err.lineno, err.line) == (2, line)
    assert err.reason == "Bad directive or wrong number of arguments"


def test_unknown_flag(tmp_path: Path) -> None:
    err = load_error(tmp_path, "", "--port", "1", "--bogus", "x")
    assert (err.source, err.lineno, err.line) == ("command line", 2, "bogus x")
    assert err.reason == "Bad directive or wrong number of arguments"


def test_stray_argument_after_the_config_file(tmp_path: Path) -> None:
    err = load_error(tmp_path, "", "stray")
    assert (err.source, err.line) == ("command line", "stray")
    assert err.reason == "Bad directive or wrong number of arguments"


def test_unbalanced_quotes_reason(tmp_path: Path) -> None:
    err = load_error(tmp_path, 'requirepass "abc\n')
    assert (err.lineno, err.line) == (1, 'requirepass "abc')
    assert err.reason == "Unbalanced quotes in configuration line"


@pytest.mark.parametrize(("line", "reason"), [
    ("daemonize maybe", "Invalid value for daemonize: argument must be 'yes' or 'no'"),
    ("appendonly 1", "Invalid value for appendonly: argument must be 'yes' or 'no'"),
    ("port abc", "Invalid value for port: 'abc' is not an integer"),
    ("port 1.5", "Invalid value for port: '1.5' is not an integer"),
    ("port -1", "Invalid value for port: must be between 0 and 65535"),
    ("port 65536", "Invalid value for port: must be between 0 and 65535"),
    ("tcp-backlog -1", "Invalid value for tcp-backlog: must be >= 0"),
    ("timeout -1", "Invalid value for timeout: must be >= 0"),
    ("tcp-keepalive yes", "Invalid value for tcp-keepalive: 'yes' is not an integer"),
    ("databases 0", "Invalid value for databases: must be >= 1"),
    ("maxclients 0", "Invalid value for maxclients: must be >= 1"),
    ("maxmemory 0", "Invalid value for maxmemory: must be at least 1 (1 bytes)"),
    ("maxmemory-samples 0", "Invalid value for maxmemory-samples: must be >= 1"),
    ("maxmemory-policy allkeys-lru",
     "Invalid value for maxmemory-policy: must be one of acks, noeviction"),
    ("appendfsync sometimes",
     "Invalid value for appendfsync: must be one of everysec, always, no"),
    ("log-format xml", "Invalid value for log-format: must be one of console, json"),
    ("syslog-facility local8", "Invalid value for syslog-facility: must be one of user, "
     "local0, local1, local2, local3, local4, local5, local6, local7"),
    ("hz fast", "Invalid value for hz: 'fast' is not an integer"),
    ("cluster-node-timeout 0", "Invalid value for cluster-node-timeout: must be >= 1"),
    ("auto-aof-rewrite-min-size -1", "Invalid value for auto-aof-rewrite-min-size: '-1' is not "
     "a memory size (bytes, or a number followed by k, kb, m, mb, g or gb)"),
    ("proto-max-bulk-len 1000kb",
     "Invalid value for proto-max-bulk-len: must be at least 1mb (1048576 bytes)"),
    ("client-query-buffer-limit 1m",
     "Invalid value for client-query-buffer-limit: must be at least 1mb (1048576 bytes)"),
    ("queue-idle-timeout 0", "Invalid value for queue-idle-timeout: must be >= 1"),
    ("http-idle-timeout 0", "Invalid value for http-idle-timeout: must be between 1 and 86400"),
    ("http-body-timeout 86401",
     "Invalid value for http-body-timeout: must be between 1 and 86400"),
    ("http-body-timeout 1.5", "Invalid value for http-body-timeout: '1.5' is not an integer"),
    ("unixsocketperm 778", "Invalid value for unixsocketperm: must be an octal number <= 777"),
    ("unixsocketperm 1000", "Invalid value for unixsocketperm: must be an octal number <= 777"),
    ("cluster-announce-ip not-an-ip",
     "Invalid value for cluster-announce-ip: 'not-an-ip' is not an IP address"),
    ("cluster-announce-port 70000",
     "Invalid value for cluster-announce-port: must be between 0 and 65535"),
    ("cluster-port-offset 0", "Invalid value for cluster-port-offset: must be between 1 and "
     "65535"),
    ("slowlog-max-len -1", "Invalid value for slowlog-max-len: must be >= 0"),
    ("latency-monitor-threshold -1", "Invalid value for latency-monitor-threshold: must be >= 0"),
    ("client-output-buffer-limit pubsub 0 0 0",
     "Invalid value for client-output-buffer-limit: the client class must be 'normal'"),
    ("client-output-buffer-limit normal 1x 0 0", "Invalid value for client-output-buffer-limit: "
     "'1x' is not a memory size (bytes, or a number followed by k, kb, m, mb, g or gb)"),
    ("client-output-buffer-limit normal 0 0 -1",
     "Invalid value for client-output-buffer-limit: soft seconds must be >= 0"),
    ("requirepass " + "x" * 513, "Invalid value for requirepass: longer than 512 characters"),
    ("bind " + " ".join(f"10.0.0.{i}" for i in range(17)), "Too many bind addresses specified."),
])
def test_bad_values(tmp_path: Path, line: str, reason: str) -> None:
    err = load_error(tmp_path, line + "\n")
    assert (err.lineno, err.line, err.reason) == (1, line, reason)


@pytest.mark.parametrize("name", ["foo/disque.aof", "/abs/disque.aof", "..\\x.aof", "./a"])
def test_appendfilename_must_not_be_a_path(tmp_path: Path, name: str) -> None:
    err = load_error(tmp_path, f"appendfilename {name}\n")
    assert err.reason == "appendfilename can't be a path, just a filename"


def test_port_leaves_room_for_the_cluster_bus(tmp_path: Path) -> None:
    assert load_text(tmp_path, "port 55535\n").port == 55535
    assert load_text(tmp_path, "port 0\n").port == 0
    err = load_error(tmp_path, "port 55536\n")
    assert (err.lineno, err.line) == (1, "port 55536")
    assert err.reason == ("Invalid port: the cluster bus port (port + cluster-port-offset = "
                          "65536) must be <= 65535")
    assert load_text(tmp_path, "port 60000\ncluster-port-offset 100\n").port == 60000
    err = load_error(tmp_path, "port 60000\n", "--cluster-port-offset", "6000")
    assert (err.source, err.line) == ("command line", "cluster-port-offset 6000")


@pytest.mark.parametrize(("value", "hz"), [("0", 1), ("-5", 1), ("1", 1), ("100", 100),
                                           ("500", 500), ("1000", 500)])
def test_hz_is_clamped_in_the_file(tmp_path: Path, value: str, hz: int) -> None:
    assert load_text(tmp_path, f"hz {value}\n").hz == hz


def test_value_forms_in_the_file(tmp_path: Path) -> None:
    cfg = load_text(tmp_path, "\n".join([
        "daemonize YES", "activerehashing No", "loglevel DEBUG", "unixsocketperm 700",
        "bind 10.0.0.1 ::1", "client-output-buffer-limit NORMAL 1mb 512kb 60",
        "tcp-keepalive 60", "slowlog-log-slower-than -1", "cluster-announce-ip ::1",
        "requirepass 'p w'", "maxmemory 100",
    ]) + "\n")
    assert cfg.daemonize is True and cfg.activerehashing is False
    assert cfg.loglevel == "debug"
    assert cfg.unixsocketperm == 0o700
    assert cfg.bind == ["10.0.0.1", "::1"]
    assert cfg.client_output_buffer_limit == (MB, 512 * 1024, 60)
    assert cfg.tcp_keepalive == 60
    assert cfg.slowlog_log_slower_than == -1
    assert cfg.cluster_announce_ip == "::1"
    assert cfg.requirepass == "p w"
    assert cfg.maxmemory == 100


# -- CONFIG GET ----------------------------------------------------------------------------------

# checklist §8, "CONFIG GET order of output" [verified `CONFIG GET *`]
ORIGINAL_GET_ORDER = [
    "requirepass", "unixsocket", "logfile", "pidfile", "maxmemory", "maxmemory-samples",
    "timeout", "auto-aof-rewrite-percentage", "auto-aof-rewrite-min-size",
    "slowlog-log-slower-than", "latency-monitor-threshold", "slowlog-max-len", "port",
    "tcp-backlog", "databases", "maxclients", "watchdog-period", "hz", "cluster-node-timeout",
    "tcp-keepalive", "no-appendfsync-on-rewrite", "daemonize", "activerehashing",
    "aof-rewrite-incremental-fsync", "aof-load-truncated", "aof-enqueue-jobs-once",
    "maxmemory-policy", "loglevel", "appendfsync", "syslog-facility", "appendonly", "dir",
    "client-output-buffer-limit", "unixsocketperm", "bind",
]
GET_ORDER = [
    *ORIGINAL_GET_ORDER,
    # disque-py additions
    "log-format", "proto-max-bulk-len", "client-query-buffer-limit", "queue-idle-timeout",
    "rereplicate-rate", "repair-rate", "repair-grace", "overflow", "overflow-dir", "overflow-threshold", "overflow-max-size", "cluster-forget-ttl", "default-max-deliveries", "default-max-nacks", "deadletter-queue", "redrive-rate",
    "cluster-announce-ip", "cluster-announce-port", "cluster-config-file", "appendfilename",
    "cluster-port-offset", "cluster-password", "tls-port", "tls-cert-file", "tls-key-file",
    "tls-key-file-pass", "tls-ca-cert-file", "tls-ca-cert-dir", "tls-auth-clients",
    "tls-protocols", "tls-ciphers", "tls-prefer-server-ciphers", "tls-session-caching",
    "tls-handshake-timeout", "tls-cluster", "tls-http", "http-port", "http-password",
    "metrics-max-queues", "http-idle-timeout", "http-body-timeout",
]


def test_config_get_star_lists_parameters_in_the_original_order() -> None:
    assert [name for name, _ in config_get(Config(), "*")] == GET_ORDER


def test_config_get_default_values() -> None:
    got = dict(config_get(Config(), "*"))
    assert got["maxmemory"] == "1073741824"
    assert got["auto-aof-rewrite-min-size"] == "67108864"
    assert got["proto-max-bulk-len"] == "536870912"
    assert got["dir"] == os.getcwd()
    assert got["bind"] == "127.0.0.1"
    assert got["unixsocketperm"] == "0"
    assert got["tcp-keepalive"] == "no"
    assert got["activerehashing"] == "yes" and got["appendonly"] == "no"
    assert got["client-output-buffer-limit"] == "normal 0 0 0"
    assert got["requirepass"] == "" and got["cluster-password"] == ""
    assert "syslog-enabled" not in got and "syslog-ident" not in got


def test_config_get_formats(tmp_path: Path) -> None:
    cfg = load_text(tmp_path, "\n".join([
        "bind 10.0.0.1 ::1", "unixsocketperm 755", "tcp-keepalive 60", "maxmemory 2gb",
        "requirepass sekrit", "cluster-password shared", "daemonize yes",
        "client-output-buffer-limit normal 1mb 1kb 5",
    ]) + "\n")
    got = dict(config_get(cfg, "*"))
    assert got["bind"] == "10.0.0.1 ::1"
    assert got["unixsocketperm"] == "755"
    assert got["tcp-keepalive"] == "yes"
    assert got["maxmemory"] == str(2 * GB)
    assert got["requirepass"] == "sekrit"
    assert got["cluster-password"] == "******"
    assert got["daemonize"] == "yes"
    assert got["client-output-buffer-limit"] == "normal 1048576 1024 5"


@pytest.mark.parametrize(("pattern", "names"), [
    ("port", ["port"]),
    ("maxmemory*", ["maxmemory", "maxmemory-samples", "maxmemory-policy"]),
    ("*port", ["port", "cluster-announce-port", "tls-port", "http-port"]),
    ("slowlog-*", ["slowlog-log-slower-than", "slowlog-max-len"]),
    ("h?", ["hz"]),
    ("[dp]i*", ["pidfile", "dir"]),
    ("PORT", []),
    ("Maxmemory", []),
    ("nothing", []),
    ("syslog-ident", []),
])
def test_config_get_glob_is_case_sensitive(pattern: str, names: list[str]) -> None:
    assert [n for n, _ in config_get(Config(), pattern)] == names


# -- CONFIG SET ----------------------------------------------------------------------------------

@pytest.mark.parametrize("name", [
    "port", "bind", "daemonize", "databases", "unixsocket", "unixsocketperm", "logfile",
    "pidfile", "syslog-facility", "appendfilename", "no-appendfsync-on-rewrite",
    "cluster-config-file", "cluster-password", "cluster-port-offset", "tcp-backlog",
    "include", "rename-command", "nosuchthing", "Port", "http-idle-timeout",
    "http-body-timeout",
])
def test_config_set_unsupported(name: str) -> None:
    cfg = Config()
    with pytest.raises(ConfigSetError) as info:
        config_set(cfg, name, "1")
    assert info.value.message == f"ERR Unsupported CONFIG parameter: {name}"
    assert str(info.value) == info.value.message
    assert cfg == Config(dir=cfg.dir)


@pytest.mark.parametrize(("name", "value"), [
    ("maxmemory", "banana"), ("maxmemory", "-1"), ("timeout", "-1"), ("timeout", "1.5"),
    ("maxclients", "0"), ("maxmemory-samples", "0"), ("hz", "-1"), ("loglevel", "loud"),
    ("appendonly", "maybe"), ("appendfsync", "sometimes"), ("maxmemory-policy", "lru"),
    ("tcp-keepalive", "maybe"), ("tcp-keepalive", "-1"), ("slowlog-log-slower-than", "-1"),
    ("slowlog-max-len", "-1"), ("cluster-node-timeout", "-1"), ("requirepass", "x" * 513),
    ("client-output-buffer-limit", "normal 0 0"), ("client-output-buffer-limit", "slave 0 0 0"),
    ("client-output-buffer-limit", ""), ("proto-max-bulk-len", "1000"),
    ("client-query-buffer-limit", "1kb"), ("queue-idle-timeout", "0"), ("log-format", "xml"),
    ("cluster-announce-ip", "300.1.1.1"), ("cluster-announce-port", "65536"),
    ("auto-aof-rewrite-percentage", "x"), ("latency-monitor-threshold", "-5"),
    ("watchdog-period", "-1"), ("MaxMemory", "x"),
])
def test_config_set_invalid_argument(name: str, value: str) -> None:
    cfg = Config()
    with pytest.raises(ConfigSetError) as info:
        config_set(cfg, name, value)
    assert info.value.message == f"ERR Invalid argument '{value}' for CONFIG SET '{name}'"
    assert cfg == Config(dir=cfg.dir)


@pytest.mark.parametrize(("name", "value", "attr", "expected"), [
    ("requirepass", "pw", "requirepass", "pw"),
    ("requirepass", "", "requirepass", ""),
    ("maxmemory", "0", "maxmemory", 0),
    ("maxmemory", "2gb", "maxmemory", 2 * GB),
    ("maxmemory-samples", "3", "maxmemory_samples", 3),
    ("timeout", "30", "timeout", 30),
    ("auto-aof-rewrite-percentage", "0", "auto_aof_rewrite_percentage", 0),
    ("auto-aof-rewrite-min-size", "1mb", "auto_aof_rewrite_min_size", MB),
    ("slowlog-log-slower-than", "0", "slowlog_log_slower_than", 0),
    ("latency-monitor-threshold", "100", "latency_monitor_threshold", 100),
    ("slowlog-max-len", "0", "slowlog_max_len", 0),
    ("maxclients", "1", "maxclients", 1),
    ("watchdog-period", "200", "watchdog_period", 200),
    ("hz", "0", "hz", 1),
    ("hz", "50", "hz", 50),
    ("hz", "1000", "hz", 500),
    ("cluster-node-timeout", "3000", "cluster_node_timeout", 3000),
    ("cluster-node-timeout", "0", "cluster_node_timeout", 0),
    ("tcp-keepalive", "yes", "tcp_keepalive", 300),
    ("tcp-keepalive", "YES", "tcp_keepalive", 300),
    ("tcp-keepalive", "no", "tcp_keepalive", 0),
    ("tcp-keepalive", "60", "tcp_keepalive", 60),
    ("activerehashing", "no", "activerehashing", False),
    ("aof-rewrite-incremental-fsync", "no", "aof_rewrite_incremental_fsync", False),
    ("aof-load-truncated", "no", "aof_load_truncated", False),
    ("aof-enqueue-jobs-once", "yes", "aof_enqueue_jobs_once", True),
    ("maxmemory-policy", "noeviction", "maxmemory_policy", "noeviction"),
    ("loglevel", "Warning", "loglevel", "warning"),
    ("appendfsync", "always", "appendfsync", "always"),
    ("appendonly", "yes", "appendonly", True),
    ("client-output-buffer-limit", "normal 1mb 2kb 60", "client_output_buffer_limit",
     (MB, 2048, 60)),
    ("client-output-buffer-limit", "normal 1 2 3 normal 4 5 6", "client_output_buffer_limit",
     (4, 5, 6)),
    ("log-format", "json", "log_format", "json"),
    ("proto-max-bulk-len", "1mb", "proto_max_bulk_len", MB),
    ("client-query-buffer-limit", "2gb", "client_query_buffer_limit", 2 * GB),
    ("queue-idle-timeout", "1", "queue_idle_timeout", 1),
    ("cluster-announce-ip", "10.1.2.3", "cluster_announce_ip", "10.1.2.3"),
    ("cluster-announce-ip", "", "cluster_announce_ip", ""),
    ("cluster-announce-port", "7000", "cluster_announce_port", 7000),
])
def test_config_set_values(name: str, value: str, attr: str, expected: object) -> None:
    cfg = Config()
    config_set(cfg, name, value)
    assert getattr(cfg, attr) == expected


def test_config_set_name_is_case_insensitive() -> None:
    cfg = Config()
    config_set(cfg, "MAXMEMORY", "5mb")
    assert cfg.maxmemory == 5 * MB
    assert dict(config_get(cfg, "maxmemory")) == {"maxmemory": str(5 * MB)}


def test_config_set_several_pairs_are_all_set_or_none() -> None:
    """CONFIG SET p1 v1 p2 v2 (Redis 7; a TLS certificate and its key change together)."""
    cfg = Config()
    applied: list[tuple[str, int, int]] = []
    on_set(cfg, "maxmemory", lambda c, n: applied.append((n, c.maxmemory, c.hz)))
    on_set(cfg, "hz", lambda c, n: applied.append((n, c.maxmemory, c.hz)))
    config_set(cfg, "maxmemory", "5mb", ("hz", "20"))
    assert (cfg.maxmemory, cfg.hz) == (5 * MB, 20)
    # every hook ran once, after both values were stored
    assert applied == [("maxmemory", 5 * MB, 20), ("hz", 5 * MB, 20)]
    # a bad value anywhere: nothing is stored, no hook runs
    applied.clear()
    with pytest.raises(ConfigSetError, match="Invalid argument 'x' for CONFIG SET 'hz'"):
        config_set(cfg, "maxmemory", "7mb", ("hz", "x"))
    with pytest.raises(ConfigSetError, match="Duplicate parameter: HZ"):
        config_set(cfg, "hz", "30", ("HZ", "40"))
    assert (cfg.maxmemory, cfg.hz, applied) == (5 * MB, 20, [])

    # a hook that refuses: every value goes back, and the hooks that ran apply the old ones
    def refuse(c: Config, n: str) -> None:
        if c.hz == 99:
            raise ConfigSetError("ERR no")
    on_set(cfg, "hz", refuse)
    with pytest.raises(ConfigSetError, match="ERR no"):
        config_set(cfg, "maxmemory", "9mb", ("hz", "99"))
    assert (cfg.maxmemory, cfg.hz) == (5 * MB, 20)
    assert applied[-2:] == [("maxmemory", 5 * MB, 20), ("hz", 5 * MB, 20)]


def test_config_set_tcp_keepalive_reads_back_as_yes_no() -> None:
    cfg = Config()
    config_set(cfg, "tcp-keepalive", "yes")
    assert config_get(cfg, "tcp-keepalive") == [("tcp-keepalive", "yes")]
    assert render_value(cfg, "tcp-keepalive", for_rewrite=True) == "300"
    config_set(cfg, "tcp-keepalive", "no")
    assert config_get(cfg, "tcp-keepalive") == [("tcp-keepalive", "no")]


def test_hooks_run_after_the_value_is_stored() -> None:
    cfg = Config()
    seen: list[tuple[str, int]] = []
    on_set(cfg, "MaxMemory", lambda c, name: seen.append((name, c.maxmemory)))
    on_set(cfg, "maxmemory", lambda c, name: seen.append(("second", c.maxmemory)))
    config_set(cfg, "maxmemory", "1mb")
    assert seen == [("maxmemory", MB), ("second", MB)]


def test_hooks_are_not_called_for_invalid_values_or_other_names() -> None:
    cfg = Config()
    calls: list[str] = []
    on_set(cfg, "appendonly", lambda c, name: calls.append(name))
    with pytest.raises(ConfigSetError):
        config_set(cfg, "appendonly", "maybe")
    config_set(cfg, "appendfsync", "always")
    assert calls == []


def test_a_failing_hook_restores_the_old_value() -> None:
    cfg = Config()

    def refuse(c: Config, name: str) -> None:
        assert c.appendonly is True
        raise ConfigSetError("ERR Unable to turn on AOF. Check server logs.")

    on_set(cfg, "appendonly", refuse)
    with pytest.raises(ConfigSetError) as info:
        config_set(cfg, "appendonly", "yes")
    assert info.value.message == "ERR Unable to turn on AOF. Check server logs."
    assert cfg.appendonly is False


def test_on_set_refuses_names_config_set_cannot_change() -> None:
    cfg = Config()
    for name in ("port", "nosuch"):
        with pytest.raises(ValueError):
            on_set(cfg, name, lambda c, n: None)


def test_render_value() -> None:
    cfg = Config(maxmemory=2 * GB, requirepass='a "b"', cluster_password="s3")
    assert render_value(cfg, "maxmemory") == str(2 * GB)
    assert render_value(cfg, "maxmemory", for_rewrite=True) == "2gb"
    assert render_value(cfg, "requirepass", for_rewrite=True) == r'"a \"b\""'
    assert render_value(cfg, "cluster-password") == "******"
    assert render_value(cfg, "cluster-password", for_rewrite=True) == "s3"
    assert render_value(cfg, "logfile", for_rewrite=True) == '""'
    with pytest.raises(KeyError):
        render_value(cfg, "nosuch")


# -- CONFIG REWRITE ------------------------------------------------------------------------------

def test_rewrite_without_a_config_file() -> None:
    with pytest.raises(ConfigSetError) as info:
        config_rewrite(Config())
    assert info.value.message == "ERR The server is running without a config file"


def test_rewrite_round_trip_keeps_comments_and_blanks_duplicates(tmp_path: Path) -> None:
    (tmp_path / "extra.conf").write_text("slowlog-max-len 7\n")
    original = "\n".join([
        "# my disque",
        "port 7711",
        "",
        "  # indented comment",
        "cluster-node-timeout 15000",
        "maxmemory 1gb",
        "MAXMEMORY 3gb",
        "include extra.conf",
        'rename-command DEBUG ""',
        "databases 16",
        "loglevel notice",
        "loglevel debug",
    ]) + "\n"
    cfg = load_text(tmp_path, original)
    assert cfg.maxmemory == 3 * GB and cfg.loglevel == "debug" and cfg.slowlog_max_len == 7
    config_set(cfg, "cluster-node-timeout", "3000")
    config_set(cfg, "maxmemory", "2gb")
    config_set(cfg, "requirepass", "p w")
    config_rewrite(cfg)

    lines = (tmp_path / "disque.conf").read_text().split("\n")
    assert lines == [
        "# my disque",
        "port 7711",                   # equal to the default but present: kept
        "",
        "  # indented comment",
        "cluster-node-timeout 3000",
        "maxmemory 2gb",
        "",                            # duplicate blanked
        "include extra.conf",          # not expanded
        'rename-command DEBUG ""',
        "databases 16",
        "loglevel debug",
        "",
        "# Generated by CONFIG REWRITE",
        'requirepass "p w"',
        "slowlog-max-len 7",           # came from the include and differs from the default
        f"dir {tmp_path}",
        "",
    ]
    again = load_config([str(tmp_path / "disque.conf")], cwd=str(tmp_path))
    assert directive_values(again) == directive_values(cfg)
    assert again.renamed_commands == {"debug": ""}


def test_rewrite_does_not_add_defaults(tmp_path: Path) -> None:
    cfg = load_text(tmp_path, "port 7711\n")
    config_set(cfg, "maxmemory", "1gb")   # set, but still the default
    config_rewrite(cfg)
    text = (tmp_path / "disque.conf").read_text()
    assert text == f"port 7711\n# Generated by CONFIG REWRITE\ndir {tmp_path}\n"


def test_rewrite_twice_is_stable(tmp_path: Path) -> None:
    cfg = load_text(tmp_path, "# hello\n")
    config_set(cfg, "hz", "20")
    config_rewrite(cfg)
    first = (tmp_path / "disque.conf").read_text()
    config_rewrite(cfg)
    assert (tmp_path / "disque.conf").read_text() == first
    assert first.count("# Generated by CONFIG REWRITE") == 1
    assert first == f"# hello\n# Generated by CONFIG REWRITE\nhz 20\ndir {tmp_path}\n"


def test_rewrite_writes_flags_and_round_trips_every_settable_kind(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    cfg = load_text(tmp_path, "", "--dir", "data", "--bind", "127.0.0.1", "::1",
                    "--cluster-password", "s e c", "--unixsocketperm", "750")
    for name, value in [("client-output-buffer-limit", "normal 1mb 1000 5"),
                        ("tcp-keepalive", "yes"), ("appendonly", "yes"),
                        ("requirepass", "q\"uo'te\\ \n"), ("log-format", "json"),
                        ("cluster-announce-ip", "::1"), ("proto-max-bulk-len", "1500000"),
                        ("watchdog-period", "100")]:
        config_set(cfg, name, value)
    config_rewrite(cfg)
    text = (tmp_path / "disque.conf").read_text()
    assert f"dir {tmp_path / 'data'}\n" in text
    assert "bind 127.0.0.1 ::1\n" in text
    assert 'cluster-password "s e c"\n' in text
    assert "unixsocketperm 750\n" in text
    assert "client-output-buffer-limit normal 1mb 1000 5\n" in text
    assert "tcp-keepalive 300\n" in text
    assert "watchdog-period" not in text
    again = load_config([str(tmp_path / "disque.conf")], cwd="/")
    assert directive_values(again) == directive_values(cfg) | {"watchdog-period": 0}
    assert again.dir == str(tmp_path / "data")


def test_rewrite_of_a_missing_file_creates_it(tmp_path: Path) -> None:
    cfg = Config(config_file=str(tmp_path / "new.conf"), port=1234)
    config_rewrite(cfg)
    assert (tmp_path / "new.conf").read_text() == (
        f"# Generated by CONFIG REWRITE\nport 1234\ndir {cfg.dir}\n")


def test_rewrite_failure_reports_strerror(tmp_path: Path) -> None:
    cfg = Config(config_file=str(tmp_path / "no" / "such" / "dir.conf"))
    with pytest.raises(ConfigSetError) as info:
        config_rewrite(cfg)
    assert info.value.message == "ERR Rewriting config file: No such file or directory"


def test_rewrite_keeps_permissions_and_symlinks(tmp_path: Path) -> None:
    real = tmp_path / "real.conf"
    real.write_text("port 1\n")
    real.chmod(0o600)
    link = tmp_path / "link.conf"
    link.symlink_to(real)
    cfg = load_config([str(link)], cwd=str(tmp_path))
    config_set(cfg, "hz", "42")
    config_rewrite(cfg)
    assert link.is_symlink()
    assert stat.S_IMODE(real.stat().st_mode) == 0o600
    assert "hz 42\n" in real.read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.conf", "real.conf"]


def test_set_then_rewrite_then_load_gives_the_new_value(tmp_path: Path) -> None:
    cfg = load_config([str(SHIPPED_CONF)], cwd=str(tmp_path))
    conf = tmp_path / "disque.conf"
    conf.write_text(SHIPPED_CONF.read_text())
    cfg.config_file = str(conf)
    config_set(cfg, "maxmemory", "512mb")
    config_set(cfg, "cluster-node-timeout", "3000")
    config_rewrite(cfg)
    text = conf.read_text()
    assert "\nmaxmemory 512mb\n" in text
    assert "# Memory limit." in text                      # comments kept
    assert "# maxmemory-policy acks\n" in text             # commented examples untouched
    again = load_config([str(conf)], cwd=str(tmp_path))
    assert (again.maxmemory, again.cluster_node_timeout) == (512 * MB, 3000)
    assert directive_values(again) == directive_values(cfg)
