"""Replies as typed values: pure functions from what redis-py's parser returns to records.

redis-py hands back bytes for bulk and status strings, ints, lists and None (for both RESP2
nulls and the RESP3 `_`); these functions accept exactly that, in either protocol version, and
never touch a socket. Job bodies stay bytes (they are the user's payload); IDs, queue names and
SHOW/QSTAT field names become `str`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from disque.client.errors import DisqueError, error_from_redis
from disque.protocol.values import decode

ID_LEN = 40


def is_job_id(job_id: str) -> bool:
    """The node's own format check: 40 chars, `D-`, dashes at 10 and 35."""
    return (len(job_id) == ID_LEN and job_id.startswith("D-") and job_id[10] == "-"
            and job_id[35] == "-")


def node_prefix(job_id: str) -> str:
    """The 8 characters of the creating node's ID a job ID carries (positions 2..9)."""
    return job_id[2:10]


@dataclass(slots=True, frozen=True)
class Job:
    """One job as GETJOB / QPEEK return it. The counters are None unless asked for
    (GETJOB WITHCOUNTERS)."""

    queue: str
    id: str
    body: bytes
    nacks: int | None = None
    additional_deliveries: int | None = None

    @property
    def node_prefix(self) -> str:
        return node_prefix(self.id)


def parse_job(entry: list[Any]) -> Job:
    """`[queue, id, body]` or `[queue, id, body, "nacks", n, "additional-deliveries", n]`."""
    queue, job_id, body = entry[0], entry[1], entry[2]
    nacks = deliveries = None
    if len(entry) > 3:
        extra = dict(zip(decode(entry[3::2]), entry[4::2], strict=False))
        nacks = int(extra.get("nacks", 0))
        deliveries = int(extra.get("additional-deliveries", 0))
    return Job(decode(queue), decode(job_id), body if isinstance(body, bytes) else
               str(body).encode(), nacks, deliveries)


def parse_jobs(reply: Any) -> list[Job]:
    """GETJOB / QPEEK: an array of jobs, or a null (timeout, NOHANG) which becomes []."""
    if reply is None:
        return []
    return [parse_job(entry) for entry in reply]


def parse_int(reply: Any) -> int:
    return int(reply)


def parse_str(reply: Any) -> str:
    return decode(reply)


def parse_id(reply: Any) -> str:
    """ADDJOB's status reply (bytes in both protocols)."""
    return reply.decode("ascii") if isinstance(reply, bytes) else str(reply)


def parse_addjobs(reply: Any) -> list[str | DisqueError]:
    """ADDJOBS: an array with, per job, its ID (a status reply) or its error. redis-py leaves
    an error inside an array as a `ResponseError` instance in the list (it raises only a
    top-level one); each becomes its typed `DisqueError`."""
    return [error_from_redis(item) if isinstance(item, Exception) else parse_id(item)
            for item in reply]


_BYTES_FIELDS = frozenset({"body"})


def parse_pairs(reply: Any) -> dict[str, Any]:
    """A flat `[name, value, name, value...]` array (SHOW, QSTAT, JSCAN REPLY all) -> dict.
    Values are decoded to str except `body`; a RESP3 map (should a node send one) works too."""
    if isinstance(reply, dict):
        items = list(reply.items())
    else:
        items = list(zip(reply[0::2], reply[1::2], strict=False))
    out: dict[str, Any] = {}
    for key, value in items:
        name = decode(key)
        out[name] = value if name in _BYTES_FIELDS else decode(value)
    return out


def parse_show(reply: Any) -> dict[str, Any] | None:
    """SHOW: None for an unknown job, else its fields by name: the original's 15, and for a
    job with a dead-letter policy 8 more (`max-deliveries`, `max-nacks`, `deadletter-queue`,
    `source-queue`, `deadletter-reason` and `deadletter-time`, None while it is alive,
    `redrives` and `backoff`)."""
    return None if reply is None else parse_pairs(reply)


def parse_qstat(reply: Any) -> dict[str, Any] | None:
    """QSTAT: None for an unknown queue, else the 10 fields by name (and `deadlettered`, the
    jobs this node moved out of the queue to a dead-letter queue, once there are some)."""
    return None if reply is None else parse_pairs(reply)


@dataclass(slots=True, frozen=True)
class HelloNode:
    id: str
    host: str
    port: int
    priority: int


@dataclass(slots=True, frozen=True)
class Hello:
    """Disque's plain HELLO: format version, the answering node's ID, every known node."""

    version: int
    node_id: str
    nodes: list[HelloNode]


def parse_hello(reply: Any) -> Hello:
    """`[1, myid, [id, ip, port, priority], ...]` (port and priority are bulk strings)."""
    if isinstance(reply, dict) or not isinstance(reply, list) or len(reply) < 2:
        raise ValueError(f"not a Disque HELLO reply: {reply!r}")
    nodes = []
    for entry in reply[2:]:
        node_id, host, port, priority = decode(entry[:4])
        nodes.append(HelloNode(node_id, host, int(port), int(priority)))
    return Hello(int(reply[0]), decode(reply[1]), nodes)


def parse_scan(reply: Any) -> tuple[int, list[str]]:
    """QSCAN / JSCAN (REPLY id): `[cursor, [items]]` -> (next cursor, names or IDs)."""
    return int(reply[0]), [decode(item) for item in reply[1]]


def parse_scan_all(reply: Any) -> tuple[int, list[dict[str, Any]]]:
    """JSCAN REPLY all: `[cursor, [show-array, ...]]` -> (next cursor, SHOW dicts)."""
    return int(reply[0]), [parse_pairs(item) for item in reply[1]]


def _number(text: str) -> Any:
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        return text


def parse_info(reply: Any) -> dict[str, Any]:
    """INFO's bulk text -> {field: value}, numbers converted; section headers skipped."""
    text = decode(reply)
    out: dict[str, Any] = {}
    for line in text.splitlines():
        if not line or line.startswith("#") or ":" not in line:
            continue
        key, _, value = line.partition(":")
        out[key] = _number(value)
    return out


def parse_ok(reply: Any) -> bool:
    return decode(reply) == "OK"
