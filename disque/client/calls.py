"""Every command the client sends, as a `Call`: its arguments, the parser of its reply, and
whether it may be sent again on another node after a connection loss or a -LEAVING.

Both clients (blocking and asyncio) are thin loops around these values, so what a method
sends and how its reply is read is defined once here and unit-tested without a socket.

Retry safety (the `safe` flag):
- GETJOB is always safe: jobs a lost reply had taken out of a queue are re-queued by their
  RETRY timer, which is the at-least-once contract anyway.
- Reads (QLEN, SHOW, QSTAT, ...) and the idempotent job commands (ACKJOB, FASTACK, DELJOB,
  ENQUEUE, DEQUEUE, PAUSE, WORKING) are safe: sending them twice has the effect of once.
- ADDJOB is not: a reply lost after the node added the job would, if resent, add a second
  job. It is resent only when the caller allows it; with a DEDUP key a resend to the *same*
  node answers the first job's ID instead of adding another. ADDJOBS (many jobs, one
  command) follows the same rule: safe only with a DEDUP key per body (WITHDEDUP) or when
  the caller allows it.
- NACK is not resent: a second NACK would count a second negative acknowledgement.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from disque.client import replies
from disque.client.errors import DisqueError
from disque.client.replies import Hello, Job

T = TypeVar("T")

PAUSE_OPTIONS = frozenset({"in", "out", "all", "none", "state", "bcast"})
JOB_STATES = frozenset({"wait-repl", "active", "queued", "acked"})


@dataclass(slots=True, frozen=True)
class Call(Generic[T]):
    """One command: `args` as sent, `parse` for its reply, `safe` to resend elsewhere, and
    `blocking_ms` when the node may hold the reply back (GETJOB): None for a command that
    answers at once, 0 for one that may block forever."""

    args: tuple[Any, ...]
    parse: Callable[[Any], T]
    safe: bool = True
    blocking_ms: int | None = None


def _ms(name: str, value: int | float) -> int:
    v = int(value)
    if v < 0:
        raise ValueError(f"{name} must be >= 0 (milliseconds)")
    return v


def _addjob_options(replicate: int | None, delay: int | None, retry: int | None,
                    ttl: int | None, maxlen: int | None, async_: bool,
                    max_deliveries: int | None = None, max_nacks: int | None = None,
                    deadletter: str | bytes | None = None,
                    deadttl: int | None = None, backoff: int | None = None) -> list[Any]:
    """The options ADDJOB and ADDJOBS share, only those given (TTL/RETRY/DELAY/DEADTTL in
    seconds). The dead-letter policy (disque-py only, docs/commands.md "Failed jobs"):
    `max_deliveries` / `max_nacks` limits (0: none) and the `deadletter` queue a job over
    one goes to; `deadttl`, how long a dead job lives at least."""
    args: list[Any] = []
    if replicate is not None:
        args += ["REPLICATE", int(replicate)]
    if delay is not None:
        args += ["DELAY", int(delay)]
    if retry is not None:
        args += ["RETRY", int(retry)]
    if ttl is not None:
        args += ["TTL", int(ttl)]
    if maxlen is not None:
        args += ["MAXLEN", int(maxlen)]
    if async_:
        args.append("ASYNC")
    if max_deliveries is not None:
        args += ["MAXDELIVERIES", _count("max_deliveries", max_deliveries)]
    if max_nacks is not None:
        args += ["MAXNACKS", _count("max_nacks", max_nacks)]
    if deadletter is not None:
        if not deadletter:
            raise ValueError("deadletter queue name must not be empty")
        args += ["DEADLETTER", deadletter]
    if deadttl is not None:
        args += ["DEADTTL", _ms("deadttl", deadttl)]
    if backoff is not None:
        args += ["BACKOFF", _ms("backoff", backoff)]
    return args


def _count(name: str, value: int) -> int:
    """A MAXDELIVERIES / MAXNACKS limit: what every node refuses is refused before sending."""
    v = int(value)
    if not 0 <= v <= 65535:
        raise ValueError(f"{name} must be between 0 and 65535")
    return v


def dedup_key_arg(key: str | bytes) -> str | bytes:
    """A DEDUP key as sent; ValueError for what every node refuses."""
    if not key or len(key) > 512:
        raise ValueError("dedup key must be 1 to 512 bytes")
    return key


def addjob_args(queue: str | bytes, body: str | bytes, timeout_ms: int = 5000, *,
                replicate: int | None = None, delay: int | None = None,
                retry: int | None = None, ttl: int | None = None, maxlen: int | None = None,
                async_: bool = False, dedup: str | bytes | None = None,
                max_deliveries: int | None = None, max_nacks: int | None = None,
                deadletter: str | bytes | None = None, deadttl: int | None = None,
                backoff: int | None = None
                ) -> list[Any]:
    """ADDJOB's argument list (options only when given; TTL/RETRY/DELAY in seconds)."""
    args: list[Any] = ["ADDJOB", queue, body, _ms("timeout_ms", timeout_ms)]
    args += _addjob_options(replicate, delay, retry, ttl, maxlen, async_, max_deliveries,
                            max_nacks, deadletter, deadttl, backoff)
    if dedup is not None:
        args += ["DEDUP", dedup_key_arg(dedup)]
    return args


def addjobs_args(queue: str | bytes, bodies: Sequence[str | bytes], timeout_ms: int = 5000,
                 *, replicate: int | None = None, delay: int | None = None,
                 retry: int | None = None, ttl: int | None = None,
                 maxlen: int | None = None, async_: bool = False,
                 dedup_keys: Sequence[str | bytes] | None = None,
                 max_deliveries: int | None = None, max_nacks: int | None = None,
                 deadletter: str | bytes | None = None, deadttl: int | None = None,
                 backoff: int | None = None
                 ) -> list[Any]:
    """ADDJOBS's argument list: `queue timeout [options] [WITHDEDUP] JOBS body...`, with
    `key body` pairs after JOBS when `dedup_keys` (one per body) are given."""
    if not bodies:
        raise ValueError("ADDJOBS needs at least one body")
    args: list[Any] = ["ADDJOBS", queue, _ms("timeout_ms", timeout_ms)]
    args += _addjob_options(replicate, delay, retry, ttl, maxlen, async_, max_deliveries,
                            max_nacks, deadletter, deadttl, backoff)
    if dedup_keys is None:
        args.append("JOBS")
        args.extend(bodies)
        return args
    if len(dedup_keys) != len(bodies):
        raise ValueError("dedup_keys must have one key per body")
    args += ["WITHDEDUP", "JOBS"]
    for key, body in zip(dedup_keys, bodies, strict=True):
        args += [dedup_key_arg(key), body]
    return args


def add_job(queue: str | bytes, body: str | bytes, timeout_ms: int = 5000, *,
            replicate: int | None = None, delay: int | None = None, retry: int | None = None,
            ttl: int | None = None, maxlen: int | None = None, async_: bool = False,
            dedup: str | bytes | None = None, allow_retry: bool | None = None,
            max_deliveries: int | None = None, max_nacks: int | None = None,
            deadletter: str | bytes | None = None, deadttl: int | None = None,
            backoff: int | None = None) -> Call[str]:
    """ADDJOB -> the job ID. `allow_retry` defaults to True only with a `dedup` key."""
    args = addjob_args(queue, body, timeout_ms, replicate=replicate, delay=delay, retry=retry,
                       ttl=ttl, maxlen=maxlen, async_=async_, dedup=dedup,
                       max_deliveries=max_deliveries, max_nacks=max_nacks,
                       deadletter=deadletter, deadttl=deadttl, backoff=backoff)
    safe = (dedup is not None) if allow_retry is None else allow_retry
    # a synchronous ADDJOB waits for replication up to timeout_ms (0 = no limit)
    return Call(tuple(args), replies.parse_id, safe, int(timeout_ms))


def add_jobs_batch(queue: str | bytes, bodies: Sequence[str | bytes], timeout_ms: int = 5000,
                   *, replicate: int | None = None, delay: int | None = None,
                   retry: int | None = None, ttl: int | None = None,
                   maxlen: int | None = None, async_: bool = False,
                   dedup_keys: Sequence[str | bytes] | None = None,
                   allow_retry: bool | None = None, max_deliveries: int | None = None,
                   max_nacks: int | None = None, deadletter: str | bytes | None = None,
                   deadttl: int | None = None,
                   backoff: int | None = None) -> Call[list[str | DisqueError]]:
    """One ADDJOBS -> per body its job ID or its error (`DisqueError`), in order. An error
    of the command as a whole (syntax, unknown command on a node without ADDJOBS) raises.
    `allow_retry` defaults to True only with `dedup_keys`."""
    args = addjobs_args(queue, bodies, timeout_ms, replicate=replicate, delay=delay,
                        retry=retry, ttl=ttl, maxlen=maxlen, async_=async_,
                        dedup_keys=dedup_keys, max_deliveries=max_deliveries,
                        max_nacks=max_nacks, deadletter=deadletter, deadttl=deadttl,
                        backoff=backoff)
    safe = (dedup_keys is not None) if allow_retry is None else allow_retry
    return Call(tuple(args), replies.parse_addjobs, safe, int(timeout_ms))


def get_job(queues: Sequence[str | bytes], *, timeout: int | None = None, count: int | None = None,
            nohang: bool = False, with_counters: bool = False) -> Call[list[Job]]:
    """GETJOB [NOHANG] [TIMEOUT ms] [COUNT n] [WITHCOUNTERS] FROM q... -> jobs ([] on timeout).
    `timeout` is in milliseconds as on the wire; None (or 0) blocks until a job arrives."""
    if not queues:
        raise ValueError("get_job needs at least one queue")
    args: list[Any] = ["GETJOB"]
    if nohang:
        args.append("NOHANG")
    if timeout is not None:
        args += ["TIMEOUT", _ms("timeout", timeout)]
    if count is not None:
        if int(count) < 1:
            raise ValueError("count must be >= 1")
        args += ["COUNT", int(count)]
    if with_counters:
        args.append("WITHCOUNTERS")
    args.append("FROM")
    args.extend(queues)
    blocking = None if nohang else (0 if timeout is None else int(timeout))
    return Call(tuple(args), replies.parse_jobs, True, blocking)


def _ids(name: str, ids: Iterable[str | bytes], parse: Callable[[Any], T],
         safe: bool = True) -> Call[T]:
    return Call((name, *ids), parse, safe)


def ack_job(*ids: str | bytes) -> Call[int]:
    return _ids("ACKJOB", ids, replies.parse_int)


def fast_ack(*ids: str | bytes) -> Call[int]:
    return _ids("FASTACK", ids, replies.parse_int)


def nack(*ids: str | bytes, delay: int | None = None) -> Call[int]:
    """NACK; with `delay` (seconds) the jobs go back to their queue only after that long."""
    if delay is not None:
        return Call(("NACK", *ids, "DELAY", int(delay)), replies.parse_int, False)
    return _ids("NACK", ids, replies.parse_int, safe=False)


def enqueue(*ids: str | bytes) -> Call[int]:
    return _ids("ENQUEUE", ids, replies.parse_int)


def dequeue(*ids: str | bytes) -> Call[int]:
    return _ids("DEQUEUE", ids, replies.parse_int)


def del_job(*ids: str | bytes) -> Call[int]:
    return _ids("DELJOB", ids, replies.parse_int)


def working(job_id: str | bytes) -> Call[int]:
    """WORKING -> seconds until the job would be re-queued (its RETRY; 0 if at-most-once)."""
    return Call(("WORKING", job_id), replies.parse_int)


def redrive(queue: str | bytes, count: int | None = None, rate: int | None = None,
            reset: bool = False, ids: Sequence[str | bytes] | None = None) -> Call[int]:
    """REDRIVE: dead jobs queued in the dead-letter queue `queue` *on the node it is sent to*
    back to their source queues. With `ids` those jobs at once (-> how many moved); else a
    task moving `count` of them (default: all queued there now) at `rate` a second (default:
    the node's redrive-rate) (-> how many it will move). `reset` restarts their counters.
    Not resent on another node after a lost reply: another node has other dead jobs."""
    args: list[Any] = ["REDRIVE", queue]
    if count is not None:
        if int(count) < 1:
            raise ValueError("count must be >= 1")
        args += ["COUNT", int(count)]
    if rate is not None:
        if int(rate) < 1:
            raise ValueError("rate must be >= 1 (jobs per second)")
        args += ["RATE", int(rate)]
    if reset:
        args.append("RESET")
    if ids is not None:
        if not ids:
            raise ValueError("ids, when given, must name at least one job")
        args += ["ID", *ids]
    return Call(tuple(args), replies.parse_int, False)


def show(job_id: str | bytes) -> Call[dict[str, Any] | None]:
    return Call(("SHOW", job_id), replies.parse_show)


def qlen(queue: str | bytes) -> Call[int]:
    return Call(("QLEN", queue), replies.parse_int)


def qstat(queue: str | bytes) -> Call[dict[str, Any] | None]:
    return Call(("QSTAT", queue), replies.parse_qstat)


def qpeek(queue: str | bytes, count: int) -> Call[list[Job]]:
    return Call(("QPEEK", queue, int(count)), replies.parse_jobs)


def pause(queue: str | bytes, *options: str) -> Call[str]:
    """PAUSE queue in|out|all|none|state|bcast... -> the resulting state."""
    if not options:
        raise ValueError("pause needs at least one option (in, out, all, none, state, bcast)")
    bad = [o for o in options if o.lower() not in PAUSE_OPTIONS]
    if bad:
        raise ValueError(f"unknown PAUSE option(s) {bad}")
    return Call(("PAUSE", queue, *options), replies.parse_str)


def qscan(cursor: int = 0, *, count: int | None = None, busyloop: bool = False,
          minlen: int | None = None, maxlen: int | None = None,
          importrate: int | None = None) -> Call[tuple[int, list[str]]]:
    args: list[Any] = ["QSCAN", int(cursor)]
    if count is not None:
        args += ["COUNT", int(count)]
    if busyloop:
        args.append("BUSYLOOP")
    if minlen is not None:
        args += ["MINLEN", int(minlen)]
    if maxlen is not None:
        args += ["MAXLEN", int(maxlen)]
    if importrate is not None:
        args += ["IMPORTRATE", int(importrate)]
    return Call(tuple(args), replies.parse_scan)


def jscan(cursor: int = 0, *, count: int | None = None, busyloop: bool = False,
          queue: str | bytes | None = None, states: Iterable[str] = (),
          reply: str = "id") -> Call[tuple[int, list[Any]]]:
    """JSCAN; `reply="all"` makes the items SHOW dicts instead of IDs."""
    args: list[Any] = ["JSCAN", int(cursor)]
    if count is not None:
        args += ["COUNT", int(count)]
    if busyloop:
        args.append("BUSYLOOP")
    if queue is not None:
        args += ["QUEUE", queue]
    for state in states:
        if state.lower() not in JOB_STATES:
            raise ValueError(f"unknown job state {state!r}")
        args += ["STATE", state]
    if reply not in ("id", "all"):
        raise ValueError("reply must be 'id' or 'all'")
    parse: Callable[[Any], tuple[int, list[Any]]]
    if reply == "all":
        args += ["REPLY", "all"]
        parse = replies.parse_scan_all
    else:
        parse = replies.parse_scan
    return Call(tuple(args), parse)


def info(section: str | None = None) -> Call[dict[str, Any]]:
    return Call(("INFO",) if section is None else ("INFO", section), replies.parse_info)


def hello() -> Call[Hello]:
    return Call(("HELLO",), replies.parse_hello)


def ping() -> Call[str]:
    return Call(("PING",), replies.parse_str)


def raw(*args: Any, safe: bool = False) -> Call[Any]:
    """Any command, reply returned as redis-py parsed it."""
    return Call(tuple(args), lambda r: r, safe)
