"""What a worker prints for failed attempts: one line each, the traceback once."""

from __future__ import annotations

import pytest

from tests import tasks

pytestmark = pytest.mark.timeout(120)

FAST_RETRY = {"RETRY_BASE_SECONDS": 0.01, "RETRY_MAX_SECONDS": 0.05, "RETRY_JITTER": 0}


def test_one_line_per_failed_attempt_and_the_traceback_once_at_the_dead_letter(workers):
    result = tasks.always_fails.enqueue("nope")
    worker = workers("--max-jobs", "3", "--poll-interval", "0.05", settings=FAST_RETRY)
    assert worker.wait(60) == 0, worker.output()
    lines = worker.output().splitlines()
    about_job = [line for line in lines if f"job {result.id} " in line]
    # No "started" line at the default verbosity: failures are lines of their own.
    assert [line.split(f"job {result.id} ")[1].split(":")[0] for line in about_job] == [
        "failed, will retry",
        "failed, will retry",
        "dead-lettered",
    ]
    assert all("error=builtins.ValueError: nope" in line for line in about_job)
    # Django's own receivers would add an ERROR record and a traceback per attempt.
    assert not any("django.tasks" in line or "Task id=" in line for line in lines)
    assert sum(line.startswith("Traceback") for line in lines) == 1
    traceback_at = lines.index("Traceback (most recent call last):")
    assert "dead-lettered" in lines[traceback_at - 1]
    assert "ValueError: nope" in lines[traceback_at:]


def test_failures_are_logged_at_verbosity_zero(workers):
    tasks.always_fails.using(max_attempts=1).enqueue("quiet")
    worker = workers("--burst", verbosity=0)
    assert worker.wait(60) == 0, worker.output()
    output = worker.output()
    assert "started: task=" not in output
    assert "dead-lettered: task=tests.tasks.always_fails" in output


def _summaries(output: str) -> list[str]:
    return [line for line in output.splitlines() if "finished in the last" in line]


def test_successes_are_counted_in_the_summary_line_at_the_default_verbosity(workers):
    results = tasks.noop.enqueue_many([((), {})] * 30)
    worker = workers("--burst", settings={"LOG_SUMMARY_SECONDS": 0.05})
    assert worker.wait(60) == 0, worker.output()
    output = worker.output()
    assert not any(f"job {result.id} " in output for result in results)
    summaries = _summaries(output)
    assert summaries, output
    counted = 0
    for line in summaries:
        assert " INFO " in line
        assert "django_pgqueue.worker" in line
        counted += int(line.split(": ")[-1].split(" succeeded")[0].replace(",", ""))
    assert counted == 30


def test_verbosity_two_writes_a_line_per_job_start_and_finish(workers):
    result = tasks.noop.enqueue()
    worker = workers("--burst", verbosity=2)
    assert worker.wait(60) == 0, worker.output()
    about_job = [line for line in worker.output().splitlines() if f"job {result.id} " in line]
    assert [line.split(f"job {result.id} ")[1].split(":")[0] for line in about_job] == [
        "started",
        "succeeded",
    ]
    assert all(" DEBUG " in line for line in about_job)


def test_no_summary_line_when_it_is_turned_off(workers):
    tasks.noop.enqueue()
    worker = workers("--burst", settings={"LOG_SUMMARY_SECONDS": 0})
    assert worker.wait(60) == 0, worker.output()
    assert not _summaries(worker.output())
    assert "stopped after 1 jobs" in worker.output()
