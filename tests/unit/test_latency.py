"""disque.latency: the latency monitor's samples and reports, on injected clocks; and the
node's and the AOF's events recorded through it (real files, no sockets)."""

from __future__ import annotations

from pathlib import Path

import pytest

from disque.aof.writer import AppendOnlyFile
from disque.latency import HISTORY_LEN, NEVER, OFF, LatencyMonitor, LatencyStats
from disque.node import Node
from disque.timers import Timer

T0 = 1_700_000_000_000  # unix ms
MYID = b"0123abcd" + b"e" * 32


class Clocks:
    """A wall clock the test sets, and a duration clock that advances `step_ms` per read."""

    def __init__(self, step_ms: int = 0) -> None:
        self.now = T0
        self.reads = 0
        self.step_ns = step_ms * 1_000_000
        self.perf = 0

    def wall(self) -> int:
        return self.now

    def perf_ns(self) -> int:
        self.reads += 1
        self.perf += self.step_ns
        return self.perf


def monitor(threshold: int = 10, step_ms: int = 0) -> tuple[LatencyMonitor, Clocks]:
    clocks = Clocks(step_ms)
    return LatencyMonitor(clocks.wall, clocks.perf_ns, threshold), clocks


# ---------------------------------------------------------------------------------- recording

def test_threshold_zero_records_nothing_and_reads_no_clock() -> None:
    mon, clocks = monitor(threshold=0, step_ms=50)
    assert mon.min_usec == NEVER
    started = mon.start()
    assert started == OFF
    mon.end("aof-write", started)
    mon.add_sample_if_needed("command", 10_000)
    assert clocks.reads == 0
    assert mon.latest() == [] and mon.events == {}


def test_a_duration_is_kept_from_the_threshold_on() -> None:
    mon, _ = monitor(threshold=10)
    mon.add_sample_if_needed("aof-write", 9)
    assert mon.latest() == []
    mon.add_sample_if_needed("aof-write", 10)
    assert mon.latest() == [[b"aof-write", T0 // 1000, 10, 10]]


def test_start_and_end_time_the_work_with_the_duration_clock() -> None:
    mon, _ = monitor(threshold=10, step_ms=15)
    mon.end("eviction-cycle", mon.start())
    assert mon.history("eviction-cycle") == [[T0 // 1000, 15]]


def test_set_threshold_takes_effect_at_the_next_event() -> None:
    mon, _ = monitor(threshold=0, step_ms=20)
    mon.end("expire-cycle", mon.start())
    mon.set_threshold(10)
    assert mon.min_usec == 10_000
    mon.end("expire-cycle", mon.start())
    assert mon.history("expire-cycle") == [[T0 // 1000, 20]]
    mon.set_threshold(0)
    assert mon.min_usec == NEVER and mon.start() == OFF


def test_command_samples_are_split_by_the_fast_flag_in_whole_milliseconds() -> None:
    mon, _ = monitor(threshold=10)
    mon.add_command_sample(False, 50_999)
    mon.add_command_sample(True, 12_000)
    assert mon.latest() == [[b"command", T0 // 1000, 50, 50],
                            [b"fast-command", T0 // 1000, 12, 12]]


def test_samples_in_the_same_second_keep_the_largest() -> None:
    mon, clocks = monitor()
    mon.add_sample("command", 30)
    clocks.now += 999
    mon.add_sample("command", 50)
    mon.add_sample("command", 20)
    assert mon.history("command") == [[T0 // 1000, 50]]
    clocks.now += 1
    mon.add_sample("command", 20)
    assert mon.history("command") == [[T0 // 1000, 50], [T0 // 1000 + 1, 20]]
    assert mon.latest() == [[b"command", T0 // 1000 + 1, 20, 50]]


def test_history_keeps_the_newest_160_samples_and_the_all_time_max() -> None:
    mon, clocks = monitor()
    mon.add_sample("command", 1000)
    for i in range(HISTORY_LEN + 5):
        clocks.now += 1000
        mon.add_sample("command", 10 + i)
    history = mon.history("command")
    assert len(history) == HISTORY_LEN
    assert history[0] == [T0 // 1000 + 6, 15]
    assert history[-1] == [T0 // 1000 + HISTORY_LEN + 5, 10 + HISTORY_LEN + 4]
    assert mon.latest()[0][3] == 1000


def test_history_of_an_unknown_event_is_empty_and_names_are_exact() -> None:
    mon, _ = monitor()
    mon.add_sample("command", 12)
    assert mon.history("nope") == []
    assert mon.history("COMMAND") == []


def test_reset_forgets_named_series_ignoring_case_and_counts_them() -> None:
    mon, _ = monitor()
    for event in ("command", "aof-write", "expire-cycle"):
        mon.add_sample(event, 12)
    assert mon.reset(["COMMAND", "command", "nope"]) == 1
    assert [e[0] for e in mon.latest()] == [b"aof-write", b"expire-cycle"]
    assert mon.reset() == 2
    assert mon.latest() == [] and mon.reset() == 0


# ---------------------------------------------------------------------------------- GRAPH

def test_graph_of_an_event_without_samples_is_none() -> None:
    mon, _ = monitor()
    assert mon.graph("command") is None


def test_graph_draws_a_sparkline_with_age_labels() -> None:
    mon, clocks = monitor()
    for ms in (10, 20, 30, 40):
        mon.add_sample("command", ms)
        clocks.now += 1000
    clocks.now -= 1000  # the newest sample is 0 s old
    assert mon.graph("command") == (
        "command - high 40 ms, low 10 ms (all time high 40 ms)\n"
        + "-" * 80 + "\n"
        "   #\n"
        "  #|\n"
        " o||\n"
        "_|||\n"
        "    \n"
        "3210\n"
        "ssss\n")


def test_graph_of_equal_samples_is_a_floor_line() -> None:
    mon, clocks = monitor()
    mon.add_sample("aof-write", 25)
    clocks.now += 75_000  # 1 minute and 15 s later
    assert mon.graph("aof-write") == (
        "aof-write - high 25 ms, low 25 ms (all time high 25 ms)\n" + "-" * 80 + "\n"
        " \n \n \n_\n \n1\nm\n")


def test_graph_wraps_every_80_samples() -> None:
    mon, clocks = monitor()
    for i in range(100):
        mon.add_sample("command", 10 + i)
        clocks.now += 1000
    graph = mon.graph("command")
    assert graph is not None
    blocks = graph.split("\n\n")
    assert len(blocks) == 2
    first = blocks[0].split("\n")[2:]
    second = blocks[1].rstrip("\n").split("\n")
    assert {len(row) for row in first} == {80}
    assert {len(row) for row in second} == {20}
    assert second[3] == "|" * 20  # the later samples are the highest ones


# ---------------------------------------------------------------------------------- DOCTOR

def test_doctor_says_monitoring_is_off_when_nothing_was_ever_recorded() -> None:
    mon, _ = monitor(threshold=0)
    text = mon.doctor(10000, "everysec")
    assert "disabled" in text and "CONFIG SET latency-monitor-threshold" in text


def test_doctor_says_no_spikes_when_on_and_nothing_was_recorded() -> None:
    mon, _ = monitor(threshold=25)
    assert mon.doctor(10000, "everysec").startswith(
        "No latency spikes were observed on this node")
    assert "(25 ms)" in mon.doctor(10000, "everysec")


def test_latency_stats_average_mean_deviation_and_period() -> None:
    mon, clocks = monitor()
    for ms in (10, 20, 60):
        mon.add_sample("command", ms)
        clocks.now += 2000
    st = LatencyStats(mon.events["command"], clocks.now // 1000)
    assert (st.samples, st.avg, st.mad, st.max) == (3, 30, 20, 60)
    assert st.period == pytest.approx(6 / 3)


def test_doctor_reports_each_event_and_advice_for_it() -> None:
    mon, clocks = monitor(threshold=10)
    mon.add_sample("command", 50)
    mon.add_sample("aof-fsync-always", 30)
    mon.add_sample("eviction-cycle", 11)
    clocks.now += 4000
    text = mon.doctor(100_000, "always")
    assert text.startswith("Latency spikes were observed on this node "
                           "(latency-monitor-threshold is 10 ms):\n\n")
    assert ("1. command: 1 latency spikes (average 50ms, mean deviation 0ms, period 4.00 "
            "sec). Worst all time event 50ms.\n") in text
    assert "2. aof-fsync-always: 1 latency spikes" in text
    assert "3. eviction-cycle: 1 latency spikes" in text
    assert "\nSome advice:\n" in text
    assert "'CONFIG SET slowlog-log-slower-than 10000'" in text  # the slow log misses them
    assert "SLOWLOG GET" in text
    assert "'CONFIG SET appendfsync everysec'" in text
    assert "maxmemory" in text


def test_doctor_fits_its_advice_to_the_settings() -> None:
    mon, _ = monitor(threshold=10)
    mon.add_sample("command", 50)
    mon.add_sample("aof-fsync-always", 30)
    off = mon.doctor(-1, "everysec")
    assert "The slow log is off" in off
    assert "appendfsync" not in off  # no longer `always`: nothing to relax
    tuned = mon.doctor(5000, "everysec")
    assert "slowlog-log-slower-than" not in tuned


# ---------------------------------------------------------------------------------- sources

def test_a_slow_timer_pass_is_an_expire_cycle_event() -> None:
    clocks = Clocks(step_ms=15)
    mon = LatencyMonitor(clocks.wall, clocks.perf_ns, 10)
    node = Node(MYID, clocks.wall, latency=mon)
    node.tick(T0 + 1000)
    assert mon.history("expire-cycle") == [[T0 // 1000, 15]]
    mon.set_threshold(0)
    reads = clocks.reads
    node.tick(T0 + 2000)
    assert clocks.reads == reads  # off: the pass is not timed


def test_an_eviction_attempt_is_an_eviction_cycle_event() -> None:
    clocks = Clocks(step_ms=12)
    mon = LatencyMonitor(clocks.wall, clocks.perf_ns, 10)
    node = Node(MYID, clocks.wall, latency=mon)
    node.evict(0)
    assert [e[0] for e in mon.latest()] == [b"eviction-cycle"]


def test_the_node_without_a_monitor_records_nothing() -> None:
    node = Node(MYID, lambda: T0)
    fired: list[int] = []
    node.wheel.schedule(Timer(fired.append), T0 + 10)
    node.tick(T0 + 10)
    assert fired == [T0 + 10] and node.latency.latest() == []


@pytest.mark.parametrize("policy,events", [
    ("always", [b"aof-write", b"aof-fsync-always"]),
    ("no", [b"aof-write"]),  # an fsync outside `always` is not the fsync-always event
])
def test_aof_writes_and_always_fsyncs_are_events(tmp_path: Path, policy: str,
                                                 events: list[bytes]) -> None:
    clocks = Clocks(step_ms=20)
    mon = LatencyMonitor(clocks.wall, clocks.perf_ns, 10)
    scheduled: list[object] = []
    aof = AppendOnlyFile(str(tmp_path / "a.aof"), policy, scheduled.append, lambda: None,
                         latency=mon)
    try:
        aof.append(b"*1\r\n$4\r\nPING\r\n")
        assert aof.flush(fsync=True)
        assert [e[0] for e in mon.latest()] == events
        assert all(e[2] == 20 for e in mon.latest())
    finally:
        aof.close()
    assert (tmp_path / "a.aof").read_bytes() == b"*1\r\n$4\r\nPING\r\n"
