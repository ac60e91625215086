"""The django.tasks backend: enqueue through Django's Tasks API, read results back."""

from __future__ import annotations

import asyncio
import datetime as dt

import pytest
from asgiref.sync import sync_to_async
from django.db import connections, transaction
from django.utils import timezone

from django_pgqueue.compat import (
    TaskResultDoesNotExist,
    TaskResultStatus,
    task_backends,
    task_enqueued,
)
from django_pgqueue.exceptions import InvalidArguments, LeaseLost, PayloadTooLarge, UnknownTask
from django_pgqueue.models import Job
from django_pgqueue.states import JobStatus
from django_pgqueue.store.partition import bucket_for
from django_pgqueue.store.retry import RetryPolicy
from django_pgqueue.store.values import Failure, JobSpec
from django_pgqueue.tasks.backend import PgQueueBackend, PgQueueTask
from tests import tasks

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def enqueued_signals():
    received = []

    def receiver(sender, task_result, **kwargs):
        received.append(task_result)

    task_enqueued.connect(receiver)
    yield received
    task_enqueued.disconnect(receiver)


def test_backend_is_configured_with_truthful_capabilities():
    backend = task_backends["default"]
    assert isinstance(backend, PgQueueBackend)
    assert backend.supports_defer
    assert backend.supports_async_task
    assert backend.supports_get_result
    assert backend.supports_priority
    assert backend.task_class is PgQueueTask
    assert isinstance(tasks.send_receipt, PgQueueTask)


@pytest.mark.django_db
def test_enqueue_returns_a_ready_result_whose_id_is_the_job_id(enqueued_signals):
    result = tasks.send_receipt.enqueue(7)
    job = Job.objects.get()
    assert result.id == str(job.pk)
    assert result.status == TaskResultStatus.READY
    assert result.args == [7]
    assert result.kwargs == {}
    assert result.enqueued_at == job.created_at
    assert result.backend == "default"
    assert (job.queue, job.priority, job.max_attempts) == ("emails", 10, 8)
    assert job.task_path == "tests.tasks.send_receipt"
    assert enqueued_signals == [result]


@pytest.mark.django_db
def test_using_sets_idempotency_and_partition_keys(enqueued_signals):
    task = tasks.send_receipt.using(idempotency_key="receipt:1", partition_key="customer:9")
    first = task.enqueue(1)
    second = task.enqueue(1)
    assert first.id == second.id
    job = Job.objects.get()
    assert (job.idempotency_key, job.partition_key) == ("receipt:1", "customer:9")
    assert job.partition_bucket == bucket_for("customer:9")
    assert len(enqueued_signals) == 1  # the duplicate enqueued nothing


@pytest.mark.django_db
def test_using_keeps_other_options_and_overrides_per_call():
    task = tasks.send_receipt.using(max_attempts=3, timeout=5.5, priority=-5)
    assert (task.max_attempts, task.timeout, task.priority, task.queue_name) == (
        3,
        5.5,
        -5,
        "emails",
    )
    task.enqueue(1)
    assert Job.objects.get().max_attempts == 3


@pytest.mark.django_db
def test_run_after_becomes_available_at():
    when = timezone.now() + dt.timedelta(hours=2)
    tasks.noop.using(run_after=when).enqueue()
    assert Job.objects.get().available_at == when


@pytest.mark.django_db
def test_enqueue_joins_the_callers_transaction():
    class Abort(Exception):
        pass

    with pytest.raises(Abort), transaction.atomic():
        tasks.send_receipt.using(idempotency_key="receipt:2").enqueue(2)
        raise Abort
    assert not Job.objects.exists()
    with transaction.atomic():
        tasks.send_receipt.using(idempotency_key="receipt:2").enqueue(2)
    assert Job.objects.count() == 1


@pytest.mark.django_db
def test_enqueue_many_inserts_one_job_per_call(enqueued_signals):
    results = tasks.add.enqueue_many([((index, 1), {}) for index in range(50)])
    assert [result.args for result in results] == [[index, 1] for index in range(50)]
    assert Job.objects.count() == 50
    assert len(enqueued_signals) == 50


_COMPARED = (
    "queue", "task_path", "args", "kwargs", "priority", "status", "max_attempts",
    "partition_key", "partition_bucket", "concurrency_key", "concurrency_limit",
    "rate_limit", "rate_period", "traceparent", "idempotency_key",
)  # fmt: skip


@pytest.mark.django_db
def test_the_tasks_enqueue_many_stores_what_one_spec_per_call_would(enqueued_signals):
    # Task.enqueue_many checks the task's options once and builds no spec per call:
    # every row and result must be what the per-spec path makes of the same calls.
    task = tasks.add.using(priority=7, queue_name="emails", max_attempts=4, partition_key="p")
    calls = [((index, {"n": [index]}), {"label": f"x{index}"}) for index in range(5)]
    calls.append(((), {}))
    results = task.enqueue_many(calls)
    backend = task_backends["default"]
    specs = [backend._spec(task, args, kwargs) for args, kwargs in calls]
    expected = Job.objects.enqueue_many(specs)
    fast = Job.objects.filter(pk__in=[int(r.id) for r in results]).order_by("id")
    slow = Job.objects.filter(pk__in=[job.pk for job in expected]).order_by("id")
    assert [[getattr(job, name) for name in _COMPARED] for job in fast] == [
        [getattr(job, name) for name in _COMPARED] for job in slow
    ]
    assert [job.id for job in fast] == [int(result.id) for result in results]
    for result in results:
        stored = backend.get_result(result.id)
        assert (result.status, result.args, result.kwargs, result.enqueued_at) == (
            stored.status,
            stored.args,
            stored.kwargs,
            stored.enqueued_at,
        )
    assert enqueued_signals == results


@pytest.mark.django_db
def test_the_tasks_enqueue_many_checks_the_options_once_and_every_calls_arguments(
    monkeypatch,
):
    from django_pgqueue.store import intake as enqueueing

    full_checks = []
    checked = enqueueing.validated
    monkeypatch.setattr(
        enqueueing, "validated", lambda *a, **k: full_checks.append(1) or checked(*a, **k)
    )
    tasks.add.enqueue_many([((index, 1), {}) for index in range(300)])
    assert len(full_checks) == 1
    assert Job.objects.count() == 300


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("bad", "raised", "named"),
    [
        ((object(), 1), InvalidArguments, "jobs[2].args[0]"),
        (("x" * 2_000_000,), PayloadTooLarge, "args/kwargs"),
        ((1, "\x00"), InvalidArguments, "jobs[2].args[1]"),
    ],
)
def test_a_bad_call_of_the_tasks_enqueue_many_is_named_and_nothing_is_written(
    bad, raised, named, enqueued_signals
):
    calls = [((1, 1), {}), ((2, 1), {}), (bad, {}), ((3, 1), {})]
    with pytest.raises(raised) as error:
        tasks.add.enqueue_many(calls)
    assert error.value.argument == named
    assert not Job.objects.exists()
    assert enqueued_signals == []


@pytest.mark.django_db
def test_a_bad_first_call_is_named_by_the_full_check_and_nothing_is_written(enqueued_signals):
    # The first call goes through the full check (with the task's options), the others
    # through the arguments-only one: both name the call's position.
    with pytest.raises(InvalidArguments) as error:
        tasks.add.enqueue_many([((1, "\x00"), {}), ((2, 1), {})])
    assert error.value.argument == "jobs[0].args[1]"
    assert not Job.objects.exists()
    assert enqueued_signals == []


@pytest.mark.django_db
def test_the_tasks_enqueue_many_with_an_idempotency_key_makes_one_job():
    # The key is the task's, so every call names the same job (the per-spec path).
    results = tasks.add.using(idempotency_key="once").enqueue_many([((1, 1), {}), ((2, 2), {})])
    assert results[0].id == results[1].id
    assert Job.objects.count() == 1


def _run_to(store, job_id, status):
    (claimed,) = store.claim("worker-1", ["default", "emails"], per_queue=1, lease_seconds=30)
    assert claimed.id == job_id
    if status == JobStatus.SUCCEEDED:
        store.complete_if_leased(claimed.lease, '{"total": 3}')
    elif status == JobStatus.DEAD_LETTER:
        store.fail_if_leased(
            claimed.lease,
            Failure("builtins.ValueError", "bad input", "Traceback: ValueError"),
            RetryPolicy(0, 0, 0),
        )
    return claimed


def test_get_result_maps_every_status(store):
    result = tasks.add.using(max_attempts=1).enqueue(1, 2)
    backend = task_backends["default"]
    assert backend.get_result(result.id).status == TaskResultStatus.READY

    claimed = store.claim("worker-1", ["default"], per_queue=1, lease_seconds=30)[0]
    running = backend.get_result(result.id)
    assert running.status == TaskResultStatus.RUNNING
    assert running.worker_ids == ["worker-1"]
    assert running.started_at is not None
    assert running.last_attempted_at is not None
    store.complete_if_leased(claimed.lease, '{"total": 3}')

    done = backend.get_result(result.id)
    assert done.status == TaskResultStatus.SUCCESSFUL
    assert done.return_value == {"total": 3}
    assert done.finished_at is not None
    assert done.errors == []

    failing = tasks.add.using(max_attempts=1).enqueue(2, 2)
    _run_to(store, int(failing.id), JobStatus.DEAD_LETTER)
    failed = tasks.add.get_result(failing.id)
    assert failed.status == TaskResultStatus.FAILED
    (error,) = failed.errors
    assert error.exception_class_path == "builtins.ValueError"
    assert error.exception_class is ValueError
    assert "Traceback" in error.traceback
    assert failed.worker_ids == ["worker-1"]
    with pytest.raises(ValueError, match="failed"):
        _ = failed.return_value

    cancelled = tasks.add.enqueue(3, 3)
    Job.objects.cancel([int(cancelled.id)])
    result = tasks.add.get_result(cancelled.id)
    assert result.status == TaskResultStatus.FAILED
    assert result.errors[-1].exception_class_path.endswith("JobCancelled")


def test_refresh_reads_the_latest_state(store):
    result = tasks.add.enqueue(1, 2)
    (claimed,) = store.claim("w", ["default"], per_queue=1, lease_seconds=30)
    store.complete_if_leased(claimed.lease, "3")
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == 3


@pytest.mark.django_db
@pytest.mark.parametrize("bad_id", ["999999999", "abc", "", "1.5"])
def test_unknown_result_ids_raise_task_result_does_not_exist(bad_id):
    with pytest.raises(TaskResultDoesNotExist):
        task_backends["default"].get_result(bad_id)


@pytest.mark.django_db
def test_result_of_a_removed_task_raises_unknown_task():
    job = Job.objects.enqueue("tests.tasks.no_such_task")
    with pytest.raises(UnknownTask, match="no_such_task"):
        task_backends["default"].get_result(str(job.pk))


def test_async_enqueue_and_get_result(db_url):
    async def scenario():
        try:
            result = await tasks.async_add.aenqueue(2, 3)
            fetched = await tasks.async_add.aget_result(result.id)
        finally:
            # The thread-sensitive executor thread has its own connection: close it there.
            await sync_to_async(connections.close_all, thread_sensitive=True)()
        return result, fetched

    result, fetched = asyncio.run(scenario())
    assert fetched.id == result.id
    assert fetched.status == TaskResultStatus.READY
    assert Job.objects.get().task_path == "tests.tasks.async_add"


def test_manager_level_results_keep_working_after_the_job_is_pruned(store):
    job = store.enqueue(JobSpec("tests.tasks.noop")).job
    store.runner.connection.execute("DELETE FROM django_pgqueue_job")
    with pytest.raises(TaskResultDoesNotExist):
        task_backends["default"].get_result(str(job.pk))
    with pytest.raises(LeaseLost):
        from django_pgqueue.store.values import Lease

        store.complete_if_leased(Lease(job.pk, 1, "w"), "null")


def test_the_typed_decorator_declares_a_pgqueue_task_with_its_options(db):
    assert isinstance(tasks.typed_report, PgQueueTask)
    assert (tasks.typed_report.max_attempts, tasks.typed_report.timeout) == (2, 30.0)
    tasks.typed_report.using(idempotency_key="monthly").enqueue("march")
    job = Job.objects.get()
    assert (job.queue, job.max_attempts, job.partition_key, job.idempotency_key) == (
        "reports",
        2,
        "reports",
        "monthly",
    )


def test_the_typed_decorator_refuses_other_backends(settings):
    from django_pgqueue import task as pgqueue_task
    from django_pgqueue.compat import NATIVE_TASKS, InvalidTask

    dummy = (
        "django.tasks.backends.dummy.DummyBackend"
        if NATIVE_TASKS
        else ("django_tasks.backends.dummy.DummyBackend")
    )
    settings.TASKS = {**settings.TASKS, "other": {"BACKEND": dummy}}
    with pytest.raises(InvalidTask, match="PgQueueBackend"):
        pgqueue_task(backend="other")(tasks.noop.func)
