"""Parameters of claim_batch for tests that send its text directly."""

from __future__ import annotations

from typing import Any

from django_pgqueue.store.statements.lease import floor_params


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
