"""Waking up: NOTIFY, the fallback poll, re-LISTEN after reconnects, fairness."""

from __future__ import annotations

import datetime as dt
import statistics

import pytest
from django.utils import timezone

from django_pgqueue.models import Job
from django_pgqueue.states import JobStatus
from django_pgqueue.store.values import JobSpec
from tests import ledger, tasks
from tests.workers import wait_for

pytestmark = pytest.mark.timeout(180)


def _listener_connected(observer, worker_id):
    return observer.execute(
        "SELECT pid FROM pg_stat_activity WHERE application_name = %s",
        [f"pgqueue listener {worker_id}"[:63]],
    ).fetchone()


def test_notify_wakes_an_idle_worker_long_before_its_poll(workers, observer):
    worker = workers("--poll-interval", "60")
    worker_id = worker.wait_registered(observer)
    wait_for(lambda: _listener_connected(observer, worker_id), timeout=15)
    latencies = []
    for _ in range(20):
        result = tasks.ledger_sleep.enqueue()
        wait_for(lambda r=result: ledger.entries(observer, int(r.id)), timeout=10, interval=0.005)
        job = Job.objects.get(pk=int(result.id))
        (start, *_) = ledger.entries(observer, job.pk)
        latencies.append((start["at"] - job.created_at).total_seconds() * 1000)
    # Each job started within the 10 s wait although the poll is 60 s: NOTIFY woke it.
    print(f"enqueue->start latency over 20 jobs: median {statistics.median(latencies):.1f} ms")


def test_the_fallback_poll_runs_scheduled_jobs_without_any_notify(workers, observer):
    worker = workers("--poll-interval", "0.2")
    worker.wait_registered(observer)
    when = timezone.now() + dt.timedelta(seconds=1)
    result = tasks.ledger_sleep.using(run_after=when).enqueue()
    wait_for(lambda: Job.objects.get(pk=int(result.id)).status == JobStatus.SUCCEEDED, timeout=30)
    (start, *_) = ledger.entries(observer, int(result.id))
    assert start["at"] >= when


def test_after_a_reconnect_the_listener_listens_again(workers, observer):
    worker = workers("--poll-interval", "60")
    worker_id = worker.wait_registered(observer)
    (old_pid,) = wait_for(lambda: _listener_connected(observer, worker_id), timeout=15)
    observer.execute("SELECT pg_terminate_backend(%s)", [old_pid])
    (new_pid,) = wait_for(
        lambda: (row := _listener_connected(observer, worker_id)) and row[0] != old_pid and row,
        timeout=30,
    )
    assert new_pid != old_pid
    result = tasks.ledger_sleep.enqueue()
    wait_for(lambda: Job.objects.get(pk=int(result.id)).status == JobStatus.SUCCEEDED, timeout=15)


def test_a_flood_in_one_queue_does_not_starve_another(workers, observer):
    Job.objects.enqueue_many(
        [JobSpec("tests.tasks.ledger_sleep", kwargs={"seconds": 0.003}) for _ in range(3000)]
    )
    emails = Job.objects.enqueue_many(
        [JobSpec("tests.tasks.ledger_sleep", queue="emails") for _ in range(5)]
    )
    workers("--queue", "default", "--queue", "emails", "--concurrency", "2", "--batch-size", "10")
    wait_for(
        lambda: (
            Job.objects.filter(pk__in=[j.pk for j in emails], status=JobStatus.SUCCEEDED).count()
            == 5
        ),
        timeout=60,
    )
    still_waiting = Job.objects.filter(queue="default", status=JobStatus.PENDING).count()
    assert still_waiting > 2000, f"emails waited behind {3000 - still_waiting} default jobs"
