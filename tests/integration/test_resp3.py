"""Modern clients: redis-py 8 with its defaults (HELLO 3, RESP3) and with protocol=2; the
Redis 6 `HELLO <protover>` handshake; Disque's own replies keeping their RESP2 shapes (flat
arrays) under RESP3 with RESP3 nulls (issue 3, "Modern clients")."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from tests.harness import DisqueProcess
from tests.integration.resp import JOB_ID_RE, QSTAT_FIELDS, SHOW_FIELDS, Conn, Err, keys_of

HELLO3_KEYS = [b"server", b"version", b"proto", b"id", b"mode", b"role", b"modules"]
UNKNOWN_ID = "D-00000000-AAAAAAAAAAAAAAAAAAAAAAAA-05a1"


@pytest.fixture(params=[3, 2], ids=["resp3-default", "resp2"])
def r(request: pytest.FixtureRequest, node: DisqueProcess) -> Iterator[redis.Redis]:
    client = node.client() if request.param == 3 else node.client(protocol=2)
    try:
        yield client
    finally:
        client.close()


def test_redis_py_default_client_negotiates_resp3(node: DisqueProcess) -> None:
    client = node.client()
    try:
        assert client.ping() is True
        conn = client.connection_pool.get_connection()
        try:
            assert conn.protocol in (3, "3")
        finally:
            client.connection_pool.release(conn)
    finally:
        client.close()


def test_addjob_getjob_ackjob(r: redis.Redis, q: str) -> None:
    job_id = r.execute_command("ADDJOB", q, b"payload", 0)
    assert isinstance(job_id, bytes) and JOB_ID_RE.match(job_id.decode())
    assert r.execute_command("QLEN", q) == 1
    got = r.execute_command("GETJOB", "COUNT", 10, "FROM", q)
    assert got == [[q.encode(), job_id, b"payload"]]
    assert r.execute_command("ACKJOB", job_id) == 1
    assert r.execute_command("SHOW", job_id) is None


def test_getjob_nohang_and_timeout_give_none(r: redis.Redis, q: str) -> None:
    assert r.execute_command("GETJOB", "NOHANG", "FROM", q) is None
    assert r.execute_command("GETJOB", "TIMEOUT", 100, "FROM", q) is None


def test_withcounters_is_a_flat_array(r: redis.Redis, q: str) -> None:
    job_id = r.execute_command("ADDJOB", q, "b", 0)
    got = r.execute_command("GETJOB", "WITHCOUNTERS", "FROM", q)
    assert got == [[q.encode(), job_id, b"b", b"nacks", 0, b"additional-deliveries", 0]]


def test_show_is_a_flat_array(r: redis.Redis, q: str) -> None:
    job_id = r.execute_command("ADDJOB", q, "b", 0, "RETRY", 0)
    show = r.execute_command("SHOW", job_id)
    assert isinstance(show, list) and len(show) == 30
    assert keys_of(show) == SHOW_FIELDS
    assert show[show.index(b"next-requeue-within") + 1] is None


def test_qstat_is_a_flat_array(r: redis.Redis, q: str) -> None:
    r.execute_command("ADDJOB", q, "b", 0)
    st = r.execute_command("QSTAT", q)
    assert isinstance(st, list) and len(st) == 20
    assert keys_of(st) == QSTAT_FIELDS
    assert r.execute_command("QSTAT", q + "-missing") is None


def test_qpeek_qscan_jscan_hello(r: redis.Redis, q: str) -> None:
    job_id = r.execute_command("ADDJOB", q, "b", 0)
    assert r.execute_command("QPEEK", q, 1) == [[q.encode(), job_id, b"b"]]
    cursor, items = r.execute_command("QSCAN", "BUSYLOOP", "MINLEN", 1)
    assert cursor == b"0" and q.encode() in items
    cursor, items = r.execute_command("JSCAN", "BUSYLOOP", "QUEUE", q)
    assert cursor == b"0" and items == [job_id]
    hello = r.execute_command("HELLO")
    assert hello[0] == 1 and len(hello[1]) == 40 and job_id[2:10] == hello[1][:8]


def test_errors_raise_response_errors(r: redis.Redis, q: str) -> None:
    with pytest.raises(redis.ResponseError, match="COUNT must be a number greater than zero"):
        r.execute_command("GETJOB", "COUNT", 0, "FROM", q)
    with pytest.raises(redis.ResponseError, match="Invalid Job ID format"):
        r.execute_command("SHOW", "nope")


def test_hello_3_replies_a_map_and_switches_to_resp3(conn: Conn, q: str) -> None:
    raw = conn.call("HELLO", "3")
    assert raw.startswith(b"%7\r\n"), raw[:40]
    hello = conn.cmd("HELLO", "3")
    assert list(hello.keys()) == HELLO3_KEYS
    assert hello[b"proto"] == 3
    assert isinstance(hello[b"server"], bytes) and isinstance(hello[b"version"], bytes)
    assert isinstance(hello[b"mode"], bytes) and isinstance(hello[b"role"], bytes)
    assert hello[b"modules"] == []
    assert hello[b"id"] == conn.cmd("CLIENT", "ID")
    # RESP3 nulls from now on
    assert conn.call("GETJOB", "NOHANG", "FROM", q) == b"_\r\n"
    assert conn.call("SHOW", UNKNOWN_ID) == b"_\r\n"
    assert conn.call("QSTAT", q + "-missing") == b"_\r\n"
    assert conn.call("CLIENT", "GETNAME") == b"_\r\n"


def test_disque_replies_keep_resp2_shapes_under_resp3(conn: Conn, q: str) -> None:
    assert isinstance(conn.cmd("HELLO", "3"), dict)
    assert conn.call("ADDJOB", q, "b", "0", "RETRY", "0").startswith(b"+D-")
    job_id = conn.cmd("QPEEK", q, "1")[0][1].decode()
    raw_show = conn.call("SHOW", job_id)
    assert raw_show.startswith(b"*30\r\n")
    assert b"$19\r\nnext-requeue-within\r\n_\r\n" in raw_show
    assert conn.call("QSTAT", q).startswith(b"*20\r\n")
    raw = conn.call("GETJOB", "FROM", q)
    assert raw.startswith(b"*1\r\n*3\r\n")
    assert conn.call("QPEEK", q, "1") == b"*0\r\n"


def test_plain_hello_keeps_disque_shape_after_hello_3(conn: Conn) -> None:
    conn.cmd("HELLO", "3")
    hello = conn.cmd("HELLO")
    assert isinstance(hello, list) and hello[0] == 1 and len(hello) == 3
    assert hello[2][0] == hello[1]


def test_hello_2_replies_a_flat_array_and_keeps_resp2(conn: Conn, q: str) -> None:
    hello = conn.cmd("HELLO", "2")
    assert isinstance(hello, list) and hello[::2] == HELLO3_KEYS
    assert hello[hello.index(b"proto") + 1] == 2
    assert conn.call("GETJOB", "NOHANG", "FROM", q) == b"*-1\r\n"


def test_hello_2_after_hello_3_goes_back_to_resp2(conn: Conn, q: str) -> None:
    conn.cmd("HELLO", "3")
    assert conn.call("SHOW", UNKNOWN_ID) == b"_\r\n"
    conn.cmd("HELLO", "2")
    assert conn.call("SHOW", UNKNOWN_ID) == b"$-1\r\n"
    assert conn.call("QSTAT", q) == b"*-1\r\n"


def test_hello_3_setname(conn: Conn) -> None:
    hello = conn.cmd("HELLO", "3", "SETNAME", "worker-7")
    assert isinstance(hello, dict)
    assert conn.cmd("CLIENT", "GETNAME") == b"worker-7"


def test_hello_unsupported_protocol_version(conn: Conn) -> None:
    reply = conn.cmd("HELLO", "4")
    assert isinstance(reply, Err) and reply.startswith("NOPROTO"), reply
    assert conn.call("GETJOB", "NOHANG", "FROM", "resp3-x") == b"*-1\r\n"   # still RESP2


def test_client_setinfo_is_accepted(conn: Conn) -> None:
    assert conn.call("CLIENT", "SETINFO", "LIB-NAME", "redis-py") == b"+OK\r\n"
    assert conn.call("CLIENT", "SETINFO", "LIB-VER", "8.1.0") == b"+OK\r\n"


def test_pydisque_style_hello_through_default_redis_py(node: DisqueProcess) -> None:
    client = redis.Redis(host="127.0.0.1", port=node.port)
    try:
        hello = client.execute_command("HELLO")
        assert hello[0] == 1
        assert hello[2][0] == hello[1]
        assert hello[2][2] == str(node.port).encode()
    finally:
        client.close()
