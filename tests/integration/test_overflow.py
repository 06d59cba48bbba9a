"""Overflow (issue 22): a real node with a small maxmemory and `overflow yes` moves queued jobs
to a real file and serves them back in order; every command sees them; restarts with and
without AOF; a size cap acts as a full disk."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from tests.harness import DisqueProcess, wait_for
from tests.integration.resp import Conn, Err, Status, info, qstat, show
from tests.smalldisk import SmallDisk

OOM = "OOM command not allowed when used memory > 'maxmemory'."
BODY = "x" * 1000
ARGS = ["--maxmemory", "4mb", "--overflow", "yes", "--overflow-threshold", "50"]


def produce(c: Conn, queue: str, first: int, n: int, *opts: object) -> list[str]:
    ids: list[str] = []
    for start in range(first, first + n, 500):
        replies = c.pipeline([("ADDJOB", queue, "%06d" % i + BODY, 0, *opts)
                              for i in range(start, min(start + 500, first + n))])
        assert all(isinstance(r, Status) for r in replies), [r for r in replies if not isinstance(r, Status)][:3]
        ids += [str(r) for r in replies]
    return ids


def text(x: object) -> str:
    return x.decode() if isinstance(x, bytes) else str(x)


def on_disk(c: Conn) -> int:
    return int(info(c, "jobs")["overflow_jobs"])


def consume(c: Conn, queue: str) -> list[int]:
    seqs: list[int] = []
    while True:
        got = c.cmd("GETJOB", "NOHANG", "COUNT", 100, "FROM", queue)
        if not got:
            return seqs
        seqs += [int(j[2][:6]) for j in got]
        assert c.cmd("ACKJOB", *[j[1] for j in got]) == len(got)


def test_jobs_overflow_and_come_back_in_order(make_server) -> None:  # type: ignore[no-untyped-def]
    node = make_server(args=ARGS)
    with Conn(node.port) as c:
        produce(c, "ovq", 0, 4000)
        wait_for(lambda: on_disk(c) > 1000, what="jobs on disk")
        fields = info(c, "jobs")
        assert fields["overflow_status"] == "ok" and int(fields["overflow_bytes"]) > 1000 * 1000
        assert int(fields["overflow_file_bytes"]) >= int(fields["overflow_bytes"])
        assert int(fields["registered_jobs"]) == 4000
        assert c.cmd("QLEN", "ovq") == 4000
        stat = qstat(c, "ovq")
        assert stat is not None and stat["len"] == 4000 and stat["overflow-jobs"] > 1000
        wait_for(lambda: int(info(c, "memory")["used_memory"]) <= 2 * 1024 * 1024,
                 what="memory under the threshold")
        produce(c, "ovq", 4000, 500)  # added while the queue's tail is on disk
        assert consume(c, "ovq") == list(range(4500))
        assert on_disk(c) == 0 and c.cmd("QLEN", "ovq") == 0
        assert int(info(c, "jobs")["registered_jobs"]) == 0


def test_every_command_sees_a_job_on_disk(make_server) -> None:  # type: ignore[no-untyped-def]
    node = make_server(args=ARGS)
    with Conn(node.port) as c:
        ids = overflowed(c, "cq")
        newest = c.cmd("QPEEK", "cq", -2)
        assert [text(j[1]) for j in newest] == [ids[-1], ids[-2]]
        oldest = c.cmd("QPEEK", "cq", 3)
        assert [text(j[1]) for j in oldest] == ids[:3]
        scanned = set()
        cursor = "0"
        while True:
            cursor, found = c.cmd("JSCAN", cursor, "COUNT", 500, "QUEUE", "cq")
            scanned |= {text(f) for f in found}
            if cursor == b"0":
                break
        assert scanned == set(ids)
        job = show(c, ids[-10])
        assert job is not None and job["state"] == b"queued" and job["body"][:6] == b"003990"
        assert c.cmd("DEQUEUE", ids[-11]) == 1 and c.cmd("QLEN", "cq") == 3999
        assert c.cmd("ENQUEUE", ids[-11]) == 1 and c.cmd("QLEN", "cq") == 4000
        assert c.cmd("DELJOB", ids[-12]) == 1
        assert c.cmd("FASTACK", ids[-13]) == 1
        assert c.cmd("ACKJOB", ids[-14]) == 1
        assert c.cmd("QLEN", "cq") == 3997
        gone = {3986, 3987, 3988}
        seqs = consume(c, "cq")
        # ids[-11] went back to its ctime place: queue order is creation order
        assert seqs == [i for i in range(4000) if i not in gone]


def test_jobs_on_disk_expire_with_their_ttl(make_server) -> None:  # type: ignore[no-untyped-def]
    node = make_server(args=ARGS)
    with Conn(node.port) as c:
        produce(c, "tq", 0, 4000, "TTL", 3)
        wait_for(lambda: on_disk(c) > 1000, what="jobs on disk")
        wait_for(lambda: c.cmd("QLEN", "tq") == 0, timeout=30, what="expiry")
        assert on_disk(c) == 0 and int(info(c, "jobs")["registered_jobs"]) == 0


def test_restart_with_aof_brings_every_job_back(make_server) -> None:  # type: ignore[no-untyped-def]
    node: DisqueProcess = make_server(args=[*ARGS, "--appendonly", "yes",
                                            "--appendfsync", "always"])
    with Conn(node.port) as c:
        ids = overflowed(c, "aq")
        assert c.cmd("BGREWRITEAOF") is not None  # the rewrite walks the disk too
        wait_for(lambda: info(c, "persistence")["aof_rewrite_in_progress"] == "0",
                 what="rewrite done")
        ids += produce(c, "aq", 4000, 200)
    node.kill()
    node.start()
    with Conn(node.port) as c:
        wait_for(lambda: info(c, "persistence")["loading"] == "0", what="AOF loaded")
        fields = info(c, "jobs")
        assert int(fields["registered_jobs"]) == 4200
        assert int(fields["overflow_jobs"]) > 1000  # the load overflowed as it went
        assert int(info(c, "memory")["used_memory"]) <= 4 * 1024 * 1024
        assert c.cmd("SHOW", ids[-1]) is not None and c.cmd("SHOW", ids[0]) is not None
        # after a kill the jobs come back active (queued again after their retry, as
        # without overflow): ENQUEUE them all and they are served in order
        for start in range(0, 4200, 500):
            assert c.cmd("ENQUEUE", *ids[start:start + 500]) == len(ids[start:start + 500])
        assert consume(c, "aq") == list(range(4200))


def overflowed(c: Conn, queue: str, n: int = 4000) -> list[str]:
    """n jobs added to `queue`, more than 1000 of them on disk."""
    ids = produce(c, queue, 0, n)
    wait_for(lambda: on_disk(c) > 1000, what="jobs on disk")
    return ids


def store_path(node: DisqueProcess) -> Path:
    return Path(node.workdir) / "overflow" / f"jobs-{node.port}.db"


def test_without_aof_a_restart_starts_empty_and_drops_the_file(make_server) -> None:  # type: ignore[no-untyped-def]
    node: DisqueProcess = make_server(args=ARGS)
    path = store_path(node)
    with Conn(node.port) as c:
        overflowed(c, "nq")
    big = path.stat().st_size
    node.kill()
    node.start()
    with Conn(node.port) as c:
        assert on_disk(c) == 0 and c.cmd("QLEN", "nq") == 0
    assert path.stat().st_size < big


def test_a_file_deleted_by_hand_keeps_serving(make_server) -> None:  # type: ignore[no-untyped-def]
    node: DisqueProcess = make_server(args=ARGS)
    with Conn(node.port) as c:
        overflowed(c, "dq")
        os.remove(store_path(node))
        assert consume(c, "dq") == list(range(4000))


def fill_until_full_then_drain(c: Conn, node: DisqueProcess, queue: str,
                               space_back: Callable[[], None] = lambda: None) -> None:
    """ADDJOB until -OOM (the overflow file full, memory then), the node up and saying so;
    every job drained in order; `space_back`, then ADDJOB is accepted again."""
    added = 0
    refused = None
    for i in range(20_000):
        reply = c.cmd("ADDJOB", queue, "%06d" % i + BODY, 0)
        if isinstance(reply, Err):
            refused = reply
            break
        added += 1
    assert refused is not None and str(refused) == OOM, refused
    assert node.alive() and info(c, "jobs")["overflow_status"] == "full"
    assert 0 < on_disk(c) < added
    assert consume(c, queue) == list(range(added))
    space_back()
    wait_for(lambda: isinstance(c.cmd("ADDJOB", queue, "again", 0), Status),
             what="accepted again")


def test_a_size_cap_acts_as_a_full_disk(make_server) -> None:  # type: ignore[no-untyped-def]
    node = make_server(args=[*ARGS, "--overflow-max-size", "1mb"])
    with Conn(node.port) as c:
        fill_until_full_then_drain(c, node, "fq")
        assert c.cmd("PING") == Status("PONG")


def test_config_set_turns_overflow_on_and_off(make_server) -> None:  # type: ignore[no-untyped-def]
    node = make_server(args=["--maxmemory", "4mb"])
    with Conn(node.port) as c:
        assert info(c, "jobs")["overflow_status"] == "off"
        assert qstat(c, "none") is None
        assert c.cmd("CONFIG", "SET", "overflow", "yes") == Status("OK")
        overflowed(c, "sq")
        assert c.cmd("CONFIG", "SET", "overflow", "no") == Status("OK")
        assert consume(c, "sq") == list(range(4000))
        wait_for(lambda: info(c, "jobs")["overflow_status"] == "off", what="store closed")
        bad = c.cmd("CONFIG", "SET", "overflow-threshold", "95")
        assert isinstance(bad, Err)


def test_a_full_disk_stops_overflow_without_a_crash_and_loses_nothing(
        small_disk: SmallDisk, make_server) -> None:  # type: ignore[no-untyped-def]
    # the overflow file on a small filesystem (tests/smalldisk.py: tmpfs, a loop-mounted
    # image, or a file-size limit): ENOSPC / EFBIG make the node stop overflowing and answer
    # -OOM once memory is full, as without overflow; it goes on once jobs are drained
    node = make_server(args=[*ARGS, "--overflow-dir", str(small_disk.path)])
    assert node.proc is not None
    small_disk.attach(node.proc.pid)
    small_disk.fill(leave=400_000)
    with Conn(node.port) as c:
        fill_until_full_then_drain(c, node, "eq", small_disk.free)
