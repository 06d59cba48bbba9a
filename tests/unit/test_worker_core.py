"""disque.worker.core: the worker's decisions fed as events, no sockets, clock injected."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from disque.client import DisqueConnectionError, Job, NoJobError
from disque.worker.core import (
    ACK,
    ENQUEUE,
    NACK,
    SHOW,
    WORKING,
    Command,
    WorkerCore,
    attempt_of,
    backoff_seconds,
)
from disque.worker.run import UsageError, is_async, load_handler

NODE = "node-a"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def job(n: int = 1, nacks: int | None = 0, deliveries: int | None = 0) -> Job:
    return Job("q", f"D-{n:08x}-{'x' * 24}-0001", b"body", nacks, deliveries)


def running(core: WorkerCore, j: Job | None = None) -> Job:
    """A job fetched from NODE whose handler started."""
    j = j or job()
    core.fetched([j], NODE)
    assert core.may_start(j)
    return j


def make(**kw: object) -> tuple[WorkerCore, Clock]:
    clock = Clock()
    return WorkerCore(clock=clock, rng=random.Random(7), **kw), clock  # type: ignore[arg-type]


# -- backoff ---------------------------------------------------------------------------------
def test_attempt_counts_nacks_and_additional_deliveries() -> None:
    assert attempt_of(job(nacks=0, deliveries=0)) == 1
    assert attempt_of(job(nacks=2, deliveries=3)) == 6
    assert attempt_of(job(nacks=None, deliveries=None)) == 1  # GETJOB without counters


@pytest.mark.parametrize(("attempt", "jitter", "expected"), [
    (1, 1.0, 2), (2, 1.0, 4), (3, 1.0, 8), (4, 1.0, 16),
    (1, 0.5, 1), (3, 0.5, 4),
    (10, 1.0, 60), (10, 0.5, 30),          # capped by max_backoff, then jittered
    (65535 * 2, 1.0, 60),                  # huge counters neither overflow nor exceed the cap
])
def test_backoff_doubles_per_delivery_up_to_the_cap(attempt: int, jitter: float,
                                                    expected: int) -> None:
    assert backoff_seconds(attempt, base=2, max_backoff=60, jitter=jitter) == expected


def test_backoff_rounds_up_to_whole_seconds_and_is_never_zero_with_a_base() -> None:
    assert backoff_seconds(1, base=0.1, max_backoff=60, jitter=0.5) == 1
    assert backoff_seconds(2, base=1.5, max_backoff=60, jitter=0.75) == 3  # 3 x 0.75 = 2.25


def test_backoff_base_zero_means_no_delay() -> None:
    assert backoff_seconds(5, base=0, max_backoff=60, jitter=1.0) == 0


@given(attempt=st.integers(1, 200), nacks_seed=st.integers(0, 2**32))
def test_failed_nack_delay_stays_within_the_jitter_band(attempt: int, nacks_seed: int) -> None:
    core = WorkerCore(backoff_base=1, max_backoff=300, rng=random.Random(nacks_seed))
    j = running(core, job(nacks=attempt - 1))
    command = core.failed(j, NODE)
    full = min(300, 2.0 ** min(attempt - 1, 62))
    assert command.kind == NACK and command.node == NODE
    assert full / 2 <= command.delay <= max(1, full) and command.delay >= 1


def test_jitter_spreads_jobs_failing_together() -> None:
    core, _ = make(backoff_base=8, max_backoff=300)
    delays = set()
    for n in range(20):
        j = job(n, nacks=1)
        core.fetched([j], NODE)
        core.may_start(j)
        delays.add(core.failed(j, NODE).delay)
    assert len(delays) > 3 and min(delays) >= 8 and max(delays) <= 16


# -- outcomes --------------------------------------------------------------------------------
def test_success_acks_on_the_delivering_node_and_releases_the_job() -> None:
    core, clock = make()
    j = job()
    assert core.fetched([j], NODE) is True
    assert core.may_start(j)
    clock.now += 2.5
    command = core.succeeded(j, NODE)
    assert command == Command(ACK, j.id, NODE)
    assert j.id in core.held  # until the node took the ACK
    core.sent(command, 1)
    assert j.id not in core.held and not core.heartbeats.jobs
    summary = core.summary()
    assert (summary["processed"], summary["succeeded"], summary["failed"],
            summary["acked"]) == (1, 1, 0, 1)
    assert summary["handler_seconds"] == 2.5


def test_failure_counts_and_nacks() -> None:
    core, _ = make(backoff_base=1)
    j = running(core, job(nacks=0))
    command = core.failed(j, NODE)
    assert command.kind == NACK and command.delay == 1
    core.sent(command, 1)
    s = core.summary()
    assert (s["processed"], s["failed"], s["nacked"], s["acked"]) == (1, 1, 1, 0)
    assert not core.held


def test_nack_the_node_did_not_hold_is_not_counted_as_nacked() -> None:
    core, _ = make()
    j = running(core)
    core.sent(core.failed(j, NODE), 0)
    assert core.summary()["nacked"] == 0 and not core.held
    assert "did not hold" in core.summary()["notes"][0]


# -- stopping --------------------------------------------------------------------------------
def test_stop_ends_fetching_and_gives_back_jobs_not_started() -> None:
    core, _ = make(backoff_base=5)
    first, second = job(1), job(2)
    core.fetched([first, second], NODE)
    assert core.may_start(first)
    assert core.stop("SIGTERM") is False
    assert not core.fetching
    # the running job still finishes normally
    ack = core.succeeded(first, NODE)
    assert ack.kind == ACK
    # the one not started goes back at once (no backoff: it did not fail)
    assert core.may_start(second) is False
    back = core.given_back(second, NODE)
    assert back == Command(ENQUEUE, second.id, NODE, 0, given_back=True)  # not a failure
    core.sent(ack, 1)
    core.sent(back, 1)
    s = core.summary()
    assert (s["processed"], s["acked"], s["nacked"], s["given_back"]) == (1, 1, 0, 1)
    assert s["stop"] == "SIGTERM" and not core.held


def test_second_stop_forces() -> None:
    core, _ = make()
    assert core.stop("SIGINT") is False
    assert core.stop("SIGTERM") is True
    assert core.state == WorkerCore.FORCED
    assert core.summary()["stop"] == "SIGINT, then SIGTERM: forced"


def test_burst_fetch_loop_ends_on_an_empty_fetch_only() -> None:
    core, _ = make(burst=True)
    assert core.fetched([job()], NODE) is True
    assert core.fetched([], NODE) is False
    plain, _ = make()
    assert plain.fetched([], NODE) is True


def test_fetch_failures_back_off_and_reset_on_success() -> None:
    core, _ = make()
    waits = [core.fetch_failed(OSError("down")) for _ in range(8)]
    assert waits[:4] == [0.1, 0.2, 0.4, 0.8] and waits[-1] == 5.0
    core.fetched([], NODE)
    assert core.fetch_failed(OSError("down")) == 0.1
    assert core.summary()["fetch_errors"] == 9


# -- a node that is gone ---------------------------------------------------------------------
def unreachable() -> DisqueConnectionError:
    return DisqueConnectionError("cannot connect", unreachable=True)


def lost() -> DisqueConnectionError:
    return DisqueConnectionError("connection lost")


@pytest.mark.parametrize("kind", [ACK, WORKING, SHOW])
def test_idempotent_commands_go_to_another_node_when_theirs_is_gone(kind: str) -> None:
    core, _ = make()
    command = Command(kind, job().id, NODE)
    for error in (unreachable(), lost()):
        assert core.not_sent(command, error) == Command(kind, command.job_id, None)


def test_nack_goes_elsewhere_only_if_it_was_not_sent() -> None:
    core, _ = make()
    j = running(core)
    nack = core.failed(j, NODE)
    elsewhere = core.not_sent(nack, unreachable())
    assert elsewhere is not None and elsewhere.node is None and elsewhere.delay == nack.delay
    assert core.not_sent(nack, lost()) is None  # it may have counted: never twice
    assert core.summary()["errors"] == 1 and not core.held


def test_command_failing_on_any_node_is_given_up() -> None:
    core, _ = make()
    j = running(core)
    ack = core.succeeded(j, NODE)
    anywhere = core.not_sent(ack, unreachable())
    assert anywhere is not None
    assert core.not_sent(anywhere, unreachable()) is None
    assert core.summary()["errors"] == 1 and not core.held


# -- heartbeats ------------------------------------------------------------------------------
def show_reply(retry: int, requeue_ms: int | None) -> dict[str, object]:
    return {"retry": retry, "next-requeue-within": requeue_ms}


def test_fast_jobs_never_cost_a_heartbeat() -> None:
    core, clock = make(first_check=0.2)
    j = running(core)
    clock.now += 0.19
    assert core.heartbeats_due() == []
    core.sent(core.succeeded(j, NODE), 1)
    clock.now += 10
    assert core.heartbeats_due() == []


def test_working_is_sent_at_half_the_retry() -> None:
    core, clock = make(first_check=0.2)
    j = running(core)
    clock.now += 0.2
    assert core.heartbeats_due() == [Command(SHOW, j.id, NODE)]
    assert core.heartbeats_due() == []  # pushed back while the SHOW is in flight
    core.sent(Command(SHOW, j.id, NODE), show_reply(retry=10, requeue_ms=9800))
    assert core.next_heartbeat_in(idle=60) == pytest.approx(4.9)
    clock.now += 4.8
    assert core.heartbeats_due() == []
    clock.now += 0.11
    assert core.heartbeats_due() == [Command(WORKING, j.id, NODE)]
    core.sent(Command(WORKING, j.id, NODE), 10)  # WORKING answers the RETRY
    assert core.next_heartbeat_in(idle=60) == pytest.approx(5.0)
    clock.now += 5.01
    assert core.heartbeats_due() == [Command(WORKING, j.id, NODE)]
    assert core.summary()["working"] == 1


def test_jobs_waiting_in_a_batch_are_held_and_heartbeated_too() -> None:
    core, clock = make(first_check=0.2)
    a, b = job(1), job(2)
    core.fetched([a, b], NODE)
    core.may_start(a)  # b waits for a
    clock.now += 0.2
    assert {c.job_id for c in core.heartbeats_due()} == {a.id, b.id}


def test_no_heartbeat_for_at_most_once_or_unknown_jobs() -> None:
    core, clock = make()
    a, b = job(1), job(2)
    core.fetched([a, b], NODE)
    clock.now += 0.2
    core.heartbeats_due()
    core.sent(Command(SHOW, a.id, NODE), show_reply(retry=0, requeue_ms=None))  # RETRY 0
    core.sent(Command(SHOW, b.id, NODE), None)  # the node does not know it
    assert core.heartbeats.jobs == {}
    assert core.next_heartbeat_in(idle=0.5) == 0.5


def test_working_refused_stops_the_heartbeats_of_that_job() -> None:
    core, clock = make()
    j = job()
    core.fetched([j], NODE)
    clock.now += 0.2
    core.heartbeats_due()
    core.sent(Command(SHOW, j.id, NODE), show_reply(retry=4, requeue_ms=3000))
    clock.now += 2
    (working,) = core.heartbeats_due()
    assert core.not_sent(working, NoJobError("Unknown job")) is None
    assert core.heartbeats.jobs == {}
    assert j.id in core.held  # still ours: the handler runs on
    assert core.summary()["errors"] == 0  # a heartbeat is no lost ACK/NACK


# -- handler loading -------------------------------------------------------------------------
def test_load_handler_accepts_colon_and_dotted_forms() -> None:
    assert load_handler("json:dumps") is load_handler("json.dumps")
    assert load_handler("os:path.join") is load_handler("os.path.join")


@pytest.mark.parametrize("spec", ["nosuchmodule_xyz:f", "json:nosuch", "json", "json:__name__"])
def test_load_handler_errors_are_usage_errors(spec: str) -> None:
    with pytest.raises(UsageError):
        load_handler(spec)


def test_async_handlers_are_recognised() -> None:
    async def coro(job: Job) -> None: ...

    class Callable_:
        async def __call__(self, job: Job) -> None: ...

    assert is_async(coro) and is_async(Callable_())
    assert not is_async(print) and not is_async(lambda job: None)


# -- the settings consume() runs the core with -----------------------------------------------
def test_max_jobs_reserves_what_each_fetch_asks_so_fetchers_never_get_more_together() -> None:
    core, _ = make(count=3, max_jobs=5)
    assert core.fetch_count() == 3
    assert core.fetch_count() == 2  # another fetcher: only what is left
    assert core.fetch_count() == 0 and core.fetching  # all reserved, none received yet
    core.fetched([job(1)], NODE, asked=3)  # 2 of the 3 asked for did not come
    assert core.fetch_count() == 2
    core.fetch_failed(OSError("down"), asked=2)  # a failed fetch gives its share back
    core.fetched([job(2), job(3)], NODE, asked=2)
    assert core.fetch_count() == 2
    core.fetched([job(4), job(5)], NODE, asked=2)
    assert core.fetch_count() == 0
    assert not core.fetching and core.summary()["stop"] == "max_jobs"
    assert core.stats.received == 5


def test_max_jobs_zero_stops_before_any_fetch() -> None:
    core, _ = make(max_jobs=0)
    assert core.fetch_count() == 0 and not core.fetching


def test_without_give_back_jobs_fetched_before_a_stop_still_run() -> None:
    core, _ = make(give_back=False, forcible=False)
    a, b = job(1), job(2)
    core.fetched([a, b], NODE)
    assert core.may_start(a)
    assert core.stop("stop event") is False
    assert core.stop("SIGINT") is False  # not forcible: a second request changes nothing
    assert core.may_start(b) and core.state == WorkerCore.STOPPING
    assert core.fetch_count() == 0


def test_base_zero_nacks_without_delay_and_heartbeats_can_be_off() -> None:
    core, clock = make(backoff_base=0, heartbeats=False)
    j = running(core, job(nacks=4))
    assert core.failed(j, NODE).delay == 0
    clock.now += 10
    assert core.heartbeats_due() == [] and core.heartbeats.jobs == {}


def test_a_constant_fetch_retry_wait() -> None:
    core, _ = make(fetch_retry_first=0.5, fetch_retry_max=0.5)
    assert [core.fetch_failed(OSError("down")) for _ in range(4)] == [0.5] * 4


@pytest.mark.parametrize("kind", [ACK, NACK])
def test_a_command_a_leaving_node_refused_goes_elsewhere(kind: str) -> None:
    from disque.client import LeavingError

    core, _ = make()
    command = Command(kind, job().id, NODE)
    assert core.not_sent(command, LeavingError("node is leaving")) == Command(kind,
                                                                               command.job_id)


def test_following_names_the_producers_node_every_n_jobs() -> None:
    from disque.client import Node

    here = Node("h", 1, id="aaaaaaaa" + "0" * 32)
    core, _ = make(follow_every=60)
    other = [Job("q", f"D-bbbbbbbb-{n:024d}-0001", b"") for n in range(60)]
    assert core.producers_prefix(here) is None  # nothing counted yet
    core.fetched(other[:59], here)
    assert core.producers_prefix(here) is None  # not 60 jobs yet
    core.fetched(other[59:], here)
    assert core.producers_prefix(here) == "bbbbbbbb"
    assert core.producers_prefix(here) is None  # counted again from 0
    core.followed("h2:2", None)
    core.followed("h3:3", OSError("refused"))
    assert core.stats.switches == 1 and "moving to h3:3" in core.summary()["notes"][0]
    plain, _ = make()
    plain.fetched(other, here)
    assert plain.producers_prefix(here) is None  # following is off by default


def test_consume_logs_the_drivers_events_through_stdlib_logging(
        caplog: pytest.LogCaptureFixture) -> None:
    import logging

    from disque.worker.driver import StdlibEvents

    events = StdlibEvents(logging.getLogger("disque.client.consumer"))
    with caplog.at_level(logging.INFO, logger="disque.client.consumer"):
        events.warning("job.failed", job="D-1", error="ValueError('x y')", nack_delay=0)
        events.info("worker.stopping", reason="SIGINT")
    assert [r.getMessage() for r in caplog.records] == [
        "job.failed job=D-1 error=\"ValueError('x y')\" nack_delay=0",
        "worker.stopping reason=SIGINT"]
    assert [r.levelname for r in caplog.records] == ["WARNING", "INFO"]
