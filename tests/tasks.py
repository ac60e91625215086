"""Tasks used by the tests (importable by worker subprocesses)."""

from __future__ import annotations

import asyncio
from typing import Any

from django_pgqueue import compat
from django_pgqueue import task as pgqueue_task

# Django's own decorator where it passes our options on (the way the README writes
# tasks); on Django 6.0, whose decorator rejects them, the package's own.
task: Any = compat.task if compat.TASK_DECORATOR_TAKES_OPTIONS else pgqueue_task


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


# ---------------------------------------------------------------- ledger tasks (workers)
def _ledger(context: Any, event: str, label: str = "") -> None:
    from tests import ledger

    ledger.write(
        context.job_id,
        event,
        attempt=context.attempt,
        lease_generation=context.lease_generation,
        label=label,
    )


@task(takes_context=True)
def ledger_sleep(context: Any, seconds: float = 0.0, label: str = "") -> dict[str, Any]:
    """Record start, sleep (stopping early if cancelled), record end; return who ran it."""
    import os

    _ledger(context, "start", label)
    if seconds and context.wait_cancelled(seconds):
        _ledger(context, "cancelled", label)
    _ledger(context, "end", label)
    return {"pid": os.getpid(), "label": label, "attempt": context.attempt}


@task(takes_context=True, max_attempts=3)
def ledger_poison(context: Any) -> None:
    """Kill the worker process running it, every time (an OOM-killed job, say)."""
    import os
    import signal

    _ledger(context, "start")
    os.kill(os.getpid(), signal.SIGKILL)


@task(takes_context=True)
def ledger_die_after_return(context: Any) -> str:
    """Return normally; the test app kills the worker right after (first attempt only)."""
    _ledger(context, "end")
    return f"attempt {context.attempt}"


@task(takes_context=True, max_attempts=3)
def ledger_flaky(context: Any, fail_times: int = 1) -> int:
    """Fail the first ``fail_times`` attempts, then succeed."""
    _ledger(context, "start")
    if context.attempt <= fail_times:
        raise RuntimeError(f"flaky failure on attempt {context.attempt}")
    return context.attempt


@task(takes_context=True, max_attempts=3)
def ledger_steps(context: Any) -> list[str]:
    """A three-step job that fails after step "rendered" once and resumes from it."""
    done = []
    if context.step is None:
        done.append("render")
        context.set_step("rendered")
    if context.step == "rendered":
        if context.attempt == 1:
            _ledger(context, "crash-after-render")
            raise RuntimeError("upload failed")
        done.append("upload")
        context.set_step("uploaded")
    done.append("email")
    context.set_step("emailed")
    _ledger(context, "done", ",".join(done))
    return done


@task(takes_context=True, atomic=True)
def ledger_atomic_order(context: Any, lose_lease: bool = False) -> int:
    """Write an Order in the job's transaction; optionally lose the lease before returning."""
    from tests.models import Order

    _ledger(context, "start")
    Order.objects.create(job_id=context.job_id, note="atomic")
    if lose_lease:
        # Another worker takes over: the lease expires and housekeeping recovers it.
        from django_pgqueue.manager import PsycopgRunner, QueueStore
        from django_pgqueue.pgconn import connect

        with connect("default", prepare=False) as conn:
            conn.execute(
                "UPDATE django_pgqueue_job SET lease_expires_at = now() - interval '1 second' "
                "WHERE id = %s",
                [context.job_id],
            )
            QueueStore(PsycopgRunner(conn, "default")).reap_expired()
    return context.job_id


@task(takes_context=True)
def ledger_order_plain(context: Any, fail: bool = False) -> int:
    """Write an Order outside any job transaction, then optionally fail."""
    from tests.models import Order

    Order.objects.create(job_id=context.job_id, note="plain")
    if fail:
        raise RuntimeError("failed after writing")
    return context.job_id


@task(takes_context=True, timeout=1.0, max_attempts=1)
def ledger_overrun(context: Any, seconds: float = 30.0) -> None:
    """Run past the 1 second timeout, noticing cancellation."""
    _ledger(context, "start")
    if context.wait_cancelled(seconds):
        _ledger(context, "cancelled")


@task(timeout=0.5, max_attempts=1)
async def async_overrun(seconds: float = 30.0) -> None:
    """An async task past its timeout."""
    await asyncio.sleep(seconds)


@task(takes_context=True)
def ledger_sequence(context: Any, key: str, sequence: int) -> None:
    """Record start and end of one job of a partition, with a short pause between."""
    import time

    _ledger(context, "start", f"{key}:{sequence}")
    time.sleep(0.002)
    _ledger(context, "end", f"{key}:{sequence}")


@task
def signal_probe(value: int) -> int:
    """The test app records task_started/task_finished for this task in the ledger."""
    return value


# ---------------------------------------------------------------- the typed decorator
@pgqueue_task(queue_name="reports", max_attempts=2, timeout=30.0, partition_key="reports")
def typed_report(name: str) -> str:
    """Declared with django_pgqueue.task."""
    return name.upper()


@task(takes_context=True)
def scheduled_probe(context: Any, label: str = "") -> dict[str, Any]:
    """Return the schedule and fire time the job was enqueued for (periodic tests)."""
    fire_time = context.fire_time
    return {
        "schedule": context.schedule,
        "fire_time": fire_time.isoformat() if fire_time else None,
        "label": label,
    }
