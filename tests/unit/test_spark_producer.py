"""disque.spark.producer without Spark or sockets: node per partition, DEDUP keys per row,
batching, retry with backoff on transient errors, fallback to the next node only when the
partition's node is unreachable, row/Arrow records to bodies."""

from __future__ import annotations

import json
from datetime import date
from typing import Any

import pytest

from disque.client.base import AddJobsResult
from disque.client.errors import (
    DisqueConnectionError,
    DisqueError,
    MaxLenError,
    NoReplicationError,
    OutOfMemoryError,
)
from disque.spark.producer import (
    PartitionProducer,
    ProducerConfig,
    arrow_records,
    dedup_key,
    json_body,
    node_order,
    normalize_nodes,
    row_records,
    to_body,
)

NODES = ["127.0.0.1:7001", "127.0.0.1:7002", "127.0.0.1:7003"]


class FakeClient:
    """Records every add_jobs call; `script` gives, per call, a function index -> error.
    `addjobs`: what the client knows of its node having ADDJOBS (None: not yet)."""

    def __init__(self, addr: str, log: list[tuple[str, list[Any], list[Any] | None]],
                 script: list[Any], addjobs: bool | None = None) -> None:
        self.addr = addr
        self.log = log
        self.script = script
        self.closed = False
        self.addjobs = addjobs

    def has_addjobs(self) -> bool | None:
        return self.addjobs

    def add_jobs(self, queue: str, bodies: list[Any], timeout_ms: int, **kw: Any
                 ) -> AddJobsResult:
        self.log.append((self.addr, list(bodies), kw.get("dedup_keys")))
        fail = self.script.pop(0) if self.script else (lambda i, addr: None)
        errors = [fail(i, self.addr) for i in range(len(bodies))]
        ids = [None if e else f"D-{i}" for i, e in enumerate(errors)]
        return AddJobsResult(ids, errors)

    def close(self) -> None:
        self.closed = True


def producer(script: list[Any] | None = None, addjobs: bool | None = None, **cfg: Any
             ) -> tuple[PartitionProducer, list[Any], list[float]]:
    log: list[Any] = []
    sleeps: list[float] = []
    script = list(script or [])
    defaults: dict[str, Any] = dict(nodes=NODES, queue="q", batch_size=3, dedup_prefix="w1",
                                    backoff=0.1, backoff_max=0.3, max_attempts=4)
    defaults.update(cfg)
    p = PartitionProducer(ProducerConfig(**defaults), 4,
                          client_factory=lambda addr: FakeClient(addr, log, script, addjobs),
                          sleep=sleeps.append)
    return p, log, sleeps


def records(n: int) -> list[tuple[bytes, None]]:
    return [(b"row%d" % i, None) for i in range(n)]


def test_partition_node_is_chosen_from_the_partition_index():
    assert node_order(NODES, 0) == NODES
    assert node_order(NODES, 4) == [NODES[1], NODES[2], NODES[0]]
    assert node_order(NODES, 5)[0] == NODES[2]


def test_node_lists_are_normalized():
    assert normalize_nodes("disque://a:1,b") == ["a:1", "b:7711"]
    assert normalize_nodes(["[::1]:5"]) == ["[::1]:5"]


def test_rows_are_sent_in_batches_to_the_partition_node_with_row_index_keys():
    p, log, sleeps = producer()
    result = p.run(records(7))
    assert (result.added, result.failed) == (7, 0)
    assert [len(bodies) for _, bodies, _ in log] == [3, 3, 1]
    assert {addr for addr, _, _ in log} == {NODES[1]}  # partition 4 -> node 4 % 3
    keys = [k for _, _, ks in log for k in ks]
    assert keys == [dedup_key("w1", 4, i) for i in range(7)] == [f"w1:4:{i}" for i in range(7)]
    assert sleeps == []


def test_a_retried_partition_sends_the_same_keys_to_the_same_node():
    first, log1, _ = producer()
    first.run(records(5))
    again, log2, _ = producer()
    again.run(records(5))
    assert log1 == log2


def test_user_keys_are_used_as_given():
    p, log, _ = producer()
    p.run([(b"a", "order-17"), (b"b", None)])
    assert log[0][2] == ["order-17", "w1:4:1"]


def test_without_dedup_no_keys_are_sent():
    p, log, _ = producer(dedup=False, dedup_prefix="")
    p.run(records(2))
    assert log[0][2] is None


def test_transient_errors_are_retried_with_backoff_for_the_failed_rows_only():
    norepl = NoReplicationError("Not enough reachable nodes")
    script = [lambda i, a: norepl if i == 1 else None, lambda i, a: None]
    p, log, sleeps = producer(script)
    result = p.run(records(3))
    assert (result.added, result.failed) == (3, 0)
    assert log[1][1] == [b"row1"] and log[1][2] == ["w1:4:1"]
    assert log[1][0] == NODES[1]  # NOREPL: same node
    assert sleeps == [0.1]


def test_backoff_grows_and_rows_fail_after_max_attempts():
    oom = OutOfMemoryError("command not allowed")
    p, log, sleeps = producer([lambda i, a: oom] * 10)
    result = p.run(records(2))
    assert (result.added, result.failed) == (0, 2)
    assert len(log) == 4
    assert sleeps == [0.1, 0.2, 0.3]
    assert "gave up after 4 attempts" in result.errors[-1]


def test_permanent_errors_fail_the_row_without_retry():
    p, log, sleeps = producer([lambda i, a: MaxLenError("full") if i == 0 else None])
    result = p.run(records(3))
    assert (result.added, result.failed) == (2, 1)
    assert len(log) == 1 and sleeps == []
    assert result.errors == ["MaxLenError: MAXLEN full"]


def test_an_unreachable_node_makes_the_partition_fall_back_to_the_next_one():
    down = DisqueConnectionError("cannot connect", unreachable=True)
    p, log, _ = producer([lambda i, a: down, lambda i, a: None])
    result = p.run(records(2))
    assert (result.added, result.failed, result.node_switches) == (2, 0, 1)
    assert [addr for addr, _, _ in log] == [NODES[1], NODES[2]]
    assert log[0][2] == log[1][2]  # same keys on the fallback node


def test_a_lost_reply_is_retried_on_the_same_node():
    lost = DisqueConnectionError("connection lost")  # the node still accepts connections
    p, log, _ = producer([lambda i, a: lost, lambda i, a: None])
    assert p.run(records(1)).added == 1
    assert [addr for addr, _, _ in log] == [NODES[1], NODES[1]]


def test_a_node_with_addjobs_gets_each_batch_over_one_connection():
    p, log, _ = producer(batch_size=40, addjobs=True)  # replicated, synchronous (default)
    assert p.run(records(80)).added == 80
    assert [len(bodies) for _, bodies, _ in log] == [40, 40]
    p, log, _ = producer(batch_size=40, addjobs=True, connections=4)  # as asked
    assert p.run(records(40)).added == 40
    assert sorted(len(bodies) for _, bodies, _ in log) == [10, 10, 10, 10]


def test_synchronous_replicated_batches_to_a_node_without_addjobs_are_split():
    for addjobs in (False, None):  # None: the first batch, before the client knows
        p, log, _ = producer(batch_size=40, addjobs=addjobs)
        assert p.run(records(40)).added == 40
        assert sorted(len(bodies) for _, bodies, _ in log) == [5] * 8


def test_synchronous_replicated_batches_are_split_over_connections():
    p, log, _ = producer(batch_size=40, connections=4)
    assert p.run(records(40)).added == 40
    assert sorted(len(bodies) for _, bodies, _ in log) == [10, 10, 10, 10]
    keys = sorted(k for _, _, ks in log for k in ks)
    assert keys == sorted(f"w1:4:{i}" for i in range(40))
    assert PartitionProducer(ProducerConfig(nodes=NODES, queue="q", dedup_prefix="x"),
                             0).connections == 8  # default replication waits for copies
    for opts in ({"replicate": 1}, {"async_": True}):
        cfg = ProducerConfig(nodes=NODES, queue="q", dedup_prefix="x", **opts)
        assert PartitionProducer(cfg, 0).connections == 1


def test_config_is_checked():
    with pytest.raises(ValueError):
        ProducerConfig(nodes=[], queue="q", dedup_prefix="x")
    with pytest.raises(ValueError):
        ProducerConfig(nodes=NODES, queue="q", dedup=True, dedup_prefix="")
    with pytest.raises(ValueError):
        ProducerConfig(nodes=NODES, queue="q", batch_size=0, dedup_prefix="x")


@pytest.mark.parametrize(("settings", "message"), [
    ({"queue": ""}, "a queue name is needed, not ''"),
    ({"queue": None}, "a queue name is needed, not None"),
    ({"replicate": 0}, "replicate must be an integer from 1 to 65535, not 0"),
    ({"replicate": 65536}, "replicate must be an integer from 1 to 65535, not 65536"),
    ({"replicate": True}, "replicate must be an integer from 1 to 65535, not True"),
    ({"retry": -1}, "retry must be an integer >= 0, not -1"),
    ({"ttl": 0}, "ttl must be an integer >= 1, not 0"),
    ({"delay": -1}, "delay must be an integer >= 0, not -1"),
    ({"ttl": 10, "delay": 10}, "delay (10) must be smaller than ttl (10)"),
    ({"maxlen": 0}, "maxlen must be an integer >= 1, not 0"),
    ({"timeout_ms": -1}, "timeout_ms must be an integer >= 0, not -1"),
    ({"timeout_ms": "5000"}, "timeout_ms must be an integer >= 0, not '5000'"),
    ({"batch_size": 0}, "batch_size must be an integer >= 1, not 0"),
    ({"max_attempts": 0}, "max_attempts must be an integer >= 1, not 0"),
    ({"connections": 0}, "connections must be an integer >= 1, not 0"),
])
def test_config_refuses_what_every_node_would_refuse(settings, message):
    cfg = dict(nodes=NODES, queue="q", dedup_prefix="x")
    cfg.update(settings)
    with pytest.raises(ValueError) as info:
        ProducerConfig(**cfg)
    assert str(info.value).startswith(message), str(info.value)


def test_config_accepts_the_bounds_and_none_for_node_defaults():
    ProducerConfig(nodes=NODES, queue="q", dedup_prefix="x", replicate=65535, retry=0, ttl=1,
                   delay=0, maxlen=1, timeout_ms=0, batch_size=1, max_attempts=1,
                   connections=1)
    ProducerConfig(nodes=NODES, queue=b"q", dedup_prefix="x", replicate=None, retry=None,
                   ttl=None, delay=None, maxlen=None, connections=None)


def test_body_values():
    assert to_body(b"x") == b"x"
    assert to_body("é") == "é"
    assert to_body(bytearray(b"ab")) == b"ab"
    assert to_body(None) == b""
    assert to_body(12) == "12"


def test_row_records_raw_json_and_body_fn():
    rows = [{"body": "a", "k": 1, "d": date(2024, 1, 2)}, {"body": b"b", "k": 2, "d": None}]
    assert list(row_records(rows)) == [("a", None), (b"b", None)]
    assert list(row_records(rows, dedup_key_col="k")) == [("a", "1"), (b"b", "2")]
    bodies = [json.loads(b) for b, _ in row_records(rows[:1], body_format="json")]
    assert bodies == [{"body": "a", "k": 1, "d": "2024-01-02"}]
    assert list(row_records(rows, body_fn=lambda r: r["k"] * 10)) == [("10", None),
                                                                       ("20", None)]
    with pytest.raises(ValueError):
        list(row_records(rows, body_format="xml"))
    with pytest.raises(ValueError):
        list(row_records([{"body": "a", "k": None}], dedup_key_col="k"))


def test_json_body_is_compact_and_keeps_unicode():
    assert json_body({"a": "é", "b": b"\x00"}) == '{"a":"é","b":"\\u0000"}'


def test_arrow_records():
    pa = pytest.importorskip("pyarrow")
    batch = pa.RecordBatch.from_pydict({"body": ["x", None], "k": [7, 8]})
    assert list(arrow_records([batch], dedup_key_col="k")) == [("x", "7"), (b"", "8")]
    assert [json.loads(b) for b, _ in arrow_records([batch], body_format="json")] == [
        {"body": "x", "k": 7}, {"body": None, "k": 8}]


def test_a_node_without_addjobs_nor_dedup_gets_the_rows_without_keys() -> None:
    """antirez's Disque: pipelined ADDJOB ... DEDUP is a syntax error there; the batch is
    sent again without keys, and so is every later one."""
    syntax = DisqueError("syntax error")
    p, log, sleeps = producer([lambda i, addr: syntax], addjobs=False)
    result = p.run(records(5))
    assert (result.added, result.failed) == (5, 0)
    assert [keys for _, _, keys in log] == [["w1:4:0", "w1:4:1", "w1:4:2"], None, None]
    assert sleeps == [] and p.dedup_refused


def test_a_syntax_error_from_a_node_with_addjobs_fails_the_rows() -> None:
    syntax = DisqueError("syntax error")
    p, log, _ = producer([lambda i, addr: syntax], addjobs=True)
    result = p.run(records(3))
    assert (result.added, result.failed) == (0, 3) and not p.dedup_refused
