"""Latency monitor: the node's record of the events that stalled its event loop, as Redis's
latency.c (inherited by the original Disque) keeps it; the LATENCY command reads it.

An *event* is a kind of work done on the event loop, named as in Redis where Redis has it:

- `command`: a command (not flagged `fast`) took that long; `fast-command`: a command
  flagged `fast` in COMMAND (constant work) did, which points at the machine, not the command;
- `aof-write`: writing the AOF buffer; `aof-fsync-always`: the fsync of `appendfsync always`;
  `aof-rewrite`: one step of an AOF rewrite (they run on the event loop, in slices);
- `expire-cycle`: one pass of the node's timers (job expiry, requeue, ACK garbage
  collection, queue GC); `eviction-cycle`: one eviction attempt above 95% of maxmemory.

Invariants:
- threshold 0 means off: `start()` returns OFF without reading a clock and nothing is kept;
  otherwise a duration is kept iff it is >= threshold ms. The command path does not call in
  at all unless the duration it already measured for SLOWLOG reaches `min_usec`.
- per event: the all-time maximum and at most HISTORY_LEN (time, ms) samples, oldest first,
  at most one per wall-clock second (a second sample in the same second keeps the larger
  latency). A series exists from its first sample until LATENCY RESET names it.

Sans-I/O: the wall clock (unix ms, the samples' times) and the duration clock (ns, monotonic)
are injected; DOCTOR and GRAPH are built from the samples and the current time only.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Final

HISTORY_LEN: Final = 160  # samples kept per event (Redis's LATENCY_TS_LEN)
GRAPH_COLUMNS: Final = 80  # LATENCY GRAPH: samples per block of rows
GRAPH_ROWS: Final = 4  # LATENCY GRAPH: rows of the sparkline, 3 levels each
OFF: Final = -1  # what start() returns while the monitor is off
NEVER: Final = 1 << 62  # min_usec while off: no measured duration reaches it

COMMAND: Final = "command"
FAST_COMMAND: Final = "fast-command"
AOF_WRITE: Final = "aof-write"
AOF_FSYNC_ALWAYS: Final = "aof-fsync-always"
AOF_REWRITE: Final = "aof-rewrite"
EXPIRE_CYCLE: Final = "expire-cycle"
EVICTION_CYCLE: Final = "eviction-cycle"

_LEVELS: Final = "_o#"  # the sparkline's three levels within a row; '|' fills below them


class EventSeries:
    """The samples of one event: (unix second, ms) oldest first, and the all-time max."""

    __slots__ = ("samples", "max")

    def __init__(self) -> None:
        self.samples: deque[tuple[int, int]] = deque(maxlen=HISTORY_LEN)
        self.max = 0

    def add(self, second: int, ms: int) -> None:
        if ms > self.max:
            self.max = ms
        samples = self.samples
        if samples and samples[-1][0] == second:
            if ms > samples[-1][1]:
                samples[-1] = (second, ms)
            return
        samples.append((second, ms))

    def latest(self) -> tuple[int, int]:
        return self.samples[-1]


class LatencyStats:
    """What DOCTOR says about one event: over the samples kept, their count, integer average,
    mean absolute deviation from that average, and seconds per sample since the oldest."""

    __slots__ = ("samples", "avg", "mad", "period", "max")

    def __init__(self, series: EventSeries, now: int) -> None:
        values = [ms for _, ms in series.samples]
        self.samples = len(values)
        self.avg = sum(values) // self.samples if values else 0
        self.mad = sum(abs(self.avg - v) for v in values) // self.samples if values else 0
        oldest = min((t for t, _ in series.samples), default=now)
        self.period = max(now - oldest, 1) / self.samples if values else 0.0
        self.max = series.max


class LatencyMonitor:
    """The latency events of one node (see the module comment)."""

    __slots__ = ("clock", "perf_ns", "threshold", "min_usec", "events")

    def __init__(self, clock: Callable[[], int], perf_ns: Callable[[], int],
                 threshold: int = 0) -> None:
        self.clock = clock  # unix ms
        self.perf_ns = perf_ns  # monotonic ns, for durations
        self.events: dict[str, EventSeries] = {}
        self.threshold = 0
        self.min_usec = NEVER
        self.set_threshold(threshold)

    @classmethod
    def disabled(cls) -> LatencyMonitor:
        """A monitor that stays off, for code run without a server (tools, tests)."""
        return cls(_no_clock, _no_clock)

    def set_threshold(self, ms: int) -> None:
        """latency-monitor-threshold (ms, 0 = off); takes effect at the next event."""
        self.threshold = ms
        self.min_usec = ms * 1000 if ms > 0 else NEVER

    # ------------------------------------------------------------------ recording
    def start(self) -> int:
        """Before some work: the time to hand to end(), or OFF (no clock read) when off."""
        return self.perf_ns() if self.threshold else OFF

    def end(self, event: str, started: int) -> None:
        """After that work: keep its duration under `event` if it reached the threshold."""
        if started != OFF:
            self.add_sample_if_needed(event, (self.perf_ns() - started) // 1_000_000)

    def add_command_sample(self, fast: bool, usec: int) -> None:
        """A command took `usec` >= min_usec (the caller compared: one test per command)."""
        self.add_sample(FAST_COMMAND if fast else COMMAND, usec // 1000)

    def add_sample_if_needed(self, event: str, ms: int) -> None:
        if self.threshold and ms >= self.threshold:
            self.add_sample(event, ms)

    def add_sample(self, event: str, ms: int) -> None:
        series = self.events.get(event)
        if series is None:
            series = self.events[event] = EventSeries()
        series.add(self.clock() // 1000, ms)

    def reset(self, names: list[str] | None = None) -> int:
        """LATENCY RESET: forget the named series (case-insensitive), or all of them; the
        number of series forgotten."""
        if names is None:
            n = len(self.events)
            self.events.clear()
            return n
        resets = 0
        for name in names:
            folded = name.lower()
            for event in [e for e in self.events if e.lower() == folded]:
                del self.events[event]
                resets += 1
        return resets

    # ------------------------------------------------------------------ reports
    def latest(self) -> list[list[object]]:
        """LATENCY LATEST: [event, time of the latest sample, its ms, all-time max ms]."""
        out: list[list[object]] = []
        for event, series in self.events.items():
            second, ms = series.latest()
            out.append([event.encode(), second, ms, series.max])
        return out

    def history(self, event: str) -> list[list[int]]:
        """LATENCY HISTORY: [time, ms] per sample kept, oldest first ([] if none)."""
        series = self.events.get(event)
        return [] if series is None else [[t, ms] for t, ms in series.samples]

    def graph(self, event: str) -> str | None:
        """LATENCY GRAPH: an ASCII sparkline of the samples kept, or None if there are none.

        As Redis draws it: a title line with the highest and lowest sample kept and the
        all-time high, a rule, then blocks of GRAPH_COLUMNS samples, one column each, GRAPH_ROWS
        rows high (`_`, `o`, `#` for the three levels within a row, `|` below them), scaled
        between the lowest and highest sample; under each column, written downwards, how long
        ago the sample was taken (`12s`, `5m`, `3h`, `2d`)."""
        series = self.events.get(event)
        if series is None or not series.samples:
            return None
        now = self.clock() // 1000
        values = [ms for _, ms in series.samples]
        labels = [_ago(now - t) for t, _ in series.samples]
        low, high = min(values), max(values)
        head = (f"{event} - high {high} ms, low {low} ms (all time high {series.max} ms)\n"
                + "-" * GRAPH_COLUMNS + "\n")
        blocks = [_sparkline(values[i:i + GRAPH_COLUMNS], labels[i:i + GRAPH_COLUMNS],
                             low, high)
                  for i in range(0, len(values), GRAPH_COLUMNS)]
        return head + "\n".join(blocks)

    def doctor(self, slowlog_log_slower_than: int, appendfsync: str) -> str:
        """LATENCY DOCTOR: what was recorded, per event, and advice for the events seen."""
        if not self.events:
            if not self.threshold:
                return ("Latency monitoring is disabled on this node, and no latency event "
                        "was recorded. Use 'CONFIG SET latency-monitor-threshold "
                        "<milliseconds>' to record the events that last at least that "
                        "long.\n")
            return (f"No latency spikes were observed on this node: no event lasted "
                    f"latency-monitor-threshold ({self.threshold} ms) or more since the node "
                    f"started or the last LATENCY RESET.\n")
        now = self.clock() // 1000
        lines = [f"Latency spikes were observed on this node (latency-monitor-threshold "
                 f"is {self.threshold} ms):\n"]
        advice: list[str] = []
        for i, (event, series) in enumerate(self.events.items(), 1):
            st = LatencyStats(series, now)
            lines.append(f"{i}. {event}: {st.samples} latency spikes (average {st.avg}ms, "
                         f"mean deviation {st.mad}ms, period {st.period:.2f} sec). "
                         f"Worst all time event {st.max}ms.")
            for text in _advice(event, self.threshold, slowlog_log_slower_than, appendfsync):
                if text not in advice:
                    advice.append(text)
        if advice:
            lines.append("\nSome advice:\n")
            lines += [f"- {text}" for text in advice]
        else:
            lines.append("\nThere is no easy fix to suggest for these events: please include "
                         "this report when asking for help.")
        return "\n".join(lines) + "\n"


def _no_clock() -> int:
    return 0


def _ago(seconds: int) -> str:
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m"
    if seconds < 86400:
        return f"{seconds // 3600}h"
    return f"{seconds // 86400}d"


def _sparkline(values: list[int], labels: list[str], low: int, high: int) -> str:
    """One block of the graph: GRAPH_ROWS rows of levels, a blank row, the label rows."""
    span = (high - low) or 1
    steps = len(_LEVELS) * GRAPH_ROWS
    levels = [min(max(int(int((v - low) * steps) / span), 0), steps - 1) for v in values]
    rows = []
    for row in range(GRAPH_ROWS):
        base = (GRAPH_ROWS - row - 1) * len(_LEVELS)
        rows.append("".join(
            _LEVELS[lv - base] if 0 <= lv - base < len(_LEVELS)
            else "|" if lv - base >= len(_LEVELS) else " "
            for lv in levels))
    rows.append(" " * len(values))
    for k in range(max(len(label) for label in labels)):
        rows.append("".join(label[k] if k < len(label) else " " for label in labels))
    return "".join(row + "\n" for row in rows)


def _advice(event: str, threshold: int, slowlog_log_slower_than: int,
            appendfsync: str) -> list[str]:
    """What DOCTOR suggests for one kind of event (several events may share advice)."""
    if event == COMMAND:
        out = []
        if slowlog_log_slower_than < 0:
            out.append(f"The slow log is off (slowlog-log-slower-than is negative): 'CONFIG "
                       f"SET slowlog-log-slower-than {threshold * 1000}' makes it record the "
                       f"commands behind these spikes.")
        elif slowlog_log_slower_than // 1000 > threshold:
            out.append(f"The slow log only records commands slower than "
                       f"{slowlog_log_slower_than} microseconds, more than the latency "
                       f"threshold: 'CONFIG SET slowlog-log-slower-than {threshold * 1000}' "
                       f"makes it record the commands behind these spikes.")
        out.append("SLOWLOG GET shows which commands were slow. A command that walks many "
                   "jobs or queues (QPEEK or JSCAN with a large COUNT, ACKJOB, DELJOB or "
                   "ENQUEUE with many IDs, DEBUG commands) blocks the node while it runs: "
                   "split it into smaller calls.")
        return out
    if event == FAST_COMMAND:
        return ["Commands that do constant work were slow: the node's process was not given "
                "the CPU. Lower the load of the machine, give the node a CPU of its own and "
                "look for other busy processes beside it (INFO CPU shows the node's own CPU "
                "time)."]
    if event == AOF_WRITE:
        return ["Writing the AOF was slow: the disk is slow or busy. Keep the AOF on a "
                "local disk (network disks are slow), lower the other disk traffic of the "
                "machine, or use an SSD."]
    if event == AOF_FSYNC_ALWAYS:
        if appendfsync != "always":
            return []
        return ["appendfsync is 'always': the node waits for the disk after every event "
                "loop iteration that logged a change. 'CONFIG SET appendfsync everysec' "
                "risks about a second of writes on a crash for a much lower latency."]
    if event == AOF_REWRITE:
        return ["A step of an AOF rewrite was slow (rewrites run on the event loop, a slice "
                "of the jobs at a time). Rewrites come from BGREWRITEAOF, 'CONFIG SET "
                "appendonly yes' and auto-aof-rewrite-percentage / auto-aof-rewrite-min-size: "
                "raise those to rewrite less often, and keep aof-rewrite-incremental-fsync on "
                "so that the last fsync stays short."]
    if event == EXPIRE_CYCLE:
        return ["The node's timers (job expiry, requeue, acknowledgement GC, queue GC) had "
                "much to do at once: jobs created together with the same TTL or RETRY come "
                "due together. Spreading their TTL and RETRY values spreads that work."]
    if event == EVICTION_CYCLE:
        return ["The node is near maxmemory (from 95% on it evicts acknowledged and "
                "delivered jobs and idle queues): raise maxmemory, or acknowledge jobs "
                "sooner so that there is less to evict."]
    return []
