"""Running jobs with real runqueueworker subprocesses: results, errors, retries, context."""

from __future__ import annotations

import pytest

from django_pgqueue.compat import TaskResultStatus, task_backends
from django_pgqueue.models import Job, LiveJob
from django_pgqueue.states import JobStatus
from django_pgqueue.store.values import JobSpec
from tests import ledger, tasks
from tests.models import Order
from tests.workers import wait_for

pytestmark = pytest.mark.timeout(120)

FAST_RETRY = {"RETRY_BASE_SECONDS": 0.01, "RETRY_MAX_SECONDS": 0.05, "RETRY_JITTER": 0}


def _job(job_id):
    return Job.objects.get(pk=int(job_id))


def test_burst_runs_sync_async_and_context_tasks_and_stores_results(workers):
    added = tasks.add.enqueue(2, 3)
    async_added = tasks.async_add.enqueue(4, 5)
    attempt = tasks.report_attempt.enqueue()
    receipt = tasks.send_receipt.enqueue(12)
    worker = workers("--burst")
    assert worker.wait() == 0, worker.output()
    backend = task_backends["default"]
    assert backend.get_result(added.id).return_value == 5
    assert backend.get_result(async_added.id).return_value == 9
    assert backend.get_result(attempt.id).return_value == 1
    done = backend.get_result(receipt.id)
    assert done.status == TaskResultStatus.SUCCESSFUL
    assert done.return_value == {"order": 12, "sent": True}
    assert done.worker_ids
    assert done.worker_ids[0].split(":")[1] == str(worker.pid)
    job = _job(receipt.id)
    assert (job.attempts, job.claimed_by, job.lease_expires_at) == (1, done.worker_ids[0], None)


def test_one_log_line_per_job_start_and_finish_at_verbosity_two(workers):
    result = tasks.add.enqueue(1, 1)
    worker = workers("--burst", verbosity=2)
    assert worker.wait() == 0
    output = worker.output()
    assert f"job {result.id} started: task=tests.tasks.add queue=default attempt=1/5" in output
    assert (
        f"job {result.id} succeeded: task=tests.tasks.add queue=default attempt=1/5 duration="
        in output
    )


def test_verbosity_zero_logs_no_job_lines(workers):
    tasks.add.enqueue(1, 1)
    worker = workers("--burst", verbosity=0)
    assert worker.wait() == 0
    assert "started: task=" not in worker.output()


def test_started_and_finished_signals_are_sent(workers, observer):
    result = tasks.signal_probe.enqueue(7)
    assert workers("--burst").wait() == 0
    events = [(e["event"], e["label"]) for e in ledger.entries(observer, int(result.id))]
    assert events == [
        ("signal:started", str(TaskResultStatus.RUNNING)),
        ("signal:finished", str(TaskResultStatus.SUCCESSFUL)),
    ]


def test_failures_retry_with_backoff_then_succeed(workers, observer):
    result = tasks.ledger_flaky.enqueue(fail_times=2)
    worker = workers("--poll-interval", "0.05", settings=FAST_RETRY)
    wait_for(lambda: _job(result.id).status == JobStatus.SUCCEEDED, timeout=60)
    job = _job(result.id)
    assert job.attempts == 3
    assert job.result == 3
    assert [entry["message"] for entry in job.errors] == [
        "flaky failure on attempt 1",
        "flaky failure on attempt 2",
    ]
    assert all("RuntimeError" in entry["traceback"] for entry in job.errors)
    assert [e["attempt"] for e in ledger.entries(observer, job.pk)] == [1, 2, 3]
    worker.stop()


def test_exhausted_retries_end_in_dead_letter(workers):
    result = tasks.always_fails.enqueue("nope")
    workers("--poll-interval", "0.05", settings=FAST_RETRY)
    wait_for(lambda: _job(result.id).status == JobStatus.DEAD_LETTER, timeout=60)
    job = _job(result.id)
    assert job.attempts == job.max_attempts == 3
    assert job.last_error == "nope"
    assert job.last_error_class == "builtins.ValueError"
    failed = task_backends["default"].get_result(result.id)
    assert failed.status == TaskResultStatus.FAILED
    assert [error.exception_class for error in failed.errors] == [ValueError] * 3


def test_a_type_error_raised_by_the_task_fails_it_and_a_list_result_is_stored(workers):
    job = Job.objects.enqueue("tests.tasks.add", args=[[1], [2]])  # returns a list: fine
    bad = Job.objects.enqueue("tests.tasks.add", args=[{"a": 1}, {"b": 2}])  # TypeError
    assert workers("--burst", settings=FAST_RETRY).wait() == 0
    job.refresh_from_db()
    assert (job.status, job.result) == (JobStatus.SUCCEEDED, [1, 2])
    bad.refresh_from_db()
    assert bad.last_error_class == "builtins.TypeError"


def test_unknown_task_waits_then_dead_letters_without_running(workers, observer):
    job = Job.objects.enqueue("tests.tasks.renamed_in_the_next_release")
    worker = workers("--poll-interval", "0.05", settings={"UNKNOWN_TASK_TIMEOUT_SECONDS": 3})
    wait_for(lambda: _job(job.pk).last_error, timeout=30)
    waiting = _job(job.pk)
    assert waiting.status == JobStatus.PENDING
    assert waiting.attempts == 0  # no attempt used while waiting
    assert "waiting for a worker that knows this task" in waiting.last_error
    assert waiting.last_error_class == "django_pgqueue.exceptions.UnknownTask"
    assert waiting.unknown_task_since is not None
    assert waiting.available_at > waiting.created_at  # backing off, not spinning
    wait_for(lambda: _job(job.pk).status == JobStatus.DEAD_LETTER, timeout=30)
    dead = _job(job.pk)
    assert "unknown task" in dead.last_error
    assert dead.last_error_class == "django_pgqueue.exceptions.UnknownTask"
    # Claimed (and released) only a handful of times in those seconds: no tight loop.
    assert dead.lease_generation <= 12
    worker.stop()


def test_a_worker_that_knows_the_task_picks_it_up_after_another_could_not(workers):
    # Rolling deploy: this worker cannot import the task (it serves an old release).
    job = Job.objects.enqueue("tests.tasks.noop")
    LiveJob.objects.filter(pk=job.pk).update(task_path="tests.tasks.not_yet_deployed")
    assert workers("--burst").wait() == 0
    assert _job(job.pk).status == JobStatus.PENDING
    # The new release arrives (here: the path is fixed) and the job runs.
    LiveJob.objects.filter(pk=job.pk).update(
        task_path="tests.tasks.noop", available_at=_job(job.pk).created_at
    )
    assert workers("--burst").wait() == 0
    assert _job(job.pk).status == JobStatus.SUCCEEDED


def test_resumable_job_resumes_after_its_last_step(workers, observer):
    result = tasks.ledger_steps.enqueue()
    workers("--poll-interval", "0.05", settings=FAST_RETRY)
    wait_for(lambda: _job(result.id).status == JobStatus.SUCCEEDED, timeout=60)
    job = _job(result.id)
    assert job.step == "emailed"
    assert job.result == ["upload", "email"]  # the retry skipped "render"
    events = [e["event"] for e in ledger.entries(observer, job.pk)]
    assert events == ["crash-after-render", "done"]


def test_handler_writes_commit_on_their_own_even_when_the_job_fails(workers):
    result = tasks.ledger_order_plain.using(max_attempts=1).enqueue(fail=True)
    assert workers("--burst").wait() == 0
    assert _job(result.id).status == JobStatus.DEAD_LETTER
    assert Order.objects.filter(job_id=int(result.id)).exists()


def test_atomic_task_commits_its_writes_with_the_completion(workers):
    result = tasks.ledger_atomic_order.enqueue()
    assert workers("--burst").wait() == 0
    assert _job(result.id).status == JobStatus.SUCCEEDED
    assert Order.objects.filter(job_id=int(result.id)).count() == 1


def test_atomic_task_that_lost_its_lease_rolls_its_writes_back(workers, observer):
    result = tasks.ledger_atomic_order.enqueue(lose_lease=True)
    # A long backoff after the reap: the burst ends before the job is ready again.
    assert workers("--burst", settings={"RETRY_BASE_SECONDS": 60}).wait() == 0
    job = _job(result.id)
    # The handler ran, but its completion was fenced off, so its Order vanished with it.
    assert [e["event"] for e in ledger.entries(observer, job.pk)] == ["start"]
    assert not Order.objects.filter(job_id=job.pk).exists()
    assert job.status == JobStatus.PENDING  # reaped: it will run again
    assert job.last_error_class == "django_pgqueue.exceptions.LeaseExpired"


def test_sync_task_past_its_timeout_is_failed_and_told_to_stop(workers, observer):
    result = tasks.ledger_overrun.enqueue(seconds=60)
    workers("--poll-interval", "0.05")
    wait_for(lambda: _job(result.id).status == JobStatus.DEAD_LETTER, timeout=30)
    job = _job(result.id)
    assert job.last_error_class == "django_pgqueue.exceptions.JobTimeout"
    wait_for(
        lambda: "cancelled" in [e["event"] for e in ledger.entries(observer, job.pk)],
        timeout=10,
        message="the handler to see its cancellation flag",
    )


def test_async_task_past_its_timeout_is_cancelled(workers):
    result = tasks.async_overrun.enqueue(seconds=60)
    workers("--poll-interval", "0.05")
    wait_for(lambda: _job(result.id).status == JobStatus.DEAD_LETTER, timeout=30)
    assert _job(result.id).last_error_class == "django_pgqueue.exceptions.JobTimeout"


def test_a_job_longer_than_its_lease_keeps_it_by_extension(workers, observer):
    result = tasks.ledger_sleep.enqueue(seconds=3)
    workers(
        "--lease-seconds",
        "1",
        "--poll-interval",
        "0.05",
        settings={"HOUSEKEEPING_INTERVAL_SECONDS": 0.2},
    )
    wait_for(lambda: _job(result.id).status == JobStatus.SUCCEEDED, timeout=30)
    job = _job(result.id)
    assert job.attempts == 1  # never reaped, though it ran three lease lengths
    assert job.errors == []


def test_max_jobs_exits_after_that_many(workers):
    Job.objects.enqueue_many([JobSpec("tests.tasks.noop") for _ in range(30)])
    worker = workers("--max-jobs", "10", "--concurrency", "2")
    assert worker.wait() == 0, worker.output()
    assert Job.objects.filter(status=JobStatus.SUCCEEDED).count() == 10
    assert Job.objects.filter(status=JobStatus.PENDING).count() == 20


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--concurrency", "0"], "--concurrency must be a whole number of at least 1"),
        (["--queue", "nope"], "--queue 'nope' is not in TASKS['default']['QUEUES']"),
        (["--backend", "missing"], "--backend 'missing' is not a key of TASKS"),
        (["--lease-seconds", "-1"], "--lease-seconds must be a positive number"),
        (["--grace-seconds", "nan"], "--grace-seconds must be 0 or more"),
        (["--max-jobs", "0"], "--max-jobs must be a whole number of at least 1"),
        (["--concurrency", "many"], "invalid int value: 'many'"),
        (["--processes", "0"], "--processes must be at least 1"),
    ],
)
def test_bad_flags_fail_before_starting_with_exit_code_2(workers, observer, args, message):
    worker = workers(*args)
    assert worker.wait() == 2
    assert message in worker.output()
    assert observer.execute("SELECT count(*) FROM django_pgqueue_worker").fetchone()[0] == 0
