"""Cluster bus messages: typed records, their msgpack wire form and the frame decoder.

A frame is a 4-byte big-endian payload length followed by one msgpack array:

    [version, type, sender_id, sender_ip, sender_port, sender_bus_port, sender_flags, payload]

`payload` is itself an array whose shape depends on the type (a list of gossip entries for
PING/PONG/MEET, `[node_id]` for FAIL, ...). Arrays led by a type tag, never string-keyed maps:
the bus carries every replicated job. `sender_ip` is the sender's announced address or empty
(the receiver then uses the address it sees the connection come from); `sender_flags` is the
sender's view of its own flags (see `disque.cluster.nodes`: only LEAVING is meaningful) and,
above INCARNATION_SHIFT, its incarnation: a random number drawn at every process start, so
that a peer notices a restart even when it was quicker than the failure detection (the
re-replication of disque.cluster.rereplication starts from it). A node that does not know it
ignores those bits. A sender with a TLS client port (`tls-port`) sets TLS_PORT_FLAG and puts
that port above TLS_PORT_SHIFT (its incarnation then has INCARNATION_BITS, below it), so
that HELLO on a TLS connection can list the other nodes' TLS ports; a node that does not
know the flag reads those bits as part of the incarnation, the same value in every header
of the sender's process, so it sees no restart that did not happen. PERSIST_FLAG says the
sender logs its copies to an AOF (a restart may reload them).

Every message is a `__slots__` record holding a shared `Header` and its payload fields.
Encoding is one `msgpack.packb` of the payload: the array prefix, version and type are
pre-packed per type and the header fields are packed once per `Header` object (a node builds
a new Header only when its ID, address or flags change).

Decoding is strict: anything that is not exactly a known message of this version (frame
length above the limit, truncated or trailing msgpack, wrong field count or type, a node ID
that is not 40 lowercase hex chars) raises `BusProtocolError` and nothing else; the I/O layer
closes that link. A `FrameDecoder` that raised stays failed.

Type numbers are the original Disque's (PING 0 ... PAUSE 15). The job messages (REPLJOB ...
PAUSE) get a `Message` subclass listed in `_DECODERS` (at the end of the module) the same way as
the membership messages below.

Batched frames (protocol version 2): the node speaks one job per message, but on the wire the
messages about jobs (REPLJOB and every message carrying a job ID and an `aux` integer: GOTJOB,
SETACK, GOTACK, DELJOB, QUEUED, WILLQUEUE, ENQUEUE, WORKING) always travel as a list, so that
`encode_many` packs a run of consecutive messages of one type (same sender header, same
`aux` / `noreply`) into one frame: `[[rec, rec, ...], noreply, [node id, ...]]` (a REPLJOB's
records name their nodes by index into that table: each 40-byte ID once per frame),
`[[id, id, ...], aux]`. The decoder gives the messages back one by one, in order, except a
frame of several REPLJOBs or GOTJOBs, which reaches the node as one `ReplJobBatch` /
`GotJobBatch` that it handles in one call. Under load the replication round trip
of a hundred jobs to a node is then one frame each way, one header to pack and to check,
instead of a hundred. The original's REPLJOB header had a job count for the same purpose,
which it never used.

The optional bus password: the accepting side sends AUTH_CHALLENGE(nonce) as soon as a
connection is accepted; the connecting side answers AUTH_RESPONSE(HMAC-SHA256(password,
nonce || its node ID)); the accepting side verifies it (`auth_verify`) before handing any
other message of that link to the node.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import struct
from collections.abc import Callable, Iterable
from typing import Any, ClassVar, Final, NamedTuple

import msgpack

from disque.jobs.deadletter import DeadLetter
from disque.jobs.job import MAX_JOB_SECONDS

VERSION: Final = 2  # 2: job messages carry lists of jobs (batched frames)
MAX_FRAME: Final = 64 * 1024 * 1024  # default FrameDecoder limit (bytes of payload)
INCARNATION_SHIFT: Final = 16  # header flags: the sender's incarnation above its flag bits
INCARNATION_BITS: Final = 31  # drawn at start (below TLS_PORT_SHIFT)
INCARNATION_MASK: Final = (1 << INCARNATION_BITS) - 1
TLS_PORT_FLAG: Final = 0x4000  # header flags: the sender announces its TLS client port
# header flags: the sender logs its copies to an AOF (appendonly yes): after a restart it
# may hold copies again, reloaded (re-replication keeps it on the jobs' lists)
PERSIST_FLAG: Final = 0x2000
TLS_PORT_SHIFT: Final = INCARNATION_SHIFT + INCARNATION_BITS  # (16 bits: a u64 that stays positive)

# ---------------------------------------------------------------------------- type numbers
PING: Final = 0
PONG: Final = 1
MEET: Final = 2
FAIL: Final = 3
# Job messages (payloads defined by the replication issue).
REPLJOB: Final = 4
GOTJOB: Final = 5
ENQUEUE: Final = 6
QUEUED: Final = 7
SETACK: Final = 8
WILLQUEUE: Final = 9
GOTACK: Final = 10
DELJOB: Final = 11
NEEDJOBS: Final = 12
YOURJOBS: Final = 13
WORKING: Final = 14
PAUSE: Final = 15
# Link authentication (cluster-password).
AUTH_CHALLENGE: Final = 16
AUTH_RESPONSE: Final = 17

TYPE_NAMES: dict[int, str] = {
    PING: "ping", PONG: "pong", MEET: "meet", FAIL: "fail",
    REPLJOB: "repljob", GOTJOB: "gotjob", ENQUEUE: "enqueue", QUEUED: "queued",
    SETACK: "setack", WILLQUEUE: "willqueue", GOTACK: "gotack", DELJOB: "deljob",
    NEEDJOBS: "needjobs", YOURJOBS: "yourjobs", WORKING: "working", PAUSE: "pause",
    AUTH_CHALLENGE: "auth_challenge", AUTH_RESPONSE: "auth_response",
}
JOB_TYPES: Final = (REPLJOB, GOTJOB, ENQUEUE, QUEUED, SETACK, WILLQUEUE, GOTACK, DELJOB, NEEDJOBS,
             YOURJOBS, WORKING, PAUSE)

NONCE_SIZE: Final = 32
DIGEST_SIZE: Final = 32  # HMAC-SHA256
MAX_IP_LEN: Final = 64

# One Packer for every frame: `msgpack.packb` is a Python function that builds a Packer
# (and its buffer) per call, a third of the cost of packing a small payload. The loop is
# single-threaded and nothing packed here calls back into Python, so the shared Packer is
# never re-entered; on an error it drops what it had packed (autoreset).
_packb: Final = msgpack.Packer().pack
_unpackb: Final = msgpack.unpackb
_LEN: Final = struct.Struct(">I")
_pack_len: Final = _LEN.pack
_unpack_len: Final = _LEN.unpack_from
_IP: Final = re.compile(rb"[\x21-\x7e]{0,%d}" % MAX_IP_LEN)  # printable, no spaces (nodes.conf)
_MAX_U64: Final = (1 << 64) - 1


class BusProtocolError(Exception):
    """Bytes on a bus link that are not a valid frame of this protocol version.

    `messages` holds the messages decoded from the same `feed()` call before the bad frame,
    so the I/O layer may still deliver them before closing the link."""

    def __init__(self, reason: str, messages: list[Message] | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.messages: list[Message] = messages if messages is not None else []


# ---------------------------------------------------------------------------- header
class Header:
    """Sender fields common to every message. Treat as immutable: the packed form is cached.

    `wire` is that packed form once made (None until then): the encoders read it and call
    `packed()` only when it is None, a call saved per frame."""

    __slots__ = ("sender", "ip", "port", "bus_port", "flags", "wire")

    def __init__(self, sender: bytes, ip: bytes, port: int, bus_port: int, flags: int) -> None:
        self.sender = sender
        self.ip = ip
        self.port = port
        self.bus_port = bus_port
        self.flags = flags
        self.wire: bytes | None = None

    def packed(self) -> bytes:
        p = self.wire
        if p is None:
            p = self.wire = (_packb(self.sender) + _packb(self.ip) + _packb(self.port)
                                + _packb(self.bus_port) + _packb(self.flags))
        return p

    def _key(self) -> tuple[bytes, bytes, int, int, int]:
        return (self.sender, self.ip, self.port, self.bus_port, self.flags)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Header) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        return (f"Header({self.sender[:8]!r}.., {self.ip!r}, {self.port}, {self.bus_port}, "
                f"flags={self.flags})")


# ---------------------------------------------------------------------------- messages
# fixarray(8), version, type: the first three bytes of every payload.
_PREFIX: dict[int, bytes] = {t: b"\x98" + _packb(VERSION) + _packb(t) for t in TYPE_NAMES}


class Message:
    """Base of every bus message: `header` plus the type's payload fields."""

    __slots__ = ("header",)
    TYPE: ClassVar[int]

    def __init__(self, header: Header) -> None:
        self.header = header

    def payload(self) -> Any:
        """The payload as msgpack-packable sequence (packed as one array)."""
        raise NotImplementedError

    @classmethod
    def from_payload(cls, header: Header, payload: list[Any]) -> Message:
        """Build the message from a decoded payload list, validating it (BusProtocolError)."""
        raise NotImplementedError

    # Messages of a batchable type (BATCH_KEY not None) are packed several to a frame; a
    # frame of several reaches the node as one BATCH message when the type has one.
    BATCH_KEY: ClassVar[str | None] = None
    BATCH: ClassVar[type[BatchOf] | None] = None
    n: int = 1  # how many jobs' messages this object stands for (a batch: several)

    def encode(self) -> bytes:
        """The complete frame: length prefix + msgpack payload."""
        header = self.header
        body = (_PREFIX[self.TYPE] + (header.wire or header.packed())
                + _packb(self.payload()))
        return _pack_len(len(body)) + body

    @classmethod
    def encode_batch(cls, msgs: list[Any]) -> bytes:
        """One frame for a run of messages of this batchable type that share the header
        and the batch key (see encode_many)."""
        raise NotImplementedError

    @classmethod
    def frame(cls, header: Header, items: list[Any], key: Any) -> bytes:
        """The frame of a batchable type holding `items` (job IDs or records) with their
        shared batch key."""
        raise NotImplementedError

    @classmethod
    def decode_batch(cls, header: Header, payload: list[Any]) -> list[Message]:
        """The messages of a frame of a batchable type, in order."""
        raise NotImplementedError

    @property
    def type_name(self) -> str:
        return TYPE_NAMES[self.TYPE]

    def __eq__(self, other: object) -> bool:
        return (type(other) is type(self) and self.header == other.header
                and list(self.payload()) == list(other.payload()))

    def __hash__(self) -> int:
        return hash((self.TYPE, self.header))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.header!r}, {self.payload()!r})"


class GossipEntry(NamedTuple):
    """What the sender knows about one other node (PING/PONG/MEET gossip section)."""

    node_id: bytes
    ip: bytes
    port: int
    bus_port: int
    flags: int
    ping_sent: int
    pong_received: int


class _GossipMessage(Message):
    __slots__ = ("gossip",)

    def __init__(self, header: Header, gossip: list[GossipEntry]) -> None:
        self.header = header
        self.gossip = gossip

    def payload(self) -> list[GossipEntry]:
        return self.gossip

    @classmethod
    def from_payload(cls, header: Header, payload: list[Any]) -> Message:
        return cls(header, [_gossip_entry(e) for e in payload])


class Ping(_GossipMessage):
    """A request for a PONG, sent on the sender's outbound link; carries gossip."""

    __slots__ = ()
    TYPE = PING


class Pong(_GossipMessage):
    """The reply to PING/MEET, on the link the request came on (or broadcast on a change)."""

    __slots__ = ()
    TYPE = PONG


class Meet(_GossipMessage):
    """Like PING, but the receiver adds an unknown sender to its node table."""

    __slots__ = ()
    TYPE = MEET


class Fail(Message):
    """The sender's majority decided `node_id` is failing: every receiver marks it FAIL."""

    __slots__ = ("node_id",)
    TYPE = FAIL

    def __init__(self, header: Header, node_id: bytes) -> None:
        self.header = header
        self.node_id = node_id

    def payload(self) -> tuple[bytes]:
        return (self.node_id,)

    @classmethod
    def from_payload(cls, header: Header, payload: list[Any]) -> Message:
        _expect_len(payload, 1, "FAIL")
        return cls(header, _node_id(payload[0]))


class AuthChallenge(Message):
    """Sent by the accepting side first thing when cluster-password is set."""

    __slots__ = ("nonce",)
    TYPE = AUTH_CHALLENGE

    def __init__(self, header: Header, nonce: bytes) -> None:
        self.header = header
        self.nonce = nonce

    def payload(self) -> tuple[bytes]:
        return (self.nonce,)

    @classmethod
    def from_payload(cls, header: Header, payload: list[Any]) -> Message:
        _expect_len(payload, 1, "AUTH_CHALLENGE")
        nonce = payload[0]
        if type(nonce) is not bytes or not 16 <= len(nonce) <= 64:
            raise BusProtocolError("bad AUTH_CHALLENGE nonce")
        return cls(header, nonce)


class AuthResponse(Message):
    """The connecting side's answer: HMAC-SHA256(password, nonce || sender node ID)."""

    __slots__ = ("digest",)
    TYPE = AUTH_RESPONSE

    def __init__(self, header: Header, digest: bytes) -> None:
        self.header = header
        self.digest = digest

    def payload(self) -> tuple[bytes]:
        return (self.digest,)

    @classmethod
    def from_payload(cls, header: Header, payload: list[Any]) -> Message:
        _expect_len(payload, 1, "AUTH_RESPONSE")
        digest = payload[0]
        if type(digest) is not bytes or len(digest) != DIGEST_SIZE:
            raise BusProtocolError("bad AUTH_RESPONSE digest")
        return cls(header, digest)


# ---------------------------------------------------------------------------- validation
def _expect_len(payload: list[Any], n: int, what: str) -> None:
    if len(payload) != n:
        raise BusProtocolError(f"{what} payload has {len(payload)} fields, expected {n}")


_KNOWN_IDS: dict[bytes, bytes] = {}  # node IDs already validated (a cluster has few)
_KNOWN_IDS_MAX: Final = 4096


def _node_id(v: Any) -> bytes:
    """A valid node ID, as one shared bytes object per ID (jobs hold many of them)."""
    if type(v) is bytes:
        known = _KNOWN_IDS.get(v)
        if known is not None:
            return known
    if type(v) is not bytes or len(v) != 40 or v.translate(None, b"0123456789abcdef"):
        raise BusProtocolError("bad node ID")
    if len(_KNOWN_IDS) >= _KNOWN_IDS_MAX:
        _KNOWN_IDS.clear()
    _KNOWN_IDS[v] = v
    return v


def _ip(v: Any) -> bytes:
    if type(v) is not bytes or _IP.fullmatch(v) is None:
        raise BusProtocolError("bad IP address field")
    return v


def _port(v: Any) -> int:
    if type(v) is not int or not 0 <= v <= 65535:
        raise BusProtocolError("bad port field")
    return v


def _u64(v: Any) -> int:
    if type(v) is not int or not 0 <= v <= _MAX_U64:
        raise BusProtocolError("bad integer field")
    return v


def _gossip_entry(e: Any) -> GossipEntry:
    if type(e) is not list or len(e) != 7:
        raise BusProtocolError("bad gossip entry")
    return GossipEntry(_node_id(e[0]), _ip(e[1]), _port(e[2]), _port(e[3]), _u64(e[4]),
                       _u64(e[5]), _u64(e[6]))


def decode(payload: bytes | bytearray | memoryview) -> Message:
    """One frame's payload (without the length prefix) -> its message, or BusProtocolError
    (also for a batched frame that does not hold exactly one message)."""
    msgs = decode_frame(payload)
    if len(msgs) != 1:
        raise BusProtocolError(f"expected one message, the frame holds {len(msgs)}")
    return msgs[0]


def decode_frame(payload: bytes | bytearray | memoryview,
                 known: Header | None = None) -> list[Message]:
    """One frame's payload (without the length prefix) -> its messages (several for a
    batched frame), or BusProtocolError. `known`: the header of the link's previous frame;
    a frame whose sender fields are the same (as they are from frame to frame of a link)
    shares it, without checking and building them again."""
    try:
        obj = _unpackb(payload, raw=False)
    except Exception as e:  # msgpack raises several unrelated types on bad input
        raise BusProtocolError(f"malformed msgpack: {type(e).__name__}") from None
    if type(obj) is not list or len(obj) != 8:
        raise BusProtocolError("a bus message is an 8-element array")
    version, mtype, sender, ip, port, bus_port, flags, body = obj
    if type(version) is not int or version != VERSION:
        raise BusProtocolError(f"unsupported bus protocol version {version!r}")
    cls = _DECODERS.get(mtype) if type(mtype) is int else None
    if cls is None:
        raise BusProtocolError(f"unknown bus message type {mtype!r}")
    if type(body) is not list:
        raise BusProtocolError("message payload is not an array")
    if (known is not None and type(port) is int and type(bus_port) is int
            and type(flags) is int and sender == known.sender and ip == known.ip
            and port == known.port and bus_port == known.bus_port and flags == known.flags):
        # (equal to fields that passed the checks below, of the same types: they pass)
        if cls.BATCH_KEY is not None:
            return cls.decode_batch(known, body)
        return [cls.from_payload(known, body)]
    sender = _node_id(sender)
    if type(ip) is not bytes or (ip and _IP.fullmatch(ip) is None):
        raise BusProtocolError("bad IP address field")
    if (type(port) is not int or type(bus_port) is not int or not 0 <= port <= 65535
            or not 0 <= bus_port <= 65535):
        raise BusProtocolError("bad port field")
    if type(flags) is not int or not 0 <= flags <= _MAX_U64:
        raise BusProtocolError("bad integer field")
    header = Header(sender, ip, port, bus_port, flags)
    if cls.BATCH_KEY is not None:
        return cls.decode_batch(header, body)
    return [cls.from_payload(header, body)]


def encode_many(msgs: Iterable[Message], stats: BusStats | None = None,
                shared: dict[tuple[Any, ...], bytes] | None = None) -> bytes:
    """Frames of several messages as one buffer (one write for a batch). A run of
    consecutive messages of one batchable type with the same header and batch key (REPLJOB
    with the same `noreply`, GOTJOB with the same `aux`...) becomes one frame.

    `shared`: frames already made for the same run of message objects, for a caller that
    encodes several links' queues in one go while those objects live (the same REPLJOBs go
    to every replica: one encoding for all)."""
    parts: list[bytes] = []
    run: list[Message] = []
    run_cls: type[Message] = Message  # (no run yet: no message is of the base class)
    run_key: Any = None
    run_header: Header | None = None
    for m in msgs:
        cls = m.__class__
        key_attr = cls.BATCH_KEY
        if key_attr is not None:
            key = getattr(m, key_attr)
            if cls is run_cls and key == run_key and m.header is run_header:
                run.append(m)
                continue
            if run:
                _flush_run(run_cls, run, parts, stats, shared)
            run = [m]
            run_cls, run_key, run_header = cls, key, m.header
            continue
        if run:
            _flush_run(run_cls, run, parts, stats, shared)
            run = []
            run_cls = Message
        frame = m.encode()
        if stats is not None:
            stats.sent(m.TYPE, len(frame), m.n)
        parts.append(frame)
    if run:
        _flush_run(run_cls, run, parts, stats, shared)
    return b"".join(parts)


def _flush_run(cls: type[Message], run: list[Message], parts: list[bytes], stats: BusStats | None,
               shared: dict[tuple[Any, ...], bytes] | None = None) -> None:
    if shared is not None:
        # the same message objects in the same order: every message of the caller's queues
        # existed, all at once, before it began, so their ids tell them apart (objects
        # freed since are no messages of those queues)
        key = tuple([id(m) for m in run])
        frame = shared.get(key)
        if frame is None:
            frame = shared[key] = cls.encode_batch(run)
    else:
        frame = cls.encode_batch(run)
    if stats is not None:
        stats.sent(cls.TYPE, len(frame), len(run))
    parts.append(frame)


class FrameDecoder:
    """Incremental decoder for one link: feed(bytes) -> complete messages.

    Holds at most one partial frame (bounded by `max_frame`). After a BusProtocolError the
    decoder stays failed: the link must be closed."""

    __slots__ = ("max_frame", "stats", "_buf", "_failed", "_header")

    def __init__(self, max_frame: int = MAX_FRAME, stats: BusStats | None = None) -> None:
        self.max_frame = max_frame
        self.stats = stats
        self._buf = bytearray()
        self._failed = False
        self._header: Header | None = None  # the last frame's (see decode_frame)

    def feed(self, data: bytes | bytearray | memoryview) -> list[Message]:
        if self._failed:
            raise BusProtocolError("decoder already failed")
        buf = self._buf
        buf += data
        out: list[Message] = []
        pos = 0
        end_of_data = len(buf)
        stats = self.stats
        try:
            while end_of_data - pos >= 4:
                (size,) = _unpack_len(buf, pos)
                if size > self.max_frame:
                    raise BusProtocolError(f"frame of {size} bytes exceeds the limit of "
                                           f"{self.max_frame}")
                if size == 0:
                    raise BusProtocolError("empty frame")
                end = pos + 4 + size
                if end > end_of_data:
                    break
                msgs = decode_frame(buf[pos + 4:end], self._header)
                if msgs:
                    self._header = msgs[0].header
                if stats is not None:
                    stats.received(msgs[0].TYPE, size + 4,
                                   len(msgs) if len(msgs) > 1 else msgs[0].n)
                out += msgs
                pos = end
        except BusProtocolError as e:
            self._failed = True
            buf.clear()
            e.messages = out
            raise
        if pos:
            del buf[:pos]
        return out

    @property
    def pending(self) -> int:
        """Bytes of an incomplete frame held."""
        return len(self._buf)


# ---------------------------------------------------------------------------- auth
def make_nonce(randbytes: Callable[[int], bytes] = secrets.token_bytes) -> bytes:
    return randbytes(NONCE_SIZE)


def auth_digest(password: bytes, nonce: bytes, node_id: bytes) -> bytes:
    """HMAC-SHA256(password, nonce || node_id): the connecting side's AUTH_RESPONSE."""
    return hmac.new(password, nonce + node_id, hashlib.sha256).digest()


def auth_verify(password: bytes, nonce: bytes, node_id: bytes, digest: bytes) -> bool:
    """Constant-time check of an AUTH_RESPONSE digest for the challenge `nonce`."""
    return hmac.compare_digest(auth_digest(password, nonce, node_id), digest)


# ---------------------------------------------------------------------------- stats
class BusStats:
    """Messages and bytes in/out per message type, kept by whoever moves the frames (the
    asyncio bus, or the simulated network). CLUSTER INFO and INFO read it."""

    __slots__ = ("msgs_sent", "msgs_received", "bytes_sent", "bytes_received")

    def __init__(self) -> None:
        self.msgs_sent: dict[int, int] = {}
        self.msgs_received: dict[int, int] = {}
        self.bytes_sent: dict[int, int] = {}
        self.bytes_received: dict[int, int] = {}

    def sent(self, mtype: int, nbytes: int, count: int = 1) -> None:
        """`count` messages of type `mtype` left in `nbytes` (one frame, or a batch)."""
        self.msgs_sent[mtype] = self.msgs_sent.get(mtype, 0) + count
        self.bytes_sent[mtype] = self.bytes_sent.get(mtype, 0) + nbytes

    def received(self, mtype: int, nbytes: int, count: int = 1) -> None:
        self.msgs_received[mtype] = self.msgs_received.get(mtype, 0) + count
        self.bytes_received[mtype] = self.bytes_received.get(mtype, 0) + nbytes

    def total_sent(self) -> int:
        return sum(self.msgs_sent.values())

    def total_received(self) -> int:
        return sum(self.msgs_received.values())

    def info_fields(self) -> list[tuple[str, object]]:
        """INFO's bus counters: totals, then one line per message type seen."""
        fields: list[tuple[str, object]] = [
            ("bus_messages_sent", self.total_sent()),
            ("bus_messages_received", self.total_received()),
            ("bus_bytes_sent", sum(self.bytes_sent.values())),
            ("bus_bytes_received", sum(self.bytes_received.values())),
        ]
        for mtype, name in TYPE_NAMES.items():
            if mtype in self.msgs_sent or mtype in self.msgs_received:
                fields.append((f"bus_{name}", f"sent={self.msgs_sent.get(mtype, 0)},"
                                              f"sent_bytes={self.bytes_sent.get(mtype, 0)},"
                                              f"received={self.msgs_received.get(mtype, 0)},"
                                              f"received_bytes="
                                              f"{self.bytes_received.get(mtype, 0)}"))
        return fields

    def reset(self) -> None:
        for d in (self.msgs_sent, self.msgs_received, self.bytes_sent, self.bytes_received):
            d.clear()


# ---------------------------------------------------------------------------- job messages
# The job state machines of disque/cluster/jobs.py speak these (the spec's names). A job
# travels as a JobRecord; its expire time is relative ("ms left"), so the nodes' clocks need
# not agree.
QUEUED_INCR_NACKS: Final = 1  # QUEUED flags: bump the receiver's nacks counter...
QUEUED_INCR_DELIV: Final = 2  # ...or its additional-deliveries counter
# Dead-letter state (disque.cluster.deadletters) in the aux of QUEUED and WILLQUEUE:
QUEUED_STATE_ONLY: Final = 4  # the sender did not queue the job: it only tells its state
QUEUED_RESET: Final = 8  # a redrive that reset the counters
QUEUED_UNKNOWN: Final = 16  # (with STATE_ONLY) the answer to a WILLQUEUE_CONFIRM: job collected here
STATE_REASON_SHIFT: Final = 5  # 2 bits: why the job is dead (disque.jobs.deadletter REASON_*)
STATE_REASON_MASK: Final = 3
STATE_EPOCH_SHIFT: Final = 7  # the rest: the job's dead-letter epoch (odd: dead)
# WILLQUEUE's aux: the state bits above, and this flag from a copy reloaded from the AOF,
# which asks every holder to answer (QUEUED STATE_ONLY, with UNKNOWN if it collected the job)
WILLQUEUE_CONFIRM: Final = 1


class JobRecord(NamedTuple):
    id: bytes
    queue: bytes
    body: bytes
    repl: int
    ttl_ms: int  # milliseconds left before expiry, at the sender
    ctime: int
    delay: int
    retry: int
    nacks: int
    deliveries: int
    delivered: tuple[bytes, ...]
    dl: DeadLetter | None = None  # a 12th wire field only with a dead-letter policy


def _job_id(v: Any) -> bytes:
    if type(v) is not bytes or len(v) != 40:
        raise BusProtocolError("bad job id")
    return v


def _uint(v: Any, what: str) -> int:
    if type(v) is not int or not 0 <= v <= _MAX_U64:
        raise BusProtocolError(f"bad {what}")
    return v


def _job_record(v: Any, table: list[bytes] | None = None,
                cache: dict[tuple[int, ...], tuple[bytes, ...]] | None = None) -> JobRecord:
    """A job record; its `delivered` holds node IDs, or (REPLJOB: `table` given) indexes
    into the frame's node table, each distinct list of them made into one tuple (`cache`)
    that every job of the frame shares."""
    if type(v) is not list or not 11 <= len(v) <= 12:
        raise BusProtocolError("bad job record")
    dl = None
    if len(v) == 12:
        try:
            dl = DeadLetter.from_wire(v.pop())
        except ValueError as exc:
            raise BusProtocolError(str(exc)) from None
    jid, queue, body, repl, ttl_ms, ctime, delay, retry, nacks, deliv, delivered = v
    if type(queue) is not bytes or type(body) is not bytes or type(delivered) is not list:
        raise BusProtocolError("bad job record fields")
    if type(jid) is not bytes or len(jid) != 40:
        raise BusProtocolError("bad job id")
    # the integers: one test for the usual case, the precise error otherwise. All in
    # 0..2^64-1 exactly when their bitwise OR is, i.e. when it shifted right by 64 is 0 (a
    # negative one makes it -1): compiled, native operations on small ints, where
    # comparisons with 2^64-1 (no small int) went through the generic path, 7 per record
    if not (type(repl) is int and type(ttl_ms) is int and type(ctime) is int
            and type(delay) is int and type(retry) is int and type(nacks) is int
            and type(deliv) is int
            and (repl | ttl_ms | ctime | delay | retry | nacks | deliv) >> 64 == 0):
        for value, what in ((repl, "repl"), (ttl_ms, "ttl"), (ctime, "ctime"),
                            (delay, "delay"), (retry, "retry"), (nacks, "nacks"),
                            (deliv, "deliveries")):
            _uint(value, what)
    nodes: tuple[bytes, ...] | None
    if table is None:
        nodes = tuple([_node_id(n) for n in delivered])
    else:
        try:
            key = tuple(delivered)
            nodes = cache.get(key)  # type: ignore[union-attr]
        except TypeError:  # an unhashable element
            raise BusProtocolError("bad node index") from None
        if nodes is None:
            try:
                nodes = tuple([table[i] for i in key])
            except (TypeError, IndexError):
                raise BusProtocolError("bad node index") from None
            if any(type(i) is not int or i < 0 for i in key):
                raise BusProtocolError("bad node index")
            cache[key] = nodes  # type: ignore[index]
    # TTL, DELAY and RETRY are capped at what ADDJOB accepts (10 years): times derived from
    # them must fit the bus and AOF encodings when this node sends or logs the job in turn.
    # Capped, not refused: a peer of an older version may hold such a job, and refusing the
    # record would drop the link again at every reconnection.
    if ttl_ms > _MAX_TTL_MS:
        ttl_ms = _MAX_TTL_MS
    if delay > MAX_JOB_SECONDS:
        delay = MAX_JOB_SECONDS
    if retry > MAX_JOB_SECONDS:
        retry = MAX_JOB_SECONDS
    return new_record(JobRecord, (jid, queue, body, repl, ttl_ms, ctime, delay, retry, nacks,
                                  deliv, nodes, dl))


def _wire_record(rec: JobRecord) -> tuple[Any, ...]:
    """A record as YOURJOBS sends it: the dead-letter field only when there is one."""
    dl = rec[11]
    return rec[:11] if dl is None else (*rec[:11], dl.to_wire())


def _repljob_frame(header: Header, recs: Iterable[JobRecord], noreply: bool) -> bytes:
    """REPLJOB's wire form: [[record, ...], noreply, [node id, ...]], each record's
    `delivered` as indexes into that node table: the IDs (40 bytes each, 3 per job with
    REPLICATE 3) travel once per frame instead of once per job."""
    table: dict[bytes, int] = {}
    lists: dict[tuple[bytes, ...], list[int]] = {}
    out = []
    for rec in recs:
        delivered = rec[10]
        idx = lists.get(delivered)
        if idx is None:
            idx = lists[delivered] = [table.setdefault(n, len(table)) for n in delivered]
        dl = rec[11]
        out.append((*rec[:10], idx) if dl is None else (*rec[:10], idx, dl.to_wire()))
    body = (_PREFIX[REPLJOB] + (header.wire or header.packed())
            + _packb((out, noreply, list(table))))
    return _pack_len(len(body)) + body


# JobRecord(...) goes through a generated __new__ (a quarter of the cost of a REPLJOB on
# the replica's side); records built on the hot paths use the tuple constructor directly.
new_record: Final = tuple.__new__


_MAX_TTL_MS: Final = MAX_JOB_SECONDS * 1000


def _batch_frame(cls: Any, header: Header, items: list[Any], key: Any) -> bytes:
    body = _PREFIX[cls.TYPE] + (header.wire or header.packed()) + _packb((items, key))
    return _pack_len(len(body)) + body


def _batch_items(payload: list[Any], what: str) -> list[Any]:
    _expect_len(payload, 2, what)
    items = payload[0]
    if type(items) is not list or not items:
        raise BusProtocolError(f"bad {what} job list")
    return items


class _JobIdMessage(Message):
    """A message about one job: its ID and one small integer (`aux`, 0 when unused). On the
    wire a frame carries a list of IDs sharing one `aux`."""

    __slots__ = ("job_id", "aux")
    BATCH_KEY = "aux"

    def __init__(self, header: Header, job_id: bytes, aux: int = 0) -> None:
        self.header = header
        self.job_id = job_id
        self.aux = aux

    def payload(self) -> tuple[list[bytes], int]:
        return ([self.job_id], self.aux)

    @classmethod
    def encode_batch(cls, msgs: list[Any]) -> bytes:
        first = msgs[0]
        return cls.frame(first.header, [m.job_id for m in msgs], first.aux)

    @classmethod
    def frame(cls, header: Header, job_ids: list[bytes], aux: int) -> bytes:
        return _batch_frame(cls, header, job_ids, aux)

    @classmethod
    def decode_batch(cls, header: Header, payload: list[Any]) -> list[Message]:
        ids = [_job_id(job_id) for job_id in _batch_items(payload, TYPE_NAMES[cls.TYPE])]
        aux = _uint(payload[1], "aux")
        batch = cls.BATCH
        if len(ids) > 1 and batch is not None:
            return [batch(header, ids, aux)]
        return [cls(header, job_id, aux) for job_id in ids]


class BatchOf(Message):
    """The messages of one frame of a batchable type, handed to the node as one message
    (`items`: their job IDs or records, `key`: their shared aux / noreply) so that the hot
    ones (REPLJOB, GOTJOB) cost no object and no dispatch per job."""

    __slots__ = ("items", "key", "n")

    def __init__(self, header: Header, items: list[Any], key: Any) -> None:
        self.header = header
        self.items = items
        self.key = key
        self.n = len(items)

    def payload(self) -> tuple[list[Any], Any]:
        return (self.items, self.key)

    def messages(self) -> list[Message]:
        """The single messages this batch stands for."""
        raise NotImplementedError


class GotJobBatch(BatchOf):
    """Several GOTJOBs of one frame. (Each batch class names its single message type in
    its methods, and the single type names its batch class as BATCH, set in its class
    body: no class attribute is assigned after the class, which mypyc does not allow.)"""

    __slots__ = ()
    TYPE = GOTJOB

    def messages(self) -> list[Message]:
        return [GotJob(self.header, item, self.key) for item in self.items]

    def encode(self) -> bytes:
        return GotJob.frame(self.header, self.items, self.key)


class GotJob(_JobIdMessage):
    """Reply to REPLJOB: the sender now holds a copy."""

    __slots__ = ()
    TYPE = GOTJOB
    BATCH = GotJobBatch


class EnqueueJob(_JobIdMessage):
    """Queue this job (aux = delay in seconds): sent by a node that kept no copy."""

    __slots__ = ()
    TYPE = ENQUEUE


class Queued(_JobIdMessage):
    """The sender queued the job (aux = QUEUED_INCR_* flags): postpone your own requeue."""

    __slots__ = ()
    TYPE = QUEUED


class SetAck(_JobIdMessage):
    """Mark the job acknowledged (aux = how many nodes the sender thinks may have it)."""

    __slots__ = ()
    TYPE = SETACK


class WillQueue(_JobIdMessage):
    """The sender will requeue the job in 500 ms unless told it is queued or acked."""

    __slots__ = ()
    TYPE = WILLQUEUE


class GotAck(_JobIdMessage):
    """Reply to SETACK (aux = 1 if the sender knew the job)."""

    __slots__ = ()
    TYPE = GOTACK


class DelJob(_JobIdMessage):
    """Delete your copy of the job."""

    __slots__ = ()
    TYPE = DELJOB


class WorkingJob(_JobIdMessage):
    """A consumer is still working on the job: postpone the requeue, dequeue it. aux > 0:
    a NACK DELAY of aux seconds (count a nack; requeue no sooner than aux s + RETRY)."""

    __slots__ = ()
    TYPE = WORKING


class ReplJobBatch(BatchOf):
    """Several REPLJOBs of one frame."""

    __slots__ = ()
    TYPE = REPLJOB

    def messages(self) -> list[Message]:
        return [ReplJob(self.header, item, self.key) for item in self.items]

    def encode(self) -> bytes:
        return ReplJob.frame(self.header, self.items, self.key)


class ReplJob(Message):
    """Hold a copy of this job (reply GOTJOB unless `noreply`). On the wire a frame carries
    a list of job records sharing one `noreply`."""

    __slots__ = ("job", "noreply")
    TYPE = REPLJOB
    BATCH_KEY = "noreply"
    BATCH = ReplJobBatch

    def __init__(self, header: Header, job: JobRecord, noreply: bool = False) -> None:
        self.header = header
        self.job = job
        self.noreply = noreply

    def payload(self) -> tuple[list[JobRecord], bool]:
        return ([self.job], self.noreply)

    def encode(self) -> bytes:
        return _repljob_frame(self.header, (self.job,), self.noreply)

    @classmethod
    def encode_batch(cls, msgs: list[Any]) -> bytes:
        first = msgs[0]
        return _repljob_frame(first.header, [m.job for m in msgs], first.noreply)

    @classmethod
    def frame(cls, header: Header, jobs: list[JobRecord], noreply: bool) -> bytes:
        return _repljob_frame(header, jobs, noreply)

    @classmethod
    def decode_batch(cls, header: Header, payload: list[Any]) -> list[Message]:
        if len(payload) != 3:
            raise BusProtocolError(f"REPLJOB payload has {len(payload)} fields, expected 3")
        recs = payload[0]
        if type(recs) is not list or not recs:
            raise BusProtocolError("bad REPLJOB job list")
        noreply = payload[1]
        if type(noreply) is not bool:
            raise BusProtocolError("bad REPLJOB flag")
        nodes = payload[2]
        if type(nodes) is not list:
            raise BusProtocolError("bad REPLJOB node table")
        table = [_node_id(n) for n in nodes]
        cache: dict[tuple[int, ...], tuple[bytes, ...]] = {}
        jobs = [_job_record(r, table, cache) for r in recs]
        if len(jobs) == 1:
            return [cls(header, jobs[0], noreply)]
        return [ReplJobBatch(header, jobs, noreply)]


class NeedJobs(Message):
    """The sender has consumers waiting on `queue`: send up to `count` jobs."""

    __slots__ = ("queue", "count")
    TYPE = NEEDJOBS

    def __init__(self, header: Header, queue: bytes, count: int) -> None:
        self.header = header
        self.queue = queue
        self.count = count

    def payload(self) -> tuple[bytes, int]:
        return (self.queue, self.count)

    @classmethod
    def from_payload(cls, header: Header, payload: list[Any]) -> Message:
        _expect_len(payload, 2, "NEEDJOBS")
        if type(payload[0]) is not bytes:
            raise BusProtocolError("bad NEEDJOBS queue")
        return cls(header, payload[0], _uint(payload[1], "count"))


class YourJobs(Message):
    """Jobs moved out of the sender's queue, for the receiver to queue."""

    __slots__ = ("jobs",)
    TYPE = YOURJOBS

    def __init__(self, header: Header, jobs: list[JobRecord]) -> None:
        self.header = header
        self.jobs = jobs

    def payload(self) -> tuple[list[Any]]:
        return ([_wire_record(r) for r in self.jobs],)

    @classmethod
    def from_payload(cls, header: Header, payload: list[Any]) -> Message:
        _expect_len(payload, 1, "YOURJOBS")
        if type(payload[0]) is not list:
            raise BusProtocolError("bad YOURJOBS list")
        return cls(header, [_job_record(r) for r in payload[0]])


class PauseQueue(Message):
    """Set the pause state of `queue` (flags: 1 in, 2 out), as PAUSE ... bcast."""

    __slots__ = ("queue", "flags")
    TYPE = PAUSE

    def __init__(self, header: Header, queue: bytes, flags: int) -> None:
        self.header = header
        self.queue = queue
        self.flags = flags

    def payload(self) -> tuple[bytes, int]:
        return (self.queue, self.flags)

    @classmethod
    def from_payload(cls, header: Header, payload: list[Any]) -> Message:
        _expect_len(payload, 2, "PAUSE")
        flags = _uint(payload[1], "pause flags")
        if type(payload[0]) is not bytes or flags > 3:
            raise BusProtocolError("bad PAUSE payload")
        return cls(header, payload[0], flags)


# The decoder of each message type: an explicit table rather than a class decorator (a
# decorated class is not a native class for mypyc), in the order of the type numbers.
_DECODERS: Final[dict[int, type[Message]]] = {cls.TYPE: cls for cls in (
    Ping, Pong, Meet, Fail, ReplJob, GotJob, EnqueueJob, Queued, SetAck, WillQueue, GotAck,
    DelJob, NeedJobs, YourJobs, WorkingJob, PauseQueue, AuthChallenge, AuthResponse)}
if sorted(_DECODERS) != sorted(TYPE_NAMES):
    raise ValueError("every bus message type needs exactly one decoder class")
