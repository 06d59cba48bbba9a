"""Issue 13 part 2: with AOF, an acknowledged job is not delivered again after restarts.

Two ways a restarted node used to bring an acknowledged job back:

1. the AOF logged an ACK as a DELJOB, so a node restarted after it acked a job forgot the
   acknowledgement: a copy elsewhere (on a node that was down during the ACK) asked it with
   WILLQUEUE, heard nothing, and queued the job again. The ACK is now logged as an acked
   record and answers for the job after a restart;
2. a node whose DELJOB did not reach the disk before a crash (appendfsync everysec) reloads an
   active copy of a job every other holder already collected. A reloaded copy now asks every
   holder before it queues the job, and drops it when none of them has it.

Each is staged deterministically with appendfsync always: (2) by putting back the AOF the node
had before the job was acknowledged, as a crash before the fsync would have left it.
"""

from __future__ import annotations

import shutil

from tests.cluster.conftest import NODE_TIMEOUT, cmd, holds_for, kill_until_failed
from tests.harness import DisqueProcess, wait_for
from tests.integration.resp import Status

Q = "q"
AOF = ["--appendonly", "yes", "--appendfsync", "always"]


def add_r3(p: DisqueProcess) -> str:
    reply = cmd(p, "ADDJOB", Q, "body", 5000, "REPLICATE", 3, "RETRY", 1, timeout=15)
    assert isinstance(reply, Status), reply
    return str(reply)


def states(c, job_id: str) -> list[str | None]:
    out = []
    for p in c.nodes:
        s = cmd(p, "SHOW", job_id)
        out.append(None if s is None else s[5].decode())
    return out


def never_queued(c, job_id: str, seconds: float) -> None:
    holds_for(lambda: "queued" not in states(c, job_id), seconds,
              "the acknowledged job stays out of every queue", detail=lambda: states(c, job_id))


def test_an_ack_survives_the_restart_of_the_nodes_that_saw_it(cluster) -> None:
    c = cluster(3, node_timeout=NODE_TIMEOUT, args=AOF)
    a, b, x = c.nodes
    job_id = add_r3(a)
    assert cmd(a, "GETJOB", "NOHANG", "FROM", Q)[0][1].decode() == job_id
    kill_until_failed(c, 2)  # x keeps an active copy on disk, and misses the ACK
    assert cmd(a, "ACKJOB", job_id) == 1
    wait_for(lambda: cmd(b, "SHOW", job_id)[5] == b"acked")
    for p in (a, b):  # both acknowledged holders restart: they used to forget the ACK
        p.kill()
        p.start()
    x.start()
    c.wait_mesh()
    # x's copy comes back active and its RETRY (1 s) expires: the restarted nodes must
    # answer for the acknowledgement, and the GC then removes the job everywhere
    never_queued(c, job_id, 4)
    wait_for(lambda: states(c, job_id) == [None, None, None], timeout=30)


def test_a_reloaded_copy_of_a_job_collected_meanwhile_is_dropped(cluster) -> None:
    c = cluster(3, args=AOF)
    a, b, x = c.nodes
    job_id = add_r3(a)
    wait_for(lambda: cmd(x, "SHOW", job_id) is not None)
    saved = x.workdir / "aof-before-ack"
    shutil.copyfile(x.workdir / "disque.aof", saved)
    assert cmd(a, "GETJOB", "NOHANG", "FROM", Q)[0][1].decode() == job_id
    assert cmd(a, "ACKJOB", job_id) == 1
    wait_for(lambda: states(c, job_id) == [None, None, None], timeout=30)
    # x crashes, its DELJOB of the job lost (as with everysec): it reloads an active copy
    x.kill()
    shutil.copyfile(saved, x.workdir / "disque.aof")
    x.start()
    c.wait_mesh()
    assert cmd(x, "SHOW", job_id)[5] == b"active"
    never_queued(c, job_id, 3)
    wait_for(lambda: cmd(x, "SHOW", job_id) is None, timeout=20)
    assert cmd(x, "GETJOB", "NOHANG", "FROM", Q) is None


def test_a_reloaded_copy_whose_other_holders_never_collected_it_is_delivered(cluster) -> None:
    # Found by the long client-port fuzz: holders that do not know the job (a local DELJOB
    # here; also a copy refused or lost) are not proof that it was acknowledged. Only the
    # nodes that collected it (the ACK GC, a DELJOB from the bus, FASTACK) say so.
    c = cluster(2, args=AOF)
    a, b = c.nodes
    reply = cmd(a, "ADDJOB", Q, "body", 5000, "REPLICATE", 2, "RETRY", 1, timeout=15)
    job_id = str(reply)
    assert cmd(b, "DELJOB", job_id) == 1  # b drops its own copy only
    a.kill()
    a.start()
    c.wait_mesh()
    assert cmd(a, "SHOW", job_id)[5] == b"active"
    # reloaded active, it asks b, which never collected it: queued again after RETRY
    wait_for(lambda: cmd(a, "GETJOB", "NOHANG", "FROM", Q), timeout=20,
             what="the reloaded job queued")
