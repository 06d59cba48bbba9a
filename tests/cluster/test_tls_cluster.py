"""`tls-cluster yes` (issue 23): the cluster bus over mutual TLS, on real processes. Every node
presents its certificate and verifies the other's against tls-ca-cert-file; jobs replicate
and federate as on a plain bus; a node whose certificate another CA signed, and a node that
speaks plain text, are refused on the bus and the refusal logged (bus.tls_refused)."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

from tests.cluster.conftest import cluster_info, cluster_nodes, cmd, ok
from tests.harness import DisqueProcess, wait_for
from tests.tlscerts import closed_by_peer, make_pki


def tls_args(crt: Path, key: Path, ca: Path) -> list[str]:
    return ["--tls-cluster", "yes", "--tls-cert-file", str(crt), "--tls-key-file", str(key),
            "--tls-ca-cert-file", str(ca)]


def test_a_tls_cluster_replicates_federates_and_refuses_nodes_without_the_cas_certificate(
        cluster: Any, tmp_path: Path) -> None:
    pki = make_pki(tmp_path / "pki")
    # with cluster-password too: the HMAC challenge runs inside the TLS links
    c = cluster(3, args=[*tls_args(pki.server_crt, pki.server_key, pki.ca),
                         "--cluster-password", "s3cret"])
    a, b, d = c.nodes
    # replication: the copies reach the other two nodes over TLS links
    jid = cmd(a, "ADDJOB", "tlsq", "a secret body", 0, "REPLICATE", 3)
    for p in (b, d):
        wait_for(lambda p=p: cmd(p, "SHOW", jid) is not None, what="the copy on " + str(p.port))
    # federation: a GETJOB on b gets a job only a holds
    jid2 = cmd(a, "ADDJOB", "tlsfed", "moved", 0, "REPLICATE", 1, "RETRY", 30)
    got = cmd(b, "GETJOB", "TIMEOUT", 10000, "FROM", "tlsfed")
    assert got == [[b"tlsfed", jid2.encode(), b"moved"]], got
    assert cmd(b, "ACKJOB", jid2) == 1
    # the bus port speaks only TLS: plain bytes are refused, and logged
    with socket.create_connection(("127.0.0.1", a.port + 10000), timeout=10) as s:
        s.sendall(b"\x00" * 64)
        assert closed_by_peer(s)
    wait_for(lambda: "bus.tls_refused" in a.output(), what="the refusal logged")
    # a node with a certificate from another CA, and a plain-text node: never joined
    rogue = DisqueProcess(tmp_path / "rogue", args=tls_args(pki.rogue_crt, pki.rogue_key,
                                                             pki.rogue_ca))
    plain = DisqueProcess(tmp_path / "plain")
    for p in (rogue, plain):
        p.start()
    try:
        # (one after the other: bus.connect_failed is logged once per 10 s, whatever the peer)
        ok(a, "CLUSTER", "MEET", "127.0.0.1", rogue.port)
        wait_for(lambda: "CERTIFICATE_VERIFY_FAILED" in a.output(),
                 what="a's link to the rogue node failing on its certificate")
        ok(a, "CLUSTER", "MEET", "127.0.0.1", plain.port)
        # a's TLS handshake reached the plain node's bus, which refused it as a bad frame
        wait_for(lambda: "bus.bad_frame" in plain.output(), what="the plain bus refusing TLS")
        ids = {cmd(p, "CLUSTER", "MYID") for p in (rogue, plain)}
        for view in (cluster_nodes(a), cluster_nodes(b)):
            joined = [n for n in view.values() if n.id in ids and "handshake" not in n.flags]
            assert not joined, joined
        assert cluster_info(rogue)["cluster_known_nodes"] == "1"
        # the TLS cluster is still whole
        c.wait_mesh()
    finally:
        for p in (rogue, plain):
            p.kill()
    for p in c.nodes:
        assert "Traceback" not in p.output()
