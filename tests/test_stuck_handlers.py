"""Stuck handlers: reported, kept in their place, and their process replaced after a grace.

A sync handler past its timeout (or an operator's cancel) cannot be stopped in its thread.
Real ``runqueueworker`` processes: the registry and the admin report it with how long it
has been stuck, the metric counts it, and past ``PGQUEUE_STUCK_HANDLER_GRACE_SECONDS``
the process drains and exits (code 3), its supervisor starts a fresh one, and the job is
retried only once its lease has run out after the old process (and the thread) are gone.
"""

from __future__ import annotations

import os

import pytest
from django.test import override_settings

from django_pgqueue.models import Job, Worker
from django_pgqueue.worker.leases import EXIT_STUCK
from tests import ledger
from tests.admin_fixtures import login, url
from tests.workers import wait_for

pytestmark = pytest.mark.timeout(180)

#: A short lease and heartbeat so a stuck job's lease runs out soon after its process.
FAST = {
    "HEARTBEAT_SECONDS": 0.5,
    "LEASE_SECONDS": 3,
    "HOUSEKEEPING_INTERVAL_SECONDS": 0.5,
    "WORKER_TIMEOUT_SECONDS": 3,
    # A stop at teardown does not wait long for a handler that never returns.
    "GRACE_SECONDS": 1,
}


def _stuck_report(job_id: int):
    for worker in Worker.objects.all():
        for item in (worker.metadata or {}).get("stuck_handlers") or []:
            if item.get("job") == job_id:
                return worker, item
    return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_stuck_handler_is_reported_on_the_job_and_worker_pages(workers, observer, client):
    job = Job.objects.enqueue("tests.tasks.ledger_stuck", kwargs={"seconds": 30})
    worker = workers(
        "--poll-interval", "0.1", settings={**FAST, "STUCK_HANDLER_GRACE_SECONDS": None}
    )
    row, item = wait_for(
        lambda: (found := _stuck_report(job.pk)) and found[1]["seconds"] >= 1 and found,
        timeout=30,
        message=f"the stuck handler in the registry\n{worker.output()}",
    )
    assert (item["why"], item["task"]) == ("timeout", "tests.tasks.ledger_stuck")
    assert "ran past its timeout of 1.0s" in worker.output()
    login(client, superuser=True)
    with override_settings(PGQUEUE_STUCK_HANDLER_GRACE_SECONDS=None):
        page = client.get(url("django_pgqueue_job_change", job.pk)).text
    assert "Handler still running" in page
    assert "past its timeout" in page
    assert "restart that worker to free the thread" in page  # the grace is off
    worker_page = client.get(url("django_pgqueue_worker_change", row.pk)).text
    assert f"#{job.pk}" in worker_page
    assert "handler still running" in worker_page
    # Never replaced with the grace off: the process and its handler go on.
    assert worker.process.poll() is None
    assert Job.objects.get(pk=job.pk).status == "processing"


def test_the_metric_counts_stuck_handlers():
    prometheus_client = pytest.importorskip("prometheus_client")
    from django_pgqueue.metrics.worker import WorkerMetrics

    metrics = WorkerMetrics(prometheus_client.CollectorRegistry())
    metrics.stuck_handlers(2)
    assert metrics.registry.get_sample_value("pgqueue_worker_stuck_handlers") == 2


def test_past_the_grace_the_supervisor_replaces_the_process_and_the_job_is_retried_after_it(
    workers, observer
):
    job = Job.objects.enqueue("tests.tasks.ledger_stuck", kwargs={"seconds": 120})
    worker = workers(
        "--processes",
        "2",
        "--poll-interval",
        "0.1",
        settings={**FAST, "STUCK_HANDLER_GRACE_SECONDS": 1},
    )
    (first,) = wait_for(
        lambda: [e for e in ledger.entries(observer, job.pk) if e["event"] == "start"],
        timeout=30,
        message=f"the job to start\n{worker.output()}",
    )
    stuck_pid = first["worker_pid"]
    wait_for(
        lambda: "exited to free a stuck handler; replacing it" in worker.output(),
        timeout=30,
        message=f"the stuck process to be replaced\n{worker.output()}",
    )
    assert not _alive(stuck_pid)
    output = worker.output()
    assert f"job {job.pk}: its handler (tests.tasks.ledger_stuck) is still running" in output
    assert "leaving 1 stuck jobs to their leases" in output
    # The retry runs in another process, after the stuck one (and its thread) ended.
    second = wait_for(
        lambda: [
            e for e in ledger.entries(observer, job.pk) if e["attempt"] == 2 and e["event"] == "end"
        ],
        timeout=60,
        message=f"the retry\n{worker.output()}",
    )
    assert second[0]["worker_pid"] != stuck_pid
    events = [(e["event"], e["attempt"]) for e in ledger.entries(observer, job.pk)]
    assert events == [("start", 1), ("start", 2), ("end", 2)]  # attempt 1 never ended
    finished = wait_for(
        lambda: (found := Job.objects.get(pk=job.pk)).status == "succeeded" and found,
        timeout=30,
        message="the retry's outcome",
    )
    assert finished.result == 2
    assert finished.errors[0]["exception_class"] == "django_pgqueue.exceptions.LeaseExpired"
    # The supervisor kept two processes running: the replacement registered.
    alive = wait_for(
        lambda: Worker.objects.filter(status="alive").count() == 2,
        timeout=30,
        message="two live workers again",
    )
    assert alive


def test_a_single_process_exits_with_code_3_for_its_process_manager(workers, observer):
    job = Job.objects.enqueue("tests.tasks.ledger_stuck", kwargs={"seconds": 120})
    worker = workers("--poll-interval", "0.1", settings={**FAST, "STUCK_HANDLER_GRACE_SECONDS": 1})
    assert worker.wait(60) == EXIT_STUCK, worker.output()
    assert "replacing worker process" in worker.output()
    # Its lease runs out after the process; another worker then retries the job.
    retry = workers("--poll-interval", "0.1", settings=FAST)
    wait_for(
        lambda: Job.objects.get(pk=job.pk).status == "succeeded",
        timeout=60,
        message=f"the retry\n{retry.output()}",
    )


def test_under_reload_the_stuck_child_is_replaced_and_the_command_runs_on(workers, observer):
    job = Job.objects.enqueue("tests.tasks.ledger_stuck", kwargs={"seconds": 120})
    worker = workers(
        "--reload", "--poll-interval", "0.1", settings={**FAST, "STUCK_HANDLER_GRACE_SECONDS": 1}
    )
    (first,) = wait_for(
        lambda: [e for e in ledger.entries(observer, job.pk) if e["event"] == "start"],
        timeout=30,
        message=f"the job to start\n{worker.output()}",
    )
    # A fresh child (another pid) retries the job once the stuck one's lease ran out.
    retried = wait_for(
        lambda: [
            e for e in ledger.entries(observer, job.pk) if e["attempt"] == 2 and e["event"] == "end"
        ],
        timeout=60,
        message=f"the retry in a new child\n{worker.output()}",
    )
    assert retried[0]["worker_pid"] != first["worker_pid"]
    assert not _alive(first["worker_pid"])
    assert "replacing the worker's process to free a stuck handler" in worker.output()
    assert worker.process.poll() is None  # the command itself runs on


def test_a_cancelled_handler_that_never_returns_is_replaced_and_ends_cancelled(workers, observer):
    job = Job.objects.enqueue("tests.tasks.ledger_sleep_through", kwargs={"seconds": 120})
    worker = workers("--poll-interval", "0.1", settings={**FAST, "STUCK_HANDLER_GRACE_SECONDS": 2})
    wait_for(lambda: ledger.entries(observer, job.pk), timeout=30, message="the job to start")
    Job.objects.cancel([job.pk])
    _, item = wait_for(
        lambda: _stuck_report(job.pk), timeout=30, message=f"the report\n{worker.output()}"
    )
    assert item["why"] == "cancel"
    assert worker.wait(60) == EXIT_STUCK, worker.output()
    # The reaper ends it cancelled once its lease has run out (housekeeping of any worker).
    reaper = workers("--poll-interval", "0.1", settings=FAST)
    wait_for(
        lambda: Job.objects.get(pk=job.pk).status == "cancelled",
        timeout=60,
        message=f"the cancel to be recorded\n{reaper.output()}",
    )
