"""Tasks used by the tests (importable by worker subprocesses)."""

from __future__ import annotations

import asyncio
import time
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


@task
def add_slowly(a: int, b: int, seconds: float = 0.005) -> int:
    """Return a + b after a pause, so a drain lasts long enough to be interrupted."""
    time.sleep(seconds)
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
        from django_pgqueue.store.pgconn import connect
        from django_pgqueue.store.queue import QueueStore
        from django_pgqueue.store.runners import PsycopgRunner

        # One transaction: the worker's heartbeat would renew the expired lease in between.
        with connect("default", prepare=False) as conn, conn.transaction():
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


# ---------------------------------------------------------------- results and failures
@task
def echo(*args: Any, **kwargs: Any) -> dict[str, Any]:
    """Return exactly what the task received (types included)."""
    return {
        "args": [[type(value).__name__, value] for value in args],
        "kwargs": {name: [type(value).__name__, value] for name, value in kwargs.items()},
    }


@task
def returns_mapping(kind: str) -> Any:
    """Return a Mapping or str subclass that Django stores as its plain form."""
    import collections
    import enum

    from django.db import models

    class Colour(models.TextChoices):
        RED = "red", "Red"

    class Size(enum.IntEnum):
        LARGE = 3

    values = {
        "ordered": lambda: collections.OrderedDict([("b", 1), ("a", [2])]),
        "default": lambda: collections.defaultdict(list, {"x": [1]}),
        "choice": lambda: Colour.RED,
        "nested": lambda: {"colour": Colour.RED, "size": Size.LARGE, "pair": (1, 2)},
        "bytes": lambda: b"caf\xc3\xa9",
        "wide_float": lambda: [1e20, 1.5e300, 0.1],
    }
    return values[kind]()


@task(max_attempts=3)
def returns_unstorable(kind: str, marker_job: int = 0) -> Any:
    """Do the work (a ledger entry), then return something that cannot be stored."""
    from tests import ledger

    if marker_job:
        ledger.write(marker_job, "side-effect")
    values = {
        "set": lambda: {1, 2},
        "nan": lambda: {"ratio": float("nan")},
        "nul": lambda: "a\x00b",
        "surrogate": lambda: ["\ud800"],
        "object": object,
        "huge_int": lambda: 10**5000,
    }
    return values[kind]()


@task(takes_context=True, atomic=True, max_attempts=3)
def atomic_returns_unstorable(context: Any) -> Any:
    """Write an Order in the job's transaction, then return a set."""
    from tests.models import Order

    Order.objects.create(job_id=context.job_id, note="atomic")
    return {1, 2}


@task(max_attempts=3)
def signal_exit(kind: str) -> None:
    """Leave the way a script would: SystemExit, KeyboardInterrupt or exit()."""
    import sys

    if kind == "system_exit":
        sys.exit(3)
    if kind == "keyboard_interrupt":
        raise KeyboardInterrupt("stop")
    exit("bye")  # the site builtin: raises SystemExit("bye")  # noqa: PLR1722


@task(max_attempts=3)
async def signal_async_exit() -> None:
    """An async task calling sys.exit()."""
    import sys

    await asyncio.sleep(0)
    sys.exit(4)


class UnprintableError(Exception):
    """An error whose message cannot be rendered."""

    def __str__(self) -> str:
        raise RuntimeError("__str__ is broken")


@task(max_attempts=3)
def raises_unprintable() -> None:
    """Raise an exception whose __str__ raises."""
    raise UnprintableError("hidden")


@task(timeout=30.0, max_attempts=1)
async def async_own_timeout() -> None:
    """Raise the task's own TimeoutError, well within the job's timeout."""
    await asyncio.sleep(0)
    raise TimeoutError("the upstream API timed out")


@task(takes_context=True, atomic=True)
def atomic_finish_clock(context: Any) -> str:
    """Hold the job's transaction open a while, then return the database clock at the end."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_sleep(0.2)")  # work that takes time inside the transaction
        cursor.execute("SELECT clock_timestamp()")
        finished: Any = cursor.fetchone()[0]
    return str(finished.isoformat())


# ---------------------------------------------------------------- outcomes the database refuses
#: An exception whose class path (module + qualname) is longer than last_error_class.
LongNamedError = type("Overlong" + "Name" * 70 + "Error", (RuntimeError,), {"__module__": __name__})

#: Kinds of outcome PostgreSQL refuses as they are: NUL in text, lone surrogates (not
#: encodable as UTF-8), a class path longer than its column.
POISON_OUTCOMES = (
    "nul_message",
    "long_class_path",
    "surrogate_message",
    "surrogate_result",
    "nul_result",
)


def _poison_outcome(kind: str) -> Any:
    if kind == "nul_message":
        raise ValueError("before\x00after")
    if kind == "long_class_path":
        raise LongNamedError("a long class path")
    if kind == "surrogate_message":
        raise ValueError("lone \udc80 surrogate")
    if kind == "surrogate_result":
        return {"text": "lone \udc80 surrogate"}
    if kind == "nul_result":
        return {"text": "before\x00after"}
    raise AssertionError(kind)


@task(takes_context=True, max_attempts=1)
def ledger_poison_outcome(context: Any, kind: str) -> Any:
    """Raise or return text PostgreSQL refuses to store (see ``POISON_OUTCOMES``)."""
    _ledger(context, "start", kind)
    return _poison_outcome(kind)


@task(takes_context=True, max_attempts=3)
def ledger_poison_outcome_retried(context: Any, kind: str) -> Any:
    """Like ``ledger_poison_outcome``, with attempts to spare."""
    _ledger(context, "start", kind)
    return _poison_outcome(kind)


@task(takes_context=True, max_attempts=3)
def ledger_exit_poison(context: Any) -> None:
    """End the worker process running it at once, every time (os._exit: no clean-up)."""
    import os

    _ledger(context, "start")
    os._exit(1)


# ---------------------------------------------------------------- handlers past their timeout
@task(takes_context=True, timeout=1.0, max_attempts=1)
def ledger_stubborn(context: Any, seconds: float = 4.0, label: str = "") -> None:
    """Run past the 1 second timeout without noticing cancellation (it cannot be stopped)."""
    import time

    _ledger(context, "start", label)
    time.sleep(seconds)
    _ledger(context, "end", label)


@task(takes_context=True, timeout=4.0, max_attempts=3)
def ledger_overrun_once(context: Any) -> int:
    """Overrun the 4 s timeout on the first attempt; later attempts take 3.2 s, in time."""
    import time

    _ledger(context, "start")
    time.sleep(4.6 if context.attempt == 1 else 3.2)
    _ledger(context, "end")
    return context.attempt


@task(takes_context=True)
def ledger_sleep_through(context: Any, seconds: float = 4.0, later_seconds: float = 5.0) -> int:
    """Sleep without noticing cancellation: ``seconds`` on attempt 1, ``later_seconds`` after."""
    import time

    _ledger(context, "start")
    time.sleep(seconds if context.attempt == 1 else later_seconds)
    _ledger(context, "end")
    return context.attempt


# ---------------------------------------------------------------- bookkeeping beside atomic jobs
@task(takes_context=True, atomic=True)
def ledger_atomic_step_hold(
    context: Any, hold_seconds: float = 6.0, linger_after_return: float = 0.0
) -> int:
    """Record a step inside the job's transaction, then keep that transaction open.

    ``linger_after_return`` is read by a task_finished receiver of the test app, which
    sleeps that long after the transaction committed (a slow receiver).
    """
    import time

    _ledger(context, "start")
    context.set_step("holding")  # locks the job's row until the transaction ends
    _ledger(context, "step-set")
    time.sleep(hold_seconds)
    _ledger(context, "return")
    return context.attempt


@task(takes_context=True)
def ledger_plain_step(context: Any, before: float = 1.0, after: float = 2.0) -> int:
    """Record a step ``before`` seconds in, timing the call (ledger "step", label = seconds).

    The ledger's "return" entry is written just before the handler returns.
    """
    import time

    _ledger(context, "start")
    if context.wait_cancelled(before):
        _ledger(context, "cancelled")
        return context.attempt
    called = time.monotonic()
    context.set_step("halfway")
    _ledger(context, "step", f"{time.monotonic() - called:.3f}")
    if context.wait_cancelled(after):
        _ledger(context, "cancelled")
    _ledger(context, "return")
    return context.attempt


# ---------------------------------------------------------------- soak tasks (test_soak_faults)
# Each records "start" and how it left ("end": returned and its result is storable, "fail":
# about to raise, "late-end": returned after its worker gave up on it, "end-unstorable":
# returned a value the database refuses) in the ledger, labelled with its kind.
def _soak_result(context: Any) -> dict[str, Any]:
    return {"attempt": context.attempt, "generation": context.lease_generation}


@task(takes_context=True, max_attempts=5)
def soak_plain(
    context: Any, kind: str = "plain", seconds: float = 0.0, fail_first: bool = False
) -> dict[str, Any]:
    """A short job; with ``fail_first`` it raises on its first attempt."""
    import time

    _ledger(context, "start", kind)
    if seconds:
        time.sleep(seconds)
    if fail_first and context.attempt == 1:
        _ledger(context, "fail", kind)
        raise RuntimeError(f"{kind}: planned failure of attempt 1")
    _ledger(context, "end", kind)
    return _soak_result(context)


@task(takes_context=True, timeout=0.5, max_attempts=5)
def soak_overrun(context: Any, seconds: float = 1.2) -> dict[str, Any]:
    """Overrun the 0.5 s timeout on the first attempt, in a sleep nothing can interrupt."""
    import time

    _ledger(context, "start", "overrun")
    if context.attempt == 1:
        time.sleep(seconds)
        _ledger(context, "late-end" if context.cancelled else "end", "overrun")
        return _soak_result(context)
    _ledger(context, "end", "overrun")
    return _soak_result(context)


@task(takes_context=True, atomic=True, max_attempts=5)
def soak_atomic(context: Any, hold: float = 1.0) -> dict[str, Any]:
    """Record steps and a domain row in the job's transaction, and hold it open a while."""
    import time

    from django.db import transaction

    from tests import ledger
    from tests.models import Order

    _ledger(context, "start", "atomic")
    try:
        context.set_step(f"attempt {context.attempt} started")
        Order.objects.create(job_id=context.job_id, note=f"attempt {context.attempt}")
        time.sleep(hold)
        context.set_step(f"attempt {context.attempt} written")
    except BaseException:
        # Its transaction's connection was cut (a terminated backend, a server restart)
        # or its lease was lost: the execution ends by raising.
        _ledger(context, "fail", "atomic")
        raise
    job_id, attempt, generation = context.job_id, context.attempt, context.lease_generation
    transaction.on_commit(
        lambda: ledger.write(
            job_id, "commit", attempt=attempt, lease_generation=generation, label="atomic"
        )
    )
    _ledger(context, "end", "atomic")
    return _soak_result(context)


@task(takes_context=True, max_attempts=3)
def soak_poison(context: Any, how: str) -> Any:
    """Fail with, or return, text the database refuses (NUL, lone surrogates)."""
    kind = f"poison-{how}"
    _ledger(context, "start", kind)
    if how == "nul-message":
        _ledger(context, "fail", kind)
        raise ValueError("poison message with a NUL \x00 inside")
    if how == "surrogate-message":
        _ledger(context, "fail", kind)
        raise ValueError("poison message with a lone surrogate \ud800 inside")
    if how == "surrogate-result":
        _ledger(context, "end-unstorable", kind)
        return {"text": "a lone surrogate \udc00 in a result"}
    _ledger(context, "end-unstorable", kind)
    return {"text": "a NUL \x00 in a result"}


@task(takes_context=True)
def scheduled_probe(context: Any, label: str = "") -> dict[str, Any]:
    """Return the schedule and fire time the job was enqueued for (periodic tests)."""
    fire_time = context.fire_time
    return {
        "schedule": context.schedule,
        "fire_time": fire_time.isoformat() if fire_time else None,
        "label": label,
    }


# ---------------------------------------------------------------- cancelling running jobs
@task(takes_context=True)
def ledger_until_cancelled(context: Any, seconds: float = 60.0) -> str:
    """Poll ``context.cancelled`` (ledger "cancelled" when it turns true), then finish anyway.

    The return value is a late completion: it must never be recorded for a cancelled job.
    """
    _ledger(context, "start")
    if context.wait_cancelled(seconds):
        _ledger(context, "cancelled")
    _ledger(context, "return")
    return "late result"


@task(takes_context=True)
async def ledger_async_until_cancelled(context: Any, seconds: float = 60.0) -> str:
    """Sleep; on CancelledError (ledger "cancelled") swallow it and finish anyway."""
    _ledger(context, "start")
    try:
        await asyncio.sleep(seconds)
    except asyncio.CancelledError:
        _ledger(context, "cancelled")
    _ledger(context, "return")
    return "late result"


@task(takes_context=True, atomic=True)
def ledger_atomic_until_cancelled(context: Any, seconds: float = 60.0) -> str:
    """An atomic task that never locks its row: a cancel reaches it; its completion fails."""
    _ledger(context, "start")
    if context.wait_cancelled(seconds):
        _ledger(context, "cancelled")
    _ledger(context, "return")
    return "late result"


@task(takes_context=True, max_attempts=1)
def ledger_cancel_linger(context: Any, linger: float = 2.0, seconds: float = 60.0) -> str:
    """Wait to be cancelled (ledger "cancelled"), then keep running ``linger`` seconds.

    A handler that does not stop at once: its concurrency slot and partition turn must
    stay taken until it returns ("return").
    """
    _ledger(context, "start")
    if context.wait_cancelled(seconds):
        _ledger(context, "cancelled")
        time.sleep(linger)
    _ledger(context, "return")
    return "late result"


# ---------------------------------------------------------------- workflows (after=)
@task(takes_context=True)
def ledger_price(context: Any, item: int) -> int:
    """Price one line item (ledgered): its number times ten."""
    _ledger(context, "start", f"price:{item}")
    _ledger(context, "end", f"price:{item}")
    return item * 10


@task(takes_context=True)
def ledger_fan_in(context: Any) -> dict[str, Any]:
    """Fan in: record the run, return every result it runs after."""
    results = context.dependency_results
    _ledger(context, "start", f"fan_in:{len(results)}")
    _ledger(context, "end", "fan_in")
    return {"results": results}


@task(takes_context=True)
def ledger_chain_step(context: Any, label: str, seconds: float = 0.0) -> list[str]:
    """One chain step: its predecessor's list plus its own label (ledgered, may sleep)."""
    import time

    _ledger(context, "start", label)
    if seconds:
        time.sleep(seconds)
    _ledger(context, "end", label)
    return [*(context.previous_result or []), label]


@task(takes_context=True, concurrency_limit=3)
def ledger_limited(context: Any, seconds: float = 0.0, label: str = "") -> None:
    """Runs at most 3 at a time per concurrency key (per task without one)."""
    _ledger(context, "start", label)
    time.sleep(seconds)
    _ledger(context, "end", label)


@task(takes_context=True, concurrency_limit=2)
def ledger_task_limited(context: Any, seconds: float = 0.0) -> None:
    """At most 2 jobs of this task in flight (no key: the task is the key)."""
    _ledger(context, "start", "task")
    time.sleep(seconds)
    _ledger(context, "end", "task")


@task(takes_context=True, rate_limit="20/s")
def ledger_rated(context: Any, label: str = "rated") -> None:
    """At most 20 starts a second across all workers."""
    _ledger(context, "start", label)


#: Called with the job id right after an atomic_commit_window task's transaction
#: commits, before the worker learns it did (test_lease_loss_races).
COMMIT_PROBES: list[Any] = []


@task(takes_context=True, atomic=True)
def atomic_commit_window(context: Any) -> int:
    """Run each of COMMIT_PROBES the moment this attempt's transaction commits."""
    import functools

    from django.db import transaction

    for probe in COMMIT_PROBES:
        transaction.on_commit(functools.partial(probe, context.job_id))
    return context.attempt


# ---------------------------------------------------------------- snoozes
def _snoozes(job_id: int) -> int:
    from django_pgqueue.models import Job

    return int(Job.objects.values_list("snoozes", flat=True).get(pk=job_id))


@task(takes_context=True, max_attempts=1, max_snoozes=3)
def ledger_snooze(context: Any, times: int = 1, seconds: float = 0.0, how: str = "raise") -> Any:
    """Snooze ``times`` times (raising or returning Snooze), then return what it saw."""
    from django_pgqueue import Snooze

    snoozes = _snoozes(context.job_id)
    if snoozes < times:
        _ledger(context, "snooze", str(snoozes))
        if how == "return":
            return Snooze(seconds)
        raise Snooze(seconds)
    _ledger(context, "done", str(snoozes))
    return {"attempt": context.attempt, "snoozes": snoozes}


@task(takes_context=True, max_attempts=1, max_snoozes=3)
async def ledger_async_snooze(context: Any, times: int = 1) -> Any:
    """The async twin of ledger_snooze (always raises)."""
    from asgiref.sync import sync_to_async

    from django_pgqueue import Snooze

    snoozes = await sync_to_async(_snoozes)(context.job_id)
    if snoozes < times:
        await sync_to_async(_ledger)(context, "snooze", str(snoozes))
        raise Snooze(0)
    await sync_to_async(_ledger)(context, "done", str(snoozes))
    return {"attempt": context.attempt, "snoozes": snoozes}


@task(takes_context=True, max_attempts=2, max_snoozes=2)
def ledger_snooze_forever(context: Any) -> None:
    """Ask to snooze every time: past max_snoozes the job is dead-lettered."""
    from django_pgqueue import Snooze

    _ledger(context, "snooze")
    raise Snooze(0)


@task(takes_context=True, atomic=True, max_snoozes=5)
def ledger_atomic_snooze(context: Any, times: int = 1) -> int:
    """Write an Order, then snooze ``times`` times: a snooze rolls the Order back."""
    from django_pgqueue import Snooze
    from tests.models import Order

    snoozes = _snoozes(context.job_id)
    # One row per job: a rolled-back snooze leaves none, so the create never collides.
    Order.objects.create(job_id=context.job_id, note=f"after {snoozes} snoozes")
    if snoozes < times:
        return Snooze(0)  # type: ignore[return-value]
    return snoozes


@task(takes_context=True, max_attempts=1)
def ledger_bad_snooze(context: Any) -> None:
    """Ask for a snooze of a negative length: the attempt fails with InvalidOption."""
    from django_pgqueue import Snooze

    raise Snooze(-5)


# ---------------------------------------------------------------- middleware
@task
def tenant_probe(**kwargs: Any) -> dict[str, Any]:
    """Return the tenant tests.middleware.Tenant set, and the kwargs the task got."""
    from tests.middleware import EVENTS, TENANT

    EVENTS.append("task")
    return {"tenant": TENANT.get(), "kwargs": kwargs}


@task
async def async_tenant_probe(**kwargs: Any) -> dict[str, Any]:
    """The async twin of tenant_probe."""
    from tests.middleware import EVENTS, TENANT

    EVENTS.append("async task")
    return {"tenant": TENANT.get(), "kwargs": kwargs}


# ---------------------------------------------------------------- stuck handlers
@task(takes_context=True, timeout=1.0, max_attempts=2)
def ledger_stuck(context: Any, seconds: float = 60.0) -> int:
    """On attempt 1, sleep ``seconds`` ignoring its timeout and any cancel; then return."""
    import time

    _ledger(context, "start")
    if context.attempt == 1:
        time.sleep(seconds)
    _ledger(context, "end")
    return int(context.attempt)


# ---------------------------------------------------------------- batched handlers
def _batch_outcome(job: Any, leader: int) -> Any:
    """What a batched test task answers for one job, by its ``do`` keyword argument."""
    from django_pgqueue import PermanentError, Snooze
    from tests import ledger

    ledger.write(job.id, "batch", attempt=job.attempt, label=str(leader))
    do = job.kwargs.get("do", "ok")
    if do == "fail" or (do == "fail_once" and job.attempt == 1):
        return RuntimeError(f"job {job.id} failed in its batch")
    if do == "permanent":
        return PermanentError(f"job {job.id} cannot be done")
    if do == "snooze_once" and _snoozes(job.id) == 0:
        return Snooze(0)
    return {"job": job.id, "value": job.kwargs.get("value"), "attempt": job.attempt}


@pgqueue_task(batch_size=5, max_attempts=3)
def ledger_batch(jobs: list[Any]) -> dict[int, Any]:
    """Answer for each job of the batch by its ``do`` argument; a "raise" job raises."""
    if any(job.kwargs.get("do") == "raise" for job in jobs):
        raise ValueError(f"batch of {len(jobs)} raised")
    leader = jobs[0].id
    return {job.id: _batch_outcome(job, leader) for job in jobs}


@pgqueue_task(batch_size=5, max_attempts=2)
async def async_ledger_batch(jobs: list[Any]) -> dict[int, Any]:
    """The async twin of ledger_batch."""
    from asgiref.sync import sync_to_async

    leader = jobs[0].id
    return {job.id: await sync_to_async(_batch_outcome)(job, leader) for job in jobs}


@pgqueue_task(batch_size=3, max_attempts=2)
def batch_returns_nothing(jobs: list[Any]) -> None:
    """Succeed every job of the batch without a result."""
    from tests import ledger

    for job in jobs:
        ledger.write(job.id, "batch", attempt=job.attempt, label=str(jobs[0].id))


@pgqueue_task(batch_size=3, max_attempts=1)
def batch_answers_for_strangers(jobs: list[Any]) -> dict[int, Any]:
    """Answer for a job that is not in the batch (a bug the worker must refuse)."""
    return {-1: "not mine", **{job.id: "ok" for job in jobs}}


@pgqueue_task(batch_size=4, max_attempts=2, timeout=1.0)
def slow_batch(jobs: list[Any]) -> None:
    """Sleep past the timeout on the first attempt of the batch's first job."""
    from tests import ledger

    for job in jobs:
        ledger.write(job.id, "batch", attempt=job.attempt, label=str(jobs[0].id))
    if jobs[0].attempt == 1:
        time.sleep(float(jobs[0].kwargs.get("seconds", 2.5)))


@pgqueue_task(batch_size=10, max_attempts=1)
def held_batch(jobs: list[Any]) -> None:
    """Hold the batch until the test says so (``release`` file), past several heartbeats."""
    import os

    from tests import ledger

    for job in jobs:
        ledger.write(job.id, "batch", attempt=job.attempt, label=str(jobs[0].id))
    path = jobs[0].kwargs["release"]
    deadline = time.monotonic() + 60
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.05)


@pgqueue_task(batch_size=5, max_attempts=3, concurrency_limit=1)
def limited_batch(jobs: list[Any]) -> dict[int, Any]:
    """ledger_batch under a concurrency limit of one (key task:<path>)."""
    leader = jobs[0].id
    return {job.id: _batch_outcome(job, leader) for job in jobs}
