"""Claim floors: a worker keeps claiming at full speed while a long transaction is open.

Every job a claim takes leaves its index entry in ``pgq_job_claim`` pointing at a row
version that is no longer pending. Normally the next scans mark such entries dead and
vacuum removes them. While any transaction holds a snapshot older than the claim (an
idle ``REPEATABLE READ`` session, a long report, a replication slot's horizon), they can
be neither: each claim from the head of the queue visits every job claimed since that
snapshot was taken, one heap fetch each, and the drain slows to a crawl.

So a worker whose claim from the head turns slow claims from a floor for a while: the
last job it took of each queue, in claim order (``claim_batch`` reads after it, with
two range scans of the same index), once a claim from the head took longer than
``PGQUEUE_CLAIM_FLOOR_AFTER_SECONDS``. It claims from the head again after
:data:`FLOOR_SPAN` times as long as that slow claim took, so the time spent walking
dead entries stays a small share however old the snapshot grows; or sooner, after
:data:`SHORT_SPAN` times as long, once a claim from floors came back with fewer jobs
than the worker had room for. A worker with room to spare loses little by walking, and
jobs waiting behind its floors are exactly what a short claim from floors cannot tell
from an empty queue.

What a floor costs: a job that sorts before it (a higher priority than the floor's,
or an ``available_at`` before it, as when its producer's transaction began before the
floor's job was made ready and committed after, or a dependent released by its last
blocker) waits for the next claim from the head.
Nothing is skipped for good, and while claims from the head stay fast (no long
snapshot) there are no floors at all.

Partitions and concurrency keys have floors of their own, in the claim order of their
next job (``pgq_partition_claim``, ``pgq_concurrency_claim``): each claim leaves an entry
there where its partition's or key's next job sorted. But a partition's next job
sorts before the floor whenever its backlog is older than the floor (its last job ran
long, or its jobs came in a burst), and a claim from floors does not see it. So these
floors are kept only while claims come back full, when the worker had no room for
what they left behind; a claim that comes back short drops them, and the next one
reads partitions and keys from the head, as it would without floors.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from django_pgqueue.conf import conf
from django_pgqueue.store.values import ClaimedJob, ClaimFloor

__all__ = [
    "FLOOR_LOOKBACK",
    "FLOOR_SPAN",
    "SHORT_SPAN",
    "ClaimCursor",
    "ClaimFloors",
    "HeadPacing",
    "ReapFloor",
]

#: Floors are used for this many times as long as the last claim from the head took.
FLOOR_SPAN = 20
#: ... or this many times as long, once a claim from floors came back short.
SHORT_SPAN = 4
#: How far before its floor a floor claim starts. It walks again the entries of the
#: jobs made ready in that time (1,500 at 15,000 jobs/s, about a millisecond), so that
#: a producer transaction committed up to this long after it began is not left behind.
FLOOR_LOOKBACK = timedelta(milliseconds=100)


class HeadPacing:
    """When a scan that may walk dead index entries should start from the head again.

    Always, while scans from the head stay under ``slow`` seconds
    (``PGQUEUE_CLAIM_FLOOR_AFTER_SECONDS``: healthy claims of a few hundred jobs take
    a few milliseconds; None: always); otherwise after :data:`FLOOR_SPAN` times as long
    as the last one took, or :data:`SHORT_SPAN` times once a scan from the floor found
    less than it looked for.
    """

    def __init__(
        self, slow: float | None = None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._slow = conf.CLAIM_FLOOR_AFTER_SECONDS if slow is None else slow
        self._clock = clock
        self._seconds = 0.0
        self._done_at = -math.inf
        self._short = False

    @property
    def slow_after(self) -> float | None:
        """Return the duration past which a scan from the head counts as slow."""
        return self._slow

    @property
    def clock(self) -> Callable[[], float]:
        """Return the clock the pacing reads."""
        return self._clock

    def due(self) -> bool:
        """Return whether the next scan should start from the head."""
        if self._slow is None or self._seconds < self._slow:
            return True
        span = SHORT_SPAN if self._short else FLOOR_SPAN
        return self._clock() - self._done_at >= span * self._seconds

    def ran(self, seconds: float) -> None:
        """Record a scan from the head that took ``seconds``."""
        self._seconds = seconds
        self._done_at = self._clock()
        self._short = False

    def came_back_short(self) -> None:
        """Record a scan from floors that found less than it looked for."""
        self._short = True


class ReapFloor:
    """Where the reaper's scan of expired leases starts (``pgq_job_lease``).

    A pass that recovered every expired lease it could see has left behind only rows
    locked by their running atomic task (alive, so not to be reaped). The next pass
    reads from that pass's clock on, and one from the head (for locks since let go)
    follows the same pacing as the claim's.
    """

    def __init__(self, pacing: HeadPacing | None = None) -> None:
        self._pacing = pacing or HeadPacing()
        self._since: datetime | None = None
        self._from_head = True

    def since(self) -> datetime | None:
        """Return the lease expiry the next pass starts at (None: the head)."""
        self._from_head = self._since is None or self._pacing.due()
        return None if self._from_head else self._since

    def reaped(self, count: int, limit: int, *, seconds: float, database_now: datetime) -> None:
        """Record a pass (as started after :meth:`since`) that reaped ``count``."""
        if self._from_head:
            self._pacing.ran(seconds)
        # A full batch may have left more expired leases before the clock.
        self._since = database_now if count < limit else None


@dataclass(frozen=True, slots=True)
class ClaimFloors:
    """Where one claim starts, one floor (or None: the head) per queue and kind."""

    plain: list[ClaimFloor | None]
    partitions: list[ClaimFloor | None]
    keys: list[ClaimFloor | None]


class ClaimCursor:
    """One worker's claim floors, per queue and kind, and when to claim from the head."""

    def __init__(self, pacing: HeadPacing | None = None) -> None:
        self._pacing = pacing or HeadPacing()
        self._floors: dict[str, ClaimFloor] = {}
        self._partition_floors: dict[str, ClaimFloor] = {}
        self._key_floors: dict[str, ClaimFloor] = {}
        self._from_floors = False

    def forget(self) -> None:
        """Drop every floor and the pacing: the next claim starts from the head.

        After a lost connection (a server restart, a failover), a claim that was under
        way may have been rolled back, leaving its jobs before the floors.
        """
        self._pacing = HeadPacing(self._pacing.slow_after, self._pacing.clock)
        self._floors.clear()
        self._partition_floors.clear()
        self._key_floors.clear()
        self._from_floors = False

    @property
    def slow_after(self) -> float | None:
        """Return the duration past which a claim from the head counts as slow."""
        return self._pacing.slow_after

    @property
    def active(self) -> bool:
        """Return whether the next claim would start from floors."""
        return not self._pacing.due()

    def floors(self, queues: Sequence[str]) -> ClaimFloors | None:
        """Return the floors for a claim of ``queues`` (None: claim from the head).

        Each is sent :data:`FLOOR_LOOKBACK` before its job, for the jobs of producer
        transactions that committed late.
        """
        self._from_floors = self.active and any(
            queue in self._floors or queue in self._partition_floors or queue in self._key_floors
            for queue in queues
        )
        if not self._from_floors:
            return None
        return ClaimFloors(
            plain=[_sent(self._floors.get(queue)) for queue in queues],
            partitions=[_sent(self._partition_floors.get(queue)) for queue in queues],
            keys=[_sent(self._key_floors.get(queue)) for queue in queues],
        )

    def mates_floor(self, queue: str) -> ClaimFloor | None:
        """Return where a batch's scan for more jobs of ``queue`` starts (None: the head).

        The queue's floor, sent :data:`FLOOR_LOOKBACK` early, while claims start from
        floors; read by the batch runner's thread, so it only reads (a floor replaced
        meanwhile is as good a place to start).
        """
        return _sent(self._floors.get(queue)) if self.active else None

    def claimed(self, jobs: Sequence[ClaimedJob], *, seconds: float, short: bool = False) -> None:
        """Record a claim (as sent after :meth:`floors`), how long it took, and whether
        it came back ``short`` (fewer jobs than the worker had room for).

        Each queue's floor moves to its last plain job taken: from the head, wherever
        that is; from floors, only on. Its partition floor moves to the last partition
        taken, and its key floor to the last key taken from (where the key's first job
        taken sorted); a short claim drops both kinds instead.
        """
        if not self._from_floors:
            self._pacing.ran(seconds)
        elif short:
            self._pacing.came_back_short()
        plain = [job for job in jobs if job.partition_key is None and job.concurrency_key is None]
        self._move(self._floors, _last_per_queue(plain))
        if short:
            self._partition_floors.clear()
            self._key_floors.clear()
            return
        heads = [job for job in jobs if job.partition_key is not None]
        self._move(self._partition_floors, _last_per_queue(heads))
        firsts: dict[tuple[str, str], ClaimFloor] = {}
        for job in jobs:
            if job.concurrency_key is not None:
                floor = ClaimFloor.after(job)
                known = firsts.get((job.queue, job.concurrency_key))
                if known is None or floor.sort_key() < known.sort_key():
                    firsts[(job.queue, job.concurrency_key)] = floor
        last_keys: dict[str, ClaimFloor] = {}
        for (queue, _), floor in firsts.items():
            best = last_keys.get(queue)
            if best is None or floor.sort_key() > best.sort_key():
                last_keys[queue] = floor
        self._move(self._key_floors, last_keys)

    def _move(self, floors: dict[str, ClaimFloor], last: dict[str, ClaimFloor]) -> None:
        """Move ``floors`` to ``last``: from the head, wherever that is; from floors,
        only on."""
        for queue, floor in last.items():
            current = floors.get(queue)
            if not self._from_floors or current is None or floor.sort_key() > current.sort_key():
                floors[queue] = floor


def _last_per_queue(jobs: Iterable[ClaimedJob]) -> dict[str, ClaimFloor]:
    """Return the floor just past the last of ``jobs`` of each queue, in claim order."""
    last: dict[str, ClaimFloor] = {}
    for job in jobs:
        floor = ClaimFloor.after(job)
        best = last.get(job.queue)
        if best is None or floor.sort_key() > best.sort_key():
            last[job.queue] = floor
    return last


def _sent(floor: ClaimFloor | None) -> ClaimFloor | None:
    """Return where a scan from ``floor`` starts: :data:`FLOOR_LOOKBACK` before its job.

    The id is dropped with the time moved back: every job made ready in that span sorts
    after the returned floor, whatever its id.
    """
    if floor is None:
        return None
    return ClaimFloor(floor.priority, floor.available_at - FLOOR_LOOKBACK, 0)
