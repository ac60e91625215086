"""Checked by mypy (strict) in ``make lint``, never run: the public decorator is typed.

A user's ``from django_pgqueue import task`` must give type checkers the real signature,
not the ``object`` of the package's lazy ``__getattr__``.
"""

from __future__ import annotations

from typing import assert_type

from django_pgqueue import task
from django_pgqueue.features.periodic import periodic
from django_pgqueue.tasks.backend import PgQueueTask


@task(queue_name="emails", priority=10, max_attempts=8, timeout=60.0, atomic=True)
def send_receipt(order_id: int) -> str:
    """A task with every option of the decorator."""
    return str(order_id)


@task
def bare(value: int) -> int:
    """A task without options."""
    return value


@periodic("0 2 * * *", timezone="Europe/Berlin", downtime="catch_up", catch_up=2)
@task(queue_name="reports")
def nightly() -> None:
    """A periodic task: @periodic keeps the task's type."""


assert_type(send_receipt, PgQueueTask)
assert_type(nightly, PgQueueTask)
assert_type(bare, PgQueueTask)
assert_type(send_receipt.using(idempotency_key="k", partition_key="p"), PgQueueTask)
