"""Rate limits, enforced by the claim across worker processes (a token bucket per key).

The documented burst: a key's bucket holds one period's worth of starts (the limit) and
starts full, so any window of one period holds at most twice the limit, and over a long
run the starts average the limit.
"""

from __future__ import annotations

import bisect
import datetime as dt

import pytest
from django.test import override_settings

from django_pgqueue.exceptions import InvalidOption
from django_pgqueue.models import ConcurrencyKey, Job, LiveJob
from django_pgqueue.states import JobStatus
from django_pgqueue.store.flow_limits import Rate, parse_rate
from django_pgqueue.store.values import JobSpec
from tests import ledger, tasks
from tests.workers import wait_for

pytestmark = pytest.mark.timeout(240)

RUN_SECONDS = 30.0
LIMIT = 20


def _starts(observer, label: str) -> list[dt.datetime]:
    return sorted(e["at"] for e in ledger.entries(observer) if e["label"] == label)


def _max_in_a_sliding_second(starts: list[dt.datetime]) -> int:
    second = dt.timedelta(seconds=1)
    return max(bisect.bisect_left(starts, at + second) - index for index, at in enumerate(starts))


@pytest.mark.one_server
def test_20_per_second_across_4_workers_for_30_seconds(workers, observer):
    tasks.ledger_rated.enqueue_many([((), {})] * 1000)
    for _ in range(4):
        workers("--concurrency", "8", "--poll-interval", "0.2")
    wait_for(lambda: len(_starts(observer, "rated")) > 0, timeout=60)
    first = _starts(observer, "rated")[0]
    wait_for(
        lambda: (
            observer.execute("SELECT clock_timestamp()").fetchone()[0]
            > first + dt.timedelta(seconds=RUN_SECONDS + 1)
        ),
        timeout=RUN_SECONDS + 30,
        interval=0.5,
    )
    LiveJob.objects.filter(status=JobStatus.PENDING).update(status=JobStatus.CANCELLED)
    end = first + dt.timedelta(seconds=RUN_SECONDS)
    # The claims, on the database clock, are what the bucket governs; the handlers' own
    # starts (the ledger) lag them by a thread hand-off, which can bunch them a little.
    claims = sorted(
        at
        for at in Job.objects.filter(claimed_at__isnull=False).values_list("claimed_at", flat=True)
        if at < end
    )
    window = [at for at in _starts(observer, "rated") if at < end]
    peak = _max_in_a_sliding_second(claims)
    print(
        f"rate 20/s, 4 workers, {RUN_SECONDS:g} s: {len(claims)} claims, max {peak} in a "
        f"sliding second; handler starts: {len(window)}, max "
        f"{_max_in_a_sliding_second(window)} in a sliding second"
    )
    # Burst: one period's worth (the full bucket) on top of the limit, at most.
    assert peak <= 2 * LIMIT
    # 20/s for 30 s plus the full bucket at the start: 620, within 5% of 600.
    assert abs(len(claims) - LIMIT * RUN_SECONDS) <= 0.05 * LIMIT * RUN_SECONDS


def test_a_rate_limited_key_keeps_its_bucket_while_empty(store, observer):
    with override_settings(PGQUEUE_RATE_LIMITS={"queue:reports": "5/h"}):
        for _ in range(3):
            tasks.noop.using(queue_name="reports").enqueue()
    store.fold_partition_signals()
    row = ConcurrencyKey.objects.get(pk="queue:reports")
    assert (row.rate_limit, row.rate_period, row.tokens) == (5, 3600.0, 5.0)


@pytest.mark.parametrize(
    ("text", "rate"),
    [("20/s", Rate(20, 1.0)), ("1000/h", Rate(1000, 3600.0)), ("3/10s", Rate(3, 10.0))],
)
def test_rates_parse(text, rate):
    assert parse_rate("rate_limit", text) == rate


@pytest.mark.parametrize("text", ["0/s", "20/0s", "20", "-1/s", "20/w", 20])
def test_bad_rates_are_refused(text):
    with pytest.raises(InvalidOption, match="rate_limit"):
        parse_rate("rate_limit", text)


def test_an_idle_key_is_forgotten_once_its_bucket_is_full(store, observer):
    job = store.enqueue(JobSpec("tests.tasks.noop", concurrency_key="api", rate_limit="2/s")).job
    (claimed,) = store.claim("w", ["default"], per_queue=10, lease_seconds=30)
    store.complete_if_leased(claimed.lease, "null")
    assert Job.objects.get(pk=job.pk).status == JobStatus.SUCCEEDED
    # One token spent: the empty key keeps its bucket until it has refilled.
    assert ConcurrencyKey.objects.filter(pk="api", head_id__isnull=True).exists()
    wait_for(lambda: store.prune_idle_concurrency_keys() == 1, timeout=10, interval=0.1)
    assert not ConcurrencyKey.objects.filter(pk="api").exists()
