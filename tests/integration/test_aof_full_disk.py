"""A full disk under the AOF (issue 25): real servers writing on a small filesystem the test
makes (tests/smalldisk.py: a tmpfs mount, else a loop-mounted ext4 image, else a file-size
limit on the server process).

While the AOF cannot be written the node refuses new jobs with -MISCONF, answers reads,
answers an ACK it cannot log with -MISCONF, and stays up; when space comes back it accepts
writes again by itself; after a crash its AOF holds every job whose ADDJOB returned an ID
and none whose ADDJOB failed, with no torn record in it.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from disque.aof import check
from tests.harness import DisqueProcess, wait_for
from tests.integration.resp import Conn, Status, info, pairs
from tests.smalldisk import SmallDisk

MISCONF = b"-MISCONF Errors writing to the AOF file: "
PAD = "x" * 400  # job bodies of ~0.4 KB: a 2 MB disk fills in a few thousand jobs


def start_on(disk: SmallDisk, make_server: Any, *args: str) -> DisqueProcess:
    # the log stays in the node's own directory; only `dir` (AOF, nodes.conf) is small
    p = make_server(args=["--dir", str(disk.path), "--appendonly", "yes", *args])
    assert p.proc is not None
    disk.attach(p.proc.pid)
    return p


def restart(p: DisqueProcess, disk: SmallDisk) -> None:
    p.start()
    assert p.proc is not None
    disk.attach(p.proc.pid)


def expected_error(disk: SmallDisk) -> str:
    return "File too large" if disk.kind == "fsize" else "No space left on device"


class Producer(threading.Thread):
    """ADDJOBs with unique bodies, one at a time, until stopped: which bodies got an ID and
    which an error."""

    def __init__(self, port: int, name: str) -> None:
        super().__init__(daemon=True)
        self.port = port
        self.name = name
        self.acked: dict[str, str] = {}  # job ID -> body
        self.refused: list[str] = []  # bodies answered -MISCONF
        self.errors: list[bytes] = []  # anything else (must stay empty)
        self.halt = threading.Event()

    def run(self) -> None:
        with Conn(self.port) as c:
            i = 0
            while not self.halt.is_set():
                body = f"{self.name}-{i}-{PAD}"
                i += 1
                reply = c.call("ADDJOB", "q", body, 0)
                if reply.startswith(b"+"):
                    self.acked[reply[1:-2].decode()] = body
                elif reply.startswith(MISCONF):
                    self.refused.append(body)
                else:
                    self.errors.append(reply)

    def stop(self) -> None:
        self.halt.set()
        self.join(timeout=30)
        assert not self.is_alive()


def bodies_of(c: Conn) -> dict[str, str]:
    """Every job the node holds (a live registry walk), ID -> body (None for an acked one)."""
    cursor, ids = c.cmd("JSCAN", "BUSYLOOP", "COUNT", 100000)
    assert cursor == b"0"
    out = {}
    ids = [str(i) for i in ids]
    for k in range(0, len(ids), 500):
        batch = ids[k:k + 500]
        for job_id, reply in zip(batch, c.pipeline([("SHOW", i) for i in batch]), strict=True):
            fields = pairs(reply)
            body = fields["body"]
            out[job_id] = body.decode() if body is not None else None
    return out


@pytest.mark.parametrize("policy", ["everysec", "always"])
def test_a_full_disk_refuses_new_jobs_serves_reads_and_loses_no_acknowledged_job(
        small_disk: SmallDisk, make_server: Any, policy: str) -> None:
    disk = small_disk
    p = start_on(disk, make_server, "--appendfsync", policy,
                 "--auto-aof-rewrite-percentage", "0")
    c = Conn(p.port)
    before = {c.cmd("ADDJOB", "q", f"early-{i}-{PAD}", 0): f"early-{i}-{PAD}" for i in range(20)}
    # an ACK while the disk is fine: gone after the restart
    (early,) = c.cmd("GETJOB", "NOHANG", "FROM", "q")
    acked_early = early[1].decode()
    assert c.cmd("ACKJOB", acked_early) == 1

    disk.fill(leave=300_000)  # the producers write the rest
    producers = [Producer(p.port, f"p{k}") for k in range(3)]
    for pr in producers:
        pr.start()
    try:
        wait_for(lambda: sum(len(pr.refused) for pr in producers) >= 100, timeout=60,
                 what="ADDJOBs refused once the disk is full")

        # -- the disk is full: the node is up, refuses writes, answers reads --------------
        assert p.alive()
        error = expected_error(disk)
        state = info(c, "persistence")
        assert state["aof_last_write_status"] == "err"
        assert state["aof_last_write_error"] == error
        assert int(state["aof_write_errors"]) >= 1
        refused = MISCONF + error.encode() + b"\r\n"
        assert c.call("ADDJOB", "q", "one more", 0) == refused
        assert c.call("ADDJOBS", "q", 0, "JOBS", "a", "b") == refused
        assert c.call("PING") == refused  # health checks see it, as in Redis
        assert isinstance(c.cmd("QLEN", "q"), int)
        job_id = next(i for i in before if i != acked_early)
        assert pairs(c.cmd("SHOW", job_id))["id"] == job_id.encode()
        (got,) = c.cmd("GETJOB", "NOHANG", "FROM", "q")  # reads, dequeues included
        taken = got[1].decode()
        # an ACK whose record cannot be written is not confirmed; it is applied and its
        # record waits for the retry
        assert c.call("ACKJOB", taken) == refused
        show = c.cmd("SHOW", taken)  # (a lone node forgets an acknowledged job at once)
        assert show is None or pairs(show)["state"] == b"acked"
        assert p.alive()

        # -- space comes back: writes are accepted again without any command ----------------
        counts = [len(pr.acked) for pr in producers]
        freed = time.monotonic()
        disk.free()
        wait_for(lambda: all(len(pr.acked) > n for pr, n in zip(producers, counts, strict=True)),
                 timeout=30, what="ADDJOBs accepted again after space came back")
        print(f"{disk.kind}/{policy}: writes accepted again "
              f"{time.monotonic() - freed:.2f}s after space came back")
        state = info(c, "persistence")
        assert state["aof_last_write_status"] == "ok" and state["aof_last_write_error"] == ""
        assert c.call("PING") == b"+PONG\r\n"
    finally:
        for pr in producers:
            pr.stop()
    assert not any(pr.errors for pr in producers), [pr.errors[:3] for pr in producers]

    acked = dict(before)
    refused_bodies: set[str] = set()
    for pr in producers:
        acked.update(pr.acked)
        refused_bodies.update(pr.refused)
    assert refused_bodies and len(acked) > len(before)

    # -- a crash, then a restart from the AOF alone -------------------------------------------
    p.kill()
    aof = disk.path / "disque.aof"
    records, end, reason = check.scan(str(aof))
    assert reason is None and end == aof.stat().st_size  # no torn record, anywhere
    restart(p, disk)
    c = Conn(p.port)
    held = bodies_of(c)
    missing = [i for i in acked if i not in held and i not in (acked_early, taken)]
    assert not missing, f"{len(missing)} acknowledged jobs lost, e.g. {missing[:3]}"
    assert not set(held.values()) & refused_bodies  # no job whose ADDJOB failed came back
    assert set(held) <= set(acked)
    for gone in (acked_early, taken):  # acknowledged: absent, or kept as an acknowledgement
        assert held.get(gone) is None


def test_a_rewrite_on_a_full_disk_fails_and_leaves_the_old_aof_intact(
        small_disk: SmallDisk, make_server: Any) -> None:
    disk = small_disk
    p = start_on(disk, make_server, "--auto-aof-rewrite-percentage", "0")
    c = Conn(p.port)
    ids = [str(c.cmd("ADDJOB", "q", f"{i}-{PAD}", 0)) for i in range(500)]
    aof = disk.path / "disque.aof"
    wait_for(lambda: info(c, "persistence")["aof_buffer_length"] == "0", what="AOF written")
    old = aof.read_bytes()

    disk.room_for_new_file(len(old) // 2)  # not enough for a rewritten copy of the file
    assert isinstance(c.cmd("BGREWRITEAOF"), Status)
    wait_for(lambda: info(c, "persistence")["aof_rewrite_in_progress"] == "0",
             what="the rewrite to end")
    state = info(c, "persistence")
    assert state["aof_last_bgrewrite_status"] == "err"
    assert state["aof_rewrites_consecutive_failures"] == "1"
    assert aof.read_bytes() == old  # untouched
    assert not [f for f in disk.path.iterdir() if f.name.startswith("temp-rewriteaof")]
    assert p.alive() and c.cmd("QLEN", "q") == len(ids)

    disk.free()
    assert isinstance(c.cmd("BGREWRITEAOF"), Status)
    wait_for(lambda: info(c, "persistence")["aof_last_bgrewrite_status"] == "ok",
             what="a rewrite once space is back")
    assert info(c, "persistence")["aof_rewrites_consecutive_failures"] == "0"
    p.kill()
    restart(p, disk)
    assert set(bodies_of(Conn(p.port))) == set(ids)


def test_appendonly_turned_on_over_a_full_disk_retries_its_first_rewrite(
        small_disk: SmallDisk, make_server: Any) -> None:
    """CONFIG SET appendonly yes starts the AOF with a rewrite; on a full disk that rewrite
    fails and the node stays in wait-rewrite, trying again, until the AOF exists."""
    disk = small_disk
    p = make_server(args=["--dir", str(disk.path)])
    assert p.proc is not None
    disk.attach(p.proc.pid)
    c = Conn(p.port)
    ids = {str(c.cmd("ADDJOB", "q", f"{i}-{PAD}", 0)) for i in range(200)}
    disk.room_for_new_file(10_000)  # not enough for the 80 KB of jobs
    assert c.cmd("CONFIG", "SET", "appendonly", "yes") == "OK"
    wait_for(lambda: info(c, "persistence")["aof_last_bgrewrite_status"] == "err",
             what="the first rewrite to fail")
    assert info(c, "persistence")["aof_state"] == "wait-rewrite"
    ids.add(str(c.cmd("ADDJOB", "q", "meanwhile", 0)))
    disk.free()
    wait_for(lambda: info(c, "persistence")["aof_state"] == "on", timeout=30,
             what="a new rewrite to write the AOF once space is back")
    p.kill()
    p.args += ["--appendonly", "yes"]
    restart(p, disk)
    assert set(bodies_of(Conn(p.port))) == ids
