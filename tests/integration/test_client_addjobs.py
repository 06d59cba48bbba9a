"""`add_jobs` over ADDJOBS against real nodes, with the blocking and the asyncio client: one
ADDJOBS per batch with one ID or one error per body in order, dedup keys that make a batch
whose reply was lost safe to send again (a proxy loses the reply after the node ran the
command), and the fallback to pipelined ADDJOBs on a node that does not have ADDJOBS
(`rename-command ADDJOBS ""`, which answers as antirez's Disque does), found out once."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Iterator
from typing import Any

import hiredis
import pytest

from disque.client import (
    AddJobsResult,
    AsyncClient,
    Client,
    DisqueConnectionError,
    DisqueError,
    MaxLenError,
)
from tests.harness import DisqueProcess
from tests.integration.resp import JOB_ID_RE

RENAMED = ["--rename-command", "ADDJOBS", ""]


class Proxy:
    """A TCP proxy in front of a node, run by threads in the test process. It records every
    byte the clients send (`sent`); with `lose_reply_to`, the first request containing those
    bytes reaches the node, whose whole reply the proxy reads and keeps (`lost`, as hiredis
    parses it) and then closes that connection without passing the reply on."""

    def __init__(self, port: int, lose_reply_to: bytes | None = None) -> None:
        self.target = ("127.0.0.1", port)
        self.lose = lose_reply_to
        self.sent = bytearray()
        self.lost: Any = None
        self.armed = False
        self.lock = threading.Lock()
        self.socks: list[socket.socket] = []
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.addr = f"127.0.0.1:{self.sock.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def count(self, command: bytes) -> int:
        """How many times clients sent `command` (as a RESP bulk string)."""
        with self.lock:
            return bytes(self.sent).count(b"$%d\r\n%s\r\n" % (len(command), command))

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target, timeout=10)
            upstream.settimeout(None)
            self.socks += [client, upstream]
            state = {"losing": False}
            threading.Thread(target=self._requests, args=(client, upstream, state),
                             daemon=True).start()
            threading.Thread(target=self._replies, args=(upstream, client, state),
                             daemon=True).start()

    def _requests(self, client: socket.socket, upstream: socket.socket,
                  state: dict[str, bool]) -> None:
        try:
            while data := client.recv(65536):
                with self.lock:
                    self.sent += data
                    if self.lose is not None and not self.armed and self.lose in data:
                        self.armed = state["losing"] = True
                upstream.sendall(data)
        except OSError:
            pass
        finally:
            _shutdown(client, upstream)

    def _replies(self, upstream: socket.socket, client: socket.socket,
                 state: dict[str, bool]) -> None:
        reader = hiredis.Reader()
        try:
            while data := upstream.recv(65536):
                if not state["losing"]:
                    client.sendall(data)
                    continue
                reader.feed(data)
                reply = reader.gets()
                if reply is not False:  # the node answered in full: lose it
                    self.lost = reply
                    return
        except OSError:
            pass
        finally:
            _shutdown(client, upstream)

    def close(self) -> None:
        self.sock.close()
        for s in self.socks:
            s.close()


def _shutdown(*socks: socket.socket) -> None:
    for s in socks:
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


@pytest.fixture
def proxy() -> Iterator[Any]:
    """Factory: proxy(node, lose_reply_to=None); every proxy closed at teardown."""
    made: list[Proxy] = []

    def factory(node: DisqueProcess, lose_reply_to: bytes | None = None) -> Proxy:
        made.append(Proxy(node.port, lose_reply_to))
        return made[-1]

    try:
        yield factory
    finally:
        for p in made:
            p.close()


@pytest.fixture
def renamed(make_server: Any) -> DisqueProcess:
    """A node without ADDJOBS: it answers `-ERR unknown command 'ADDJOBS'`."""
    return make_server(args=RENAMED)


def add_jobs(kind: str, addr: str, calls: list[tuple[Any, ...]], **client_kw: Any
             ) -> tuple[list[AddJobsResult], bool | None]:
    """Run `add_jobs(*args, **kw)` for each (args, kw) of `calls` on one client of `kind`
    ("sync" or "async") pinned to `addr`; the results and whether it saw ADDJOBS there."""
    if kind == "sync":
        with Client([addr], discover=False, **client_kw) as c:
            return [c.add_jobs(*args, **kw) for args, kw in calls], c.has_addjobs()

    async def run() -> tuple[list[AddJobsResult], bool | None]:
        async with AsyncClient([addr], discover=False, **client_kw) as c:
            return [await c.add_jobs(*args, **kw) for args, kw in calls], c.has_addjobs()

    return asyncio.run(run())


def calls_of(node: DisqueProcess, command: str) -> int:
    """INFO commandstats: how many times `node` ran `command`."""
    stats = node.client().info("commandstats")
    return int(stats.get(f"cmdstat_{command}", {}).get("calls", 0))


def addr(node: DisqueProcess) -> str:
    return f"127.0.0.1:{node.port}"


def qlen(node: DisqueProcess, queue: str) -> int:
    with Client([addr(node)]) as c:
        return c.qlen(queue)


both = pytest.mark.parametrize("kind", ["sync", "async"])


@both
def test_add_jobs_sends_one_addjobs_per_batch_with_the_ids_in_order(
        kind: str, node: DisqueProcess, q: str) -> None:
    bodies = [b"body%d" % i for i in range(250)]
    before = (calls_of(node, "addjobs"), calls_of(node, "addjob"))
    [result], has = add_jobs(kind, addr(node), [((q, bodies), dict(batch_size=100))])
    assert result.ok and has is True
    assert all(JOB_ID_RE.match(i or "") for i in result.ids) and len(set(result.ids)) == 250
    assert (calls_of(node, "addjobs"), calls_of(node, "addjob")) == (before[0] + 3, before[1])
    with Client([addr(node)]) as c:
        jobs = c.get_job(q, count=250, nohang=True)
    assert [j.id for j in jobs] == result.ids and [j.body for j in jobs] == bodies


@both
def test_add_jobs_reports_maxlen_reached_mid_batch_for_those_jobs_only(
        kind: str, node: DisqueProcess, q: str) -> None:
    [result], _ = add_jobs(kind, addr(node), [((q, [b"a", b"b", b"c", b"d", b"e"]),
                                               dict(maxlen=3, batch_size=4))])
    assert [type(e) for e in result.errors] == [type(None)] * 3 + [MaxLenError] * 2
    assert all(result.ids[:3]) and result.ids[3:] == [None, None]
    assert (result.added, result.failed) == (3, 2)
    with Client([addr(node)]) as c:
        assert [j.body for j in c.qpeek(q, 10)] == [b"a", b"b", b"c"]


@both
def test_add_jobs_dedup_keys_answer_the_first_ids_within_a_batch_and_across_calls(
        kind: str, node: DisqueProcess, q: str) -> None:
    keys = ["k0", "k1", "k0"]
    [first, again], _ = add_jobs(kind, addr(node), [
        ((q, [b"x0", b"x1", b"x2"]), dict(dedup_keys=keys)),
        ((q, [b"y0", b"y1", b"y2"]), dict(dedup_keys=keys))])
    assert first.ok and first.ids[0] == first.ids[2] != first.ids[1]
    assert again.ids == first.ids
    assert qlen(node, q) == 2


@both
def test_a_batch_whose_reply_was_lost_is_resent_with_its_dedup_keys_and_gets_the_same_ids(
        kind: str, node: DisqueProcess, proxy: Any, q: str) -> None:
    p = proxy(node, lose_reply_to=b"ADDJOBS")
    keys = [f"{q}:{i}" for i in range(20)]
    [result], _ = add_jobs(kind, p.addr, [((q, [b"v%d" % i for i in range(20)]),
                                           dict(dedup_keys=keys))])
    assert p.lost is not None, "the proxy lost no reply"
    assert result.ok
    assert result.ids == [job_id.decode() for job_id in p.lost]  # the IDs of the first send
    assert p.count(b"ADDJOBS") == 2
    assert qlen(node, q) == 20


@both
def test_a_batch_without_dedup_keys_is_not_resent_after_a_lost_reply(
        kind: str, node: DisqueProcess, proxy: Any, q: str) -> None:
    p = proxy(node, lose_reply_to=b"ADDJOBS")
    [result], _ = add_jobs(kind, p.addr, [((q, [b"a", b"b"]), {})])
    assert result.ids == [None, None]
    assert all(isinstance(e, DisqueConnectionError) and not e.unreachable
               for e in result.errors)
    assert p.count(b"ADDJOBS") == 1
    assert qlen(node, q) == 2  # the node did add them: that is why it is not resent


@both
def test_a_node_without_addjobs_gets_pipelined_addjobs_found_out_once(
        kind: str, renamed: DisqueProcess, proxy: Any) -> None:
    p = proxy(renamed)
    bodies = [b"r%d" % i for i in range(30)]
    [first, second], has = add_jobs(kind, p.addr, [
        (("q", bodies), dict(maxlen=25, batch_size=10)),
        (("q2", bodies[:5]), dict(dedup_keys=["a", "b", "a", "c", "d"]))])
    assert has is False
    assert p.count(b"ADDJOBS") == 1  # the first batch only; then ADDJOB for every body
    assert p.count(b"ADDJOB") == 35
    assert first.ids[:25] == [i for i in first.ids[:25] if i and JOB_ID_RE.match(i)]
    assert [type(e) for e in first.errors[25:]] == [MaxLenError] * 5
    assert second.ok and second.ids[0] == second.ids[2]
    with Client([addr(renamed)]) as c:
        assert [j.body for j in c.qpeek("q", 30)] == bodies[:25]
        assert c.qlen("q2") == 4


def test_add_jobs_batch_is_one_addjobs_and_raises_on_a_node_without_it(
        node: DisqueProcess, renamed: DisqueProcess, q: str) -> None:
    with Client([addr(node)]) as c:
        got = c.add_jobs_batch(q, [b"a", b"b"], maxlen=1)
        with pytest.raises(DisqueError, match="unknown command"):
            c.add_jobs_batch(q, [b"a"], node=addr(renamed))
    assert isinstance(got[0], str) and JOB_ID_RE.match(got[0])
    assert isinstance(got[1], MaxLenError)


async def test_async_add_jobs_batch_is_one_addjobs_and_raises_on_a_node_without_it(
        node: DisqueProcess, renamed: DisqueProcess, q: str) -> None:
    async with AsyncClient([addr(node)]) as c:
        got = await c.add_jobs_batch(q, [b"a", b"b"], dedup_keys=["k", "k"])
        with pytest.raises(DisqueError, match="unknown command"):
            await c.add_jobs_batch(q, [b"a"], node=addr(renamed))
    assert isinstance(got[0], str) and got[1] == got[0]



def test_a_lost_batch_with_maxlen_resent_with_dedup_keys_gets_its_ids(
        node: DisqueProcess, proxy: Any, q: str) -> None:
    """The first send fills the queue up to MAXLEN and its reply is lost; the resend must
    answer the jobs it added, not report them as refused."""
    p = proxy(node, lose_reply_to=b"ADDJOBS")
    [result], _ = add_jobs("sync", p.addr, [((q, [b"a", b"b", b"c"]),
                                             dict(maxlen=3, dedup_keys=["a", "b", "c"]))])
    assert p.lost is not None and qlen(node, q) == 3
    assert result.errors == [None] * 3
    assert result.ids == [job_id.decode() for job_id in p.lost]
