"""The heartbeat: keeps leases and the registry row fresh, and the bucket ring current.

It runs on its own thread and connection, so a busy or stuck handler can never delay a
lease extension, and nothing else uses that connection (step writes go through the
handler's own connection). No statement here waits on a row lock: each is one short
autocommit statement, and the extension skips locked rows. Each beat, in order of
importance:

1. extend every held lease in one statement; a lease whose row is locked right now (an
   atomic task's open transaction) is still held, and is extended at a later beat;
   leases that came back missing were lost (expired and taken over, or changed by an
   operator) and the worker abandons them; leases whose job an operator asked to cancel
   have their handlers asked to stop (a lost cancel notice is made up for here);
2. refresh the worker's registry row;
3. rebuild the partition-bucket ring from the live workers;
4. add the finished-job counters to the per-minute statistics.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from django_pgqueue.store.partition import BUCKET_COUNT, HashRing
from django_pgqueue.store.reports import QueueCounts
from django_pgqueue.store.values import Lease
from django_pgqueue.worker import observe
from django_pgqueue.worker.connection import CONNECTION_ERRORS, ConnectionSlot

__all__ = ["Heartbeat", "bucket_masks"]

logger = logging.getLogger("django_pgqueue.worker")


def bucket_masks(
    worker_id: str,
    queues: Sequence[str],
    live: Sequence[tuple[str, Sequence[str]]],
    *,
    vnodes: int,
) -> tuple[str | None, ...]:
    """Return, per queue, the '0'/'1' mask of buckets ``worker_id`` owns (None: all).

    The ring of a queue is made of the live workers serving it, plus this worker.
    """
    masks: list[str | None] = []
    for queue in queues:
        members = {member for member, served in live if queue in served}
        members.add(worker_id)
        if len(members) == 1:
            masks.append(None)
            continue
        owned = HashRing(members, vnodes=vnodes).buckets_of(worker_id)
        masks.append("".join("1" if bucket in owned else "0" for bucket in range(BUCKET_COUNT)))
    return tuple(masks)


class Heartbeat(threading.Thread):
    """Beats every ``interval`` seconds until stopped."""

    def __init__(
        self,
        *,
        slot: ConnectionSlot,
        worker_id: str,
        queues: Sequence[str],
        concurrency: int,
        interval: float,
        lease_seconds: float,
        worker_timeout: float,
        vnodes: int,
        held_leases: Callable[[], list[Lease]],
        on_leases_lost: Callable[[list[Lease]], None],
        on_leases_extended: Callable[[frozenset[tuple[int, int]], float], None],
        take_counts: Callable[[], list[QueueCounts]],
        set_masks: Callable[[tuple[str | None, ...]], None],
        status: Callable[[], str],
        metadata: dict[str, Any],
        overdue: Callable[[], list[int]] = list,
        stuck: Callable[[], list[dict[str, Any]]] = list,
        on_cancel_requested: Callable[[list[Lease]], None] | None = None,
    ) -> None:
        super().__init__(name="pgqueue-heartbeat", daemon=True)
        self._overdue = overdue
        self._stuck = stuck
        self._on_cancel_requested = on_cancel_requested
        self._slot = slot
        self._worker_id = worker_id
        self._queues = tuple(queues)
        self._concurrency = concurrency
        self._interval = interval
        self._lease_seconds = lease_seconds
        self._worker_timeout = worker_timeout
        self._vnodes = vnodes
        self._held_leases = held_leases
        self._on_leases_lost = on_leases_lost
        self._on_leases_extended = on_leases_extended
        self._take_counts = take_counts
        self._set_masks = set_masks
        self._status = status
        self._metadata = metadata
        self._stopping = threading.Event()
        self._beat_now = threading.Event()
        self.beats = 0
        self._pending_counts: list[QueueCounts] = []
        self._owned: dict[str, int] = {}

    def stop(self) -> None:
        """Ask the thread to finish after the current beat."""
        self._stopping.set()
        self._beat_now.set()

    def beat_soon(self) -> None:
        """Beat now rather than at the next interval (a status change, say)."""
        self._beat_now.set()

    def run(self) -> None:
        """Beat until stopped; after a connection error, retry sooner."""
        delay = 0.0  # the first beat builds the ring at once
        while not self._stopping.is_set():
            self._beat_now.wait(delay)
            self._beat_now.clear()
            if self._stopping.is_set():
                break
            try:
                self.beat()
                delay = self._interval
            except CONNECTION_ERRORS as error:
                logger.warning("heartbeat: connection lost (%s); retrying", error)
                delay = min(self._interval, 0.5)
            except Exception:
                logger.exception("heartbeat failed")
                delay = self._interval
        try:
            self.flush_counts()
        except CONNECTION_ERRORS:
            logger.warning("heartbeat: could not write the last statistics")

    def beat(self) -> None:
        """Run one beat (public for tests)."""
        leases = self._held_leases()
        if leases:
            sent_at = time.monotonic()
            extension = self._slot.run(
                lambda store: store.extend_leases_if_leased(
                    self._worker_id, leases, self._lease_seconds
                )
            )
            self._on_leases_extended(extension.held, sent_at)
            if extension.cancelling and self._on_cancel_requested is not None:
                # An operator's cancel whose notice this worker missed.
                self._on_cancel_requested(
                    [
                        lease
                        for lease in leases
                        if (lease.job_id, lease.lease_generation) in extension.cancelling
                    ]
                )
            lost = extension.lost(leases)
            observe.current.leases_extended(len(leases) - len(lost))
            if lost:
                self._on_leases_lost(lost)
        # Shown in the admin: handlers past their timeout (or cancel) that Python cannot
        # stop. overdue_jobs is what the admin of the previous release reads.
        stuck = self._stuck()
        observe.current.stuck_handlers(len(stuck))
        metadata = {
            **self._metadata,
            "owned_buckets": self._owned,
            "overdue_jobs": self._overdue(),
            "stuck_handlers": stuck,
        }
        self._slot.run(
            lambda store: store.heartbeat_worker(
                self._worker_id,
                status=self._status(),
                hostname=socket.gethostname(),
                pid=os.getpid(),
                queues=self._queues,
                concurrency=self._concurrency,
                metadata=metadata,
            )
        )
        live = self._slot.run(
            lambda store: store.live_workers(timeout_seconds=self._worker_timeout)
        )
        masks = bucket_masks(
            self._worker_id,
            self._queues,
            [(member.worker_id, member.queues) for member in live],
            vnodes=self._vnodes,
        )
        self._set_masks(masks)
        # Shown in the registry (and the admin): how many buckets this worker owns.
        self._owned = {
            queue: BUCKET_COUNT if mask is None else mask.count("1")
            for queue, mask in zip(self._queues, masks, strict=True)
        }
        self.flush_counts()
        self.beats += 1

    def flush_counts(self) -> None:
        """Write the finished-job counters (kept for the next beat if that fails)."""
        self._pending_counts.extend(self._take_counts())
        if not self._pending_counts:
            return
        try:
            self._slot.run(lambda store: store.record_queue_stats(self._pending_counts))
            self._pending_counts = []
        except CONNECTION_ERRORS:
            if len(self._pending_counts) > 10_000:  # a long outage: keep memory bounded
                self._pending_counts = self._pending_counts[-1000:]
            raise
