"""BusLink output over a real socket pair: a message that cannot be encoded loses only
itself, never the batch it was queued with."""

from __future__ import annotations

import asyncio
import random
import socket

from disque.cluster.bus import Bus, BusLink
from disque.cluster.membership import Membership
from disque.cluster.messages import Fail, FrameDecoder, GotJob, JobRecord, ReplJob

ME = b"a" * 40
PEER = b"b" * 40


def record(ttl_ms: int) -> JobRecord:
    return JobRecord(b"D-aaaaaaaa-" + b"x" * 24 + b"-05a1", b"q", b"body", 2, ttl_ms,
                     1, 0, 30, 0, 0, (ME,))


async def test_an_unencodable_message_is_dropped_and_the_rest_of_the_batch_is_sent() -> None:
    loop = asyncio.get_running_loop()
    membership = Membership(ME, 7711, clock=lambda: 0, rng=random.Random(1))
    bus = Bus(membership, save_config=lambda _reason: None)
    ours, theirs = socket.socketpair()
    theirs.setblocking(False)
    try:
        _, link = await loop.create_connection(lambda: BusLink(bus, inbound=False), sock=ours)
        header = membership.header
        link.send(Fail(header, PEER))
        link.send(ReplJob(header, record(1 << 70)))  # beyond u64: msgpack refuses it
        link.send(ReplJob(header, record(5000)))
        link.flush()
        decoder = FrameDecoder()
        got: list = []
        deadline = loop.time() + 10
        while len(got) < 2 and loop.time() < deadline:
            try:
                got += decoder.feed(await loop.sock_recv(theirs, 65536))
            except BlockingIOError:
                await asyncio.sleep(0.01)
        assert [type(m).__name__ for m in got] == ["Fail", "ReplJob"]
        assert got[1].job.ttl_ms == 5000
        assert "bus.encode_error" in bus.error_log
        assert not link.closed
    finally:
        link.close()
        theirs.close()


def test_bus_links_leave_from_a_bind_address_that_can_reach_the_peer() -> None:
    from disque.cluster.bus import source_for
    binds = ["127.0.0.2", "10.1.2.3", "::1"]
    assert source_for("127.0.0.1", binds) == "127.0.0.2"  # loopback peer: loopback source
    assert source_for("10.9.9.9", binds) == "10.1.2.3"  # remote peer: never 127.x
    assert source_for("::1", binds) == "::1"
    assert source_for("fe80::1", binds) == ""  # no IPv6 non-loopback bind: kernel's choice
    assert source_for("10.9.9.9", ["127.0.0.1"]) == ""
    assert source_for("node-2.example", binds) == ""


async def test_a_link_closed_by_a_message_delivers_nothing_more_from_the_same_read() -> None:
    # Compiled, BusLink.data_received's check for a link closed during the loop was a block
    # mypy took for unreachable (`closed` narrowed to False by the check on entry), which
    # mypyc turns into `raise RuntimeError`: the check must really run.
    loop = asyncio.get_running_loop()
    membership = Membership(ME, 7711, clock=lambda: 0, rng=random.Random(1))
    delivered: list = []

    def deliver(link: BusLink, msg: object) -> None:
        delivered.append(msg)
        link.close()  # as a slow peer's output limit does, from inside the delivery

    bus = Bus(membership, save_config=lambda _reason: None, deliver_job_message=deliver)
    ours, theirs = socket.socketpair()
    try:
        _, link = await loop.create_connection(lambda: BusLink(bus, inbound=False), sock=ours)
        header = membership.header
        frames = b"".join(m.encode() for m in (GotJob(header, b"D-aaaaaaaa-" + b"x" * 24
                                                      + b"-05a1", 0),
                                               GotJob(header, b"D-bbbbbbbb-" + b"x" * 24
                                                      + b"-05a1", 0)))
        link.data_received(frames)  # raised RuntimeError on the compiled build
        assert len(delivered) == 1 and link.closed
    finally:
        link.close()
        theirs.close()
