"""disque.client against a real node: every method, in RESP3 (redis-py's default) and RESP2,
the asyncio twin, pipelined add_jobs with DEDUP, the consume helper (ACK, NACK,
WORKING, stop), and the dead-letter side (a policy on add_job / add_jobs, SHOW's extra
fields, redrive)."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from collections.abc import Awaitable, Callable, Iterator

import pytest

from disque.client import (
    AsyncClient,
    BadIdError,
    Client,
    DisqueConnectionError,
    DisqueError,
    Job,
    MaxLenError,
    NoJobError,
    NoReplicationError,
    PausedError,
    TooLateError,
)
from tests.harness import DisqueProcess, free_port, wait_for
from tests.integration.resp import JOB_ID_RE, Conn, blocked_on
from tests.threads import Background

UNKNOWN_ID = "D-00000000-000000000000000000000000-05a1"


@pytest.fixture(params=[3, 2], ids=["resp3", "resp2"])
def client(node: DisqueProcess, request: pytest.FixtureRequest) -> Iterator[Client]:
    c = Client([f"127.0.0.1:{node.port}"], protocol=request.param)
    try:
        yield c
    finally:
        c.close()


def test_connects_through_hello_and_knows_the_node_id(client: Client, node: DisqueProcess):
    n = client.connect()
    assert n.port == node.port
    myid = node.client().execute_command("CLUSTER", "MYID").decode()
    assert client.node_id == myid
    hello = client.hello()
    assert hello.node_id == myid and [e.port for e in hello.nodes] == [node.port]


def test_url_form_and_unreachable_seeds_are_skipped(node: DisqueProcess):
    dead = free_port()
    with Client(f"disque://127.0.0.1:{dead},127.0.0.1:{node.port}") as c:
        for _ in range(5):  # whatever random order: the live node is found
            c.node = None
            assert c.connect().port == node.port


def test_no_reachable_node_is_a_connection_error():
    with Client([f"127.0.0.1:{free_port()}"]) as c, pytest.raises(DisqueConnectionError):
        c.ping()


def test_add_get_ack(client: Client, q: str):
    job_id = client.add_job(q, b"hello", retry=10)
    assert JOB_ID_RE.match(job_id)
    assert client.qlen(q) == 1
    [job] = client.get_job(q, timeout=1000)
    assert job == Job(q, job_id, b"hello")
    assert job.node_prefix == client.node_id[:8]  # type: ignore[index]
    assert client.ack_job(job.id) == 1
    assert client.show(job.id) is None


def test_add_job_options_reach_the_node(client: Client, q: str):
    job_id = client.add_job(q, "body", 0, ttl=3600, retry=60, delay=30, replicate=1,
                            async_=True)
    show = client.show(job_id)
    assert show is not None
    assert (show["ttl"] <= 3600, show["retry"], show["delay"], show["state"]) == (
        True, 60, 30, "active")
    assert show["body"] == b"body" and show["queue"] == q


def test_get_job_counts_nohang_timeout_and_counters(client: Client, q: str):
    ids = [client.add_job(q, f"b{i}") for i in range(3)]
    jobs = client.get_job(q, count=2, with_counters=True)
    assert [j.id for j in jobs] == ids[:2]
    assert all(j.nacks == 0 and j.additional_deliveries == 0 for j in jobs)
    assert client.nack(jobs[0].id) == 1
    [again] = client.get_job(q, count=1, with_counters=True)
    assert again.id == ids[0] and again.nacks == 1
    assert [j.id for j in client.get_job(q, nohang=True, count=5)] == [ids[2]]
    assert client.get_job(q, nohang=True) == []
    t0 = time.monotonic()
    assert client.get_job(q, timeout=100) == []
    assert time.monotonic() - t0 >= 0.09


def test_blocking_get_job_outlasts_the_socket_timeout(node: DisqueProcess, q: str):
    with Client([f"127.0.0.1:{node.port}"], socket_timeout=0.2) as c:
        assert c.get_job(q, timeout=600) == []  # no read timeout before the node answers
        with Client([f"127.0.0.1:{node.port}"]) as other, Conn(node.port) as probe:
            def add_late() -> str:
                wait_for(lambda: blocked_on(probe, q) == 1, what="the GETJOB blocked")
                time.sleep(0.4)  # the scenario: blocked for twice the socket timeout
                return other.add_job(q, b"late")

            producer = Background(add_late)
            [job] = c.get_job(q)  # blocks (TIMEOUT 0) until the job comes
            assert job.body == b"late"
            assert producer.result(timeout=30) == job.id


def test_fast_ack_del_job_enqueue_dequeue(client: Client, q: str):
    a, b, c = (client.add_job(q, x) for x in ("a", "b", "c"))
    assert client.dequeue(a) == 1 and client.qlen(q) == 2
    assert client.enqueue(a) == 1 and client.qlen(q) == 3
    assert client.del_job(b) == 1 and client.show(b) is None
    assert client.fast_ack(c, UNKNOWN_ID) == 1
    assert client.ack_job() == 0


def test_working_returns_retry_and_errors_are_typed(client: Client, q: str):
    job_id = client.add_job(q, "w", retry=7)
    client.get_job(q)
    assert client.working(job_id) == 7
    with pytest.raises(NoJobError):
        client.working(UNKNOWN_ID)
    with pytest.raises(BadIdError):
        client.ack_job("not-an-id")
    short = client.add_job(q, "short", ttl=2, retry=1)
    wait_for(lambda: client.show(short)["ttl"] < 1, timeout=5, what="half the TTL")  # type: ignore[index]
    with pytest.raises(TooLateError):
        client.working(short)


def test_queue_commands(client: Client, q: str):
    ids = [client.add_job(q, f"p{i}") for i in range(3)]
    assert [j.id for j in client.qpeek(q, 2)] == ids[:2]
    assert [j.id for j in client.qpeek(q, -1)] == ids[2:]
    stat = client.qstat(q)
    assert stat is not None and stat["name"] == q and stat["len"] == 3 and stat["pause"] == "none"
    assert client.qstat(q + "-none") is None
    assert client.pause(q, "in") == "in"
    with pytest.raises(PausedError):
        client.add_job(q, "x")
    assert client.pause(q, "state") == "in"
    assert client.pause(q, "none") == "none"
    with pytest.raises(MaxLenError):
        client.add_job(q, "x", maxlen=3)
    with pytest.raises(NoReplicationError):
        client.add_job(q, "x", replicate=2)


def test_scans_iterate_every_page(client: Client, q: str):
    ids = {client.add_job(q, f"s{i}") for i in range(250)}
    assert q in set(client.qscan(count=2))
    assert q in set(client.qscan(minlen=250))
    assert set(client.jscan(queue=q, count=10)) == ids
    shows = list(client.jscan(queue=q, states=["queued"], reply="all"))
    assert {s["id"] for s in shows} == ids and all(s["body"].startswith(b"s") for s in shows)


def test_info_ping_and_raw_commands(client: Client):
    info = client.info()
    assert "disque_version" in info and isinstance(info["tcp_port"], int)
    assert set(client.info("jobs")) == {"registered_jobs", "deadlettered_jobs",
                                        "redriven_jobs", "redrive_pending",
                                        "rereplication_nodes", "rereplication_pending",
                                        "rereplicated_jobs", "rereplication_unlisted",
                                        "rereplication_rechecks", "rereplication_rechecked",
                                        "rereplication_left",
                                        "underreplicated_jobs",
                                        "repaired_jobs", "overflow_status", "overflow_jobs",
                                        "overflow_bytes", "overflow_file_bytes", "overflow_written_jobs", "overflow_read_jobs", "overflow_spills"}
    assert client.ping() == "PONG"
    assert client.execute_command("ECHO", "hi") == b"hi"
    with pytest.raises(DisqueError) as exc:
        client.execute_command("NOSUCHCOMMAND")
    assert exc.value.prefix == "ERR"


def test_add_jobs_pipelines_and_reports_per_job_errors(client: Client, q: str):
    result = client.add_jobs(q, [b"a", b"b", b"c", b"d"], maxlen=2, batch_size=3)
    assert result.ids[:2] == [i for i in result.ids[:2] if i and JOB_ID_RE.match(i)]
    assert result.ids[2:] == [None, None]
    assert [type(e) for e in result.errors] == [type(None), type(None), MaxLenError,
                                                MaxLenError]
    assert (result.added, result.failed) == (2, 2)
    assert client.qlen(q) == 2


def test_add_jobs_with_dedup_keys_answers_known_keys_with_the_first_id(client: Client, q: str):
    keys = [f"k{i}" for i in range(1000)]
    first = client.add_jobs(q, [f"v{i}".encode() for i in range(1000)], dedup_keys=keys)
    assert first.ok and len(set(first.ids)) == 1000
    again = client.add_jobs(q, [b"other"] * 1000, dedup_keys=keys)
    assert again.ids == first.ids
    assert client.qlen(q) == 1000
    # even after the job was acknowledged, within its TTL
    client.ack_job(first.ids[0])  # type: ignore[arg-type]
    assert client.add_job(q, "x", dedup="k0") == first.ids[0]
    assert client.qlen(q) == 999


def test_add_jobs_many_round_trips_keep_the_order(client: Client, q: str):
    bodies = [str(i).encode() for i in range(2500)]
    result = client.add_jobs(q, bodies, batch_size=1000)
    assert result.ok
    jobs = client.get_job(q, count=2500)
    assert [j.body for j in jobs] == bodies
    assert [j.id for j in jobs] == result.ids


# ---------------------------------------------------------------------------- consume
def test_consume_acks_handled_jobs_and_nacks_failed_ones(node: DisqueProcess, q: str):
    with Client([f"127.0.0.1:{node.port}"]) as c:
        ids = [c.add_job(q, f"job{i}", retry=30) for i in range(10)]
        failed_once: set[str] = set()
        seen: list[str] = []

        def handler(job: Job) -> None:
            seen.append(job.id)
            if job.body == b"job3" and job.id not in failed_once:
                failed_once.add(job.id)
                raise RuntimeError("first try fails")

        stats = c.consume(q, handler, concurrency=2, max_jobs=11, poll_ms=200)
        assert (stats.received, stats.acked, stats.nacked) == (11, 10, 1)
        assert sorted(set(seen)) == sorted(ids) and len(seen) == 11
        assert c.qlen(q) == 0
        assert all(c.show(i) is None for i in ids)  # acked and deleted on a lone node


def test_consume_sends_working_for_a_long_handler(node: DisqueProcess, q: str):
    with Client([f"127.0.0.1:{node.port}"]) as c:
        job_id = c.add_job(q, "slow", retry=1)
        deliveries: list[int | None] = []

        def handler(job: Job) -> None:
            deliveries.append(job.additional_deliveries)
            time.sleep(2.5)  # 2.5 x RETRY: without WORKING the job would be re-queued

        stats = c.consume(q, handler, max_jobs=1, heartbeat_after=0.1, poll_ms=200)
        assert stats.acked == 1 and stats.working >= 2
        assert deliveries == [0]
        assert c.show(job_id) is None


def test_consume_stops_on_the_stop_event(node: DisqueProcess, q: str):
    with Client([f"127.0.0.1:{node.port}"]) as c, Conn(node.port) as probe:
        stop = threading.Event()
        consumer = Background(c.consume, [q], lambda job: None, concurrency=3,
                              stop_event=stop, poll_ms=200, handle_signals=False)
        # it is polling (its GETJOBs block on the node), and goes on until told to stop
        wait_for(lambda: blocked_on(probe, q) >= 1, what="the consumer polling")
        assert consumer.is_alive()
        stop.set()
        stats = consumer.result(timeout=30)
        assert stats.received == 0


def test_consume_stops_cleanly_on_sigterm_and_restores_the_handler(node: DisqueProcess, q: str):
    before = signal.getsignal(signal.SIGTERM)
    with Client([f"127.0.0.1:{node.port}"]) as c:
        for i in range(3):
            c.add_job(q, f"t{i}")
        handled: list[bytes] = []

        def handler(job: Job) -> None:
            handled.append(job.body)
            if len(handled) == 1:  # stop while jobs remain: the job in hand is still acked
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(0.3)

        stats = c.consume(q, handler, poll_ms=200)
        assert stats.acked == len(handled) >= 1
        assert c.qlen(q) == 3 - len(handled)
    assert signal.getsignal(signal.SIGTERM) is before


# bad arguments: ValueError before anything is fetched (never a consumer that spins on a
# refused GETJOB, blocks past a stop, or silently does nothing)
BAD_CONSUME = [  # (queues, options, what the message says)
    ([], {}, "at least one queue"),
    ((), {}, "at least one queue"),
    (None, {}, "at least one queue"),
    ("Q", {"concurrency": 0}, "concurrency must be an integer >= 1"),
    ("Q", {"concurrency": -2}, "concurrency must be an integer >= 1"),
    ("Q", {"concurrency": 1.5}, "concurrency must be an integer >= 1"),
    ("Q", {"concurrency": "2"}, "concurrency must be an integer >= 1"),
    ("Q", {"count": 0}, "count must be an integer >= 1"),
    ("Q", {"poll_ms": 0}, "poll_ms must be an integer >= 1"),
    ("Q", {"poll_ms": -5}, "poll_ms must be an integer >= 1"),
    ("Q", {"max_jobs": -1}, "max_jobs must be None or an integer >= 0"),
]
BAD_CONSUME_IDS = ["empty-list", "empty-tuple", "none", "concurrency-0", "concurrency-neg",
                   "concurrency-float", "concurrency-str", "count-0", "poll-0", "poll-neg",
                   "max-jobs-neg"]


def in_thread(fn: Callable[[], object]) -> tuple[str, object]:
    """('returned', value) or ('raised', exception); fails if fn is still running after a
    hang guard (the consumer must not start at all)."""
    out: list[tuple[str, object]] = []

    def target() -> None:
        try:
            out.append(("returned", fn()))
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            out.append(("raised", exc))

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(60)
    assert out, "consume() is still running: it should have refused its arguments"
    return out[0]


@pytest.mark.parametrize(("queues", "options", "message"), BAD_CONSUME, ids=BAD_CONSUME_IDS)
def test_consume_refuses_bad_arguments_at_once(node: DisqueProcess, q: str, queues: object,
                                               options: dict, message: str) -> None:
    with Client([f"127.0.0.1:{node.port}"]) as c:
        c.add_job(q, "untouched")
        handled: list[Job] = []
        qs = q if queues == "Q" else queues
        how, what = in_thread(lambda: c.consume(qs, handled.append, **options))  # type: ignore[arg-type]
        assert how == "raised" and type(what) is ValueError, (how, what)
        assert message in str(what)
        assert handled == [] and c.qlen(q) == 1


@pytest.mark.parametrize(("queues", "options", "message"), BAD_CONSUME, ids=BAD_CONSUME_IDS)
async def test_async_consume_refuses_bad_arguments_at_once(
        node: DisqueProcess, q: str, queues: object, options: dict, message: str) -> None:
    async with AsyncClient([f"127.0.0.1:{node.port}"]) as c:
        await c.add_job(q, "untouched")
        handled: list[Job] = []
        qs = q if queues == "Q" else queues
        with pytest.raises(ValueError, match=message):
            # (the deadline is a hang guard: a refused call ends at once)
            await asyncio.wait_for(c.consume(qs, handled.append, **options), 60)  # type: ignore[arg-type]
        assert handled == [] and await c.qlen(q) == 1


def test_consume_takes_a_queue_name_given_as_bytes(node: DisqueProcess, q: str) -> None:
    with Client([f"127.0.0.1:{node.port}"]) as c:
        job_id = c.add_job(q, "by-bytes")
        handled: list[str] = []
        how, what = in_thread(lambda: c.consume(q.encode(), lambda j: handled.append(j.id),
                                                max_jobs=1, poll_ms=200))
        assert how == "returned", what
        assert handled == [job_id]


async def test_async_consume_takes_a_queue_name_given_as_bytes(node: DisqueProcess,
                                                               q: str) -> None:
    async with AsyncClient([f"127.0.0.1:{node.port}"]) as c:
        job_id = await c.add_job(q, "by-bytes")
        handled: list[str] = []
        await asyncio.wait_for(c.consume(q.encode(), lambda j: handled.append(j.id),
                                         max_jobs=1, poll_ms=200), 60)
        assert handled == [job_id]


# ---------------------------------------------------------------------------- asyncio
async def test_async_client_every_method(node: DisqueProcess, q: str):
    async with AsyncClient(f"disque://127.0.0.1:{node.port}") as c:
        assert (await c.connect()).port == node.port
        assert (await c.hello()).node_id == c.node_id
        job_id = await c.add_job(q, b"x", retry=5)
        assert await c.qlen(q) == 1
        assert (await c.qstat(q))["len"] == 1  # type: ignore[index]
        assert [j.id for j in await c.qpeek(q, 1)] == [job_id]
        [job] = await c.get_job(q, timeout=1000, with_counters=True)
        assert (job.id, job.body, job.nacks) == (job_id, b"x", 0)
        assert await c.working(job_id) == 5
        assert await c.nack(job_id) == 1
        assert await c.dequeue(job_id) == 1
        assert await c.enqueue(job_id) == 1
        assert (await c.show(job_id))["state"] == "queued"  # type: ignore[index]
        assert [i async for i in c.jscan(queue=q)] == [job_id]
        assert q in [n async for n in c.qscan()]
        assert await c.ack_job(job_id) == 1
        assert await c.get_job(q, nohang=True) == []
        assert await c.pause(q, "out") == "out"
        assert await c.pause(q, "none") == "none"
        res = await c.add_jobs(q, [b"1", b"2"], dedup_keys=["a", "a"])
        assert res.ok and res.ids[0] == res.ids[1]
        assert await c.fast_ack(res.ids[0]) == 1  # type: ignore[arg-type]
        j2 = await c.add_job(q, "y")
        assert await c.del_job(j2) == 1
        assert "registered_jobs" in await c.info("jobs")
        assert await c.ping() == "PONG"
        with pytest.raises(NoReplicationError):
            await c.add_job(q, "z", replicate=3)
        with pytest.raises(BadIdError):
            await c.ack_job("bad")


async def test_async_blocking_get_job_and_consume(node: DisqueProcess, q: str):
    async with AsyncClient([f"127.0.0.1:{node.port}"], socket_timeout=0.2, protocol=2) as c:
        assert await c.get_job(q, timeout=500) == []
        for i in range(5):
            await c.add_job(q, f"a{i}")
        bodies: list[bytes] = []

        async def handler(job: Job) -> None:
            bodies.append(job.body)
            if job.body == b"a0" and job.nacks == 0:
                raise ValueError("again")
            await asyncio.sleep(0)

        stats = await c.consume(q, handler, concurrency=2, max_jobs=6, poll_ms=100)
        assert (stats.acked, stats.nacked) == (5, 1)
        assert sorted(set(bodies)) == [b"a0", b"a1", b"a2", b"a3", b"a4"]
        assert await c.qlen(q) == 0


# ---------------------------------------------------------------------------- dead letters
def fail(client: Client, q: str, job_id: str) -> None:
    """A consumer takes the job from `q` and fails (NACK)."""
    (job,) = client.get_job(q, nohang=True)
    assert job.id == job_id
    assert client.nack(job_id) == 1


def test_a_job_nacked_to_its_limit_is_dead_and_redriven_by_id(client: Client, q: str) -> None:
    dead = f"{q}-dead"
    job_id = client.add_job(q, b"payload", max_nacks=3, deadletter=dead, deadttl=3600)
    for _ in range(3):
        fail(client, q, job_id)
    assert client.qlen(q) == 0 and client.qlen(dead) == 1
    show = client.show(job_id)
    assert show is not None
    assert (show["queue"], show["source-queue"], show["deadletter-queue"]) == (dead, q, dead)
    assert (show["deadletter-reason"], show["nacks"], show["max-nacks"]) == ("max-nacks", 3, 3)
    assert isinstance(show["deadletter-time"], int) and show["body"] == b"payload"
    assert client.qstat(q)["deadlettered"] == 1
    assert client.redrive(dead, reset=True, ids=[job_id]) == 1
    show = client.show(job_id)
    assert (show["queue"], show["nacks"], show["redrives"]) == (q, 0, 1)
    assert show["deadletter-reason"] is None and show["deadletter-time"] is None


def test_add_jobs_share_the_policy_and_a_redrive_task_moves_them_back(client: Client,
                                                                      q: str) -> None:
    dead = f"{q}-dead"
    result = client.add_jobs(q, [b"a", b"b", b"c"], max_deliveries=1, deadletter=dead)
    assert result.ok and all(client.show(j)["max-deliveries"] == 1 for j in result.ids)
    jobs = client.get_job(q, count=3, nohang=True)
    assert client.nack(*[j.id for j in jobs]) == 3  # MAXDELIVERIES 1: never redelivered
    assert client.qlen(dead) == 3
    assert client.redrive(dead, count=2, rate=100) == 2
    wait_for(lambda: client.qlen(q) == 2)
    assert client.qlen(dead) == 1
    batch = client.add_jobs_batch(q, [b"d"], max_nacks=1, deadletter=dead)
    assert client.show(batch[0])["max-nacks"] == 1


async def test_async_client_dead_letters_nack_delay_and_redrive(node: DisqueProcess,
                                                                q: str) -> None:
    dead = f"{q}-dead"
    async with AsyncClient([f"127.0.0.1:{node.port}"]) as client:
        job_id = await client.add_job(q, b"x", max_nacks=2, deadletter=dead, retry=60)
        (job,) = await client.get_job(q, nohang=True)
        assert await client.nack(job.id, delay=1) == 1  # the first failure: back after 1 s
        assert (await client.show(job_id))["state"] == "active"
        await wait_for_async(lambda: client.qlen(q), 1)
        (job,) = await client.get_job(q, nohang=True)
        assert await client.nack(job.id, delay=30) == 1  # the second: dead at once
        show = await client.show(job_id)
        assert (show["queue"], show["state"], show["deadletter-reason"]) == \
            (dead, "queued", "max-nacks")
        assert (await client.add_jobs(q, [b"y"], max_nacks=1, deadletter=dead)).ok
        assert (await client.add_jobs_batch(q, [b"z"], max_nacks=1))[0]
        assert await client.redrive(dead, rate=1000) == 1
        await wait_for_async(lambda: client.qlen(dead), 0)
        assert (await client.show(job_id))["queue"] == q


async def wait_for_async(get: Callable[[], Awaitable[int]], want: int,
                         timeout: float = 10.0) -> None:
    """Poll an async getter until it returns `want` (no fixed sleep)."""
    deadline = time.monotonic() + timeout
    while (got := await get()) != want:
        assert time.monotonic() < deadline, f"still {got}, not {want}"
        await asyncio.sleep(0.02)
