"""`add_jobs` without I/O: which commands carry a list of bodies to a node, and how their
replies fill the `AddJobsResult`. `Client` and `AsyncClient` drive it the same way, each
around its own sockets:

    batch = AddJobsBatch(queue, bodies, ..., support=client.addjobs_support)
    for todo in batch.chunks():
        while todo:                                   # the failover policy is `Attempts`
            sent = batch.round_trip(todo, node)       # written at once, replies read in order
            for command in sent:
                batch.take(command, reply_or_error, node)
            todo = batch.pending(todo)
    result = batch.result()

The policy:
- A chunk of `batch_size` bodies goes to a node as one ADDJOBS (the node replicates the
  whole chunk in one bus round trip); its array reply has one ID or one error per body.
  With dedup keys it is `ADDJOBS ... WITHDEDUP JOBS key body ...`.
- A node that answers ADDJOBS with "unknown command" (antirez's Disque, or a disque-py node
  that renamed ADDJOBS away) is remembered in `support` (per address, shared by the
  client's calls): the same chunk, and every later one for that node, goes as pipelined
  ADDJOBs, one per body (with its DEDUP key). The fallback costs one round trip, once.
- An error reply to ADDJOBS as a whole (OOM, NOAUTH, a bad option) is every body's error,
  as each of the pipelined ADDJOBs would have got it.
- After a lost connection the bodies whose reply was not read are sent again only when the
  batch is `safe`: with dedup keys (a node answers a key it has seen with the first job's
  ID), or when the caller allows it; `Attempts` decides where.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from disque.client import calls, replies
from disque.client.base import AddJobsResult
from disque.client.errors import DisqueError
from disque.client.nodes import Node


@dataclass(slots=True, frozen=True)
class Command:
    """One command of a round trip: its arguments and the bodies (positions) it adds;
    `batch` for an ADDJOBS (an array reply), else one ADDJOB."""

    args: list[Any]
    positions: Sequence[int]
    batch: bool


def is_unknown_command(error: DisqueError) -> bool:
    """`-ERR unknown command 'ADDJOBS'`: the node does not have the command."""
    return error.prefix == "ERR" and error.message.lower().startswith("unknown command")


class AddJobsBatch:
    """One `add_jobs` call: its commands, its replies, its result. See the module doc."""

    __slots__ = ("queue", "bodies", "dedup_keys", "options", "blocking_ms", "safe",
                 "batch_size", "support", "ids", "errors", "answered", "template")

    def __init__(self, queue: str | bytes, bodies: Sequence[str | bytes],
                 timeout_ms: int = 5000, *, replicate: int | None = None,
                 delay: int | None = None, retry: int | None = None, ttl: int | None = None,
                 maxlen: int | None = None, async_: bool = False,
                 dedup_keys: Sequence[str | bytes] | None = None,
                 allow_retry: bool | None = None, batch_size: int = 1000,
                 support: dict[str, bool] | None = None, max_deliveries: int | None = None,
                 max_nacks: int | None = None, deadletter: str | bytes | None = None,
                 deadttl: int | None = None, backoff: int | None = None) -> None:
        n = len(bodies)
        if dedup_keys is not None and len(dedup_keys) != n:
            raise ValueError("dedup_keys must have one key per body")
        if batch_size < 1:
            raise ValueError("batch_size must be >= 1")
        for key in dedup_keys or ():
            calls.dedup_key_arg(key)  # refused before anything is sent
        self.queue = queue
        self.bodies = bodies
        self.dedup_keys = dedup_keys
        self.options: dict[str, Any] = dict(replicate=replicate, delay=delay, retry=retry,
                                            ttl=ttl, maxlen=maxlen, async_=async_,
                                            max_deliveries=max_deliveries,
                                            max_nacks=max_nacks, deadletter=deadletter,
                                            deadttl=deadttl, backoff=backoff)
        # checks the options and the timeout once; ADDJOB's body goes at [2]
        self.template = calls.addjob_args(queue, b"", timeout_ms, **self.options)
        self.blocking_ms = int(timeout_ms)  # how long a node may hold the replies back
        self.safe = (dedup_keys is not None) if allow_retry is None else allow_retry
        self.batch_size = batch_size
        self.support = {} if support is None else support
        self.ids: list[str | None] = [None] * n
        self.errors: list[DisqueError | None] = [None] * n
        self.answered = bytearray(n)

    def chunks(self) -> list[list[int]]:
        """The positions of the bodies, `batch_size` at a time: one round trip each."""
        n, size = len(self.bodies), self.batch_size
        return [list(range(i, min(i + size, n))) for i in range(0, n, size)]

    def round_trip(self, todo: Sequence[int], node: Node) -> list[Command]:
        """The commands that add bodies `todo` on `node`, to be written at once."""
        bodies, keys = self.bodies, self.dedup_keys
        if self.support.get(node.addr, True):
            args = calls.addjobs_args(self.queue, [bodies[i] for i in todo], self.blocking_ms,
                                      dedup_keys=None if keys is None
                                      else [keys[i] for i in todo], **self.options)
            return [Command(args, todo, True)]
        sent = []
        for i in todo:
            args = list(self.template)
            args[2] = bodies[i]
            if keys is not None:
                args += ["DEDUP", keys[i]]
            sent.append(Command(args, (i,), False))
        return sent

    def take(self, command: Command, reply: Any, node: Node) -> None:
        """The reply to `command` from `node` (a `DisqueError` for an error reply)."""
        if isinstance(reply, DisqueError):
            if command.batch and is_unknown_command(reply):
                self.support[node.addr] = False  # its bodies stay pending: sent as ADDJOBs
                return
            for i in command.positions:
                self._answer(i, None, reply)
            return
        if not command.batch:
            self._answer(command.positions[0], replies.parse_id(reply), None)
            return
        self.support[node.addr] = True
        if not isinstance(reply, list) or len(reply) != len(command.positions):
            error = DisqueError(f"ADDJOBS of {len(command.positions)} jobs answered {reply!r}")
            for i in command.positions:
                self._answer(i, None, error)
            return
        for i, item in zip(command.positions, replies.parse_addjobs(reply), strict=True):
            if isinstance(item, DisqueError):
                self._answer(i, None, item)
            else:
                self._answer(i, item, None)

    def _answer(self, i: int, job_id: str | None, error: DisqueError | None) -> None:
        self.ids[i] = job_id
        self.errors[i] = error
        self.answered[i] = 1

    def pending(self, todo: Sequence[int]) -> list[int]:
        """The bodies of `todo` not answered yet."""
        answered = self.answered
        return [i for i in todo if not answered[i]]

    def fail(self, todo: Sequence[int], error: DisqueError) -> None:
        """No answer will come for `todo` (no node, or a lost reply not safe to resend)."""
        for i in todo:
            self.ids[i] = None
            self.errors[i] = error

    def result(self) -> AddJobsResult:
        return AddJobsResult(self.ids, self.errors)
