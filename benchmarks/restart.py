"""`make bench`'s restart scenario (`python -m benchmarks.run --only restart`): how soon the
peers of a node restarted after kill -9 see it again (issue 12: "within ~50 ms of answering";
the original's test "Sync REPLJOB messages are retried against old nodes" kills a node just
after restarting it).

Three fresh nodes in a mesh; `runs` times: SIGKILL the third, wait until both peers show its
link down, start it again on the same port and directory (same node ID), take the instant it
answers PING, then poll both peers' CLUSTER NODES every millisecond until each shows it
connected with no failure flag. Reported: milliseconds from the PING answer to the second
peer's view, per run. With --disque-cmd the same runs on three original nodes.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

from benchmarks.loadgen import Client

RUNS = 5
POLL_S = 0.001


def _peer_view(port: int, node_id: str) -> tuple[bool, str]:
    """(connected with no failure flag, the CLUSTER NODES line) of `node_id` seen at `port`."""
    with Client(port, timeout=2) as c:
        raw = c.call("CLUSTER", "NODES")
    text = raw.decode() if isinstance(raw, bytes) else str(raw)
    for line in text.splitlines():
        f = line.split()
        if f and f[0] == node_id:
            flags = f[2].split(",") if len(f) > 2 else []
            ok = "connected" in f and not ({"fail", "fail?", "handshake", "noaddr"} & set(flags))
            return ok, line
    return False, ""


def _myid(port: int) -> str:
    with Client(port, timeout=2) as c:
        raw = c.call("CLUSTER", "MYID")
    return raw.decode() if isinstance(raw, bytes) else str(raw)


def _wait(cond: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(POLL_S)


def measure_restarts(servers: list[Any], runs: int = RUNS) -> list[float]:
    """Milliseconds from the restarted node's first PING answer to both peers seeing it."""
    x, peers = servers[-1], servers[:-1]
    xid = _myid(x.port)
    out = []
    for _ in range(runs):
        assert x.proc is not None
        x.proc.kill()
        x.proc.wait()
        _wait(lambda: not any(_peer_view(p.port, xid)[0] for p in peers), 30,
              "the peers to see the killed node's link down")
        x.start(poll=POLL_S)
        t0 = time.monotonic()
        _wait(lambda: all(_peer_view(p.port, xid)[0] for p in peers), 30,
              "the peers to see the restarted node")
        out.append((time.monotonic() - t0) * 1000)
    return out


def scenario_restart(workdir: Path, cpus: set[int] | None, say: Any,
                     original_cmd: list[str] | None = None) -> dict[str, Any]:
    from benchmarks.run import start_cluster

    result: dict[str, Any] = {}
    flavors = [("disque", None)] + ([("original", original_cmd)] if original_cmd else [])
    for flavor, cmd in flavors:
        servers: list[Any] = []
        try:
            servers = start_cluster(workdir / f"restart-{flavor}", cpus, cmd=cmd,
                                    flavor=flavor)
            ms = measure_restarts(servers)
            result[flavor] = {"ms": [round(v, 1) for v in ms],
                              "median_ms": round(statistics.median(ms), 1),
                              "max_ms": round(max(ms), 1)}
        except (OSError, RuntimeError) as exc:
            result[flavor] = {"error": str(exc)}
        finally:
            for s in servers:
                s.stop()
        say(f"  restart -> seen by both peers, {flavor}: {result[flavor]}")
    return result


def print_restart(result: dict[str, Any], say: Any = print) -> None:
    say("")
    say("restart (kill -9 one of 3 nodes, start it again): ms from its first PING answer to "
        "both peers showing it connected")
    for flavor, r in result.items():
        if "error" in r:
            say(f"  {flavor:<9} error: {r['error']}")
        else:
            say(f"  {flavor:<9} median {r['median_ms']:.1f} ms, max {r['max_ms']:.1f} ms, "
                f"runs {r['ms']}")
