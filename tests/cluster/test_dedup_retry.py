"""ADDJOB ... DEDUP retried while the first ADDJOB still waits for its copies (a client
that timed out and retries on a new connection): the retry waits for the same outcome,
and closing the first connection does not delete the job under it. Before, the retry was
answered "added" at once, and the first connection's close then deleted the job
cluster-wide."""

from __future__ import annotations

import threading

from tests.cluster.conftest import cmd
from tests.integration.resp import Conn, Status


def test_a_dedup_retry_gets_the_job_the_first_addjob_was_replicating(cluster) -> None:
    c = cluster(2)
    a, b = c[0], c[1]
    # b stalls, so a's REPLICATE 2 waits for b's GOTJOB
    sleeper = threading.Thread(target=lambda: cmd(b, "DEBUG", "SLEEP", "3", timeout=30))
    sleeper.start()
    first = Conn(a.port)
    first.send_cmd("ADDJOB", "q", "body", 0, "REPLICATE", 2, "DEDUP", "k1")
    with Conn(a.port) as retry:
        # the retry blocks too (it used to answer at once) ...
        retry.send_cmd("ADDJOB", "q", "body", 0, "REPLICATE", 2, "DEDUP", "k1")
        first.close()  # ... and the first client gives up
        reply = retry.read(timeout=30)  # b wakes up: the job is replicated
    sleeper.join()
    assert isinstance(reply, Status), reply
    show = cmd(a, "SHOW", str(reply))
    assert show is not None  # not deleted when the first connection closed
    assert cmd(a, "QLEN", "q") == 1
    # a third try answers the same ID at once
    assert cmd(a, "ADDJOB", "q", "body", 0, "REPLICATE", 2, "DEDUP", "k1") == reply
