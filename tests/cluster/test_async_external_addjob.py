"""ADDJOB ... ASYNC on a node that keeps no copy (external replication: CLUSTER LEAVING yes,
or memory above 75% of maxmemory) is handled as a *synchronous* ADDJOB.

Found by the soak run: during a 30 s LEAVING window, ASYNC ADDJOBs on the leaving node hung
(timeout 0) or answered `-NOREPL Timeout reached ...` although the job had been replicated
and queued on the other nodes; meanwhile the creator kept re-sending REPLJOB every 50 ms,
so every time a replica was ACKed and garbage-collected, the next REPLJOB re-created it and
the "acknowledged" job was delivered again (one job: 8 deliveries, ACKJOB -> 1 three times).

Cause: `Node._add_replicated` returns the never-registered job of the async+external branch
with its initial state WAIT_REPL, and `commands/jobs.py:cmd_addjob` decides "sync" by
`job.state == WAIT_REPL`, so it parks the client in `wait_replication`; `repl_tick` then
re-sends REPLJOB forever (GOTJOBs are ignored by `on_gotjob` since the job is not in the
registry) until the ADDJOB timeout or the client disconnects.
"""

from __future__ import annotations

from tests.cluster.conftest import cmd, holds_for, ok
from tests.harness import wait_for
from tests.integration.resp import Err, Status
from tests.threads import Background


def test_async_addjob_on_a_leaving_node_answers_at_once(cluster) -> None:
    c = cluster(3)
    leaving = c[0]
    ok(leaving, "CLUSTER", "LEAVING", "yes")
    # with the bug it waits for GOTJOBs it ignores: -NOREPL Timeout after 3 s
    reply = cmd(leaving, "ADDJOB", "q", "body", 3000, "REPLICATE", 2, "ASYNC")
    assert not isinstance(reply, Err), f"ASYNC ADDJOB on a leaving node -> {reply!r}"
    assert cmd(leaving, "INFO", "clients").count(b"blocked_clients:0") == 1


def test_an_acked_async_job_of_a_leaving_node_is_not_recreated(cluster) -> None:
    """Even with the ADDJOB still blocked (timeout 0), an ACKed job must stay gone."""
    c = cluster(3)
    leaving, others = c[0], [c[1], c[2]]
    ok(leaving, "CLUSTER", "LEAVING", "yes")
    # The ADDJOB runs in a thread: with the bug it never returns by itself (its connection
    # times out after 8 s), which adder.result() below reports.
    adder = Background(cmd, leaving, "ADDJOB", "q", "body", 0, "REPLICATE", 2, "RETRY", 1,
                       "ASYNC", timeout=8.0)

    def fetched():
        for p in others:
            r = cmd(p, "GETJOB", "NOHANG", "FROM", "q")
            if r:
                return p, r[0][1]
        return None

    node, job_id = wait_for(fetched, timeout=10, what="the async job queued on a replica")
    assert cmd(node, "ACKJOB", job_id) == 1
    wait_for(lambda: all(cmd(p, "SHOW", job_id) is None for p in others), timeout=10,
             what="every copy collected after the ACK")
    holds_for(lambda: all(cmd(p, "SHOW", job_id) is None for p in others), 3.0,
              "the acked job stays collected",
              detail=lambda: [cmd(p, "SHOW", job_id) for p in others])
    reply = adder.result(timeout=10)
    assert isinstance(reply, Status) and str(reply) == job_id.decode(), reply


def test_async_addjob_above_75_percent_of_maxmemory_answers_at_once(cluster) -> None:
    """The same path without LEAVING: external replication because of memory."""
    c = cluster(3)
    node = c[0]
    ok(node, "CONFIG", "SET", "maxmemory", 1_300_000)  # idle node ~1 MB: above 75%
    reply = cmd(node, "ADDJOB", "q", "body", 2000, "REPLICATE", 2, "ASYNC")
    assert not isinstance(reply, Err), f"ASYNC ADDJOB with memory above 75% -> {reply!r}"
