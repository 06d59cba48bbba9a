"""A replica whose AOF disk fills up (issue 25), on 2 real nodes: B writes its AOF on a small
filesystem (tests/smalldisk.py), A adds jobs with REPLICATE 2, so every job needs B's copy.

B confirms a copy (GOTJOB) only once its record is written, and takes no copy while its
AOF cannot be written: A's ADDJOBs then time out with -NOREPL instead of being acknowledged
on a copy B could lose. After a kill -9 of B, B's AOF holds every job A acknowledged.
"""

from __future__ import annotations

import threading
from typing import Any

from tests.cluster.conftest import ok
from tests.harness import DisqueProcess, wait_for
from tests.integration.resp import Conn, Err, info
from tests.smalldisk import SmallDisk

NOREPL = "NOREPL Timeout reached before replicating to the requested number of nodes"
PAD = "x" * 400


class Producer(threading.Thread):
    def __init__(self, port: int, name: str) -> None:
        super().__init__(daemon=True)
        self.port = port
        self.name = name
        self.acked: list[str] = []
        self.norepl = 0
        self.errors: list[Any] = []
        self.halt = threading.Event()

    def run(self) -> None:
        with Conn(self.port) as c:
            i = 0
            while not self.halt.is_set():
                i += 1
                reply = c.cmd("ADDJOB", "q", f"{self.name}-{i}-{PAD}", 500, "REPLICATE", 2)
                if isinstance(reply, Err):
                    if reply == NOREPL:
                        self.norepl += 1
                    else:
                        self.errors.append(reply)
                else:
                    self.acked.append(str(reply))

    def stop(self) -> None:
        self.halt.set()
        self.join(timeout=30)
        assert not self.is_alive()


def persistence(p: DisqueProcess) -> dict[str, str]:
    with Conn(p.port) as c:
        return info(c, "persistence")


def aof_status(p: DisqueProcess) -> str:
    return persistence(p)["aof_last_write_status"]


def test_a_replica_confirms_only_copies_its_full_disk_let_it_write(
        small_disk: SmallDisk, cluster: Any) -> None:
    disk = small_disk
    c = cluster(2, args=["--appendonly", "yes", "--auto-aof-rewrite-percentage", "0"])
    a, b = c
    ok(b, "CONFIG", "SET", "dir", str(disk.path))  # B's AOF moves there (a rewrite)
    wait_for(lambda: (disk.path / "disque.aof").exists()
             and persistence(b)["aof_rewrite_in_progress"] == "0",
             what="B's AOF rewritten on the small disk")
    assert b.proc is not None
    disk.attach(b.proc.pid)

    disk.fill(leave=200_000)
    producers = [Producer(a.port, f"p{k}") for k in range(3)]
    for pr in producers:
        pr.start()
    try:
        wait_for(lambda: sum(pr.norepl for pr in producers) >= 3, timeout=60,
                 what="ADDJOBs refused a copy by the full replica")
        assert aof_status(b) == "err" and b.alive()
        counts = [len(pr.acked) for pr in producers]
        disk.free()
        wait_for(lambda: all(len(pr.acked) > n for pr, n in zip(producers, counts, strict=True)),
                 timeout=30, what="copies taken again once space is back")
        assert aof_status(b) == "ok"
    finally:
        for pr in producers:
            pr.stop()
    assert not any(pr.errors for pr in producers), [pr.errors[:3] for pr in producers]
    acked = [i for pr in producers for i in pr.acked]

    b.kill()  # no shutdown: only what B wrote before each GOTJOB counts
    b.args += ["--dir", str(disk.path)]
    b.start()
    with Conn(b.port) as conn:
        replies = conn.pipeline([("SHOW", i) for i in acked])
    lost = [i for i, r in zip(acked, replies, strict=True) if r is None]
    assert not lost, f"{len(lost)} of {len(acked)} acknowledged jobs missing on B, e.g. {lost[:3]}"
