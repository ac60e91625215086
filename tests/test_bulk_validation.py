"""Bulk enqueue checks each set of options once: it must accept and refuse exactly what
checking every job in full does, name the same job and field, and store the same rows.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from django_pgqueue.exceptions import InvalidArguments, InvalidOption
from django_pgqueue.models import Job
from django_pgqueue.store.intake import EnqueueDefaults, jobs_document, validated, validated_many
from django_pgqueue.store.values import JobSpec

pytestmark = pytest.mark.timeout(120)

AWARE = dt.datetime(2030, 1, 1, 12, tzinfo=dt.UTC)

# A few values per option: valid ones, then invalid ones, including values equal to a
# valid one but not equally valid (True == 1, 1.0 == 1) and equal instants in other zones.
VALID: dict[str, list[Any]] = {
    "task_path": ["tests.tasks.noop", "tests.tasks.add"],
    "queue": ["default", "other"],
    "priority": [0, 1, -100],
    "max_attempts": [None, 1, 3],
    "available_at": [None, AWARE, AWARE.astimezone(dt.timezone(dt.timedelta(hours=2)))],
    "partition_key": [None, "p1"],
    "traceparent": [None, "00-" + "a" * 32 + "-" + "b" * 16 + "-01"],
    "after": [(), []],
}
INVALID: dict[str, list[Any]] = {
    "task_path": ["", "bad\x00path"],
    "queue": ["x" * 101],
    "priority": [True, 1.0, 101],
    "max_attempts": [0, True, 3.0],
    "available_at": ["tomorrow"],
    "partition_key": ["", 7],
    "traceparent": ["not-a-traceparent"],
    "after": ["1"],
}
OPTIONS = {name: VALID[name] + INVALID[name] for name in VALID}
ARGUMENTS: list[tuple[Any, Any]] = [
    ((), {}),
    ([1, 2], {"a": "b"}),
    ((object(),), {}),  # not JSON
    (["\ud800"], {}),  # a lone surrogate PostgreSQL refuses
    ([], {"k": float("nan")}),
]
KEYS: list[Any] = [None, "k1", "k2", "", "x" * 300, 5]


@st.composite
def batches(draw: st.DrawFn) -> list[JobSpec]:
    """A batch of repeats of one spec and of variants that differ from it in one field.

    That is what ``Task.enqueue_many`` sends, and the near misses (``True`` after ``1``)
    are where a cache of checked options could wrongly reuse an earlier verdict.
    """
    fields = {name: draw(st.sampled_from(values)) for name, values in VALID.items()}
    args, kwargs = draw(st.sampled_from(ARGUMENTS[:2]))
    base = {"args": args, "kwargs": kwargs, "idempotency_key": None, **fields}
    pool = [base]
    for _ in range(draw(st.integers(0, 3))):
        name = draw(st.sampled_from([*OPTIONS, "arguments", "idempotency_key"]))
        if name == "arguments":
            args, kwargs = draw(st.sampled_from(ARGUMENTS))
            pool.append({**base, "args": args, "kwargs": kwargs})
        elif name == "idempotency_key":
            pool.append({**base, name: draw(st.sampled_from(KEYS))})
        else:
            pool.append({**base, name: draw(st.sampled_from(OPTIONS[name]))})
    chosen = draw(st.lists(st.sampled_from(pool), min_size=1, max_size=12))
    return [JobSpec(**spec) for spec in chosen]


def _one_by_one(batch: list[JobSpec], defaults: EnqueueDefaults) -> list[dict[str, Any]]:
    return [validated(spec, defaults, position=index) for index, spec in enumerate(batch)]


def _outcome(check: Any, batch: list[JobSpec], defaults: EnqueueDefaults) -> Any:
    try:
        return check(batch, defaults)
    except (InvalidOption, InvalidArguments) as error:
        return (type(error), str(error))


@hypothesis_settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(batches())
def test_checking_options_once_accepts_and_refuses_what_full_checks_do(settings, batch):
    settings.USE_TZ = True
    defaults = EnqueueDefaults.read()
    expected = _outcome(_one_by_one, batch, defaults)
    got = _outcome(validated_many, batch, defaults)
    assert got == expected
    if isinstance(expected, list):
        assert jobs_document(got) == jobs_document(expected)


def test_bulk_error_names_the_job_and_field_after_many_good_ones(db):
    batch = [JobSpec("tests.tasks.add", args=[n, n]) for n in range(50)]
    batch[37] = JobSpec("tests.tasks.add", args=[object()])
    with pytest.raises(InvalidArguments, match=r"jobs\[37\]\.args\[0\]"):
        Job.objects.enqueue_many(batch)
    batch[37] = JobSpec("tests.tasks.add", args=[1, 1], idempotency_key="")
    with pytest.raises(InvalidOption, match=r"jobs\[37\]\.idempotency_key"):
        Job.objects.enqueue_many(batch)
    batch[37] = JobSpec("tests.tasks.add", args=[1, 1], priority=True)
    with pytest.raises(InvalidOption, match=r"jobs\[37\]\.priority"):
        Job.objects.enqueue_many(batch)
    assert not Job.objects.exists()


def test_bulk_rows_keep_each_jobs_own_options(db):
    later = AWARE
    batch = [
        JobSpec("tests.tasks.add", args=[1, 1]),
        JobSpec("tests.tasks.add", args=[2, 2], queue="other", priority=5),
        JobSpec("tests.tasks.add", args=[3, 3], partition_key="p", available_at=later),
        JobSpec("tests.tasks.add", args=[4, 4]),
        JobSpec("tests.tasks.add", args=[5, 5], idempotency_key="k", max_attempts=7),
        JobSpec("tests.tasks.noop"),
    ]
    jobs = Job.objects.enqueue_many(batch)
    stored = {
        job.pk: job
        for job in Job.objects.filter(pk__in=[job.pk for job in jobs])  # read back
    }
    rows = [stored[job.pk] for job in jobs]
    assert [(r.task_path, r.queue, r.priority, r.args) for r in rows] == [
        ("tests.tasks.add", "default", 0, [1, 1]),
        ("tests.tasks.add", "other", 5, [2, 2]),
        ("tests.tasks.add", "default", 0, [3, 3]),
        ("tests.tasks.add", "default", 0, [4, 4]),
        ("tests.tasks.add", "default", 0, [5, 5]),
        ("tests.tasks.noop", "default", 0, []),
    ]
    assert rows[2].partition_key == "p"
    assert rows[2].available_at == later
    assert rows[3].partition_key is None
    assert rows[3].available_at <= rows[2].available_at
    assert rows[4].idempotency_key == "k"
    assert rows[4].max_attempts == 7
    assert rows[0].idempotency_key is None
    assert rows[0].max_attempts == rows[3].max_attempts


class _NoTruthValue(list):  # what a numpy array does in ``if array:``
    def __bool__(self) -> bool:
        raise ValueError("The truth value of an array with more than one element is ambiguous")


def test_an_after_without_a_truth_value_gets_the_typed_error(db):
    batch = [JobSpec("tests.tasks.noop", after=_NoTruthValue(["x", "y"]))] * 2
    with pytest.raises(InvalidOption, match=r"jobs\[0\]\.after"):
        Job.objects.enqueue_many(batch)
    assert not Job.objects.exists()
