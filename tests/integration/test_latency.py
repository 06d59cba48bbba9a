"""LATENCY against a real server: a `DEBUG SLEEP 0.05` with latency-monitor-threshold 10 is a
`command` event of at least 50 ms, seen by LATEST, HISTORY, GRAPH and DOCTOR, forgotten by
RESET; with the threshold at 0 (the default) nothing is recorded.

On a busy machine any other command or timer pass may also take 10 ms (the process was not
given the CPU) and be recorded too: the assertions look for the DEBUG SLEEP's sample among
whatever else is there, and exact replies are checked with the threshold back at 0."""

from __future__ import annotations

import re
import time

from tests.harness import DisqueProcess
from tests.integration.resp import Conn, Err, Status


def sleep_50ms(c: Conn) -> tuple[int, int]:
    """DEBUG SLEEP 0.05; the unix seconds around it (the sample's time is between)."""
    before = int(time.time())
    assert c.cmd("DEBUG", "SLEEP", "0.05") == Status("OK")
    return before, int(time.time())


def slept(history: list[list[int]], before: int, after: int) -> list[int]:
    """The sample of the DEBUG SLEEP in a HISTORY reply."""
    found = [s for s in history if before <= s[0] <= after and s[1] >= 50]
    assert found, history
    return found[0]


def test_nothing_is_recorded_with_the_default_threshold(server: DisqueProcess) -> None:
    with Conn(server.port) as c:
        assert c.cmd("CONFIG", "GET", "latency-monitor-threshold") == [
            b"latency-monitor-threshold", b"0"]
        sleep_50ms(c)
        assert c.call("LATENCY", "LATEST") == b"*0\r\n"
        assert c.call("LATENCY", "HISTORY", "command") == b"*0\r\n"
        assert c.call("LATENCY", "GRAPH", "command") == (
            b"-ERR No samples available for event 'command'\r\n")
        assert c.call("LATENCY", "RESET") == b":0\r\n"
        assert b"disabled" in c.cmd("LATENCY", "DOCTOR")


def test_a_slow_command_is_recorded_and_reported(server: DisqueProcess) -> None:
    with Conn(server.port) as c:
        assert c.cmd("CONFIG", "SET", "latency-monitor-threshold", "10") == Status("OK")
        before, after = sleep_50ms(c)
        when, ms = slept(c.cmd("LATENCY", "HISTORY", "command"), before, after)
        raw = c.call("LATENCY", "HISTORY", "command")
        assert raw.startswith(b"*") and b"*2\r\n:%d\r\n:%d\r\n" % (when, ms) in raw

        rows = {row[0]: row for row in c.cmd("LATENCY", "LATEST")}
        event, latest_time, latest_ms, worst = rows[b"command"]
        assert latest_time >= when and latest_ms >= 10 and worst >= ms
        raw = c.call("LATENCY", "LATEST")
        assert re.match(rb"\*\d+\r\n\*4\r\n\$\d+\r\n", raw), raw
        assert b"$7\r\ncommand\r\n:%d\r\n:%d\r\n:%d\r\n" % (latest_time, latest_ms, worst) in raw

        graph = c.cmd("LATENCY", "GRAPH", "command").decode()
        lines = graph.split("\n")
        assert re.fullmatch(r"command - high (\d+) ms, low (\d+) ms \(all time high (\d+) ms\)",
                            lines[0]), lines[0]
        assert lines[1] == "-" * 80
        assert set("".join(lines[2:6])) <= set(" _o#|")  # four rows of levels
        assert lines[6].strip() == ""  # then the labels, downwards: "0s", "1s"...

        doctor = c.cmd("LATENCY", "DOCTOR").decode()
        assert doctor.startswith("Latency spikes were observed on this node "
                                 "(latency-monitor-threshold is 10 ms)")
        assert re.search(r"\d+\. command: \d+ latency spikes \(average \d+ms", doctor), doctor
        assert "SLOWLOG GET" in doctor

        assert c.call("LATENCY", "RESET", "nope") == b":0\r\n"
        assert c.cmd("CONFIG", "SET", "latency-monitor-threshold", "0") == Status("OK")
        assert c.call("LATENCY", "RESET", "COMMAND") == b":1\r\n"  # case-insensitive
        assert c.call("LATENCY", "HISTORY", "command") == b"*0\r\n"
        assert c.cmd("LATENCY", "GRAPH", "command") == Err(
            "ERR No samples available for event 'command'")
        c.cmd("LATENCY", "RESET")
        assert c.call("LATENCY", "LATEST") == b"*0\r\n"


def test_setting_the_threshold_to_zero_stops_recording_at_once(server: DisqueProcess) -> None:
    with Conn(server.port) as c:
        c.cmd("CONFIG", "SET", "latency-monitor-threshold", "10")
        before, after = sleep_50ms(c)
        slept(c.cmd("LATENCY", "HISTORY", "command"), before, after)
        assert c.cmd("CONFIG", "SET", "latency-monitor-threshold", "0") == Status("OK")
        assert c.cmd("LATENCY", "RESET") >= 1
        sleep_50ms(c)
        assert c.call("LATENCY", "LATEST") == b"*0\r\n"
        assert b"disabled" in c.cmd("LATENCY", "DOCTOR")


def test_the_threshold_from_the_command_line_and_redis_clients(make_server) -> None:  # type: ignore[no-untyped-def]
    node = make_server(args=["--latency-monitor-threshold", "10"])
    r = node.client()  # redis-py, RESP3
    before = int(time.time())
    assert r.execute_command("DEBUG", "SLEEP", "0.05")
    after = int(time.time())
    rows = {row[0]: row for row in r.latency_latest()}
    assert rows[b"command"][3] >= 50
    slept(r.latency_history("command"), before, after)
    assert "command" in node.cli("LATENCY", "LATEST").split()
    assert "command - high" in node.cli("LATENCY", "GRAPH", "command", raw=True)
    assert re.search(r"\d+\. command:", node.cli("LATENCY", "DOCTOR", raw=True))
    assert r.config_set("latency-monitor-threshold", 0)
    assert r.latency_reset("command") == 1
    assert r.latency_history("command") == []


def test_help_and_unknown_subcommands(server: DisqueProcess) -> None:
    with Conn(server.port) as c:
        help_lines = c.cmd("LATENCY", "HELP")
        assert help_lines[0] == Status("LATENCY <subcommand> [<arg> ...]. Subcommands are:")
        assert all(isinstance(line, Status) for line in help_lines)
        assert {"LATEST", "HISTORY <event>", "RESET [<event> ...]", "GRAPH <event>", "DOCTOR",
                "HELP"} <= set(help_lines)
        for args in (["FOO"], ["LATEST", "x"], ["HISTORY"], ["GRAPH"], ["DOCTOR", "x"]):
            assert c.call("LATENCY", *args) == b"-ERR syntax error\r\n", args
        assert c.cmd("PING") == Status("PONG")
