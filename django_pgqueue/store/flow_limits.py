"""Flow control: which key, concurrency limit and rate limit a job gets, checked early.

One mechanism, one vocabulary. A *partition key* means "one job in flight at a time, in
enqueue order". A *concurrency key* means "at most N jobs in flight at a time, in claim
order (priority, then id)", and optionally "at most N starts per period" (a rate
limit). Both are enforced by the claim statement against a state row per key
(``django_pgqueue_partition``, ``django_pgqueue_concurrency``), never by a worker-side
counter, so they hold across every worker process and host.

Where a job's key comes from, most specific first:

1. ``task.using(concurrency_key=...)`` (or the decorator's ``concurrency_key``): the
   limits are the task's ``concurrency_limit`` / ``rate_limit``, else
   ``PGQUEUE_CONCURRENCY_LIMITS["task:<path>"]`` / ``PGQUEUE_RATE_LIMITS["task:<path>"]``;
   they apply per key.
2. A task limit without a key: the key is ``task:<path>`` (the task as a whole).
3. A queue limit (``"queue:<name>"`` in the settings): the key is ``queue:<name>``.

A job counts against one key, the most specific one.
"""

from __future__ import annotations

from dataclasses import dataclass

from django_pgqueue.exceptions import InvalidOption
from django_pgqueue.limits import (
    CONCURRENCY_LIMIT_MAX,
    KEY_MAX_LENGTH,
    Rate,
    check_limit,
    parse_rate,
)
from django_pgqueue.store.payload import check_key

__all__ = [
    "CONCURRENCY_LIMIT_MAX",
    "FlowLimits",
    "Rate",
    "check_limit",
    "parse_rate",
    "resolve_limits",
]


@dataclass(frozen=True, slots=True)
class FlowLimits:
    """A job's key and limits, as stored with it (all None: no limit)."""

    key: str | None = None
    concurrency: int | None = None
    rate: Rate | None = None


def resolve_limits(
    task_path: str,
    queue: str,
    key: str | None,
    concurrency: int | None,
    rate: str | Rate | None,
    *,
    partition_key: str | None,
    concurrency_limits: dict[str, int],
    rate_limits: dict[str, str],
) -> FlowLimits:
    """Return the key and limits of a job (see the module docstring), validated."""
    explicit = key is not None or concurrency is not None or rate is not None
    if not explicit and (partition_key is not None or not (concurrency_limits or rate_limits)):
        # Settings leave partitioned jobs alone: they run one at a time already.
        return FlowLimits()
    if concurrency is None:
        concurrency = concurrency_limits.get(f"task:{task_path}")
    if rate is None:
        rate = rate_limits.get(f"task:{task_path}")
    if key is None and (concurrency is not None or rate is not None):
        key = f"task:{task_path}"
    if key is None:
        concurrency = concurrency_limits.get(f"queue:{queue}")
        rate = rate_limits.get(f"queue:{queue}")
        if concurrency is None and rate is None:
            return FlowLimits()
        key = f"queue:{queue}"
    check_key("concurrency_key", key, max_length=KEY_MAX_LENGTH)
    if concurrency is None and rate is None:
        raise InvalidOption(
            "concurrency_key",
            f"{key!r} has no limit: set concurrency_limit or rate_limit on the task, or "
            '"task:<path>" in PGQUEUE_CONCURRENCY_LIMITS / PGQUEUE_RATE_LIMITS',
        )
    if concurrency is not None:
        check_limit("concurrency_limit", concurrency)
    parsed = None if rate is None else parse_rate("rate_limit", rate)
    if partition_key is not None:
        raise InvalidOption(
            "concurrency_key",
            "a job has a partition key (one in flight, in order) or a concurrency key "
            "(N in flight, any order), not both",
        )
    return FlowLimits(key, concurrency, parsed)
