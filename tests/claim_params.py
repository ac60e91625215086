"""Parameters of claim_batch that tests sending its text directly leave at the head."""

from __future__ import annotations

from typing import Any

from django_pgqueue.store.statements.lease import floor_params


def no_flow_floors(queues: int) -> dict[str, list[Any]]:
    """Return the partition and key floor arrays for ``queues`` queues, all at the head."""
    return {**floor_params("part_", [None] * queues), **floor_params("key_", [None] * queues)}
