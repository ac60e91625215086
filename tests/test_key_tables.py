"""Idempotency and coalesce keys hold without the job table's unique indexes (0026, 0027).

A segmented job table cannot carry ``pgq_job_idempotency_key`` or
``pgq_job_coalesce_key``; this release's statements must not need them. The tests under
``without_unique_indexes`` (tests/key_indexes.py) drop both for their duration, and the
coalesced enqueue's backstop clause that names one, so what they check is exactly what a
release without the indexes will have: the key tables and their row locks alone keep
one job per key. The rest attack the key tables'
housekeeping against producers acting on the same key at the same moment.
"""

from __future__ import annotations

import json
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from importlib import import_module
from pathlib import Path
from typing import Any

import psycopg
import pytest

from django_pgqueue.states import JobStatus
from django_pgqueue.store.retry import RetryPolicy
from django_pgqueue.store.sql import QUERIES
from django_pgqueue.store.values import Failure, JobSpec
from django_pgqueue.worker.housekeeping import COALESCE_KEY_RECHECK_SECONDS
from tests.releases import checkout, previous_release, python
from tests.workers import wait_for

pytestmark = pytest.mark.timeout(120)


def _coalesced(*args: Any, key: str = "reindex:1", task: str = "tests.tasks.echo") -> JobSpec:
    return JobSpec(task, args=args, coalesce_key=key)


def _pending_holders(observer, key: str) -> list[int]:
    return [
        row[0]
        for row in observer.execute(
            "SELECT id FROM django_pgqueue_job WHERE coalesce_key = %s AND status = 'pending'",
            [key],
        )
    ]


def _named(observer, key: str) -> int | None:
    row = observer.execute(
        "SELECT job_id FROM django_pgqueue_coalesce_key WHERE coalesce_key = %s", [key]
    ).fetchone()
    return None if row is None else row[0]


def _waiting_on_lock(observer, pid: int) -> bool:
    return bool(
        observer.execute(
            "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = %s", [pid]
        ).fetchone()[0]
    )


def _race(make_store, spec_of, count: int) -> list[tuple[int, bool]]:
    """``count`` producers, each on its own connection, enqueue at the same moment."""
    stores = [make_store() for _ in range(count)]
    start = threading.Barrier(count)

    def enqueue(index: int) -> tuple[int, bool]:
        start.wait(timeout=30)
        outcome = stores[index].enqueue(spec_of(index))
        return outcome.id, outcome.created

    with ThreadPoolExecutor(max_workers=count) as pool:
        return list(pool.map(enqueue, range(count)))


def test_racing_coalesced_enqueues_make_one_job_without_the_unique_index(
    without_unique_indexes, make_store, observer
):
    for round_ in range(5):
        key = f"race:{round_}"
        results = _race(make_store, lambda index, key=key: _coalesced(index, key=key), 8)
        assert len({job_id for job_id, _ in results}) == 1
        assert sum(created for _, created in results) == 1
        assert _pending_holders(observer, key) == [results[0][0]]
        assert _named(observer, key) == results[0][0]


def test_racing_coalesced_enqueues_in_open_transactions_make_one_job(
    without_unique_indexes, make_store, observer
):
    """The second producer waits for the first's transaction, then sees its job."""
    first, second = make_store(), make_store()
    pid = second.runner.connection.info.backend_pid
    with ThreadPoolExecutor(max_workers=1) as pool:
        with first.runner.connection.transaction():
            made = first.enqueue(_coalesced(1))
            waiting = pool.submit(second.enqueue, _coalesced(2))
            wait_for(lambda: _waiting_on_lock(observer, pid), timeout=10, message="a wait")
        joined = waiting.result(timeout=10)
    assert made.created
    assert (joined.id, joined.created) == (made.id, False)
    assert joined.snapshot.args == [2]
    assert _pending_holders(observer, "reindex:1") == [made.id]


def test_a_rolled_back_producer_leaves_the_key_to_the_next(
    without_unique_indexes, make_store, observer
):
    first, second = make_store(), make_store()
    pid = second.runner.connection.info.backend_pid
    with ThreadPoolExecutor(max_workers=1) as pool:
        first.runner.connection.execute("BEGIN")
        try:
            first.enqueue(_coalesced(1))
            waiting = pool.submit(second.enqueue, _coalesced(2))
            wait_for(lambda: _waiting_on_lock(observer, pid), timeout=10, message="a wait")
        finally:
            first.runner.connection.execute("ROLLBACK")
        made = waiting.result(timeout=10)
    assert made.created
    assert _pending_holders(observer, "reindex:1") == [made.id]
    assert _named(observer, "reindex:1") == made.id


def test_a_claim_racing_a_coalesced_enqueue_frees_the_key_without_the_unique_index(
    without_unique_indexes, make_store, observer
):
    claimer, producer = make_store(), make_store()
    first = producer.enqueue(_coalesced(1))
    pid = producer.runner.connection.info.backend_pid
    with ThreadPoolExecutor(max_workers=1) as pool:
        with claimer.runner.connection.transaction():
            (claimed,) = claimer.claim("w", ["default"], per_queue=5, lease_seconds=30)
            waiting = pool.submit(producer.enqueue, _coalesced(2))
            wait_for(lambda: _waiting_on_lock(observer, pid), timeout=10, message="a wait")
        second = waiting.result(timeout=10)
    assert claimed.id == first.id
    assert second.created
    assert second.id != first.id
    assert _pending_holders(observer, "reindex:1") == [second.id]
    assert _named(observer, "reindex:1") == second.id


@pytest.mark.parametrize("how", ["retry", "cancel", "snooze"])
def test_a_job_that_left_pending_and_came_back_does_not_hold_its_key(
    without_unique_indexes, store, observer, how
):
    """A retried or snoozed job is pending again without its key; a cancelled one is gone."""
    first = store.enqueue(_coalesced(1))
    if how == "cancel":
        assert store.cancel([first.id]).done == (first.id,)
    else:
        (job,) = store.claim("w", ["default"], per_queue=5, lease_seconds=30)
        if how == "retry":
            store.fail_if_leased(job.lease, Failure("RuntimeError", "boom"), RetryPolicy(0, 0, 0))
        else:
            store.snooze_if_leased(job.lease, delay_seconds=0, max_snoozes=10)
        assert _pending_holders(observer, "reindex:1") == []
    second = store.enqueue(_coalesced(2))
    assert second.created
    assert second.id != first.id
    assert _pending_holders(observer, "reindex:1") == [second.id]
    assert store.enqueue(_coalesced(3)).id == second.id


def test_another_tasks_holder_is_returned_unchanged_without_the_unique_index(
    without_unique_indexes, store, observer
):
    first = store.enqueue(_coalesced(1))
    other = store.enqueue(_coalesced(key="reindex:1", task="tests.tasks.noop"))
    assert (other.id, other.created) == (first.id, False)
    assert other.snapshot.args == [1]
    assert _pending_holders(observer, "reindex:1") == [first.id]


def test_racing_idempotent_enqueues_make_one_job_without_the_unique_index(
    without_unique_indexes, make_store, observer
):
    for round_ in range(5):
        key = f"once:{round_}"
        results = _race(
            make_store, lambda index, key=key: JobSpec("tests.tasks.noop", idempotency_key=key), 8
        )
        assert len({job_id for job_id, _ in results}) == 1
        assert sum(created for _, created in results) == 1
    # A batch naming one key twice, and a key a finished job holds.
    outcomes = make_store().enqueue_many(
        [JobSpec("tests.tasks.noop", idempotency_key=k) for k in ("a", "b", "a", "once:0")]
    )
    assert [outcome.created for outcome in outcomes] == [True, True, False, False]
    assert outcomes[0].id == outcomes[2].id
    (from_sql,) = observer.execute(
        "SELECT django_pgqueue_enqueue('tests.tasks.noop', idempotency_key => 'b')"
    ).fetchone()
    assert from_sql == outcomes[1].id
    assert (
        observer.execute(
            "SELECT idempotency_key, count(*) FROM django_pgqueue_job_all "
            "WHERE idempotency_key IS NOT NULL GROUP BY 1 HAVING count(*) > 1"
        ).fetchall()
        == []
    )


def test_a_finished_holders_key_stays_taken_without_the_unique_index(
    without_unique_indexes, store, observer
):
    first = store.enqueue(JobSpec("tests.tasks.noop", idempotency_key="done-once"))
    (job,) = store.claim("w", ["default"], per_queue=5, lease_seconds=30)
    store.complete_if_leased(job.lease, "null")
    again = store.enqueue(JobSpec("tests.tasks.noop", idempotency_key="done-once"))
    assert (again.id, again.created, again.snapshot.status) == (
        first.id,
        False,
        JobStatus.SUCCEEDED,
    )


def test_coalesce_keys_whose_job_no_longer_holds_them_are_forgotten(store, observer):
    claimed = store.enqueue(_coalesced(1, key="claimed"))
    (job,) = store.claim("w", ["default"], per_queue=5, lease_seconds=30)
    assert job.id == claimed.id
    held = store.enqueue(_coalesced(1, key="held"))
    locked = store.enqueue(_coalesced(1, key="locked"))
    recent = store.enqueue(_coalesced(1, key="recent"))
    observer.execute(
        "UPDATE django_pgqueue_coalesce_key SET checked_at = now() - interval '1 hour' "
        "WHERE coalesce_key <> 'recent'"
    )
    with psycopg.connect(observer.info.dsn) as producer:
        # A producer holding "locked"'s row: skipped, whatever its job.
        producer.execute(
            "SELECT 1 FROM django_pgqueue_coalesce_key WHERE coalesce_key = 'locked' FOR UPDATE"
        )
        observer.execute("DELETE FROM django_pgqueue_job WHERE id = %s", [locked.id])
        freed = store.prune_coalesce_keys(limit=10, recheck_seconds=COALESCE_KEY_RECHECK_SECONDS)
    assert freed == 1
    rows = dict(observer.execute("SELECT coalesce_key, job_id FROM django_pgqueue_coalesce_key"))
    assert rows == {"held": held.id, "locked": locked.id, "recent": recent.id}
    # The held key was found held: checked again only after the interval.
    assert store.prune_coalesce_keys(limit=10, recheck_seconds=COALESCE_KEY_RECHECK_SECONDS) == 1
    assert set(
        dict(observer.execute("SELECT coalesce_key, job_id FROM django_pgqueue_coalesce_key"))
    ) == {"held", "recent"}
    # A producer makes a forgotten key's row again.
    again = store.enqueue(_coalesced(2, key="claimed"))
    assert again.created
    assert _named(observer, "claimed") == again.id


def _enqueue_while_housekeeping_frees(
    make_store, observer, *, kind: str, key: str, spec: JobSpec, recheck_seconds: float
):
    """Housekeeping locks ``key`` (``lock_<kind>_keys``); a producer enqueueing ``spec``
    waits for it; housekeeping then deletes the key (``free_<kind>_keys``) and commits.
    Returns the producer's outcome."""
    housekeeper, producer = make_store(), make_store()
    pid = producer.runner.connection.info.backend_pid
    with ThreadPoolExecutor(max_workers=1) as pool:
        with housekeeper.runner.connection.transaction():
            locked = housekeeper.runner.run(
                QUERIES[f"lock_{kind}_keys"], {"limit": 10, "recheck_seconds": recheck_seconds}
            ).rows
            assert locked == [(key,)]
            waiting = pool.submit(producer.enqueue, spec)
            wait_for(lambda: _waiting_on_lock(observer, pid), timeout=10, message="a wait")
            freed = housekeeper.runner.run(QUERIES[f"free_{kind}_keys"], {"keys": [key]})
            assert freed.rows == [(1,)]
        return waiting.result(timeout=10)


def test_a_producer_waiting_on_a_key_housekeeping_forgets_makes_it_again(
    without_unique_indexes, make_store, observer
):
    """Housekeeping locks a key whose job was claimed; a producer of that key waits for
    it, and once the row is deleted makes it again and inserts the one new holder."""
    first = make_store().enqueue(_coalesced(1))
    make_store().claim("w", ["default"], per_queue=5, lease_seconds=30)
    observer.execute("UPDATE django_pgqueue_coalesce_key SET checked_at = now() - interval '1 h'")
    second = _enqueue_while_housekeeping_frees(
        make_store,
        observer,
        kind="coalesce",
        key="reindex:1",
        spec=_coalesced(2),
        recheck_seconds=60,
    )
    assert second.created
    assert second.id != first.id
    assert _pending_holders(observer, "reindex:1") == [second.id]
    assert _named(observer, "reindex:1") == second.id


def test_a_producer_taking_over_a_stale_idempotency_key_housekeeping_frees_takes_it_anew(
    without_unique_indexes, make_store, observer
):
    """The trigger waits for the key's row while housekeeping frees it; it then takes
    the key anew (0020's trigger inserted the job with its key taken nowhere)."""
    spec = JobSpec("tests.tasks.noop", idempotency_key="stale")
    gone = make_store().enqueue(spec)
    observer.execute("DELETE FROM django_pgqueue_job WHERE id = %s", [gone.id])
    observer.execute("UPDATE django_pgqueue_job_key SET checked_at = now() - interval '2 h'")
    made = _enqueue_while_housekeeping_frees(
        make_store, observer, kind="idempotency", key="stale", spec=spec, recheck_seconds=3600
    )
    assert made.created
    assert observer.execute("SELECT idempotency_key FROM django_pgqueue_job_key").fetchall() == [
        ("stale",)
    ]
    # So the key keeps its job: another enqueue returns it.
    assert make_store().enqueue(spec).id == made.id


def test_keys_of_jobs_enqueued_before_0020_are_taken_by_0027(
    without_unique_indexes, store, observer, monkeypatch
):
    """A live job whose key only the unique index held (no row in the key table): without
    0027 a second enqueue of the key would make a second job."""
    old = store.enqueue(JobSpec("tests.tasks.noop", idempotency_key="from-0019"))
    later = store.enqueue(JobSpec("tests.tasks.noop", idempotency_key="from-0025"))
    observer.execute("DELETE FROM django_pgqueue_job_key WHERE idempotency_key = 'from-0019'")
    migration = import_module("django_pgqueue.migrations.0027_take_old_idempotency_keys")
    monkeypatch.setattr(migration, "BATCH", 1)  # a batch per key: the loop's every turn

    class Editor:
        connection = _DjangoConnection()

    migration.take_old_keys(None, Editor())
    assert dict(observer.execute("SELECT idempotency_key, 1 FROM django_pgqueue_job_key")) == {
        "from-0019": 1,
        "from-0025": 1,
    }
    again = store.enqueue(JobSpec("tests.tasks.noop", idempotency_key="from-0019"))
    assert (again.id, again.created) == (old.id, False)
    assert store.enqueue(JobSpec("tests.tasks.noop", idempotency_key="from-0025")).id == later.id


class _DjangoConnection:
    """Django's default connection, as a migration's schema editor hands it over."""

    def cursor(self):
        from django.db import connection

        return connection.cursor()


def test_a_holder_the_previous_release_inserted_is_coalesced_into(store, observer):
    """A rolling deploy: the previous release's producers insert holders the key's row
    does not name; the backstop clause finds them through pgq_job_coalesce_key."""
    (old_id,) = observer.execute(
        "INSERT INTO django_pgqueue_job (queue, task_path, args, kwargs, priority, status, "
        "attempts, max_attempts, lease_generation, available_at, created_at, errors, "
        "coalesce_key) VALUES ('default', 'tests.tasks.echo', '[1]', '{}', 0, 'pending', 0, "
        "3, 0, now(), now(), '[]', 'reindex:1') RETURNING id"
    ).fetchone()
    again = store.enqueue(_coalesced(2))
    assert (again.id, again.created) == (old_id, False)
    assert again.snapshot.args == [2]
    assert _named(observer, "reindex:1") == old_id
    other = store.enqueue(_coalesced(key="reindex:1", task="tests.tasks.noop"))
    assert (other.id, other.created) == (old_id, False)
    assert _pending_holders(observer, "reindex:1") == [old_id]


def test_a_repeatable_read_producer_behind_another_gets_a_serialization_failure(
    without_unique_indexes, make_store, observer
):
    """Its snapshot cannot see the job the other producer committed: it must not make a
    second one. PostgreSQL refuses the key's row to it instead, as it refused the unique
    index's conflict before."""
    first, second = make_store(), make_store()
    late = second.runner.connection
    for made_first in (False, True):  # the key's row new, then one that exists already
        key = f"rr:{made_first}"
        if made_first:
            first.enqueue(_coalesced(0, key=key))
            first.claim("w", ["default"], per_queue=5, lease_seconds=30)
        late.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        try:
            late.execute("SELECT 1").fetchone()  # the snapshot is taken
            made = first.enqueue(_coalesced(1, key=key))
            with pytest.raises(psycopg.errors.SerializationFailure):
                second.enqueue(_coalesced(2, key=key))
        finally:
            late.execute("ROLLBACK")
        assert _pending_holders(observer, key) == [made.id]


#: The previous release's producer: coalesced and idempotent enqueues on the same keys
#: as this release's, printing each outcome as JSON.
OLD_PRODUCER = """
import json, sys, time
import django
django.setup()
from django_pgqueue.models import Job
from django_pgqueue.store.values import JobSpec
store = Job.objects.store()
print("ready", flush=True)
sys.stdin.readline()  # go
out = []
started = time.time()
for round_ in range(int(sys.argv[1])):
    for key in range(int(sys.argv[2])):
        spec = JobSpec("tests.tasks.echo", args=["old", round_], coalesce_key=f"mix:{key}")
        made = store.enqueue(spec)
        out.append(["c", key, made.id, made.created])
        made = store.enqueue(JobSpec("tests.tasks.noop", idempotency_key=f"once:{round_}:{key}"))
        out.append(["i", f"once:{round_}:{key}", made.id, made.created])
print(json.dumps({"outcomes": out, "span": [started, time.time()]}))
"""


def test_old_and_new_producers_racing_on_the_same_keys_keep_one_job_per_key(
    db_url, make_store, observer
):
    """A rolling deploy: the previous release's producers (ON CONFLICT on the unique
    indexes) and this release's (the key tables) enqueue on the same keys at once, while
    a worker claims the holders; none fails, and each key keeps one job."""
    rounds, keys = 30, 4
    claimer = make_store()
    stop = threading.Event()

    def claim() -> None:
        while not stop.is_set():
            claimer.claim("w", ["default"], per_queue=2, lease_seconds=300)
            stop.wait(0.01)

    def produce(store) -> tuple[list[list[Any]], tuple[float, float]]:
        out: list[list[Any]] = []
        started = time.time()
        for round_ in range(rounds):
            for key in range(keys):
                made = store.enqueue(_coalesced("new", round_, key=f"mix:{key}"))
                out.append(["c", key, made.id, made.created])
                once = f"once:{round_}:{key}"
                made = store.enqueue(JobSpec("tests.tasks.noop", idempotency_key=once))
                out.append(["i", once, made.id, made.created])
        return out, (started, time.time())

    with tempfile.TemporaryDirectory(prefix="pgqueue-previous-") as old_tree:
        checkout(previous_release("0026_keys_outside_job_indexes"), Path(old_tree))
        old = python(db_url, Path(old_tree), OLD_PRODUCER, str(rounds), str(keys))
        assert old.stdout is not None
        assert old.stdin is not None
        assert old.stdout.readline().strip() == "ready", old.stderr
        stores = [make_store(), make_store()]
        with ThreadPoolExecutor(max_workers=3) as pool:
            claiming = pool.submit(claim)
            old.stdin.write("go\n")
            old.stdin.flush()
            new = [pool.submit(produce, store) for store in stores]
            try:
                stdout, stderr = old.communicate(timeout=90)
            finally:
                results = [future.result(timeout=90) for future in new]
                stop.set()
                claiming.result(timeout=30)
    assert old.returncode == 0, stderr
    printed = json.loads(stdout)
    # The releases really ran side by side.
    old_span = printed["span"]
    for _, (started, ended) in results:
        assert started < old_span[1], (old_span, started)
        assert old_span[0] < ended, (old_span, ended)
    outcomes = printed["outcomes"] + [row for rows, _ in results for row in rows]
    ids_by_key: dict[Any, set[int]] = {}
    for kind, key, job_id, _created in outcomes:
        ids_by_key.setdefault((kind, key), set()).add(job_id)
    # Idempotency: one job per key, made once, whoever enqueued it.
    for (kind, key), ids in ids_by_key.items():
        if kind == "i":
            assert len(ids) == 1, (key, ids)
    created = [row for row in outcomes if row[0] == "i" and row[3]]
    assert len(created) == rounds * keys
    # Coalescing: every job returned for a key held it, and at most one is pending.
    for key in range(keys):
        rows = dict(
            observer.execute(
                "SELECT id, coalesce_key FROM django_pgqueue_job_all WHERE id = ANY(%s)",
                [list(ids_by_key[("c", key)])],
            ).fetchall()
        )
        assert set(rows.values()) <= {f"mix:{key}", None}  # None: a retried one let go
        assert len(_pending_holders(observer, f"mix:{key}")) <= 1
        # The next enqueue of this release finds the holder, whoever made it.
        last = make_store().enqueue(_coalesced("last", key=f"mix:{key}"))
        assert _pending_holders(observer, f"mix:{key}") == [last.id]
        assert _named(observer, f"mix:{key}") == last.id
