"""Seeded fuzzing of a real node's cluster bus port: frames of every message type, built by
the real encoder with random (mostly valid, sometimes absurd) fields and a sender that is a
real member of the cluster, then mutated (bytes flipped, cut short, length prefix changed,
random bytes). A node must close a link on a bad frame and never crash, hang or stop
serving: afterwards it answers clients, and the cluster is a full mesh again.

Long mode: DISQUE_FUZZ_INPUTS=500000; the count of frames sent is printed.
"""

from __future__ import annotations

import os
import random
import socket

from disque.cluster import messages as bus
from disque.cluster.messages import GossipEntry, Header, JobRecord
from tests.cluster.conftest import Cluster, cmd, myid

INPUTS = int(os.environ.get("DISQUE_FUZZ_INPUTS", "3000"))
BATCH = 20  # frames per connection before a new one


def random_frame(r: random.Random, sender: bytes, port: int, job_ids: list[bytes]
                 ) -> tuple[bytes, bool]:
    """A frame, and whether it was mutated (then probably bad: the node closes the link)."""
    h = Header(sender, b"", port, port + 10000, r.choice([0, 32, 1 << 16, r.getrandbits(63)]))
    jid = r.choice(job_ids)
    n = lambda: r.choice([0, 1, 2, 5, 3600, 2**32, 2**63 - 1])  # noqa: E731
    kind = r.randrange(9)
    if kind == 0:
        msg: bus.Message = bus.Ping(h, [GossipEntry(r.choice([sender, b"f" * 40]), b"127.0.0.1",
                                                    n() % 65536, n() % 65536,
                                                    r.getrandbits(8), n(), n())
                                        for _ in range(r.randrange(3))])
    elif kind == 1:
        rec = JobRecord(jid, r.choice([b"fq", b""]), b"x" * r.randrange(50), n() % 8, n(), n(),
                        n() % 100, n() % 100, n() % 5, n() % 5, (sender,))
        msg = bus.ReplJob(h, rec, r.random() < 0.5)
    elif kind == 2:
        msg = bus.NeedJobs(h, b"fq", n())
    elif kind == 3:
        msg = bus.PauseQueue(h, b"fq", r.randrange(4))
    else:
        cls = r.choice([bus.GotJob, bus.EnqueueJob, bus.Queued, bus.SetAck, bus.WillQueue,
                        bus.GotAck, bus.DelJob, bus.WorkingJob])
        msg = cls(h, jid, n() % 4)
    frame = bytearray(msg.encode())
    m = r.randrange(10)
    if m == 0:  # flip bytes
        for _ in range(r.randrange(1, 4)):
            i = r.randrange(len(frame))
            frame[i] = r.randrange(256)
    elif m == 1:  # cut short
        frame = frame[:r.randrange(1, len(frame))]
    elif m == 2:  # another length prefix
        frame[:4] = r.choice([0, 1, len(frame) + 100, 2**31]).to_bytes(4, "big")
    elif m == 3:
        frame = bytearray(r.randbytes(r.randrange(1, 64)))
    return bytes(frame), m < 4


def test_random_bus_frames_never_crash_or_stall_a_node(cluster) -> None:  # type: ignore[no-untyped-def]
    c: Cluster = cluster(3)
    target, peer = c[0], c[1]
    sender = myid(peer).encode()
    job_ids = [str(cmd(target, "ADDJOB", "fq", f"b{i}", 5000, "REPLICATE", 2)).encode()
               for i in range(5)] + [b"D-00000000-" + b"A" * 24 + b"-05a1"]
    r = random.Random(1)
    sent = 0
    while sent < INPUTS:
        # A connection ends after a mutated frame, and the fuzzer reads until the node closes
        # it: so the node has read every frame counted (none is lost in a socket the node
        # already closed on an earlier bad frame).
        try:
            with socket.create_connection(("127.0.0.1", target.port + 10000), timeout=5) as s:
                for _ in range(BATCH):
                    frame, mutated = random_frame(r, sender, peer.port, job_ids)
                    s.sendall(frame)
                    sent += 1
                    if mutated:
                        break
                s.shutdown(socket.SHUT_WR)
                while s.recv(65536):
                    pass
        except OSError:
            pass  # reset by the node on a bad frame
    print(f"\nbus-port fuzz: {sent} frames, each read by the node")
    assert target.alive(), target.output()[-2000:]
    # every bad frame refused by the decoder (a logged link error), none by an exception
    # escaping to the event loop: on the compiled build, a field of the wrong type reaching
    # a typed constructor is a TypeError the decoder must have refused first
    assert "Traceback" not in target.output(), target.output()[-4000:]
    assert cmd(target, "PING") == "PONG"
    c.wait_mesh()
