"""`python -m disque.tools.cluster` (behind `make cluster`): start, status, stop, restart."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from disque.tools.cluster import read_pid, running
from tests.cluster.conftest import reachable
from tests.harness import REPO, DisqueProcess, free_port, wait_for
from tests.tlscerts import closed_by_peer

N = 3


def free_port_range(n: int) -> int:
    """A base port such that base..base+n-1, their bus ports, their HTTP ports (port +
    1000, the tool's default) and their TLS ports (port + 2000) are all free."""
    def bindable(port: int) -> bool:
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                return False
        return True

    for _ in range(200):
        base = free_port()
        if base + n - 1 + 10000 <= 65535 and all(
                bindable(p) and bindable(p + 10000) and bindable(p + 1000)
                and bindable(p + 2000)
                for p in range(base, base + n)):
            return base
    raise RuntimeError(f"no {n} consecutive free port pairs")


def tool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "disque.tools.cluster", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=120)


@pytest.fixture
def run_dir(tmp_path: Path) -> Iterator[Path]:
    """The tool's --dir; whatever it left running is stopped, then killed, at teardown."""
    base = tmp_path / "run" / "cluster"
    try:
        yield base
    finally:
        tool("stop", "--dir", str(base), "--wait", "10")
        for d in base.glob("node-*"):
            pid = read_pid(d)
            if pid is not None and running(pid):
                os.kill(pid, signal.SIGKILL)


def handle(port: int, d: Path) -> DisqueProcess:
    """A harness view of a node the tool started (for the query helpers; never started)."""
    return DisqueProcess(d, port=port)


def test_tool_starts_a_meshed_cluster_and_stops_it(run_dir):
    port = free_port_range(N)
    ports = list(range(port, port + N))
    done = tool("start", "--nodes", str(N), "--port", str(port), "--dir", str(run_dir),
                "--timeout", "2000")
    assert done.returncode == 0, done.stderr
    lines = re.findall(r"^127\.0\.0\.1:(\d+) ([0-9a-f]{40}) (\S+)$", done.stdout, re.M)
    assert [int(p) for p, _, _ in lines] == ports, done.stdout
    ids = {int(p): node_id for p, node_id, _ in lines}
    assert len(set(ids.values())) == N

    dirs = {p: run_dir / f"node-{p}" for p in ports}
    nodes = [handle(p, dirs[p]) for p in ports]
    for n in nodes:
        assert reachable(n) == N - 1
        assert (n.workdir / "log.txt").exists()
        pid = read_pid(n.workdir)
        assert pid is not None and running(pid)

    # every node serves its dashboard and /metrics on port + 1000; the first one is printed
    assert f"dashboard: http://127.0.0.1:{port + 1000}/" in done.stdout, done.stdout
    for p in ports:
        with urllib.request.urlopen(f"http://127.0.0.1:{p + 1000}/metrics", timeout=10) as r:
            assert b"disque_cluster_known_nodes 3.0" in r.read()

    status = tool("status", "--dir", str(run_dir))
    assert status.returncode == 0, status.stderr
    rows = [line.split(" ") for line in status.stdout.splitlines()]
    assert len(rows) == N and all(len(r) == 6 for r in rows)
    assert [r[0] for r in rows if "myself" in r[2]] == [ids[port]]

    again = tool("start", "--nodes", str(N), "--port", str(port), "--dir", str(run_dir))
    assert again.returncode == 1
    assert "already running" in again.stderr

    pids = [read_pid(d) for d in dirs.values()]
    stopped = tool("stop", "--dir", str(run_dir))
    assert stopped.returncode == 0, stopped.stderr
    assert stopped.stdout.count("stopped") == N
    for pid, d in zip(pids, dirs.values(), strict=True):
        assert pid is not None and not running(pid)
        assert not (d / "disque.pid").exists()
    assert "no running node" in tool("stop", "--dir", str(run_dir)).stdout

    # Same directory again: the same nodes come back (identities from their nodes.conf).
    back = tool("start", "--nodes", str(N), "--port", str(port), "--dir", str(run_dir),
                "--timeout", "2000")
    assert back.returncode == 0, back.stderr
    again_ids = {int(p): i for p, i, _ in
                 re.findall(r"^127\.0\.0\.1:(\d+) ([0-9a-f]{40}) (\S+)$", back.stdout, re.M)}
    assert again_ids == ids
    assert tool("stop", "--dir", str(run_dir)).returncode == 0
    wait_for(lambda: not any(running(p) for p in pids if p), timeout=10,
             what="every node gone")


def test_tool_refuses_a_port_in_use(run_dir):
    port = free_port_range(N)
    with socket.create_server(("127.0.0.1", port + 1)):
        done = tool("start", "--nodes", str(N), "--port", str(port), "--dir", str(run_dir))
    assert done.returncode == 1
    assert f"port {port + 1} is already in use" in done.stderr
    assert not list(run_dir.glob("node-*/disque.pid")), "nothing was started"


def test_tool_tls_makes_certificates_and_a_tls_cluster(run_dir):
    """`make cluster TLS=1`: a throwaway CA and per-node certificates, the bus over mutual
    TLS, HTTPS, a TLS client port; the printed redis-cli line works."""
    import ssl

    base = free_port_range(N)
    out = tool("start", "--nodes", str(N), "--port", str(base), "--dir", str(run_dir),
               "--tls", "--wait", "60")
    assert out.returncode == 0, out.stderr
    ca = run_dir / "tls" / "ca.crt"
    line = next(x for x in out.stdout.splitlines() if "redis-cli" in x).split()
    assert line[:3] == ["redis-cli", "-p", str(base + 2000)] and str(ca) in line, line
    done = subprocess.run(line, capture_output=True, text=True, timeout=30)
    assert done.stdout.strip() == "PONG", done
    ctx = ssl.create_default_context(cafile=str(ca))
    with urllib.request.urlopen(f"https://127.0.0.1:{base + 1000}/metrics", context=ctx,
                                timeout=10) as resp:
        assert resp.status == 200
    # the bus speaks TLS only
    with socket.create_connection(("127.0.0.1", base + 10000), timeout=10) as sock:
        sock.sendall(b"\x00" * 64)
        assert closed_by_peer(sock)
    log = (run_dir / f"node-{base}" / "log.txt").read_text()
    wait_for(lambda: "bus.tls_refused" in (run_dir / f"node-{base}" / "log.txt").read_text(),
             what="the plain bus connection refused")
    assert "Traceback" not in log
