"""The options a ``PgQueueTask`` adds to Django's, checked where the task is declared."""

from __future__ import annotations

import inspect
import math
from typing import Any

from django_pgqueue.exceptions import InvalidOption
from django_pgqueue.limits import (
    KEY_MAX_LENGTH,
    MAX_ATTEMPTS_LIMIT,
    MAX_BATCH_SIZE,
    MAX_SNOOZES_LIMIT,
)
from django_pgqueue.states import BlockerFailure
from django_pgqueue.store.coalescing import check_coalescing
from django_pgqueue.store.flow_limits import check_limit, parse_rate
from django_pgqueue.store.intake import blocker_ids
from django_pgqueue.store.payload import check_key

__all__ = ["validate_options"]


def validate_options(task: Any) -> None:
    """Raise :class:`InvalidOption` naming the first of a ``PgQueueTask``'s options out of range."""
    if task.max_attempts is not None and (
        isinstance(task.max_attempts, bool)
        or not isinstance(task.max_attempts, int)
        or not 1 <= task.max_attempts <= MAX_ATTEMPTS_LIMIT
    ):
        raise InvalidOption(
            "max_attempts",
            f"{task.max_attempts!r} is not a whole number in 1..{MAX_ATTEMPTS_LIMIT}",
        )
    if task.timeout is not None and (
        isinstance(task.timeout, bool)
        or not isinstance(task.timeout, int | float)
        or not math.isfinite(task.timeout)
        or task.timeout <= 0
    ):
        raise InvalidOption("timeout", f"{task.timeout!r} is not a positive number of seconds")
    if task.max_snoozes is not None and (
        isinstance(task.max_snoozes, bool)
        or not isinstance(task.max_snoozes, int)
        or not 0 <= task.max_snoozes <= MAX_SNOOZES_LIMIT
    ):
        raise InvalidOption(
            "max_snoozes",
            f"{task.max_snoozes!r} is not a whole number in 0..{MAX_SNOOZES_LIMIT}",
        )
    if not isinstance(task.atomic, bool):
        raise InvalidOption("atomic", f"must be True or False, not {task.atomic!r}")
    if task.atomic and inspect.iscoroutinefunction(task.func):
        # Django's transaction.atomic() cannot span an await.
        raise InvalidOption("atomic", "async tasks cannot be atomic")
    _check_batch(task)
    check_key("idempotency_key", task.idempotency_key, max_length=KEY_MAX_LENGTH)
    check_key("partition_key", task.partition_key, max_length=KEY_MAX_LENGTH)
    check_coalescing(task.coalesce_key, task.debounce, task.idempotency_key)
    blocker_ids(task.after)
    if task.on_blocker_failure not in BlockerFailure.values:
        raise InvalidOption(
            "on_blocker_failure",
            f"must be one of {', '.join(BlockerFailure.values)}, not {task.on_blocker_failure!r}",
        )
    check_key("concurrency_key", task.concurrency_key, max_length=KEY_MAX_LENGTH)
    if task.concurrency_limit is not None:
        check_limit("concurrency_limit", task.concurrency_limit)
    if task.rate_limit is not None:
        parse_rate("rate_limit", task.rate_limit)
    if task.partition_key is not None and (
        task.concurrency_key is not None
        or task.concurrency_limit is not None
        or task.rate_limit is not None
    ):
        raise InvalidOption(
            "concurrency_key",
            "a task has a partition key (one in flight, in order) or a concurrency limit "
            "(N in flight, any order), not both",
        )


def _check_batch(task: Any) -> None:
    batch_size = task.batch_size
    if batch_size is None:
        return
    if (
        isinstance(batch_size, bool)
        or not isinstance(batch_size, int)
        or not 1 <= batch_size <= MAX_BATCH_SIZE
    ):
        raise InvalidOption(
            "batch_size", f"{batch_size!r} is not a whole number in 1..{MAX_BATCH_SIZE}"
        )
    # One call runs many jobs: a context (one job's) or a transaction completing one
    # job's lease has no meaning for it.
    if task.takes_context:
        raise InvalidOption("batch_size", "a batched task cannot take a context")
    if task.atomic:
        raise InvalidOption("batch_size", "a batched task cannot be atomic")
