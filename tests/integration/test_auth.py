"""requirepass and AUTH (checklist §0 dispatch order, §4 AUTH; issue 3)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from tests.harness import DisqueProcess, wait_for
from tests.integration.resp import Conn, Err

PASSWORD = "s3cret-pass"
NOAUTH = b"-NOAUTH Authentication required.\r\n"


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DisqueProcess]:
    # the harness' readiness probe is a PING, which answers -NOAUTH here: wait for the port only
    proc = DisqueProcess(tmp_path_factory.mktemp("auth"), args=["--requirepass", PASSWORD])
    proc.start(wait=False)

    def ready() -> bool:
        if not proc.alive():
            raise RuntimeError(proc.output())
        try:
            with Conn(proc.port, timeout=2) as c:
                return c.call("PING") == NOAUTH
        except OSError:
            return False

    try:
        wait_for(ready, timeout=30, what="password-protected server")
        yield proc
    finally:
        proc.kill()


@pytest.mark.parametrize(
    "command",
    [
        ("PING",),
        ("ADDJOB", "q", "b", "0"),
        ("GETJOB", "NOHANG", "FROM", "q"),
        ("QLEN", "q"),
        ("INFO",),
        ("HELLO",),
        ("CONFIG", "GET", "maxmemory"),
        ("CLIENT", "LIST"),
        ("DEBUG", "FLUSHALL"),
        ("SHUTDOWN",),
    ],
)
def test_every_command_but_auth_and_quit_needs_authentication(
        secured: DisqueProcess, command: tuple[str, ...]) -> None:
    with Conn(secured.port) as c:
        assert c.call(*command) == NOAUTH
    assert secured.alive()


def test_unknown_command_and_arity_are_checked_before_auth(secured: DisqueProcess) -> None:
    with Conn(secured.port) as c:
        assert c.call("NOSUCHCMD") == b"-ERR unknown command 'NOSUCHCMD'\r\n"
        assert c.call("ADDJOB", "q") == b"-ERR wrong number of arguments for 'addjob' command\r\n"


def test_quit_works_without_authentication(secured: DisqueProcess) -> None:
    with Conn(secured.port) as c:
        c.send_cmd("QUIT")
        assert c.wait_closed(timeout=10) == b"+OK\r\n"


def test_wrong_password(secured: DisqueProcess) -> None:
    with Conn(secured.port) as c:
        assert c.call("AUTH", "wrong") == b"-ERR invalid password\r\n"
        assert c.call("PING") == NOAUTH


def test_right_password_then_commands_work(secured: DisqueProcess) -> None:
    with Conn(secured.port) as c:
        assert c.call("AUTH", PASSWORD) == b"+OK\r\n"
        assert c.call("PING") == b"+PONG\r\n"
        assert c.call("QLEN", "authq") == b":0\r\n"


def test_wrong_password_after_success_deauthenticates(secured: DisqueProcess) -> None:
    with Conn(secured.port) as c:
        assert c.call("AUTH", PASSWORD) == b"+OK\r\n"
        assert c.call("AUTH", "wrong") == b"-ERR invalid password\r\n"
        assert c.call("PING") == NOAUTH


def test_authentication_is_per_connection(secured: DisqueProcess) -> None:
    with Conn(secured.port) as a, Conn(secured.port) as b:
        assert a.call("AUTH", PASSWORD) == b"+OK\r\n"
        assert b.call("PING") == NOAUTH
        assert a.call("PING") == b"+PONG\r\n"


def test_auth_arity(secured: DisqueProcess) -> None:
    with Conn(secured.port) as c:
        assert c.call("AUTH") == b"-ERR wrong number of arguments for 'auth' command\r\n"


def test_hello_3_with_auth_authenticates(secured: DisqueProcess) -> None:
    with Conn(secured.port) as c:
        reply = c.cmd("HELLO", "3", "AUTH", "default", PASSWORD)
        assert isinstance(reply, dict), reply
        assert reply[b"proto"] == 3
        assert c.call("PING") == b"+PONG\r\n"


def test_hello_3_with_wrong_password_is_refused(secured: DisqueProcess) -> None:
    with Conn(secured.port) as c:
        reply = c.cmd("HELLO", "3", "AUTH", "default", "wrong")
        assert isinstance(reply, Err), reply
        assert c.call("PING") == NOAUTH


def test_hello_3_without_auth_needs_authentication(secured: DisqueProcess) -> None:
    with Conn(secured.port) as c:
        reply = c.cmd("HELLO", "3")
        assert isinstance(reply, Err) and reply.startswith("NOAUTH"), reply


@pytest.mark.parametrize("protocol", [3, 2])
def test_redis_py_with_password(secured: DisqueProcess, protocol: int) -> None:
    r = secured.client(password=PASSWORD, protocol=protocol)
    try:
        assert r.ping() is True
        job_id = r.execute_command("ADDJOB", f"authq{protocol}", "body", 0)
        assert r.execute_command("GETJOB", "FROM", f"authq{protocol}")[0][1] == job_id
        assert r.execute_command("ACKJOB", job_id) == 1
    finally:
        r.close()


def test_redis_py_without_password_is_refused(secured: DisqueProcess) -> None:
    r = secured.client()
    try:
        with pytest.raises(redis.exceptions.RedisError):
            r.execute_command("QLEN", "q")
    finally:
        r.close()


def test_auth_with_no_password_set(server: DisqueProcess) -> None:
    with Conn(server.port) as c:
        assert c.call("AUTH", "anything") == b"-ERR Client sent AUTH, but no password is set\r\n"


def test_config_set_requirepass_at_runtime(server: DisqueProcess) -> None:
    with Conn(server.port) as admin:
        assert admin.call("CONFIG", "SET", "requirepass", "later") == b"+OK\r\n"
    with Conn(server.port) as c:
        assert c.call("PING") == NOAUTH
        assert c.call("AUTH", "later") == b"+OK\r\n"
        assert c.call("PING") == b"+PONG\r\n"
        assert c.cmd("CONFIG", "GET", "requirepass") == [b"requirepass", b"later"]
        assert c.call("CONFIG", "SET", "requirepass", "") == b"+OK\r\n"
    with Conn(server.port) as c:
        assert c.call("PING") == b"+PONG\r\n"
        assert c.call("AUTH", "x") == b"-ERR Client sent AUTH, but no password is set\r\n"


# -------------------------------------------------------------- disque.client's AuthError
# What the node answers: HELLO 3 AUTH (redis-py's RESP3 handshake) with a wrong password,
# AUTH with a wrong one (RESP2), HELLO 3 without AUTH, any command without AUTH (RESP2).
WRONG_RESP3 = "WRONGPASS invalid username-password pair or user is disabled."
WRONG_RESP2 = "ERR invalid password"
MISSING_RESP3 = "NOAUTH HELLO must be called with the client already authenticated"
MISSING_RESP2 = "NOAUTH Authentication required."
CASES = [  # (password, protocol, the error's text)
    ("wrong", 3, WRONG_RESP3), ("wrong", 2, WRONG_RESP2),
    (None, 3, MISSING_RESP3), (None, 2, MISSING_RESP2),
]
CASE_IDS = ["wrong-resp3", "wrong-resp2", "missing-resp3", "missing-resp2"]


def _check_auth_error(exc: BaseException, text: str) -> None:
    from disque.client import AuthError, DisqueConnectionError

    # the documented type, not a connection error after trying every node, nor a bare
    # DisqueError; its text is the node's, prefix included
    assert type(exc) is AuthError and not isinstance(exc, DisqueConnectionError), repr(exc)
    assert str(exc).startswith(text), str(exc)
    assert exc.prefix == text.split(" ")[0]


@pytest.mark.parametrize(("password", "protocol", "text"), CASES, ids=CASE_IDS)
def test_client_raises_auth_error_on_a_wrong_or_missing_password(
        secured: DisqueProcess, password: str | None, protocol: int, text: str) -> None:
    from disque.client import AuthError, Client

    # socket_timeout: a hang would end as a timeout error, and fail the type check
    with Client([f"127.0.0.1:{secured.port}"], password=password, protocol=protocol,
                socket_timeout=10) as c:
        for call in (c.connect, c.ping, lambda: c.qlen("authq")):
            with pytest.raises(AuthError) as info:
                call()
            _check_auth_error(info.value, text)
    # the password of a disque:// URL, too
    if password is not None:
        with Client(f"disque://:{password}@127.0.0.1:{secured.port}", protocol=protocol,
                    socket_timeout=10) as c, pytest.raises(AuthError) as info:
            c.ping()
        _check_auth_error(info.value, text)
    with Client([f"127.0.0.1:{secured.port}"], password=PASSWORD, protocol=protocol) as c:
        assert c.ping() == "PONG"


@pytest.mark.parametrize(("password", "protocol", "text"), CASES, ids=CASE_IDS)
async def test_async_client_raises_auth_error_on_a_wrong_or_missing_password(
        secured: DisqueProcess, password: str | None, protocol: int, text: str) -> None:
    from disque.client import AsyncClient, AuthError

    async with AsyncClient([f"127.0.0.1:{secured.port}"], password=password,
                           protocol=protocol, socket_timeout=10) as c:
        for call in (c.connect, c.ping, lambda: c.qlen("authq")):
            with pytest.raises(AuthError) as info:
                await call()
            _check_auth_error(info.value, text)
    if password is not None:
        async with AsyncClient(f"disque://:{password}@127.0.0.1:{secured.port}",
                               protocol=protocol, socket_timeout=10) as c:
            with pytest.raises(AuthError) as info:
                await c.ping()
            _check_auth_error(info.value, text)
    async with AsyncClient([f"127.0.0.1:{secured.port}"], password=PASSWORD,
                           protocol=protocol) as c:
        assert await c.ping() == "PONG"


@pytest.mark.parametrize("password", ["wrong", None], ids=["wrong", "missing"])
def test_consume_raises_auth_error_instead_of_retrying_for_ever(
        secured: DisqueProcess, password: str | None) -> None:
    import threading

    from disque.client import AuthError, Client

    out: list[BaseException | object] = []

    def run() -> None:
        with Client([f"127.0.0.1:{secured.port}"], password=password) as c:
            try:
                out.append(c.consume("authq", lambda job: None, concurrency=2, poll_ms=200))
            except BaseException as exc:  # noqa: BLE001 - handed to the test
                out.append(exc)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(60)  # a hang guard: the first GETJOB's refusal ends it
    assert out, "consume() still running: it retries a refused password for ever"
    assert isinstance(out[0], AuthError), out[0]


@pytest.mark.parametrize("password", ["wrong", None], ids=["wrong", "missing"])
async def test_async_consume_raises_auth_error_instead_of_retrying_for_ever(
        secured: DisqueProcess, password: str | None) -> None:
    import asyncio

    from disque.client import AsyncClient, AuthError

    async with AsyncClient([f"127.0.0.1:{secured.port}"], password=password) as c:
        with pytest.raises(AuthError):
            # (a hang guard: the first GETJOB's refusal ends it)
            await asyncio.wait_for(c.consume("authq", lambda job: None, concurrency=2,
                                             poll_ms=200), 60)
