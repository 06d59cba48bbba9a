"""Python client for disque-py (and antirez's Disque): blocking `Client`, asyncio
`AsyncClient`.

    from disque.client import Client
    c = Client(["127.0.0.1:7711", "127.0.0.1:7712"])     # or "disque://h:p,h:p"
    job_id = c.add_job("emails", b"to:tom", retry=60)
    for job in c.get_job("emails", timeout=1000, count=10):
        ...
        c.ack_job(job.id)

How it is built (the spec's "Client libraries" section):
- Connections are redis-py's (hiredis parses replies and packs commands when installed), one
  pool per node; both RESP2 and RESP3 (`protocol=2|3`) work, and a node that refuses
  redis-py's `HELLO 3` handshake (antirez's Disque) gets RESP2 without being asked.
- The client connects to a random reachable node, sends HELLO and keeps the cluster's node
  list from it, preferring nodes with the lowest priority (`nodes.NodeTable`).
- `-LEAVING` and lost connections move it to another node; a command is sent again only where
  that is safe (`calls` says which: GETJOB always, ADDJOB only if the caller allows it or it
  carries a DEDUP key).
- `add_jobs` sends one ADDJOBS per batch, or pipelined ADDJOBs to a node that does not have
  ADDJOBS (antirez's Disque), found out once per node (`batch`).
- Error replies become typed exceptions (`errors`), replies typed values (`replies`).
- `consume()` runs workers with ACK / NACK / WORKING and moves next to the producers.

Modules: `calls` (what each command sends and how its reply is read), `replies`, `errors`,
`nodes`, `batch`, `base` (settings and every connection and failover decision: all pure),
`sync` / `aio` (the I/O that drives them), `consumer`.
"""

from disque.client.aio import AsyncClient
from disque.client.base import AddJobsResult, ConsumeStats
from disque.client.errors import (
    AuthError,
    BadIdError,
    DisqueConnectionError,
    DisqueError,
    LeavingError,
    MaxLenError,
    NoJobError,
    NoReplicationError,
    OutOfMemoryError,
    PausedError,
    TooLateError,
)
from disque.client.nodes import Node, parse_nodes
from disque.client.replies import Hello, HelloNode, Job
from disque.client.sync import Client

__all__ = [
    "AddJobsResult",
    "AsyncClient",
    "AuthError",
    "BadIdError",
    "Client",
    "ConsumeStats",
    "DisqueConnectionError",
    "DisqueError",
    "Hello",
    "HelloNode",
    "Job",
    "LeavingError",
    "MaxLenError",
    "NoJobError",
    "NoReplicationError",
    "Node",
    "OutOfMemoryError",
    "PausedError",
    "TooLateError",
    "parse_nodes",
]
