"""The bookkeeping path never waits on a row lock held by a handler's transaction.

An ``atomic=True`` task that records its step holds its job's row lock until its
transaction ends. Nothing else of the worker may queue behind that lock: not the lease
extension of its other jobs, not their outcome writes, not their step writes, not the
heartbeat of another worker that took over one of its leases. And what the worker logs
and counts for the atomic job is what the database recorded.

Lock waits are sampled from ``pg_stat_activity`` (see :mod:`tests.lockwatch`).
"""

from __future__ import annotations

import signal

import psycopg
import pytest
from django.db import connection, transaction
from psycopg import sql

from django_pgqueue.models import Job
from django_pgqueue.states import JobStatus
from django_pgqueue.store.values import JobSpec
from tests import ledger
from tests.lockwatch import LockWatch
from tests.workers import wait_for

pytestmark = pytest.mark.timeout(150)

RECOVERY = {"HOUSEKEEPING_INTERVAL_SECONDS": 0.2, "RETRY_BASE_SECONDS": 0.05, "RETRY_JITTER": 0}
LEASE = ("--lease-seconds", "2", "--poll-interval", "0.1")
FINISHED = (JobStatus.SUCCEEDED, JobStatus.DEAD_LETTER, JobStatus.CANCELLED)
#: Longest tolerated lock wait of a bookkeeping statement (sampling is every 50 ms).
MAX_LOCK_WAIT = 0.5


def _entry(observer, job_id: int, event: str) -> dict | None:
    found = [e for e in ledger.entries(observer, job_id) if e["event"] == event]
    return found[-1] if found else None


def _wait_finished(job_ids: list[int], timeout: float = 90, watch: LockWatch | None = None) -> None:
    """Wait until every job finished; on timeout, say where each job stands (and the lock
    waits seen so far)."""
    try:
        wait_for(
            lambda: Job.objects.filter(pk__in=job_ids, status__in=FINISHED).count() == len(job_ids),
            timeout=timeout,
            message=f"jobs {job_ids} to finish",
        )
    except AssertionError as error:
        rows = Job.objects.filter(pk__in=job_ids).values_list(
            "pk", "status", "attempts", "lease_generation", "claimed_by", "errors"
        )
        waits = f"\n{watch.report()}" if watch is not None else ""
        raise AssertionError(f"{error}\n" + "\n".join(map(str, rows)) + waits) from None


def test_an_open_atomic_step_transaction_delays_none_of_the_workers_other_jobs(
    workers, observer, db_url
):
    plain = JobSpec("tests.tasks.ledger_plain_step", kwargs={"before": 1.0, "after": 2.0})
    # The atomic job is claimed first (priority) but sits between plain jobs in id order:
    # a statement locking the worker's rows in id order meets it half-way.
    atomic = JobSpec(
        "tests.tasks.ledger_atomic_step_hold", kwargs={"hold_seconds": 6.0}, priority=10
    )
    ids = [job.pk for job in Job.objects.enqueue_many([plain] * 3 + [atomic] + [plain] * 3)]
    atomic_id = ids.pop(3)
    with LockWatch(db_url) as watch:
        worker = workers("--concurrency", "4", *LEASE, settings=RECOVERY)
        _wait_finished([atomic_id, *ids], watch=watch)
    assert not watch.errors, watch.errors
    output = worker.output()
    problems = []
    atomic_job = Job.objects.get(pk=atomic_id)
    if atomic_job.status != JobStatus.SUCCEEDED or atomic_job.attempts != 1:
        problems.append(f"atomic job: {atomic_job.status} after {atomic_job.attempts} attempts")
    for job_id in ids:
        job = Job.objects.get(pk=job_id)
        expired = [e for e in job.errors if e["exception_class"].endswith("LeaseExpired")]
        if job.status != JobStatus.SUCCEEDED or job.attempts != 1 or expired:
            problems.append(
                f"job {job_id}: {job.status} after {job.attempts} attempts, "
                f"{len(expired)} lost leases"
            )
            continue
        returned = _entry(observer, job_id, "return")
        step = _entry(observer, job_id, "step")
        late = (job.finished_at - returned["at"]).total_seconds()
        if late > 1.0:
            problems.append(f"job {job_id}: recorded {late:.2f}s after its handler returned")
        if float(step["label"]) > 1.0:
            problems.append(f"job {job_id}: set_step() took {step['label']}s")
    if "lease lost" in output:
        problems.append(f"{output.count('lease lost')} 'lease lost' lines in the worker log")
    longest = watch.longest()
    if longest is not None and longest.seconds > MAX_LOCK_WAIT:
        problems.append(f"bookkeeping waited on a lock:\n{watch.report()}")
    assert not problems, "\n".join(problems)


def test_a_worker_that_took_over_a_lease_never_waits_on_the_first_workers_heartbeat(
    workers, observer, db_url
):
    # In id order: an atomic job (5 s), a plain job the second worker takes over, an
    # atomic job (10 s). All three run on the first worker, which serves only "default".
    # The second worker serves only "reports", where the plain job moves as its lease runs
    # out: once the first atomic job ends, the first worker has a free slot and must not
    # win the job back.
    specs = [
        JobSpec("tests.tasks.ledger_atomic_step_hold", kwargs={"hold_seconds": 5.0}),
        JobSpec("tests.tasks.ledger_sleep", kwargs={"seconds": 8.0}),
        JobSpec("tests.tasks.ledger_atomic_step_hold", kwargs={"hold_seconds": 10.0}),
    ]
    first_atomic, taken_over, second_atomic = (job.pk for job in Job.objects.enqueue_many(specs))
    with LockWatch(db_url) as watch:
        first = workers(
            "--concurrency",
            "3",
            "--queue",
            "default",
            *LEASE,
            "--no-housekeeping",
            settings=RECOVERY,
        )
        wait_for(
            lambda: all(
                _entry(observer, job_id, event)
                for job_id, event in (
                    (first_atomic, "step-set"),
                    (taken_over, "start"),
                    (second_atomic, "step-set"),
                )
            ),
            timeout=30,
            message="the first worker to run all three jobs",
        )
        # Without housekeeping of its own: the test's reap below is the one recovery (the
        # worker's reaper would race it for the expired lease).
        second = workers(
            "--concurrency",
            "2",
            "--queue",
            "reports",
            *LEASE,
            "--no-housekeeping",
            settings=RECOVERY,
        )
        second_id = second.wait_registered(observer)
        # The plain job's lease runs out (as when the first worker is cut off) and it is
        # recovered; the second worker takes it over. One transaction: the first worker's
        # heartbeat renews a lease that expired but was not reaped yet, and skips the row
        # while it is locked here.
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(
                "UPDATE django_pgqueue_job SET lease_expires_at = now() - interval '1 second', "
                "queue = 'reports' WHERE id = %s",
                [taken_over],
            )
            assert [job.job_id for job in Job.objects.reap_expired()] == [taken_over]
        wait_for(
            lambda: Job.objects.get(pk=taken_over).claimed_by == second_id,
            timeout=30,
            message="the second worker to take the job over",
        )
        _wait_finished([first_atomic, taken_over, second_atomic], watch=watch)
    assert not watch.errors, watch.errors
    heartbeat = f"pgqueue heartbeat {second_id}"[:63]
    waited = watch.longest(lambda wait: wait.application_name == heartbeat)
    assert waited is None or waited.seconds <= MAX_LOCK_WAIT, (
        f"the second worker's heartbeat waited {waited.seconds:.2f}s on a lock\n{watch.report()}"
    )
    longest = watch.longest()
    assert longest is None or longest.seconds <= MAX_LOCK_WAIT, watch.report()
    job = Job.objects.get(pk=taken_over)
    assert job.status == JobStatus.SUCCEEDED
    assert job.result["pid"] == second.pid
    for job_id in (first_atomic, second_atomic):
        assert Job.objects.get(pk=job_id).status == JobStatus.SUCCEEDED
    assert first.process.poll() is None


def test_an_atomic_job_committing_while_the_heartbeat_meets_its_row_is_counted_succeeded(
    workers, observer
):
    # The heartbeat waits on (or, once fixed, skips) the row the step write locked; the
    # transaction commits; a slow task_finished receiver delays the outcome a second.
    spec = JobSpec(
        "tests.tasks.ledger_atomic_step_hold",
        kwargs={"hold_seconds": 3.0, "linger_after_return": 1.0},
    )
    job_id = Job.objects.enqueue_many([spec])[0].pk
    # -v 2: the per-job lines say how the attempt ended.
    worker = workers(*LEASE, settings=RECOVERY, verbosity=2)
    _wait_finished([job_id])
    assert Job.objects.get(pk=job_id).status == JobStatus.SUCCEEDED

    def logged() -> str | None:
        for line in worker.output().splitlines():
            if f"job {job_id} " in line and "started" not in line:
                return line
        return None

    line = wait_for(logged, timeout=10, message="the worker to log the outcome")
    assert f"job {job_id} succeeded" in line, worker.output()
    assert f"job {job_id}: lease lost" not in worker.output()
    # The per-minute counters the heartbeat writes agree with the database.
    wait_for(
        lambda: (
            observer.execute(
                "SELECT coalesce(sum(succeeded), 0) FROM django_pgqueue_queuestat "
                "WHERE queue = 'default'"
            ).fetchone()[0]
            == 1
        ),
        timeout=10,
        message=f"the succeeded job to be counted\n{worker.output()}",
    )


#: Rows finished before migration 0020 (the upgrade left them in the job table) are the
#: only finished rows housekeeping deletes from it, in ``prune_finished`` batches.
_OLD_FINISHED = {
    "status": "'succeeded'",
    "attempts": "1",
    "started_at": "now() - interval '1 day'",
    "finished_at": "now() - interval '1 day'",
}
#: ``prune_finished`` as ``pg_stat_activity`` shows it (its ``doomed`` rows, no dead letters).
_PRUNING = (
    "SELECT count(*) FROM pg_stat_activity "
    "WHERE datname = current_database() AND state = 'active' "
    "AND application_name LIKE 'pgqueue housekeeping%%' "
    "AND query ILIKE '%%delete from django_pgqueue_job as job%%' "
    "AND query ILIKE '%%doomed%%' AND query NOT ILIKE '%%dead_letter%%'"
)


def _seed_old_succeeded_jobs(observer, count: int) -> None:
    """Insert ``count`` jobs that succeeded a day ago into the job table, as the previous
    release left them there, for ``prune_finished`` to delete.

    Finishing a job by UPDATE would move it to the history (the to-history trigger), so
    the rows are inserted finished, copied from a pending job that is then deleted.
    """
    seed = Job.objects.enqueue("tests.tasks.noop").pk
    names = [
        name
        for (name,) in observer.execute(
            "SELECT column_name FROM information_schema.columns "
            "WHERE table_schema = current_schema() AND table_name = 'django_pgqueue_job' "
            "AND column_name <> 'id' ORDER BY ordinal_position"
        ).fetchall()
    ]
    values = [
        sql.SQL(_OLD_FINISHED[name]) if name in _OLD_FINISHED else sql.Identifier(name)
        for name in names
    ]
    observer.execute(
        sql.SQL(
            "INSERT INTO django_pgqueue_job ({columns}) SELECT {values} "
            "FROM django_pgqueue_job, generate_series(1, %s) WHERE id = %s"
        ).format(
            columns=sql.SQL(", ").join(map(sql.Identifier, names)),
            values=sql.SQL(", ").join(values),
        ),
        [count, seed],
    )
    observer.execute("DELETE FROM django_pgqueue_job WHERE id = %s", [seed])
    assert _old_succeeded_in_job_table(observer) == count


def _old_succeeded_in_job_table(observer) -> int:
    return observer.execute(
        "SELECT count(*) FROM django_pgqueue_job "
        "WHERE status = 'succeeded' AND finished_at < now() - interval '1 hour'"
    ).fetchone()[0]


def _reaped_and_unlocked(observer, job_id: int) -> bool:
    """Whether the job's reap is committed and nobody holds its row lock right now."""
    try:
        with observer.transaction():
            row = observer.execute(
                "SELECT status FROM django_pgqueue_job WHERE id = %s FOR UPDATE NOWAIT", [job_id]
            ).fetchone()
    except psycopg.errors.LockNotAvailable:
        return False
    return row is not None and row[0] != JobStatus.PROCESSING


def test_a_housekeeping_pass_keeps_no_reaped_row_locked_while_it_prunes(workers, observer, db_url):
    _seed_old_succeeded_jobs(observer, 500_000)
    job_id = Job.objects.enqueue("tests.tasks.ledger_sleep", kwargs={"seconds": 15}).pk
    first = workers(*LEASE, "--no-housekeeping", settings=RECOVERY)
    first_id = first.wait_registered(observer)
    wait_for(lambda: _entry(observer, job_id, "start"), timeout=30, message="the job to start")
    first.send(signal.SIGSTOP)
    try:
        wait_for(
            lambda: observer.execute(
                "SELECT lease_expires_at < now() FROM django_pgqueue_job WHERE id = %s", [job_id]
            ).fetchone()[0],
            timeout=10,
            message="the paused worker's lease to expire",
        )
        with LockWatch(db_url) as watch:
            # Its first pass reaps the expired lease, then prunes 500,000 old jobs. It
            # serves another queue, so nothing but the reap and the prune touches the job.
            workers(
                *LEASE,
                "--queue",
                "reports",
                settings={
                    **RECOVERY,
                    "RETENTION_SECONDS": 3600,
                    "PRUNE_BATCH_SIZE": 1_000_000,
                    "HOUSEKEEPING_INTERVAL_SECONDS": 0.05,
                },
            )
            wait_for(
                lambda: observer.execute(_PRUNING).fetchone()[0],
                timeout=30,
                interval=0.01,
                message="the housekeeping pass to prune",
            )
            # While the prune runs, the reap is committed and its row free to lock.
            free = _reaped_and_unlocked(observer, job_id)
            pruning = observer.execute(_PRUNING).fetchone()[0]
            assert free or not pruning, "the reaped job's row is locked while the pass prunes"
            first.send(signal.SIGCONT)
            # The first worker's heartbeat extends the reaped lease (and learns it is lost).
            wait_for(
                lambda: f"job {job_id}: lease lost" in first.output(),
                timeout=30,
                message="the first worker to learn its lease is gone",
            )
    finally:
        first.send(signal.SIGCONT)
    wait_for(
        lambda: _old_succeeded_in_job_table(observer) == 0,
        timeout=60,
        message="the housekeeping pass to prune every old job",
    )
    assert not watch.errors, watch.errors
    heartbeat = f"pgqueue heartbeat {first_id}"[:63]
    waited = watch.longest(lambda wait: wait.application_name == heartbeat)
    assert waited is None or waited.seconds <= MAX_LOCK_WAIT, (
        f"the heartbeat waited {waited.seconds:.2f}s behind a housekeeping pass\n{watch.report()}"
    )
