"""What a task receives is what was enqueued, or enqueue refuses it with a typed error.

Arguments go through PostgreSQL's jsonb and back; these tests read them back the way a
worker does (a claim) and the way the admin does (the ORM).
"""

from __future__ import annotations

import collections
import enum
import math
import sys
import types

import pytest
from django.db import models, transaction

from django_pgqueue.exceptions import EnqueueError, InvalidArguments, InvalidOption
from django_pgqueue.models import Job
from django_pgqueue.store.values import JobSpec
from tests import tasks

pytestmark = [pytest.mark.timeout(60), pytest.mark.django_db]

WIDE_FLOATS = [1e20, 1.5e300, -1e16, 1e16, 1.7976931348623157e308, 1e-7, 5e-324, 0.1, 2.0]


def _round_trip(*args, **kwargs):
    """Enqueue, then return (args, kwargs) as a worker's claim decodes them."""
    store = Job.objects.store()
    job = store.enqueue(JobSpec("tests.tasks.echo", args=args, kwargs=kwargs)).job
    (claimed,) = store.claim("w", ["default"], per_queue=1, lease_seconds=30)
    assert claimed.id == job.pk
    return claimed.args, claimed.kwargs


def _same(a, b):
    """Equal with the same types all the way down (1e20 is not 100000000000000000000)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, float):
        return a == b and math.copysign(1, a) == math.copysign(1, b)
    return bool(a == b)


def test_floats_come_back_as_the_same_floats():
    args, kwargs = _round_trip(WIDE_FLOATS, nested={"x": [1e20, -2.5e200]})
    assert _same(args, [WIDE_FLOATS])
    assert _same(kwargs, {"nested": {"x": [1e20, -2.5e200]}})
    # The ORM (admin, get_result) decodes the same values.
    assert _same(Job.objects.get().args, [WIDE_FLOATS])


def test_big_integers_within_pythons_limit_round_trip():
    big = 10**4000 + 7
    args, _ = _round_trip(big, -(2**200))
    assert _same(args, [big, -(2**200)])


@pytest.mark.parametrize(
    ("args", "kwargs", "argument"),
    [
        ([-0.0], {}, "args[0]"),
        ([], {"x": [1, 2, -0.0]}, "kwargs['x'][2]"),
        ([10**5000], {}, "args[0]"),
        ([], {"x": {"y": -(10**5000)}}, "kwargs['x']['y']"),
    ],
)
def test_numbers_jsonb_or_python_cannot_return_are_refused(args, kwargs, argument):
    with pytest.raises(InvalidArguments) as caught:
        Job.objects.enqueue("tests.tasks.echo", args=args, kwargs=kwargs)
    assert caught.value.argument == argument
    assert Job.objects.count() == 0


def test_the_integer_digit_limit_error_names_the_limit():
    with pytest.raises(InvalidArguments, match=str(sys.get_int_max_str_digits())):
        tasks.echo.enqueue(10**5000)


@pytest.mark.parametrize(
    ("args", "kwargs", "argument"),
    [
        (["ok", "a\ud800b"], {}, "args[1]"),
        ([], {"x": [1, 2, "\udfff"]}, "kwargs['x'][2]"),
        ([], {"x": {"\ud800": 1}}, "kwargs['x']['\\ud800']"),
        ([], {"\ud800": 1}, "kwargs['\\ud800']"),
        ([{"k": ["\ud83d"]}], {}, "args[0]['k'][0]"),
    ],
)
def test_lone_surrogates_in_arguments_are_refused_naming_the_spot(args, kwargs, argument):
    with transaction.atomic():
        with pytest.raises(InvalidArguments) as caught:
            Job.objects.enqueue("tests.tasks.echo", args=args, kwargs=kwargs)
        assert caught.value.argument == argument
        assert "surrogate" in str(caught.value)
        Job.objects.enqueue("tests.tasks.echo")  # the transaction is still usable
    assert Job.objects.count() == 1


@pytest.mark.parametrize(
    ("options", "option"),
    [
        ({"idempotency_key": "key-\ud800"}, "idempotency_key"),
        ({"partition_key": "\udc00"}, "partition_key"),
        ({"queue": "q\ud800"}, "queue_name"),
        ({"task_path": "tests.tasks.\ud800"}, "task_path"),
    ],
)
def test_lone_surrogates_in_options_are_refused_naming_the_option(options, option):
    spec = {"task_path": "tests.tasks.echo", **options}
    with pytest.raises(InvalidOption) as caught:
        Job.objects.store().enqueue(JobSpec(**spec))
    assert caught.value.option == option
    assert "surrogate" in str(caught.value)
    with pytest.raises(InvalidOption) as in_batch:
        Job.objects.enqueue_many([JobSpec("tests.tasks.echo"), JobSpec(**spec)])
    assert in_batch.value.option == f"jobs[1].{option}"
    assert Job.objects.count() == 0


def test_lone_surrogates_in_task_options_are_refused_at_using_time():
    with pytest.raises(InvalidOption, match="idempotency_key"):
        tasks.echo.using(idempotency_key="\ud800")
    with pytest.raises(InvalidOption, match="partition_key"):
        tasks.echo.using(partition_key="x\udfff")
    assert Job.objects.count() == 0


class Colour(models.TextChoices):
    RED = "red", "Red"


class Size(enum.IntEnum):
    LARGE = 3


class Name(str):
    pass


def test_mapping_and_str_subclasses_are_stored_as_their_plain_form():
    ordered = collections.OrderedDict([("b", 1), ("a", 2)])
    args, kwargs = _round_trip(
        ordered,
        collections.defaultdict(list, {"x": [1]}),
        collections.UserDict({"u": 1}),
        types.MappingProxyType({"m": Name("n")}),
        Colour.RED,
        Name("plain"),
        Size.LARGE,
        collections.UserList([1, 2]),
        colour=Colour.RED,
        mapping=collections.OrderedDict([(Name("key"), (1, 2))]),
    )
    assert _same(
        args, [{"b": 1, "a": 2}, {"x": [1]}, {"u": 1}, {"m": "n"}, "red", "plain", 3, [1, 2]]
    )
    assert _same(kwargs, {"colour": "red", "mapping": {"key": [1, 2]}})


def test_non_json_arguments_raise_an_error_that_is_also_a_type_error():
    with pytest.raises(TypeError) as caught:
        tasks.add.enqueue({1, 2}, 3)
    assert isinstance(caught.value, InvalidArguments)
    assert isinstance(caught.value, EnqueueError)
    with pytest.raises(TypeError):
        Job.objects.enqueue("tests.tasks.add", args=[object()])
    assert Job.objects.count() == 0
