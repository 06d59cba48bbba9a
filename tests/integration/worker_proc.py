"""Real `python -m disque.worker` processes for the tests, and the handlers they run.

`workers` (the fixture of the test modules that use it, made by `workers_of`) writes `handlers.py` into the
test's tmp_path, puts it on PYTHONPATH and starts workers with `--json` logs, so the tests
read the worker's own events (`job.failed`, `worker.summary`) from its stderr. Every handler
appends one line per event to a shared file (`HLOG`), `<event> <job id> <pid> <time>
<nacks> <additional deliveries>`, which is how a test sees which process ran which job and
when. All processes are killed at teardown.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.harness import REPO, wait_for

HANDLERS = '''
import asyncio, os, time

def _note(event, job):
    with open(os.environ["HLOG"], "a") as f:
        f.write(f"{event} {job.id} {os.getpid()} {time.time()} {job.nacks} "
                f"{job.additional_deliveries}\\n")

def ok(job):
    _note("done", job)

def fail(job):
    _note("fail", job)
    raise RuntimeError("handler failed on " + job.body.decode())

def slow(job):
    # simulated work of $WORK seconds (a handler's own duration, not a test's wait)
    _note("start", job)
    time.sleep(float(os.environ.get("WORK", "1")))
    _note("done", job)

async def aok(job):
    await asyncio.sleep(0)
    _note("done", job)

async def aslow(job):
    _note("start", job)
    await asyncio.sleep(float(os.environ.get("WORK", "1")))
    _note("done", job)

async def afail(job):
    _note("fail", job)
    raise RuntimeError("handler failed on " + job.body.decode())
'''


@dataclass(frozen=True)
class Event:
    event: str
    job: str
    pid: int
    time: float
    nacks: int
    deliveries: int


class WorkerProcess:
    def __init__(self, proc: subprocess.Popen[bytes], log: Path) -> None:
        self.proc = proc
        self.log = log

    @property
    def pid(self) -> int:
        return self.proc.pid

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def records(self) -> list[dict[str, Any]]:
        """The JSON log lines of the worker."""
        out = []
        for line in self.output().splitlines():
            if line.startswith("{"):
                out.append(json.loads(line))
        return out

    def logged(self, event: str) -> list[dict[str, Any]]:
        return [r for r in self.records() if r.get("event") == event]

    def summary(self) -> dict[str, Any]:
        (summary,) = self.logged("worker.summary")
        return summary

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def wait(self, timeout: float = 30.0) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"worker still running after {timeout}s:\n"
                                 f"{self.output()[-3000:]}") from None

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)


class Workers:
    def __init__(self, tmp_path: Path) -> None:
        self.dir = tmp_path / "worker"
        self.dir.mkdir(exist_ok=True)
        (self.dir / "handlers.py").write_text(HANDLERS)
        self.hlog = self.dir / "events.log"
        self.started: list[WorkerProcess] = []

    def start(self, handler: str, queues: list[str], ports: list[int], *args: str,
              work: float | None = None) -> WorkerProcess:
        """`python -m disque.worker handlers:<handler> -q ... --nodes ... --json *args`."""
        env = dict(os.environ, HLOG=str(self.hlog),
                   PYTHONPATH=os.pathsep.join([str(self.dir), str(REPO)]))
        if work is not None:
            env["WORK"] = str(work)
        cmd = [sys.executable, "-m", "disque.worker", f"handlers:{handler}", "--json",
               "--nodes", ",".join(f"127.0.0.1:{p}" for p in ports)]
        for q in queues:
            cmd += ["-q", q]
        cmd += list(args)
        log = self.dir / f"worker{len(self.started)}.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env,
                                    cwd=self.dir)
        worker = WorkerProcess(proc, log)
        self.started.append(worker)
        return worker

    def events(self, event: str | None = None, job: str | None = None) -> list[Event]:
        if not self.hlog.exists():
            return []
        out = []
        for line in self.hlog.read_text().splitlines():
            name, job_id, pid, when, nacks, deliveries = line.split(" ")
            e = Event(name, job_id, int(pid), float(when),
                      int(nacks) if nacks != "None" else 0,
                      int(deliveries) if deliveries != "None" else 0)
            if (event is None or e.event == event) and (job is None or e.job == job):
                out.append(e)
        return out

    def wait_events(self, event: str, n: int, job: str | None = None,
                    timeout: float = 30.0) -> list[Event]:
        """Wait until at least `n` events named `event` were written; all of them."""
        return wait_for(lambda: (lambda found: found if len(found) >= n else None)(
            self.events(event, job)), timeout=timeout,
            what=f"{n} {event!r} handler event(s)")


def workers_of(tmp_path: Path) -> Iterator[Workers]:
    """The body of a test module's `workers` fixture: kills every worker it started."""
    w = Workers(tmp_path)
    try:
        yield w
    finally:
        for proc in w.started:
            proc.kill()


def stop(worker: WorkerProcess, timeout: float = 30.0) -> int:
    """SIGTERM, and the exit code once the worker finished what it ran."""
    worker.signal(signal.SIGTERM)
    return worker.wait(timeout)


