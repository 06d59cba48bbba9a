"""The third-party `pydisque` client from PyPI (which builds a default redis-py 8 connection,
i.e. HELLO 3) adds, gets and acks jobs (issue 3)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pydisque.client import Client

from tests.harness import DisqueProcess
from tests.integration.resp import JOB_ID_RE


@pytest.fixture
def client(node: DisqueProcess) -> Iterator[Client]:
    c = Client([f"127.0.0.1:{node.port}"])
    c.connect()
    try:
        yield c
    finally:
        c.get_connection().close()


def test_pydisque_connects_through_hello(client: Client, node: DisqueProcess) -> None:
    assert client.connected_node is not None
    hello = client.hello()
    assert hello[0] == 1
    assert client.connected_node.node_id == hello[1]


def test_pydisque_add_get_ack(client: Client, q: str) -> None:
    job_id = client.add_job(q, "hello pydisque", timeout=1000)
    assert JOB_ID_RE.match(job_id.decode())
    assert client.qlen(q) == 1
    jobs = client.get_job([q], timeout=1000)
    # pydisque names the tuple (job_id, queue_name, job) but hands back the reply order
    assert jobs == [(q.encode(), job_id, b"hello pydisque")]
    client.ack_job(job_id)
    assert client.show(job_id) is None
    assert client.qlen(q) == 0


def test_pydisque_options_and_counters(client: Client, q: str) -> None:
    job_id = client.add_job(q, "b", retry=0, ttl=120, maxlen=10)
    assert job_id.decode().endswith("-0002")
    show = client.show(job_id, return_dict=True)
    assert show[b"retry"] == 0 and show[b"state"] == b"queued"
    jobs = client.get_job([q], count=5, withcounters=True)
    assert jobs == [(q.encode(), job_id, b"b", 0, 0)]
    assert client.get_job([q], nohang=True) == []
    client.fast_ack(job_id)
    assert client.show(job_id) is None


def test_pydisque_nack_qstat_qpeek(client: Client, q: str) -> None:
    job_id = client.add_job(q, "b")
    assert client.qpeek(q, 1) == [[q.encode(), job_id, b"b"]]
    client.get_job([q])
    client.nack_job(job_id)
    stat = client.qstat(q, return_dict=True)
    assert stat[b"len"] == 1 and stat[b"jobs-in"] == 2 and stat[b"jobs-out"] == 1
    client.del_job(job_id)
    assert client.qlen(q) == 0
