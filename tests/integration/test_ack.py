"""ACKJOB, FASTACK, WORKING, NACK, ENQUEUE, DEQUEUE, DELJOB on a single node: counts returned,
state changes, ID validation (checklist §2 and §4; issue 3)."""

from __future__ import annotations

import pytest

from tests.harness import wait_for
from tests.integration.resp import Conn, Err, add, info, show

BADID = b"-BADID Invalid Job ID format.\r\n"
UNKNOWN_ID = "D-00000000-AAAAAAAAAAAAAAAAAAAAAAAA-05a1"   # well formed, never created
MULTI_ID_COMMANDS = ["ACKJOB", "FASTACK", "DELJOB", "ENQUEUE", "NACK", "DEQUEUE"]


# -- ID validation ---------------------------------------------------------------------------------

BAD_IDS = [
    "hello",
    "",
    "D-00000000-AAAAAAAAAAAAAAAAAAAAAAAA-05a",      # 39 chars
    "D-00000000-AAAAAAAAAAAAAAAAAAAAAAAA-05a10",    # 41 chars
    "X-00000000-AAAAAAAAAAAAAAAAAAAAAAAA-05a1",     # not D
    "D_00000000-AAAAAAAAAAAAAAAAAAAAAAAA-05a1",     # no dash at 1
    "D-00000000_AAAAAAAAAAAAAAAAAAAAAAAA-05a1",     # no dash at 10
    "D-00000000-AAAAAAAAAAAAAAAAAAAAAAAA_05a1",     # no dash at 35
    "DI4b895d5af4537526a2dd8d6c3f1cdd26e429b76705a0SQ",  # the old 48-char format
]


@pytest.mark.parametrize("bad", BAD_IDS)
@pytest.mark.parametrize("command", MULTI_ID_COMMANDS + ["SHOW", "WORKING"])
def test_malformed_job_id_is_badid(conn: Conn, command: str, bad: str) -> None:
    assert conn.call(command, bad) == BADID


@pytest.mark.parametrize("command", MULTI_ID_COMMANDS)
def test_multi_id_commands_validate_all_ids_before_acting(conn: Conn, q: str, command: str) -> None:
    job_id = add(conn, q)
    assert conn.call(command, job_id, "not-an-id") == BADID
    job = show(conn, job_id)
    assert job is not None and job["state"] == b"queued"
    assert conn.cmd("QLEN", q) == 1


def test_only_length_and_dash_positions_are_validated(conn: Conn) -> None:
    odd = "D-zzzzzzzz-!!!!!!!!!!!!!!!!!!!!!!!!-zzzz"
    assert conn.call("SHOW", odd) == b"$-1\r\n"
    assert conn.call("ACKJOB", odd) == b":0\r\n"


@pytest.mark.parametrize("command", MULTI_ID_COMMANDS)
def test_multi_id_commands_accept_zero_ids(conn: Conn, command: str) -> None:
    assert conn.call(command) == b":0\r\n"


@pytest.mark.parametrize("command", MULTI_ID_COMMANDS)
def test_unknown_well_formed_id_is_not_an_error(conn: Conn, command: str) -> None:
    assert conn.call(command, UNKNOWN_ID) == b":0\r\n"


# -- ACKJOB ----------------------------------------------------------------------------------------

def test_ackjob_removes_the_job_on_a_single_node(conn: Conn, q: str) -> None:
    job_id = add(conn, q)
    conn.cmd("GETJOB", "FROM", q)
    assert conn.call("ACKJOB", job_id) == b":1\r\n"
    assert conn.call("SHOW", job_id) == b"$-1\r\n"
    assert conn.call("ACKJOB", job_id) == b":0\r\n"


def test_show_of_an_acked_job_does_not_crash(conn: Conn, q: str) -> None:
    """Regression (original issue): addjob, getjob, ackjob, show crashed the server."""
    for _ in range(20):
        job_id = add(conn, q)
        conn.cmd("GETJOB", "FROM", q)
        conn.cmd("ACKJOB", job_id)
        assert conn.cmd("SHOW", job_id) is None
    assert conn.call("PING") == b"+PONG\r\n"


def test_ackjob_of_a_queued_job_removes_it_from_the_queue(conn: Conn, q: str) -> None:
    job_id = add(conn, q)
    assert conn.cmd("ACKJOB", job_id) == 1
    assert conn.cmd("QLEN", q) == 0
    assert conn.cmd("GETJOB", "NOHANG", "FROM", q) is None


def test_ackjob_counts_duplicates_once_and_skips_unknown(conn: Conn, q: str) -> None:
    a, b = add(conn, q), add(conn, q)
    assert conn.call("ACKJOB", a, a, b, UNKNOWN_ID, b) == b":2\r\n"


def test_acked_jobs_are_unregistered(conn: Conn, q: str) -> None:
    """Regression (original issue): memory was never reclaimed after ACK."""
    base = int(info(conn, "jobs")["registered_jobs"])
    ids = conn.pipeline([("ADDJOB", q, "x" * 100, "0") for _ in range(500)])
    assert int(info(conn, "jobs")["registered_jobs"]) == base + 500
    got = conn.cmd("GETJOB", "COUNT", "500", "FROM", q)
    assert len(got) == 500
    assert conn.cmd("ACKJOB", *ids) == 500
    assert int(info(conn, "jobs")["registered_jobs"]) == base


# -- FASTACK ---------------------------------------------------------------------------------------

def test_fastack_deletes_queued_and_active_jobs(conn: Conn, q: str) -> None:
    queued, active = add(conn, q), add(conn, q)
    conn.cmd("DEQUEUE", active)
    assert conn.call("FASTACK", queued, active, queued, UNKNOWN_ID) == b":2\r\n"
    assert conn.cmd("SHOW", queued) is None
    assert conn.cmd("SHOW", active) is None
    assert conn.cmd("QLEN", q) == 0
    assert conn.cmd("FASTACK", queued) == 0


# -- WORKING ---------------------------------------------------------------------------------------

def test_working_returns_the_retry_time(conn: Conn, q: str) -> None:
    job_id = add(conn, q, "b", "RETRY", "123")
    conn.cmd("GETJOB", "FROM", q)
    assert conn.call("WORKING", job_id) == b":123\r\n"


def test_working_on_retry_zero_job_returns_zero(conn: Conn, q: str) -> None:
    job_id = add(conn, q, "b", "RETRY", "0")
    conn.cmd("GETJOB", "FROM", q)
    assert conn.call("WORKING", job_id) == b":0\r\n"


def test_working_dequeues_a_queued_job(conn: Conn, q: str) -> None:
    job_id = add(conn, q, "b", "RETRY", "100")
    assert conn.cmd("WORKING", job_id) == 100
    assert conn.cmd("QLEN", q) == 0
    job = show(conn, job_id)
    assert job is not None and job["state"] == b"active"


def test_working_pushes_the_next_requeue_by_retry(conn: Conn, q: str) -> None:
    job_id = add(conn, q, "b", "RETRY", "100")
    conn.cmd("GETJOB", "FROM", q)
    assert conn.cmd("WORKING", job_id) == 100
    job = show(conn, job_id)
    assert job is not None
    assert 90_000 <= job["next-requeue-within"] <= 100_250


def test_working_unknown_job_is_nojob(conn: Conn) -> None:
    assert conn.call("WORKING", UNKNOWN_ID) == b"-NOJOB Job not known in the context of this node.\r\n"


def test_working_after_half_the_ttl_is_toolate(conn: Conn, q: str) -> None:
    job_id = add(conn, q, "b", "TTL", "4")
    conn.cmd("GETJOB", "FROM", q)
    assert conn.cmd("WORKING", job_id) == 1     # default retry: max(1, 4 // 10)

    def refused() -> bytes | None:
        raw = conn.call("WORKING", job_id)
        return None if raw == b":1\r\n" else raw

    raw = wait_for(refused, timeout=20, interval=0.05, what="WORKING refused after half TTL")
    assert raw == (b"-TOOLATE Half of job TTL already elapsed, you are no longer allowed to "
                   b"postpone the next delivery.\r\n")


def test_working_arity(conn: Conn) -> None:
    assert conn.call("WORKING") == b"-ERR wrong number of arguments for 'working' command\r\n"
    assert conn.call("WORKING", UNKNOWN_ID, UNKNOWN_ID) == (
        b"-ERR wrong number of arguments for 'working' command\r\n")


# -- NACK / ENQUEUE / DEQUEUE ----------------------------------------------------------------------

def test_nack_requeues_at_once_and_counts(conn: Conn, q: str) -> None:
    job_id = add(conn, q)
    conn.cmd("GETJOB", "FROM", q)
    assert conn.cmd("QLEN", q) == 0
    assert conn.call("NACK", job_id, job_id) == b":1\r\n"
    assert conn.cmd("QLEN", q) == 1
    job = show(conn, job_id)
    assert job is not None
    assert job["state"] == b"queued" and job["nacks"] == 1 and job["additional-deliveries"] == 0


def test_nack_of_a_queued_job_does_nothing(conn: Conn, q: str) -> None:
    job_id = add(conn, q)
    assert conn.cmd("NACK", job_id) == 0
    job = show(conn, job_id)
    assert job is not None and job["nacks"] == 0
    assert conn.cmd("QLEN", q) == 1


def test_enqueue_requeues_active_jobs_and_counts_deliveries(conn: Conn, q: str) -> None:
    job_id = add(conn, q)
    conn.cmd("GETJOB", "FROM", q)
    assert conn.call("ENQUEUE", job_id) == b":1\r\n"
    assert conn.cmd("ENQUEUE", job_id) == 0          # already queued
    conn.cmd("GETJOB", "FROM", q)
    assert conn.cmd("NACK", job_id) == 1
    job = show(conn, job_id)
    assert job is not None
    assert job["additional-deliveries"] == 1 and job["nacks"] == 1


def test_enqueue_cannot_requeue_an_at_most_once_job(conn: Conn, q: str) -> None:
    job_id = add(conn, q, "b", "RETRY", "0")
    conn.cmd("GETJOB", "FROM", q)
    assert conn.call("ENQUEUE", job_id) == b":0\r\n"
    assert conn.cmd("QLEN", q) == 0


def test_dequeue_returns_how_many_jobs_it_dequeued(conn: Conn, q: str) -> None:
    """Regression (original issue): DEQUEUE always answered 0."""
    a, b, c = add(conn, q), add(conn, q), add(conn, q)
    assert conn.call("DEQUEUE", a) == b":1\r\n"
    assert conn.call("DEQUEUE", b, c, b) == b":2\r\n"
    assert conn.cmd("QLEN", q) == 0
    assert conn.cmd("DEQUEUE", a, b, c) == 0
    for job_id in (a, b, c):
        job = show(conn, job_id)
        assert job is not None and job["state"] == b"active"
        assert isinstance(job["next-requeue-within"], int)   # keeps its requeue timer


def test_dequeue_does_not_count_as_jobs_out(conn: Conn, q: str) -> None:
    job_id = add(conn, q)
    conn.cmd("DEQUEUE", job_id)
    st = conn.cmd("QSTAT", q)
    assert st[st.index(b"jobs-out") + 1] == 0


def test_deljob_deletes_in_any_state(conn: Conn, q: str) -> None:
    queued, active = add(conn, q), add(conn, q)
    conn.cmd("DEQUEUE", active)
    assert conn.call("DELJOB", queued, active, active, UNKNOWN_ID) == b":2\r\n"
    assert conn.cmd("SHOW", queued) is None and conn.cmd("SHOW", active) is None
    assert conn.cmd("QLEN", q) == 0
    assert conn.cmd("DELJOB", queued) == 0


def test_deleted_job_cannot_be_acked_or_worked_on(conn: Conn, q: str) -> None:
    job_id = add(conn, q)
    conn.cmd("DELJOB", job_id)
    assert conn.cmd("ACKJOB", job_id) == 0
    reply = conn.cmd("WORKING", job_id)
    assert isinstance(reply, Err) and reply.startswith("NOJOB"), reply
