"""disque.client against real 3-node clusters: the node list comes from HELLO, -LEAVING and
a killed node move the client to another node, commands are resent only where that is safe,
and the consumer moves next to the producers (the spec's "Client libraries" protocol).

The tests that leave the cluster as they found it share one (`shared_cluster`) and use queue
names of their own (`q`); the others (a node leaving, killed or stalled) start their own."""

from __future__ import annotations

import contextlib
import signal

import pytest

from disque.client import Client, DisqueConnectionError
from tests.cluster.conftest import cmd, myid, ok
from tests.harness import DisqueProcess, wait_for
from tests.integration.resp import ConnectionClosed
from tests.threads import Background
from tests.waits import request_waiting, wait_unresponsive


def addr(p: DisqueProcess) -> str:
    return f"127.0.0.1:{p.port}"


def client_on(c: Client, target: DisqueProcess) -> Client:
    c.use_node(addr(target))
    assert c.node is not None and c.node.port == target.port
    return c


def test_one_seed_is_enough_the_rest_comes_from_hello(shared_cluster):
    nodes = shared_cluster(3)
    with Client([addr(nodes[0])]) as c:
        assert c.connect().port == nodes[0].port
        known = {n.port: n for n in c.nodes}
        assert set(known) == {p.port for p in nodes}
        assert {known[p.port].id for p in nodes} == set(nodes.ids())
        assert all(n.priority == 1 for n in known.values())


def test_node_list_is_refreshed_from_hello(cluster):
    nodes = cluster(3)
    with Client([addr(nodes[0])], hello_interval=0.0) as c:
        c.connect()
        ok(nodes[2], "CLUSTER", "LEAVING", "yes")
        wait_for(lambda: c.ping() and c.table.get(addr(nodes[2])).priority == 100,
                 timeout=20, what="HELLO priority 100 for the leaving node")
        # a fresh connection does not pick the leaving node while others are fine
        for _ in range(10):
            c.node = None
            assert c.connect().port != nodes[2].port


def test_leaving_moves_a_blocking_getjob_to_another_node(cluster):
    nodes = cluster(3)
    a, b = nodes[0], nodes[1]
    with Client([addr(p) for p in nodes]) as c:
        client_on(c, a)
        ok(a, "CLUSTER", "LEAVING", "yes")
        job_id = str(cmd(b, "ADDJOB", "lq", "from-b", 0, "REPLICATE", 1))
        # GETJOB would block on a -> -LEAVING -> the client goes to another node and retries
        jobs = c.get_job("lq", timeout=5000)
        assert c.node is not None and c.node.port != a.port
        if not jobs:  # it landed on the third node: the job is federated there on request
            jobs = c.get_job("lq", timeout=5000)
        assert [j.id for j in jobs] == [job_id]


def test_a_blocked_getjob_told_leaving_is_retried_elsewhere(cluster):
    nodes = cluster(3)
    a, b = nodes[0], nodes[1]
    with Client([addr(a)]) as c:
        client_on(c, a)
        getter = Background(c.get_job, "lq2", timeout=15000)
        wait_for(lambda: cmd(a, "QSTAT", "lq2") is not None, what="the GETJOB blocked on a")
        ok(a, "CLUSTER", "LEAVING", "yes")  # wakes the blocked client with -LEAVING
        wait_for(lambda: c.node is not None and c.node.port != a.port, what="client moved")
        target = next(p for p in nodes if c.node is not None and p.port == c.node.port)
        assert target in (b, nodes[2])
        cmd(target, "ADDJOB", "lq2", "x", 0, "REPLICATE", 1)
        assert [j.body for j in getter.result(timeout=20)] == [b"x"]


def test_a_killed_node_makes_the_client_reconnect_elsewhere(cluster):
    nodes = cluster(3, node_timeout=1000)
    a = nodes[0]
    with Client([addr(p) for p in nodes]) as c:
        client_on(c, a)
        job_id = c.add_job("kq", "before", replicate=1)
        a.kill(signal.SIGKILL)
        # nothing can be sent to a dead node: even an ADDJOB (not retry-safe) moves on
        other = c.add_job("kq", "after", replicate=1)
        assert c.node is not None and c.node.port != a.port
        assert other != job_id
        assert c.qlen("kq") == 1
        assert c.table.is_cooling(addr(a))


def test_a_blocked_getjob_survives_the_death_of_its_node(cluster):
    nodes = cluster(3, node_timeout=1000)
    a = nodes[0]
    with Client([addr(p) for p in nodes]) as c:
        client_on(c, a)
        getter = Background(c.get_job, "dq", timeout=20000)
        wait_for(lambda: cmd(a, "QSTAT", "dq") is not None, what="the GETJOB blocked on a")
        a.kill(signal.SIGKILL)
        wait_for(lambda: c.node is not None and c.node.port != a.port, what="client moved")
        target = next(p for p in nodes if c.node is not None and p.port == c.node.port)
        cmd(target, "ADDJOB", "dq", "survived", 0, "REPLICATE", 1)
        assert [j.body for j in getter.result(timeout=30)] == [b"survived"]


@pytest.mark.parametrize("allow_retry", [False, True])
def test_addjob_whose_reply_is_lost_is_resent_only_when_allowed(cluster, allow_retry):
    nodes = cluster(3, node_timeout=1000)
    a = nodes[0]
    with Client([addr(p) for p in nodes]) as c:
        client_on(c, a)
        c.ping()
        # stall node a, send ADDJOB to it, kill it before it answers: the reply is lost
        def stall() -> None:
            with contextlib.suppress(ConnectionClosed):  # the node is killed under it
                cmd(a, "DEBUG", "SLEEP", "60", timeout=90)

        def kill_once_the_addjob_arrived() -> None:
            wait_for(lambda: request_waiting(a.port), what="the ADDJOB unread on a")
            a.kill(signal.SIGKILL)

        sleeper = Background(stall)
        wait_unresponsive(a.port)
        killer = Background(kill_once_the_addjob_arrived)
        if allow_retry:
            job_id = c.add_job("rq", "maybe", replicate=1, allow_retry=True)
            assert c.node is not None and c.node.port != a.port
            assert c.qlen("rq") == 1 and job_id
        else:
            with pytest.raises(DisqueConnectionError) as exc:
                c.add_job("rq", "maybe", replicate=1)
            assert not exc.value.unreachable  # sent: the job may exist on the dead node
        killer.result(timeout=30)
        sleeper.result(timeout=30)


def test_consumer_moves_to_the_node_producing_its_jobs(shared_cluster, q):
    nodes = shared_cluster(3)
    a, b = nodes[0], nodes[1]
    b_prefix = myid(b)[:8]
    with Client([addr(p) for p in nodes]) as producer, Client([addr(a)]) as consumer:
        client_on(producer, b)
        client_on(consumer, a)
        for i in range(60):
            producer.add_job(q, f"j{i}", replicate=1)
        seen: list[str] = []
        stats = consumer.consume(q, lambda job: seen.append(job.node_prefix), max_jobs=60,
                                 follow_every=10, poll_ms=200)
        assert stats.acked == 60 and set(seen) == {b_prefix}
        assert stats.switches >= 1
        assert consumer.node is not None and consumer.node.port == b.port
