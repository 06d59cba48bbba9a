"""Memory: INFO memory fields, maxmemory refusal (-OOM for denyoom commands), memory given back
after ACK, eviction of idle empty queues under pressure (checklist §0, §6, §11; issue 3).
Every test changes maxmemory, so each gets its own server."""

from __future__ import annotations

import re

from tests.harness import wait_for
from tests.integration.resp import Conn, add, info, qstat

OOM = b"-OOM command not allowed when used memory > 'maxmemory'.\r\n"
MEMORY_FIELDS = ["used_memory", "used_memory_human", "used_memory_rss", "used_memory_peak",
                 "used_memory_peak_human", "mem_fragmentation_ratio", "mem_allocator"]
HUMAN = re.compile(r"^\d+(\.\d{2})?[BKMGTP]$")


def memory_keys(raw: bytes) -> list[str]:
    lines = raw.decode().split("\r\n")
    assert lines[0] == "# Memory", lines[:2]
    return [line.split(":", 1)[0] for line in lines[1:] if line]


def test_info_memory_fields_in_order(server) -> None:  # type: ignore[no-untyped-def]
    with Conn(server.port) as c:
        raw = c.cmd("INFO", "memory")
        assert memory_keys(raw) == MEMORY_FIELDS
        m = info(c, "memory")
        assert int(m["used_memory"]) > 0
        assert int(m["used_memory_rss"]) > 0
        assert int(m["used_memory_peak"]) >= int(m["used_memory"])
        assert HUMAN.match(m["used_memory_human"]), m["used_memory_human"]
        assert HUMAN.match(m["used_memory_peak_human"]), m["used_memory_peak_human"]
        assert re.match(r"^\d+\.\d{2}$", m["mem_fragmentation_ratio"]), m
        assert m["mem_allocator"]


def test_used_memory_grows_with_jobs_and_is_given_back_after_ack(server) -> None:  # type: ignore[no-untyped-def]
    """Regression (original issue): memory was never reclaimed after ACK."""
    with Conn(server.port) as c:
        base = int(info(c, "memory")["used_memory"])
        ids = c.pipeline([("ADDJOB", "memq", "x" * 1000, "0") for _ in range(2000)])
        loaded = int(info(c, "memory")["used_memory"])
        assert loaded >= base + 2000 * 1000, (base, loaded)
        assert int(info(c, "memory")["used_memory_peak"]) >= loaded
        assert len(c.cmd("GETJOB", "COUNT", "2000", "FROM", "memq")) == 2000
        assert c.cmd("ACKJOB", *ids) == 2000
        after = int(info(c, "memory")["used_memory"])
        assert after <= loaded - 2000 * 1000 * 3 // 4, (base, loaded, after)
        assert int(info(c, "jobs")["registered_jobs"]) == 0


def test_repeated_add_ack_cycles_do_not_accumulate_memory(server) -> None:  # type: ignore[no-untyped-def]
    bodies = [b"", bytes([209, 100, 0, 105, 182, 14, 6, 2, 62]), bytes([39, 157, 129, 26]), b"?~"]
    with Conn(server.port) as c:
        def cycle() -> None:
            ids = c.pipeline([("ADDJOB", "cycleq", bodies[i % 4], "300") for i in range(200)])
            got = c.cmd("GETJOB", "COUNT", "200", "FROM", "cycleq")
            assert len(got) == 200
            assert c.cmd("ACKJOB", *ids) == 200
            assert c.cmd("QLEN", "cycleq") == 0

        for _ in range(5):
            cycle()
        settled = int(info(c, "memory")["used_memory"])
        for _ in range(50):
            cycle()
        assert int(info(c, "jobs")["registered_jobs"]) == 0
        # 10,000 jobs went through; what is left must not scale with that
        assert int(info(c, "memory")["used_memory"]) <= settled + 200_000


def test_maxmemory_refuses_denyoom_commands(server) -> None:  # type: ignore[no-untyped-def]
    with Conn(server.port) as c:
        job_id = add(c, "oomq")
        c.cmd("GETJOB", "FROM", "oomq")
        assert c.call("CONFIG", "SET", "maxmemory", "1") == b"+OK\r\n"
        assert c.call("ADDJOB", "oomq", "b", "0") == OOM
        assert c.call("ENQUEUE", job_id) == OOM
        assert c.call("NACK", job_id) == OOM
        # commands that do not add memory keep working
        assert c.call("PING") == b"+PONG\r\n"
        assert c.cmd("QLEN", "oomq") == 0
        assert c.cmd("SHOW", job_id) is not None
        assert c.call("WORKING", job_id) == b":300\r\n"
        assert c.call("ACKJOB", job_id) == b":1\r\n"
        assert c.call("CONFIG", "SET", "maxmemory", "1gb") == b"+OK\r\n"
        add(c, "oomq")


def test_oom_comes_after_arity_and_before_argument_errors(server) -> None:  # type: ignore[no-untyped-def]
    with Conn(server.port) as c:
        add(c, "oomq")
        c.cmd("CONFIG", "SET", "maxmemory", "1")
        assert c.call("ADDJOB", "oomq", "b") == (
            b"-ERR wrong number of arguments for 'addjob' command\r\n")
        assert c.call("ADDJOB", "oomq", "b", "0", "TTL", "0") == OOM


def test_maxmemory_config_get_reports_bytes(server) -> None:  # type: ignore[no-untyped-def]
    with Conn(server.port) as c:
        assert c.cmd("CONFIG", "GET", "maxmemory") == [b"maxmemory", b"1073741824"]
        assert c.call("CONFIG", "SET", "maxmemory", "3mb") == b"+OK\r\n"
        assert c.cmd("CONFIG", "GET", "maxmemory") == [b"maxmemory", b"3145728"]


def test_idle_empty_queues_are_evicted_under_memory_pressure(server) -> None:  # type: ignore[no-untyped-def]
    with Conn(server.port) as c:
        names = [f"evictq-{i}" for i in range(200)]
        ids = c.pipeline([("ADDJOB", n, "b", "0") for n in names])
        c.cmd("GETJOB", "COUNT", "200", "FROM", *names)
        assert c.cmd("ACKJOB", *ids) == 200
        c.cmd("PAUSE", "kept-paused", "in")
        assert int(info(c, "queues")["registered_queues"]) >= 201
        c.cmd("CONFIG", "SET", "maxmemory", "1")
        wait_for(lambda: int(info(c, "queues")["registered_queues"]) <= 1,
                 timeout=40, interval=0.1, what="idle empty queues evicted")
        # paused queues are never evicted
        st = qstat(c, "kept-paused")
        assert st is not None and st["pause"] == b"in"


def test_eviction_frees_memory_above_95_percent_without_any_denyoom_command(server) -> None:  # type: ignore[no-untyped-def]
    """Checklist section 11: at level >= 2 the original evicts before every command, not
    only before ADDJOB / ENQUEUE / NACK: evictable jobs must not stay in memory while a node
    over 95% only serves GETJOB / ACKJOB / PING. disque-py evicts every 100 ms (and before
    the denyoom commands), so consumers do not pay for it."""
    with Conn(server.port) as c:
        c.pipeline([("ADDJOB", "amo", "x" * 2000, "0", "REPLICATE", "1", "RETRY", "0")
                    for _ in range(300)])
        assert len(c.cmd("GETJOB", "COUNT", "300", "FROM", "amo")) == 300  # delivered
        assert int(info(c, "jobs")["registered_jobs"]) == 300
        used = int(info(c, "memory")["used_memory"])
        assert c.cmd("CONFIG", "SET", "maxmemory", str(used * 100 // 97)) == "OK"  # level 2
        # no ADDJOB / ENQUEUE / NACK from now on: the delivered at-most-once jobs are the
        # evictable ones, freed down to 95% of maxmemory
        wait_for(lambda: int(info(c, "jobs")["registered_jobs"]) < 300, timeout=30,
                 what="eviction of delivered RETRY 0 jobs with no denyoom command")
        assert int(info(c, "memory")["used_memory"]) <= used * 100 // 97 * 95 // 100
