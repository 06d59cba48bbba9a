"""Regression tests for bugs and requests filed against the original Disque (single node).

One test (or two) per row of docs/original-bugs.md owned by issue 3. Each test is named after
the behaviour disque-py must have and carries a one-line comment naming the original report.
Exact reply strings come from ../shared/spec/checklist.md.
"""

from __future__ import annotations

import socket
import struct
from concurrent.futures import ThreadPoolExecutor

import pytest
import redis

from disque.client.errors import error_from_redis
from tests.harness import DisqueProcess, wait_for

# -- helpers -----------------------------------------------------------------------------------


def resp(*args: str | bytes) -> bytes:
    """Encode one RESP multibulk request."""
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        b = a if isinstance(a, bytes) else str(a).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(b), b))
    return b"".join(out)


def error_reply(client: redis.Redis, *args: str | bytes) -> str:
    """Run a command that must fail and give back the server's error line, e.g. '-ERR syntax error'."""
    with pytest.raises(redis.ResponseError) as info:
        client.execute_command(*args)
    return f"-{error_from_redis(info.value)}"  # the prefix redis-py may have cut off, back


def show(client: redis.Redis, job_id: str) -> dict | None:
    reply = client.execute_command("SHOW", job_id)
    if reply is None:
        return None
    return dict(zip(reply[0::2], reply[1::2], strict=True))


def config_get(client: redis.Redis, pattern: str) -> dict:
    """CONFIG GET as a dict, whether the reply is the flat RESP2 array or a RESP3 map."""
    reply = client.execute_command("CONFIG", "GET", pattern)
    if isinstance(reply, dict):
        return reply
    return dict(zip(reply[0::2], reply[1::2], strict=True))


def blocked_clients(client: redis.Redis) -> int:
    return int(client.info("clients")["blocked_clients"])


def addjob(client: redis.Redis, queue: str, body: str | bytes = "body", *opts: str) -> str:
    job_id = client.execute_command("ADDJOB", queue, body, 0, *opts)
    return job_id.decode() if isinstance(job_id, bytes) else job_id


def scan_all(client: redis.Redis, command: str, *opts: str) -> list:
    """Iterate QSCAN/JSCAN with its cursor until it comes back to 0."""
    cursor, items = "0", []
    while True:
        cursor, batch = client.execute_command(command, cursor, *opts)
        items.extend(batch)
        if str(cursor) == "0":
            return items


# -- rows owned by issue 3 ---------------------------------------------------------------------


def test_getjob_count_zero_is_an_error(server: DisqueProcess) -> None:
    # Original: "Getting 0 jobs out of a non-empty queue succeeds" (GETJOB COUNT 0 acted as COUNT 1).
    c = server.client(decode_responses=True)
    addjob(c, "test_queue", "foo")
    for count in ("0", "-1", "abc"):
        assert error_reply(c, "GETJOB", "COUNT", count, "FROM", "test_queue") == \
            "-ERR COUNT must be a number greater than zero"
    assert c.execute_command("QLEN", "test_queue") == 1


def test_memory_reclaimed_after_ack(server: DisqueProcess) -> None:
    # Original: "Disque doesn't seem to reclaim memory" (GETJOB/ACKJOB/ADDJOB cycles grew to 800 MB).
    c = server.client()
    bodies = [b"", bytes([209, 100, 0, 105, 182, 14, 6, 2, 62]), bytes([39, 157, 129, 26, 95, 242, 121]),
              bytes([232, 223, 179, 218, 130, 58]), b"", bytes([237, 158, 171, 168, 97]),
              bytes([63, 126]), bytes([61, 96, 195, 99, 167, 139])]

    def rounds(n: int) -> None:
        for _ in range(n):
            jobs = c.execute_command("GETJOB", "NOHANG", "COUNT", 100, "FROM", "test_queue") or []
            if jobs:
                assert c.execute_command("ACKJOB", *[j[1] for j in jobs]) == len(jobs)
            assert c.execute_command("QLEN", "test_queue") == 0
            pipe = c.pipeline(transaction=False)
            for body in bodies:
                pipe.execute_command("ADDJOB", "test_queue", body, 300)
            replies = pipe.execute(raise_on_error=False)
            assert not [r for r in replies if isinstance(r, Exception)], replies

    rounds(300)
    used_before = int(c.info("memory")["used_memory"])
    rounds(3000)  # 24,000 more jobs added and acked
    used_after = int(c.info("memory")["used_memory"])
    assert used_after - used_before < 2 * 1024 * 1024, (used_before, used_after)
    jobs = c.execute_command("GETJOB", "NOHANG", "COUNT", 100, "FROM", "test_queue")
    assert c.execute_command("ACKJOB", *[j[1] for j in jobs]) == 8
    assert int(c.info("jobs")["registered_jobs"]) == 0


def test_huge_declared_lengths_are_refused_without_allocating(server: DisqueProcess) -> None:
    # Original: "Code errors discovered by static analysis" (unchecked allocations crash on OOM).
    c = server.client(decode_responses=True)
    rss_before = int(c.info("memory")["used_memory_rss"])
    cases = [
        (b"*2\r\n$4\r\nPING\r\n$9999999999\r\n", b"-ERR Protocol error: invalid bulk length"),
        (b"*9999999999\r\n", b"-ERR Protocol error: invalid multibulk length"),
    ]
    for payload, expected in cases:
        with socket.create_connection(("127.0.0.1", server.port), timeout=5) as s:
            s.sendall(payload)
            data = b""
            while True:  # read until the server closes the connection (the timeout fails the test)
                chunk = s.recv(65536)
                if not chunk:
                    break
                data += chunk
        assert data.startswith(expected), data
    assert c.ping()
    rss_after = int(c.info("memory")["used_memory_rss"])
    assert rss_after - rss_before < 64 * 1024 * 1024, (rss_before, rss_after)


def test_dequeue_returns_number_of_jobs_dequeued(server: DisqueProcess) -> None:
    # Original: "dequeue always return 0" (jobs left the queue but DEQUEUE replied 0).
    c = server.client(decode_responses=True)
    ids = [addjob(c, "test", "test") for _ in range(3)]
    assert c.execute_command("DEQUEUE", ids[0]) == 1
    assert c.execute_command("DEQUEUE", ids[1], ids[2]) == 2
    assert c.execute_command("QLEN", "test") == 0
    assert c.execute_command("DEQUEUE", *ids) == 0  # already active: not counted
    assert c.execute_command("ENQUEUE", ids[0]) == 1
    assert c.execute_command("DEQUEUE", ids[0], ids[0]) == 1  # duplicates count once


def test_qscan_minlen_maxlen_are_inclusive_and_busyloop_returns_all(server: DisqueProcess) -> None:
    # Original: "QSCAN command proposal" (cursor iterator with MINLEN/MAXLEN filters and a full scan).
    c = server.client(decode_responses=True)
    for n in (1, 2, 3):
        for _ in range(n):
            addjob(c, f"q{n}")
    cursor, names = c.execute_command("QSCAN", "BUSYLOOP")
    assert str(cursor) == "0"
    assert sorted(names) == ["q1", "q2", "q3"]
    assert sorted(scan_all(c, "QSCAN", "MINLEN", "2")) == ["q2", "q3"]
    assert sorted(scan_all(c, "QSCAN", "MAXLEN", "2")) == ["q1", "q2"]
    assert sorted(scan_all(c, "QSCAN", "MINLEN", "2", "MAXLEN", "2")) == ["q2"]


def test_qscan_cursor_returns_every_queue_while_queues_are_added(server: DisqueProcess) -> None:
    # Original: "QSCAN test is missing" (no test of the cursor's full-iteration guarantee).
    c = server.client(decode_responses=True)
    pipe = c.pipeline(transaction=False)
    for i in range(512):
        pipe.execute_command("ADDJOB", f"queue:{i}", "x", 0)
    pipe.execute()
    seen: set[str] = set()
    cursor, extra = "0", 0
    while True:
        cursor, batch = c.execute_command("QSCAN", cursor, "COUNT", 10)
        seen.update(batch)
        addjob(c, f"late:{extra}")  # the queue set changes during the scan
        extra += 1
        if str(cursor) == "0":
            break
    assert {f"queue:{i}" for i in range(512)} <= seen


def test_nack_puts_job_back_at_once(server: DisqueProcess) -> None:
    # Original: "NACKJOB (re-queue) and WAITJOB" (asked for an immediate re-queue on failure).
    c = server.client(decode_responses=True)
    job_id = addjob(c, "q", "work", "RETRY", "300")
    [[_, got_id, _]] = c.execute_command("GETJOB", "NOHANG", "FROM", "q")
    assert got_id == job_id
    assert c.execute_command("QLEN", "q") == 0
    assert c.execute_command("NACK", job_id) == 1
    assert c.execute_command("QLEN", "q") == 1
    [job] = c.execute_command("GETJOB", "NOHANG", "WITHCOUNTERS", "FROM", "q")
    assert job[1] == job_id and job[3] == "nacks" and job[4] == 1


def test_getjob_queue_names_are_literal_not_patterns(server: DisqueProcess) -> None:
    # Original: "Support for topic subscription" (pattern-matching consumers were requested).
    c = server.client(decode_responses=True)
    job_id = addjob(c, "host1.cpu.idle", "42")
    assert c.execute_command("GETJOB", "NOHANG", "FROM", "?.cpu.idle") is None
    assert c.execute_command("GETJOB", "NOHANG", "FROM", "*") is None
    assert c.execute_command("QLEN", "*") == 0
    assert c.execute_command("QLEN", "host1.cpu.idle") == 1
    [[queue, got_id, _]] = c.execute_command("GETJOB", "NOHANG", "FROM", "host1.cpu.idle")
    assert (queue, got_id) == ("host1.cpu.idle", job_id)


def test_additional_deliveries_counted_after_retry_requeue(server: DisqueProcess) -> None:
    # Original: "Expired items queue -- dead letter queue" (workers need to spot poison jobs).
    c = server.client(decode_responses=True)
    job_id = addjob(c, "q", "poison", "RETRY", "1")
    assert c.execute_command("GETJOB", "NOHANG", "FROM", "q")[0][1] == job_id
    wait_for(lambda: c.execute_command("QLEN", "q") == 1, timeout=15, what="retry re-queue")
    [job] = c.execute_command("GETJOB", "NOHANG", "WITHCOUNTERS", "FROM", "q")
    assert job == ["q", job_id, "poison", "nacks", 0, "additional-deliveries", 1]


def test_retry_limit_is_left_to_workers_via_counters(server: DisqueProcess) -> None:
    # Original: "A home for dead jobs and retry limit" (asked for RETRYLIMIT / FAILURE options).
    c = server.client(decode_responses=True)
    assert error_reply(c, "ADDJOB", "emailnotify", "info here", 0, "RETRY", 120, "RETRYLIMIT", 5,
                       "FAILURE", "emailnotifydead") == "-ERR syntax error"
    job_id = addjob(c, "emailnotify", "info here", "RETRY", "120")
    for expected_nacks in range(4):
        [job] = c.execute_command("GETJOB", "NOHANG", "WITHCOUNTERS", "FROM", "emailnotify")
        assert job[1] == job_id and job[4] == expected_nacks
        if expected_nacks < 3:
            assert c.execute_command("NACK", job_id) == 1
    # the worker decides: after 3 NACKs the job goes to its own failure queue
    addjob(c, "emailnotifydead", "info here")
    assert c.execute_command("ACKJOB", job_id) == 1
    assert c.execute_command("QLEN", "emailnotifydead") == 1


def test_show_of_acked_job_does_not_crash(server: DisqueProcess) -> None:
    # Original: "crash when SHOW of acked job" (ADDJOB, GETJOB, ACKJOB, SHOW -> segfault).
    c = server.client(decode_responses=True)
    job_id = addjob(c, "q")
    c.execute_command("GETJOB", "FROM", "q")
    assert c.execute_command("ACKJOB", job_id) == 1
    assert c.execute_command("SHOW", job_id) is None
    assert c.execute_command("ACKJOB", job_id) == 0
    assert c.execute_command("SHOW", job_id) is None
    queued_id = addjob(c, "q")  # acked while still queued, SHOW in the same pipeline
    pipe = c.pipeline(transaction=False)
    pipe.execute_command("ACKJOB", queued_id)
    pipe.execute_command("SHOW", queued_id)
    assert pipe.execute() == [1, None]
    assert c.ping()


def test_blocked_client_disconnect_does_not_crash(server: DisqueProcess) -> None:
    # Original: "Segfault when removing client from blocked list" (unblocking a GETJOB client).
    c = server.client(decode_responses=True)
    requests = [
        ("GETJOB", "TIMEOUT", "0", "FROM", "q1", "q2", "q1"),
        ("GETJOB", "FROM", "q1"),
        ("GETJOB", "TIMEOUT", "60000", "FROM", "q2", "q1"),
        ("GETJOB", "COUNT", "5", "FROM", "q2"),
    ]
    socks = []
    for req in requests:
        s = socket.create_connection(("127.0.0.1", server.port), timeout=5)
        s.sendall(resp(*req))
        socks.append(s)
    wait_for(lambda: blocked_clients(c) == len(requests), what="4 blocked GETJOB clients")
    for i, s in enumerate(socks):
        if i % 2 == 0:  # half of them reset the connection instead of closing it
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        s.close()
    wait_for(lambda: blocked_clients(c) == 0, what="blocked clients to go away")
    id1, id2 = addjob(c, "q1"), addjob(c, "q2")
    assert c.execute_command("QLEN", "q1") == 1  # not handed to a dead client
    assert c.execute_command("QLEN", "q2") == 1
    got = c.execute_command("GETJOB", "NOHANG", "COUNT", 2, "FROM", "q1", "q2")
    assert sorted(j[1] for j in got) == sorted([id1, id2])
    assert c.ping()


def test_blocked_getjob_timeouts_on_repeated_queues_do_not_crash(server: DisqueProcess) -> None:
    # Original: "Segfault when removing client from blocked list" (crash in the GETJOB timeout path).
    c = server.client(decode_responses=True)

    def worker(_: int) -> list:
        w = server.client(decode_responses=True)
        return [w.execute_command("GETJOB", "TIMEOUT", 200, "FROM", "qa", "qb", "qa")
                for _ in range(3)]

    with ThreadPoolExecutor(max_workers=6) as pool:
        results = list(pool.map(worker, range(6)))
    assert results == [[None, None, None]] * 6
    wait_for(lambda: blocked_clients(c) == 0, what="no blocked clients")
    job_id = addjob(c, "qa")
    assert c.execute_command("QLEN", "qa") == 1
    assert c.execute_command("GETJOB", "NOHANG", "FROM", "qb", "qa")[0][1] == job_id
    assert c.ping()


def test_working_postpones_requeue_and_replies_retry_seconds(server: DisqueProcess) -> None:
    # Original: "WORKING command" request (reset the retry timer of a job still being processed).
    c = server.client(decode_responses=True)
    job_id = addjob(c, "q", "long task", "RETRY", "123")
    c.execute_command("GETJOB", "FROM", "q")
    assert c.execute_command("WORKING", job_id) == 123
    within = show(c, job_id)["next-requeue-within"]
    assert 123_000 - 1_000 <= within <= 123_000 + 250
    queued_id = addjob(c, "q", "other", "RETRY", "123")
    assert c.execute_command("WORKING", queued_id) == 123  # a queued job is taken out of the queue
    assert c.execute_command("QLEN", "q") == 0
    unknown = "D-00000000-AAAAAAAAAAAAAAAAAAAAAAAA-05a1"
    assert error_reply(c, "WORKING", unknown) == "-NOJOB Job not known in the context of this node."
    assert error_reply(c, "WORKING", "not-an-id") == "-BADID Invalid Job ID format."


def test_working_refused_after_half_the_ttl(server: DisqueProcess) -> None:
    # Original: "WORKING command" request (postponing must stop at half of the job's TTL).
    c = server.client(decode_responses=True)
    job_id = addjob(c, "q", "task", "TTL", "4", "RETRY", "1")
    c.execute_command("GETJOB", "FROM", "q")
    assert c.execute_command("WORKING", job_id) == 1

    def too_late() -> bool:
        try:
            c.execute_command("WORKING", job_id)
        except redis.ResponseError as exc:
            assert str(exc) == ("TOOLATE Half of job TTL already elapsed, you are no longer "
                                "allowed to postpone the next delivery.")
            return True
        return False

    wait_for(too_late, timeout=10, what="WORKING to be refused")


def test_queue_idle_eviction_time_is_configurable(server: DisqueProcess) -> None:
    # Original: "Configurable QUEUE_MAX_IDLE_TIME" (empty queues were kept for a fixed 300 s).
    c = server.client(decode_responses=True)
    params = [p for p in config_get(c, "*") if "idle" in p and "queue" in p]
    assert len(params) == 1, f"expected one CONFIG parameter for the queue idle time, got {params}"
    c.execute_command("CONFIG", "SET", params[0], "1")
    assert config_get(c, params[0]) == {params[0]: "1"}
    job_id = addjob(c, "transient")
    c.execute_command("GETJOB", "FROM", "transient")
    c.execute_command("ACKJOB", job_id)
    assert c.execute_command("PAUSE", "kept", "in") == "in"
    wait_for(lambda: c.execute_command("QSTAT", "transient") is None, timeout=20,
             what="the idle empty queue to be collected")
    assert c.execute_command("QSTAT", "kept") is not None  # paused queues are never collected


def test_updatejob_is_an_unknown_command_jobs_are_immutable(server: DisqueProcess) -> None:
    # Original: "UPDATEJOB jobid value [options]" request (change a job in place).
    c = server.client(decode_responses=True)
    job_id = addjob(c, "q", "v1")
    assert error_reply(c, "UPDATEJOB", job_id, "v2") == "-ERR unknown command 'UPDATEJOB'"
    assert show(c, job_id)["body"] == "v1"


def test_qlen_counts_only_deliverable_jobs(server: DisqueProcess) -> None:
    # Original: "Disque can report a QLEN higher than the number of available jobs" (9 after 8 adds).
    c = server.client()
    delayed = addjob(c, "test_queue", b"later", "DELAY", "3600")
    dequeued = addjob(c, "test_queue", b"held")
    assert c.execute_command("DEQUEUE", dequeued) == 1
    bodies = [b"", b"\xd1d\x00i\xb6\x0e\x06\x02>", b"'\x9d\x81\x1a_\xf2y", b"\xe8\xdf\xb3\xda\x82:",
              b"", b"\xed\x9e\xab\xa8a", b"?~", b"=`\xc3c\xa7\x8b"]
    for _ in range(300):
        pipe = c.pipeline(transaction=False)
        for body in bodies:
            pipe.execute_command("ADDJOB", "test_queue", body, 300)
        pipe.execute_command("QLEN", "test_queue")
        pipe.execute_command("QPEEK", "test_queue", 100)
        *_, qlen, peek = pipe.execute()
        assert qlen == 8 and len(peek) == 8
        jobs = c.execute_command("GETJOB", "NOHANG", "COUNT", 100, "FROM", "test_queue")
        assert len(jobs) == 8
        assert c.execute_command("QLEN", "test_queue") == 0
        assert c.execute_command("ACKJOB", *[j[1] for j in jobs]) == 8
        assert c.execute_command("QLEN", "test_queue") == 0
    assert c.execute_command("ACKJOB", delayed, dequeued) == 2


def test_blocked_getjob_returns_as_soon_as_a_job_is_added(server: DisqueProcess) -> None:
    # Original: "GETJOB command failed to return" (GETJOB COUNT 1 FROM queue1 hung in the CLI).
    c = server.client(decode_responses=True)
    consumer = server.client(decode_responses=True, socket_timeout=10)
    queued = addjob(c, "queue1", "ready")
    assert consumer.execute_command("GETJOB", "COUNT", 1, "FROM", "queue1") == \
        [["queue1", queued, "ready"]]
    with ThreadPoolExecutor(max_workers=1) as pool:
        fut = pool.submit(consumer.execute_command, "GETJOB", "COUNT", "1", "FROM", "queue1")
        wait_for(lambda: blocked_clients(c) == 1, what="GETJOB to block")
        added = addjob(c, "queue1", "late")
        assert fut.result(timeout=10) == [["queue1", added, "late"]]
    assert blocked_clients(c) == 0


def test_jscan_queue_filter_after_acks_and_deletes_does_not_crash(server: DisqueProcess) -> None:
    # Original: "Segfault" in JSCAN 0 COUNT 1000 QUEUE queue17 (a job without a queue was compared).
    c = server.client(decode_responses=True)
    ids = {i: addjob(c, f"queue{i % 20}", f"b{i}") for i in range(60)}
    live = dict(ids)
    got = c.execute_command("GETJOB", "NOHANG", "COUNT", 3, "FROM", "queue17", "queue3", "queue5")
    got_ids = [j[1] for j in got]
    assert c.execute_command("ACKJOB", got_ids[0]) == 1
    assert c.execute_command("FASTACK", ids[6]) == 1
    assert c.execute_command("DELJOB", ids[7]) == 1
    assert c.execute_command("DEQUEUE", ids[8]) == 1
    assert c.execute_command("ENQUEUE", got_ids[1]) == 1
    c.execute_command("ACKJOB", "D-00000000-AAAAAAAAAAAAAAAAAAAAAAAA-05a1")  # unknown id
    for gone in (got_ids[0], ids[6], ids[7]):
        live = {k: v for k, v in live.items() if v != gone}
    assert sorted(scan_all(c, "JSCAN", "COUNT", "1000")) == sorted(live.values())
    expected = sorted(v for k, v in live.items() if k % 20 == 17)
    assert sorted(scan_all(c, "JSCAN", "COUNT", "1000", "QUEUE", "queue17")) == expected
    assert scan_all(c, "JSCAN", "COUNT", "1000", "QUEUE", "no-such-queue") == []
    assert c.ping()


def test_paused_queue_keeps_jobs_until_resumed(server: DisqueProcess) -> None:
    # Original: "Pause a queue" request (halt consumption without stopping the workers).
    c = server.client(decode_responses=True)
    consumer = server.client(decode_responses=True)
    assert c.execute_command("PAUSE", "q", "out") == "out"
    job_id = addjob(c, "q")
    assert c.execute_command("GETJOB", "NOHANG", "FROM", "q") is None
    assert c.execute_command("QLEN", "q") == 1
    with ThreadPoolExecutor(max_workers=1) as pool:
        fut = pool.submit(consumer.execute_command, "GETJOB", "TIMEOUT", "10000", "FROM", "q")
        wait_for(lambda: blocked_clients(c) == 1, what="GETJOB to block on the paused queue")
        assert c.execute_command("PAUSE", "q", "none") == "none"
        assert fut.result(timeout=10) == [["q", job_id, "body"]]
    assert c.execute_command("PAUSE", "q", "in") == "in"
    assert error_reply(c, "ADDJOB", "q", "b", 0) == "-PAUSED Queue paused in input, try later"
    assert c.execute_command("PAUSE", "q", "state") == "in"


def test_maxlen_refuses_when_queue_holds_n_jobs(server: DisqueProcess) -> None:
    # Original: "ADDJOB MAXLEN Off-by-One Error" (MAXLEN 1 refused the third job, not the second).
    c = server.client(decode_responses=True)
    refusal = "-MAXLEN Queue is already longer than the specified MAXLEN count"
    c.execute_command("ADDJOB", "foo", "bar", 1000, "MAXLEN", 1)
    assert error_reply(c, "ADDJOB", "foo", "bar", 1000, "MAXLEN", 1) == refusal
    assert c.execute_command("QLEN", "foo") == 1
    c.execute_command("ADDJOB", "foo", "bar", 1000, "MAXLEN", 2)
    assert error_reply(c, "ADDJOB", "foo", "bar", 1000, "MAXLEN", 2) == refusal
    assert c.execute_command("QLEN", "foo") == 2


def test_withcounters_reports_nacks_and_additional_deliveries(server: DisqueProcess) -> None:
    # Original: "NACK and dead letters, recap and proposal" (NACK plus best-effort counters).
    c = server.client(decode_responses=True)
    job_id = addjob(c, "q", "payload")
    c.execute_command("GETJOB", "FROM", "q")
    assert c.execute_command("ENQUEUE", job_id) == 1
    c.execute_command("GETJOB", "FROM", "q")
    assert c.execute_command("NACK", job_id) == 1
    [job] = c.execute_command("GETJOB", "WITHCOUNTERS", "FROM", "q")
    assert job == ["q", job_id, "payload", "nacks", 1, "additional-deliveries", 1]


def test_delivered_at_most_once_job_is_never_requeued(server: DisqueProcess) -> None:
    # Original: "When a job with retry set to 0 gets dequeued, it should be removed" (proposal).
    c = server.client(decode_responses=True)
    job_id = addjob(c, "q", "once", "RETRY", "0")
    assert int(job_id[-4:], 16) % 2 == 0  # at-most-once jobs carry an even TTL field
    assert c.execute_command("GETJOB", "FROM", "q")[0][1] == job_id
    assert c.execute_command("ENQUEUE", job_id) == 0
    assert c.execute_command("NACK", job_id) == 0
    assert c.execute_command("QLEN", "q") == 0
    info = show(c, job_id)
    assert info["state"] == "active" and info["next-requeue-within"] is None
    assert c.execute_command("ACKJOB", job_id) == 1
