"""disque.timers: the timer wheel, driven by a fake clock (plain ints)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from disque.timers import RES, Timer, TimerWheel


class E:
    """A wheel entry, as jobs and Timers are: just an `awake` attribute."""

    __slots__ = ("awake", "when", "sched_at", "name")

    def __init__(self, name: object = None) -> None:
        self.awake = 0
        self.name = name

    def __repr__(self) -> str:
        return f"E({self.name}, awake={self.awake})"


# ---------------------------------------------------------------------------------- examples


def test_entry_fires_at_the_end_of_its_bucket_never_before():
    w = TimerWheel()
    e = E()
    w.schedule(e, 7)
    assert e.awake == 7
    assert w.due(6) == []
    assert w.due(9) == []  # bucket [5, 10) fires at 10
    assert w.due(10) == [e]
    assert w.due(100) == []


def test_entry_on_a_bucket_boundary_fires_exactly_on_time():
    w = TimerWheel()
    e = E()
    w.schedule(e, 10)
    assert w.due(9) == []
    assert w.due(10) == [e]


def test_next_due_is_none_when_empty_and_bucket_end_otherwise():
    w = TimerWheel()
    assert w.next_due() is None
    a, b = E("a"), E("b")
    w.schedule(b, 23)
    w.schedule(a, 11)
    assert w.next_due() == 15
    assert w.due(15) == [a]
    assert w.next_due() == 25
    assert w.due(30) == [b]
    assert w.next_due() is None


def test_due_returns_several_buckets_in_time_order():
    w = TimerWheel()
    es = [E(i) for i in range(5)]
    for i, e in enumerate(es):
        w.schedule(e, 100 - 10 * i)
    assert w.due(1000) == list(reversed(es))
    assert len(w) == 0


def test_len_counts_scheduled_copies():
    w = TimerWheel()
    e = E()
    w.schedule(e, 10)
    w.schedule(e, 50)
    assert len(w) == 2


def test_rescheduling_later_leaves_a_stale_copy_the_owner_can_detect():
    w = TimerWheel()
    e = E()
    w.schedule(e, 100)
    w.schedule(e, 200)
    assert e.awake == 200
    fired = w.due(100)
    assert fired == [e]
    assert e.awake > 100  # stale: the owner skips it
    assert w.due(199) == []
    assert w.due(200) == [e] and e.awake == 200  # the live copy


def test_rescheduling_earlier_fires_early_copy_then_a_stale_one():
    w = TimerWheel()
    e = E()
    w.schedule(e, 200)
    w.schedule(e, 100)
    assert w.due(100) == [e] and e.awake == 100  # live
    e.awake = 0  # the owner handled it
    assert w.due(200) == [e] and e.awake == 0  # stale copy: awake 0 says "not scheduled"


def test_scheduling_in_the_past_after_due_fires_in_the_next_bucket():
    w = TimerWheel()
    assert w.due(103) == []  # nothing, and no bucket handed out yet
    a = E("a")
    w.schedule(a, 50)  # the past, but no bucket fired yet: bucket 10 (ends at 50)
    assert w.next_due() == 50
    assert w.due(103) == [a]
    b = E("b")
    w.schedule(b, 50)  # bucket 10 was handed out already: goes to bucket 11, not lost
    assert w.next_due() == 55
    assert w.due(103) == [b]  # due at the very next call


def test_scheduling_now_right_after_due_of_same_bucket_is_not_lost():
    w = TimerWheel()
    a = E("a")
    w.schedule(a, 10)
    assert w.due(10) == [a]
    b = E("b")
    w.schedule(b, 10)  # bucket 2 already fired
    assert w.due(10) == []
    assert w.due(15) == [b]


def test_timer_cancel_clears_awake():
    t = Timer(lambda now: None)
    w = TimerWheel()
    w.schedule(t, 30)
    assert t.awake == 30
    t.cancel()
    assert t.awake == 0
    assert w.due(30) == [t]  # the copy still comes out; awake 0 marks it dead


def test_clear_drops_everything():
    w = TimerWheel()
    for i in range(5):
        w.schedule(E(i), 10 * i)
    w.clear()
    assert w.next_due() is None and w.due(10**9) == [] and len(w) == 0


# ---------------------------------------------------------------------------------- properties

op_st = st.one_of(
    st.tuples(st.just("schedule"), st.integers(-30, 200)),  # offset from now
    st.tuples(st.just("advance"), st.integers(0, 30)),
)


@settings(max_examples=300, deadline=None)
@given(start=st.integers(0, 10_000), ops=st.lists(op_st, max_size=60))
def test_one_shot_entries_never_fire_early_and_at_most_res_late(start, ops):
    w = TimerWheel()
    now = start
    pending: list[E] = []
    for kind, value in ops:
        if kind == "schedule":
            e = E()
            e.when = max(0, now + value)
            e.sched_at = now
            w.schedule(e, e.when)
            pending.append(e)
        else:
            now += value
            for e in w.due(now):
                assert e in pending
                assert now >= e.when, "fired early"
                assert now >= e.sched_at
                pending.remove(e)
            for e in pending:
                assert now < max(e.when, e.sched_at) + RES, "more than RES ms late"
    # and everything eventually fires
    now += 10_000
    assert sorted(map(id, w.due(now))) == sorted(map(id, pending))


@settings(max_examples=300, deadline=None)
@given(start=st.integers(0, 10_000),
       ops=st.lists(st.tuples(st.sampled_from(["schedule", "advance"]), st.integers(0, 4),
                              st.integers(-30, 200)), max_size=80))
def test_rescheduled_entries_fire_once_per_live_schedule_with_owner_check(start, ops):
    """The owner's rule (`awake and awake <= now`, then clear awake) runs each live
    schedule exactly once, on time, however often entries are rescheduled."""
    w = TimerWheel()
    entries = [E(i) for i in range(5)]
    target: dict[int, tuple[int, int] | None] = {i: None for i in range(5)}
    now = start
    for kind, idx, value in ops:
        if kind == "schedule":
            when = max(1, now + value)
            w.schedule(entries[idx], when)
            target[idx] = (when, now)
        else:
            now += abs(value) % 31
            for e in w.due(now):
                if e.awake and e.awake <= now:
                    assert target[e.name] is not None
                    assert e.awake == target[e.name][0]
                    e.awake = 0
                    target[e.name] = None
            for i, t in target.items():
                if t is not None:
                    when, sched_at = t
                    assert now < max(when, sched_at) + RES, f"entry {i} is late"
