"""The AOF on disk: job serialization, record encoding and parsing, the loader's handling of
truncated and corrupt files, and the `disque-check-aof` tool (checklist section 12).

No server: files are written to temporary directories and loaded into a `Node` driven by a
fake clock.
"""

from __future__ import annotations

import os
import random
import struct
import tempfile
from dataclasses import dataclass
from pathlib import Path
from unittest.mock import patch

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from disque.aof import check
from disque.aof import loader as loader_mod
from disque.aof.format import (
    AofFormatError,
    Incomplete,
    ackjob_record,
    deljob_record,
    loadjob_record,
    parse_record,
)
from disque.aof.loader import AofLoader, AofLoadError
from disque.jobs.job import (
    ACKED,
    ACTIVE,
    F_BCAST_QUEUED,
    F_BCAST_WILLQUEUE,
    F_DELIVERED,
    F_DUMMY,
    QUEUED,
    WAIT_REPL,
    Job,
)
from disque.jobs.serialize import SerializeError, deserialize_job, serialize_job
from disque.node import Node
from disque.state import REQUEUE_JITTER

MYID = b"0123abcd" + b"e" * 32
OTHER = b"89abcdef" + b"0" * 32
T0 = 1_700_000_000_000  # unix ms: the fake clock of every loader test
B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
HEX = "0123456789abcdef"

# -- strategies ------------------------------------------------------------------------------

job_ids = st.builds(
    lambda node, rnd, ttl: f"D-{node}-{rnd}-{ttl}".encode(),
    st.text(HEX, min_size=8, max_size=8),
    st.text(B64, min_size=24, max_size=24),
    st.text(HEX, min_size=4, max_size=4),
)
node_ids = st.binary(min_size=40, max_size=40)
U16 = st.integers(0, 0xFFFF)
U32 = st.integers(0, 0xFFFF_FFFF)


@st.composite
def jobs(draw, states=st.integers(0, 3), etime=st.integers(0, 0xFFFF_FFFF * 1000 + 999),
         body=st.binary(max_size=300), queue=st.binary(max_size=40)) -> Job:
    job = Job(draw(job_ids), draw(queue), draw(body), draw(U16), draw(st.integers(0, 2**64 - 1)),
              draw(etime), draw(U32), draw(U32), tuple(draw(st.lists(node_ids, max_size=5))))
    job.state = draw(states)
    job.flags = draw(st.integers(0, 15))
    job.nacks = draw(st.integers(0, 70_000))
    job.deliveries = draw(st.integers(0, 70_000))
    job.gc_retry = draw(st.integers(0, 15))
    job.qtime = draw(st.integers(0, 2**40))  # node-local: never serialized
    return job


def fields(job: Job) -> dict[str, object]:
    return {name: getattr(job, name) for name in (
        "id", "queue", "body", "state", "flags", "repl", "ctime", "etime", "delay", "retry",
        "nacks", "deliveries", "delivered", "gc_retry")}


# -- serialization ----------------------------------------------------------------------------

@given(jobs())
def test_storage_form_round_trips_every_persisted_field(job: Job) -> None:
    blob = serialize_job(job)
    back, end = deserialize_job(blob)
    assert end == len(blob)
    want = fields(job)
    want["etime"] = job.etime // 1000 * 1000  # stored as unix seconds
    want["flags"] = job.flags & (F_BCAST_QUEUED | F_BCAST_WILLQUEUE | F_DELIVERED)  # no F_DUMMY
    want["nacks"] = min(job.nacks, 0xFFFF)
    want["deliveries"] = min(job.deliveries, 0xFFFF)
    assert fields(back) == want
    assert back.qtime == 0 and back.awake == 0 and back.confirmed == ()


@given(jobs(etime=st.integers(0, 2**41)), st.integers(0, 2**41), st.integers(0, 2**41))
def test_message_form_sends_relative_ttl_and_clears_delivered_flag(job: Job, now_send: int,
                                                                   now_recv: int) -> None:
    blob = serialize_job(job, storage=False, now_ms=now_send)
    back, end = deserialize_job(blob, storage=False, now_ms=now_recv)
    assert end == len(blob)
    seconds_left = max(0, (job.etime - now_send) // 1000)
    want = fields(job)
    want["etime"] = now_recv + seconds_left * 1000
    want["flags"] = job.flags & (F_BCAST_QUEUED | F_BCAST_WILLQUEUE)
    want["nacks"] = min(job.nacks, 0xFFFF)
    want["deliveries"] = min(job.deliveries, 0xFFFF)
    assert fields(back) == want


@given(st.lists(jobs(body=st.binary(max_size=30)), min_size=1, max_size=4), st.binary(max_size=9))
def test_deserialize_walks_concatenated_jobs_by_offset(many: list[Job], junk: bytes) -> None:
    blobs = [serialize_job(j) for j in many]
    data = junk + b"".join(blobs)
    pos = len(junk)
    for job, blob in zip(many, blobs, strict=True):
        back, end = deserialize_job(data, pos)
        assert back.id == job.id and back.body == job.body
        assert end == pos + len(blob)
        pos = end


def test_serialized_layout_is_the_originals() -> None:
    job = Job(b"D-0123abcd-" + b"A" * 24 + b"-05a1", b"q1", b"hello", 3, 1234567 * 10**6 + 1,
              1_800_000_000_999, 5, 60, (MYID, OTHER))
    job.state, job.flags, job.gc_retry, job.nacks, job.deliveries = QUEUED, 5, 2, 7, 9
    rest = (struct.pack("<40sBBHIQIIHH", job.id, QUEUED | (2 << 4), 5, 3, 1_800_000_000,
                        1234567 * 10**6 + 1, 5, 60, 7, 9)
            + struct.pack("<I", 2) + b"q1" + struct.pack("<I", 5) + b"hello"
            + struct.pack("<I", 2) + MYID + OTHER)
    assert serialize_job(job) == struct.pack("<I", len(rest)) + rest
    assert len(rest) == 68 + 4 + 2 + 4 + 5 + 4 + 80


def test_dummy_ack_without_queue_and_body_serializes_as_empty_strings() -> None:
    job = Job(b"D-0123abcd-" + b"B" * 24 + b"-05a1", None, None, 0, 0, T0, 0, 0, ())
    job.state, job.flags = ACKED, F_DUMMY
    back, _ = deserialize_job(serialize_job(job))
    assert back.queue == b"" and back.body == b"" and back.flags == 0 and back.state == ACKED


@given(jobs(body=st.binary(max_size=40)), st.data())
def test_truncated_serialized_job_is_a_serialize_error(job: Job, data: st.DataObject) -> None:
    blob = serialize_job(job)
    cut = data.draw(st.integers(0, len(blob) - 1))
    with pytest.raises(SerializeError):
        deserialize_job(blob[:cut])


def test_bad_state_is_a_serialize_error() -> None:
    job = Job(b"D-0123abcd-" + b"C" * 24 + b"-05a1", b"q", b"b", 1, 1, T0, 0, 1, ())
    blob = bytearray(serialize_job(job))
    blob[4 + 40] = 9  # state nibble 9
    with pytest.raises(SerializeError, match="bad job state"):
        deserialize_job(bytes(blob))


def test_inconsistent_inner_lengths_are_a_serialize_error() -> None:
    job = Job(b"D-0123abcd-" + b"D" * 24 + b"-05a1", b"queue", b"body", 1, 1, T0, 0, 1, (MYID,))
    blob = bytearray(serialize_job(job))
    struct.pack_into("<I", blob, 4 + 68, 200)  # queue length beyond the job
    with pytest.raises(SerializeError):
        deserialize_job(bytes(blob))


# -- records ----------------------------------------------------------------------------------

@given(jobs(body=st.binary(max_size=100)))
def test_loadjob_record_is_a_resp_multibulk_and_parses_back(job: Job) -> None:
    blob = serialize_job(job)
    record = loadjob_record(job)
    assert record == b"*2\r\n$7\r\nLOADJOB\r\n$%d\r\n%b\r\n" % (len(blob), blob)
    argv, end = parse_record(record, 0, 0)
    assert argv == [b"LOADJOB", blob] and end == len(record)


def test_deljob_record_is_a_resp_multibulk_and_parses_back() -> None:
    job_id = b"D-0123abcd-" + b"E" * 24 + b"-05a1"
    record = deljob_record(job_id)
    assert record == b"*2\r\n$6\r\nDELJOB\r\n$40\r\n" + job_id + b"\r\n"
    assert parse_record(record, 0, 0) == ([b"DELJOB", job_id], len(record))


@given(st.lists(jobs(body=st.binary(max_size=60)), min_size=1, max_size=6), st.binary(max_size=5))
def test_parse_record_returns_end_positions_of_consecutive_records(many: list[Job],
                                                                   lead: bytes) -> None:
    records = []
    for i, job in enumerate(many):
        records.append(loadjob_record(job) if i % 2 == 0 else deljob_record(job.id))
    buf = lead + b"".join(records)
    pos = len(lead)
    for record in records:
        argv, end = parse_record(buf, pos, 1000 + pos)
        assert end - pos == len(record)
        assert argv[0] in (b"LOADJOB", b"DELJOB")
        pos = end
    assert pos == len(buf)
    with pytest.raises(Incomplete):
        parse_record(buf, pos, 1000 + pos)


@given(jobs(body=st.binary(max_size=60)), st.data())
def test_every_proper_prefix_of_a_record_is_incomplete(job: Job, data: st.DataObject) -> None:
    record = data.draw(st.sampled_from([loadjob_record(job), deljob_record(job.id)]))
    cut = data.draw(st.integers(0, len(record) - 1))
    with pytest.raises(Incomplete):
        parse_record(record[:cut], 0, 0)


@pytest.mark.parametrize("bad,reason", [
    (b"x2\r\n$6\r\nDELJOB\r\n", "expected '*'"),
    (b"*x\r\n$6\r\nDELJOB\r\n", "bad count line"),
    (b"*0\r\n", "empty record"),
    (b"*2\r\n#6\r\nDELJOB\r\n", "expected '$'"),
    (b"*2\r\n$-1\r\nDELJOB\r\n", "bad count line"),
    (b"*2\r\n$6\r\nDELJOBxx$1\r\n", "bulk not terminated by CRLF"),
    (b"*2" + b"2" * 40 + b"\r\n", "bad count line"),  # no CRLF in the first 32 bytes
    (b"*2000\r\n$6\r\nDELJOB\r\n", "bad count line"),  # more than 1024 arguments
])
def test_bad_record_bytes_raise_format_error_at_the_record_offset(bad: bytes, reason: str) -> None:
    good = deljob_record(b"D-0123abcd-" + b"F" * 24 + b"-05a1")
    buf = good + bad
    _, end = parse_record(buf, 0, 500)
    with pytest.raises(AofFormatError) as info:
        parse_record(buf, end, 500 + end)
    assert info.value.offset == 500 + end
    assert info.value.reason == reason
    assert str(info.value) == f"{reason} at offset {500 + end}"


# -- the loader ---------------------------------------------------------------------------------

def make_node(now: int = T0) -> Node:
    return Node(MYID, lambda: now, rng=random.Random(7))


def load(path: str | Path, node: Node | None = None, *, enqueue: bool = False,
         truncated_ok: bool = True) -> tuple[AofLoader, Node]:
    node = node or make_node()
    ld = AofLoader(str(path), node, enqueue, truncated_ok)
    for _ in ld.steps():
        pass
    return ld, node


def registered(node: Node, candidates: set[bytes] | None = None) -> set[bytes]:
    """The registered job IDs (checked among `candidates` when given: walking the registry's
    4096 shards for every cut of a property test is the slow part)."""
    if candidates is None:
        return {j.id for j in node.jobs.values()}
    found = {i for i in candidates if node.lookup_job(i) is not None}
    assert len(node.jobs) == len(found), "a job that no record mentions was registered"
    return found


@dataclass
class Aof:
    """A valid AOF built from a list of operations, with what each prefix should load."""

    data: bytes
    starts: list[int]  # file offset of each record
    live_after: list[set[bytes]]  # registered job IDs after applying records[0..i]

    @property
    def all_ids(self) -> set[bytes]:
        return set().union(*self.live_after)

    @property
    def last_start(self) -> int:
        return self.starts[-1]


live_jobs = jobs(states=st.sampled_from([ACTIVE, QUEUED]),
                 etime=st.integers(T0 + 1000, T0 + 10**9), body=st.binary(max_size=40),
                 queue=st.sampled_from([b"q1", b"q2", b""]))


@st.composite
def aofs(draw, min_records: int = 1, max_records: int = 6) -> Aof:
    """LOADJOB records of fresh jobs, DELJOB records of loaded ones (or of unknown IDs), and
    an occasional second LOADJOB of a loaded job (the newer record wins)."""
    n = draw(st.integers(min_records, max_records))
    data = bytearray()
    starts: list[int] = []
    live: list[set[bytes]] = []
    current: dict[bytes, Job] = {}
    for _ in range(n):
        kind = draw(st.sampled_from(["load", "load", "del", "reload"]))
        if kind == "del":
            job_id = (draw(st.sampled_from(sorted(current))) if current and draw(st.booleans())
                      else draw(job_ids))
            record = deljob_record(job_id)
            current.pop(job_id, None)
        elif kind == "reload" and current:
            job = current[draw(st.sampled_from(sorted(current)))]
            record = loadjob_record(job)
        else:
            job = draw(live_jobs)
            record = loadjob_record(job)
            current[job.id] = job
        starts.append(len(data))
        data += record
        live.append(set(current))
    return Aof(bytes(data), starts, live)


# Small chunks make records straddle chunk boundaries in the loader.
CHUNKS = st.sampled_from([5, 64, 1000, loader_mod.CHUNK])


@settings(max_examples=25, deadline=None)
@given(aofs(max_records=4), CHUNKS)
def test_truncated_last_record_loads_the_prefix_at_every_cut(aof: Aof, chunk: int) -> None:
    before_last = aof.live_after[-2] if len(aof.starts) > 1 else set()
    # the loader fsyncs the file it cuts; hundreds of cuts per example need no durability
    with tempfile.TemporaryDirectory() as tmp, patch.object(loader_mod, "CHUNK", chunk), \
            patch.object(loader_mod.os, "fsync", lambda fd: None):
        path = os.path.join(tmp, "disque.aof")
        for cut in range(aof.last_start + 1, len(aof.data)):
            Path(path).write_bytes(aof.data[:cut])
            ld, node = load(path)
            assert registered(node, aof.all_ids) == before_last, cut
            assert ld.truncated_at == aof.last_start
            assert os.path.getsize(path) == aof.last_start, "file cut to the last whole record"
        # the truncated file now loads cleanly to the same state
        ld2, node2 = load(path, truncated_ok=False)
        assert registered(node2) == before_last and ld2.truncated_at is None


@settings(max_examples=15, deadline=None)
@given(aofs(max_records=4), CHUNKS)
def test_truncated_last_record_is_an_error_when_load_truncated_is_no(aof: Aof,
                                                                     chunk: int) -> None:
    with tempfile.TemporaryDirectory() as tmp, patch.object(loader_mod, "CHUNK", chunk):
        path = os.path.join(tmp, "disque.aof")
        for cut in range(aof.last_start + 1, len(aof.data)):
            Path(path).write_bytes(aof.data[:cut])
            with pytest.raises(AofLoadError) as info:
                load(path, truncated_ok=False)
            assert f"truncated record at offset {aof.last_start}" in str(info.value)
            assert "disque-check-aof --fix" in str(info.value)
            assert os.path.getsize(path) == cut, "the file is left alone"


@settings(max_examples=40, deadline=None)
@given(aofs(), CHUNKS)
def test_whole_file_loads_every_record_in_order(aof: Aof, chunk: int) -> None:
    with tempfile.TemporaryDirectory() as tmp, patch.object(loader_mod, "CHUNK", chunk):
        path = os.path.join(tmp, "disque.aof")
        Path(path).write_bytes(aof.data)
        ld, node = load(path, truncated_ok=False)
        assert registered(node) == aof.live_after[-1]
        assert ld.truncated_at is None and ld.records == len(aof.starts)
        assert ld.loaded_bytes == len(aof.data) == os.path.getsize(path)
        # a file cut exactly between records is a whole file too
        Path(path).write_bytes(aof.data[:aof.last_start])
        ld, node = load(path, truncated_ok=False)
        assert registered(node) == (aof.live_after[-2] if len(aof.starts) > 1 else set())


def _corrupt(data: bytes, start: int, kind: str) -> tuple[bytes, str]:
    """Damage the record at `start`; returns (new data, the reason the loader must give)."""
    buf = bytearray(data)
    if kind == "star":
        buf[start] = ord("?")
        return bytes(buf), "expected '*'"
    if kind == "argc":
        buf[start + 1] = ord("x")
        return bytes(buf), "bad count line"
    if kind == "dollar":
        buf[start + 4] = ord("#")
        return bytes(buf), "expected '$'"
    if kind == "command":
        # LOADJOB -> LOADJOX, DELJOB -> DELJOX: same length, unknown command
        name_end = data.index(b"\r\n", start + 8)
        buf[name_end - 1] = ord("X")
        return bytes(buf), "unknown command"
    if kind == "crlf":
        # the CRLF closing the record's last bulk
        next_start = _record_end(data, start)
        buf[next_start - 2:next_start] = b"XX"
        return bytes(buf), "bulk not terminated by CRLF"
    raise AssertionError(kind)


def _record_end(data: bytes, start: int) -> int:
    return parse_record(data, start, start)[1]


@settings(max_examples=60, deadline=None)
@given(aofs(min_records=3), st.sampled_from(["star", "argc", "dollar", "command", "crlf"]),
       st.booleans(), CHUNKS, st.data())
def test_corrupt_record_in_the_middle_stops_the_load_naming_its_offset(
        aof: Aof, kind: str, truncated_ok: bool, chunk: int, data: st.DataObject) -> None:
    k = data.draw(st.integers(0, len(aof.starts) - 2))  # never the last record
    bad, reason = _corrupt(aof.data, aof.starts[k], kind)
    with tempfile.TemporaryDirectory() as tmp, patch.object(loader_mod, "CHUNK", chunk):
        path = os.path.join(tmp, "disque.aof")
        Path(path).write_bytes(bad)
        with pytest.raises(AofLoadError) as info:
            load(path, truncated_ok=truncated_ok)
        msg = str(info.value)
        assert f"at offset {aof.starts[k]} " in msg and reason in msg, msg
        assert "disque-check-aof" in msg
        assert Path(path).read_bytes() == bad, "a corrupt file is never cut by the loader"
        # the check tool stops at the same place
        records, good, why = check.scan(path)
        assert (records, good) == (k, aof.starts[k])
        assert why is not None and reason in why


def test_bad_loadjob_payload_is_a_load_error_at_its_offset(tmp_path: Path) -> None:
    a = Job(b"D-0123abcd-" + b"G" * 24 + b"-05a1", b"q", b"a", 1, 1, T0 + 10**6, 0, 1, ())
    b = Job(b"D-0123abcd-" + b"H" * 24 + b"-05a1", b"q", b"b", 1, 2, T0 + 10**6, 0, 1, ())
    a.state = b.state = ACTIVE
    rec_a, rec_b = loadjob_record(a), loadjob_record(b)
    broken = bytearray(rec_b)
    state_at = rec_b.index(b.id) + 40
    broken[state_at] = 9
    path = tmp_path / "disque.aof"
    path.write_bytes(rec_a + bytes(broken) + rec_a)
    with pytest.raises(AofLoadError, match=rf"at offset {len(rec_a)} .*bad LOADJOB payload"):
        load(path)
    assert check.scan(str(path))[:2] == (1, len(rec_a))


def test_empty_file_loads_nothing(tmp_path: Path) -> None:
    path = tmp_path / "disque.aof"
    path.write_bytes(b"")
    ld, node = load(path, truncated_ok=False)
    assert len(node.jobs) == 0 and ld.records == 0 and ld.truncated_at is None
    assert check.scan(str(path)) == (0, 0, None)


# -- what a reloaded job looks like (Node.load_job through the loader) ----------------------------

def _job(tag: bytes, *, state: int, retry: int = 30, delay: int = 0, flags: int = 0,
         etime: int = T0 + 3_600_000, ctime: int = (T0 - 5000) * 1_000_000,
         queue: bytes = b"q") -> Job:
    job = Job(b"D-0123abcd-" + tag * 24 + (b"-05a1" if retry else b"-05a0"), queue, b"body",
              1, ctime, etime, delay, retry, (MYID,))
    job.state, job.flags = state, flags
    return job


def test_reloaded_queued_job_is_active_with_requeue_after_delay_plus_retry(tmp_path: Path) -> None:
    job = _job(b"a", state=QUEUED, retry=30, delay=4, flags=F_BCAST_QUEUED)
    path = tmp_path / "disque.aof"
    path.write_bytes(loadjob_record(job))
    _, node = load(path)
    back = node.lookup_job(job.id)
    assert back is not None and back.state == ACTIVE
    assert abs(back.qtime - (T0 + 34_000)) <= REQUEUE_JITTER
    assert not node.lookup_queue(b"q") or len(node.lookup_queue(b"q").jobs) == 0


def test_reloaded_at_most_once_job_that_was_queued_is_never_requeued(tmp_path: Path) -> None:
    job = _job(b"b", state=ACTIVE, retry=0, flags=F_BCAST_QUEUED | F_DELIVERED)
    path = tmp_path / "disque.aof"
    path.write_bytes(loadjob_record(job))
    _, node = load(path)
    back = node.lookup_job(job.id)
    assert back is not None and back.state == ACTIVE and back.qtime == 0


def test_reloaded_at_most_once_job_still_delayed_is_queued_when_its_delay_ends(
        tmp_path: Path) -> None:
    ctime_ms = T0 - 2000
    job = _job(b"c", state=ACTIVE, retry=0, delay=10, ctime=ctime_ms * 1_000_000)
    path = tmp_path / "disque.aof"
    path.write_bytes(loadjob_record(job))
    _, node = load(path)
    back = node.lookup_job(job.id)
    assert back is not None and back.state == ACTIVE and back.qtime == ctime_ms + 10_000


def test_expired_and_waiting_records_are_not_loaded(tmp_path: Path) -> None:
    expired = _job(b"d", state=QUEUED, etime=T0 - 1000)
    waiting = _job(b"f", state=WAIT_REPL)
    path = tmp_path / "disque.aof"
    path.write_bytes(b"".join(loadjob_record(j) for j in (expired, waiting)))
    ld, node = load(path)
    assert len(node.jobs) == 0 and ld.jobs_loaded == 0 and ld.records == 2


def test_an_acked_record_comes_back_acked_without_body_and_awaits_its_gc(tmp_path: Path) -> None:
    # issue 13: the acknowledgement survives a restart, so this node still answers for it
    acked = _job(b"e", state=ACKED)
    path = tmp_path / "disque.aof"
    path.write_bytes(ackjob_record(acked))
    ld, node = load(path)
    back = node.lookup_job(acked.id)
    assert back is not None and back.state == ACKED and back.body == b""
    assert ld.jobs_loaded == 1 and back.awake and back.qtime - T0 <= 1250


class Recorder:
    """The node's persistence door, recording the AOF records it would write."""

    def __init__(self) -> None:
        self.records: list[bytes] = []

    def loadjob(self, job: Job) -> None:
        self.records.append(loadjob_record(job))

    addjob = loadjob
    last_write_error = None

    def ackjob(self, job: Job) -> None:
        self.records.append(ackjob_record(job))

    def deljob(self, job_id: bytes) -> None:
        self.records.append(deljob_record(job_id))


def test_ack_logs_an_acked_record_and_the_end_of_its_gc_a_deljob(tmp_path: Path) -> None:
    node = make_node()
    node.persist = Recorder()
    job = _job(b"g", state=ACTIVE)
    job.delivered = (MYID, b"b" * 40)
    node.register(job)
    node.ack_job(job)
    assert node.persist.records == [ackjob_record(job)]
    assert b"body" not in node.persist.records[0]
    node.unregister(job)
    assert node.persist.records[-1] == deljob_record(job.id)


def test_enqueue_jobs_once_restores_queued_jobs_in_ctime_order(tmp_path: Path) -> None:
    # written out of order, as a rewrite walks the registry by hash
    js = [_job(bytes([65 + i]), state=QUEUED, ctime=(T0 - 10_000 + i) * 1_000_000)
          for i in range(5)]
    inflight = _job(b"z", state=ACTIVE, flags=F_BCAST_QUEUED | F_DELIVERED)
    path = tmp_path / "disque.aof"
    path.write_bytes(b"".join(loadjob_record(j) for j in [js[3], js[0], inflight, js[4], js[1],
                                                            js[2]]))
    _, node = load(path, enqueue=True)
    q = node.lookup_queue(b"q")
    assert q is not None
    assert [j.id for j in node.get_jobs([b"q"], 10)] == [j.id for j in js]
    assert node.lookup_job(inflight.id).state == ACTIVE


def test_deljob_removes_a_queued_job_from_its_queue(tmp_path: Path) -> None:
    job = _job(b"g", state=QUEUED)
    path = tmp_path / "disque.aof"
    path.write_bytes(loadjob_record(job) + deljob_record(job.id))
    ld, node = load(path, enqueue=True)
    assert len(node.jobs) == 0 and ld.jobs_deleted == 1
    q = node.lookup_queue(b"q")
    assert q is None or len(q.jobs) == 0


# -- disque-check-aof ---------------------------------------------------------------------------

def _sample_aof(n: int = 5) -> Aof:
    data = bytearray()
    starts = []
    live: list[set[bytes]] = []
    ids: set[bytes] = set()
    for i in range(n):
        job = _job(bytes([97 + i]), state=QUEUED)
        starts.append(len(data))
        if i == 3:
            data += deljob_record(_job(b"a", state=QUEUED).id)
            ids.discard(_job(b"a", state=QUEUED).id)
        else:
            data += loadjob_record(job)
            ids.add(job.id)
        live.append(set(ids))
    return Aof(bytes(data), starts, live)


def test_check_reports_a_valid_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    aof = _sample_aof()
    path = tmp_path / "a.aof"
    path.write_bytes(aof.data)
    assert check.main([str(path)]) == 0
    assert capsys.readouterr().out == f"AOF is valid: 5 records, {len(aof.data)} bytes\n"


@pytest.mark.parametrize("damage", ["truncated", "corrupt"])
def test_check_fix_yes_truncates_to_the_last_good_record(tmp_path: Path, damage: str,
                                                         capsys: pytest.CaptureFixture[str]
                                                         ) -> None:
    aof = _sample_aof()
    if damage == "truncated":
        data, good, kept = aof.data[:-3], aof.last_start, 4
    else:
        data, _ = _corrupt(aof.data, aof.starts[2], "star")
        good, kept = aof.starts[2], 2
    path = tmp_path / "a.aof"
    path.write_bytes(data)
    assert check.main([str(path)]) == 1
    out = capsys.readouterr().out
    assert "AOF is not valid: " in out and f"at offset {good} (of {len(data)} bytes)" in out
    assert Path(path).read_bytes() == data, "no --fix: nothing changes"

    assert check.main(["--fix", "--yes", str(path)]) == 0
    assert f"Truncated to {good} bytes: {kept} records kept" in capsys.readouterr().out
    assert os.path.getsize(path) == good
    assert check.scan(str(path)) == (kept, good, None)
    _, node = load(path, truncated_ok=False)
    assert registered(node) == aof.live_after[kept - 1]


def test_check_fix_asks_and_a_no_changes_nothing(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    aof = _sample_aof()
    path = tmp_path / "a.aof"
    path.write_bytes(aof.data[:-1])
    with patch("builtins.input", return_value="n") as ask:
        assert check.main(["--fix", str(path)]) == 1
    assert "Truncate" in ask.call_args.args[0]
    assert "Nothing changed" in capsys.readouterr().out
    assert Path(path).read_bytes() == aof.data[:-1]
    with patch("builtins.input", return_value="y"):
        assert check.main(["--fix", str(path)]) == 0
    assert os.path.getsize(path) == aof.last_start


def test_check_of_a_missing_file_fails(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert check.main([str(tmp_path / "nope.aof")]) == 1
    assert "Cannot read" in capsys.readouterr().err


@example(b"*2\r\n$6\r\nDELJOB\r\n$40\r\n")
@given(st.binary(max_size=200))
def test_scan_never_crashes_on_arbitrary_bytes(blob: bytes) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "x.aof")
        Path(path).write_bytes(blob)
        records, good, reason = check.scan(path)
        assert 0 <= good <= len(blob)
        assert (reason is None) == (good == len(blob))
