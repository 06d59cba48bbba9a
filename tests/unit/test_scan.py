"""disque.scan.ScanDict: a sharded dict with SCAN-style cursors (QSCAN / JSCAN)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from disque.scan import ScanDict


def keep_all(_value: object) -> bool:
    return True


def full_scan(d: ScanDict, count: int = 10) -> list:
    out: list = []
    cursor = 0
    for _ in range(d.shard_count() + 1):
        cursor, found = d.scan(cursor, count, keep_all)
        out += found
        if cursor == 0:
            return out
    raise AssertionError("scan did not terminate")


# ---------------------------------------------------------------------------------- dict part


def test_get_add_pop_len_contains():
    d = ScanDict(4)
    assert len(d) == 0 and d.get(b"a") is None and b"a" not in d
    d.add(b"a", 1)
    d.add(b"b", 2)
    assert len(d) == 2 and d.get(b"a") == 1 and b"a" in d
    d.add(b"a", 3)  # replace: length unchanged
    assert len(d) == 2 and d.get(b"a") == 3
    assert d.pop(b"a") == 3
    assert d.pop(b"a") is None
    assert len(d) == 1 and b"a" not in d and d.get(b"a") is None
    assert sorted(d.values()) == [2]
    d.clear()
    assert len(d) == 0 and list(d.values()) == [] and b"b" not in d


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["add", "pop"]), st.integers(0, 30),
                          st.integers(1, 100)), max_size=80))
def test_behaves_like_a_dict(ops):
    d = ScanDict(3)
    model: dict[int, int] = {}
    for op, k, v in ops:
        if op == "add":
            d.add(k, v)
            model[k] = v
        else:
            assert d.pop(k) == model.pop(k, None)
        assert len(d) == len(model)
        assert all(d.get(key) == val and key in d for key, val in model.items())
    assert sorted(d.values()) == sorted(model.values())


def test_shard_count_and_shard_index_wraps():
    d = ScanDict(4)
    assert d.shard_count() == 16
    d.add(5, "x")
    idx = hash(5) & 15
    assert d.shard(idx) == {5: "x"}
    assert d.shard(idx + 16) is d.shard(idx)


# ---------------------------------------------------------------------------------- scan


def test_scan_of_empty_dict_ends_in_one_call():
    d = ScanDict(12)
    assert d.scan(0, 1, keep_all) == (0, [])


def test_scan_matching_nothing_among_few_elements_ends_in_one_call():
    """Issue 15: `JSCAN 0 QUEUE <no such queue>` answered cursor 1000 (10 x COUNT empty
    shards visited) where the original, whose table is sized to its few jobs, answers 0."""
    d = ScanDict(12)
    for i in range(50):
        d.add(i, i)
    assert d.scan(0, 100, lambda v: False) == (0, [])


def test_scan_visits_at_most_10x_count_elements_per_call():
    d = ScanDict(5)  # 32 shards
    for i in range(64):
        d.add(i, i)
    cursor, found = d.scan(0, 1, lambda v: False)
    assert found == [] and 0 < cursor < 32
    examined = sum(len(d.shard(s)) for s in range(cursor))
    # stops in the shard where the 10th element was examined, not before
    assert examined >= 10 and examined - len(d.shard(cursor - 1)) < 10


def test_scan_stops_after_count_matches():
    d = ScanDict(4)
    for i in range(64):
        d.add(i, i)
    cursor, found = d.scan(0, 3, keep_all)
    assert len(found) >= 3
    assert 0 < cursor < 16
    assert len(found) == sum(len(d.shard(s)) for s in range(cursor))
    # at most one shard past the point where count was reached
    before = sum(len(d.shard(s)) for s in range(cursor - 1))
    assert before < 3


def test_scan_returns_everything_once_without_changes():
    d = ScanDict(4)
    for i in range(100):
        d.add(i, i)
    assert sorted(full_scan(d, count=2)) == list(range(100))


def test_busyloop_returns_everything_in_one_call_with_cursor_zero():
    d = ScanDict(6)
    for i in range(500):
        d.add(i, i)
    cursor, found = d.scan(0, 1, keep_all, busyloop=True)
    assert cursor == 0
    assert sorted(found) == list(range(500))


def test_busyloop_from_a_cursor_returns_the_rest():
    d = ScanDict(4)
    for i in range(50):
        d.add(i, i)
    cursor, first = d.scan(0, 1, keep_all)
    assert cursor != 0
    cursor2, rest = d.scan(cursor, 1, keep_all, busyloop=True)
    assert cursor2 == 0
    assert sorted(first + rest) == list(range(50))


def test_scan_filter_is_applied():
    d = ScanDict(3)
    for i in range(40):
        d.add(i, i)
    assert sorted(v for v in full_scan(d) if v % 3 == 0) == list(range(0, 40, 3))
    cursor, found = d.scan(0, 1000, lambda v: v % 3 == 0, busyloop=True)
    assert cursor == 0 and sorted(found) == list(range(0, 40, 3))


def test_scan_with_out_of_range_cursor_ends_the_iteration():
    d = ScanDict(4)
    d.add(1, 1)
    assert d.scan(16, 10, keep_all) == (0, [])
    assert d.scan(10**12, 10, keep_all) == (0, [])
    assert d.scan(-1, 10, keep_all) == (0, [])


@settings(max_examples=200, deadline=None)
@given(initial=st.sets(st.integers(0, 200), max_size=60),
       count=st.integers(1, 5),
       changes=st.lists(st.lists(st.tuples(st.sampled_from(["add", "pop"]),
                                           st.integers(0, 200)), max_size=6), max_size=40))
def test_scan_returns_every_key_present_for_the_whole_iteration(initial, count, changes):
    d = ScanDict(4)
    for k in initial:
        d.add(k, k)
    ever_present = set(initial)
    always_present = set(initial)
    seen: list[int] = []
    cursor = 0
    calls = 0
    while True:
        cursor, found = d.scan(cursor, count, keep_all)
        seen += found
        calls += 1
        assert calls <= d.shard_count(), "the cursor must always move forward"
        if cursor == 0:
            break
        for op, k in (changes[calls - 1] if calls - 1 < len(changes) else []):
            if op == "add":
                d.add(k, k)
                ever_present.add(k)
            else:
                d.pop(k)
                always_present.discard(k)
    assert always_present <= set(seen)
    assert set(seen) <= ever_present  # never a key that was never there
