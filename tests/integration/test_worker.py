"""`disque-worker` against one real node: real worker processes (`python -m disque.worker`)
running handlers from a module the test writes (see `worker_proc`). Issue 15."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness import REPO, DisqueProcess, free_port, wait_for
from tests.integration.resp import Conn, add, show
from tests.integration.worker_proc import Workers, stop, workers_of


@pytest.fixture
def workers(tmp_path: Path) -> Iterator[Workers]:
    yield from workers_of(tmp_path)


@pytest.fixture
def conn(server: DisqueProcess) -> Iterator[Conn]:
    c = Conn(server.port)
    yield c
    c.close()


@pytest.mark.parametrize(("handler", "mode"), [("ok", "threads"), ("aok", "asyncio")])
def test_worker_runs_the_handler_on_every_job_and_acks_it(
        server: DisqueProcess, conn: Conn, workers: Workers, handler: str, mode: str) -> None:
    ids = [add(conn, "emails", f"mail{i}") for i in range(6)] + [add(conn, "other", "x")]
    w = workers.start(handler, ["emails", "other"], [server.port], "-c", "3")
    done = workers.wait_events("done", 7)
    assert sorted(e.job for e in done) == sorted(ids)  # each job once
    # ACKJOB on a lone node deletes the job at once
    wait_for(lambda: all(show(conn, i) is None for i in ids), what="jobs acked")
    assert conn.cmd("QLEN", "emails") == 0
    assert stop(w) == 0
    (start,) = w.logged("worker.start")
    assert start["mode"] == mode and start["concurrency"] == 3
    s = w.summary()
    assert (s["processed"], s["succeeded"], s["acked"], s["failed"], s["nacked"]) == \
        (7, 7, 7, 0, 0)
    assert s["stop"] == "SIGTERM"


@pytest.mark.parametrize("handler", ["fail", "afail"])
def test_failing_handler_nacks_with_a_delay_and_logs_the_exception(
        server: DisqueProcess, conn: Conn, workers: Workers, handler: str) -> None:
    # RETRY 60: only the NACK can bring the job back within the test
    job_id = add(conn, "q", "payload", "RETRY", "60")
    w = workers.start(handler, ["q"], [server.port], "--backoff", "2", "--max-backoff", "2")
    (first,) = workers.wait_events("fail", 1)
    # NACK DELAY: nacked once, but not back in the queue until the delay is over
    wait_for(lambda: show(conn, job_id)["nacks"] == 1, what="the NACK")
    shown = show(conn, job_id)
    assert shown["state"] == b"active" and conn.cmd("QLEN", "q") == 0, shown
    assert shown["next-requeue-within"] > 0
    fails = workers.wait_events("fail", 2)
    # delay = ceil(min(2, 2 x 2^0) x uniform(0.5, 1)) seconds: at least 1 s
    assert fails[1].time - first.time >= 1.0
    assert (fails[1].nacks, fails[1].deliveries) == (1, 0)  # a NACK, not a redelivery
    assert stop(w) == 0
    failed = w.logged("job.failed")
    assert failed[0]["job"] == job_id and failed[0]["attempt"] == 1
    assert failed[0]["nack_delay"] in (1, 2)
    assert "RuntimeError: handler failed on payload" in failed[0]["exception"]
    s = w.summary()
    assert s["failed"] == s["processed"] >= 2 and s["nacked"] == s["failed"]


def test_backoff_zero_sends_a_plain_nack(server: DisqueProcess, conn: Conn,
                                        workers: Workers) -> None:
    add(conn, "q", "payload", "RETRY", "60")
    w = workers.start("fail", ["q"], [server.port], "--backoff", "0")
    fails = workers.wait_events("fail", 3)
    assert [f.nacks for f in fails[:3]] == [0, 1, 2]
    assert stop(w) == 0
    assert {r["nack_delay"] for r in w.logged("job.failed")} == {0}


def info_field(conn: Conn, name: str) -> int:
    text = conn.cmd("INFO")
    text = text.decode() if isinstance(text, bytes) else str(text)
    return int(next(line.split(":", 1)[1] for line in text.splitlines()
                    if line.startswith(name + ":")))


@pytest.mark.parametrize("handler", ["slow", "aslow"])
def test_working_keeps_a_long_job_from_being_redelivered(
        server: DisqueProcess, conn: Conn, workers: Workers, handler: str) -> None:
    # RETRY 2 and 3.5 s of work: without WORKING the node requeues the job after 2 s and
    # the worker's second thread (task) runs it again. The job is added once the worker
    # waits for it: a job's RETRY timer runs from its queueing, not from its delivery (as
    # in the original), so a job added before a worker that took over 2 s to start (a
    # loaded machine) was requeued right after its late delivery, before any WORKING.
    w = workers.start(handler, ["q"], [server.port], "-c", "2", work=3.5)
    wait_for(lambda: info_field(conn, "blocked_clients") >= 1, timeout=60,
             what="the worker blocked in GETJOB")
    job_id = add(conn, "q", "long", "RETRY", "2")
    workers.wait_events("done", 1, timeout=30)
    assert len(workers.events("start")) == 1, workers.events()
    wait_for(lambda: show(conn, job_id) is None, what="the job acked")
    assert stop(w) == 0
    s = w.summary()
    assert s["working"] >= 2 and s["acked"] == 1  # at ~1.1 s, then every RETRY/2 = 1 s


@pytest.mark.parametrize("handler", ["slow", "aslow"])
def test_sigterm_finishes_the_running_job_and_gives_back_the_others(
        server: DisqueProcess, conn: Conn, workers: Workers, handler: str) -> None:
    ids = [add(conn, "q", f"j{i}", "RETRY", "60") for i in range(3)]
    w = workers.start(handler, ["q"], [server.port], "--batch", "3", work=1.5)
    (started,) = workers.wait_events("start", 1)
    w.signal(signal.SIGTERM)
    assert w.wait() == 0
    (done,) = workers.events("done")
    assert done.job == started.job
    assert show(conn, started.job) is None  # acked
    rest = [i for i in ids if i != started.job]
    # the two fetched with it but not started were put back at once, for another worker:
    # ENQUEUE, not NACK (they did not fail: no nack toward MAXNACKS)
    assert conn.cmd("QLEN", "q") == 2
    for job_id in rest:
        shown = show(conn, job_id)
        assert shown["state"] == b"queued" and shown["nacks"] == 0, shown
        assert shown["additional-deliveries"] == 1, shown
    s = w.summary()
    assert (s["processed"], s["acked"], s["given_back"], s["nacked"]) == (1, 1, 2, 0)
    (stopping,) = w.logged("worker.stopping")
    assert stopping["reason"] == "SIGTERM" and stopping["running"] == 1


@pytest.mark.parametrize("handler", ["slow", "aslow"])
def test_second_signal_forces_the_exit(server: DisqueProcess, conn: Conn,
                                       workers: Workers, handler: str) -> None:
    job_id = add(conn, "q", "stuck", "RETRY", "60")
    w = workers.start(handler, ["q"], [server.port], work=60)
    workers.wait_events("start", 1)
    w.signal(signal.SIGINT)
    wait_for(lambda: w.logged("worker.stopping"), what="the first stop logged")
    w.signal(signal.SIGTERM)
    assert w.wait(timeout=10) == 3
    assert w.summary()["stop"] == "SIGINT, then SIGTERM: forced"
    assert show(conn, job_id)["state"] == b"active"  # left to its RETRY


@pytest.mark.parametrize("handler", ["ok", "aok"])
def test_burst_exits_when_the_queues_are_empty(server: DisqueProcess, conn: Conn,
                                               workers: Workers, handler: str) -> None:
    ids = [add(conn, "q", f"j{i}") for i in range(5)]
    w = workers.start(handler, ["q"], [server.port], "--burst", "-c", "2",
                      "--timeout", "200")
    assert w.wait() == 0
    assert sorted(e.job for e in workers.events("done")) == sorted(ids)
    s = w.summary()
    assert (s["processed"], s["acked"]) == (5, 5) and s["stop"] == "burst: queues empty"
    assert conn.cmd("QLEN", "q") == 0


def test_burst_on_empty_queues_exits_at_once(server: DisqueProcess, workers: Workers) -> None:
    w = workers.start("ok", ["nothing"], [server.port], "--burst", "--timeout", "100")
    assert w.wait() == 0
    assert w.summary()["processed"] == 0


def test_no_reachable_node_exits_1(workers: Workers) -> None:
    w = workers.start("ok", ["q"], [free_port()])
    assert w.wait() == 1
    (err,) = w.logged("worker.cannot_start")
    assert "no reachable node" in err["error"]


def test_password_is_sent_and_a_wrong_one_exits_1(server: DisqueProcess, conn: Conn,
                                                  workers: Workers) -> None:
    assert conn.cmd("CONFIG", "SET", "requirepass", "secret") == "OK"
    assert workers.start("ok", ["q"], [server.port]).wait() == 1
    assert workers.start("ok", ["q"], [server.port], "--password", "wrong").wait() == 1
    w = workers.start("ok", ["q"], [server.port], "--password", "secret", "--burst",
                      "--timeout", "100")
    assert w.wait() == 0


@pytest.mark.parametrize(("args", "text"), [
    (["handlers:nosuch", "-q", "q"], "has no attribute"),
    (["nosuchmodule:f", "-q", "q"], "cannot import"),
    (["handlers:ok"], "the following arguments are required: -q/--queue"),
    (["handlers:ok", "-q", "q", "-c", "0"], "must be >= 1"),
    (["handlers:ok", "-q", "q", "--backoff", "-1"], "must be a number of seconds"),
    (["handlers:ok", "-q", "q", "--nodes", "h:notaport"], "bad port in node address"),
    (["handlers:ok", "-q", "q", "--nodes", ""], "no node address given"),
])
def test_usage_errors_exit_2(workers: Workers, args: list[str], text: str) -> None:
    env_path = f"{workers.dir}"
    proc = subprocess.run([sys.executable, "-m", "disque.worker", *args],
                          capture_output=True, text=True, timeout=60, cwd=env_path)
    assert proc.returncode == 2, proc.stderr
    assert text in proc.stderr


def test_console_script_help_documents_every_readme_option_and_the_exit_codes(
        server: DisqueProcess, conn: Conn, workers: Workers) -> None:
    """`disque-worker` is installed from pyproject's [project.scripts]; its --help names
    every option the README's Worker section names, and the exit codes."""
    exe = Path(sys.executable).parent / "disque-worker"
    out = subprocess.run([str(exe), "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    readme = (REPO / "README.md").read_text()
    section = readme.split("\n## Worker\n", 1)[1].split("\n## ", 1)[0]
    options = set(re.findall(r"`(--[a-z-]+|-[a-z])\b", section))
    assert {"--backoff", "--max-backoff", "--burst", "--password", "--json"} <= options
    assert all(opt in out.stdout for opt in options), options
    assert "exit codes:" in out.stdout and "  3  forced" in out.stdout
    # and it runs jobs like `python -m disque.worker`
    job_id = add(conn, "q", "x")
    env = dict(os.environ, HLOG=str(workers.hlog), PYTHONPATH=str(workers.dir))
    run = subprocess.run([str(exe), "handlers:ok", "-q", "q", "--burst", "--timeout", "100",
                          "--nodes", f"127.0.0.1:{server.port}"], capture_output=True,
                         text=True, timeout=60, env=env)
    assert run.returncode == 0, run.stderr
    assert [e.job for e in workers.events("done")] == [job_id]
