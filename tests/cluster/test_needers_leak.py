"""Unanswered NEEDJOBS are forgotten (found by a 3-node soak): Node.needers (cluster/jobs.py,
NEEDER_HOLD_MS) lost an entry only when a job was later queued into that queue here, so a
node asked for many short-lived queue names (per-request reply queues, per-tenant queues)
kept ~480 bytes per name forever, visible only in RSS (~24 MB per 50,000 names), and a
non-empty `needers` turned off ADDJOB's fast path. The sans-I/O test is in
tests/unit/test_cluster_jobs.py; this one shows it on real processes through the RSS.
"""

from __future__ import annotations

import pytest

from tests.cluster.conftest import cmd, ok, parse_fields
from tests.harness import wait_for


def _info(proc) -> dict[str, str]:
    return parse_fields(cmd(proc, "INFO"))


@pytest.mark.slow
def test_asking_for_many_short_lived_queues_does_not_grow_the_other_node(cluster) -> None:
    c = cluster(2)
    asker, other = c[0], c[1]
    for p in c:
        ok(p, "CONFIG", "SET", "queue-idle-timeout", 1)

    def round_of(tag: str, n_cmds: int) -> None:
        for k in range(n_cmds):
            names = [f"{tag}-{k}-{i}" for i in range(1000)]
            cmd(asker, "GETJOB", "TIMEOUT", 1, "FROM", *names, timeout=30)
        wait_for(lambda: int(_info(asker)["registered_queues"]) == 0, timeout=60,
                 what="the asker's queues evicted")

    round_of("warmup", 20)  # let the allocator and the bus buffers reach their size
    rss0 = int(_info(other)["used_memory_rss"])
    for r in range(4):
        round_of(f"r{r}", 25)  # 100,000 queue names asked for in total
    info = _info(other)
    grown = (int(info["used_memory_rss"]) - rss0) / 2**20
    assert info["registered_queues"] == "0" and info["registered_jobs"] == "0"
    assert grown < 12, f"idle node grew {grown:.1f} MB after 100k NEEDJOBS for gone queues"
