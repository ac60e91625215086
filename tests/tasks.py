"""Tasks used by the tests (importable by worker subprocesses)."""

from __future__ import annotations

import asyncio
from typing import Any

from django_pgqueue.compat import task


@task
def noop() -> None:
    """Do nothing."""


@task(queue_name="emails", priority=10, max_attempts=8)
def send_receipt(order_id: int) -> dict[str, Any]:
    """Pretend to send a receipt."""
    return {"order": order_id, "sent": True}


@task
def add(a: int, b: int) -> int:
    """Return a + b."""
    return a + b


@task(max_attempts=3)
def always_fails(message: str = "boom") -> None:
    """Raise every time."""
    raise ValueError(message)


@task
async def async_add(a: int, b: int) -> int:
    """Return a + b, asynchronously."""
    await asyncio.sleep(0)
    return a + b


@task(takes_context=True)
def report_attempt(context: Any) -> int:
    """Return the attempt number the context reports."""
    return int(context.attempt)


def not_a_task() -> None:
    """A plain function: a job pointing here has an unknown task."""
