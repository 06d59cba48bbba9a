"""TLS on the client port (issue 23, first part; disque.tls): real servers, Debian's
`redis-cli --tls`, redis-py with `ssl=True`, Python ssl sockets, certificates made with
the openssl tool (tests/tlscerts.py)."""

from __future__ import annotations

import shutil
import socket
import ssl
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import redis

from tests.harness import REPO, DisqueProcess, free_port, wait_for
from tests.integration.resp import Conn
from tests.tlscerts import KEY_PASSWORD, Pki, closed_by_peer, make_pki, tls_only_args


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def tls_node(tmp_path: Path, pki: Pki, *extra: str) -> tuple[DisqueProcess, int]:
    tls_port = free_port()
    node = DisqueProcess(tmp_path / "node", args=[
        "--tls-port", str(tls_port), "--tls-cert-file", str(pki.server_crt),
        "--tls-key-file", str(pki.server_key), "--tls-ca-cert-file", str(pki.ca),
        "--tls-auth-clients", "no", *extra])
    node.start()
    return node, tls_port


def cli(port: int, pki: Pki, *args: str, cert: tuple[Path, Path] | None = None
        ) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("redis-cli")
    assert exe, "make system-deps installs redis-tools"
    tls = ["--tls", "--cacert", str(pki.ca)]
    if cert is not None:
        tls += ["--cert", str(cert[0]), "--key", str(cert[1])]
    return subprocess.run([exe, "-h", "127.0.0.1", "-p", str(port), *tls, *args],
                          capture_output=True, text=True, timeout=30)


def tls_socket(port: int, pki: Pki, cert: tuple[Path, Path] | None = None,
               ca: Path | None = None) -> ssl.SSLSocket:
    ctx = ssl.create_default_context(cafile=str(ca or pki.ca))
    ctx.check_hostname = False  # the certificates name 127.0.0.1, but some tests swap them
    if cert is not None:
        ctx.load_cert_chain(str(cert[0]), str(cert[1]))
    raw = socket.create_connection(("127.0.0.1", port), timeout=10)
    try:
        return ctx.wrap_socket(raw)
    except BaseException:
        raw.close()
        raise


def ping(s: ssl.SSLSocket) -> bytes:
    s.sendall(b"*1\r\n$4\r\nPING\r\n")
    return s.recv(64)


def peer_cn(port: int, pki: Pki) -> str:
    with tls_socket(port, pki) as s:
        cert: Any = s.getpeercert()
        assert ping(s) == b"+PONG\r\n"
    return dict(x[0] for x in cert["subject"])["commonName"]


def refused(port: int, pki: Pki, **kw: Any) -> bool:
    """True if a TLS client cannot get a PING answered (handshake or first read fails)."""
    try:
        with tls_socket(port, pki, **kw) as s:
            return ping(s) != b"+PONG\r\n"
    except (ssl.SSLError, OSError):
        return True


def info(node: DisqueProcess, section: str) -> dict[str, str]:
    with Conn(node.port) as c:
        text = c.cmd("INFO", section).decode()
    return dict(line.split(":", 1) for line in text.splitlines() if ":" in line)


def test_redis_cli_and_redis_py_work_over_tls_beside_the_plain_port(tmp_path: Path,
                                                                    pki: Pki) -> None:
    node, port = tls_node(tmp_path, pki)
    try:
        assert cli(port, pki, "PING").stdout.strip() == "PONG"
        job_id = cli(port, pki, "ADDJOB", "q", "over tls", "0").stdout.strip()
        assert job_id.startswith("D-")
        got = cli(port, pki, "GETJOB", "NOHANG", "FROM", "q").stdout.split()
        assert got == ["q", job_id, "over", "tls"] or got == ["q", job_id, "over tls"], got
        assert cli(port, pki, "ACKJOB", job_id).stdout.strip() == "1"
        r = redis.Redis(host="127.0.0.1", port=port, ssl=True, ssl_ca_certs=str(pki.ca),
                        socket_timeout=10, protocol=2)
        try:
            jid = r.execute_command("ADDJOB", "q2", "from redis-py", 0).decode()
            assert r.execute_command("GETJOB", "FROM", "q2") == [
                [b"q2", jid.encode(), b"from redis-py"]]
            assert r.execute_command("ACKJOB", jid) == 1
        finally:
            r.close()
        assert node.cli("PING").strip() == "PONG"  # the plain port serves as before
        stats = info(node, "stats")
        assert int(stats["tls_handshakes"]) >= 5 and stats["tls_handshake_failures"] == "0"
    finally:
        node.stop()


def test_bad_peers_on_either_port_cost_only_their_own_connection(tmp_path: Path,
                                                                 pki: Pki) -> None:
    node, port = tls_node(tmp_path, pki, "--tls-handshake-timeout", "500")
    try:
        # a plaintext client on the TLS port, and garbage: closed at once
        for payload in (b"*1\r\n$4\r\nPING\r\n", b"\x16\x03\x01\x00\x05hello", b"\xff" * 300):
            with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
                s.sendall(payload)
                assert closed_by_peer(s), payload
        # a TLS client on the plain port: its handshake fails; the node goes on
        assert refused(node.port, pki)
        assert node.cli("PING").strip() == "PONG"
        # 50 handshakes that never start (slowloris) do not hold up a TLS client's requests
        idle = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(50)]
        try:
            with tls_socket(port, pki) as s:
                for _ in range(20):
                    assert ping(s) == b"+PONG\r\n"
            # and each is closed once tls-handshake-timeout has passed
            for s in idle:
                assert closed_by_peer(s)
        finally:
            for s in idle:
                s.close()
        wait_for(lambda: int(info(node, "stats")["tls_handshake_failures"]) >= 53,
                 what="the failed handshakes counted")
        assert "tls.handshake_failed" in node.output()
        assert "Traceback" not in node.output()
        assert peer_cn(port, pki) == "127.0.0.1"
    finally:
        node.stop()


def test_mutual_tls_refuses_clients_without_a_certificate_from_the_ca(tmp_path: Path,
                                                                      pki: Pki) -> None:
    node, port = tls_node(tmp_path, pki, "--tls-auth-clients", "yes")
    mine = (pki.client_crt, pki.client_key)
    rogue = (pki.rogue_crt, pki.rogue_key)
    try:
        assert refused(port, pki)  # no certificate
        assert refused(port, pki, cert=rogue)  # signed by a CA the node does not trust
        assert refused(port, pki, cert=(pki.expired_crt, pki.expired_key))  # the CA's, expired
        assert not refused(port, pki, cert=mine)
        assert cli(port, pki, "PING", cert=mine).stdout.strip() == "PONG"
        assert cli(port, pki, "PING").stdout.strip() != "PONG"
        # optional: a client may come without a certificate, not with a bad one
        assert node.cli("CONFIG", "SET", "tls-auth-clients", "optional").strip() == "OK"
        assert not refused(port, pki)
        assert refused(port, pki, cert=rogue)
        # the CA file reloaded: now the other CA's clients are the trusted ones
        assert node.cli("CONFIG", "SET", "tls-auth-clients", "yes", "tls-ca-cert-file",
                        str(pki.rogue_ca)).strip() == "OK"
        assert not refused(port, pki, cert=rogue)
        assert refused(port, pki, cert=mine)
        # yes or optional without any CA to check with is refused, the old context kept
        out = node.cli("CONFIG", "SET", "tls-ca-cert-file", "")
        assert "needs tls-ca-cert-file" in out
        assert node.cli("CONFIG", "GET", "tls-ca-cert-file").split()[1] == str(pki.rogue_ca)
        assert not refused(port, pki, cert=rogue)
    finally:
        node.stop()


def test_config_set_reloads_certificates_for_new_connections_and_refuses_bad_ones(
        tmp_path: Path, pki: Pki) -> None:
    node, port = tls_node(tmp_path, pki)
    try:
        assert peer_cn(port, pki) == "127.0.0.1"
        kept = tls_socket(port, pki)  # open across the reloads
        assert node.cli("CONFIG", "SET", "tls-cert-file", str(pki.renewed_crt)).strip() == "OK"
        assert peer_cn(port, pki) == "renewed"
        # a certificate whose key is not the current one: refused, the context in use stays
        out = node.cli("CONFIG", "SET", "tls-cert-file", str(pki.other_crt))
        assert out.startswith("ERR Invalid TLS configuration") and "does not match" in out, out
        assert node.cli("CONFIG", "GET", "tls-cert-file").split()[1] == str(pki.renewed_crt)
        assert peer_cn(port, pki) == "renewed"
        # the certificate and its key together (several pairs in one CONFIG SET)
        assert node.cli("CONFIG", "SET", "tls-cert-file", str(pki.other_crt), "tls-key-file",
                        str(pki.other_key)).strip() == "OK"
        assert peer_cn(port, pki) == "other"
        # missing file; a key that needs a password, without it and with it
        out = node.cli("CONFIG", "SET", "tls-cert-file", str(tmp_path / "nope.crt"))
        assert "cannot read tls-cert-file" in out and "No such file" in out, out
        out = node.cli("CONFIG", "SET", "tls-cert-file", str(pki.locked_crt), "tls-key-file",
                       str(pki.locked_key))
        assert out.startswith("ERR Invalid TLS configuration"), out
        assert node.cli("CONFIG", "GET", "tls-key-file").split()[1] == str(pki.other_key)
        assert node.cli("CONFIG", "SET", "tls-cert-file", str(pki.locked_crt), "tls-key-file",
                        str(pki.locked_key), "tls-key-file-pass", KEY_PASSWORD).strip() == "OK"
        assert peer_cn(port, pki) == "locked"
        assert node.cli("CONFIG", "GET", "tls-key-file-pass").split()[1] == "******"
        assert ping(kept) == b"+PONG\r\n"  # the connection made before keeps working
        kept.close()
        assert "Traceback" not in node.output()
    finally:
        node.stop()


def test_port_zero_serves_tls_only_and_bad_tls_files_stop_the_start(tmp_path: Path,
                                                                     pki: Pki) -> None:
    tls_port = free_port()
    base = [sys.executable, "-m", "disque", "--port", "0", "--tls-port", str(tls_port),
            "--tls-key-file", str(pki.server_key), "--tls-auth-clients", "no"]
    bad = subprocess.run(base + ["--tls-cert-file", str(tmp_path / "missing.crt"), "--dir",
                                 str(tmp_path / "bad")], cwd=str(REPO), capture_output=True,
                         text=True, timeout=30)
    assert bad.returncode == 1
    assert "Failed to configure TLS: cannot read tls-cert-file" in bad.stderr, bad.stderr
    log = open(tmp_path / "tls-only.log", "wb")  # noqa: SIM115 - owned by the process
    proc = subprocess.Popen(base + ["--tls-cert-file", str(pki.server_crt), "--dir",
                                    str(tmp_path / "d")], cwd=str(REPO), stdout=log,
                            stderr=subprocess.STDOUT)
    log.close()
    try:
        wait_for(lambda: not refused(tls_port, pki), what="the TLS-only node")
        assert cli(tls_port, pki, "INFO", "server").stdout.count("tcp_port:0") == 1
        with socket.create_connection(("127.0.0.1", tls_port), timeout=10) as s:
            s.sendall(b"*1\r\n$4\r\nPING\r\n")  # plaintext: no answer, closed
            assert closed_by_peer(s)
    finally:
        proc.terminate()
        proc.wait(timeout=20)
    assert proc.returncode == 0


def test_tls_http_serves_metrics_and_the_api_over_https_only(tmp_path: Path, pki: Pki) -> None:
    http_port = free_port()
    node, _ = tls_node(tmp_path, pki, "--http-port", str(http_port), "--tls-http", "yes")
    ctx = ssl.create_default_context(cafile=str(pki.ca))

    def get(port: int, path: str) -> tuple[int, str]:
        url = f"https://127.0.0.1:{port}{path}"
        with urllib.request.urlopen(url, context=ctx, timeout=10) as resp:
            return resp.status, resp.read().decode()

    try:
        status, text = get(http_port, "/metrics")
        assert status == 200 and "disque_node_info" in text
        cmd_ok = node.cli("ADDJOB", "webq", "seen over https", "0").strip()
        status, text = get(http_port, "/api/queues")
        assert status == 200 and "webq" in text, text
        # plain HTTP on the HTTPS port: refused, the node goes on
        with socket.create_connection(("127.0.0.1", http_port), timeout=10) as s:
            s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            assert closed_by_peer(s)
        # moved by CONFIG SET http-port: still HTTPS, with the context reloaded meanwhile
        assert node.cli("CONFIG", "SET", "tls-cert-file", str(pki.renewed_crt)).strip() == "OK"
        moved = free_port()
        assert node.cli("CONFIG", "SET", "http-port", str(moved)).strip() == "OK"
        wait_for(lambda: get(moved, "/metrics")[0] == 200, what="HTTPS on the new port")
        assert cmd_ok.startswith("D-")
        assert "Traceback" not in node.output()
    finally:
        node.stop()


def test_the_python_client_speaks_tls_sync_and_async(tmp_path: Path, pki: Pki) -> None:
    import asyncio

    from disque.client import AsyncClient, Client, DisqueConnectionError

    port = free_port()
    node = DisqueProcess(tmp_path / "node",
                         args=tls_only_args(pki, port, "--tls-auth-clients", "optional"))
    node.start(wait=False)
    # (TLS only: HELLO lists the TLS port, which discovery then uses, with TLS)
    try:
        wait_for(lambda: not refused(port, pki), what="the TLS-only node")
        with Client(f"disque+tls://127.0.0.1:{port}", ssl_ca_certs=str(pki.ca)) as c:
            jid = c.add_job("clientq", "sync over tls")
            jobs = c.get_job("clientq", timeout=5000)
            assert [(j.id, j.body) for j in jobs] == [(jid, b"sync over tls")]
            assert c.ack_job(jid) == 1
            assert [n.port for n in c.nodes] == [port]
        # a client certificate, with ssl=True and redis-py's keywords
        with Client([f"127.0.0.1:{port}"], ssl=True, ssl_ca_certs=str(pki.ca),
                    ssl_certfile=str(pki.client_crt), ssl_keyfile=str(pki.client_key)) as c:
            assert c.execute_command("PING") in (b"PONG", "PONG", True)

        async def run() -> None:
            c = AsyncClient(f"rediss://127.0.0.1:{port}", ssl_ca_certs=str(pki.ca))
            try:
                jid = await c.add_job("clientq", "async over tls")
                jobs = await c.get_job("clientq", timeout=5000)
                assert [j.id for j in jobs] == [jid]
                assert await c.ack_job(jid) == 1
            finally:
                await c.close()
        asyncio.run(run())
        # and a plain client to the TLS port fails cleanly
        with Client([f"127.0.0.1:{port}"], connect_timeout=2, socket_timeout=2,
                    retries=0) as c, pytest.raises(DisqueConnectionError):  # not a crash
            c.add_job("clientq", "plain")
    finally:
        node.stop()


def tls_only_node(tmp_path: Path, pki: Pki, *extra: str) -> tuple[DisqueProcess, int]:
    """A node serving TLS only (port 0), up and answering a TLS PING."""
    port = free_port()
    node = DisqueProcess(tmp_path / "tls-only", args=tls_only_args(pki, port, *extra))
    node.start(wait=False)
    wait_for(lambda: not refused(port, pki, cert=(pki.client_crt, pki.client_key)),
             what="the TLS-only node")
    return node, port


def test_disque_worker_runs_jobs_over_tls_with_a_client_certificate(tmp_path: Path,
                                                                    pki: Pki) -> None:
    from tests.integration.worker_proc import workers_of

    node, port = tls_only_node(tmp_path, pki)  # tls-auth-clients yes: a certificate needed
    gen = workers_of(tmp_path)
    workers = next(gen)
    try:
        mine = (pki.client_crt, pki.client_key)
        ids = [cli(port, pki, "ADDJOB", "wq", f"job{i}", "0", cert=mine).stdout.strip()
               for i in range(5)]
        assert all(i.startswith("D-") for i in ids), ids
        w = workers.start("ok", ["wq"], [], "--nodes", f"disque+tls://127.0.0.1:{port}",
                          "--tls-ca-cert-file", str(pki.ca), "--tls-cert-file",
                          str(pki.client_crt), "--tls-key-file", str(pki.client_key),
                          "--burst", "--timeout", "200")
        assert w.wait() == 0, w.output()[-2000:]
        assert sorted(e.job for e in workers.events("done")) == sorted(ids)
        # without the client certificate the node refuses it: the worker cannot start
        w = workers.start("ok", ["wq"], [], "--nodes", f"127.0.0.1:{port}", "--tls",
                          "--tls-ca-cert-file", str(pki.ca), "--burst")
        assert w.wait() == 1, w.output()[-2000:]
        assert "worker.cannot_start" in w.output()
    finally:
        gen.close()
        node.stop()


def hello_ports(port: int, pki: Pki | None = None) -> dict[bytes, int]:
    """HELLO's node -> port, asked over TLS when `pki` is given."""
    import hiredis

    reader = hiredis.Reader()
    sock: socket.socket = (tls_socket(port, pki) if pki is not None
                           else socket.create_connection(("127.0.0.1", port), timeout=10))
    with sock:
        sock.sendall(b"*1\r\n$5\r\nHELLO\r\n")
        reply: Any = False
        while reply is False:
            reader.feed(sock.recv(65536))
            reply = reader.gets()
    return {e[0]: int(e[2]) for e in reply[2:]}


def test_hello_over_tls_lists_the_tls_ports_of_the_other_nodes(tmp_path: Path,
                                                                pki: Pki) -> None:
    """Nodes with a plain and a TLS port announce the TLS one in their bus headers: HELLO
    on a TLS connection lists every node's TLS port, so a client that discovers the cluster
    over TLS keeps TLS for the other nodes; HELLO on a plain connection, the plain ports."""
    from disque.client import Client

    a, a_tls = tls_node(tmp_path / "a", pki)
    b, b_tls = tls_node(tmp_path / "b", pki)
    try:
        ra, rb = redis.Redis(port=a.port), redis.Redis(port=b.port)
        assert ra.execute_command("CLUSTER", "MEET", "127.0.0.1", b.port) in (b"OK", True)
        a_id, b_id = (r.execute_command("CLUSTER", "MYID") for r in (ra, rb))
        wait_for(lambda: hello_ports(a_tls, pki).get(b_id) == b_tls, what="b's TLS port")
        assert hello_ports(a_tls, pki) == {a_id: a_tls, b_id: b_tls}
        assert hello_ports(a.port) == {a_id: a.port, b_id: b.port}
        assert hello_ports(b_tls, pki) == {a_id: a_tls, b_id: b_tls}
        with Client(f"disque+tls://127.0.0.1:{a_tls}", ssl_ca_certs=str(pki.ca)) as c:
            assert c.add_job("tlshello", "over tls")  # (connects: HELLO fills the table)
            assert sorted(n.port for n in c.nodes) == sorted([a_tls, b_tls])
    finally:
        a.stop()
        b.stop()
