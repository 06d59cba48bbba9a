"""nodes.conf that cannot be written (checklist §4 CLUSTER SAVECONFIG error, §7 "rewritten
whenever membership/flags change")."""

from __future__ import annotations

import shutil

from tests.cluster.conftest import cluster_nodes, cmd, myid, ok
from tests.harness import wait_for
from tests.integration.resp import Err


def _break_nodes_conf(p) -> None:
    path = p.workdir / "nodes.conf"
    path.unlink()
    (path / "x").mkdir(parents=True)  # rename(tmp, nodes.conf) now fails: Is a directory


def test_saveconfig_error_names_the_os_error(cluster):
    c = cluster(1, meet=None)
    p = c[0]
    _break_nodes_conf(p)
    try:
        reply = cmd(p, "CLUSTER", "SAVECONFIG")
        assert isinstance(reply, Err) and str(reply).startswith(
            "ERR error saving the cluster node config: "), reply
    finally:
        shutil.rmtree(p.workdir / "nodes.conf")


def test_failed_automatic_save_does_not_break_the_command_or_the_bus(cluster):
    """A membership change whose nodes.conf rewrite fails (disk full, read-only fs...) must
    not turn the command into an internal error or drop the bus effects queued with it
    (the original exits with "can't update cluster config file" instead)."""
    c = cluster(3, meet=None)
    a, b, d = c
    ok(b, "CLUSTER", "MEET", "127.0.0.1", a.port)
    c.wait_mesh([a, b])
    _break_nodes_conf(a)
    try:
        ok(d, "CLUSTER", "MEET", "127.0.0.1", a.port)
        wait_for(lambda: myid(d) in cluster_nodes(a) and cluster_nodes(d)[myid(a)].flags
                 == ["noflags"], timeout=10, what="the node still adding members")
        assert "Traceback" not in a.output(), a.output()[-3000:]
        reply = cmd(a, "CLUSTER", "FORGET", myid(b))
        assert reply == "OK", reply
    finally:
        shutil.rmtree(a.workdir / "nodes.conf")
    conf = a.workdir / "nodes.conf"
    wait_for(lambda: conf.is_file() and myid(d) in conf.read_text()
             and myid(b) not in conf.read_text(), timeout=10,
             what="the failed nodes.conf write retried once the path is writable")
