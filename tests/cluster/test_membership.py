"""Cluster bus and membership with real processes (issue 4, checklist §7, §9, §13).

Every cluster here is formed the way a user forms one: CLUSTER MEET to a single node, gossip
does the rest. The failure-detection tests run with cluster-node-timeout 1000 ms
(NODE_TIMEOUT) so that a killed node is flagged `fail` within a few seconds, the others with
the calm default (5 s); every wait is a poll with a generous deadline. The tests that only read
a formed cluster or send it frames it must refuse share one with other calm tests
(`shared_cluster`); those that form, reset, forget, kill or reconfigure nodes start their own.
"""

from __future__ import annotations

import re
import socket
import time

import pytest

from disque.cluster.messages import VERSION, Header, Ping
from tests.cluster.conftest import (
    NODE_TIMEOUT,
    NodeLine,
    cluster_info,
    cluster_nodes,
    cmd,
    hello,
    holds_for,
    myid,
    ok,
    parse_fields,
    reachable,
)
from tests.harness import DisqueProcess, free_port, wait_for
from tests.integration.resp import Conn, Err, Status

HEX40 = re.compile(r"[0-9a-f]{40}")
FLAG_NAMES = {"myself", "fail?", "fail", "handshake", "noaddr", "leaving", "noflags"}


def flags_of(proc: DisqueProcess, node_id: str) -> list[str] | None:
    line = cluster_nodes(proc).get(node_id)
    return None if line is None else line.flags


def priority_of(proc: DisqueProcess, node_id: str) -> bytes | None:
    entry = hello(proc).get(node_id)
    return None if entry is None else entry[3]


def nodes_conf_ids(proc: DisqueProcess) -> dict[str, list[str]]:
    text = (proc.workdir / "nodes.conf").read_text()
    return {NodeLine(line).id: NodeLine(line).flags for line in text.splitlines()
            if line and not line.startswith("vars ")}


# ---------------------------------------------------------------------------- forming
@pytest.mark.parametrize("n", [3, 5])
def test_meeting_one_node_makes_a_full_mesh(cluster, n):
    c = cluster(n)  # every node met node 0 only; the fixture waited for the full mesh
    ids = c.ids()
    assert len(set(ids)) == n, "every node has a distinct ID"
    for p in c:
        info = cluster_info(p)
        assert info["cluster_known_nodes"] == str(n)
        assert info["cluster_size"] == str(n)
        assert set(cluster_nodes(p)) == set(ids)


def test_a_chain_of_meets_converges_to_a_full_mesh(cluster):
    c = cluster(4, meet="chain")  # 0 meets 1, 1 meets 2, 2 meets 3
    ids = set(c.ids())
    for p in c:
        assert set(cluster_nodes(p)) == ids


def test_the_users_story_two_meets_then_hello(cluster):
    """The issue's example: node 1 meets nodes 2 and 3; HELLO on node 2 lists all three."""
    c = cluster(3, meet=None)
    for p in c.nodes[1:]:
        assert cmd(c[0], "CLUSTER", "MEET", "127.0.0.1", p.port) == Status("OK")
    c.wait_mesh()
    entries = hello(c[1])
    assert set(entries) == set(c.ids())
    assert {int(e[2]) for e in entries.values()} == {p.port for p in c}


def test_meet_accepts_a_host_name(cluster):
    c = cluster(2, meet=None)
    ok(c[0], "CLUSTER", "MEET", "localhost", c[1].port)
    c.wait_mesh()
    assert hello(c[0])[myid(c[1])][1] == b"127.0.0.1"


# ---------------------------------------------------------------------------- reply shapes
def test_hello_lists_every_node_with_bulk_port_and_priority(shared_cluster):
    c = shared_cluster(3)
    ids = c.ids()
    port_of = {i: p.port for i, p in zip(ids, c, strict=True)}
    for p, me in zip(c, ids, strict=True):
        reply = cmd(p, "HELLO")
        assert reply[0] == 1 and type(reply[0]) is int
        assert reply[1] == me.encode()
        assert len(reply) == 2 + len(c)
        seen = set()
        for entry in reply[2:]:
            assert len(entry) == 4
            assert all(type(x) is bytes for x in entry), f"all four are bulk strings: {entry}"
            node_id, ip, port, prio = (x.decode() for x in entry)
            assert HEX40.fullmatch(node_id)
            assert ip == "127.0.0.1"
            assert int(port) == port_of[node_id]
            assert prio == "1"
            seen.add(node_id)
        assert seen == set(ids)


def test_cluster_nodes_lines_have_six_fields_and_one_myself(shared_cluster):
    c = shared_cluster(3)
    ids = c.ids()
    port_of = {i: p.port for i, p in zip(ids, c, strict=True)}
    now_ms = time.time() * 1000
    for p, me in zip(c, ids, strict=True):
        text = cmd(p, "CLUSTER", "NODES").decode()
        assert text.endswith("\n") and "\r" not in text
        lines = [NodeLine(line) for line in text[:-1].split("\n")]
        assert {n.id for n in lines} == set(ids)
        mine = [n for n in lines if "myself" in n.flags]
        assert len(mine) == 1 and mine[0].id == me
        assert mine[0].flags == ["myself"]
        assert (mine[0].ping_sent, mine[0].pong_received) == (0, 0)
        for n in lines:
            assert set(n.flags) <= FLAG_NAMES
            assert n.addr == f"127.0.0.1:{port_of[n.id]}"
            assert n.link == "connected"
            if n.id != me:
                assert n.flags == ["noflags"]
                assert abs(n.pong_received - now_ms) < 60_000, "pong times are unix ms"
                assert n.ping_sent == 0 or abs(n.ping_sent - now_ms) < 60_000


def test_cluster_info_fields_in_order(shared_cluster):
    c = shared_cluster(3)
    raw = cmd(c[0], "CLUSTER", "INFO").decode()
    assert raw.endswith("\r\n")
    keys = [line.split(":")[0] for line in raw.split("\r\n") if line]
    assert keys == ["cluster_state", "cluster_known_nodes", "cluster_reachable_nodes",
                    "cluster_size", "cluster_stats_messages_sent",
                    "cluster_stats_messages_received"]
    info = parse_fields(raw)
    assert info["cluster_state"] == "ok"
    assert (info["cluster_known_nodes"], info["cluster_reachable_nodes"],
            info["cluster_size"]) == ("3", "2", "3")
    assert int(info["cluster_stats_messages_sent"]) > 0
    assert int(info["cluster_stats_messages_received"]) > 0


def test_info_cluster_section_counts_nodes_and_bus_messages(shared_cluster):
    c = shared_cluster(3)
    info = parse_fields(cmd(c[0], "INFO", "cluster"))
    assert info["cluster_nodes"] == "3"
    assert info["cluster_reachable_nodes"] == "2"
    assert info["cluster_failing_nodes"] == "0"
    assert info["cluster_leaving_nodes"] == "0"
    assert info["cluster_handshake_nodes"] == "0"
    for key in ("bus_messages_sent", "bus_messages_received", "bus_bytes_sent",
                "bus_bytes_received"):
        assert int(info[key]) > 0, key
    # (a row per message type seen: the links of a fresh cluster open with MEETs, and the
    # PINGs of the cron follow within half a node timeout)
    wait_for(lambda: all(k in parse_fields(cmd(c[0], "INFO", "cluster"))
                         for k in ("bus_ping", "bus_pong")), timeout=10)
    info = parse_fields(cmd(c[0], "INFO", "cluster"))
    for name in ("bus_ping", "bus_pong"):
        assert re.fullmatch(r"sent=\d+,sent_bytes=\d+,received=\d+,received_bytes=\d+",
                            info[name]), info[name]


def test_nodes_conf_keeps_every_known_node(shared_cluster):
    c = shared_cluster(3)
    ids = c.ids()
    for p, me in zip(c, ids, strict=True):
        ok(p, "CLUSTER", "SAVECONFIG")
        saved = nodes_conf_ids(p)
        assert set(saved) == set(ids)
        assert saved[me] == ["myself"]


# ---------------------------------------------------------------------------- failures
def test_killed_node_is_failed_everywhere_and_rejoins_with_its_id(cluster):
    c = cluster(3, node_timeout=NODE_TIMEOUT)
    victim = c[2]
    vid = myid(victim)
    others = c.nodes[:2]
    victim.kill()  # SIGKILL
    wait_for(lambda: all("fail" in flags_of(p, vid) for p in others), timeout=20,
             what="the killed node flagged fail on every other node")
    for p in others:
        assert priority_of(p, vid) == b"100"
        assert reachable(p) == 1
        assert parse_fields(cmd(p, "INFO", "cluster"))["cluster_failing_nodes"] == "1"

    victim.start()  # same port, same dir: nodes.conf gives back the identity and the peers
    assert myid(victim) == vid
    c.wait_mesh()  # nobody met it again: it rejoined from its nodes.conf
    for p in others:
        flags = flags_of(p, vid)
        assert "fail" not in flags and "fail?" not in flags, flags
        assert priority_of(p, vid) == b"1"


def test_second_server_on_the_same_dir_refuses_to_start(cluster):
    c = cluster(1, meet=None)
    first = c[0]
    me = myid(first)
    twin = DisqueProcess(first.workdir, port=free_port())
    twin.start(wait=False)
    try:
        assert twin.proc is not None
        assert twin.proc.wait(timeout=30) != 0
    finally:
        twin.kill()
    assert "already used by a different Disque node" in first.output()
    assert cmd(first, "PING") == Status("PONG")
    assert myid(first) == me


# ---------------------------------------------------------------------------- FORGET
def test_forget_removes_a_node_and_gossip_does_not_re_add_it(cluster):
    c = cluster(4)
    gone = c[3]
    gid = myid(gone)
    rest = c.nodes[:3]
    # Forget on one node first: the other two keep gossiping about it (with 4 nodes every
    # gossip section names it), and the blacklist must keep it out.
    ok(rest[0], "CLUSTER", "FORGET", gid)
    holds_for(lambda: gid not in cluster_nodes(rest[0]), 2.0,
              "a forgotten node staying out while others still gossip about it")
    for p in rest[1:]:
        ok(p, "CLUSTER", "FORGET", gid)
    # It is still running and pinging them; nobody adds it back.
    holds_for(lambda: all(gid not in cluster_nodes(p) for p in rest), 3.0,
              "the forgotten node staying forgotten everywhere")
    for p in rest:
        info = cluster_info(p)
        assert (info["cluster_known_nodes"], info["cluster_reachable_nodes"]) == ("3", "2")
        assert gid not in hello(p)
    assert gone.alive()


def test_forgotten_node_is_re_added_by_gossip_once_the_blacklist_expires(cluster):
    """FORGET on one node only: the others keep gossiping about the node, so after the
    blacklist (cluster-forget-ttl, 60 s by default; set to 5 s here with CONFIG SET) it comes
    back by itself."""
    c = cluster(3)
    gid = myid(c[2])
    ok(c[0], "CONFIG", "SET", "cluster-forget-ttl", "5")
    ok(c[0], "CLUSTER", "FORGET", gid)
    holds_for(lambda: gid not in cluster_nodes(c[0]), 2.0, "the blacklist", interval=0.2)
    wait_for(lambda: gid in cluster_nodes(c[0]) and reachable(c[0]) == 2, timeout=40,
             what="the node re-added by gossip after the blacklist expired")


def test_cluster_forget_errors(server):
    me = myid(server)
    assert cmd(server, "CLUSTER", "FORGET", me) == Err(
        "ERR I tried hard but I can't forget myself...")
    unknown = "f" * 40
    assert cmd(server, "CLUSTER", "FORGET", unknown) == Err(f"ERR Unknown node {unknown}")
    assert cmd(server, "CLUSTER", "FORGET", "abc") == Err("ERR Invalid node identifier")


def test_meet_by_host_name_keeps_the_pipeline_in_order_and_the_node_serving(cluster):
    """A host name is resolved off the event loop while the client waits: the commands it
    pipelined behind the MEET are answered after it, in order."""
    c = cluster(2, meet=None)
    conn = Conn(c[0].port)
    assert conn.pipeline([("CLUSTER", "MEET", "localhost", c[1].port), ("PING",),
                          ("CLUSTER", "MEET", "no-such-host.invalid", 7711), ("ECHO", "x"),
                          ("CLUSTER", "MEET", "localhost", 60000)]) == [
        Status("OK"), Status("PONG"),
        Err("ERR Invalid node address specified: no-such-host.invalid:7711"), b"x",
        Err("ERR Invalid node address specified: localhost:60000")]
    c.wait_mesh()


def test_client_gone_while_its_meet_resolves_leaves_the_node_serving(cluster):
    c = cluster(2, meet=None)
    for _ in range(20):
        conn = Conn(c[0].port)
        conn.send_cmd("CLUSTER", "MEET", "localhost", c[1].port)
        conn.close()
    assert cmd(c[0], "PING") == Status("PONG")
    c.wait_mesh()


def test_cluster_meet_errors(server):
    assert cmd(server, "CLUSTER", "MEET", "127.0.0.1", "nope") == Err(
        "ERR Invalid TCP port specified: nope")
    assert cmd(server, "CLUSTER", "MEET", "127.0.0.1", "60000") == Err(
        "ERR Invalid node address specified: 127.0.0.1:60000")
    assert cmd(server, "CLUSTER", "MEET", "no-such-host.invalid", "7711") == Err(
        "ERR Invalid node address specified: no-such-host.invalid:7711")
    assert cmd(server, "CLUSTER", "MEET", "127.0.0.1") == Err(
        "ERR Wrong CLUSTER subcommand or number of arguments")


# ---------------------------------------------------------------------------- LEAVING
def test_leaving_is_mirrored_by_every_node_and_cleared(cluster):
    c = cluster(3)
    leaver = c[1]
    lid = myid(leaver)
    others = [c[0], c[2]]
    assert cmd(leaver, "CLUSTER", "LEAVING") == Status("no")
    ok(leaver, "CLUSTER", "LEAVING", "yes")
    assert cmd(leaver, "CLUSTER", "LEAVING") == Status("yes")
    assert flags_of(leaver, lid) == ["myself", "leaving"]
    wait_for(lambda: all(flags_of(p, lid) == ["leaving"] and priority_of(p, lid) == b"100"
                         for p in others),
             timeout=10, what="every node showing the leaving flag and priority 100")
    for p in others:
        info = parse_fields(cmd(p, "INFO", "cluster"))
        assert info["cluster_leaving_nodes"] == "1"
        assert info["cluster_reachable_nodes"] == "1", "a leaving node is not a replica target"

    ok(leaver, "CLUSTER", "LEAVING", "no")
    wait_for(lambda: all(flags_of(p, lid) == ["noflags"] and priority_of(p, lid) == b"1"
                         for p in others),
             timeout=10, what="the leaving flag cleared everywhere")
    c.wait_mesh()


def test_cluster_leaving_rejects_other_values(server):
    assert cmd(server, "CLUSTER", "LEAVING", "maybe") == Err(
        "ERR Wrong argument for CLUSTER LEAVING. Use 'yes' or 'no'")


# ---------------------------------------------------------------------------- RESET
def test_reset_hard_gives_new_ids_and_the_cluster_forms_again(cluster):
    """The original suite's setup: RESET HARD every node, then meet them again."""
    c = cluster(3)
    old = c.ids()
    for p in c:
        ok(p, "CLUSTER", "RESET", "HARD")
    new = c.ids()
    assert all(HEX40.fullmatch(i) for i in new)
    assert not set(old) & set(new)
    for p, me in zip(c, new, strict=True):
        assert set(cluster_nodes(p)) == {me}
        assert nodes_conf_ids(p) == {me: ["myself"]}
    c.meet_via_first()
    c.wait_mesh()
    for p in c:
        assert set(cluster_nodes(p)) == set(new)


def test_reset_soft_keeps_the_id_and_forgets_the_others(cluster):
    c = cluster(2)
    me = myid(c[0])
    ok(c[0], "CLUSTER", "RESET", "SOFT")
    assert myid(c[0]) == me
    assert set(cluster_nodes(c[0])) == {me}
    assert cmd(c[0], "CLUSTER", "RESET", "MAYBE") == Err("ERR syntax error")


# ---------------------------------------------------------------------------- config
def test_node_timeout_set_at_run_time_drives_failure_detection(cluster):
    c = cluster(3, node_timeout=15000)
    victim = c[2]
    vid = myid(victim)
    for p in c.nodes[:2]:
        ok(p, "CONFIG", "SET", "cluster-node-timeout", "500")
    victim.kill()
    # With the 15 s the nodes started with, nothing could be flagged within 10 s.
    wait_for(lambda: all("fail" in flags_of(p, vid) for p in c.nodes[:2]), timeout=10,
             what="failure detected with the run-time node timeout")


def test_config_rewrite_keeps_the_node_timeout(make_server):
    proc = make_server(config_text="loglevel notice\n")
    ok(proc, "CONFIG", "SET", "cluster-node-timeout", "1234")
    assert cmd(proc, "CONFIG", "GET", "cluster-node-timeout") == [b"cluster-node-timeout",
                                                                 b"1234"]
    ok(proc, "CONFIG", "REWRITE")
    conf = proc.workdir / "disque.conf"
    assert "cluster-node-timeout 1234" in conf.read_text().splitlines()
    proc.stop()
    proc.config_text = conf.read_text()  # start again from the rewritten file
    proc.start()
    assert cmd(proc, "CONFIG", "GET", "cluster-node-timeout") == [b"cluster-node-timeout",
                                                                 b"1234"]


# ---------------------------------------------------------------------------- bad input
def _wrong_version_frame() -> bytes:
    frame = bytearray(Ping(Header(b"a" * 40, b"", 1, 10001, 0), []).encode())
    assert frame[5] == VERSION  # length (4), fixarray marker, then the version
    frame[5] = VERSION + 1
    return bytes(frame)


BAD_FRAMES = [
    # (what, bytes, the reason the node logs)
    ("garbage in a frame", b"\x00\x00\x00\x08" + b"\xc1" * 8, "malformed msgpack"),
    ("oversized length prefix", b"\x7f\xff\xff\xff" + b"x" * 64, "exceeds the limit"),
    ("wrong protocol version", _wrong_version_frame(),
     f"unsupported bus protocol version {VERSION + 1}"),
]


def _bus_link_closed(port: int, payload: bytes, timeout: float = 10.0) -> bytes:
    """Send `payload` to the bus port; return what came back before the node closed the
    link (fails if it stays open)."""
    with socket.create_connection(("127.0.0.1", port + 10000), timeout=timeout) as s:
        s.sendall(payload)
        got = b""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                data = s.recv(65536)
            except ConnectionResetError:
                return got
            except TimeoutError:
                break
            if not data:
                return got
            got += data
    raise AssertionError(f"bus link still open after {payload[:16]!r}...")


def test_bad_frames_on_the_bus_close_the_link_and_leave_the_node_healthy(shared_cluster):
    c = shared_cluster(3)
    ids_before = [set(cluster_nodes(p)) for p in c]
    # One kind of bad frame per node: the node logs each kind of link error at most once
    # every 10 s.
    for p, (what, payload, reason) in zip(c, BAD_FRAMES, strict=True):
        assert _bus_link_closed(p.port, payload) == b"", what
        wait_for(lambda p=p, reason=reason: "bus.bad_frame" in p.output()
                 and reason in p.output(), timeout=10, what=f"a log line for {what}")
    # A port scanner's HTTP request: its first 4 bytes read as a ~1 GB length.
    _bus_link_closed(c[0].port, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    for p, before in zip(c, ids_before, strict=True):
        assert p.alive()
        assert cmd(p, "PING") == Status("PONG")
        assert set(cluster_nodes(p)) == before
    assert c.meshed()


def test_half_a_frame_then_hang_up_is_harmless(shared_cluster):
    c = shared_cluster(2)
    frame = Ping(Header(b"b" * 40, b"", 1, 10001, 0), []).encode()
    with socket.create_connection(("127.0.0.1", c[0].port + 10000), timeout=5) as s:
        s.sendall(frame[: len(frame) // 2])
    assert cmd(c[0], "PING") == Status("PONG")
    holds_for(lambda: c.meshed(), 1.0, "the mesh")


# ---------------------------------------------------------------------------- password
def test_cluster_password_mesh_forms(cluster):
    c = cluster(3, args=["--cluster-password", "s3cret"])
    assert set(cluster_nodes(c[0])) == set(c.ids())


@pytest.mark.parametrize("odd_args", [["--cluster-password", "other"], []],
                         ids=["wrong-password", "no-password"])
def test_cluster_password_mismatch_is_refused(cluster, odd_args):
    c = cluster(3, args=["--cluster-password", "s3cret"])
    odd = cluster(1, args=odd_args, meet=None, name="odd")[0]
    odd_id = myid(odd)
    ok(c[0], "CLUSTER", "MEET", "127.0.0.1", odd.port)  # we connect to it
    ok(odd, "CLUSTER", "MEET", "127.0.0.1", c[1].port)  # it connects to us

    def refused() -> bool:
        return (all(reachable(p) == 2 and odd_id not in cluster_nodes(p) for p in c)
                and reachable(odd) == 0)

    def views() -> dict[int, str]:
        return {p.port: cmd(p, "CLUSTER", "NODES").decode() for p in [*c.nodes, odd]}

    holds_for(refused, 3.0, "the odd node staying out of the cluster", detail=views)
    wait_for(lambda: "bus.auth_refused" in c[1].output(), timeout=10,
             what="the refusal logged by the node it tried to join")
    if odd_args:
        wait_for(lambda: "bus.auth_refused" in odd.output(), timeout=10,
                 what="the refusal logged by the odd node")


# ---------------------------------------------------------------------------- announce
def test_announced_ip_is_what_the_others_see(cluster):
    c = cluster(2)
    x = cluster(1, meet=None, name="announcer",
                args=["--bind", "127.0.0.1", "127.0.0.2",
                      "--cluster-announce-ip", "127.0.0.2"])[0]
    xid = myid(x)
    ok(x, "CLUSTER", "MEET", "127.0.0.1", c[0].port)
    everyone = [*c.nodes, x]
    c.wait_mesh(everyone)
    for p in everyone:
        entry = hello(p)[xid]
        assert entry[1:3] == [b"127.0.0.2", str(x.port).encode()], entry
        assert cluster_nodes(p)[xid].addr == f"127.0.0.2:{x.port}"


def test_announced_port_behind_a_port_forward(cluster, forward):
    """A node in a "container": it listens on 127.0.0.1:P but the cluster reaches it only
    through 127.0.0.2:Q (and Q + 10000 for the bus), which it announces."""
    c = cluster(2)
    public = free_port()
    x = cluster(1, meet=None, name="natted",
                args=["--cluster-announce-ip", "127.0.0.2",
                      "--cluster-announce-port", str(public)])[0]
    forward(("127.0.0.2", public), ("127.0.0.1", x.port))
    forward(("127.0.0.2", public + 10000), ("127.0.0.1", x.port + 10000))
    xid = myid(x)
    ok(c[0], "CLUSTER", "MEET", "127.0.0.2", public)
    everyone = [*c.nodes, x]
    c.wait_mesh(everyone)
    for p in everyone:
        assert hello(p)[xid][1:3] == [b"127.0.0.2", str(public).encode()]
    with socket.create_connection(("127.0.0.2", public), timeout=5) as s:
        s.sendall(b"PING\r\n")
        assert s.recv(64).startswith(b"+PONG")


def test_config_set_announce_ip_is_not_silently_ignored(server):
    """CONFIG SET cluster-announce-ip/port must either be refused or be advertised at once
    (HELLO, the bus header); accepting it and going on with the old address is neither."""
    me = myid(server)
    public = free_port()
    got_ip = cmd(server, "CONFIG", "SET", "cluster-announce-ip", "127.0.0.2")
    got_port = cmd(server, "CONFIG", "SET", "cluster-announce-port", str(public))
    entry = hello(server)[me]
    if got_ip == "OK":
        assert entry[1] == b"127.0.0.2", f"accepted but HELLO still shows {entry[1]!r}"
    else:
        assert isinstance(got_ip, Err)
    if got_port == "OK":
        assert entry[2] == str(public).encode(), f"accepted but HELLO still shows {entry[2]!r}"
    else:
        assert isinstance(got_port, Err)
