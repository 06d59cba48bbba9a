"""`make test` / `make test-fast` fail now and then with "server.listen_failed ... address
already in use" at a node's start (seen here: tests/cluster/test_jobs.py::
test_jobs_added_on_random_nodes_are_all_obtainable_on_one_node, port 34699, while other
processes on the machine were opening client connections).

free_port() takes the port the kernel gives to bind(("127.0.0.1", 0)), i.e. one from the
ephemeral range, and closes it; the kernel hands the same range to every outgoing connection,
so until the server binds it any client socket on the machine can take it. Ports below the
ephemeral range are never handed out implicitly.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.harness import free_port

RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")


@pytest.mark.skipif(not RANGE_FILE.exists(), reason="Linux only")
def test_free_port_avoids_the_ephemeral_range() -> None:
    lo, hi = (int(x) for x in RANGE_FILE.read_text().split())
    if lo - 10000 <= 1024:
        pytest.skip("no room below the ephemeral range on this machine")
    for _ in range(20):
        p = free_port()
        assert not lo <= p <= hi, f"client port {p} is in the ephemeral range {lo}-{hi}"
        assert not lo <= p + 10000 <= hi, f"bus port {p + 10000} is in the ephemeral range"


def test_free_port_never_hands_out_a_port_twice_in_a_process() -> None:
    """A test's cluster takes all its ports before any server binds them: two nodes given
    the same port (or one's client port equal to another's bus port) made one node exit
    with 'address already in use' (seen in CI)."""
    ports = [free_port() for _ in range(300)]
    taken = set(ports) | {p + 10000 for p in ports}
    assert len(taken) == 2 * len(ports)


def test_port_slices_of_parallel_test_workers_are_disjoint(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Two pytest-xdist workers draw from their own shares (DISQUE_PORT_SLICE): no port one
    hands out, client or bus, is one the other can hand out."""
    from disque.tools import ports

    def share(spec: str) -> set[int]:
        monkeypatch.setenv("DISQUE_PORT_SLICE", spec)
        lo, hi = ports._ephemeral_range()
        every = [p for p in range(ports._LOWEST, 65536 - 10000)
                 if not lo <= p <= hi and not lo <= p + 10000 <= hi]
        mine = ports._slice(every, 10000)
        assert len(mine) >= 1000, spec
        return set(mine) | {p + 10000 for p in mine}

    assert not share("0/2") & share("1/2")
    assert not share("0/3") & share("2/3")
    monkeypatch.setenv("DISQUE_PORT_SLICE", "1/2")
    assert free_port() in ports._slice(list(range(ports._LOWEST, 65536)), 10000)
