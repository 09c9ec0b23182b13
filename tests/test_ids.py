"""`new_id`: ULIDs made in the store (store/records.py), time-sortable and unique."""

import time

from store import new_id

CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"


def decode(text: str) -> int:
    value = 0
    for ch in text:
        value = value * 32 + CROCKFORD.index(ch)
    return value


def test_an_id_is_a_ulid_of_the_current_millisecond():
    before = time.time_ns() // 1_000_000
    made = new_id()
    after = time.time_ns() // 1_000_000
    assert len(made) == 26 and set(made) <= set(CROCKFORD)
    value = decode(made)
    assert value < 2**128  # the two digits' spare bits stay zero
    assert before <= value >> 80 <= after


def test_ids_are_unique_and_each_sorts_after_those_made_before_it():
    made = [new_id() for _ in range(20_000)]  # many in each millisecond
    assert made == sorted(made) and len(set(made)) == len(made)
    assert len({m[:10] for m in made}) < len(made)  # (several shared a millisecond)
    # Each millisecond starts at a random point (not a counter from zero).
    starts = {m[:10]: decode(m) & (2**80 - 1) for m in reversed(made)}
    assert len(set(starts.values())) == len(starts)


def test_ids_stay_in_order_when_the_clock_steps_back(monkeypatch):
    first = new_id()
    monkeypatch.setattr(time, "time_ns", lambda: 1_000_000_000)  # 1970
    assert first < new_id() < new_id()


def test_ids_made_in_threads_at_once_are_unique():
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(8) as pool:
        made = list(pool.map(lambda _: new_id(), range(20_000)))
    assert len(set(made)) == len(made)
