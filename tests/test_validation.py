"""Bad input at enqueue: a typed error naming what was wrong, no row, a usable transaction."""

from __future__ import annotations

import dataclasses
import datetime as dt
import decimal
import math

import pytest
from django.db import transaction
from django.test import override_settings

from django_pgqueue.compat import InvalidTask
from django_pgqueue.exceptions import (
    EnqueueError,
    InvalidArguments,
    InvalidOption,
    PayloadTooLarge,
    UnknownQueue,
)
from django_pgqueue.models import Job
from tests import tasks

pytestmark = [pytest.mark.timeout(60), pytest.mark.django_db]


@pytest.mark.parametrize(
    ("args", "kwargs", "argument", "reason"),
    [
        ([math.nan], {}, "args[0]", "NaN"),
        ([1, math.inf], {}, "args[1]", "inf"),
        ([], {"x": -math.inf}, "kwargs['x']", "-inf"),
        (["a\x00b"], {}, "args[0]", "NUL"),
        ([], {"x": {"a\x00": 1}}, "kwargs['x']['a\\x00']", "NUL"),
        ([dt.datetime(2026, 1, 1, tzinfo=dt.UTC)], {}, "args[0]", "datetime"),
        ([decimal.Decimal("1.5")], {}, "args[0]", "Decimal"),
        ([b"raw"], {}, "args[0]", "bytes"),
        ([{1: "a"}], {}, "args[0][1]", "dict keys must be strings"),
        ([], {"x": [1, {2, 3}]}, "kwargs['x'][1]", "set"),
        ([[[object()]]], {}, "args[0][0][0]", "object"),
    ],
)
def test_non_json_arguments_raise_naming_the_argument(args, kwargs, argument, reason):
    with pytest.raises(InvalidArguments) as caught:
        Job.objects.enqueue("tests.tasks.noop", args=args, kwargs=kwargs)
    assert caught.value.argument == argument
    assert reason in str(caught.value)
    assert Job.objects.count() == 0


def test_too_deep_nesting_is_rejected():
    value: list[object] = []
    for _ in range(150):
        value = [value]
    with pytest.raises(InvalidArguments, match="nested deeper"):
        Job.objects.enqueue("tests.tasks.noop", args=[value])


def test_payload_over_the_limit_is_rejected():
    with override_settings(PGQUEUE_MAX_PAYLOAD_BYTES=1000):
        with pytest.raises(PayloadTooLarge) as caught:
            Job.objects.enqueue("tests.tasks.noop", args=["x" * 1000])
        assert caught.value.limit == 1000
        assert caught.value.size > 1000
        Job.objects.enqueue("tests.tasks.noop", args=["x" * 900])
    assert Job.objects.count() == 1


def test_default_payload_limit_is_one_megabyte():
    with pytest.raises(PayloadTooLarge):
        Job.objects.enqueue("tests.tasks.noop", args=["x" * 1_000_001])


@pytest.mark.parametrize(
    ("kwargs", "option"),
    [
        ({"priority": 101}, "priority"),
        ({"priority": -101}, "priority"),
        ({"priority": True}, "priority"),
        ({"max_attempts": 0}, "max_attempts"),
        ({"max_attempts": 1001}, "max_attempts"),
        ({"idempotency_key": "k" * 256}, "idempotency_key"),
        ({"partition_key": "p" * 256}, "partition_key"),
        ({"idempotency_key": ""}, "idempotency_key"),
        ({"partition_key": 42}, "partition_key"),
        ({"queue": "q" * 101}, "queue_name"),
        ({"available_at": dt.datetime(2030, 1, 1)}, "run_after"),  # naive with USE_TZ
    ],
)
def test_out_of_range_options_raise_naming_the_option(kwargs, option):
    with pytest.raises(InvalidOption) as caught:
        Job.objects.enqueue("tests.tasks.noop", **kwargs)
    assert caught.value.option == option
    assert Job.objects.count() == 0


def test_the_callers_transaction_stays_usable_after_a_rejected_enqueue():
    with transaction.atomic():
        Job.objects.enqueue("tests.tasks.noop")
        with pytest.raises(EnqueueError):
            Job.objects.enqueue("tests.tasks.noop", args=[math.nan])
        # A failed SQL statement would have aborted the transaction; nothing reached SQL.
        Job.objects.enqueue("tests.tasks.noop")
    assert Job.objects.count() == 2


def test_bulk_enqueue_writes_nothing_if_any_spec_is_bad():
    from django_pgqueue.store.values import JobSpec

    with pytest.raises(InvalidArguments) as caught:
        Job.objects.enqueue_many(
            [JobSpec("tests.tasks.noop", args=[1]), JobSpec("tests.tasks.noop", args=[math.nan])]
        )
    assert caught.value.argument == "jobs[1].args[0]"
    assert Job.objects.count() == 0


# ---------------------------------------------------------------- through django.tasks
def test_task_enqueue_rejects_bad_arguments_as_invalid_task():
    with pytest.raises(InvalidTask) as caught:
        tasks.add.enqueue(math.nan, 1)
    assert isinstance(caught.value, InvalidArguments)
    assert "args[0]" in str(caught.value)
    assert Job.objects.count() == 0


def test_unknown_queue_raises_at_using_time():
    with pytest.raises(UnknownQueue) as caught:
        tasks.noop.using(queue_name="nope")
    assert caught.value.queue == "nope"
    assert isinstance(caught.value, InvalidTask)


def test_priority_out_of_range_raises_at_using_time():
    with pytest.raises(InvalidOption) as caught:
        tasks.noop.using(priority=500)
    assert caught.value.option == "priority"


def test_naive_run_after_raises_with_use_tz():
    with pytest.raises(InvalidOption) as caught:
        tasks.noop.using(run_after=dt.datetime(2030, 1, 1))
    assert caught.value.option == "run_after"


@pytest.mark.parametrize(
    ("options", "option"),
    [
        ({"idempotency_key": "k" * 300}, "idempotency_key"),
        ({"partition_key": "a\x00b"}, "partition_key"),
        ({"max_attempts": 0}, "max_attempts"),
        ({"timeout": -1}, "timeout"),
        ({"timeout": math.nan}, "timeout"),
    ],
)
def test_bad_task_options_raise_at_using_time(options, option):
    with pytest.raises(InvalidOption) as caught:
        tasks.noop.using(**options)
    assert caught.value.option == option


def test_async_tasks_cannot_be_atomic():
    with pytest.raises(InvalidOption) as caught:
        dataclasses.replace(tasks.async_add, atomic=True)
    assert caught.value.option == "atomic"
