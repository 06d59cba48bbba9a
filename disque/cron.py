"""The server's cron: periodic housekeeping at `hz` times a second.

Each run refreshes the server's cached monotonic time (clients stamp their last interaction
with it), samples the counters behind INFO's instantaneous rates, keeps the memory peak,
closes idle clients (`timeout`) and those over the soft output-buffer limit for too long,
lets the AOF do its periodic work (everysec fsync, scheduled rewrites), runs the collector
policy, and re-arms the node's timer. The node's own timers do not wait for the cron: the
server arms a loop timer for the wheel's next bucket (Iteration.arm_timer).
"""

from __future__ import annotations

import gc
import time
from collections import deque
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import asyncio

    from disque.server import Server


class Cron:
    """The periodic run, its samples of the counters, and the collector's schedule."""

    def __init__(self, server: Server) -> None:
        self.server = server
        # (monotonic s, commands, input bytes, output bytes) at each of the last runs
        self.ops_samples: deque[tuple[float, int, int, int]] = deque(maxlen=16)
        self.gc_full_at = time.monotonic()
        self.handle: asyncio.TimerHandle | None = None

    def run(self) -> None:
        """Periodic housekeeping at `hz`."""
        server = self.server
        now = time.monotonic()
        shared = server.shared
        shared.now_mono = now
        cfg = server.cfg
        self.ops_samples.append((now, server.dispatch.stat_commands, shared.stat_net_input,
                                 shared.stat_net_output))
        used = server.node.used_memory()
        if used > server.peak_memory:
            server.peak_memory = used
        if cfg.timeout:
            for c in list(server.clients.values()):
                if (c.waiter is None and not c.monitor
                        and now - c.last_interaction > cfg.timeout):
                    c.close()
        if shared.obuf_soft:
            for c in list(server.clients.values()):
                if c.transport is not None and not c.closing:
                    c.check_output_limits(c.transport.get_write_buffer_size())
        server.aofm.cron()
        self.gc_tick()
        server.iteration.arm_timer()
        hz = min(max(cfg.hz, 1), 500)
        assert server.loop is not None
        self.handle = server.loop.call_later(1 / hz, self.run)

    def gc_tick(self) -> None:
        """Garbage-collector policy, run from the cron.

        Every job is a GC-tracked object and a node holds millions of them, none in a
        reference cycle; letting the collector traverse them over and over cost a quarter
        of ADDJOB's time, and a full collection of a million jobs stalls for ~0.3 s. So
        automatic collection is off: each cron tick collects the young objects created since
        the last tick and freezes the survivors (each object is traversed once). Cycles that
        outlive a tick are broken explicitly where they form (client <-> waiter <-> timer,
        see Client.connection_lost); as a safety net a full collection runs every minute
        while the node holds few enough jobs for it to be quick. (Not judged by
        gc.get_freeze_count(): it walks the whole frozen heap, and once a node held 200k
        jobs it did so at every tick, 80% of the node's time with 600k jobs.)
        """
        gc.collect(1)
        now = self.server.shared.now_mono
        if now - self.gc_full_at >= 60:
            self.gc_full_at = now
            if len(self.server.node.jobs) < 200_000:
                gc.unfreeze()
                gc.collect()
        gc.freeze()

    def instantaneous(self) -> tuple[int, float, float]:
        """ops/sec and input/output kbps over the recent cron samples."""
        if len(self.ops_samples) < 2:
            return 0, 0.0, 0.0
        t0, c0, i0, o0 = self.ops_samples[0]
        t1, c1, i1, o1 = self.ops_samples[-1]
        dt = max(t1 - t0, 1e-6)
        return int((c1 - c0) / dt), (i1 - i0) / dt / 1024, (o1 - o0) / dt / 1024
