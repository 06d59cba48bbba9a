"""disque.timers: the timer wheel, driven by a fake clock (plain ints)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from disque.timers import NEVER, RES, STALE_SLACK, Timer, TimerWheel

FAR = 1_000_000  # ms: a time well ahead of a fresh wheel


class E:
    """A wheel entry, as jobs and Timers are: an `awake` attribute."""

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


def test_rescheduling_moves_the_entry():
    w = TimerWheel()
    e = E()
    w.schedule(e, FAR + 10)
    w.schedule(e, FAR + 50)
    assert len(w) == 1
    assert w.due(FAR + 49) == []
    assert w.due(FAR + 50) == [e] and e.awake == FAR + 50


def test_rescheduling_earlier_fires_once_at_the_earlier_time():
    w = TimerWheel()
    e = E()
    w.schedule(e, FAR + 200)
    w.schedule(e, FAR + 100)
    assert w.due(FAR + 100) == [e] and e.awake == FAR + 100
    e.awake = 0  # the owner handled it
    assert w.due(FAR + 200) == []


def test_cancel_unschedules_and_the_bucket_goes_with_its_last_live_entry():
    w = TimerWheel()
    a, b = E("a"), E("b")
    w.schedule(a, FAR + 30)
    w.schedule(b, FAR + 30)
    w.cancel(a)
    assert a.awake == 0  # stale: still in the bucket with b (within the slack)
    w.cancel(a)  # twice: nothing more
    w.cancel(b)  # nothing live left in the bucket: it goes, a's copy with it
    assert b.awake == 0 and len(w) == 0 and w.due(FAR + 30) == []
    w.schedule(a, FAR + 40)
    assert w.due(FAR + 40) == [a]
    w.cancel(a)  # after it came out: only clears awake
    assert a.awake == 0 and len(w) == 0


def test_cancel_of_every_entry_drops_the_bucket_and_its_references():
    w = TimerWheel()
    es = [E(i) for i in range(100)]
    for e in es:
        w.schedule(e, 1_000_000)
    for e in es:
        w.cancel(e)
    assert len(w) == 0 and not w._buckets
    assert w.due(10**9) == []
    assert w.next_due() is None


def test_a_bucket_is_rebuilt_once_its_stale_copies_outnumber_its_live_entries_by_the_slack():
    w = TimerWheel()
    es = [E(i) for i in range(100)]
    for e in es:
        w.schedule(e, FAR + 500)
    n = (100 + STALE_SLACK) // 2  # stale == live + STALE_SLACK after n went stale
    for e in es[:n - 1]:
        w.cancel(e)
    assert len(w) == 100  # not yet
    w.schedule(es[n - 1], FAR + 900)  # moved away: the n-th stale copy
    assert len(w) == 100 - n + 1  # rebuilt: the live ones here, 1 in the 900 ms bucket
    for e in es[n:-1]:
        w.cancel(e)
    assert len(w) <= 1 + STALE_SLACK  # one live entry left, and fewer stale than the slack
    w.cancel(es[-1])  # nothing live left: the bucket goes
    assert len(w) == 1
    assert w.due(FAR + 500) == []
    assert w.due(FAR + 900) == [es[n - 1]]


def stale_and_live(w: TimerWheel, after: int = -1) -> list[tuple[int, int]]:
    """Per bucket of a key above `after`: (stale copies, live entries) (live: its awake
    puts it in that bucket)."""
    out = []
    for key, bucket in w._buckets.items():
        if key <= after:
            continue
        live = {id(e) for e in bucket.entries if e.awake and w._key_of(e.awake) == key}
        out.append((len(bucket.entries) - len(live), len(live)))
    return out


def test_stale_copies_stay_below_live_entries_plus_the_slack_in_every_bucket():
    w = TimerWheel()
    es = [E(i) for i in range(1000)]
    for i, e in enumerate(es):
        w.schedule(e, FAR + 1_000 + i % 7)  # two buckets
    for e in es[::3]:
        w.cancel(e)
    for e in es[1::3]:
        w.schedule(e, FAR + 50_000 + e.name)
    assert all(stale < live + STALE_SLACK for stale, live in stale_and_live(w))
    for e in es[2::3]:
        w.cancel(e)
    assert all(stale < live + STALE_SLACK for stale, live in stale_and_live(w))
    assert w.due(FAR + 2_000) == []  # the two buckets: only stale copies were left, dropped
    assert len(w) == len(es[1::3])


def test_dropped_buckets_do_not_pile_up_in_the_heap():
    w = TimerWheel()
    keep = E("keep")
    w.schedule(keep, FAR + 10**9)
    for i in range(20_000):  # each in its own bucket, cancelled: a far TTL, then ACK
        e = E(i)
        w.schedule(e, FAR + 1_000 + i * RES * 3)
        w.cancel(e)
    assert len(w._heap) <= 1100
    assert w.next_due() is not None
    assert_earliest_is_the_heads_key(w)  # (after heap rebuilds)
    assert w.due(FAR + 10**9) == [keep]
    assert w.next_due() is None
    assert w.earliest == NEVER


def assert_earliest_is_the_heads_key(w: TimerWheel) -> None:
    """`earliest` (what the server compares after every read) is the key of next_due()."""
    nd = w.next_due()
    assert w.earliest == (NEVER if nd is None else nd // RES)


def test_earliest_follows_schedule_due_cancel_and_clear():
    w = TimerWheel()
    assert w.earliest == NEVER
    a, b = E("a"), E("b")
    w.schedule(a, FAR + 100)
    assert w.earliest == -(-(FAR + 100) // RES)
    w.schedule(b, FAR + 50)  # sooner: a new head
    assert w.earliest == -(-(FAR + 50) // RES)
    w.schedule(b, FAR + 500)  # moved later: its old bucket is dropped, its key stays
    assert_earliest_is_the_heads_key(w)
    assert w.due(FAR + 100) == [a]
    assert_earliest_is_the_heads_key(w)
    assert w.earliest == -(-(FAR + 500) // RES)
    w.clear()
    assert w.earliest == NEVER


def test_an_entry_cleared_without_cancel_comes_out_stale_and_can_be_rescheduled():
    w = TimerWheel()
    e = E()
    w.schedule(e, FAR + 100)
    e.awake = 0  # as an owner that forgets the entry without telling the wheel
    w.schedule(e, FAR + 30_000)  # the old copy stays where it was
    assert len(w) == 2
    assert w.due(FAR + 100) == [e] and e.awake == FAR + 30_000  # stale: the owner skips it
    w.cancel(e)  # (due in 30 s: counted, and the bucket goes with its last live entry)
    assert len(w) == 0 and w.due(FAR + 30_000) == []


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


def test_timer_cancel_clears_awake_and_the_wheel_cancel_drops_it():
    t = Timer(lambda now: None)
    w = TimerWheel()
    w.schedule(t, FAR + 30)
    assert t.awake == FAR + 30
    t.cancel()
    assert t.awake == 0
    assert w.due(FAR + 30) == [t]  # still in the wheel: awake 0 marks it dead
    w.schedule(t, FAR + 60_000)
    w.cancel(t)
    assert t.awake == 0 and len(w) == 0 and w.due(FAR + 60_000) == []


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


@settings(max_examples=500, deadline=None)
@given(start=st.integers(0, 10_000),
       spread=st.sampled_from([4, 60, 5_000]),
       slack=st.sampled_from([1, STALE_SLACK]),
       ops=st.lists(st.tuples(st.sampled_from(["schedule"] * 3 + ["cancel"] * 2 + ["advance"]),
                              st.integers(0, 39), st.integers(-30, 20_000)),
                    min_size=20, max_size=300))
def test_schedule_cancel_and_due_keep_the_contract(start, spread, slack, ops):
    """Whatever the order of schedules (moves), cancels and dues, under the owner's rule
    (run an entry that comes out with `awake and awake <= now`, then clear awake) each
    schedule runs once, never early, at most RES ms late, never once cancelled or moved
    away; and no bucket holds live + STALE_SLACK stale copies or more (with a STALE_SLACK
    of 1 too, rebuilding often)."""
    import disque.timers as timers
    saved = timers.STALE_SLACK
    timers.STALE_SLACK = slack
    try:
        _contract_run(start, spread, ops)
    finally:
        timers.STALE_SLACK = saved


def _contract_run(start: int, spread: int, ops: list[tuple[str, int, int]]) -> None:
    import disque.timers as timers
    w = TimerWheel()
    entries = [E(i) for i in range(40)]
    model: dict[int, tuple[int, int]] = {}  # entry -> (when, scheduled at)
    now = start
    for kind, idx, value in ops:
        e = entries[idx]
        if kind == "schedule":
            when = max(1, now + value % spread)  # few buckets: many entries per bucket
            w.schedule(e, when)
            model[idx] = (when, now)
        elif kind == "cancel":
            w.cancel(e)
            model.pop(idx, None)
            assert e.awake == 0
        else:
            now += abs(value) % 31
            for x in w.due(now):
                if not (x.awake and x.awake <= now):
                    continue  # a stale copy: the owner's rule skips it
                assert x.name in model, "a cancelled entry ran"
                when, _ = model.pop(x.name)
                assert x.awake == when, "ran for a schedule that was moved"
                x.awake = 0  # the owner ran it
            for when, at in model.values():
                assert now < max(when, at) + RES, "more than RES ms late"
        # (the copies of an entry the owner ran from an earlier stale copy are not counted:
        # they are in a bucket due within RES ms, left out)
        assert all(stale < live + timers.STALE_SLACK
                   for stale, live in stale_and_live(w, now // RES + 1))
        assert len(w) >= len(model)
        assert_earliest_is_the_heads_key(w)
    ran = []
    for x in w.due(now + 10_000):
        if x.awake:  # the owner's rule: a copy rescheduled in the same bucket runs once
            ran.append(x.name)
            x.awake = 0
    assert sorted(ran) == sorted(model)
