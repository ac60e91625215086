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
    assert [line.split(f"job {result.id} ")[1].split(":")[0] for line in about_job] == [
        "started",
        "failed, will retry",
        "started",
        "failed, will retry",
        "started",
        "dead-lettered",
    ]
    assert all("error=builtins.ValueError: nope" in line for line in about_job[1::2])
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
