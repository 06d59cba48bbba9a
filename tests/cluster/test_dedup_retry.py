"""ADDJOB ... DEDUP retried while the first ADDJOB still waits for its copies (a client
that timed out and retries on a new connection): the retry waits for the same outcome,
and closing the first connection does not delete the job under it. Before, the retry was
answered "added" at once, and the first connection's close then deleted the job
cluster-wide."""

from __future__ import annotations

from tests.cluster.conftest import cmd, frozen, parse_fields
from tests.harness import wait_for
from tests.integration.resp import Conn, Status
from tests.waits import wait_stopped

ADDJOB = ("ADDJOB", "q", "body", 0, "REPLICATE", 2, "DEDUP", "k1")


def blocked_clients(proc) -> int:  # type: ignore[no-untyped-def]
    return int(parse_fields(cmd(proc, "INFO", "clients"))["blocked_clients"])


def registered_jobs(proc) -> int:  # type: ignore[no-untyped-def]
    return int(parse_fields(cmd(proc, "INFO", "jobs"))["registered_jobs"])


def test_a_dedup_retry_gets_the_job_the_first_addjob_was_replicating(cluster) -> None:
    c = cluster(2)
    a, b = c[0], c[1]
    first, retry = Conn(a.port), Conn(a.port)
    try:
        # b is stopped (and known to be) before the first ADDJOB goes: a's REPLICATE 2
        # waits for b's GOTJOB until b goes on, after every step below has been seen
        with frozen(b):
            wait_stopped(b.proc.pid)  # type: ignore[union-attr]
            first.send_cmd(*ADDJOB)
            wait_for(lambda: blocked_clients(a) == 1, what="the first ADDJOB waiting for b")
            # the retry blocks too, on the same replication (it used to answer at once) ...
            retry.send_cmd(*ADDJOB)
            wait_for(lambda: blocked_clients(a) == 2, what="the retry waiting for b too")
            assert retry.nothing_pending()
            # ... and the first client gives up: the job is handed to the retry, not deleted
            first.close()
            wait_for(lambda: blocked_clients(a) == 1, what="a to handle the first one's close")
            assert registered_jobs(a) == 1
            assert retry.nothing_pending()
        reply = retry.read(timeout=30)  # b goes on: the job is replicated
    finally:
        first.close()
        retry.close()
    assert isinstance(reply, Status), reply
    show = cmd(a, "SHOW", str(reply))
    assert show is not None  # not deleted when the first connection closed
    assert cmd(a, "QLEN", "q") == 1
    # a third try answers the same ID at once
    assert cmd(a, "ADDJOB", *ADDJOB[1:]) == reply
