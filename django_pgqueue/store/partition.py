"""Partition keys: the stable bucket hash and the consistent hash ring over workers.

A partition key maps to one of 1024 buckets; buckets, not keys, are spread over the live
workers serving a queue, so a worker can push "only my buckets" into its claim query.
Ownership is an efficiency measure only: one-at-a-time, in-order execution per partition
is enforced by the claim SQL whatever the ring says.
"""

from __future__ import annotations

import bisect
import hashlib
import zlib
from collections.abc import Iterable

__all__ = ["BUCKET_COUNT", "HashRing", "bucket_for"]

BUCKET_COUNT = 1024


def bucket_for(partition_key: str) -> int:
    """Return the bucket (0..1023) of ``partition_key``.

    CRC-32 of the UTF-8 bytes: fixed forever, independent of Python's hash seed and of
    PostgreSQL's internal hash functions, so rows written by any release land in the
    same bucket.
    """
    return zlib.crc32(partition_key.encode("utf-8")) % BUCKET_COUNT


def _point(label: str) -> int:
    return int.from_bytes(hashlib.blake2b(label.encode("utf-8"), digest_size=8).digest(), "big")


_BUCKET_POINTS = [_point(f"bucket:{bucket}") for bucket in range(BUCKET_COUNT)]


class HashRing:
    """A consistent hash ring assigning every bucket to exactly one member.

    Each member sits on the ring at ``vnodes`` points; a bucket belongs to the first member
    point clockwise from the bucket's own point. When a member joins or leaves, only the
    buckets next to its points move.
    """

    def __init__(self, members: Iterable[str], *, vnodes: int = 32) -> None:
        self.members = tuple(sorted(set(members)))
        points = sorted(
            (_point(f"{member}#{index}"), member)
            for member in self.members
            for index in range(vnodes)
        )
        self._points = [point for point, _ in points]
        self._owners = [member for _, member in points]

    def owner(self, bucket: int) -> str:
        """Return the member owning ``bucket``."""
        if not self._points:
            raise LookupError("the ring has no members")
        index = bisect.bisect_left(self._points, _BUCKET_POINTS[bucket]) % len(self._points)
        return self._owners[index]

    def buckets_of(self, member: str) -> frozenset[int]:
        """Return the buckets owned by ``member`` (empty if it is not on the ring)."""
        if member not in self.members:
            return frozenset()
        return frozenset(bucket for bucket in range(BUCKET_COUNT) if self.owner(bucket) == member)
