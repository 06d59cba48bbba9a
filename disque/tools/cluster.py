"""A local cluster for development: N `disque-server` processes on consecutive ports.

    python -m disque.tools.cluster start [--nodes 3] [--port 7711] [--dir run/cluster]
                                         [--timeout MS] [--wait SECONDS] [--http-offset 1000]
    python -m disque.tools.cluster stop [--dir run/cluster]
    python -m disque.tools.cluster status [--dir run/cluster] [--port PORT]

`start` runs every node daemonized (detached from the terminal) in its own directory
`<dir>/node-<port>` with its log in `log.txt` and its pid in `disque.pid` there, has the first
node CLUSTER MEET each of the others (gossip completes the mesh), waits until every node sees
the N-1 others as reachable, and prints each node's address and ID. Starting again on the
same directory brings the same nodes back: their identities and peers are in their nodes.conf.

`stop` sends SIGTERM to every node with a pid file under `<dir>` and waits for it to exit;
`status` prints CLUSTER NODES as the first (lowest-port) node sees it.

The bus of each node listens on port + 10000, on 127.0.0.1 only (the server's default bind).
Each node also serves its dashboard and /metrics on port + 1000 (`--http-offset`, 0 = off);
`start` prints the dashboard addresses.

`start --tls` (`make cluster TLS=1`) makes a throwaway CA and a certificate per node (and a
client certificate) under `<dir>/tls` with the openssl tool, and runs every node with the
bus over mutual TLS (`tls-cluster yes`), HTTPS on the HTTP side (`tls-http yes`) and a TLS
client port at port + 2000 (`--tls-offset`) beside its plain one (which this tool, on
127.0.0.1, talks to); clients may present the client certificate (`tls-auth-clients
optional`). It prints the `redis-cli --tls` line to use.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import hiredis

from disque.tools.certs import CertError, make_ca, make_cert

DEFAULT_DIR = "run/cluster"
DEFAULT_PORT = 7711
DEFAULT_NODES = 3
HOST = "127.0.0.1"
PID_FILE = "disque.pid"
LOG_FILE = "log.txt"


class ToolError(Exception):
    """Reported on stderr, exit status 1."""


# ---------------------------------------------------------------------------- talking to nodes
def call(port: int, *args: Any, timeout: float = 5.0) -> Any:
    """Send one command to 127.0.0.1:port and return its reply (errors raise ToolError)."""
    parts = [b"*%d\r\n" % len(args)]
    for a in args:
        data = a if isinstance(a, bytes) else str(a).encode()
        parts.append(b"$%d\r\n%s\r\n" % (len(data), data))
    reader = hiredis.Reader()
    with socket.create_connection((HOST, port), timeout=timeout) as s:
        s.sendall(b"".join(parts))
        while True:
            data = s.recv(65536)
            if not data:
                raise ConnectionError(f"node {HOST}:{port} closed the connection")
            reader.feed(data)
            reply = reader.gets()
            if reply is not False:
                break
    if isinstance(reply, hiredis.ReplyError):
        raise ToolError(f"{HOST}:{port}: {reply}")
    return reply


def cluster_info(port: int) -> dict[str, str]:
    text = call(port, "CLUSTER", "INFO").decode()
    return dict(line.split(":", 1) for line in text.split("\r\n") if ":" in line)


def ping(port: int) -> bool:
    try:
        return call(port, "PING", timeout=1.0) == b"PONG"
    except OSError:
        return False


# ---------------------------------------------------------------------------- processes
def node_dir(base: Path, port: int) -> Path:
    return base / f"node-{port}"


def node_dirs(base: Path) -> list[tuple[int, Path]]:
    """(port, dir) of every node directory under `base`, lowest port first."""
    found = []
    if base.is_dir():
        for d in base.iterdir():
            name = d.name
            if d.is_dir() and name.startswith("node-") and name[5:].isdigit():
                found.append((int(name[5:]), d))
    return sorted(found)


def read_pid(d: Path) -> int | None:
    try:
        return int((d / PID_FILE).read_text().strip())
    except (OSError, ValueError):
        return None


def running(pid: int) -> bool:
    """Is `pid` alive and a disque server (not a recycled pid of something else)?"""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return False  # someone else's process: not one of ours
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return True  # no /proc: trust the pid file
    return b"disque" in cmdline


def log_tail(d: Path, lines: int = 20) -> str:
    try:
        text = (d / LOG_FILE).read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


def port_free(port: int) -> bool:
    """Can a server listen on HOST:port (a port in TIME_WAIT counts as free)?"""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((HOST, port))
        except OSError:
            return False
    return True


def spawn(port: int, d: Path, timeout_ms: int | None, extra: list[str]) -> None:
    """Start one daemonized node in `d`; return once the launcher process has detached."""
    d.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "disque", "--port", str(port), "--dir", str(d.resolve()),
           "--logfile", LOG_FILE, "--pidfile", PID_FILE, "--daemonize", "yes"]
    if timeout_ms is not None:
        cmd += ["--cluster-node-timeout", str(timeout_ms)]
    cmd += extra
    # The launcher forks the daemon and exits at once; config errors come out before that.
    done = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, timeout=60,
                          start_new_session=True)
    if done.returncode != 0:
        raise ToolError(f"node {port} did not start (exit {done.returncode}):\n"
                        f"{done.stderr.decode(errors='replace').strip()}")


def wait_until(cond: Any, deadline: float, interval: float = 0.05) -> bool:
    while True:
        if cond():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)


# ---------------------------------------------------------------------------- commands
def start(args: argparse.Namespace) -> int:
    if args.nodes < 1:
        raise ToolError("--nodes must be at least 1")
    base = Path(args.dir)
    ports = list(range(args.port, args.port + args.nodes))
    if ports[-1] + 10000 > 65535:
        raise ToolError("ports too high: the cluster bus needs port + 10000 <= 65535")
    extra = ["--cluster-password", args.password] if args.password else []
    http = args.http_offset
    if http and ports[-1] + http > 65535:
        raise ToolError("ports too high for --http-offset: port + offset must be <= 65535")
    for port in ports:  # check everything before starting anything
        d = node_dir(base, port)
        pid = read_pid(d)
        if pid is not None and running(pid):
            raise ToolError(f"a node is already running in {d} (pid {pid}): run `stop` first")
        for p in (port, port + 10000, *((port + http,) if http else ())):
            if not port_free(p):
                raise ToolError(f"port {p} is already in use on {HOST}")
    tls = args.tls_offset if args.tls else 0
    if tls and ports[-1] + tls > 65535:
        raise ToolError("ports too high for --tls-offset: port + offset must be <= 65535")
    if tls:
        for port in ports:
            if not port_free(port + tls):
                raise ToolError(f"port {port + tls} is already in use on {HOST}")
        ca = make_tls_files(base, ports)
    for port in ports:
        spawn(port, node_dir(base, port), args.timeout,
              extra + (["--http-port", str(port + http)] if http else [])
              + (tls_args(base, ca, port, tls) if tls else []))

    deadline = time.monotonic() + args.wait
    for port in ports:
        d = node_dir(base, port)

        def up(d: Path = d, port: int = port) -> bool:
            pid = read_pid(d)
            return pid is not None and running(pid) and ping(port)

        if not wait_until(up, deadline):
            raise ToolError(f"node {port} is not answering; its log ({d / LOG_FILE}):\n"
                            f"{log_tail(d)}")

    first = ports[0]
    for port in ports[1:]:
        call(first, "CLUSTER", "MEET", HOST, port)

    def meshed() -> bool:
        try:
            return all(int(cluster_info(p)["cluster_reachable_nodes"]) == len(ports) - 1
                       for p in ports)
        except (OSError, KeyError, ValueError):
            return False

    if not wait_until(meshed, deadline, interval=0.1):
        views = "\n".join(f"{HOST}:{p}\n{call(p, 'CLUSTER', 'NODES').decode()}" for p in ports)
        raise ToolError(f"no full mesh within {args.wait:g}s (nodes left running; `stop` "
                        f"stops them):\n{views}")
    for port in ports:
        node_id = call(port, "CLUSTER", "MYID").decode()
        print(f"{HOST}:{port} {node_id} {node_dir(base, port)}")
    print(f"{len(ports)} node(s) in a full mesh; the bus listens on port + 10000. "
          f"Stop them with: python -m disque.tools.cluster stop --dir {base}")
    scheme = "https" if tls else "http"
    if http:
        print(f"dashboard: {scheme}://{HOST}:{ports[0] + http}/ (every node serves one, and "
              f"/metrics, on its port + {http})")
    if tls:
        t = base / "tls"
        print(f"TLS: the bus is mutual TLS; each node's TLS client port is its port + {tls}; "
              f"certificates in {t}:")
        print(f"  redis-cli -p {ports[0] + tls} --tls --cacert {t / 'ca.crt'} PING")
        if http:
            print(f"  curl --cacert {t / 'ca.crt'} https://{HOST}:{ports[0] + http}/metrics")
    return 0


def make_tls_files(base: Path, ports: list[int]) -> Path:
    """A throwaway CA and one certificate per node under <base>/tls (kept when present, so
    that a restart of the same cluster keeps its certificates): the CA's path."""
    t = base / "tls"
    t.mkdir(parents=True, exist_ok=True)
    try:
        if not (t / "ca.crt").exists():
            make_ca(t, "ca")
        for port in ports:
            if not (t / f"node-{port}.crt").exists():
                make_cert(t, f"node-{port}", "ca", f"node-{port}")
        if not (t / "client.crt").exists():
            make_cert(t, "client", "ca", "client", node=False)
    except CertError as exc:
        raise ToolError(str(exc)) from None
    return t / "ca.crt"


def tls_args(base: Path, ca: Path, port: int, offset: int) -> list[str]:
    t = (base / "tls").resolve()
    return ["--tls-port", str(port + offset), "--tls-cluster", "yes", "--tls-http", "yes",
            "--tls-cert-file", str(t / f"node-{port}.crt"),
            "--tls-key-file", str(t / f"node-{port}.key"),
            "--tls-ca-cert-file", str(ca.resolve()), "--tls-auth-clients", "optional"]


def stop(args: argparse.Namespace) -> int:
    base = Path(args.dir)
    signalled: list[tuple[int, int, Path]] = []
    for port, d in node_dirs(base):
        pid = read_pid(d)
        if pid is None:
            continue
        if not running(pid):
            print(f"{HOST}:{port} not running (stale pid file removed)")
            (d / PID_FILE).unlink(missing_ok=True)
            continue
        os.kill(pid, signal.SIGTERM)
        signalled.append((port, pid, d))
    if not signalled:
        print(f"no running node under {base}")
        return 0
    deadline = time.monotonic() + args.wait
    stuck = []
    for port, pid, d in signalled:
        if wait_until(lambda pid=pid: not running(pid), deadline):
            (d / PID_FILE).unlink(missing_ok=True)
            print(f"{HOST}:{port} stopped (pid {pid})")
        else:
            stuck.append(f"{HOST}:{port} (pid {pid})")
    if stuck:
        raise ToolError(f"still running after {args.wait:g}s: {', '.join(stuck)}")
    return 0


def status(args: argparse.Namespace) -> int:
    port = args.port
    if port is None:
        dirs = node_dirs(Path(args.dir))
        if not dirs:
            raise ToolError(f"no node directories under {args.dir}")
        port = dirs[0][0]
    try:
        text = call(port, "CLUSTER", "NODES").decode()
    except OSError as exc:
        raise ToolError(f"{HOST}:{port} is not answering ({exc})") from None
    sys.stdout.write(text)
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m disque.tools.cluster",
                                description="Run a local disque-py cluster for development.")
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("start", help="start N nodes, meet them, wait for the full mesh")
    s.add_argument("--nodes", type=int, default=DEFAULT_NODES, help="how many (default 3)")
    s.add_argument("--port", type=int, default=DEFAULT_PORT,
                   help="client port of the first node; the others follow (default 7711)")
    s.add_argument("--dir", default=DEFAULT_DIR, help="parent directory of the node dirs")
    s.add_argument("--timeout", type=int, default=None, metavar="MS",
                   help="cluster-node-timeout in ms (default: the server's, 15000)")
    s.add_argument("--password", default="", help="cluster-password for every node")
    s.add_argument("--wait", type=float, default=30.0, metavar="SECONDS",
                   help="how long to wait for the nodes and the full mesh (default 30)")
    s.add_argument("--tls", action="store_true",
                   help="make a throwaway CA and a certificate per node under <dir>/tls, and "
                        "run the nodes with tls-cluster, tls-http and a TLS client port")
    s.add_argument("--tls-offset", type=int, default=2000, metavar="N",
                   help="with --tls, each node's tls-port is its port + N (default 2000)")
    s.add_argument("--http-offset", type=int, default=1000, metavar="N",
                   help="each node's http-port (dashboard, /metrics) is its port + N; "
                        "0 turns HTTP off (default 1000)")
    s.set_defaults(func=start)

    t = sub.add_parser("stop", help="SIGTERM every node started under --dir")
    t.add_argument("--dir", default=DEFAULT_DIR)
    t.add_argument("--wait", type=float, default=30.0, metavar="SECONDS")
    t.set_defaults(func=stop)

    u = sub.add_parser("status", help="CLUSTER NODES of the first node")
    u.add_argument("--dir", default=DEFAULT_DIR)
    u.add_argument("--port", type=int, default=None, help="ask this node instead")
    u.set_defaults(func=status)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return args.func(args)
    except ToolError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
