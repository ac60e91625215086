"""Parameters of claim_batch and enqueue_many for tests that send their text directly."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django_pgqueue.store.intake import EnqueueDefaults, jobs_document, validated_many
from django_pgqueue.store.notices import flow_channel
from django_pgqueue.store.statements.lease import floor_params
from django_pgqueue.store.values import JobSpec


def no_flow_floors(queues: int) -> dict[str, list[Any]]:
    """Return the partition and key floor arrays for ``queues`` queues, all at the head."""
    return {**floor_params("part_", [None] * queues), **floor_params("key_", [None] * queues)}


def claim_params(limit: int, *, worker_id: str = "probe", **overrides: Any) -> dict[str, Any]:
    """Return the parameters of one claim of up to ``limit`` jobs of the default queue, in
    every bucket, with every floor at the head; ``overrides`` replace any of them."""
    return {
        "queues": ["default"],
        "bucket_masks": [None],
        "queue_limits": [limit],
        "total_limit": limit,
        "worker_id": worker_id,
        "lease_seconds": 30.0,
        **floor_params("", [None]),
        **no_flow_floors(1),
        **overrides,
    }


def enqueue_many_params(specs: Sequence[JobSpec]) -> dict[str, Any]:
    """Return the parameters of one bulk enqueue of ``specs`` (no dependencies)."""
    prepared = validated_many(list(specs), EnqueueDefaults.read())
    for params in prepared:
        del params["after"], params["on_blocker_failure"]
    return {"channel": "c", "flow_channel": flow_channel(), "jobs": jobs_document(prepared)}
