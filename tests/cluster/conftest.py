"""Real multi-process clusters for the tests: `cluster(n)` starts n `disque-server`
processes on free loopback ports (port + 10000 free too, for the bus), meets them through one
node only and waits until gossip has made the mesh full, i.e. every node's CLUSTER INFO says
`cluster_reachable_nodes:<n-1>`. Every process is killed at teardown, even when the test or
the mesh formation failed.

Node timeouts: CALM_NODE_TIMEOUT (5 s) unless a test asks otherwise, so that a node starved
of CPU for a second on a loaded machine is not flagged failing in a test that does not check
failure detection. A test whose subject is failure detection, or whose duration depends on
a node being flagged failing quickly (kill_until_failed, waiting for `fail`/`fail?`, a
killed node leaving the reachable set), passes `node_timeout=NODE_TIMEOUT`.

`shared_cluster(n)` hands out a cluster reused by the calm tests of the test process; such a
test names its queues with the `q` fixture, so no bus message of an earlier test can land in
them.

Views are read over a fresh RESP connection each time (`tests.integration.resp.Conn`), so a
node that was killed and restarted is simply asked again.
"""

from __future__ import annotations

import contextlib
import itertools
import re
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.harness import DisqueProcess, wait_for
from tests.integration.resp import Conn, Err

# ms: short, so that failure detection fits in a test; only for the tests that need it
NODE_TIMEOUT = 1000
# ms: the default, for clusters whose test does not check failure detection: long enough
# that a node starved of CPU for a second or two on a loaded 2-core machine is not flagged
# failing
CALM_NODE_TIMEOUT = 5000
MESH_DEADLINE = 30.0  # s: generous; a mesh of five local nodes forms in well under a second


# ---------------------------------------------------------------------------- views
def cmd(proc: DisqueProcess, *args: Any, timeout: float = 10.0) -> Any:
    """One command on a fresh connection; errors come back as `Err` values, not raised."""
    conn = Conn(proc.port, timeout=timeout)
    try:
        return conn.cmd(*args)
    finally:
        conn.close()


def ok(proc: DisqueProcess, *args: Any) -> None:
    reply = cmd(proc, *args)
    assert reply == "OK", f"{' '.join(map(str, args))} on :{proc.port} -> {reply!r}"


def parse_fields(text: bytes | str) -> dict[str, str]:
    """`key:value` lines (CLUSTER INFO, an INFO section) -> dict; headers and blanks skipped."""
    if isinstance(text, bytes):
        text = text.decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#") and ":" in line:
            key, _, value = line.partition(":")
            out[key] = value
    return out


def cluster_info(proc: DisqueProcess) -> dict[str, str]:
    reply = cmd(proc, "CLUSTER", "INFO")
    assert not isinstance(reply, Err), reply
    return parse_fields(reply)


def reachable(proc: DisqueProcess) -> int:
    return int(cluster_info(proc)["cluster_reachable_nodes"])


def handshakes(proc: DisqueProcess) -> int:
    """Handshake entries in the node table (INFO cluster)."""
    reply = cmd(proc, "INFO", "cluster")
    assert isinstance(reply, bytes), reply
    return int(parse_fields(reply)["cluster_handshake_nodes"])


class NodeLine:
    """One parsed CLUSTER NODES line: `<id> <ip>:<port> <flags> <ping> <pong> <link>`."""

    def __init__(self, line: str) -> None:
        fields = line.split(" ")
        assert len(fields) == 6, f"CLUSTER NODES line without 6 fields: {line!r}"
        self.fields = fields
        self.id, self.addr, flags, ping, pong, self.link = fields
        self.ip, _, port = self.addr.rpartition(":")
        self.port = int(port)
        self.flags = flags.split(",")
        self.ping_sent = int(ping)
        self.pong_received = int(pong)

    def __repr__(self) -> str:
        return " ".join(self.fields)


def cluster_nodes(proc: DisqueProcess) -> dict[str, NodeLine]:
    """CLUSTER NODES of `proc`, by node ID."""
    reply = cmd(proc, "CLUSTER", "NODES")
    assert isinstance(reply, bytes), reply
    text = reply.decode()
    assert text.endswith("\n") or not text, text
    lines = [NodeLine(line) for line in text.split("\n") if line]
    return {n.id: n for n in lines}


def myid(proc: DisqueProcess) -> str:
    reply = cmd(proc, "CLUSTER", "MYID")
    assert isinstance(reply, bytes), reply
    return reply.decode()


def kill_until_failed(c: Any, i: int) -> str:
    """kill -9 node i of cluster c and wait until every other node flags it fail; its ID."""
    x = c[i]
    xid = myid(x)
    x.kill()
    wait_for(lambda: all("fail" in cluster_nodes(p)[xid].flags
                         for j, p in enumerate(c.nodes) if j != i),
             timeout=15, what="the killed node failed")
    return xid


def hello(proc: DisqueProcess) -> dict[str, list[bytes]]:
    """HELLO entries [id, ip, port, priority] by node ID (the two header items checked)."""
    reply = cmd(proc, "HELLO")
    assert isinstance(reply, list) and reply[0] == 1, reply
    return {e[0].decode(): e for e in reply[2:]}


def holds_for(cond: Callable[[], Any], seconds: float, what: str,
              interval: float = 0.1, detail: Callable[[], Any] | None = None) -> None:
    """Assert `cond()` stays truthy at every poll during `seconds` (the opposite of
    wait_for: a bounded observation that something does *not* happen). `detail()`, if
    given, is added to the failure message."""
    deadline = time.monotonic() + seconds
    while True:
        value = cond()
        if not value:
            extra = f": {detail()!r}" if detail is not None else ""
            raise AssertionError(f"{what} stopped holding{extra}")
        if time.monotonic() >= deadline:
            return
        time.sleep(interval)


# ---------------------------------------------------------------------------- the cluster
class Cluster:
    """N real nodes; `nodes[i]` is a DisqueProcess (port, workdir, kill/stop/start...)."""

    def __init__(self, nodes: list[DisqueProcess]) -> None:
        self.nodes = nodes

    def __len__(self) -> int:
        return len(self.nodes)

    def __getitem__(self, i: int) -> DisqueProcess:
        return self.nodes[i]

    def __iter__(self) -> Iterator[DisqueProcess]:
        return iter(self.nodes)

    def ids(self) -> list[str]:
        return [myid(p) for p in self.nodes]

    def meet_via_first(self) -> None:
        """Every other node meets node 0 only: they learn about each other by gossip."""
        first = self.nodes[0]
        for p in self.nodes[1:]:
            ok(p, "CLUSTER", "MEET", "127.0.0.1", first.port)

    def meet_chain(self) -> None:
        """Node i meets node i+1 only."""
        for a, b in zip(self.nodes, self.nodes[1:], strict=False):
            ok(a, "CLUSTER", "MEET", "127.0.0.1", b.port)

    def meshed(self, nodes: list[DisqueProcess] | None = None) -> bool:
        """Every node reaches the n - 1 others, and none is still in a handshake: two nodes
        that learned of each other by gossip at once each start one, and the entry (listed
        by HELLO and CLUSTER NODES, as the original does) lingers until its PONG, after the
        other node's MEET made them reachable."""
        nodes = self.nodes if nodes is None else nodes
        return all(reachable(p) == len(nodes) - 1 and handshakes(p) == 0 for p in nodes)

    def wait_mesh(self, nodes: list[DisqueProcess] | None = None,
                  timeout: float = MESH_DEADLINE) -> None:
        nodes = self.nodes if nodes is None else nodes

        def check() -> bool:
            for p in nodes:
                if not p.alive():
                    raise AssertionError(f"node :{p.port} died:\n{p.output()[-3000:]}")
            return self.meshed(nodes)

        try:
            wait_for(check, timeout=timeout, what=f"a full mesh of {len(nodes)} nodes")
        except AssertionError:
            # (wait_for kept polling through check()'s "died" error: name the dead here)
            dead = "\n".join(f":{p.port} died:\n{p.output()[-2000:]}" for p in nodes
                             if not p.alive())
            views = "\n".join(f":{p.port}\n{cmd(p, 'CLUSTER', 'NODES')!r}" for p in nodes
                              if p.alive())
            raise AssertionError(f"no full mesh after {timeout}s; {dead}\nviews:\n{views}") \
                from None


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Callable[..., Cluster]]:
    """Factory: cluster(n, node_timeout=..., args=[...], meet="first"|"chain"|None).

    The node timeout is CALM_NODE_TIMEOUT unless given (NODE_TIMEOUT for the tests of
    failure detection). With `meet` set (the default "first"), the factory returns only once
    every node sees the other n-1 as reachable. All started processes are killed at
    teardown."""
    started: list[DisqueProcess] = []
    clusters: list[Cluster] = []  # a test may put a restarted process into c.nodes

    def factory(n: int, node_timeout: int = CALM_NODE_TIMEOUT, args: list[str] | None = None,
                meet: str | None = "first", name: str = "node") -> Cluster:
        base = len(started)
        procs = [DisqueProcess(tmp_path / f"{name}{base + i}",
                               args=["--cluster-node-timeout", str(node_timeout),
                                     *(args or [])])
                 for i in range(n)]
        started.extend(procs)
        for p in procs:  # start them all, then wait: startup is mostly interpreter import
            p.start(wait=False)
        for p in procs:
            p.wait_ready()
        c = Cluster(procs)
        clusters.append(c)
        if meet == "first":
            c.meet_via_first()
        elif meet == "chain":
            c.meet_chain()
        elif meet is not None:
            raise ValueError(f"unknown meet mode {meet!r}")
        if meet is not None:
            c.wait_mesh()
        return c

    try:
        yield factory
    finally:
        for p in [*started, *(p for c in clusters for p in c.nodes)]:
            p.kill()


# ---------------------------------------------------------------------------- shared clusters
def _healthy(c: Cluster) -> bool:
    try:
        return all(p.alive() for p in c.nodes) and c.meshed()
    except (OSError, AssertionError):
        return False


def _wipe(c: Cluster) -> None:
    """Every job, queue and counter gone, so that the next test starts as on a new cluster.
    (A bus message of the last test still in flight can still land; tests that share a
    cluster use queue names of their own, so it never lands in theirs.)"""
    for p in c.nodes:
        ok(p, "DEBUG", "FLUSHALL")
        ok(p, "CONFIG", "RESETSTAT")


@pytest.fixture(scope="session")
def _shared_clusters(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[Any, Cluster]]:
    made: dict[Any, Cluster] = {}
    try:
        yield made
    finally:
        for c in made.values():
            for p in c.nodes:
                p.kill()


@pytest.fixture
def shared_cluster(_shared_clusters: dict[Any, Cluster],
                   tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Cluster]:
    """Factory: shared_cluster(n, args=[...]) -> a meshed n-node cluster (node timeout
    CALM_NODE_TIMEOUT) shared by the tests of this test process that ask for the same n and
    args, wiped of jobs, queues and stats before each one (see _wipe).

    Only for tests that leave the cluster as they found it: they add, get, ack, nack, pause,
    scan... on queue names of their own, and never kill, stop, freeze, restart, partition,
    reset or reconfigure a node (CONFIG SET, CLUSTER MEET/FORGET/RESET, LEAVING) nor count
    what other tests' stragglers could add (whole-node job counts are fine right after the
    wipe only if the test's own traffic is all that can arrive). A test that does any of
    that uses `cluster`. A cluster found unhealthy is replaced."""
    def factory(n: int, args: list[str] | None = None) -> Cluster:
        key = (n, tuple(args or ()))
        c = _shared_clusters.get(key)
        if c is not None and not _healthy(c):
            for p in c.nodes:
                p.kill()
            c = None
        if c is None:
            base = tmp_path_factory.mktemp(f"shared{n}-")
            procs = [DisqueProcess(base / f"node{i}",
                                   args=["--cluster-node-timeout", str(CALM_NODE_TIMEOUT),
                                         *(args or [])])
                     for i in range(n)]
            _shared_clusters[key] = c = Cluster(procs)
            for p in procs:
                p.start(wait=False)
            for p in procs:
                p.wait_ready()
            c.meet_via_first()
            c.wait_mesh()
        _wipe(c)
        return c

    return factory


_queue_counter = itertools.count()


@pytest.fixture
def q(request: pytest.FixtureRequest) -> str:
    """A queue name no other test uses (of the test process): the test's name and a counter.
    Names derived from it (f"{q}-dead") are the test's own too."""
    base = re.sub(r"[^A-Za-z0-9_]", "_", request.node.name)[:60]
    return f"{base}-{next(_queue_counter)}"


# ---------------------------------------------------------------------------- NAT stand-in
class Forwarder:
    """A TCP port forward (listen address -> target address) run by threads in the test
    process: it plays the NAT or container port mapping in front of a node that announces
    an address it does not listen on itself."""

    def __init__(self, listen: tuple[str, int], target: tuple[str, int]) -> None:
        self.target = target
        self.sock = socket.create_server(listen)
        self.sock.settimeout(0.2)
        self.closed = threading.Event()
        self.conns: list[socket.socket] = []
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        while not self.closed.is_set():
            try:
                client, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            client.settimeout(None)
            self.conns += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self.closed.set()
        self.sock.close()
        for s in self.conns:
            s.close()
        self.thread.join(timeout=5)


@pytest.fixture
def forward() -> Iterator[Callable[[tuple[str, int], tuple[str, int]], Forwarder]]:
    """Factory: forward((listen_ip, port), (target_ip, port)); all closed at teardown."""
    made: list[Forwarder] = []

    def factory(listen: tuple[str, int], target: tuple[str, int]) -> Forwarder:
        f = Forwarder(listen, target)
        made.append(f)
        return f

    try:
        yield factory
    finally:
        for f in made:
            f.close()


# ---------------------------------------------------------------------------- SIGSTOP
@contextlib.contextmanager
def frozen(*procs: DisqueProcess) -> Iterator[None]:
    """SIGSTOP the nodes for the block, SIGCONT them after it even when it fails: a frozen
    node stays "reachable" to the others until the node timeout, and answers late."""
    for p in procs:
        assert p.proc is not None
        p.proc.send_signal(signal.SIGSTOP)
    try:
        yield
    finally:
        for p in procs:
            if p.alive():
                p.proc.send_signal(signal.SIGCONT)  # type: ignore[union-attr]
