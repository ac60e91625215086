"""Partition buckets and the consistent hash ring (pure functions, no database)."""

from __future__ import annotations

from collections import Counter

import pytest

from django_pgqueue.store.partition import BUCKET_COUNT, HashRing, bucket_for


def test_buckets_are_stable_across_releases():
    # Fixed forever: changing them would move existing rows to other buckets.
    assert [bucket_for(key) for key in ["customer:42", "order:1", "", "ünïcode"]] == [
        480,
        889,
        0,
        170,
    ]


def test_buckets_spread_keys_evenly():
    counts = Counter(bucket_for(f"customer:{index}") for index in range(102_400))
    assert len(counts) == BUCKET_COUNT
    assert max(counts.values()) < 2 * 100


def test_every_bucket_has_exactly_one_owner():
    ring = HashRing([f"worker-{index}" for index in range(5)], vnodes=32)
    owned = [ring.buckets_of(member) for member in ring.members]
    assert sum(len(buckets) for buckets in owned) == BUCKET_COUNT
    assert set().union(*owned) == set(range(BUCKET_COUNT))


def test_ownership_is_reasonably_balanced():
    ring = HashRing([f"worker-{index}" for index in range(4)], vnodes=32)
    sizes = [len(ring.buckets_of(member)) for member in ring.members]
    assert min(sizes) > BUCKET_COUNT / 4 * 0.5
    assert max(sizes) < BUCKET_COUNT / 4 * 1.5


def test_a_joining_member_only_takes_buckets_and_moves_few():
    before = HashRing([f"worker-{index}" for index in range(4)], vnodes=32)
    after = HashRing([f"worker-{index}" for index in range(5)], vnodes=32)
    moved = [
        bucket for bucket in range(BUCKET_COUNT) if before.owner(bucket) != after.owner(bucket)
    ]
    assert all(after.owner(bucket) == "worker-4" for bucket in moved)
    assert len(moved) < BUCKET_COUNT / 5 * 1.6


def test_a_leaving_member_hands_its_buckets_to_the_others():
    before = HashRing(["a", "b", "c"], vnodes=32)
    after = HashRing(["a", "c"], vnodes=32)
    for bucket in range(BUCKET_COUNT):
        if before.owner(bucket) != "b":
            assert after.owner(bucket) == before.owner(bucket)


def test_the_ring_is_the_same_in_every_process_and_order():
    assert HashRing(["x", "y", "z"]).buckets_of("y") == HashRing(["z", "y", "x"]).buckets_of("y")


def test_empty_ring_and_strangers():
    assert HashRing(["a"]).buckets_of("b") == frozenset()
    with pytest.raises(LookupError):
        HashRing([]).owner(0)
