"""Two tiers: a job that reaches a final status leaves the job table for the history.

Every way a job finishes moves it in the statement that finishes it (nothing is ever
in neither tier or both), and everything a user reads or does with a finished job
works from the history: results, waits, idempotency keys, retries, dependents, discard.
"""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from unittest import mock

import pytest
from django.db import connections
from django.test import override_settings

from django_pgqueue.models import Dependency, Job
from django_pgqueue.states import JobStatus
from django_pgqueue.store.values import Failure, JobSpec
from django_pgqueue.waiting import wait
from django_pgqueue.worker import history as worker_history
from tests.workers import wait_for

pytestmark = pytest.mark.timeout(90)


def _tier(conn, job_id: int) -> str | None:
    """Where the job is: "live", "history", None (gone); fails if it is in both."""
    live = conn.execute("SELECT count(*) FROM django_pgqueue_job WHERE id = %s", [job_id])
    history = conn.execute(
        "SELECT count(*) FROM django_pgqueue_job_history WHERE id = %s", [job_id]
    )
    found = (live.fetchone()[0], history.fetchone()[0])
    assert found in {(0, 0), (1, 0), (0, 1)}, found
    return {(1, 0): "live", (0, 1): "history"}.get(found)


def _claim(store, job_id: int, queue: str = "default"):
    claimed = store.claim("w", [queue], per_queue=50, lease_seconds=30)
    (job,) = [job for job in claimed if job.id == job_id]
    return job


def _no_job_in_both_tiers(conn) -> None:
    assert (
        conn.execute(
            "SELECT count(*) FROM (SELECT id FROM django_pgqueue_job "
            "INTERSECT SELECT id FROM django_pgqueue_job_history) AS both_tiers"
        ).fetchone()[0]
        == 0
    )


def test_a_succeeded_job_moves_to_todays_partition_of_its_class(store, observer):
    job_id = store.enqueue(JobSpec("tests.tasks.noop")).id
    claimed = _claim(store, job_id)
    assert _tier(observer, job_id) == "live"
    store.complete_if_leased(claimed.lease, '{"answer": 42}')
    assert _tier(observer, job_id) == "history"
    partition, history_class, result = observer.execute(
        "SELECT tableoid::regclass::text, history_class, result::text "
        "FROM django_pgqueue_job_history WHERE id = %s",
        [job_id],
    ).fetchone()
    assert partition == f"django_pgqueue_job_history_c1_{datetime.now(UTC):%Y%m%d}00"
    assert (history_class, result) == (1, '{"answer": 42}')
    job = Job.objects.get(pk=job_id)
    assert (job.status, job.result) == (JobStatus.SUCCEEDED, {"answer": 42})


def test_every_final_status_moves_in_the_statement_that_sets_it(store, observer):
    dead = store.enqueue(JobSpec("tests.tasks.noop", queue="d")).id
    store.fail_if_leased(_claim(store, dead, "d").lease, Failure("E", "boom", permanent=True))
    pending = store.enqueue(JobSpec("tests.tasks.noop", queue="p")).id
    running = store.enqueue(JobSpec("tests.tasks.noop", queue="r")).id
    lease = _claim(store, running, "r").lease
    result = store.cancel([pending, running])
    assert set(result.done) == {pending, running}
    assert (_tier(observer, dead), _tier(observer, pending)) == ("history", "history")
    assert _tier(observer, running) == "live"  # asked to stop: it ends when its handler returns
    store.complete_many_if_leased("w", [(lease, "null")])
    assert _tier(observer, running) == "history"
    expired = store.enqueue(JobSpec("tests.tasks.noop", queue="x", max_attempts=1)).id
    _claim(store, expired, "x")
    observer.execute(
        "UPDATE django_pgqueue_job SET lease_expires_at = now() - interval '1 s' WHERE id = %s",
        [expired],
    )
    assert [job.job_id for job in store.reap_expired(job_ids=[expired])] == [expired]
    assert _tier(observer, expired) == "history"
    statuses = dict(
        Job.objects.filter(pk__in=[dead, pending, running, expired]).values_list("id", "status")
    )
    assert statuses == {
        dead: "dead_letter",
        pending: "cancelled",
        running: "cancelled",
        expired: "dead_letter",
    }
    assert observer.execute(
        "SELECT id, history_class FROM django_pgqueue_job_history ORDER BY id"
    ).fetchall() == sorted([(dead, 3), (pending, 2), (running, 2), (expired, 3)])
    _no_job_in_both_tiers(observer)


def test_an_old_workers_plain_update_moves_the_row_too(store, observer):
    job_id = store.enqueue(JobSpec("tests.tasks.noop")).id
    _claim(store, job_id)
    # What the previous release's completion does: an UPDATE of the job table.
    observer.execute(
        "UPDATE django_pgqueue_job SET status = 'succeeded', finished_at = now(), "
        "result = '1' WHERE id = %s",
        [job_id],
    )
    assert _tier(observer, job_id) == "history"
    assert Job.objects.get(pk=job_id).result == 1


def test_a_failed_move_leaves_the_job_where_it_was(store, observer):
    """The move is part of the finishing statement: if it fails, nothing finished."""
    job_id = store.enqueue(JobSpec("tests.tasks.noop")).id
    claimed = _claim(store, job_id)
    observer.execute(
        "ALTER TABLE django_pgqueue_job_history_c1 DETACH PARTITION "
        f"django_pgqueue_job_history_c1_{datetime.now(UTC):%Y%m%d}00"
    )
    observer.execute(
        "ALTER TABLE django_pgqueue_job_history_succeeded "
        "DETACH PARTITION django_pgqueue_job_history_c1"
    )
    try:
        with pytest.raises(Exception, match="no partition"):
            store.complete_if_leased(claimed.lease, "null")
        assert _tier(observer, job_id) == "live"
        assert Job.objects.get(pk=job_id).status == JobStatus.PROCESSING
    finally:
        observer.execute(
            "ALTER TABLE django_pgqueue_job_history_succeeded ATTACH PARTITION "
            "django_pgqueue_job_history_c1 FOR VALUES IN (1)"
        )
        today = datetime.now(UTC).date()
        observer.execute(
            "ALTER TABLE django_pgqueue_job_history_c1 ATTACH PARTITION "
            f"django_pgqueue_job_history_c1_{today:%Y%m%d}00 FOR VALUES "
            f"FROM ('{today.isoformat()} 00:00+00') TO ('{today + timedelta(days=1)} 00:00+00')"
        )
    store.complete_if_leased(claimed.lease, "null")
    assert _tier(observer, job_id) == "history"


def test_an_idempotency_key_stays_taken_after_its_job_moved(store, observer):
    first = store.enqueue(JobSpec("tests.tasks.noop", idempotency_key="once"))
    store.complete_if_leased(_claim(store, first.id).lease, '"done"')
    assert _tier(observer, first.id) == "history"
    again = store.enqueue(JobSpec("tests.tasks.noop", idempotency_key="once"))
    assert (again.id, again.created) == (first.id, False)
    assert again.snapshot.status == JobStatus.SUCCEEDED
    (from_sql,) = observer.execute(
        "SELECT django_pgqueue_enqueue('tests.tasks.noop', idempotency_key => 'once')"
    ).fetchone()
    assert from_sql == first.id
    assert observer.execute(
        "SELECT count(*) FROM django_pgqueue_job_all WHERE idempotency_key = 'once'"
    ).fetchone() == (1,)


def test_a_key_is_freed_once_its_job_is_gone_from_both_tiers(store, observer):
    first = store.enqueue(JobSpec("tests.tasks.noop", idempotency_key="k"))
    store.complete_if_leased(_claim(store, first.id).lease, "null")
    observer.execute("UPDATE django_pgqueue_job_key SET checked_at = now() - interval '2 h'")
    assert store.prune_idempotency_keys(limit=10, recheck_seconds=3600) == 0  # still held
    assert store.discard([first.id]).done == (first.id,)
    assert _tier(observer, first.id) is None
    # Discard frees the key at once.
    second = store.enqueue(JobSpec("tests.tasks.noop", idempotency_key="k"))
    assert second.created
    assert second.id != first.id
    store.complete_if_leased(_claim(store, second.id).lease, "null")
    # A pruned job's key (its partition dropped): freed by housekeeping, and taken over
    # by a new job before that.
    observer.execute("DELETE FROM django_pgqueue_job_history WHERE id = %s", [second.id])
    third = store.enqueue(JobSpec("tests.tasks.noop", idempotency_key="k"))
    assert third.created
    assert third.id != second.id
    observer.execute("DELETE FROM django_pgqueue_job WHERE id = %s", [third.id])
    observer.execute("UPDATE django_pgqueue_job_key SET checked_at = now() - interval '2 h'")
    assert store.prune_idempotency_keys(limit=10, recheck_seconds=3600) == 1
    assert observer.execute("SELECT count(*) FROM django_pgqueue_job_key").fetchone() == (0,)


def test_two_producers_racing_for_a_key_whose_job_is_finishing_get_one_job(make_store, observer):
    """The key holder moves to the history while others enqueue with its key."""
    for round_ in range(20):
        key = f"race-{round_}"
        holder = make_store()
        job = holder.enqueue(JobSpec("tests.tasks.noop", idempotency_key=key))
        lease = _claim(holder, job.id).lease
        start = threading.Barrier(3)
        ids: list[int] = []

        def produce(key: str, start: threading.Barrier, ids: list[int]) -> None:
            producer = make_store()
            start.wait()
            ids.append(producer.enqueue(JobSpec("tests.tasks.noop", idempotency_key=key)).id)

        threads = [threading.Thread(target=produce, args=(key, start, ids)) for _ in range(2)]
        for thread in threads:
            thread.start()
        start.wait()
        holder.complete_if_leased(lease, "null")
        for thread in threads:
            thread.join(timeout=30)
        assert ids == [job.id, job.id]
        assert observer.execute(
            "SELECT count(*) FROM django_pgqueue_job_all WHERE idempotency_key = %s", [key]
        ).fetchone() == (1,)


def test_a_retried_dead_letter_comes_back_with_its_id_and_history(store, observer):
    job_id = store.enqueue(JobSpec("tests.tasks.noop", idempotency_key="r")).id
    store.fail_if_leased(_claim(store, job_id).lease, Failure("E", "boom", permanent=True))
    assert _tier(observer, job_id) == "history"
    assert store.retry([job_id]).done == (job_id,)
    assert _tier(observer, job_id) == "live"
    job = Job.objects.get(pk=job_id)
    assert (job.status, job.attempts, job.idempotency_key) == (JobStatus.PENDING, 0, "r")
    assert len(job.error_history()) == 1
    store.complete_if_leased(_claim(store, job_id).lease, '"second time"')
    assert _tier(observer, job_id) == "history"
    assert Job.objects.get(pk=job_id).result == "second time"


def test_retry_with_dependents_brings_back_what_the_failure_cancelled(store, observer):
    blocker = store.enqueue(JobSpec("tests.tasks.noop", queue="a")).id
    child = store.enqueue(JobSpec("tests.tasks.noop", queue="b", after=[blocker])).id
    grandchild = store.enqueue(JobSpec("tests.tasks.noop", queue="c", after=[child])).id
    store.fail_if_leased(_claim(store, blocker, "a").lease, Failure("E", "x", permanent=True))
    assert [_tier(observer, i) for i in (blocker, child, grandchild)] == ["history"] * 3
    assert Job.objects.get(pk=grandchild).status == JobStatus.CANCELLED
    assert store.retry([blocker], revive_dependents=True).done == (blocker,)
    assert [Job.objects.get(pk=i).status for i in (blocker, child, grandchild)] == [
        JobStatus.PENDING,
        JobStatus.BLOCKED,
        JobStatus.BLOCKED,
    ]
    store.complete_if_leased(_claim(store, blocker, "a").lease, "null")
    assert Job.objects.get(pk=child).status == JobStatus.PENDING
    _no_job_in_both_tiers(observer)


def test_enqueueing_after_finished_jobs_reads_them_from_the_history(store, observer):
    done = store.enqueue(JobSpec("tests.tasks.noop")).id
    store.complete_if_leased(_claim(store, done).lease, '"x"')
    dead = store.enqueue(JobSpec("tests.tasks.noop", queue="d")).id
    store.fail_if_leased(_claim(store, dead, "d").lease, Failure("E", "x", permanent=True))
    after_done = store.enqueue(JobSpec("tests.tasks.noop", after=[done]))
    after_dead = store.enqueue(JobSpec("tests.tasks.noop", after=[dead]))
    assert after_done.snapshot.status == JobStatus.PENDING
    assert after_dead.snapshot.status == JobStatus.CANCELLED
    assert {edge.blocker_id for edge in Dependency.objects.all()} == {done, dead}
    # The finished blockers are flagged in the history, for a retry to settle them.
    assert (
        observer.execute(
            "SELECT count(*) FROM django_pgqueue_job_history WHERE has_dependents"
        ).fetchone()[0]
        >= 2
    )


def test_a_wait_is_told_when_the_job_reaches_the_history(store, make_store):
    job_id = store.enqueue(JobSpec("tests.tasks.noop")).id
    claimed = _claim(store, job_id)
    outcome: list = []

    def wait_in_thread() -> None:
        try:
            outcome.append(wait(job_id, timeout=30))
        finally:
            connections.close_all()

    waiter = threading.Thread(target=wait_in_thread)
    waiter.start()
    wait_for(lambda: Job.objects.get(pk=job_id).awaited, timeout=10)
    make_store().complete_if_leased(claimed.lease, "null")
    waiter.join(timeout=30)
    assert len(outcome) == 1
    assert outcome[0].status.name == "SUCCESSFUL"


def test_housekeeping_moves_rows_finished_before_the_upgrade(store, observer):
    # Rows as the previous release left them: finished, in the job table.
    observer.execute("ALTER TABLE django_pgqueue_job DISABLE TRIGGER django_pgqueue_job_to_history")
    try:
        ids = [
            store.enqueue(JobSpec("tests.tasks.noop", idempotency_key=f"old-{i}")).id
            for i in range(25)
        ]
        observer.execute(
            "UPDATE django_pgqueue_job SET status = 'succeeded', finished_at = now() "
            "WHERE id = ANY(%s)",
            [ids],
        )
    finally:
        observer.execute(
            "ALTER TABLE django_pgqueue_job ENABLE TRIGGER django_pgqueue_job_to_history"
        )
    observer.execute("DELETE FROM django_pgqueue_job_key")  # keys only in the old index
    assert store.move_finished(limit=10) == 10
    # Housekeeping's batch is capped whatever PGQUEUE_PRUNE_BATCH_SIZE says.
    with (
        mock.patch.object(worker_history, "MOVE_BATCH", 6),
        override_settings(PGQUEUE_PRUNE_BATCH_SIZE=1_000_000),
    ):
        assert worker_history.move_finished(store) == 6
    assert store.move_finished(limit=100) == 9
    assert store.move_finished(limit=100) == 0
    assert {_tier(observer, i) for i in ids} == {"history"}
    assert observer.execute("SELECT count(*) FROM django_pgqueue_job_key").fetchone() == (25,)
    again = store.enqueue(JobSpec("tests.tasks.noop", idempotency_key="old-3"))
    assert (again.id, again.created) == (ids[3], False)


def test_the_orm_and_get_result_read_both_tiers(store):
    live = store.enqueue(JobSpec("tests.tasks.noop")).id
    done = store.enqueue(JobSpec("tests.tasks.noop", queue="q")).id
    store.complete_if_leased(_claim(store, done, "q").lease, '"r"')
    assert set(Job.objects.values_list("id", flat=True)) == {live, done}
    assert Job.objects.filter(status=JobStatus.SUCCEEDED).get().id == done


@pytest.mark.django_db(transaction=True)
def test_the_admin_lists_searches_and_shows_finished_jobs_from_the_history(client, observer):
    from tests.admin_fixtures import dead_letter, enqueue, login, row_ids, succeeded, url

    login(client, superuser=True)
    done = succeeded(result={"total": 7})
    dead = dead_letter(error_class="ValueError")
    waiting = enqueue()
    assert (_tier(observer, done.pk), _tier(observer, dead.pk)) == ("history", "history")
    assert _tier(observer, waiting.pk) == "live"
    inbox = "django_pgqueue_job_changelist"
    assert set(row_ids(client.get(url(inbox)))) == {done.pk, dead.pk, waiting.pk}
    assert row_ids(client.get(url(inbox, status="succeeded"))) == [done.pk]
    assert row_ids(client.get(url(inbox, q=str(dead.pk)))) == [dead.pk]
    page = client.get(url("django_pgqueue_job_change", done.pk))
    assert page.status_code == 200
    assert "total" in page.text
    groups = client.get(url("django_pgqueue_deadletter_groups")).context["rows"]
    assert [row["group"].jobs for row in groups] == [1]
    lag = client.get(url("django_pgqueue_lag_changelist"))
    assert lag.status_code == 200
