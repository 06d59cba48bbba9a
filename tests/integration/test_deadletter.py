"""Dead-letter queues and REDRIVE on one real node (issue 15): ADDJOB / ADDJOBS options and
their error texts (docs/commands.md "ADDJOB"), the node-wide defaults, SHOW / QSTAT shapes,
REDRIVE's errors, and dead jobs surviving a restart through the AOF."""

from __future__ import annotations

from typing import Any

import pytest

from tests.harness import DisqueProcess, wait_for
from tests.integration.resp import Conn, Err, Status, add, info, keys_of, qstat, show

SHOW_KEYS = ["id", "queue", "state", "repl", "ttl", "ctime", "delay", "retry", "nacks",
             "additional-deliveries", "nodes-delivered", "nodes-confirmed",
             "next-requeue-within", "next-awake-within", "body"]
DL_KEYS = ["max-deliveries", "max-nacks", "deadletter-queue", "source-queue",
           "deadletter-reason", "deadletter-time", "redrives", "backoff"]


def nack_dead(conn: Conn, q: str, job_id: str) -> None:
    """Take the job from `q` and NACK it (a MAXNACKS 1 job: into its dead-letter queue)."""
    jobs = conn.cmd("GETJOB", "NOHANG", "FROM", q)
    assert jobs and jobs[0][1].decode() == job_id, jobs
    assert conn.cmd("NACK", job_id) == 1


# ---------------------------------------------------------------------------- options
@pytest.mark.parametrize(("opts", "error"), [
    (("MAXDELIVERIES", -1), "ERR MAXDELIVERIES must be between 0 and 65535"),
    (("MAXDELIVERIES", 65536), "ERR MAXDELIVERIES must be between 0 and 65535"),
    (("MAXDELIVERIES", "x"), "ERR MAXDELIVERIES must be between 0 and 65535"),
    (("MAXNACKS", -1), "ERR MAXNACKS must be between 0 and 65535"),
    (("MAXNACKS", 70000), "ERR MAXNACKS must be between 0 and 65535"),
    (("DEADLETTER", ""), "ERR DEADLETTER queue name must not be empty"),
    (("DEADTTL", -1), "ERR DEADTTL must be a number of seconds from 0 to 315360000"),
    (("DEADTTL", 315360001), "ERR DEADTTL must be a number of seconds from 0 to 315360000"),
    (("BACKOFF", -1), "ERR BACKOFF must be a number of seconds from 0 to 315360000"),
    (("BACKOFF", "1.5"), "ERR BACKOFF must be a number of seconds from 0 to 315360000"),
    (("BACKOFF",), "ERR syntax error"),
    (("MAXNACKS",), "ERR syntax error"),
    (("DEADLETTER",), "ERR syntax error"),
])
def test_addjob_dead_letter_option_errors(conn: Conn, q: str, opts: tuple[Any, ...],
                                          error: str) -> None:
    assert conn.cmd("ADDJOB", q, "body", 0, *opts) == Err(error)
    assert conn.cmd("ADDJOBS", q, 0, *opts, "JOBS", "a", "b") == Err(error)
    assert conn.cmd("QLEN", q) == 0


def test_a_dead_letter_queue_equal_to_the_job_s_queue_is_refused(conn: Conn, q: str) -> None:
    error = Err("ERR DEADLETTER queue must differ from the job's queue")
    assert conn.cmd("ADDJOB", q, "body", 0, "MAXNACKS", 1, "DEADLETTER", q) == error
    assert conn.cmd("ADDJOBS", q, 0, "DEADLETTER", q, "JOBS", "a") == error
    # checked before MAXLEN (docs: check 6)
    add(conn, q, "first")
    assert conn.cmd("ADDJOB", q, "body", 0, "MAXLEN", 1, "DEADLETTER", q) == error
    assert conn.cmd("QLEN", q) == 1


def test_options_may_repeat_the_last_one_wins_and_show_has_46_items(conn: Conn, q: str) -> None:
    job_id = add(conn, q, "body", "MAXNACKS", 9, "MAXNACKS", 3, "MAXDELIVERIES", 5,
                 "DEADLETTER", "x", "DEADLETTER", f"{q}-dead", "DEADTTL", 60)
    reply = conn.cmd("SHOW", job_id)
    assert len(reply) == 46 and keys_of(reply) == SHOW_KEYS + DL_KEYS
    s = show(conn, job_id)
    assert (s["max-deliveries"], s["max-nacks"], s["redrives"], s["backoff"]) == (5, 3, 0, 0)
    assert (s["deadletter-queue"], s["source-queue"]) == (f"{q}-dead".encode(), q.encode())
    assert s["deadletter-reason"] is None and s["deadletter-time"] is None
    plain = add(conn, q, "plain")
    assert len(conn.cmd("SHOW", plain)) == 30  # the original's reply, byte for byte


def test_deadletter_alone_gives_a_policy_without_limits(conn: Conn, q: str) -> None:
    job_id = add(conn, q, "body", "DEADLETTER", f"{q}-dead")
    s = show(conn, job_id)
    assert (s["max-deliveries"], s["max-nacks"]) == (0, 0)
    conn.cmd("GETJOB", "NOHANG", "FROM", q)
    for _ in range(3):  # no limit: a NACK always puts it back in its queue
        assert conn.cmd("NACK", job_id) == 1
        assert conn.cmd("GETJOB", "NOHANG", "FROM", q)
    assert show(conn, job_id)["queue"] == q.encode()


def test_addjobs_jobs_share_the_policy_and_each_is_dead_lettered_alone(conn: Conn,
                                                                      q: str) -> None:
    ids = [str(s) for s in conn.cmd("ADDJOBS", q, 0, "MAXNACKS", 1, "DEADLETTER", f"{q}-dead",
                                    "JOBS", "a", "b", "c")]
    assert len(ids) == 3
    for job_id in ids:
        s = show(conn, job_id)
        assert (s["max-nacks"], s["deadletter-queue"]) == (1, f"{q}-dead".encode())
    nack_dead(conn, q, ids[0])
    assert [show(conn, j)["queue"] for j in ids] == [f"{q}-dead".encode(), q.encode(),
                                                      q.encode()]
    assert show(conn, ids[1])["deadletter-reason"] is None


# ---------------------------------------------------------------------------- defaults
def test_config_defaults_give_jobs_a_policy_and_an_empty_queue_name_is_refused(
        server: DisqueProcess) -> None:
    with Conn(server.port) as c:
        plain = add(c, "src", "before")
        assert c.cmd("CONFIG", "SET", "default-max-nacks", 2) == Status("OK")
        assert c.cmd("CONFIG", "SET", "deadletter-queue", "graveyard") == Status("OK")
        assert c.cmd("CONFIG", "SET", "deadletter-queue", "") == \
            Err("ERR Invalid argument '' for CONFIG SET 'deadletter-queue'")
        assert c.cmd("CONFIG", "GET", "deadletter-queue") == [b"deadletter-queue",
                                                              b"graveyard"]
        job_id = add(c, "src", "after")
        own = add(c, "src", "own", "MAXNACKS", 0, "DEADLETTER", "mine")
        assert len(c.cmd("SHOW", plain)) == 30  # jobs added before keep no policy
        s = show(c, job_id)
        assert (s["max-nacks"], s["deadletter-queue"]) == (2, b"graveyard")
        s = show(c, own)
        assert (s["max-nacks"], s["deadletter-queue"]) == (0, b"mine")  # options win
        # the default dead-letter queue may not be the job's own queue either
        assert c.cmd("ADDJOB", "graveyard", "x", 0) == \
            Err("ERR DEADLETTER queue must differ from the job's queue")
        c.cmd("GETJOB", "NOHANG", "COUNT", 10, "FROM", "src")
        for _ in range(2):
            assert c.cmd("NACK", job_id, own, plain) == 3
            c.cmd("GETJOB", "NOHANG", "COUNT", 10, "FROM", "src")
        assert show(c, job_id)["queue"] == b"graveyard"
        assert show(c, job_id)["deadletter-reason"] == b"max-nacks"
        assert [show(c, j)["queue"] for j in (own, plain)] == [b"src", b"src"]
        assert c.cmd("CONFIG", "SET", "default-max-nacks", 0) == Status("OK")
        assert len(c.cmd("SHOW", add(c, "src", "later"))) == 30


# ---------------------------------------------------------------------------- QSTAT, INFO
def test_qstat_has_20_items_until_a_job_was_dead_lettered_out_of_the_queue(conn: Conn,
                                                                          q: str) -> None:
    dead = f"{q}-dead"
    job_id = add(conn, q, "body", "MAXNACKS", 1, "DEADLETTER", dead)
    before = int(info(conn, "jobs")["deadlettered_jobs"])
    assert len(conn.cmd("QSTAT", q)) == 20
    nack_dead(conn, q, job_id)
    reply = conn.cmd("QSTAT", q)
    assert len(reply) == 22 and reply[-2:] == [b"deadlettered", 1]
    assert len(conn.cmd("QSTAT", dead)) == 20  # the dead-letter queue lost nothing
    assert qstat(conn, dead)["len"] == 1
    assert int(info(conn, "jobs")["deadlettered_jobs"]) == before + 1
    s = show(conn, job_id)
    assert (s["queue"], s["state"], s["nacks"]) == (dead.encode(), b"queued", 1)
    assert s["deadletter-reason"] == b"max-nacks" and s["deadletter-time"] > 0


# ---------------------------------------------------------------------------- REDRIVE
@pytest.mark.parametrize(("args", "error"), [
    (("COUNT", 0), "ERR COUNT must be a positive number"),
    (("COUNT", "x"), "ERR COUNT must be a positive number"),
    (("RATE", 0), "ERR RATE must be a positive number"),
    (("RATE", -5), "ERR RATE must be a positive number"),
    (("COUNT",), "ERR syntax error"),
    (("BOGUS",), "ERR syntax error"),
    (("ID",), "ERR syntax error"),
    (("ID", "not-an-id"), "BADID Invalid Job ID format."),
])
def test_redrive_errors(conn: Conn, q: str, args: tuple[Any, ...], error: str) -> None:
    assert conn.cmd("REDRIVE", q, *args) == Err(error)


def test_redrive_arity(conn: Conn) -> None:
    reply = conn.cmd("REDRIVE")
    assert isinstance(reply, Err) and "wrong number of arguments" in reply


def test_redrive_leaves_jobs_added_to_the_dead_letter_queue_directly(conn: Conn,
                                                                     q: str) -> None:
    dead = f"{q}-dead"
    direct = [add(conn, dead, f"direct{i}") for i in range(2)]
    dying = add(conn, q, "dying", "MAXNACKS", 1, "DEADLETTER", dead)
    nack_dead(conn, q, dying)
    assert conn.cmd("QLEN", dead) == 3
    assert conn.cmd("REDRIVE", dead, "ID", *direct) == 0
    assert conn.cmd("REDRIVE", dead, "RATE", 1000) == 3  # at most what is queued there
    wait_for(lambda: conn.cmd("QLEN", q) == 1)
    wait_for(lambda: info(conn, "jobs")["redrive_pending"] == "0")
    assert conn.cmd("QLEN", dead) == 2
    assert {j[1].decode() for j in conn.cmd("QPEEK", dead, 10)} == set(direct)
    s = show(conn, dying)
    assert (s["queue"], s["redrives"], s["nacks"], s["deadletter-reason"]) == \
        (q.encode(), 1, 1, None)
    assert conn.cmd("REDRIVE", f"{q}-nothing") == 0


# ---------------------------------------------------------------------------- AOF
def test_a_dead_job_and_a_job_with_a_policy_survive_a_restart(make_server) -> None:
    p = make_server(args=["--appendonly", "yes", "--appendfsync", "always"])
    with Conn(p.port) as c:
        dead = add(c, "src", "dies", "MAXNACKS", 1, "DEADLETTER", "dlq", "DEADTTL", 7200,
                   "TTL", 600, "RETRY", 3)
        alive = add(c, "src", "lives", "MAXDELIVERIES", 4, "DEADLETTER", "dlq", "RETRY", 3,
                    "BACKOFF", 60)
        c.cmd("GETJOB", "NOHANG", "FROM", "src")
        assert c.cmd("NACK", dead) == 1
        before = {j: show(c, j) for j in (dead, alive)}
    assert before[dead]["queue"] == b"dlq" and before[dead]["ttl"] > 7000
    assert before[alive]["backoff"] == 60
    p.kill()
    p.start()
    with Conn(p.port) as c:
        for job_id, s in before.items():
            after = show(c, job_id)
            assert after is not None, job_id
            for key in ("queue", "body", "nacks", "additional-deliveries", *DL_KEYS):
                assert after[key] == s[key], (job_id, key, after[key], s[key])
            assert after["state"] == b"active"  # requeued by its timer after a crash
            assert abs(after["ttl"] - s["ttl"]) <= 5  # DEADTTL's extension kept
        # still dead: its RETRY brings it back into the dead-letter queue, never to src
        wait_for(lambda: c.cmd("QLEN", "dlq") == 1 and c.cmd("QLEN", "src") == 1,
                 timeout=60)
        assert c.cmd("REDRIVE", "dlq", "ID", dead) == 1
        assert show(c, dead)["queue"] == b"src"


def test_a_job_whose_ttl_ends_alive_goes_to_its_dead_letter_queue_with_a_deadttl(
        conn: Conn, q: str) -> None:
    # original issue #95: a job nobody processed in time is kept for inspection
    kept = add(conn, q, "late", "TTL", 2, "RETRY", 1, "DEADTTL", 600,
               "DEADLETTER", f"{q}-dead")
    gone = add(conn, q, "gone", "TTL", 2, "RETRY", 1, "MAXNACKS", 5,
               "DEADLETTER", f"{q}-dead")  # a policy without DEADTTL: it expires
    plain_ttl = add(conn, q, "alone", "TTL", 2, "RETRY", 1, "DEADTTL", 600)  # default DLQ
    wait_for(lambda: conn.cmd("QLEN", q) == 0, timeout=10)
    s = show(conn, kept)
    assert (s["queue"], s["state"]) == (f"{q}-dead".encode(), b"queued")
    assert (s["deadletter-reason"], s["source-queue"]) == (b"expired", q.encode())
    assert s["ttl"] > 590
    assert show(conn, gone) is None
    assert show(conn, plain_ttl)["queue"] == b"deadletter"
    assert conn.cmd("QSTAT", q)[-2:] == [b"deadlettered", 2]
    # redriven, it is alive again in its source queue (until its extended TTL)
    assert conn.cmd("REDRIVE", f"{q}-dead", "ID", kept) == 1
    assert show(conn, kept)["queue"] == q.encode()
