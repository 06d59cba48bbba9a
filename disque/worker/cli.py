"""`disque-worker` / `python -m disque.worker`: the command line, then one driver run."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Callable
from typing import Any

from disque.client import AsyncClient, AuthError, Client, DisqueError, Job, Node, parse_nodes
from disque.worker.core import WorkerCore
from disque.worker.run import (
    EXIT_ERROR,
    EXIT_USAGE,
    Settings,
    UsageError,
    configure_logging,
    is_async,
    load_handler,
    log,
)

DESCRIPTION = """\
Run a Python callable on every job of one or more disque queues.

The handler is called with one argument, a disque.client.Job: job.id (str), job.queue (str),
job.body (bytes), job.nacks and job.additional_deliveries (int: the node's best-effort
counters; this is delivery number 1 + nacks + additional_deliveries). Its return value is
ignored. When it returns, the job is acknowledged (ACKJOB); when it raises, the failure is
logged with the exception and the job is NACKed with a delay of
    min(--max-backoff, --backoff * 2^(delivery - 1)) * uniform(0.5, 1)
seconds, rounded up (NACK ... DELAY; --backoff 0: a plain NACK, back at once). A job that
keeps failing ends in its dead-letter queue if it was added with a delivery or nack limit:
the node decides that, not the worker.

A plain function runs on --concurrency threads; an `async def` one on --concurrency asyncio
tasks. Each thread (task) fetches --batch jobs per GETJOB and runs them in turn. While the
worker holds a job it keeps the node from requeueing it: once the job has been held 0.2 s, a
SHOW tells its RETRY, and WORKING is sent when half of the time left before the requeue has
passed, then every RETRY/2 seconds.

SIGTERM or SIGINT stops the worker gracefully: no new GETJOB, running handlers finish and are
acknowledged, jobs fetched but not started are put back at once with ENQUEUE (for another
worker; not NACK: they did not fail, so they do not count toward MAXNACKS), then a summary is
logged. A second signal exits at once; running jobs come back after their RETRY.
"""

EPILOG = """\
exit codes:
  0  stopped by SIGTERM/SIGINT after finishing its jobs, or --burst found the queues empty
  1  no node reachable at start, authentication refused, or another fatal error
  2  bad command line, or the handler cannot be imported or is not callable
  3  forced by a second SIGTERM/SIGINT (running jobs were left to their RETRY)

environment: DISQUE_NODES and DISQUE_PASSWORD are the defaults of --nodes and --password;
DISQUE_TLS, DISQUE_TLS_CA_CERT_FILE, DISQUE_TLS_CERT_FILE and DISQUE_TLS_KEY_FILE of the
--tls options.

example:
  disque-worker myapp.tasks:send_mail -q emails -q other -c 16 --nodes h1:7711,h2:7711
"""


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, not {value}")
    return value


def _seconds(text: str) -> float:
    value = float(text)
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a number of seconds >= 0, not {text}")
    return value


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="disque-worker", description=DESCRIPTION, epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("handler", metavar="MODULE:CALLABLE",
                   help="the callable to run on each job, e.g. myapp.tasks:send_mail "
                        "(the current directory is on the import path)")
    p.add_argument("-q", "--queue", dest="queues", action="append", required=True,
                   metavar="QUEUE", help="a queue to take jobs from; repeat for several "
                                         "(one GETJOB asks for all of them)")
    p.add_argument("-c", "--concurrency", type=_positive, default=1, metavar="N",
                   help="threads (or asyncio tasks for an async handler) running jobs "
                        "(default 1)")
    p.add_argument("--nodes", default=os.environ.get("DISQUE_NODES", "127.0.0.1:7711"),
                   metavar="HOST:PORT,...",
                   help="nodes to start from; the others are found through HELLO, and the "
                        "worker moves to another one when a node fails (default "
                        "$DISQUE_NODES or 127.0.0.1:7711)")
    p.add_argument("--password", default=os.environ.get("DISQUE_PASSWORD"),
                   help="AUTH password of the nodes (default $DISQUE_PASSWORD)")
    p.add_argument("--tls", action="store_true",
                   default=os.environ.get("DISQUE_TLS", "") in ("1", "yes", "true"),
                   help="connect with TLS (also a disque+tls:// --nodes URL, or any --tls-* "
                        "option; default $DISQUE_TLS)")
    p.add_argument("--tls-ca-cert-file", default=os.environ.get("DISQUE_TLS_CA_CERT_FILE"),
                   metavar="FILE", help="CA certificates to verify the nodes with "
                                        "(default $DISQUE_TLS_CA_CERT_FILE; else the system's)")
    p.add_argument("--tls-cert-file", default=os.environ.get("DISQUE_TLS_CERT_FILE"),
                   metavar="FILE", help="client certificate, for nodes with tls-auth-clients "
                                        "(default $DISQUE_TLS_CERT_FILE)")
    p.add_argument("--tls-key-file", default=os.environ.get("DISQUE_TLS_KEY_FILE"),
                   metavar="FILE", help="its private key (default $DISQUE_TLS_KEY_FILE)")
    p.add_argument("--batch", type=_positive, default=1, metavar="N",
                   help="jobs per GETJOB (COUNT) for each thread or task (default 1)")
    p.add_argument("--timeout", type=_positive, default=1000, metavar="MS",
                   help="how long one GETJOB waits for a job, in ms (default 1000): also "
                        "how soon a stop is noticed, and how long --burst waits before it "
                        "calls the queues empty")
    p.add_argument("--burst", action="store_true",
                   help="exit (code 0) once the queues are empty instead of waiting for jobs")
    p.add_argument("--backoff", type=_seconds, default=1.0, metavar="SECONDS",
                   help="NACK delay after a first failure, doubled at each further delivery "
                        "(default 1; 0 = NACK without delay)")
    p.add_argument("--max-backoff", type=_seconds, default=300.0, metavar="SECONDS",
                   help="the largest NACK delay before jitter (default 300)")
    p.add_argument("--log-level", choices=("debug", "info", "warning", "error"),
                   default="info", help="default info (a line per failure, start, stop, "
                                        "summary)")
    p.add_argument("--log-format", choices=("console", "json"), default="console",
                   help="log lines on stderr as key=value text (default) or JSON objects")
    p.add_argument("--json", dest="log_format", action="store_const", const="json",
                   help="same as --log-format json")
    return p


def tls_options(on: bool, ca: str | None, cert: str | None, key: str | None
                ) -> dict[str, Any]:
    """The client's TLS keywords (redis-py's ssl_* names) from the worker's options."""
    opts: dict[str, Any] = {"ssl": True} if on else {}
    for name, value in (("ssl_ca_certs", ca), ("ssl_certfile", cert), ("ssl_keyfile", key)):
        if value:
            opts[name] = value
    return opts


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)  # exits 2 on a bad command line
    configure_logging(args.log_level, args.log_format)
    try:
        parse_nodes(args.nodes)
        handler = load_handler(args.handler)
    except (UsageError, ValueError) as exc:  # ValueError: a malformed --nodes
        print(f"disque-worker: {exc}", file=sys.stderr)
        return EXIT_USAGE
    settings = Settings(handler_spec=args.handler, queues=tuple(args.queues), nodes=args.nodes,
                        password=args.password, tls=tls_options(
                            args.tls, args.tls_ca_cert_file, args.tls_cert_file,
                            args.tls_key_file), concurrency=args.concurrency,
                        batch=args.batch, timeout_ms=args.timeout, burst=args.burst,
                        backoff=args.backoff, max_backoff=args.max_backoff)
    core = WorkerCore(burst=settings.burst, backoff_base=settings.backoff,
                      max_backoff=settings.max_backoff, count=settings.batch)
    try:
        if is_async(handler):
            code = asyncio.run(_run_async(handler, settings, core))
        else:
            code = _run_threads(handler, settings, core)
    except (AuthError, DisqueError) as exc:  # at start: no node, or AUTH refused
        log.error("worker.cannot_start", nodes=settings.nodes, error=str(exc))
        return EXIT_ERROR
    log.info("worker.summary", **core.summary())
    return code


def _started(settings: Settings, node: Node, mode: str) -> None:
    log.info("worker.start", handler=settings.handler_spec, queues=list(settings.queues),
             node=node.addr, mode=mode, concurrency=settings.concurrency,
             batch=settings.batch, burst=settings.burst)


def _run_threads(handler: Callable[[Job], object], settings: Settings,
                 core: WorkerCore) -> int:
    from disque.worker.threads import ThreadedWorker

    with Client(settings.nodes, password=settings.password, **settings.tls) as client:
        _started(settings, client.connect(), "threads")
        return ThreadedWorker(client, handler, settings.fetch(), core, log).run()


async def _run_async(handler: Callable[[Job], object], settings: Settings,
                     core: WorkerCore) -> int:
    from disque.worker.aio import AsyncWorker

    async with AsyncClient(settings.nodes, password=settings.password,
                           **settings.tls) as client:
        _started(settings, await client.connect(), "asyncio")
        return await AsyncWorker(client, handler, settings.fetch(), core, log).run()


if __name__ == "__main__":  # pragma: no cover - `python -m disque.worker` uses __main__
    sys.exit(main())
