"""`disque-worker`: runs a Python callable on the jobs of one or more queues, the way rq,
dramatiq or Celery workers do, built on `disque.client` alone.

    disque-worker myapp.tasks:send_mail -q emails -c 16 --nodes h1:7711,h2:7711

Layout: `core` decides (sans-I/O: ACK or NACK and its backoff, heartbeats, stopping, burst,
max_jobs, following the producers; unit-tested without sockets), `threads` and `aio` drive
it with `Client` / `AsyncClient` (threads for a plain handler, asyncio tasks for an `async
def` one), `driver` holds what both drivers share, `run` what the command line needs
around them (settings, handler loading, structlog), `cli` the command line. The client's own
`consume()` runs the same core with the same two drivers (`disque.client.consumer`). Invariants: every job fetched is answered exactly once by
the worker, ACKJOB after its handler returned, NACK after it raised or when the worker
stopped before starting it (unless no node takes the command: then its RETRY brings it
back); a held job gets WORKING before its RETRY elapses, for as long as it is held.
"""

from disque.worker.core import Command, WorkerCore, WorkerStats, attempt_of, backoff_seconds

__all__ = ["Command", "WorkerCore", "WorkerStats", "attempt_of", "backoff_seconds"]
