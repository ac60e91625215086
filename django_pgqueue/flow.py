"""Flow control: which concurrency key and limit a job gets, checked at the boundary.

One mechanism, one vocabulary. A *partition key* means "one job in flight at a time, in
enqueue order". A *concurrency key* means "at most N jobs in flight at a time, in claim
order (priority, then id)". Both are enforced by the claim statement against a state row
per key (``django_pgqueue_partition``, ``django_pgqueue_concurrency``), never by a
worker-side counter, so they hold across every worker process and host.

Where a job's concurrency key comes from, most specific first:

1. ``task.using(concurrency_key=...)`` (or the decorator's ``concurrency_key``): the
   limit is the task's ``concurrency_limit``, else ``PGQUEUE_CONCURRENCY_LIMITS
   ["task:<path>"]``; it applies per key.
2. A task limit without a key (decorator ``concurrency_limit=N`` or the
   ``"task:<path>"`` setting): the key is ``task:<path>``, so at most N jobs of the task.
3. A queue limit (``"queue:<name>"`` in the setting): the key is ``queue:<name>``.

A job has one concurrency key (the most specific one); combining a task limit with a
queue limit on the same job is not supported.
"""

from __future__ import annotations

from .exceptions import InvalidOption
from .limits import KEY_MAX_LENGTH
from .payload import check_key

__all__ = ["CONCURRENCY_LIMIT_MAX", "check_concurrency", "check_limit", "resolve_concurrency"]

#: Highest limit accepted: beyond it, a limit is no limit.
CONCURRENCY_LIMIT_MAX = 100_000


def check_limit(name: str, limit: object) -> int:
    """Return ``limit`` if it is a valid concurrency limit; raise :class:`InvalidOption`."""
    if isinstance(limit, bool) or not isinstance(limit, int):
        raise InvalidOption(name, f"must be an integer, not {limit!r}")
    if not 1 <= limit <= CONCURRENCY_LIMIT_MAX:
        raise InvalidOption(name, f"{limit} is outside 1..{CONCURRENCY_LIMIT_MAX}")
    return limit


def check_concurrency(
    key: str | None, limit: int | None, *, partition_key: str | None
) -> tuple[str | None, int | None]:
    """Validate a job's concurrency key and limit (both or neither)."""
    if key is None and limit is None:
        return None, None
    if key is None:
        raise InvalidOption("concurrency_limit", "a limit needs a concurrency_key")
    check_key("concurrency_key", key, max_length=KEY_MAX_LENGTH)
    if limit is None:
        raise InvalidOption(
            "concurrency_key",
            f"{key!r} has no limit: set concurrency_limit on the task, or "
            '"task:<path>" in PGQUEUE_CONCURRENCY_LIMITS',
        )
    check_limit("concurrency_limit", limit)
    if partition_key is not None:
        raise InvalidOption(
            "concurrency_key",
            "a job has a partition key (one in flight, in order) or a concurrency key "
            "(N in flight, any order), not both",
        )
    return key, limit


def resolve_concurrency(
    task_path: str,
    queue: str,
    key: str | None,
    limit: int | None,
    declared: dict[str, int],
) -> tuple[str | None, int | None]:
    """Return the concurrency key and limit of a job (see the module docstring)."""
    if limit is None:
        limit = declared.get(f"task:{task_path}")
    if key is not None:
        return key, limit
    if limit is not None:
        return f"task:{task_path}", limit
    queue_limit = declared.get(f"queue:{queue}")
    if queue_limit is not None:
        return f"queue:{queue}", queue_limit
    return None, None
