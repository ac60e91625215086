"""Pausing queues: the claim skips them at once, enqueue carries on, resume continues."""

from __future__ import annotations

import time
from collections import Counter

import pytest
from django.core.management import CommandError, call_command

from django_pgqueue import InvalidOption, UnknownQueue, pause_queue, paused_queues, resume_queue
from django_pgqueue.models import Job
from django_pgqueue.states import JobStatus
from django_pgqueue.store.values import JobSpec
from tests import ledger
from tests.workers import wait_for

pytestmark = pytest.mark.timeout(180)


def _claim(store, queues=("default", "emails")):
    return store.claim("w1", list(queues), per_queue=50, lease_seconds=30)


def test_a_paused_queue_is_skipped_by_the_claim_and_resumed(store):
    emails = [store.enqueue(JobSpec("tests.tasks.noop", queue="emails")).id for _ in range(3)]
    default = store.enqueue(JobSpec("tests.tasks.noop")).id
    pause = pause_queue("emails", by="alice", reason="provider down")
    assert (pause.queue, pause.paused_by, pause.reason, pause.created) == (
        "emails",
        "alice",
        "provider down",
        True,
    )
    # Enqueue keeps working while paused.
    emails.append(store.enqueue(JobSpec("tests.tasks.noop", queue="emails")).id)
    assert [job.id for job in _claim(store)] == [default]
    assert _claim(store) == []
    resumed = resume_queue("emails")
    assert resumed is not None
    assert resumed.paused_at == pause.paused_at
    assert sorted(job.id for job in _claim(store)) == sorted(emails)


def test_partitioned_jobs_of_a_paused_queue_wait_too(store):
    job = store.enqueue(JobSpec("tests.tasks.noop", queue="emails", partition_key="k")).id
    pause_queue("emails")
    assert _claim(store) == []
    assert _claim(store) == []  # after the partition signals were folded
    resume_queue("emails")
    assert [claimed.id for claimed in _claim(store)] == [job]


def test_pausing_twice_keeps_the_first_pause(transactional_db):
    first = pause_queue("emails", by="alice", reason="first")
    second = pause_queue("emails", by="bob", reason="second")
    assert not second.created
    assert (second.paused_by, second.reason, second.paused_at) == (
        "alice",
        "first",
        first.paused_at,
    )
    assert list(paused_queues()) == ["emails"]
    assert resume_queue("emails") is not None
    assert resume_queue("emails") is None
    assert paused_queues() == {}


def test_unknown_queues_and_bad_input_are_typed_errors(transactional_db):
    with pytest.raises(UnknownQueue, match="'nope'"):
        pause_queue("nope")
    with pytest.raises(UnknownQueue, match="'nope'"):
        resume_queue("nope")
    with pytest.raises(InvalidOption, match="queue"):
        pause_queue("")
    with pytest.raises(InvalidOption, match="by"):
        pause_queue("emails", by="x" * 151)
    assert paused_queues() == {}


def test_a_queue_paused_then_dropped_from_the_settings_can_be_resumed(transactional_db, settings):
    pause_queue("reports")
    tasks = {**settings.TASKS}
    tasks["default"] = {**tasks["default"], "QUEUES": ["default"]}
    settings.TASKS = tasks
    with pytest.raises(UnknownQueue):
        pause_queue("reports")
    assert resume_queue("reports") is not None


def test_the_commands_pause_and_resume(transactional_db, capsys):
    call_command("pausequeue", "emails", reason="incident 42", by="oncall")
    assert capsys.readouterr().out.startswith("Paused queue 'emails' at ")
    paused = paused_queues()["emails"]
    assert (paused.paused_by, paused.reason) == ("oncall", "incident 42")
    call_command("pausequeue", "emails")
    assert "was already paused at" in capsys.readouterr().out
    call_command("resumequeue", "emails")
    assert capsys.readouterr().out.startswith("Resumed queue 'emails' (paused since ")
    call_command("resumequeue", "emails")
    assert capsys.readouterr().out == "Queue 'emails' was not paused; left as it was.\n"
    with pytest.raises(CommandError, match="'nope' is not one of"):
        call_command("pausequeue", "nope")


def _started(observer):
    return [entry for entry in ledger.entries(observer) if entry["event"] == "start"]


def test_three_workers_stop_starting_jobs_within_a_round_and_resume(workers, observer, store):
    specs = [
        JobSpec("tests.tasks.ledger_sleep", queue="emails", kwargs={"seconds": 0.05})
        for _ in range(240)
    ]
    ids = [outcome.id for outcome in store.enqueue_many(specs)]
    for _ in range(3):
        workers("--queue", "emails", "--concurrency", "4", "--poll-interval", "0.2")
    wait_for(lambda: len(_started(observer)) >= 30, timeout=60, message="the drain to start")
    pause_queue("emails", by="test")
    # Acknowledged: the pause committed. Every claim that begins from now on sees it.
    acknowledged_at = observer.execute("SELECT clock_timestamp()").fetchone()[0]
    meanwhile = [
        outcome.id
        for outcome in store.enqueue_many(
            [JobSpec("tests.tasks.ledger_sleep", queue="emails") for _ in range(20)]
        )
    ]
    wait_for(
        lambda: not Job.objects.filter(queue="emails", status=JobStatus.PROCESSING).exists(),
        timeout=60,
        message="the running jobs to finish",
    )
    # Several claim rounds (poll interval 0.2 s, and the jobs above ended, freeing slots)
    # pass without a start: absence can only be watched for a while.
    time.sleep(2)
    late = Job.objects.filter(queue="emails", started_at__gte=acknowledged_at)
    assert list(late.values_list("id", flat=True)) == []
    pending = Job.objects.filter(queue="emails", status=JobStatus.PENDING).count()
    assert pending >= 20
    stopped_at = max(entry["at"] for entry in _started(observer))
    assert all(
        entry["at"] < acknowledged_at or entry["job_id"] in _claimed_before(acknowledged_at)
        for entry in _started(observer)
    ), stopped_at
    resume_queue("emails")
    everything = ids + meanwhile
    wait_for(
        lambda: (
            Job.objects.filter(pk__in=everything, status=JobStatus.SUCCEEDED).count()
            == len(everything)
        ),
        timeout=120,
        message="the queue to drain after the resume",
    )
    starts = Counter(entry["job_id"] for entry in _started(observer))
    assert set(starts) == set(everything)
    assert set(starts.values()) == {1}


def _claimed_before(moment):
    return set(
        Job.objects.filter(queue="emails", claimed_at__lt=moment).values_list("id", flat=True)
    )
