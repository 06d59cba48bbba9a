"""Membership state machine, driven by hand: events in, effects out, a fake clock."""

from __future__ import annotations

import random
from typing import Any

import pytest

from disque.cluster.effects import gossip_entries
from disque.cluster.membership import (
    BLACKLIST_TTL,
    MIN_HANDSHAKE_TIMEOUT,
    SAVE_CONFIG,
    CloseLink,
    Connect,
    LinkChanged,
    Log,
    Membership,
    Send,
    new_node_id,
)
from disque.cluster.messages import (
    INCARNATION_SHIFT,
    AuthChallenge,
    Fail,
    GossipEntry,
    Header,
    Meet,
    Ping,
    Pong,
)
from disque.cluster.nodes import (
    FAIL,
    HANDSHAKE,
    LEAVING,
    MYSELF,
    NOADDR,
    PFAIL,
    ClusterNode,
    NodesConfError,
    parse_nodes_conf,
    render_nodes_conf,
)
from disque.protocol.errors import CommandError

T0 = 1_700_000_000_000
ME = b"0" * 40
A, B, C, D = (bytes([c]) * 40 for c in b"abcd")
ADDR = {A: b"10.0.0.2", B: b"10.0.0.3", C: b"10.0.0.4", D: b"10.0.0.5"}


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> int:
        return self.now


class Link:
    """An opaque link object, as the I/O layer would hand in."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"Link({self.name})"


def make(node_timeout: int = 1000, **kw: Any) -> tuple[Membership, Clock]:
    clock = Clock()
    m = Membership(ME, 7711, clock=clock, rng=random.Random(1), node_timeout=node_timeout,
                   **kw)
    return m, clock


def hdr(node_id: bytes, flags: int = 0, ip: bytes = b"", port: int = 7711) -> Header:
    return Header(node_id, ip, port, port + 10000, flags)


def of(effects: list[Any], kind: type) -> list[Any]:
    return [e for e in effects if isinstance(e, kind)]


def sends(effects: list[Any], msg_type: type | None = None) -> list[Send]:
    return [e for e in of(effects, Send) if msg_type is None or type(e.msg) is msg_type]


def logs(effects: list[Any], event: str) -> list[Log]:
    return [e for e in of(effects, Log) if e.event == event]


def add_peer(m: Membership, node_id: bytes, flags: int = 0) -> Link:
    """Make `node_id` known and connected through the MEET-receiver path; returns the
    outbound link to it (its first PING answered)."""
    inbound = Link(f"in-{node_id[:1].decode()}")
    m.link_message(inbound, Meet(hdr(node_id, flags), []), ADDR[node_id])
    effects = m.drain()
    (connect,) = of(effects, Connect)
    out = Link(f"out-{node_id[:1].decode()}")
    m.link_connected(out, connect.token)
    m.link_message(out, Pong(hdr(node_id, flags), []), ADDR[node_id])
    m.drain()
    return out


# ---------------------------------------------------------------------------- handshake
def test_meet_starts_a_handshake_with_a_temporary_id_and_a_meet_on_a_new_link() -> None:
    m, clock = make()
    m.meet(b"10.0.0.2", 7712)
    (connect,) = of(m.drain(), Connect)
    assert (connect.ip, connect.bus_port) == (b"10.0.0.2", 17712)
    temp = m.get(connect.node_id)
    assert temp is not None and temp.bits & HANDSHAKE and temp.link == "disconnected"
    assert m.known() == 2 and m.size() == 1 and m.reachable() == ()
    link = Link("out")
    m.link_connected(link, connect.token)
    (send,) = sends(m.drain())
    assert send.link is link and isinstance(send.msg, Meet)
    assert send.msg.header.sender == ME and send.msg.header.bus_port == 17711


def test_the_handshake_pong_gives_the_entry_its_real_id() -> None:
    m, clock = make()
    m.meet("10.0.0.2", 7712)
    (connect,) = of(m.drain(), Connect)
    link = Link("out")
    m.link_connected(link, connect.token)
    m.drain()
    clock.now += 5
    m.link_message(link, Pong(hdr(A, port=7712), []), b"10.0.0.2")
    effects = m.drain()
    assert SAVE_CONFIG in effects and logs(effects, "node.added")
    node = m.get(A)
    assert node is not None and m.get(connect.node_id) is None
    assert node.flags == [] and node.link == "connected"
    assert (node.ip, node.port, node.bus_port) == (b"10.0.0.2", 7712, 17712)
    assert node.pong_received == clock.now and node.ping_sent == 0
    assert m.reachable() == (A,) and m.size() == 2


def test_meet_validates_the_address_and_a_pending_handshake_is_not_duplicated() -> None:
    m, _ = make()
    for ip, port in ((b"nonsense", 7711), (b"10.0.0.2", 0), (b"10.0.0.2", 55536)):
        with pytest.raises(CommandError, match="Invalid node address specified"):
            m.meet(ip, port)
    m.meet(b"10.0.0.2", 55535)
    m.meet(b"10.0.0.2", 55535)
    assert len(of(m.drain(), Connect)) == 1
    assert m.known() == 2
    m.meet(b"0:0::1", 7000)  # addresses are canonical, so duplicates are recognised
    m.meet(b"::1", 7000)
    assert [c.ip for c in of(m.drain(), Connect)] == [b"::1"]


def test_a_handshake_pong_from_a_known_node_or_myself_drops_the_entry() -> None:
    m, _ = make()
    add_peer(m, A)
    for answer in (A, ME):
        m.meet(b"10.0.0.9", 7711)
        (connect,) = of(m.drain(), Connect)
        link = Link("hs")
        m.link_connected(link, connect.token)
        m.drain()
        m.link_message(link, Pong(hdr(answer), []), b"10.0.0.9")
        assert CloseLink(link) in m.drain()
        assert m.get(connect.node_id) is None
        assert [n.id for n in m.nodes()] == [ME, A]
    # A answered from 10.0.0.9: that is its address now.
    assert m.get(A).ip == b"10.0.0.9"  # type: ignore[union-attr]


def test_handshake_entries_expire_after_max_of_node_timeout_and_one_second() -> None:
    for timeout, expiry in ((200, 1000), (3000, 3000)):
        m, clock = make(node_timeout=timeout)
        m.meet(b"10.0.0.2", 7711)
        m.drain()
        clock.now += expiry
        m.tick()
        assert m.known() == 2
        clock.now += 1
        m.tick()
        assert m.known() == 1 and logs(m.drain(), "node.handshake_timeout")


def test_a_failed_handshake_connect_is_retried_with_backoff_and_always_sends_meet() -> None:
    m, clock = make(node_timeout=5000)
    m.meet(b"10.0.0.2", 7711)
    (first,) = of(m.drain(), Connect)
    m.connect_failed(first.token)
    clock.now += 50
    m.tick()
    assert not of(m.drain(), Connect)  # first retry after 100 ms
    clock.now += 50
    m.tick()
    (second,) = of(m.drain(), Connect)
    m.connect_failed(second.token)
    clock.now += 100
    m.tick()
    assert not of(m.drain(), Connect)  # then 200 ms
    clock.now += 100
    m.tick()
    (third,) = of(m.drain(), Connect)
    link = Link("hs")
    m.link_connected(link, third.token)
    assert isinstance(sends(m.drain())[0].msg, Meet)


def test_a_link_for_a_stale_connect_token_is_closed() -> None:
    m, _ = make()
    m.meet(b"10.0.0.2", 7711)
    (connect,) = of(m.drain(), Connect)
    m.forget(connect.node_id)
    m.drain()
    link = Link("late")
    m.link_connected(link, connect.token)
    assert m.drain() == [CloseLink(link)]
    m.connect_failed(12345)  # unknown tokens are ignored
    assert m.drain() == []


# ---------------------------------------------------------------------------- receiving
def test_a_meet_from_an_unknown_node_adds_it_answers_pong_and_meets_it_back() -> None:
    m, clock = make()
    inbound = Link("in")
    m.link_accepted(inbound, b"10.0.0.1")
    m.link_message(inbound, Meet(hdr(A, port=7799), []), b"10.0.0.2")
    effects = m.drain()
    node = m.get(A)
    assert node is not None and node.flags == []
    assert (node.ip, node.port, node.bus_port) == (b"10.0.0.2", 7799, 17799)
    (pong,) = sends(effects, Pong)
    assert pong.link is inbound
    (connect,) = of(effects, Connect)
    assert (connect.node_id, connect.ip, connect.bus_port) == (A, b"10.0.0.2", 17799)
    assert SAVE_CONFIG in effects
    assert m.my_ip == b"10.0.0.1"  # learned from the local address of the MEET's link
    # the link back opens with a MEET, not a PING: the sender's handshake with us may have
    # timed out meanwhile (it forgot us), and a PING from a node it does not know would
    # not make it add us (a fresh cluster stayed unformed so in CI)
    m.link_connected(Link("out"), connect.token)
    assert isinstance(sends(m.drain())[0].msg, Meet)


def test_a_node_whose_handshake_timed_out_learns_of_the_node_that_took_its_meet() -> None:
    # Node B met A (us), and B's handshake timed out before A's PONG reached it: B forgot
    # A. A's link back to B must make B add A: a MEET does, a PING did not.
    a, _ = make()
    clock_b = Clock()
    b = Membership(B, 7712, clock=clock_b, rng=random.Random(2), node_timeout=1000)
    b.meet(b"10.0.0.1", 7711)
    (connect,) = of(b.drain(), Connect)
    b.link_connected(Link("b-out"), connect.token)
    (meet,) = sends(b.drain(), Meet)
    clock_b.now += MIN_HANDSHAKE_TIMEOUT + 100
    b.tick()
    assert [n for n in b.nodes() if not n.bits & MYSELF] == []  # timed out: A forgotten
    a.link_message(Link("a-in"), meet.msg, b"10.0.0.3")  # A takes B's MEET (late)
    (back,) = of(a.drain(), Connect)
    a.link_connected(Link("a-out"), back.token)
    (first,) = sends(a.drain())
    b.link_message(Link("b-in"), first.msg, b"10.0.0.1")
    known = b.get(ME)
    assert known is not None and not known.bits & HANDSHAKE


def test_an_announced_ip_in_the_header_wins_over_the_peer_address() -> None:
    m, _ = make()
    m.link_message(Link("in"), Meet(hdr(A, ip=b"203.0.113.7"), []), b"172.17.0.2")
    assert m.get(A).ip == b"203.0.113.7"  # type: ignore[union-attr]


def test_my_announced_ip_and_port_are_in_my_header_and_never_overwritten() -> None:
    m, _ = make(announce_ip=b"203.0.113.1", announce_port=6000)
    assert (m.header.ip, m.header.port, m.header.bus_port) == (b"203.0.113.1", 6000, 16000)
    inbound = Link("in")
    m.link_accepted(inbound, b"172.17.0.5")
    m.link_message(inbound, Meet(hdr(A), []), b"172.17.0.2")
    assert m.my_ip == b"203.0.113.1" and m.me.port == 6000


def test_a_meet_without_any_address_adds_a_noaddr_node_and_other_types_are_ignored() -> None:
    m, _ = make()
    m.link_message(Link("in"), Meet(hdr(A), []), b"")
    effects = m.drain()
    assert m.get(A).flags == ["noaddr"] and not of(effects, Connect)  # type: ignore[union-attr]
    nonce = b"n" * 32
    m.link_message(Link("in"), AuthChallenge(hdr(A), nonce), ADDR[A])
    m.link_message(Link("in"), AuthChallenge(hdr(B), nonce), ADDR[B])
    assert m.drain() == [] and m.known() == 2


def test_a_ping_from_an_unknown_node_is_answered_but_does_not_add_it() -> None:
    m, _ = make()
    inbound = Link("in")
    m.link_message(inbound, Ping(hdr(A), []), b"10.0.0.2")
    effects = m.drain()
    assert [s.link for s in sends(effects, Pong)] == [inbound]
    assert m.get(A) is None and not of(effects, Connect)


def test_a_ping_from_a_known_node_at_a_new_address_updates_it_and_reconnects() -> None:
    m, _ = make()
    out = add_peer(m, A)
    m.link_message(Link("in2"), Ping(hdr(A, port=7800), []), b"10.0.0.42")
    effects = m.drain()
    assert CloseLink(out) in effects and SAVE_CONFIG in effects
    node = m.get(A)
    assert (node.ip, node.port, node.bus_port) == (b"10.0.0.42", 7800, 17800)  # type: ignore[union-attr]


def test_a_pong_from_another_id_on_a_link_marks_the_node_noaddr() -> None:
    m, _ = make()
    out = add_peer(m, A)
    m.link_message(out, Pong(hdr(B), []), b"10.0.0.2")
    effects = m.drain()
    node = m.get(A)
    assert node is not None and node.flags == ["noaddr"] and node.ip == b""
    assert CloseLink(out) in effects and SAVE_CONFIG in effects
    m.tick()
    assert not of(m.drain(), Connect)  # nowhere to connect to
    # A shows up from its new address: NOADDR is cleared.
    m.link_message(Link("in"), Ping(hdr(A), []), b"10.0.0.77")
    assert node.flags == [] and node.ip == b"10.0.0.77"


def test_the_forget_blacklist_lasts_blacklist_ttl() -> None:
    """cluster-forget-ttl (CONFIG SET sets blacklist_ttl): a FORGET after the change uses
    the new length."""
    m, clock = make()
    m.blacklist_ttl = 5000
    add_peer(m, A)
    m.forget(A)
    m.drain()
    clock.now += 4999
    m.tick()
    m.link_message(Link("in"), Meet(hdr(A), []), b"10.0.0.2")
    assert m.get(A) is None
    clock.now += 1
    m.tick()
    m.link_message(Link("in"), Meet(hdr(A), []), b"10.0.0.2")
    assert m.get(A) is not None


def test_a_blacklisted_node_cannot_meet_us() -> None:
    m, clock = make()
    add_peer(m, A)
    m.forget(A)
    m.drain()
    m.link_message(Link("in"), Meet(hdr(A), []), b"10.0.0.2")
    assert m.get(A) is None and m.drain() == []
    clock.now += BLACKLIST_TTL
    m.tick()
    m.link_message(Link("in"), Meet(hdr(A), []), b"10.0.0.2")
    assert m.get(A) is not None


def test_messages_from_myself_only_get_a_pong() -> None:
    m, _ = make()
    inbound = Link("in")
    m.link_message(inbound, Meet(hdr(ME), [GossipEntry(A, b"10.0.0.2", 7711, 17711, 0, 0, 0)]),
                   b"10.0.0.1")
    effects = m.drain()
    assert len(sends(effects, Pong)) == 1 and not of(effects, Connect)
    assert m.known() == 1


# ---------------------------------------------------------------------------- gossip
def gossip_about(node_id: bytes, flags: int = 0, ip: bytes | None = None) -> GossipEntry:
    return GossipEntry(node_id, ip if ip is not None else ADDR[node_id], 7711, 17711, flags,
                       0, 0)


def test_gossip_about_an_unknown_node_from_a_known_sender_starts_a_handshake() -> None:
    m, _ = make()
    add_peer(m, A)
    m.link_message(Link("in"), Ping(hdr(A), [gossip_about(B)]), b"10.0.0.2")
    (connect,) = of(m.drain(), Connect)
    assert (connect.ip, connect.bus_port) == (ADDR[B], 17711)
    assert m.get(connect.node_id).bits & HANDSHAKE  # type: ignore[union-attr]
    # Repeated gossip while the handshake is pending does not start another.
    m.link_message(Link("in"), Ping(hdr(A), [gossip_about(B)]), b"10.0.0.2")
    assert not of(m.drain(), Connect)


def test_gossip_is_ignored_from_unknown_senders_and_about_blacklisted_or_noaddr_nodes() -> None:
    m, _ = make()
    m.link_message(Link("in"), Ping(hdr(A), [gossip_about(B)]), b"10.0.0.2")
    assert not of(m.drain(), Connect)
    add_peer(m, A)
    add_peer(m, C)
    m.forget(C)
    m.link_message(Link("in"), Ping(hdr(A), [gossip_about(C), gossip_about(B, NOADDR),
                                             gossip_about(D, ip=b"")]), b"10.0.0.2")
    assert not of(m.drain(), Connect)


def test_gossip_sections_have_max_3_or_a_tenth_capped_at_known_minus_2() -> None:
    m, _ = make()
    rng = random.Random(5)
    sizes = []
    for n in range(1, 40):
        node_id = new_node_id(rng)
        node = ClusterNode(node_id, b"10.1.0.%d" % n, 7711, 17711)
        m.table[node_id] = node
        m._views_dirty = True
        target = m.nodes()[1]
        entries = gossip_entries(m.table, target, m.rng)
        ids = [e.node_id for e in entries]
        assert len(ids) == len(set(ids)) and ME not in ids and target.id not in ids
        sizes.append(len(entries))
    known = range(2, 41)
    assert sizes == [min(max(3, k // 10), k - 2) for k in known]


def test_gossip_prefers_failing_nodes_and_never_includes_handshake_entries() -> None:
    m, _ = make()
    rng = random.Random(3)
    ids = [new_node_id(rng) for _ in range(20)]
    for i, node_id in enumerate(ids):
        m.table[node_id] = ClusterNode(node_id, b"10.1.0.%d" % i, 7711, 17711)
    m.table[ids[0]].bits |= PFAIL
    m.table[ids[1]].bits |= FAIL
    m.table[ids[2]].bits |= HANDSHAKE
    for _ in range(20):
        entries = gossip_entries(m.table, None, m.rng)
        got = {e.node_id: e.flags for e in entries}
        assert len(entries) == 3
        assert got[ids[0]] == PFAIL and got[ids[1]] == FAIL and ids[2] not in got


# ---------------------------------------------------------------------------- failure detection
def test_a_node_is_pinged_at_half_the_timeout_and_pfail_after_the_timeout() -> None:
    m, clock = make(node_timeout=1000)
    out = add_peer(m, A)
    node = m.get(A)
    assert node is not None
    start = clock.now
    clock.now = start + 500
    m.tick()
    assert not sends(m.drain(), Ping)  # not older than timeout/2 yet
    clock.now = start + 501
    m.tick()
    (ping,) = sends(m.drain(), Ping)
    assert ping.link is out and node.ping_sent == clock.now
    sent = clock.now
    clock.now = sent + 1000
    m.tick()
    assert node.flags == []
    clock.now = sent + 1001
    m.tick()
    effects = m.drain()
    assert node.flags == ["fail?"] and logs(effects, "node.pfail")
    assert m.reachable() == () and node.priority == 10


def test_a_pong_clears_pfail_and_fail() -> None:
    m, clock = make(node_timeout=1000)
    out = add_peer(m, A)
    node = m.get(A)
    for flag in (PFAIL, FAIL):
        node.bits |= flag  # type: ignore[union-attr]
        m._views_dirty = True
        assert m.reachable() == ()
        m.link_message(out, Pong(hdr(A), []), ADDR[A])
        effects = m.drain()
        assert node.flags == [] and m.reachable() == (A,)  # type: ignore[union-attr]
        assert logs(effects, "node.fail_cleared")
        assert (SAVE_CONFIG in effects) == (flag == FAIL)


def test_an_unanswered_ping_resets_an_old_link_and_keeps_the_ping_time() -> None:
    m, clock = make(node_timeout=1000)
    out = add_peer(m, A)
    node = m.get(A)
    assert node is not None
    clock.now += 600
    m.tick()
    assert sends(m.drain(), Ping)
    sent = node.ping_sent
    clock.now += 450  # link is 1050 ms old, ping unanswered for 450 ms: keep it
    m.tick()
    assert CloseLink(out) not in m.drain()
    clock.now += 100  # ping unanswered for 550 ms > timeout/2
    m.tick()
    assert CloseLink(out) in m.drain() and node.out_link is None
    clock.now += 100
    m.tick()  # the next tick reconnects
    (connect,) = of(m.drain(), Connect)
    new = Link("out2")
    m.link_connected(new, connect.token)
    assert sends(m.drain(), Ping)[0].link is new
    assert node.ping_sent == sent  # the timeout still counts from the first ping


def fail_connects_until(m: Membership, clock: Clock, until: int) -> None:
    """Tick every 100 ms up to `until`, every connection attempt failing."""
    while clock.now <= until:
        clock.now += 100
        m.tick()
        for c in of(m.drain(), Connect):
            m.connect_failed(c.token)


def test_a_connect_that_never_succeeds_ends_in_pfail() -> None:
    m, clock = make(node_timeout=1000)
    out = add_peer(m, A)
    node = m.get(A)
    assert node is not None
    m.link_closed(out)
    start = clock.now
    m.tick()
    (connect,) = of(m.drain(), Connect)
    assert node.ping_sent == start
    m.connect_failed(connect.token)
    fail_connects_until(m, clock, start + 1000)
    assert node.flags == ["fail?"] and node.link == "disconnected"


def test_a_ping_from_a_node_we_cannot_connect_to_reconnects_at_once() -> None:
    """A restarted node pings us before our reconnect backoff expires: we connect back at
    once (no wait for the next tick and its backoff), and its PONG clears FAIL."""
    m, clock = make(node_timeout=1000)
    out = add_peer(m, A)
    node = m.get(A)
    assert node is not None
    m.link_closed(out)
    fail_connects_until(m, clock, clock.now + 3000)  # down: the backoff grows, it fails
    node.bits |= FAIL
    assert node.retry_at > clock.now and node.link == "disconnected"
    m.link_message(Link("in-A2"), Ping(hdr(A), []), ADDR[A])
    (connect,) = of(m.drain(), Connect)
    again = Link("out-A2")
    m.link_connected(again, connect.token)
    assert sends(m.drain(), Ping)
    m.link_message(again, Pong(hdr(A), []), ADDR[A])
    m.drain()
    assert node.flags == [] and A in m.reachable()


def test_about_once_a_second_the_node_with_the_oldest_pong_is_pinged() -> None:
    m, clock = make(node_timeout=60_000)
    links = {x: add_peer(m, x) for x in (A, B, C)}
    m.get(A).pong_received -= 10  # type: ignore[union-attr]
    pinged = []
    for _ in range(30):
        clock.now += 100
        m.tick()
        pinged += [s.link for s in sends(m.drain(), Ping)]
        for x, link in links.items():  # answer everything at once
            if m.get(x).ping_sent:  # type: ignore[union-attr]
                m.link_message(link, Pong(hdr(x), []), ADDR[x])
                m.drain()
    assert 1 <= len(pinged) <= 3  # one per 10 ticks, when one of the 5 samples qualifies


def test_pfail_becomes_fail_with_a_majority_of_reports_then_fail_is_broadcast() -> None:
    m, clock = make(node_timeout=1000)
    links = {x: add_peer(m, x) for x in (A, B, C, D)}
    assert m.size() == 5  # quorum 3: my own PFAIL + 2 reports
    d = m.get(D)
    assert d is not None
    d.ping_sent = clock.now
    clock.now += 1001
    m.tick()
    m.drain()
    assert d.flags == ["fail?"]
    m.link_message(Link("in-a"), Ping(hdr(A), [gossip_about(D, PFAIL)]), ADDR[A])
    m.drain()
    assert d.flags == ["fail?"]  # 1 report + me = 2 < 3
    m.link_message(Link("in-b"), Ping(hdr(B), [gossip_about(D, FAIL)]), ADDR[B])
    effects = m.drain()
    assert d.flags == ["fail"] and d.priority == 100 and SAVE_CONFIG in effects
    (log,) = logs(effects, "node.fail")
    assert log.fields["reports"] == 2 and log.fields["quorum"] == 3
    fails = sends(effects, Fail)
    # Every connected node is told (the link to D was reset by the tick: stuck PING).
    assert d.out_link is None
    assert {s.link for s in fails} == {links[A], links[B], links[C]}
    assert all(s.msg.node_id == D for s in fails)


def test_reports_expire_after_twice_the_node_timeout_and_are_withdrawn_by_gossip() -> None:
    m, clock = make(node_timeout=1000)
    for x in (A, B, C, D):
        add_peer(m, x)
    d = m.get(D)
    assert d is not None
    m.link_message(Link("in"), Ping(hdr(A), [gossip_about(D, PFAIL)]), ADDR[A])
    m.link_message(Link("in"), Ping(hdr(C), [gossip_about(D, PFAIL)]), ADDR[C])
    m.link_message(Link("in"), Ping(hdr(C), [gossip_about(D)]), ADDR[C])  # C takes it back
    clock.now += 2001  # A's report is now too old
    m.link_message(Link("in"), Ping(hdr(B), [gossip_about(D, PFAIL)]), ADDR[B])
    d.ping_sent = clock.now - 1001
    m.tick()
    assert d.flags == ["fail?"]  # only B's report is valid: 2 < 3
    assert set(d.fail_reports) == {B}


def test_no_fail_in_a_two_node_cluster() -> None:
    m, clock = make(node_timeout=1000)
    add_peer(m, A)
    m.get(A).ping_sent = clock.now  # type: ignore[union-attr]
    clock.now += 5000
    m.tick()
    assert m.get(A).flags == ["fail?"]  # type: ignore[union-attr]


def test_a_fail_message_from_a_known_node_marks_the_node_failing() -> None:
    m, _ = make()
    add_peer(m, A)
    add_peer(m, B)
    m.link_message(Link("in"), Fail(hdr(C), B), ADDR[C])  # unknown sender: ignored
    assert m.get(B).flags == []  # type: ignore[union-attr]
    m.link_message(Link("in"), Fail(hdr(A), ME), ADDR[A])  # about myself: ignored
    assert m.me.flags == ["myself"]
    m.link_message(Link("in"), Fail(hdr(A), B), ADDR[A])
    effects = m.drain()
    assert m.get(B).flags == ["fail"] and SAVE_CONFIG in effects  # type: ignore[union-attr]
    assert logs(effects, "node.fail")[0].fields["via"] == "message"
    assert m.reachable() == (A,)


def test_node_timeout_can_change_at_run_time() -> None:
    m, clock = make(node_timeout=10_000)
    add_peer(m, A)
    node = m.get(A)
    assert node is not None
    node.ping_sent = clock.now
    clock.now += 3000
    m.tick()
    assert node.flags == []
    m.node_timeout = 2000
    m.tick()
    assert node.flags == ["fail?"]


# ---------------------------------------------------------------------------- commands
def test_forget_errors_and_blacklist() -> None:
    m, clock = make()
    out = add_peer(m, A)
    add_peer(m, B)
    with pytest.raises(CommandError, match="Invalid node identifier"):
        m.forget(b"abc")
    with pytest.raises(CommandError, match=f"Unknown node {C.decode()}"):
        m.forget(C)
    with pytest.raises(CommandError, match="can't forget myself"):
        m.forget(ME)
    m.get(B).fail_reports[A] = clock.now  # type: ignore[union-attr]
    m.forget(A)
    effects = m.drain()
    assert m.get(A) is None and CloseLink(out) in effects and SAVE_CONFIG in effects
    assert m.get(B).fail_reports == {}  # type: ignore[union-attr]
    # Gossip cannot bring it back for 60 s...
    m.link_message(Link("in"), Ping(hdr(B), [gossip_about(A)]), ADDR[B])
    assert not of(m.drain(), Connect)
    clock.now += BLACKLIST_TTL - 1
    m.tick()
    m.link_message(Link("in"), Ping(hdr(B), [gossip_about(A)]), ADDR[B])
    assert not of(m.drain(), Connect)
    # ...then it can.
    clock.now += 1
    m.tick()
    m.link_message(Link("in"), Ping(hdr(B), [gossip_about(A)]), ADDR[B])
    assert of(m.drain(), Connect)


def test_leaving_is_set_on_myself_and_spread_with_a_pong() -> None:
    m, _ = make()
    out = add_peer(m, A)
    m.set_leaving(True)
    effects = m.drain()
    assert m.leaving and m.me.flags == ["myself", "leaving"] and m.me.priority == 100
    assert m.header.flags == LEAVING and SAVE_CONFIG in effects
    (pong,) = sends(effects, Pong)
    assert pong.link is out and pong.msg.header.flags == LEAVING
    m.set_leaving(True)
    assert m.drain() == []
    m.set_leaving(False)
    assert m.header.flags == 0 and sends(m.drain(), Pong)


def test_leaving_of_another_node_follows_only_its_own_header() -> None:
    m, _ = make()
    out = add_peer(m, A)
    add_peer(m, B)
    # Gossip saying B is leaving does not make it so.
    m.link_message(Link("in"), Ping(hdr(A), [gossip_about(B, LEAVING)]), ADDR[A])
    assert m.get(B).flags == []  # type: ignore[union-attr]
    m.link_message(Link("in"), Pong(hdr(B, LEAVING), []), ADDR[B])
    effects = m.drain()
    assert m.get(B).flags == ["leaving"] and SAVE_CONFIG in effects  # type: ignore[union-attr]
    assert set(m.reachable()) == {A} and m.get(B).priority == 100  # type: ignore[union-attr]
    m.link_message(out, Pong(hdr(A, LEAVING), []), ADDR[A])
    assert m.reachable() == ()
    m.link_message(Link("in"), Ping(hdr(B), []), ADDR[B])
    assert m.reachable() == (B,)


def test_soft_reset_forgets_everybody_and_hard_reset_takes_a_new_id() -> None:
    m, _ = make()
    out = add_peer(m, A)
    inbound = Link("in-b")
    m.link_accepted(inbound, b"10.0.0.1")
    m.reset(hard=False)
    effects = m.drain()
    assert CloseLink(out) in effects and CloseLink(inbound) in effects
    assert [n.id for n in m.nodes()] == [ME] and SAVE_CONFIG in effects
    m.reset(hard=True, new_id=B)
    assert m.myself == B and m.header.sender == B and [n.id for n in m.nodes()] == [B]
    m.reset(hard=True)
    assert m.myself not in (B, ME) and len(m.myself) == 40


# ---------------------------------------------------------------------------- linked view
def test_linked_lists_the_reachable_nodes_whose_outbound_link_is_up() -> None:
    m, clock = make()
    out_a = add_peer(m, A)
    add_peer(m, B)
    assert set(m.linked()) == {A, B} == set(m.reachable())
    m.link_closed(out_a)  # A was killed: the kernel reset the connection
    assert (of(m.drain(), LinkChanged)) == [LinkChanged(A, False)]
    assert m.linked() == (B,)
    assert set(m.reachable()) == {A, B}  # CLUSTER INFO and NOREPL still count A
    m.tick()  # reconnect attempt: no link until it succeeds
    (connect,) = of(m.drain(), Connect)
    assert connect.node_id == A and m.linked() == (B,)
    m.link_connected(Link("out-a2"), connect.token)
    assert of(m.drain(), LinkChanged) == [LinkChanged(A, True)]
    assert set(m.linked()) == {A, B}


def test_linked_leaves_out_failing_leaving_and_handshake_nodes_even_with_a_link() -> None:
    m, clock = make()
    add_peer(m, A)
    add_peer(m, B, flags=LEAVING)
    m.meet(b"10.0.0.4", 7711)
    (connect,) = of(m.drain(), Connect)
    m.link_connected(Link("hs"), connect.token)  # a handshake's link: no LinkChanged
    assert not of(m.drain(), LinkChanged)
    assert m.linked() == (A,)
    m.link_message(Link("in-b"), Fail(hdr(B, LEAVING), A), ADDR[B])  # B: A failed
    m.drain()
    assert m.get(A).flags == ["fail"] and m.get(A).out_link is not None  # type: ignore
    assert m.linked() == ()


def test_the_linked_tuple_is_the_same_object_until_its_content_changes() -> None:
    """start_replication batches the REPLJOBs of consecutive jobs by the identity of
    their targets: the view must not be rebuilt into a new tuple by unrelated changes."""
    m, clock = make()
    add_peer(m, A)
    out_b = add_peer(m, B)
    first = m.linked()
    assert m.linked() is first
    m.set_leaving(True)  # a table change that leaves the view as it was
    m.drain()
    assert m.linked() is first
    m.link_closed(out_b)
    m.drain()
    assert m.linked() == (A,) and m.linked() is m.linked()


def test_closing_a_link_ourselves_or_forgetting_the_node_reports_the_link_down() -> None:
    m, clock = make()
    add_peer(m, A)
    add_peer(m, B)
    m.forget(A)
    effects = m.drain()
    assert of(effects, LinkChanged) == [LinkChanged(A, False)] and of(effects, CloseLink)
    assert m.linked() == (B,)
    m.link_message(Link("in-b2"), Ping(hdr(B, ip=b"10.0.0.9"), []), b"10.0.0.9")
    effects = m.drain()  # B moved: the old link is closed, a new one asked for
    assert LinkChanged(B, False) in of(effects, LinkChanged) and m.linked() == ()


def test_cluster_info_fields_in_order() -> None:
    m, _ = make()
    add_peer(m, A)
    add_peer(m, B)
    m.meet(b"10.0.0.9", 7711)
    m.get(B).bits |= PFAIL  # type: ignore[union-attr]
    m._views_dirty = True
    m.stats.sent(0, 10)
    m.stats.received(1, 10)
    m.stats.received(1, 10)
    assert m.cluster_info() == [
        ("cluster_state", "ok"), ("cluster_known_nodes", 4), ("cluster_reachable_nodes", 1),
        ("cluster_size", 3), ("cluster_stats_messages_sent", 1),
        ("cluster_stats_messages_received", 2)]
    info = dict(m.info_fields())
    assert info["cluster_failing_nodes"] == 1 and info["cluster_handshake_nodes"] == 1
    assert info["bus_ping"] == "sent=1,sent_bytes=10,received=0,received_bytes=0"


def test_cluster_nodes_lines() -> None:
    m, clock = make()
    add_peer(m, A)
    m.meet(b"10.0.0.9", 7711)
    m.drain()
    m.get(A).bits |= PFAIL | LEAVING  # type: ignore[union-attr]
    lines = m.cluster_nodes().splitlines()
    assert lines[0] == f"{ME.decode()} :7711 myself 0 0 connected"
    assert lines[1] == f"{A.decode()} 10.0.0.2:7711 fail?,leaving 0 {clock.now} connected"
    assert lines[2].endswith(" 10.0.0.9:7711 handshake 0 0 disconnected")
    assert len(lines) == 3 and len(m.nodes_conf().splitlines()) == 2


# ---------------------------------------------------------------------------- nodes.conf
def test_nodes_conf_round_trip_keeps_ids_addresses_and_flags() -> None:
    m, clock = make()
    inbound = Link("in")
    m.link_accepted(inbound, b"10.0.0.1")
    add_peer(m, A)
    add_peer(m, B, flags=LEAVING)
    add_peer(m, C)
    m.get(C).bits |= FAIL  # type: ignore[union-attr]
    m.get(C).out_link = None  # type: ignore[union-attr]
    m.meet(b"10.0.0.9", 7711)  # a handshake entry: not saved
    m.set_leaving(True)
    m.link_message(inbound, Meet(hdr(D), []), ADDR[D])
    text = m.nodes_conf()
    assert "handshake" not in text
    myself, entries = parse_nodes_conf(text)
    assert myself == ME
    assert render_nodes_conf(entries) == text.replace(" connected", " disconnected").replace(
        "myself,leaving 0 0 disconnected", "myself,leaving 0 0 connected")
    clock2 = Clock()
    clock2.now = T0 + 99_000
    m2 = Membership(myself, 7711, clock=clock2, rng=random.Random(2))
    m2.load(entries)
    assert [n.id for n in m2.nodes()] == [ME, A, B, C, D]
    assert m2.my_ip == b"10.0.0.1" and m2.leaving and m2.header.flags == LEAVING
    assert m2.get(B).flags == ["leaving"] and m2.get(C).flags == ["fail"]  # type: ignore[union-attr]
    assert m2.get(A).bus_port == 17711  # type: ignore[union-attr]
    assert m2.get(A).pong_received == clock2.now  # non-zero is loaded as now  # type: ignore[union-attr]
    assert m2.size() == 5 and set(m2.reachable()) == {A, D}
    m2.tick()
    assert len(of(m2.drain(), Connect)) == 4


def test_nodes_conf_keeps_the_incarnation_last_heard_from_each_node() -> None:
    # so a node that restarts tells a peer that restarted meanwhile from one that did not
    m, _ = make()
    add_peer(m, A)
    add_peer(m, B)
    m.link_message(Link("in-x"), Ping(hdr(A, 7 << INCARNATION_SHIFT), []), ADDR[A])
    assert SAVE_CONFIG in m.drain()  # heard: saved
    m.link_message(Link("in-x"), Ping(hdr(A, 7 << INCARNATION_SHIFT), []), ADDR[A])
    assert SAVE_CONFIG not in m.drain()  # the same one: nothing to save
    text = m.nodes_conf()
    assert text.endswith(f"vars incarnations {A.decode()}:7\n")
    _, entries = parse_nodes_conf(text)
    assert {e.id: e.incarnation for e in entries} == {ME: 0, A: 7, B: 0}
    m2 = Membership(ME, 7711, clock=Clock(), rng=random.Random(2))
    m2.load(entries)
    assert m2.get(A).incarnation == 7 and m2.get(B).incarnation == 0  # type: ignore[union-attr]
    m2.link_message(Link("in-y"), Ping(hdr(A, 7 << INCARNATION_SHIFT), []), ADDR[A])
    assert not logs(m2.drain(), "node.restarted")
    m2.link_message(Link("in-y"), Ping(hdr(A, 8 << INCARNATION_SHIFT), []), ADDR[A])
    assert logs(m2.drain(), "node.restarted")  # another one: it restarted while we were down


def test_nodes_conf_skips_an_unreadable_incarnations_item() -> None:
    text = (f"{ME.decode()} 10.0.0.1:7711 myself 0 0 connected\n"
            f"{A.decode()} 10.0.0.2:7711 noflags 0 0 connected\n"
            f"{B.decode()} 10.0.0.3:7711 noflags 0 0 connected\n"
            f"vars incarnations {A.decode()}:x,junk,{B.decode()}:12 other 3\n")
    _, entries = parse_nodes_conf(text)
    assert {e.id: e.incarnation for e in entries} == {ME: 0, A: 0, B: 12}


@pytest.mark.parametrize("text, reason", [
    ("", "no myself line"),
    ("vars currentEpoch 0\n", "no myself line"),
    (f"{A.decode()} 10.0.0.2:7711 noflags 0 0 connected\n", "no myself line"),
    (f"{ME.decode()} :7711 myself 0 0\n", "line 1: expected 6 fields"),
    (f"{ME.decode()[:39]} :7711 myself 0 0 connected\n", "line 1: node ID"),
    (f"{A.decode().upper()} :7711 myself 0 0 connected\n", "line 1: node ID"),
    (f"{ME.decode()} 7711 myself 0 0 connected\n", "address"),
    (f"{ME.decode()} :port myself 0 0 connected\n", "address"),
    (f"{ME.decode()} :7711 myself,master 0 0 connected\n", "unknown node flag 'master'"),
    (f"{ME.decode()} :7711 myself x 0 connected\n", "ping/pong"),
    (f"{ME.decode()} :7711 myself 0 0 maybe\n", "link state"),
    (f"{ME.decode()} :7711 myself 0 0 connected\n{A.decode()} :1 myself 0 0 connected\n",
     "line 2: more than one myself"),
    (f"{ME.decode()} :7711 myself 0 0 connected\n\n{ME.decode()} :1 noflags 0 0 connected\n",
     "line 3: duplicate node ID"),
])
def test_corrupt_nodes_conf_is_an_error_naming_the_line(text: str, reason: str) -> None:
    with pytest.raises(NodesConfError, match="corrupted cluster config file") as info:
        parse_nodes_conf(text)
    assert reason in str(info.value)


def test_nodes_conf_skips_blank_and_vars_lines() -> None:
    text = (f"\n  \nvars currentEpoch 5 lastVoteEpoch 0\n{ME.decode()} 10.0.0.1:7711 "
            f"myself 0 0 connected\n\n{A.decode()} [::1]:7712 fail?,noaddr 1 2 disconnected")
    myself, entries = parse_nodes_conf(text)
    assert myself == ME and [e.id for e in entries] == [ME, A]
    assert entries[1].ip == b"[::1]" and entries[1].port == 7712
    assert entries[1].flags == ["fail?", "noaddr"]
    assert (entries[1].ping_sent, entries[1].pong_received) == (1, 2)
