"""disque.client without sockets: what each command sends, how replies (RESP2 and RESP3, as
redis-py's hiredis parser returns them) become typed values, error mapping, node addresses,
node choice from HELLO, consumer heartbeats and the producer-following statistics."""

from __future__ import annotations

import random

import hiredis
import pytest
from redis._parsers.base import BaseParser

from disque.client import calls, errors, replies
from disque.client.base import AddJobsResult, Attempts, ClientBase, Connecting
from disque.client.batch import AddJobsBatch
from disque.client.consumer import Heartbeats
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
    error_from_redis,
    error_from_reply,
)
from disque.client.nodes import Node, NodeTable, PrefixStats, parse_addr, parse_nodes
from disque.client.replies import Hello, HelloNode, Job

JOB_ID = "D-dcb833cf-8YL1NT17e9+wsA/09NqxscQI-05a1"
JOB_ID2 = "D-e290a32f-9LwjPSZxopSWskT5QsVSuTna-05a1"


def wire(data: bytes) -> object:
    """Parse raw reply bytes the way redis-py's hiredis parser does (errors as values)."""
    reader = hiredis.Reader(replyError=BaseParser.parse_error, notEnoughData=False)
    reader.feed(data)
    return reader.gets()


# ---------------------------------------------------------------------------- calls
def test_addjob_sends_only_the_options_given():
    assert calls.add_job("q", b"body", 0).args == ("ADDJOB", "q", b"body", 0)
    call = calls.add_job("q", "b", 100, replicate=2, delay=1, retry=3, ttl=60, maxlen=9,
                         async_=True, dedup="k1")
    assert call.args == ("ADDJOB", "q", "b", 100, "REPLICATE", 2, "DELAY", 1, "RETRY", 3,
                         "TTL", 60, "MAXLEN", 9, "ASYNC", "DEDUP", "k1")


def test_addjob_is_resent_only_when_allowed_or_deduplicated():
    assert calls.add_job("q", "b").safe is False
    assert calls.add_job("q", "b", dedup="k").safe is True
    assert calls.add_job("q", "b", allow_retry=True).safe is True
    assert calls.add_job("q", "b", dedup="k", allow_retry=False).safe is False


def test_addjob_refuses_bad_dedup_keys_and_negative_timeouts():
    with pytest.raises(ValueError):
        calls.add_job("q", "b", dedup="")
    with pytest.raises(ValueError):
        calls.add_job("q", "b", dedup="x" * 513)
    with pytest.raises(ValueError):
        calls.add_job("q", "b", -1)


def test_addjobs_sends_the_shared_options_then_the_bodies_or_key_body_pairs():
    call = calls.add_jobs_batch("q", [b"a", "b"], 100, replicate=3, retry=5, async_=True)
    assert call.args == ("ADDJOBS", "q", 100, "REPLICATE", 3, "RETRY", 5, "ASYNC", "JOBS",
                         b"a", "b")
    assert (call.safe, call.blocking_ms) == (False, 100)
    call = calls.add_jobs_batch("q", [b"a", b"b"], 0, maxlen=7, dedup_keys=["k1", b"k2"])
    assert call.args == ("ADDJOBS", "q", 0, "MAXLEN", 7, "WITHDEDUP", "JOBS", "k1", b"a",
                         b"k2", b"b")
    assert call.safe is True
    assert calls.add_jobs_batch("q", [b"a"], dedup_keys=["k"], allow_retry=False).safe is False
    with pytest.raises(ValueError):
        calls.add_jobs_batch("q", [])
    with pytest.raises(ValueError):
        calls.add_jobs_batch("q", [b"a", b"b"], dedup_keys=["k"])
    with pytest.raises(ValueError):
        calls.add_jobs_batch("q", [b"a"], dedup_keys=[""])


def test_addjobs_reply_gives_an_id_or_a_typed_error_per_job_in_both_protocols():
    raw = (b"*3\r\n+" + JOB_ID.encode() + b"\r\n-MAXLEN Queue is already longer\r\n+"
           + JOB_ID2.encode() + b"\r\n")
    got = calls.add_jobs_batch("q", [b"a", b"b", b"c"]).parse(wire(raw))
    assert got[0] == JOB_ID and got[2] == JOB_ID2
    assert isinstance(got[1], MaxLenError) and got[1].message == "Queue is already longer"
    assert calls.add_jobs_batch("q", [b"a"]).parse(
        wire(b"*1\r\n-NOREPL Timeout\r\n"))[0].prefix == "NOREPL"  # type: ignore[union-attr]


def test_getjob_options_and_blocking_time():
    call = calls.get_job(["a", "b"], timeout=500, count=3, nohang=True, with_counters=True)
    assert call.args == ("GETJOB", "NOHANG", "TIMEOUT", 500, "COUNT", 3, "WITHCOUNTERS",
                         "FROM", "a", "b")
    assert call.blocking_ms is None  # NOHANG answers at once
    assert calls.get_job(["a"]).blocking_ms == 0  # blocks until a job
    assert calls.get_job(["a"], timeout=250).blocking_ms == 250
    assert calls.get_job(["a"]).safe is True


def test_getjob_needs_a_queue_and_a_positive_count():
    with pytest.raises(ValueError):
        calls.get_job([])
    with pytest.raises(ValueError):
        calls.get_job(["q"], count=0)


def test_id_commands_and_their_retry_safety():
    assert calls.ack_job(JOB_ID, JOB_ID2).args == ("ACKJOB", JOB_ID, JOB_ID2)
    assert calls.fast_ack(JOB_ID).args == ("FASTACK", JOB_ID)
    assert calls.del_job(JOB_ID).args == ("DELJOB", JOB_ID)
    assert calls.enqueue(JOB_ID).args == ("ENQUEUE", JOB_ID)
    assert calls.dequeue(JOB_ID).args == ("DEQUEUE", JOB_ID)
    assert calls.working(JOB_ID).args == ("WORKING", JOB_ID)
    assert calls.nack(JOB_ID).safe is False  # a resent NACK would count twice
    assert all(c.safe for c in (calls.ack_job(), calls.fast_ack(), calls.working(JOB_ID)))


def test_pause_checks_its_options():
    assert calls.pause("q", "in", "bcast").args == ("PAUSE", "q", "in", "bcast")
    with pytest.raises(ValueError):
        calls.pause("q")
    with pytest.raises(ValueError):
        calls.pause("q", "sideways")


def test_scan_arguments():
    assert calls.qscan(0, count=10, busyloop=True, minlen=1, maxlen=5, importrate=2).args == (
        "QSCAN", 0, "COUNT", 10, "BUSYLOOP", "MINLEN", 1, "MAXLEN", 5, "IMPORTRATE", 2)
    assert calls.jscan(7, queue="q", states=["queued", "active"], reply="all").args == (
        "JSCAN", 7, "QUEUE", "q", "STATE", "queued", "STATE", "active", "REPLY", "all")
    with pytest.raises(ValueError):
        calls.jscan(states=["gone"])
    with pytest.raises(ValueError):
        calls.jscan(reply="some")


# ---------------------------------------------------------------------------- replies
@pytest.mark.parametrize("null", [b"*-1\r\n", b"_\r\n"])
def test_getjob_null_reply_is_an_empty_list_in_both_protocols(null):
    assert calls.get_job(["q"]).parse(wire(null)) == []


def test_getjob_reply_becomes_jobs():
    raw = (b"*2\r\n*3\r\n$2\r\nqa\r\n$40\r\n" + JOB_ID.encode() + b"\r\n$2\r\na1\r\n"
           b"*3\r\n$2\r\nqb\r\n$40\r\n" + JOB_ID2.encode() + b"\r\n$0\r\n\r\n")
    jobs = calls.get_job(["qa", "qb"]).parse(wire(raw))
    assert jobs == [Job("qa", JOB_ID, b"a1"), Job("qb", JOB_ID2, b"")]
    assert jobs[0].node_prefix == "dcb833cf"
    assert jobs[0].nacks is None and jobs[0].additional_deliveries is None


def test_getjob_withcounters_reply_fills_the_counters():
    raw = (b"*1\r\n*7\r\n$1\r\nq\r\n$40\r\n" + JOB_ID.encode() + b"\r\n$5\r\nhello\r\n"
           b"$5\r\nnacks\r\n:2\r\n$21\r\nadditional-deliveries\r\n:5\r\n")
    [job] = calls.get_job(["q"], with_counters=True).parse(wire(raw))
    assert (job.body, job.nacks, job.additional_deliveries) == (b"hello", 2, 5)


def test_addjob_status_reply_is_the_id():
    assert calls.add_job("q", "b").parse(wire(b"+" + JOB_ID.encode() + b"\r\n")) == JOB_ID


def test_show_reply_becomes_a_dict_with_body_bytes():
    raw = (b"*8\r\n$2\r\nid\r\n$40\r\n" + JOB_ID.encode() + b"\r\n$5\r\nstate\r\n$6\r\nqueued"
           b"\r\n$19\r\nnext-requeue-within\r\n$-1\r\n$4\r\nbody\r\n$3\r\n\xff\x00x\r\n")
    show = calls.show(JOB_ID).parse(wire(raw))
    assert show == {"id": JOB_ID, "state": "queued", "next-requeue-within": None,
                    "body": b"\xff\x00x"}
    assert calls.show(JOB_ID).parse(wire(b"$-1\r\n")) is None
    assert calls.show(JOB_ID).parse(wire(b"_\r\n")) is None


def test_qstat_reply_and_unknown_queue():
    raw = (b"*6\r\n$4\r\nname\r\n$1\r\nq\r\n$3\r\nlen\r\n:3\r\n$11\r\nimport-from\r\n"
           b"*1\r\n$3\r\nabc\r\n")
    assert calls.qstat("q").parse(wire(raw)) == {"name": "q", "len": 3, "import-from": ["abc"]}
    assert calls.qstat("q").parse(wire(b"*-1\r\n")) is None


def test_hello_reply_lists_nodes_with_integer_port_and_priority():
    raw = (b"*4\r\n:1\r\n$3\r\nid1\r\n*4\r\n$3\r\nid1\r\n$9\r\n127.0.0.1\r\n$4\r\n7711\r\n"
           b"$1\r\n1\r\n*4\r\n$3\r\nid2\r\n$0\r\n\r\n$4\r\n7712\r\n$3\r\n100\r\n")
    hello = calls.hello().parse(wire(raw))
    assert hello == Hello(1, "id1", [HelloNode("id1", "127.0.0.1", 7711, 1),
                                     HelloNode("id2", "", 7712, 100)])


@pytest.mark.parametrize("reply", [
    [1, b"id1", [b"id1", b"", b"7711", b"1"]],  # the original over RESP2 (an empty IP)
    [1, "id1", ["id1", "", 7711, 1]],           # decode_responses, integers for the numbers
], ids=["resp2-bulk", "decoded-ints"])
def test_hello_node_list_reads_the_same_in_either_protocol_or_decoding(reply: list) -> None:
    assert replies.parse_hello(reply) == Hello(1, "id1", [HelloNode("id1", "", 7711, 1)])


def test_hello_3_map_is_not_taken_for_disque_hello():
    with pytest.raises(ValueError):
        replies.parse_hello({b"server": b"disque"})


def test_scan_replies():
    raw = b"*2\r\n$2\r\n17\r\n*2\r\n$1\r\na\r\n$1\r\nb\r\n"
    assert calls.qscan().parse(wire(raw)) == (17, ["a", "b"])
    raw = b"*2\r\n$1\r\n0\r\n*1\r\n+" + JOB_ID.encode() + b"\r\n"
    assert calls.jscan().parse(wire(raw)) == (0, [JOB_ID])
    raw = b"*2\r\n$1\r\n0\r\n*1\r\n*4\r\n$2\r\nid\r\n$1\r\nx\r\n$4\r\nbody\r\n$1\r\nb\r\n"
    assert calls.jscan(reply="all").parse(wire(raw)) == (0, [{"id": "x", "body": b"b"}])


def test_info_reply_becomes_a_flat_dict_with_numbers():
    text = b"# Server\r\ndisque_version:0.1.0\r\ntcp_port:7711\r\n\r\n# Memory\r\nratio:1.5\r\n"
    raw = b"$%d\r\n%s\r\n" % (len(text), text)
    assert calls.info().parse(wire(raw)) == {"disque_version": "0.1.0", "tcp_port": 7711,
                                             "ratio": 1.5}
    assert calls.info("memory").args == ("INFO", "memory")


def test_job_id_helpers():
    assert replies.is_job_id(JOB_ID)
    assert not replies.is_job_id("D-short")
    assert replies.node_prefix(JOB_ID) == "dcb833cf"


# ---------------------------------------------------------------------------- errors
@pytest.mark.parametrize(("line", "cls"), [
    ("NOREPL Not enough reachable nodes for the requested replication level",
     NoReplicationError),
    ("PAUSED Queue paused in input, try later", PausedError),
    ("LEAVING This node is leaving the cluster, please connect to a different one",
     LeavingError),
    ("MAXLEN Queue is already longer than the specified MAXLEN count", MaxLenError),
    ("NOJOB Job not known in the context of this node.", NoJobError),
    ("BADID Invalid Job ID format.", BadIdError),
    ("TOOLATE Half of job TTL already elapsed, you are no longer allowed to postpone the "
     "next delivery.", TooLateError),
    ("OOM command not allowed when used memory > 'maxmemory'.", OutOfMemoryError),
    ("ERR syntax error", DisqueError),
])
def test_error_replies_map_to_typed_exceptions(line, cls):
    # what redis-py's parser makes of the line (it cuts the prefix of ERR and OOM)
    exc = wire(b"-" + line.encode() + b"\r\n")
    mapped = error_from_redis(exc)
    assert type(mapped) is cls
    assert isinstance(mapped, DisqueError)
    prefix, _, message = line.partition(" ")
    assert (mapped.prefix, mapped.message) == (prefix, message)
    assert str(mapped) == line
    assert type(error_from_reply(line)) is cls


@pytest.mark.parametrize("line", [
    "NOAUTH Authentication required.",
    "WRONGPASS invalid username-password pair or user is disabled.",
    "ERR invalid password",  # AUTH's answer (the original's, and RESP2 clients')
])
def test_authentication_failures_are_auth_errors_whatever_their_prefix(line):
    exc = wire(b"-" + line.encode() + b"\r\n")
    mapped = error_from_redis(exc)
    assert type(mapped) is AuthError and str(mapped) == line
    assert mapped.prefix == line.split(" ")[0]


def test_unknown_error_prefix_keeps_its_prefix():
    mapped = error_from_reply("WEIRD something odd")
    assert type(mapped) is DisqueError and mapped.prefix == "WEIRD"


def test_redis_exception_without_status_code_is_mapped_by_class():
    from redis.exceptions import OutOfMemoryError as RedisOOM
    exc = RedisOOM("command not allowed when used memory > 'maxmemory'.")
    exc.status_code = None
    assert type(error_from_redis(exc)) is OutOfMemoryError


@pytest.mark.parametrize("status_code", [None, "NOREPL"])
def test_an_uncut_prefix_is_not_doubled_whatever_status_code_says(status_code):
    # redis-py < 8 leaves status_code unset for a code it does not know, 8.x sets it; either
    # way the text still starts with the code (it cuts off only the codes it knows)
    from redis.exceptions import ResponseError
    exc = ResponseError("NOREPL Not enough reachable nodes", status_code=status_code)
    mapped = error_from_redis(exc)
    assert type(mapped) is NoReplicationError
    assert str(mapped) == "NOREPL Not enough reachable nodes"


def test_connection_error_is_a_disque_error_and_a_builtin_connection_error():
    exc = DisqueConnectionError("gone", unreachable=True)
    assert isinstance(exc, DisqueError) and isinstance(exc, ConnectionError)
    assert exc.unreachable


def test_every_typed_error_is_registered_by_prefix():
    for prefix in ("NOREPL", "PAUSED", "LEAVING", "MAXLEN", "NOJOB", "BADID", "TOOLATE", "OOM"):
        assert errors.ERRORS_BY_PREFIX[prefix].prefix == prefix


# ---------------------------------------------------------------------------- addresses
@pytest.mark.parametrize(("spec", "expected"), [
    ("disque://127.0.0.1:7711,127.0.0.1:7712",
     [("127.0.0.1", 7711), ("127.0.0.1", 7712)]),
    ("h1:7000, h2", [("h1", 7000), ("h2", 7711)]),
    (["h1:1", "h2:2,h3:3"], [("h1", 1), ("h2", 2), ("h3", 3)]),
    ("disque://:secret@h1:7711", [("h1", 7711)]),
    ("[::1]:7712,[::1]", [("::1", 7712), ("::1", 7711)]),
    ("h1:1,h1:1", [("h1", 1)]),
])
def test_node_lists_in_every_accepted_form(spec, expected):
    assert parse_nodes(spec) == expected


@pytest.mark.parametrize("bad", ["", "http://h:1", "h:notaport", "h:0", "h:70000", "[::1"])
def test_bad_node_lists_are_refused(bad):
    with pytest.raises(ValueError):
        parse_nodes(bad)


def test_url_password_is_used():
    c = ClientBase("disque://:s3cret@127.0.0.1:7711")
    assert c.connection_kwargs["password"] == "s3cret"
    assert "protocol" not in c.connection_kwargs  # redis-py's default unless asked
    assert ClientBase("h:1", protocol=2).connection_kwargs["protocol"] == 2


def test_parse_addr_and_node_addr_roundtrip():
    assert parse_addr("[::1]:7711") == ("::1", 7711)
    assert Node("::1", 7711).addr == "[::1]:7711"
    assert Node("h", 1, id="abcdef0123456789").prefix == "abcdef01"


# ---------------------------------------------------------------------------- node choice
class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def hello(node_id: str, *entries: tuple[str, str, int, int]) -> Hello:
    return Hello(1, node_id, [HelloNode(*e) for e in entries])


def table(n: int = 3, seed: int = 1) -> tuple[NodeTable, Clock]:
    clock = Clock()
    t = NodeTable([("127.0.0.1", 7000 + i) for i in range(n)], cooldown=5.0,
                  rng=random.Random(seed), clock=clock)
    return t, clock


def test_candidates_are_a_random_order_of_all_seeds():
    orders = set()
    for seed in range(30):
        t, _ = table(seed=seed)
        orders.add(tuple(n.port for n in t.candidates()))
    assert len(orders) > 1  # random, so clients spread over the nodes
    assert all(sorted(o) == [7000, 7001, 7002] for o in orders)


def test_lower_priority_is_preferred_and_failed_nodes_come_last():
    t, clock = table()
    via = t.get("127.0.0.1:7000")
    assert via is not None
    t.update_from_hello(hello("a", ("a", "127.0.0.1", 7000, 1), ("b", "127.0.0.1", 7001, 100),
                              ("c", "127.0.0.1", 7002, 10)), via)
    for seed in range(10):
        t.rng = random.Random(seed)
        assert [n.port for n in t.candidates()] == [7000, 7002, 7001]
    t.mark_failed("127.0.0.1:7000")
    assert [n.port for n in t.candidates()] == [7002, 7001, 7000]
    clock.now += 6  # the cooldown is over
    assert t.candidates()[0].port == 7000


def test_hello_adds_new_nodes_and_drops_forgotten_non_seeds():
    t, _ = table(n=1)
    via = t.get("127.0.0.1:7000")
    assert via is not None
    t.update_from_hello(hello("a", ("a", "127.0.0.1", 7000, 1), ("b", "10.0.0.2", 7001, 1),
                              ("c", "", 7002, 5)), via)
    assert via.id == "a"
    assert sorted(t.nodes) == ["10.0.0.2:7001", "127.0.0.1:7000", "127.0.0.1:7002"]
    # an empty IP: reached on the host used for the node that answered
    assert t.get("127.0.0.1:7002").priority == 5  # type: ignore[union-attr]
    assert t.by_prefix("b") is t.get("10.0.0.2:7001")
    t.update_from_hello(hello("a", ("a", "127.0.0.1", 7000, 1)), via)
    assert list(t.nodes) == ["127.0.0.1:7000"]  # the seed stays, the others are gone


def test_hello_matches_a_seed_known_under_another_name_by_id():
    t = NodeTable([("localhost", 7000), ("127.0.0.1", 7001)])
    a, b = t.get("localhost:7000"), t.get("127.0.0.1:7001")
    assert a is not None and b is not None
    b.id = "bbbb"
    t.update_from_hello(hello("aaaa", ("aaaa", "127.0.0.1", 7000, 1),
                              ("bbbb", "127.0.0.1", 7001, 100)), a)
    assert b.priority == 100
    assert a.id == "aaaa"
    assert len(t) == 2  # the answering node's own entry is not added under its other name


def test_pinned_table_does_not_learn_nodes():
    t, _ = table(n=1)
    via = t.get("127.0.0.1:7000")
    assert via is not None
    t.update_from_hello(hello("a", ("a", "127.0.0.1", 7000, 100), ("b", "127.0.0.1", 7001, 1)),
                        via, add_nodes=False)
    assert list(t.nodes) == ["127.0.0.1:7000"] and via.priority == 100


def test_a_leaving_node_is_kept_only_when_nothing_better_answers():
    c = ClientBase(["127.0.0.1:7000", "127.0.0.1:7001"])
    via = c.table.get("127.0.0.1:7000")
    assert via is not None
    h = hello("a", ("a", "127.0.0.1", 7000, 100), ("b", "127.0.0.1", 7001, 1))
    assert c.pick_after_hello(via, h) is False
    c.table.mark_failed("127.0.0.1:7001")
    assert c.pick_after_hello(via, h) is True


def test_read_timeout_covers_the_blocking_time():
    c = ClientBase("h:1", socket_timeout=10)
    assert c.read_timeout(None) == 10
    assert c.read_timeout(0) is None
    assert c.read_timeout(2500) == 12.5


def test_add_jobs_result_counts():
    r = AddJobsResult([JOB_ID, None, JOB_ID2], [None, MaxLenError("full"), None])
    assert (r.added, r.failed, r.ok) == (2, 1, False)


# ---------------------------------------------------------------------------- add_jobs batches
A = Node("127.0.0.1", 7001)
B = Node("127.0.0.1", 7002)
UNKNOWN = DisqueError("unknown command 'ADDJOBS'", "ERR")


def batch(n: int = 3, **kw: object) -> AddJobsBatch:
    return AddJobsBatch("q", [b"b%d" % i for i in range(n)], 100, **kw)  # type: ignore[arg-type]


def test_add_jobs_sends_one_addjobs_per_chunk_and_fills_ids_and_errors_in_order():
    support: dict[str, bool] = {}
    b = batch(5, replicate=2, dedup_keys=[f"k{i}" for i in range(5)], batch_size=3,
              support=support)
    assert b.chunks() == [[0, 1, 2], [3, 4]] and b.safe and b.blocking_ms == 100
    [cmd] = b.round_trip([0, 1, 2], A)
    assert cmd.batch and cmd.args == ["ADDJOBS", "q", 100, "REPLICATE", 2, "WITHDEDUP",
                                      "JOBS", "k0", b"b0", "k1", b"b1", "k2", b"b2"]
    b.take(cmd, wire(b"*3\r\n+" + JOB_ID.encode() + b"\r\n-NOREPL Timeout\r\n+"
                     + JOB_ID2.encode() + b"\r\n"), A)
    assert b.pending([0, 1, 2]) == [] and support == {A.addr: True}
    assert b.ids[:3] == [JOB_ID, None, JOB_ID2]
    assert [type(e) for e in b.errors[:3]] == [type(None), NoReplicationError, type(None)]


def test_add_jobs_falls_back_to_pipelined_addjob_where_addjobs_is_unknown_once_per_node():
    support: dict[str, bool] = {}
    b = batch(2, dedup_keys=["k0", "k1"], support=support)
    [cmd] = b.round_trip([0, 1], A)
    b.take(cmd, UNKNOWN, A)
    assert support == {A.addr: False}
    assert b.pending([0, 1]) == [0, 1] and b.errors == [None, None]  # to be sent again
    sent = b.round_trip([0, 1], A)
    assert [c.args for c in sent] == [["ADDJOB", "q", b"b0", 100, "DEDUP", "k0"],
                                      ["ADDJOB", "q", b"b1", 100, "DEDUP", "k1"]]
    assert not any(c.batch for c in sent)
    b.take(sent[0], JOB_ID.encode(), A)  # the connection broke before the second reply
    assert b.pending([0, 1]) == [1]
    b.take(b.round_trip([1], A)[0], JOB_ID2.encode(), A)
    assert b.result().ids == [JOB_ID, JOB_ID2] and b.result().ok
    # a later call on the same client goes straight to ADDJOB there, still ADDJOBS elsewhere
    later = batch(1, support=support)
    assert [c.batch for c in later.round_trip([0], A)] == [False]
    assert [c.batch for c in later.round_trip([0], B)] == [True]


def test_add_jobs_error_of_the_whole_addjobs_is_every_jobs_error():
    b = batch(3)
    [cmd] = b.round_trip([0, 1, 2], A)
    oom = OutOfMemoryError("command not allowed when used memory > 'maxmemory'")
    b.take(cmd, oom, A)
    assert b.errors == [oom] * 3 and b.result().failed == 3 and b.pending([0, 1, 2]) == []


def test_add_jobs_is_resent_only_with_dedup_keys_or_when_allowed():
    assert batch().safe is False
    assert batch(allow_retry=True).safe is True
    assert batch(dedup_keys=["a", "b", "c"]).safe is True
    assert batch(dedup_keys=["a", "b", "c"], allow_retry=False).safe is False
    lost = DisqueConnectionError("connection lost")
    b = batch(2)
    b.fail(b.pending([0, 1]), lost)
    assert b.result().errors == [lost, lost]
    with pytest.raises(ValueError):
        batch(2, dedup_keys=["a"])
    with pytest.raises(ValueError):
        batch(2, dedup_keys=["a", "x" * 513])  # refused before anything is sent


def test_client_knows_which_nodes_have_addjobs():
    c = ClientBase("127.0.0.1:7001")
    assert c.has_addjobs() is None  # not connected
    c.node = c.table.get("127.0.0.1:7001")
    assert c.has_addjobs() is None
    c.addjobs_support["127.0.0.1:7001"] = False
    assert c.has_addjobs() is False and c.has_addjobs("127.0.0.1:7002") is None


# ---------------------------------------------------------------------------- consumer
def test_producer_prefix_dominating_is_preferred():
    stats = PrefixStats(window=1000)
    for _ in range(40):
        stats.observe(JOB_ID)
    assert stats.preferred(min_jobs=50) is None  # not enough seen yet
    for _ in range(30):
        stats.observe(JOB_ID2)
    assert stats.preferred(min_jobs=50) == "dcb833cf"
    for _ in range(10):
        stats.observe(JOB_ID2)
    assert stats.preferred(min_jobs=50) is None  # 40 vs 40: nobody has more than half


def test_prefix_counts_decay():
    stats = PrefixStats(window=10)
    for _ in range(10):
        stats.observe(JOB_ID)
    assert stats.counts["dcb833cf"] == 5


def test_heartbeat_first_asks_show_then_working_before_the_requeue():
    hb = Heartbeats(first_check=0.2, fraction=0.8)
    hb.add(JOB_ID, "node", now=10.0)
    assert hb.due(10.1) == []
    [entry] = hb.due(10.2)
    assert not entry.checked
    assert hb.on_show(entry, {"retry": 10, "next-requeue-within": 5000}, now=10.2)
    assert entry.due == pytest.approx(10.2 + 0.8 * 5.0)
    assert hb.on_working(entry, 10, now=14.2)
    assert entry.due == pytest.approx(14.2 + 8.0)
    assert hb.next_due() == entry.due


def test_heartbeat_stops_for_retry_zero_unknown_or_too_late_jobs():
    hb = Heartbeats()
    hb.add("a", None, 0.0)
    hb.add("b", None, 0.0)
    hb.add("c", None, 0.0)
    a, b, c = hb.jobs["a"], hb.jobs["b"], hb.jobs["c"]
    assert not hb.on_show(a, {"retry": 0, "next-requeue-within": None}, 1.0)
    assert not hb.on_show(b, None, 1.0)
    assert not hb.on_working(c, None, 1.0)  # NOJOB / TOOLATE
    assert hb.jobs == {}


def test_heartbeat_forgets_finished_jobs():
    hb = Heartbeats()
    hb.add("a", None, 0.0)
    hb.remove("a")
    hb.remove("a")
    assert hb.next_due() is None


# ---------------------------------------------------------------------------- failover policy
class PolicyClient(ClientBase):
    """ClientBase plus the one hook Attempts needs, recording the nodes marked failed."""

    def __init__(self, nodes: str, retries: int = 2) -> None:
        super().__init__(nodes, retries=retries, rng=random.Random(1))
        self.failed: list[str] = []

    def node_failed(self, node: Node) -> None:
        self.failed.append(node.addr)


def test_attempts_connect_failures_go_elsewhere_until_every_node_and_the_retries_are_used():
    c = PolicyClient("127.0.0.1:1,127.0.0.1:2,127.0.0.1:3", retries=2)
    a = Attempts(c, safe=False, pinned=None)
    node = c.table.nodes[next(iter(c.table.nodes))]
    for _ in range(5):  # 3 nodes + 2 retries
        assert a.connect_failed(node, OSError("refused")) is None
        assert a.required() is None  # the client picks the next node
    failure = a.connect_failed(node, OSError("refused"))
    assert isinstance(failure, DisqueConnectionError) and failure.unreachable
    assert len(c.failed) == 6


def test_attempts_pinned_call_ends_at_the_first_failure():
    c = PolicyClient("127.0.0.1:1,127.0.0.1:2")
    node = c.table.nodes[next(iter(c.table.nodes))]
    a = Attempts(c, safe=True, pinned=node)
    assert a.required() is node
    assert a.connect_failed(node, OSError("refused")) is not None
    assert a.leaving(node) is False


def test_attempts_leaving_moves_only_safe_commands():
    c = PolicyClient("127.0.0.1:1,127.0.0.1:2", retries=2)
    node = c.table.nodes[next(iter(c.table.nodes))]
    assert Attempts(c, safe=False, pinned=None).leaving(node) is False
    a = Attempts(c, safe=True, pinned=None)
    assert [a.leaving(node) for _ in range(3)] == [True, True, False]
    assert c.failed == [node.addr] * 4


def test_attempts_lost_reply_resends_a_safe_command_to_the_same_node_first():
    c = PolicyClient("127.0.0.1:1,127.0.0.1:2", retries=1)
    node = c.table.nodes[next(iter(c.table.nodes))]
    a = Attempts(c, safe=True, pinned=None)
    assert a.lost(node, OSError("reset")) is None
    assert a.required() is node and a.required() is None
    assert c.failed == []  # the node may be fine: only the connection broke
    failure = a.lost(node, OSError("reset"))
    assert isinstance(failure, DisqueConnectionError) and not failure.unreachable
    assert c.failed == [node.addr]
    unsafe = Attempts(c, safe=False, pinned=None)
    assert unsafe.lost(node, OSError("reset")) is not None  # maybe ran: never resent


# ---------------------------------------------------------------------------- dead letters
def test_addjob_and_addjobs_send_the_dead_letter_policy_when_given():
    call = calls.add_job("q", "b", 0, max_deliveries=5, max_nacks=3, deadletter="dead",
                         deadttl=600, backoff=120)
    assert call.args == ("ADDJOB", "q", "b", 0, "MAXDELIVERIES", 5, "MAXNACKS", 3,
                         "DEADLETTER", "dead", "DEADTTL", 600, "BACKOFF", 120)
    assert calls.add_job("q", "b", 0, max_nacks=0).args[-2:] == ("MAXNACKS", 0)
    call = calls.add_jobs_batch("q", ["a", "b"], 0, max_nacks=2, deadletter=b"dead")
    assert call.args == ("ADDJOBS", "q", 0, "MAXNACKS", 2, "DEADLETTER", b"dead", "JOBS",
                         "a", "b")


@pytest.mark.parametrize("kw", [dict(max_deliveries=-1), dict(max_nacks=65536),
                                dict(deadletter=""), dict(deadttl=-5), dict(backoff=-1)])
def test_a_dead_letter_policy_every_node_refuses_is_refused_before_sending(kw):
    with pytest.raises(ValueError):
        calls.add_job("q", "b", **kw)
    with pytest.raises(ValueError):
        batch(2, **kw)


def test_add_jobs_batches_and_their_addjob_fallback_carry_the_policy():
    support: dict[str, bool] = {}
    b = batch(2, max_nacks=3, deadletter="dead", deadttl=60, backoff=9, support=support)
    [cmd] = b.round_trip([0, 1], A)
    opts = ["MAXNACKS", 3, "DEADLETTER", "dead", "DEADTTL", 60, "BACKOFF", 9]
    assert cmd.args == ["ADDJOBS", "q", 100, *opts, "JOBS", b"b0", b"b1"]
    b.take(cmd, UNKNOWN, A)
    assert [c.args for c in b.round_trip([0, 1], A)] == [
        ["ADDJOB", "q", b"b0", 100, *opts], ["ADDJOB", "q", b"b1", 100, *opts]]


def test_redrive_arguments_reply_and_it_is_never_resent_elsewhere():
    assert calls.redrive("dead").args == ("REDRIVE", "dead")
    call = calls.redrive("dead", count=10, rate=5, reset=True, ids=[JOB_ID, JOB_ID2])
    assert call.args == ("REDRIVE", "dead", "COUNT", 10, "RATE", 5, "RESET", "ID", JOB_ID,
                         JOB_ID2)
    assert call.safe is False and call.parse(wire(b":2\r\n")) == 2
    for kw in (dict(count=0), dict(rate=0), dict(ids=[])):
        with pytest.raises(ValueError):
            calls.redrive("dead", **kw)


def resp_array(items: list) -> bytes:
    """RESP2 bytes of a flat array of bulk strings, integers and nils."""
    def one(v: object) -> bytes:
        if v is None:
            return b"$-1\r\n"
        if isinstance(v, int):
            return b":%d\r\n" % v
        return b"$%d\r\n%b\r\n" % (len(v), v)  # type: ignore[arg-type]
    return b"*%d\r\n" % len(items) + b"".join(one(v) for v in items)


@pytest.mark.parametrize("reason", [b"max-nacks", None])
def test_show_of_a_job_with_a_policy_has_its_dead_letter_fields(reason):
    raw = resp_array([b"id", JOB_ID.encode(), b"queue", b"dead", b"body", b"x",
                      b"max-deliveries", 0, b"max-nacks", 3, b"deadletter-queue", b"dead",
                      b"source-queue", b"q", b"deadletter-reason", reason,
                      b"deadletter-time", 1795362283205 if reason else None,
                      b"redrives", 0])
    show = calls.show(JOB_ID).parse(wire(raw))
    assert show["source-queue"] == "q" and show["deadletter-queue"] == "dead"
    assert show["deadletter-reason"] == (reason.decode() if reason else None)
    assert (show["max-nacks"], show["redrives"]) == (3, 0)
    assert show["deadletter-time"] == (1795362283205 if reason else None)


# ---------------------------------------------------------------------------- RESP2 fallback
@pytest.mark.parametrize("text", [
    "wrong number of arguments for 'hello' command",  # antirez's Disque
    "unknown command 'HELLO', with args beginning with: '3'",
    "NOPROTO unsupported protocol version",
])
def test_a_node_refusing_hello_3_is_spoken_to_over_resp2_from_then_on(text: str) -> None:
    from redis.exceptions import ResponseError

    c = ClientBase("127.0.0.1:7711,127.0.0.1:7712")
    a, b = c.nodes
    assert "protocol" not in c.pool_options(a)
    assert c.resp3_refused(a, ResponseError(text))
    assert c.pool_options(a)["protocol"] == 2 and "protocol" not in c.pool_options(b)
    # a concurrent connection of the refused pool: retried too (from the RESP2 pool)
    assert c.resp3_refused(a, ResponseError(text)) and c.resp2_nodes == {a.addr}


def test_resp2_fallback_never_overrides_an_explicit_protocol_or_other_errors() -> None:
    from redis.exceptions import AuthenticationError, ResponseError

    c = ClientBase("127.0.0.1:7711", protocol=3)
    assert not c.resp3_refused(c.nodes[0], ResponseError("wrong number of arguments for "
                                                         "'hello' command"))
    c = ClientBase("127.0.0.1:7711")
    assert not c.resp3_refused(c.nodes[0], AuthenticationError("invalid password"))
    assert not c.resp3_refused(c.nodes[0], ResponseError("wrong number of arguments for "
                                                         "'addjob' command"))
    assert c.resp2_nodes == set()


def hello_from(node: Node, priority: int = 1) -> Hello:
    node_id = f"{node.port:040x}"
    return Hello(1, node_id, [HelloNode(node_id, node.host, node.port, priority)])


def test_connecting_takes_the_first_node_answering_and_cools_down_the_silent_ones() -> None:
    c = ClientBase("127.0.0.1:1,127.0.0.1:2", rng=random.Random(3))
    search = Connecting(c)
    first, second = search.candidates
    assert search.refused(first, OSError("refused")) is None
    assert c.table.is_cooling(first.addr)
    assert search.answered(second, hello_from(second))
    assert c.node is second and not c.table.is_cooling(second.addr)


def test_connecting_ends_on_a_refused_password_and_reports_every_failure() -> None:
    c = ClientBase("127.0.0.1:1,127.0.0.1:2")
    search = Connecting(c)
    first, second = search.candidates
    refused = AuthError("invalid password")
    assert search.refused(first, refused) is refused
    search = Connecting(c)
    for node in search.candidates:
        assert search.refused(node, OSError("down")) is None
    with pytest.raises(DisqueConnectionError, match="no reachable node") as info:
        search.give_up()
    assert info.value.unreachable and "127.0.0.1:1: down" in str(info.value)


def test_connecting_uses_a_leaving_node_only_when_no_other_answers() -> None:
    c = ClientBase("127.0.0.1:1,127.0.0.1:2", rng=random.Random(3))
    search = Connecting(c)
    first, second = search.candidates
    assert not search.answered(first, hello_from(first, priority=100))  # leaving
    assert search.refused(second, OSError("down")) is None
    assert search.give_up() is first and c.node is first


def test_a_failed_or_leaving_refresh_leaves_the_node() -> None:
    c = ClientBase("127.0.0.1:1,127.0.0.1:2")
    a, b = c.nodes
    c.node = a
    assert c.refreshed(a, hello_from(a))
    assert c.node is a
    assert not c.refreshed(a, None)
    assert c.node is None and c.table.is_cooling(a.addr)
    c.node = b
    c.node_failed(a)  # another node's failure does not move the client
    assert c.node is b
