"""Bus framing: every message round-trips; bad bytes raise BusProtocolError and nothing else."""

from __future__ import annotations

import struct

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from disque.cluster import messages as bus
from disque.cluster.messages import (
    AuthChallenge,
    AuthResponse,
    BusProtocolError,
    BusStats,
    Fail,
    FrameDecoder,
    GossipEntry,
    Header,
    Meet,
    Ping,
    Pong,
    auth_digest,
    auth_verify,
    decode,
    encode_many,
    make_nonce,
)
from disque.jobs.deadletter import REASON_MAX_NACKS, DeadLetter

NODE_A = b"a" * 40
NODE_B = b"0123456789abcdef0123456789abcdef01234567"

node_ids = st.text(alphabet="0123456789abcdef", min_size=40, max_size=40).map(str.encode)
ips = st.sampled_from([b"", b"127.0.0.1", b"10.1.2.3", b"::1", b"fe80::1%eth0",
                       b"2001:db8::8a2e:370:7334"])
ports = st.integers(0, 65535)
u64 = st.integers(0, (1 << 64) - 1)
headers = st.builds(Header, node_ids, ips, ports, ports, st.integers(0, 255))
gossip = st.lists(st.builds(GossipEntry, node_ids, ips, ports, ports, st.integers(0, 63), u64,
                            u64), max_size=12)
messages = st.one_of(
    st.builds(Ping, headers, gossip),
    st.builds(Pong, headers, gossip),
    st.builds(Meet, headers, gossip),
    st.builds(Fail, headers, node_ids),
    st.builds(AuthChallenge, headers, st.binary(min_size=16, max_size=64)),
    st.builds(AuthResponse, headers, st.binary(min_size=32, max_size=32)),
)


def header() -> Header:
    return Header(NODE_A, b"", 7711, 17711, 0)


def frame(obj: object) -> bytes:
    payload = msgpack.packb(obj)
    return struct.pack(">I", len(payload)) + payload


def good_fields() -> list:
    return [bus.VERSION, bus.FAIL, NODE_A, b"", 7711, 17711, 0, [NODE_B]]


# ---------------------------------------------------------------------------- round trips
@given(messages)
def test_every_message_round_trips(msg: bus.Message) -> None:
    data = msg.encode()
    assert struct.unpack(">I", data[:4])[0] == len(data) - 4
    assert decode(data[4:]) == msg
    assert FrameDecoder().feed(data) == [msg]


@given(st.lists(messages, max_size=8), st.data())
def test_frames_split_anywhere_decode_in_order(msgs: list[bus.Message],
                                               data: st.DataObject) -> None:
    blob = encode_many(msgs)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(blob)), max_size=6)))
    decoder = FrameDecoder()
    out: list[bus.Message] = []
    start = 0
    for cut in [*cuts, len(blob)]:
        out += decoder.feed(blob[start:cut])
        start = cut
    assert out == msgs
    assert decoder.pending == 0


def test_encode_many_is_the_concatenation_of_frames() -> None:
    msgs = [Ping(header(), []), Fail(header(), NODE_B), Pong(header(), [])]
    assert encode_many(msgs) == b"".join(m.encode() for m in msgs)
    assert encode_many([]) == b""


def test_encode_many_and_decoder_count_messages_and_bytes_per_type() -> None:
    sent, received = BusStats(), BusStats()
    msgs = [Ping(header(), []), Ping(header(), []), Fail(header(), NODE_B)]
    blob = encode_many(msgs, stats=sent)
    FrameDecoder(stats=received).feed(blob)
    assert sent.msgs_sent == {bus.PING: 2, bus.FAIL: 1}
    assert received.msgs_received == {bus.PING: 2, bus.FAIL: 1}
    assert sum(sent.bytes_sent.values()) == len(blob) == sum(received.bytes_received.values())
    assert sent.total_sent() == 3 and received.total_received() == 3


def _job_id(i: int) -> bytes:
    return b"D-aaaaaaaa-%024d-05a1" % i


def _record(i: int) -> bus.JobRecord:
    return bus.JobRecord(_job_id(i), b"q", b"body%d" % i, 3, 5000, i, 0, 30, 0, 0,
                         (NODE_A, NODE_B))


def test_runs_of_job_messages_share_one_frame_and_decode_in_order() -> None:
    h = header()
    msgs: list[bus.Message] = [bus.ReplJob(h, _record(i), False) for i in range(50)]
    msgs += [bus.ReplJob(h, _record(50), True)]  # another noreply: a new frame
    msgs += [bus.GotJob(h, _job_id(i)) for i in range(30)]
    msgs += [Fail(h, NODE_B)]
    msgs += [bus.SetAck(h, _job_id(i), 3) for i in range(10)]
    msgs += [bus.SetAck(h, _job_id(99), 2)]  # another aux: a new frame
    msgs += [bus.GotJob(h, _job_id(i)) for i in range(5)]  # not merged across the FAIL
    sent, received = BusStats(), BusStats()
    blob = encode_many(msgs, stats=sent)
    decoder = FrameDecoder(stats=received)
    decoded = decoder.feed(blob)
    # a frame of several REPLJOBs (GOTJOBs) reaches the node as one batch message
    assert [type(m).__name__ for m in decoded] == [
        "ReplJobBatch", "ReplJob", "GotJobBatch", "Fail", "SetAck", "SetAck", "SetAck",
        "SetAck", "SetAck", "SetAck", "SetAck", "SetAck", "SetAck", "SetAck", "SetAck",
        "GotJobBatch"]
    assert [x for m in decoded for x in getattr(m, "messages", lambda m=m: [m])()] == msgs
    frames = 0
    pos = 0
    while pos < len(blob):
        pos += 4 + struct.unpack_from(">I", blob, pos)[0]
        frames += 1
    assert frames == 7
    assert sent.msgs_sent == received.msgs_received == {bus.REPLJOB: 51, bus.GOTJOB: 35,
                                                        bus.FAIL: 1, bus.SETACK: 11}
    assert sum(sent.bytes_sent.values()) == len(blob) == sum(received.bytes_received.values())


def test_a_repljob_frame_carries_each_node_id_once_and_jobs_share_their_delivered_tuple() -> None:
    h = header()
    recs = [_record(i) for i in range(100)]
    blob = encode_many([bus.ReplJob(h, r, False) for r in recs])
    assert blob.count(NODE_B) == 1  # in the node table only
    (batch,) = FrameDecoder().feed(blob)
    assert batch.items == recs
    assert len({id(r.delivered) for r in batch.items}) == 1
    (nid,) = {id(n) for r in batch.items for n in r.delivered if n == NODE_B}
    assert nid == id(bus._node_id(bytes(NODE_B)))  # one shared object per node ID


def test_links_sharing_a_run_of_messages_share_its_frame_and_only_that_run() -> None:
    h = header()
    m = [bus.ReplJob(h, _record(i), False) for i in range(4)]
    shared: dict = {}
    to_b = encode_many([m[0], m[1], m[3]], None, shared)
    to_c = encode_many([m[0], m[2], m[3]], None, shared)  # same ends, another middle
    to_d = encode_many([m[0], m[1], m[3]], None, shared)
    assert to_b == to_d == encode_many([m[0], m[1], m[3]])
    assert to_c == encode_many([m[0], m[2], m[3]]) != to_b
    assert len(shared) == 2


def test_a_batched_frame_is_smaller_than_its_messages_one_by_one() -> None:
    h = header()
    msgs = [bus.GotJob(h, _job_id(i)) for i in range(100)]
    assert len(encode_many(msgs)) < len(b"".join(m.encode() for m in msgs)) / 2


def test_header_is_packed_once_and_reused() -> None:
    h = header()
    Ping(h, []).encode()
    packed = h.packed()
    Fail(h, NODE_B).encode()
    assert h.packed() is packed


def test_wire_form_is_an_array_led_by_version_and_type() -> None:
    entry = GossipEntry(NODE_B, b"10.0.0.2", 7712, 17712, 2, 5, 6)
    data = Ping(Header(NODE_A, b"1.2.3.4", 7711, 17711, 32), [entry]).encode()
    assert msgpack.unpackb(data[4:]) == [bus.VERSION, bus.PING, NODE_A, b"1.2.3.4", 7711, 17711, 32,
                                         [[NODE_B, b"10.0.0.2", 7712, 17712, 2, 5, 6]]]


def test_type_numbers_are_the_originals_and_job_types_are_reserved() -> None:
    assert (bus.PING, bus.PONG, bus.MEET, bus.FAIL) == (0, 1, 2, 3)
    assert tuple(range(4, 16)) == bus.JOB_TYPES
    assert bus.REPLJOB == 4 and bus.PAUSE == 15 and bus.WORKING == 14
    assert len(set(bus.TYPE_NAMES)) == len(bus.TYPE_NAMES) == 18


# ---------------------------------------------------------------------------- bad input
V = bus.VERSION


def _rec(delivered: list) -> list:
    """A REPLJOB record on the wire, `delivered` as indexes into the frame's node table."""
    return [b"D-aaaaaaaa-" + b"x" * 24 + b"-05a1", b"q", b"body", 2, 5000, 1, 0, 30, 0, 0,
            delivered]


@pytest.mark.parametrize("fields, reason", [
    ([V + 1, *good_fields()[1:]], "version"),
    ([V, 99, *good_fields()[2:]], "unknown"),
    ([True, *good_fields()[1:]], "version"),
    ([V, True, *good_fields()[2:]], "unknown"),
    (good_fields()[:7], "8-element"),
    ([*good_fields(), 0], "8-element"),
    ({"type": 3}, "8-element"),
    ([V, bus.FAIL, b"A" * 40, *good_fields()[3:]], "node ID"),
    ([V, bus.FAIL, b"a" * 39, *good_fields()[3:]], "node ID"),
    ([V, bus.FAIL, "a" * 40, *good_fields()[3:]], "node ID"),
    ([V, bus.FAIL, NODE_A, b"has space", *good_fields()[4:]], "IP"),
    ([V, bus.FAIL, NODE_A, b"", 70000, 17711, 0, [NODE_B]], "port"),
    ([V, bus.FAIL, NODE_A, b"", -1, 17711, 0, [NODE_B]], "port"),
    ([V, bus.FAIL, NODE_A, b"", 7711, 17711, -5, [NODE_B]], "integer"),
    ([V, bus.FAIL, NODE_A, b"", 7711, 17711, 1.5, [NODE_B]], "integer"),
    ([V, bus.FAIL, NODE_A, b"", 7711, 17711, 0, NODE_B], "payload"),
    ([V, bus.FAIL, NODE_A, b"", 7711, 17711, 0, []], "FAIL payload"),
    ([V, bus.FAIL, NODE_A, b"", 7711, 17711, 0, [NODE_B, NODE_B]], "FAIL payload"),
    ([V, bus.PING, NODE_A, b"", 7711, 17711, 0, [[NODE_B]]], "gossip"),
    ([V, bus.PING, NODE_A, b"", 7711, 17711, 0, [[NODE_B, b"", 1, 2, 3, 4, "x"]]], "integer"),
    ([V, bus.AUTH_RESPONSE, NODE_A, b"", 7711, 17711, 0, [b"short"]], "digest"),
    ([V, bus.AUTH_CHALLENGE, NODE_A, b"", 7711, 17711, 0, [b"x"]], "nonce"),
    ([V, bus.GOTJOB, NODE_A, b"", 7711, 17711, 0, [[], 0]], "job list"),
    ([V, bus.GOTJOB, NODE_A, b"", 7711, 17711, 0, [b"D" * 40, 0]], "job list"),
    ([V, bus.GOTJOB, NODE_A, b"", 7711, 17711, 0, [[b"D" * 40, b"x"], 0]], "job id"),
    ([V, bus.REPLJOB, NODE_A, b"", 7711, 17711, 0, [[], False, []]], "job list"),
    ([V, bus.REPLJOB, NODE_A, b"", 7711, 17711, 0, [[[1]], False, []]], "job record"),
    ([V, bus.REPLJOB, NODE_A, b"", 7711, 17711, 0, [[[1]], False]], "3"),
    ([V, bus.REPLJOB, NODE_A, b"", 7711, 17711, 0, [[_rec([0])], False, NODE_B]], "node table"),
    ([V, bus.REPLJOB, NODE_A, b"", 7711, 17711, 0, [[_rec([0])], False, [b"x"]]], "node ID"),
    ([V, bus.REPLJOB, NODE_A, b"", 7711, 17711, 0, [[_rec([1])], False, [NODE_B]]], "index"),
    ([V, bus.REPLJOB, NODE_A, b"", 7711, 17711, 0, [[_rec([-1])], False, [NODE_B]]], "index"),
    ([V, bus.REPLJOB, NODE_A, b"", 7711, 17711, 0, [[_rec(["a"])], False, [NODE_B]]], "index"),
    ([V, bus.REPLJOB, NODE_A, b"", 7711, 17711, 0, [[_rec([[0]])], False, [NODE_B]]], "index"),
])
def test_invalid_messages_are_protocol_errors(fields: object, reason: str) -> None:
    with pytest.raises(BusProtocolError, match=reason):
        FrameDecoder().feed(frame(fields))


def test_malformed_msgpack_is_a_protocol_error() -> None:
    good = Fail(header(), NODE_B).encode()
    for payload in (b"\xc1", good[4:-1], good[4:] + b"\x00", b"\xdb\xff\xff\xff\xff"):
        with pytest.raises(BusProtocolError, match="malformed msgpack"):
            FrameDecoder().feed(struct.pack(">I", len(payload)) + payload)


def test_oversized_frame_is_refused_from_its_length_alone() -> None:
    decoder = FrameDecoder(max_frame=1000)
    with pytest.raises(BusProtocolError, match="exceeds the limit"):
        decoder.feed(struct.pack(">I", 1001))
    assert FrameDecoder(max_frame=1000).feed(struct.pack(">I", 1000)) == []
    with pytest.raises(BusProtocolError, match="exceeds"):
        FrameDecoder().feed(struct.pack(">I", bus.MAX_FRAME + 1))


def test_empty_frame_is_a_protocol_error() -> None:
    with pytest.raises(BusProtocolError, match="empty"):
        FrameDecoder().feed(b"\x00\x00\x00\x00")


def test_a_failed_decoder_stays_failed_and_keeps_the_messages_before_the_error() -> None:
    decoder = FrameDecoder()
    good = Fail(header(), NODE_B)
    with pytest.raises(BusProtocolError) as info:
        decoder.feed(good.encode() + frame([9]))
    assert info.value.messages == [good]
    with pytest.raises(BusProtocolError, match="already failed"):
        decoder.feed(good.encode())


def test_truncated_frame_waits_for_more_bytes() -> None:
    data = Ping(header(), [GossipEntry(NODE_B, b"::1", 1, 2, 0, 0, 0)]).encode()
    decoder = FrameDecoder()
    for i in range(len(data) - 1):
        assert decoder.feed(data[i:i + 1]) == []
    assert decoder.pending == len(data) - 1
    assert len(decoder.feed(data[-1:])) == 1


@settings(max_examples=300)
@given(st.binary(max_size=300))
def test_garbage_raises_only_bus_protocol_errors(data: bytes) -> None:
    decoder = FrameDecoder(max_frame=256)
    try:
        decoder.feed(data)
    except BusProtocolError:
        pass


@settings(max_examples=300)
@given(messages, st.data())
def test_corrupted_frames_decode_or_raise_bus_protocol_error(msg: bus.Message,
                                                             data: st.DataObject) -> None:
    blob = bytearray(msg.encode())
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(4, len(blob) - 1))
        blob[i] = data.draw(st.integers(0, 255))
    try:
        out = FrameDecoder().feed(bytes(blob))
    except BusProtocolError:
        return
    for m in out:  # a corruption that still decodes must give a valid message
        assert decode(m.encode()[4:]) == m


@given(messages, st.data())
def test_truncated_payload_with_its_true_length_is_a_protocol_error(
        msg: bus.Message, data: st.DataObject) -> None:
    payload = msg.encode()[4:]
    cut = data.draw(st.integers(0, len(payload) - 1))
    if cut == 0:
        return
    with pytest.raises(BusProtocolError):
        FrameDecoder().feed(struct.pack(">I", cut) + payload[:cut])


# ---------------------------------------------------------------------------- auth
def test_auth_digest_verifies_only_with_same_password_nonce_and_node() -> None:
    nonce = make_nonce(lambda n: b"\x01" * n)
    assert len(nonce) == bus.NONCE_SIZE
    digest = auth_digest(b"secret", nonce, NODE_A)
    assert len(digest) == bus.DIGEST_SIZE
    assert auth_verify(b"secret", nonce, NODE_A, digest)
    assert not auth_verify(b"other", nonce, NODE_A, digest)
    assert not auth_verify(b"secret", b"\x02" * 32, NODE_A, digest)
    assert not auth_verify(b"secret", nonce, NODE_B, digest)
    assert not auth_verify(b"secret", nonce, NODE_A, digest[:-1] + b"\x00")


def test_auth_messages_carry_nonce_and_digest() -> None:
    nonce = make_nonce()
    challenge = FrameDecoder().feed(AuthChallenge(header(), nonce).encode())[0]
    assert isinstance(challenge, AuthChallenge) and challenge.nonce == nonce
    digest = auth_digest(b"pw", challenge.nonce, NODE_B)
    resp = FrameDecoder().feed(AuthResponse(Header(NODE_B, b"", 1, 2, 0), digest).encode())[0]
    assert isinstance(resp, AuthResponse)
    assert auth_verify(b"pw", nonce, resp.header.sender, resp.digest)


# ---------------------------------------------------------------------------- job records
def _repljob_fields(ttl_ms: int, delay: int, retry: int) -> list:
    rec = [b"D-aaaaaaaa-" + b"x" * 24 + b"-05a1", b"q", b"body", 2, ttl_ms, 1, delay, retry,
           0, 0, [0]]
    return [bus.VERSION, bus.REPLJOB, NODE_A, b"", 7711, 17711, 0, [[rec], False, [NODE_A]]]


@pytest.mark.parametrize("ttl_ms, delay, retry, want", [
    (bus.MAX_JOB_SECONDS * 1000, bus.MAX_JOB_SECONDS - 1, bus.MAX_JOB_SECONDS,
     (bus.MAX_JOB_SECONDS * 1000, bus.MAX_JOB_SECONDS - 1, bus.MAX_JOB_SECONDS)),
    (bus.MAX_JOB_SECONDS * 1000 + 1, 0, 30, (bus.MAX_JOB_SECONDS * 1000, 0, 30)),
    ((1 << 64) - 1, 0, 30, (bus.MAX_JOB_SECONDS * 1000, 0, 30)),
    (5000, bus.MAX_JOB_SECONDS + 1, 30, (5000, bus.MAX_JOB_SECONDS, 30)),
    (5000, 0, (1 << 64) - 1, (5000, 0, bus.MAX_JOB_SECONDS)),
])
def test_job_records_beyond_what_addjob_accepts_are_capped(ttl_ms: int, delay: int,
                                                           retry: int, want: tuple) -> None:
    """A peer's job whose expiry or retry could not be encoded again when this node forwards
    it (YOURJOBS) or logs it (AOF) is stored capped at 10 years. Not refused: a peer of an
    older version may hold such a job, and a protocol error would drop the link for good."""
    (msg,) = FrameDecoder().feed(frame(_repljob_fields(ttl_ms, delay, retry)))
    assert (msg.job.ttl_ms, msg.job.delay, msg.job.retry) == want


def test_job_record_integers_must_still_be_unsigned_64_bit() -> None:
    with pytest.raises(BusProtocolError, match="bad ttl"):
        FrameDecoder().feed(frame(_repljob_fields(-1, 0, 30)))


# each integer of a record (repl, ttl, ctime, delay, retry, nacks, deliveries), by index
@pytest.mark.parametrize("index, what", [(3, "repl"), (4, "ttl"), (5, "ctime"), (6, "delay"),
                                         (7, "retry"), (8, "nacks"), (9, "deliveries")])
@pytest.mark.parametrize("bad", [-1, -(1 << 63), True, "1"])
def test_each_record_integer_outside_unsigned_64_bit_is_refused(index: int, what: str,
                                                                bad: object) -> None:
    fields = _repljob_fields(5000, 0, 30)
    fields[7][0][0][index] = bad
    with pytest.raises(BusProtocolError, match=f"^bad {what}$"):
        FrameDecoder().feed(frame(fields))


def test_record_integers_at_the_top_of_unsigned_64_bit_are_taken() -> None:
    fields = _repljob_fields(5000, 0, 30)
    for index in (5, 8, 9):  # (ctime, nacks, deliveries: not capped)
        fields[7][0][0][index] = (1 << 64) - 1
    (msg,) = FrameDecoder().feed(frame(fields))
    assert msg.job.ctime == msg.job.nacks == msg.job.deliveries == (1 << 64) - 1


# ---------------------------------------------------------------------------- dead-letter field
_DL = DeadLetter(3, 2, b"dead", b"q", 600, 1, REASON_MAX_NACKS, 1_700_000_000_000)


def _records(msg: bus.Message) -> list[bus.JobRecord]:
    if isinstance(msg, bus.YourJobs):
        return msg.jobs
    return msg.items if isinstance(msg, bus.ReplJobBatch) else [msg.job]


@pytest.mark.parametrize("dl", [None, _DL])
def test_repljob_and_yourjobs_records_round_trip_with_and_without_a_dead_letter_field(
        dl: DeadLetter | None) -> None:
    h = header()
    recs = [_record(i)._replace(dl=dl if i % 2 else None) for i in range(4)]
    for msgs in ([bus.ReplJob(h, recs[1], False)], [bus.YourJobs(h, recs)],
                 [bus.ReplJob(h, r, True) for r in recs]):  # (one frame: a batch)
        (back,) = FrameDecoder().feed(encode_many(msgs))
        got = _records(back)
        assert got == [r for m in msgs for r in _records(m)]
        assert [r.dl for r in got] == [r.dl for m in msgs for r in _records(m)]


def test_a_record_without_a_policy_has_the_11_fields_of_before() -> None:
    (payload,) = bus.YourJobs(header(), [_record(0)]).payload()
    assert [len(r) for r in payload] == [11]
    (payload,) = bus.YourJobs(header(), [_record(0)._replace(dl=_DL)]).payload()
    assert [len(r) for r in payload] == [12] and payload[0][11] == _DL.to_wire()


@pytest.mark.parametrize("field", [
    [1, 2], b"x", [0, 0, b"", b"q", 0, 0, 0, 0], [0, 0, b"d", b"q", -1, 0, 0, 0],
    [0, 0, b"d", b"q", 0, 1 << 40, 0, 0], [0, 0, b"d", b"q", 0, 1, 4, 0],
    [0, 0, b"d", "q", 0, 1, 1, 0], [0, 0, b"d", b"q", 0, 1, 1, 1.5]])
def test_a_bad_dead_letter_field_is_a_protocol_error(field: object) -> None:
    for fields in (
            [V, bus.REPLJOB, NODE_A, b"", 7711, 17711, 0, [[[*_rec([0]), field]], False,
                                                           [NODE_B]]],
            [V, bus.YOURJOBS, NODE_A, b"", 7711, 17711, 0, [[[*_rec([NODE_B]), field]]]]):
        with pytest.raises(BusProtocolError, match="dead-letter"):
            FrameDecoder().feed(frame(fields))
    too_long = [*_rec([0]), _DL.to_wire(), 0]
    with pytest.raises(BusProtocolError, match="job record"):
        FrameDecoder().feed(frame([V, bus.REPLJOB, NODE_A, b"", 7711, 17711, 0,
                                   [[too_long], False, [NODE_B]]]))


# ---------------------------------------------------------------------------- header reuse
def test_frames_of_one_sender_share_one_header_and_a_change_is_checked_again() -> None:
    d = FrameDecoder()
    (first,) = d.feed(frame(good_fields()))
    (second,) = d.feed(frame(good_fields()))
    assert second.header is first.header  # checked and built once per link
    other = good_fields()
    other[6] = 1 << bus.INCARNATION_SHIFT  # the sender restarted: a new header
    (third,) = d.feed(frame(other))
    assert third.header is not first.header and third.header.flags == other[6]
    for field, bad in ((4, True), (5, True), (6, False), (3, b"bad ip")):
        # equal to the known header's value in Python (True == 1...) or not: checked
        d = FrameDecoder()
        known = good_fields()
        known[4], known[5], known[6] = 1, 1, 0
        d.feed(frame(known))
        fields = list(known)
        fields[field] = bad
        with pytest.raises(BusProtocolError):
            d.feed(frame(fields))
