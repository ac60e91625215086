"""PGQUEUE_MIDDLEWARE: code around every attempt and every enqueue, in Django's shape.

In-process runs of the worker's runner (order, exceptions, short-circuits, async chains,
what an empty list costs), real ``runqueueworker`` subprocesses for the end-to-end path
(a tenant carried from the producer to the attempt), and the checks.
"""

from __future__ import annotations

import asyncio
import json

import pytest
from django.core import checks
from django.test import override_settings

from django_pgqueue import PermanentError, Snooze
from django_pgqueue.compat import task_backends
from django_pgqueue.exceptions import ConfigurationError
from django_pgqueue.models import Job
from django_pgqueue.store.values import JobSpec
from django_pgqueue.tasks import middleware as middleware_module
from django_pgqueue.worker.execution import JobRunner, OutcomeKind
from django_pgqueue.worker.flight import InFlight
from django_pgqueue.worker.resolver import TaskResolver
from tests import middleware, tasks

pytestmark = pytest.mark.timeout(120)

OUTER_INNER = ["tests.middleware.Outer", "tests.middleware.inner"]


@pytest.fixture(autouse=True)
def _events():
    middleware.EVENTS.clear()
    yield
    middleware.EVENTS.clear()


def _run(store, task_path: str, **kwargs):
    """Claim a job of ``task_path`` and run it with a fresh runner; return the outcome."""
    store.enqueue(JobSpec(task_path, kwargs=kwargs))
    (claimed,) = store.claim("w", ["default"], per_queue=1, lease_seconds=30)
    runner = JobRunner(
        backend_alias="default", database="default", worker_id="w", record_step=lambda *_: None
    )
    flight = InFlight(claimed, TaskResolver().resolve(task_path))
    if flight.entry is not None and flight.entry.is_async:
        return asyncio.run(runner.run_async(flight))
    return runner.run_sync(flight)


# ---------------------------------------------------------------- attempts
@override_settings(PGQUEUE_MIDDLEWARE=OUTER_INNER)
def test_the_first_listed_is_the_outermost_around_the_task(store):
    outcome = _run(store, "tests.tasks.tenant_probe", order=1)
    assert outcome.kind is OutcomeKind.SUCCEEDED
    assert middleware.EVENTS == [
        "outer:before:attempt",
        "inner:before:attempt",
        "task",
        "inner:after:attempt",
        "outer:after:attempt",
    ]


@override_settings(PGQUEUE_MIDDLEWARE=[*OUTER_INNER, "tests.middleware.Refuse"])
@pytest.mark.parametrize(
    ("refuse", "kind", "error_class"),
    [
        ("error", OutcomeKind.FAILED, "builtins.RuntimeError"),
        ("permanent", OutcomeKind.FAILED, "django_pgqueue.exceptions.PermanentError"),
        ("snooze", OutcomeKind.SNOOZED, None),
    ],
)
def test_an_exception_a_middleware_raises_is_the_attempts_outcome(store, refuse, kind, error_class):
    outcome = _run(store, "tests.tasks.tenant_probe", refuse=refuse)
    assert outcome.kind is kind
    assert "task" not in middleware.EVENTS  # the handler never ran
    if error_class is None:
        assert outcome.delay == 30
        assert "inner:raised:Snooze" in middleware.EVENTS
    else:
        assert outcome.failure is not None
        assert outcome.failure.exception_class == error_class
        assert outcome.failure.permanent is (refuse == "permanent")
        # It travelled up the chain unchanged: the inner one saw it, the outer one's
        # "after" still ran.
        assert middleware.EVENTS[-1] == "outer:after:attempt"


@override_settings(PGQUEUE_MIDDLEWARE=["tests.middleware.Refuse"])
def test_a_middleware_that_does_not_call_the_task_decides_the_result(store):
    outcome = _run(store, "tests.tasks.tenant_probe", refuse="short")
    assert outcome.kind is OutcomeKind.SUCCEEDED
    assert json.loads(outcome.result_json) == {"short_circuit": True}
    assert "task" not in middleware.EVENTS


@override_settings(PGQUEUE_MIDDLEWARE=["tests.middleware.AsyncAware"])
def test_an_async_capable_middleware_awaits_an_async_task_itself(store):
    outcome = _run(store, "tests.tasks.async_tenant_probe")
    assert outcome.kind is OutcomeKind.SUCCEEDED
    assert middleware.EVENTS == ["async-aware:async", "async task"]
    middleware.EVENTS.clear()
    assert _run(store, "tests.tasks.tenant_probe").kind is OutcomeKind.SUCCEEDED
    assert middleware.EVENTS == ["async-aware:sync", "task"]


@override_settings(PGQUEUE_MIDDLEWARE=[*OUTER_INNER, "tests.middleware.Refuse"])
def test_a_sync_middleware_wraps_an_async_task_from_a_thread(store):
    outcome = _run(store, "tests.tasks.async_tenant_probe")
    assert outcome.kind is OutcomeKind.SUCCEEDED, outcome.failure
    assert middleware.EVENTS == [
        "outer:before:attempt",
        "inner:before:attempt",
        "async task",
        "inner:after:attempt",
        "outer:after:attempt",
    ]
    failed = _run(store, "tests.tasks.async_tenant_probe", refuse="permanent")
    assert failed.kind is OutcomeKind.FAILED
    assert failed.failure is not None
    assert failed.failure.permanent


@override_settings(PGQUEUE_MIDDLEWARE=["tests.middleware.Tenant"])
def test_a_middleware_may_change_the_arguments_the_task_gets(store):
    outcome = _run(store, "tests.tasks.tenant_probe", _tenant="acme", keep=1)
    assert json.loads(outcome.result_json) == {"tenant": "acme", "kwargs": {"keep": 1}}


def test_an_empty_list_builds_nothing_and_calls_the_task_directly(store, monkeypatch):
    """No cost when unused: no chain, no Attempt object, one attribute test per job."""

    def forbidden(*args, **kwargs):
        raise AssertionError("an Attempt was built with no middleware listed")

    monkeypatch.setattr("django_pgqueue.worker.execution.Attempt", forbidden)
    assert middleware_module.attempt_chain(is_async=False) is None
    assert middleware_module.attempt_chain(is_async=True) is None
    assert _run(store, "tests.tasks.tenant_probe").kind is OutcomeKind.SUCCEEDED
    assert _run(store, "tests.tasks.async_tenant_probe").kind is OutcomeKind.SUCCEEDED
    assert middleware.EVENTS == ["task", "async task"]


# ---------------------------------------------------------------- enqueues
@override_settings(PGQUEUE_MIDDLEWARE=OUTER_INNER)
def test_enqueue_and_enqueue_many_run_through_the_chain_once_each(db_url):
    result = tasks.tenant_probe.enqueue(a=1)
    assert middleware.EVENTS == [
        "outer:before:enqueue",
        "inner:before:enqueue",
        "inner:after:enqueue",
        "outer:after:enqueue",
    ]
    assert Job.objects.get(pk=int(result.id)).kwargs == {"a": 1}
    middleware.EVENTS.clear()
    results = tasks.tenant_probe.enqueue_many([((), {"a": 2}), ((), {"a": 3})])
    assert [r.kwargs for r in results] == [{"a": 2}, {"a": 3}]
    assert middleware.EVENTS.count("outer:before:enqueue") == 1


@override_settings(PGQUEUE_MIDDLEWARE=["tests.middleware.Tenant"])
def test_arguments_a_middleware_adds_at_enqueue_are_stored_and_validated(db_url):
    result = tasks.tenant_probe.enqueue(a=1)
    assert Job.objects.get(pk=int(result.id)).kwargs == {"a": 1, "_tenant": "acme"}
    with pytest.raises(TypeError, match="not JSON"):
        tasks.tenant_probe.enqueue(a={1, 2})  # still checked after the middleware
    assert Job.objects.count() == 1


# ---------------------------------------------------------------- a real worker
def test_a_tenant_set_at_enqueue_is_set_around_the_attempt_in_a_worker(workers):
    listed = ["tests.middleware.Tenant"]
    with override_settings(PGQUEUE_MIDDLEWARE=listed):
        result = tasks.tenant_probe.enqueue(order=7)
    worker = workers("--burst", settings={"MIDDLEWARE": listed})
    assert worker.wait() == 0, worker.output()
    final = task_backends["default"].get_result(result.id)
    assert final.return_value == {"tenant": "acme", "kwargs": {"order": 7}}


def test_a_worker_with_a_middleware_it_cannot_import_stops_at_start(workers):
    worker = workers("--burst", settings={"MIDDLEWARE": ["tests.middleware.Missing"]})
    assert worker.wait() != 0
    assert "PGQUEUE_MIDDLEWARE: 'tests.middleware.Missing' cannot be imported" in worker.output()


# ---------------------------------------------------------------- checks and errors
@pytest.mark.parametrize(
    ("listed", "check_id", "text"),
    [
        ("tests.middleware.Outer", "django_pgqueue.E128", "must be a list of dotted paths"),
        ([""], "django_pgqueue.E128", "must be a list of dotted paths"),
        (["tests.middleware.Missing"], "django_pgqueue.E129", "cannot be imported"),
        (["tests.middleware.NOT_A_FACTORY"], "django_pgqueue.E129", "is not callable"),
    ],
)
def test_the_checks_name_a_bad_entry(listed, check_id, text):
    with override_settings(PGQUEUE_MIDDLEWARE=listed):
        found = [m for m in checks.run_checks() if m.id == check_id]
    assert len(found) == 1
    assert text in found[0].msg


@override_settings(PGQUEUE_MIDDLEWARE=["tests.middleware.NotCallable"])
def test_a_factory_that_returns_nothing_is_refused_when_the_chain_is_built():
    with pytest.raises(ConfigurationError, match="returned None, not a callable"):
        middleware_module.attempt_chain(is_async=False)


def test_snooze_and_permanent_error_are_importable_for_middleware():
    assert issubclass(PermanentError, Exception)
    assert Snooze(1).seconds == 1
