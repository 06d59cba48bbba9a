"""Seeded command fuzzing of a real 3-node cluster with the AOF on: random commands from
the whole client API, with option values chosen to hit edges (negative, zero, huge,
non-numeric, 2^63-1), real and malformed job IDs, several queues, PAUSE and CLUSTER LEAVING
flips. Every reply must be a reply (no internal error, no hang), every node must stay up,
and after kill -9 every node must reload from its AOF the long-lived jobs it held.

Run by hand with ADDJOB timeouts of 0 and 20,000 commands, this fuzzer found the sync
ADDJOB with `TTL 9223372036854775807` that never returned (test_jobs.py pins that case).
"""

from __future__ import annotations

import os
import random
from typing import Any

import pytest
import redis

from tests.cluster.conftest import Cluster, cmd
from tests.integration.resp import pairs

NUMBERS = ["0", "1", "2", "-1", "5", "100", "1000", "abc", "", "1.5", "-0", "3600", "86400",
           "65535", "65536", " 1", "315360000", "315360001", "99999999999999999999",
           "9223372036854775807", "-9223372036854775808"]
QUEUES = ["q1", "q2", "q3", "", "q\x00z"]
BAD_IDS = ["D-00000000-AAAAAAAAAAAAAAAAAAAAAAAA-05a1", "D-bad", "x" * 40]
# Long mode: DISQUE_FUZZ_COMMANDS=500000 (per seed); the count sent is printed.
# DISQUE_FUZZ_SEEDS=1,2,3: other seeds, each on a cluster of its own.
COMMANDS = int(os.environ.get("DISQUE_FUZZ_COMMANDS", "2500"))
SEEDS = [int(s) for s in os.environ.get("DISQUE_FUZZ_SEEDS", "1,2").split(",")]


def random_command(r: random.Random, ids: list[str]) -> list[str]:
    q = r.choice(QUEUES)
    kind = r.randrange(30)
    if kind < 6:
        # ms-timeout never 0 here: 0 blocks until replicated, and a copy ignored by a
        # node whose queue is paused for input is, by the spec, waited for forever
        args = ["ADDJOB", q, r.choice(["body", "", "x" * r.randrange(1, 3000)]),
                r.choice(["100", "300", "-1", "abc"])]
        for _ in range(r.randrange(4)):
            opt = r.choice(["REPLICATE", "DELAY", "RETRY", "TTL", "MAXLEN", "ASYNC", "DEDUP",
                            "FOO"])
            args.append(opt)
            if opt != "ASYNC" and r.random() < 0.95:
                args.append(r.choice(["k1", "k2", ""]) if opt == "DEDUP"
                            else r.choice(NUMBERS))
        return args
    if kind < 10:
        args = ["GETJOB"]
        for _ in range(r.randrange(4)):
            opt = r.choice(["NOHANG", "COUNT", "TIMEOUT", "WITHCOUNTERS"])
            args.append(opt)
            if opt == "COUNT":
                args.append(r.choice(NUMBERS))
            elif opt == "TIMEOUT":
                args.append(r.choice(["1", "10", "50", "0x"]))
        if "TIMEOUT" not in args and "NOHANG" not in args:
            args += ["TIMEOUT", "10"]
        if r.random() < 0.95:
            args += ["FROM", *r.sample(QUEUES, r.randrange(1, 4))]
        return args
    if kind < 20:
        return [r.choice(["ACKJOB", "FASTACK", "WORKING", "NACK", "ENQUEUE", "DEQUEUE",
                          "DELJOB", "SHOW"]), *(r.choice(ids) for _ in range(r.randrange(4)))]
    if kind < 24:
        name = r.choice(["QLEN", "QSTAT", "QPEEK", "PAUSE"])
        args = [name, q]
        if name == "QPEEK":
            args.append(r.choice(NUMBERS))
        if name == "PAUSE":
            args += r.sample(["in", "out", "all", "none", "state", "bcast", "bad"],
                             r.randrange(0, 3))
        return args
    if kind < 27:
        args = [r.choice(["QSCAN", "JSCAN"])]
        if r.random() < 0.7:
            args.append(r.choice(["0", *NUMBERS]))
        for _ in range(r.randrange(3)):
            opt = r.choice(["COUNT", "BUSYLOOP", "MINLEN", "MAXLEN", "IMPORTRATE", "QUEUE",
                            "STATE", "REPLY"])
            args.append(opt)
            if opt != "BUSYLOOP":
                args.append(r.choice([*NUMBERS, "all", "id", "queued", "active", "acked",
                                      "wait-repl", q]))
        return args
    return r.choice([["INFO"], ["INFO", "jobs"], ["HELLO"], ["CLUSTER", "INFO"],
                     ["CLUSTER", "NODES"], ["CONFIG", "GET", "*"], ["CLIENT", "LIST"],
                     ["PING"], ["CLUSTER", "LEAVING", r.choice(["yes", "no", "no", "maybe"])],
                     ["BGREWRITEAOF"]])


def collect_ids(args: list[str], reply: Any, ids: list[str]) -> None:
    if args[0] == "ADDJOB" and isinstance(reply, bytes):
        ids.append(reply.decode())
    elif args[0] == "GETJOB" and isinstance(reply, list):
        ids.extend(item[1].decode() for item in reply)
    del ids[len(BAD_IDS):-200]


@pytest.mark.parametrize("seed", SEEDS)
def test_random_commands_never_crash_hang_or_lose_the_aof(cluster: Any, seed: int) -> None:
    c: Cluster = cluster(3, args=["--appendonly", "yes", "--appendfsync", "always"])
    clients = [redis.Redis(port=p.port, protocol=2, socket_timeout=15) for p in c]
    r = random.Random(seed)
    ids = list(BAD_IDS)
    errors: dict[str, int] = {}
    for _ in range(COMMANDS):
        args = random_command(r, ids)
        try:
            reply = r.choice(clients).execute_command(*args)
        except redis.ResponseError as exc:
            text = str(exc)
            assert "internal error" not in text, (args, text)
            errors[text.split(" ")[0]] = errors.get(text.split(" ")[0], 0) + 1
            continue
        collect_ids(args, reply, ids)
    assert all(p.alive() for p in c)
    for p in c:  # no exception reached the event loop (a closed connection, not a reply)
        assert "Traceback" not in p.output(), p.output()[-4000:]
    print(f"\nclient-port fuzz: {COMMANDS} commands, {sum(errors.values())} error replies")
    # the fuzz reaches the error paths, not only successes
    assert sum(errors.values()) > COMMANDS // 5
    # Jobs that cannot expire or be collected during the restart must all come back: the
    # fuzz's own (how many survive it depends on timing) and one known job per node.
    sentinels = {}
    for p in c:
        assert cmd(p, "CLUSTER", "LEAVING", "no") == "OK"  # a leaving node keeps no copy
        sentinels[p.port] = str(cmd(p, "ADDJOB", "sentinel", "kept", 0, "REPLICATE", 1,
                                    "TTL", 3600))
    lasting = {p.port: long_lived_jobs(p) for p in c}
    for p in c:
        assert sentinels[p.port] in lasting[p.port]
    for p in c:
        p.kill()
    for p in c:
        p.start()
    for p in c:
        for job_id in lasting[p.port]:
            assert cmd(p, "SHOW", job_id) is not None, (p.port, job_id)
    for client in clients:
        client.close()


def long_lived_jobs(p: Any) -> list[str]:
    """IDs of the node's queued or active jobs with more than a minute left to live."""
    reply = cmd(p, "JSCAN", "BUSYLOOP")
    out = []
    for raw in reply[1]:
        job_id = str(raw)
        show = cmd(p, "SHOW", job_id)
        if show is not None:
            fields = pairs(show)
            if fields["state"] in (b"queued", b"active") and fields["ttl"] > 60:
                out.append(job_id)
    return out
