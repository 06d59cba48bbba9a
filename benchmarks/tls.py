"""`make bench`'s tls scenario (`python -m benchmarks.run --only tls`): what TLS costs
(issue 23), against what it costs Redis in the same run.

- One node: ADDJOB (disque-py) and LPUSH (redis-server, Debian's build has TLS) at
  pipeline 1 and 16 from `clients` connections, on the plain port and on the TLS port
  (`redis-benchmark --tls --cacert`); the TLS rate over the plain rate, for each.
- A PING client's p99 alone and while 200 clients keep making TLS handshakes on the TLS
  port (the handshakes must not stall the loop for others).
- Three nodes: ADDJOB REPLICATE 3 (pipeline 1 and 16) against node 0's plain client port,
  on a cluster with a plain bus and on one with `tls-cluster yes`: what the encrypted bus
  costs a replicated write.

Certificates: a throwaway CA and one node certificate (disque.tools.certs). The target,
printed PASS / MISS: TLS costs disque-py at most what it costs Redis, as a ratio (ours /
plain >= redis's / plain) on the one-node rows.
"""

from __future__ import annotations

import socket
import ssl
import threading
import time
from pathlib import Path
from typing import Any

from benchmarks.run import (
    Load,
    Options,
    Server,
    disque_server,
    redis_benchmark,
    redis_server,
    start_cluster,
)
from disque.tools.certs import make_ca, make_cert
from disque.tools.ports import free_port

PIPELINES = (1, 16)
HANDSHAKERS = 200  # clients making TLS handshakes while a PING client measures its latency


def _ratio(tls: Load, plain: Load) -> float | None:
    if tls.ok and plain.ok and plain.rps:
        return round((tls.rps or 0.0) / plain.rps, 3)
    return None


def _cell(load: Load) -> dict[str, Any]:
    return {"rps": load.rps, "p50_ms": load.p50_ms, "p99_ms": load.p99_ms, "error": load.error,
            "partial": load.partial}


def ping_under_handshakes(port: int, tls_port: int, ca: Path, o: Options, say: Any,
                          storm: int = HANDSHAKERS) -> dict[str, Any]:
    """PING latency of one plain client, alone and while `storm` threads keep making TLS
    handshakes (connect, handshake, close, again) on the TLS port: the handshakes must not
    stall the event loop for other clients."""
    ctx = ssl.create_default_context(cafile=str(ca))
    ctx.check_hostname = False
    stop = threading.Event()
    done = [0]

    def handshaker() -> None:
        while not stop.is_set():
            try:
                with socket.create_connection(("127.0.0.1", tls_port), timeout=10) as raw, \
                        ctx.wrap_socket(raw):
                    done[0] += 1
            except OSError:
                time.sleep(0.01)

    n = 20_000
    alone = redis_benchmark(port, ["PING"], n, 1, 1, o.time_limit)
    threads = [threading.Thread(target=handshaker, daemon=True) for _ in range(storm)]
    for t in threads:
        t.start()
    t0 = time.monotonic()
    try:
        during = redis_benchmark(port, ["PING"], n, 1, 1, o.time_limit)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=30)
    rate = done[0] / (time.monotonic() - t0)
    say(f"  tls PING p99 alone {alone.p99_ms} ms, during {storm} handshaking clients "
        f"({rate:,.0f} handshakes/s) {during.p99_ms} ms")
    return {"alone": _cell(alone), "during": _cell(during), "handshakers": storm,
            "handshakes_per_s": round(rate)}


def scenario_tls(workdir: Path, cpus: set[int] | None, o: Options, quick: bool,
                 say: Any) -> dict[str, Any]:
    t = workdir / "tls"
    ca, _ = make_ca(t, "ca")
    crt, key = make_cert(t, "node", "ca", "node")
    files = ["--tls-cert-file", str(crt), "--tls-key-file", str(key), "--tls-ca-cert-file",
             str(ca), "--tls-auth-clients", "no"]
    bench_tls = ["--tls", "--cacert", str(ca)]
    out: dict[str, Any] = {"single": {}, "cluster": {}}

    def loads(server_port: int, tls_port: int, command: list[str], flavor: str) -> None:
        for p in PIPELINES:
            n = o.requests(p) // (4 if quick else 1)
            plain = redis_benchmark(server_port, command, n, p, o.clients, o.time_limit)
            tls = redis_benchmark(tls_port, command, n, p, o.clients, o.time_limit, bench_tls)
            row = {"plain": _cell(plain), "tls": _cell(tls), "tls_over_plain": _ratio(tls, plain)}
            out["single"][f"{flavor} P{p}"] = row
            say(f"  tls {flavor} P{p}: plain {plain.rps or 0:,.0f}/s, TLS {tls.rps or 0:,.0f}/s, "
                f"TLS/plain {row['tls_over_plain']}")

    tls_port = free_port()
    node = disque_server(workdir, cpus, extra=["--tls-port", str(tls_port), *files])
    try:
        node.start()
        loads(node.port, tls_port, ["ADDJOB", "q", "0123456789abcdef", "0"], "disque")
        out["handshakes"] = ping_under_handshakes(node.port, tls_port, ca, o, say)
    finally:
        node.stop()
    rtls = free_port()
    r = redis_server(workdir, cpus)
    r.cmd += ["--tls-port", str(rtls), "--tls-cert-file", str(crt), "--tls-key-file", str(key),
              "--tls-ca-cert-file", str(ca), "--tls-auth-clients", "no"]
    try:
        r.start()
        loads(r.port, rtls, ["LPUSH", "q", "0123456789abcdef"], "redis")
        out["redis_handshakes"] = ping_under_handshakes(r.port, rtls, ca, o, say)
    finally:
        r.stop()
    for name, extra in (("plain bus", []), ("tls bus", ["--tls-cluster", "yes", *files])):
        servers: list[Server] = start_cluster(workdir / name.replace(" ", "-"), cpus, size=3,
                                              extra=extra)
        try:
            for p in PIPELINES:
                n = (o.cluster_n if p == 1 else o.cluster_n * 4) // (4 if quick else 1)
                load = redis_benchmark(servers[0].port, ["ADDJOB", "q", "0123456789abcdef",
                                                         "0", "REPLICATE", "3"],
                                       n, p, 20, o.time_limit)
                out["cluster"][f"{name} P{p}"] = _cell(load)
                say(f"  tls 3 nodes ADDJOB REPLICATE 3 P{p}, {name}: {load.rps or 0:,.0f}/s "
                    f"p99 {load.p99_ms} ms")
        finally:
            for s in servers:
                s.stop()
    for p in PIPELINES:
        plain, tls = out["cluster"][f"plain bus P{p}"], out["cluster"][f"tls bus P{p}"]
        if plain["rps"] and tls["rps"]:
            out["cluster"][f"tls over plain P{p}"] = round(tls["rps"] / plain["rps"], 3)
    out["targets"] = [
        {"target": f"P{p}: TLS/plain of disque-py >= TLS/plain of Redis",
         "ours": out["single"][f"disque P{p}"]["tls_over_plain"],
         "redis": out["single"][f"redis P{p}"]["tls_over_plain"]}
        for p in PIPELINES]
    for target in out["targets"]:
        ours, theirs = target["ours"], target["redis"]
        target["ok"] = None if ours is None or theirs is None else ours >= theirs
    return out


def print_tls(out: dict[str, Any], say: Any = print) -> None:
    say("tls (one node, plain port against TLS port, same run; 3 nodes: plain bus against "
        "tls-cluster)")
    for key, row in out["single"].items():
        say(f"  {key:<12} plain {row['plain']['rps'] or 0:>10,.0f}/s  TLS "
            f"{row['tls']['rps'] or 0:>10,.0f}/s  TLS/plain {row['tls_over_plain']}")
    for key, value in out["cluster"].items():
        if isinstance(value, dict):
            say(f"  3 nodes R3 {key:<14} {value['rps'] or 0:>10,.0f}/s  p99 {value['p99_ms']} ms")
        else:
            say(f"  3 nodes R3 {key:<14} {value}")
    for who, key in (("disque", "handshakes"), ("redis", "redis_handshakes")):
        hs = out.get(key)
        if hs:
            say(f"  {who} PING p99 alone {hs['alone']['p99_ms']} ms, while {hs['handshakers']} "
                f"clients make TLS handshakes ({hs['handshakes_per_s']:,}/s) "
                f"{hs['during']['p99_ms']} ms")
    for target in out["targets"]:
        verdict = {True: "PASS", False: "MISS", None: "n/a "}[target["ok"]]
        say(f"  {verdict}  {target['target']} ({target['ours']} vs {target['redis']})")
