"""disque.jobs.ids: the 40-char job ID format (checklist section 2)."""

from __future__ import annotations

import base64
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from disque.jobs import ids
from disque.jobs.ids import (
    ID_LEN,
    IdGenerator,
    id_is_at_least_once,
    id_ttl_minutes,
    is_valid_id,
    ttl_field,
)

NODE = b"d302462f" + b"0" * 32
ID_RE = re.compile(rb"D-d302462f-[A-Za-z0-9+/]{24}-[0-9a-f]{4}")


def test_id_format_is_40_chars_with_node_prefix_random_part_and_ttl_field():
    gen = IdGenerator(NODE)
    job_id = gen.new_id(86400, 30)
    assert len(job_id) == ID_LEN == 40
    assert ID_RE.fullmatch(job_id), job_id
    assert job_id[:2] == b"D-" and job_id[10:11] == b"-" and job_id[35:36] == b"-"
    assert job_id[36:] == b"05a1"
    assert is_valid_id(job_id)


def test_node_prefix_is_first_8_chars_of_node_id():
    gen = IdGenerator(b"0123abcd" + b"f" * 32)
    assert gen.new_id(60, 1)[2:10] == b"0123abcd"


@pytest.mark.parametrize("ttl,retry,field", [
    (86400, 30, 0x05A1),
    (86400, 1, 0x05A1),
    (86400, 0, 0x05A0),
    (100, 10, 0x0001),
    (5, 1, 0x0001),
    (5, 0, 0x0000),
    (59, 0, 0x0000),
    (60, 0, 0x0000),  # 1 minute forced even
    (60, 1, 0x0001),
    (120, 1, 0x0003),  # 2 minutes forced odd
    (120, 0, 0x0002),
    (65535 * 60, 1, 0xFFFF),
    (65535 * 60, 0, 0xFFFE),
    (10**9, 1, 0xFFFF),  # capped at 65535 minutes
    (10**9, 0, 0xFFFE),
])
def test_ttl_field_examples(ttl, retry, field):
    assert ttl_field(ttl, retry) == field
    assert IdGenerator(NODE).new_id(ttl, retry)[36:] == b"%04x" % field


@settings(max_examples=300, deadline=None)
@given(ttl=st.integers(1, 10**10), retry=st.integers(0, 10**6))
def test_ttl_field_parity_says_whether_retry_is_set(ttl, retry):
    field = ttl_field(ttl, retry)
    assert 0 <= field <= 0xFFFF
    assert field & 1 == (1 if retry > 0 else 0)
    minutes = min(ttl // 60, 0xFFFF)
    assert field >> 1 == minutes >> 1  # only the lowest bit is forced
    job_id = IdGenerator(NODE).new_id(ttl, retry)
    assert id_is_at_least_once(job_id) == (retry > 0)


@settings(max_examples=300, deadline=None)
@given(ttl=st.integers(1, 10**10), retry=st.integers(0, 10**6))
def test_id_ttl_minutes_reads_back_the_field(ttl, retry):
    job_id = IdGenerator(NODE).new_id(ttl, retry)
    assert id_ttl_minutes(job_id) == ttl_field(ttl, retry)


def test_id_ttl_minutes_accepts_uppercase_hex_and_counts_bad_digits_as_zero():
    base = b"D-d302462f-" + b"A" * 24 + b"-"
    assert id_ttl_minutes(base + b"05A1") == 0x05A1
    assert id_ttl_minutes(base + b"0z01") == 0x0001  # 'z' counts as 0
    assert id_ttl_minutes(base + b"g0g1") == 0x0001
    assert id_ttl_minutes(base + b"ffff") == 0xFFFF


def test_id_is_at_least_once_reads_the_low_bit():
    base = b"D-d302462f-" + b"A" * 24 + b"-"
    assert id_is_at_least_once(base + b"05a1")
    assert not id_is_at_least_once(base + b"05a0")
    assert not id_is_at_least_once(base + b"zzzz")


def test_is_valid_id_checks_only_length_and_the_four_fixed_chars():
    good = b"D-d302462f-TMue3s5dHe38/IKEhFpAQFxz-05a1"
    assert is_valid_id(good)
    # Anything goes in the other positions, even non-hex / non-base64 bytes.
    assert is_valid_id(b"D-" + b"!" * 8 + b"-" + b"\x00" * 24 + b"-" + b"zzzz")
    assert is_valid_id(b"D-" + b"-" * 38)


@pytest.mark.parametrize("bad", [
    b"",
    b"D-d302462f-TMue3s5dHe38/IKEhFpAQFxz-05a",  # 39
    b"D-d302462f-TMue3s5dHe38/IKEhFpAQFxz-05a1x",  # 41
    b"d-d302462f-TMue3s5dHe38/IKEhFpAQFxz-05a1",  # lowercase d
    b"DXd302462f-TMue3s5dHe38/IKEhFpAQFxz-05a1",
    b"D-d302462fXTMue3s5dHe38/IKEhFpAQFxz-05a1",
    b"D-d302462f-TMue3s5dHe38/IKEhFpAQFxzX05a1",
    b"DI0f0c644fd3ccb51c2cedbd47fcb6f312646c993c05a0SQ",  # old 48-char format
])
def test_is_valid_id_rejects(bad):
    assert not is_valid_id(bad)


@settings(max_examples=300, deadline=None)
@given(st.binary(min_size=0, max_size=45))
def test_is_valid_id_matches_the_rule_on_any_bytes(b):
    expected = (len(b) == 40 and b[0:1] == b"D" and b[1:2] == b"-" and b[10:11] == b"-"
                and b[35:36] == b"-")
    assert is_valid_id(b) == expected


def test_many_ids_are_unique_and_well_formed():
    gen = IdGenerator(NODE)
    made = [gen.new_id(86400, 30) for _ in range(3 * ids._POOL_IDS + 17)]
    assert len(set(made)) == len(made)
    assert all(ID_RE.fullmatch(i) for i in made)


def test_two_generators_for_the_same_node_do_not_collide():
    a, b = IdGenerator(NODE), IdGenerator(NODE)
    made = {a.new_id(60, 1) for _ in range(2000)} | {b.new_id(60, 1) for _ in range(2000)}
    assert len(made) == 4000


def test_pool_refills_exactly_at_its_boundary():
    calls: list[int] = []
    counter = [0]

    def randbytes(n: int) -> bytes:
        calls.append(n)
        counter[0] += 1
        # distinct, deterministic content per refill
        return bytes([counter[0]]) * n

    gen = IdGenerator(NODE, randbytes)
    first = [gen.new_id(60, 1) for _ in range(ids._POOL_IDS)]
    assert calls == [18 * ids._POOL_IDS]  # one draw covers the whole pool
    nxt = gen.new_id(60, 1)
    assert calls == [18 * ids._POOL_IDS] * 2  # the next ID triggers exactly one refill
    # 18 random bytes -> 24 base64 chars, no padding, no slicing across refills
    assert all(len(i) == 40 and is_valid_id(i) for i in [*first, nxt])
    assert first[-1][11:35] != nxt[11:35]
    assert nxt[11:35] == base64.b64encode(bytes([2]) * 18)


def test_random_part_comes_from_the_injected_source_in_order():
    stream = bytes(range(256)) * ((18 * ids._POOL_IDS) // 256 + 1)
    gen = IdGenerator(NODE, lambda n: stream[:n])
    a, b = gen.new_id(60, 1), gen.new_id(60, 1)
    assert a[11:35] == base64.b64encode(stream[0:18])
    assert b[11:35] == base64.b64encode(stream[18:36])
