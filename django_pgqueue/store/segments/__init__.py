"""The job table in segments: its conversion to a partitioned table and back, and its
rotation by housekeeping.

A table that keeps one row per job cannot shed the dead versions a long transaction's
snapshot may still read: VACUUM must keep them all. A partition made after that snapshot
was taken can be emptied whole while it is held (performance.md, "A job table in
segments"). :func:`enable` makes the job table a table partitioned by ``LIST
(segment)`` whose first partition, segment 0, is the table as it was (beside an empty
*parked* segment); housekeeping then rotates the segments (:func:`rotate`);
:func:`disable` brings them down to one and makes that a plain table again, with the
schema the migrations give. Both run on a live table while workers and producers go on:

- every long step (index builds, the ``CHECK`` that lets ``ATTACH PARTITION`` skip its
  scan) takes no lock that blocks the queue;
- the swap is one short transaction behind a ``lock_timeout``, tried again until it gets
  the job table's lock, so a long statement delays it rather than the queue waiting
  behind it;
- every step before the swap can run again: a conversion stopped half way (a crash, a
  lock it never got) is finished by running it again, and until the swap the job table
  is a plain table every statement works on.

The job table's unique key indexes (``pgq_job_idempotency_key``, ``pgq_job_coalesce_key``)
cannot be carried over: a partitioned table's unique indexes must include its partition
key. Since migration 0026 the key tables alone keep one job per key, and the indexes stay
only as a backstop for the previous release's producers, so :func:`enable` may only run
once none of those is left. It replaces the unique idempotency index by a plain one
(``pgq_job_idempotency``), which the look-ups of a key's job read, and saves what it
drops (the index definitions, and the coalesced enqueue's definition with its backstop)
in ``pgq_segment_saved`` for :func:`disable` to restore.

Modules: :mod:`.convert` (prepare, enable, disable), :mod:`.rotation` (housekeeping's
step), :mod:`.catalog` (names and what the catalog says), :mod:`.locking` (statements
behind a lock_timeout), :mod:`.privileges` and :mod:`.functions` (what a table or
function made again must get back).
"""

from django_pgqueue.store.segments.catalog import (
    JOB_TABLE,
    PARKED,
    Layout,
    SegmentLayoutError,
    SwapReport,
    jobs_per_segment,
    layout,
    segment_table,
)
from django_pgqueue.store.segments.convert import disable, enable, prepare
from django_pgqueue.store.segments.rotation import Rotation, emptying_wait, rotate

__all__ = [
    "JOB_TABLE",
    "PARKED",
    "Layout",
    "Rotation",
    "SegmentLayoutError",
    "SwapReport",
    "disable",
    "emptying_wait",
    "enable",
    "jobs_per_segment",
    "layout",
    "prepare",
    "rotate",
    "segment_table",
]
