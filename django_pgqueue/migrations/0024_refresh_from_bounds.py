"""Partitions are refreshed from the jobs that moved, not from their first job.

Every job a partition ran left entries in ``pgq_job_part_pending`` and
``pgq_job_part_processing``. VACUUM removes them soon enough while nothing holds it back,
but a long transaction's snapshot keeps them all, and the refresh function read a
partition's next and running jobs through every one of them: measured with
``pg_stat_statements`` (nested statements) on 1,000 partitions a minute into a held
snapshot, about 120 pages per lookup, two lookups per completion and per fold.

``django_pgqueue_refresh_partitions(keys text[], job_ids bigint[])`` takes, beside each
key, the job that moved: the one a completion, failure, release, snooze or the reaper
took out of processing, or the one a partition signal names (its new column ``job_id``:
the job a producer enqueued, an operator retried, ran now or cancelled). Under the row's
lock it then reads

* the next job from ``least(head_id, running_id, job ids)`` on, an index range of
  ``pgq_job_part_pending`` rather than the partition's first entry. A job below that
  bound was not pending when the row was last refreshed, and every statement that makes
  one pending since either refreshes the row itself or leaves a signal naming it;
* the running job by the row's ``running_id``: one primary-key probe. Only a claim
  starts a partitioned job, one at a time, through the row, and it writes the job into
  it; a row is deleted only once nothing runs. A row naming a job that is no longer
  running, and not among ``job_ids``, is read in full.

A key given with a NULL job id (a signal of an older release, or of the dependency
triggers) is read in full, as before. The claim still checks the job table for an older
job and a running one before it starts a job, so a row left behind delays a job and
never reorders one or runs two; the repair sweep still compares rows with the job table
(jobs an older release wrote, rows changed by hand).

``django_pgqueue_fold_partitions(keys text[], job_ids bigint[])`` (lazy signals) now
knows which job each signal is for: it skips a partition only when every job signalled
is behind the row's next job. The old rule assumed so, and was wrong when a producer's
transaction committed after a newer job of the partition had started: the partition
then waited for the repair sweep.

``django_pgqueue_enqueue`` and the trigger function ``django_pgqueue_signal_partition``
write the signal's ``job_id``.

Adding the column takes the signal table's lock for a moment (no rewrite); it is waited
for at most five seconds, past which the migration fails, changes nothing, and can be
run again. The one-argument functions do not change: workers of the previous release
keep calling them, and their signals (no ``job_id``) are read in full. This release's
statements call the new functions: run the migration before starting its workers.
"""

from importlib import import_module

from django.db import migrations, models

_partition_state = import_module("django_pgqueue.migrations.0004_partition_state")
_newest = import_module("django_pgqueue.migrations.0023_newest_version_first")
_rewrite = import_module("django_pgqueue.migrations.0022_refresh_by_row")._rewrite

LOCK_TIMEOUT = "SET LOCAL lock_timeout = '5s'"

REFRESH_FROM_BOUNDS = """
CREATE OR REPLACE FUNCTION django_pgqueue_refresh_partitions(keys text[], job_ids bigint[])
RETURNS integer
LANGUAGE plpgsql
VOLATILE
AS $function$
DECLARE
    wanted record;
    current record;
    bound bigint;
    head record;
    head_is_blocked boolean;
    running bigint;
    still_running boolean;
    refreshed integer := 0;
BEGIN
    -- Key order: every caller locks partition rows in the same order. keys[i] goes with
    -- job_ids[i]; a NULL job id (or a missing one) means "read the partition in full".
    FOR wanted IN
        SELECT given.key, min(given.job_id) AS since, bool_or(given.job_id IS NULL) AS unknown,
            array_agg(given.job_id) AS moved
        FROM unnest(keys, job_ids) AS given (key, job_id)
        WHERE given.key IS NOT NULL
        GROUP BY given.key
        ORDER BY given.key
    LOOP
        -- Lock the row, newest version first (migration 0023), creating it if missing;
        -- the writes below go to the version locked, by its ctid (migration 0022).
        LOOP
            SELECT part.ctid AS locked, part.head_id, part.running_id
            INTO current
            FROM django_pgqueue_partition AS part
            WHERE part.partition_key >= wanted.key AND part.partition_key <= wanted.key
            ORDER BY part.partition_key DESC
            LIMIT 1
            FOR UPDATE;
            EXIT WHEN FOUND;
            INSERT INTO django_pgqueue_partition (partition_key, refreshed_at)
            VALUES (wanted.key, now())
            ON CONFLICT (partition_key) DO NOTHING;
        END LOOP;
        -- New statements, new snapshots: everything committed before the lock is seen.
        -- The next job: the oldest that has not started, pending or waiting for its
        -- dependencies (a blocked job keeps its turn). pgq_job_part_pending, from the
        -- bound on (no bound: from the partition's first entry).
        bound := CASE
            WHEN NOT wanted.unknown THEN least(current.head_id, current.running_id, wanted.since)
        END;
        SELECT job.id, job.queue, job.priority, job.available_at, job.partition_bucket,
            job.status
        INTO head
        FROM django_pgqueue_job AS job
        WHERE job.partition_key = wanted.key
          AND job.status IN ('pending', 'blocked')
          AND job.id >= COALESCE(bound, -9223372036854775807 - 1)
        ORDER BY job.id
        LIMIT 1;
        head_is_blocked := head.id IS NOT NULL AND head.status = 'blocked';
        -- The running job: the one the row names, if it still runs (by primary key);
        -- none if it has just moved; else pgq_job_part_processing.
        running := NULL;
        IF wanted.unknown THEN
            still_running := NULL;
        ELSIF current.running_id IS NULL THEN
            -- Also a row created here: a row is deleted only once nothing runs, and a
            -- job starts only through its row.
            still_running := false;
        ELSE
            SELECT job.status = 'processing' AND job.partition_key = wanted.key
            INTO still_running
            FROM django_pgqueue_job AS job
            WHERE job.id = current.running_id;
            IF still_running THEN
                running := current.running_id;
            ELSIF current.running_id = ANY (wanted.moved) THEN
                still_running := false;
            ELSE
                still_running := NULL;
            END IF;
        END IF;
        IF still_running IS NULL THEN
            SELECT job.id INTO running
            FROM django_pgqueue_job AS job
            WHERE job.partition_key = wanted.key
              AND job.status = 'processing'
            LIMIT 1;
        END IF;
        IF head.id IS NULL AND running IS NULL THEN
            DELETE FROM django_pgqueue_partition WHERE ctid = current.locked;
        ELSE
            UPDATE django_pgqueue_partition
            SET queue = COALESCE(head.queue, queue),
                partition_bucket = COALESCE(head.partition_bucket, partition_bucket),
                head_id = head.id,
                head_priority = head.priority,
                head_available_at = head.available_at,
                head_blocked = head_is_blocked,
                -- A next job scheduled later: out of the claim index until then.
                wake_at = CASE
                    WHEN NOT head_is_blocked AND head.available_at > now() THEN head.available_at
                END,
                running_id = running,
                refreshed_at = now()
            WHERE ctid = current.locked;
        END IF;
        refreshed := refreshed + 1;
    END LOOP;
    RETURN refreshed;
END
$function$;
COMMENT ON FUNCTION django_pgqueue_refresh_partitions(text[], bigint[]) IS
    'django-pgqueue: refresh the given partitions from the jobs that moved (migration 0024)';
"""

FOLD_FROM_BOUNDS = """
CREATE OR REPLACE FUNCTION django_pgqueue_fold_partitions(keys text[], job_ids bigint[])
RETURNS integer
LANGUAGE plpgsql
VOLATILE
AS $function$
DECLARE
    wanted record;
    current record;
    stale_keys text[] := '{}';
    stale_ids bigint[] := '{}';
BEGIN
    FOR wanted IN
        SELECT given.key, min(given.job_id) AS since, bool_or(given.job_id IS NULL) AS unknown,
            array_agg(given.job_id) AS signalled
        FROM unnest(keys, job_ids) AS given (key, job_id)
        WHERE given.key IS NOT NULL
        GROUP BY given.key
        ORDER BY given.key
    LOOP
        -- Every row locked here, in key order, even one that is up to date (a missing
        -- one created first): the refresh below then waits on none.
        LOOP
            SELECT part.head_id, part.running_id
            INTO current
            FROM django_pgqueue_partition AS part
            -- Newest version first (migration 0023).
            WHERE part.partition_key >= wanted.key AND part.partition_key <= wanted.key
            ORDER BY part.partition_key DESC
            LIMIT 1
            FOR UPDATE;
            EXIT WHEN FOUND;
            INSERT INTO django_pgqueue_partition (partition_key, refreshed_at)
            VALUES (wanted.key, now())
            ON CONFLICT (partition_key) DO NOTHING;
        END LOOP;
        -- Up to date when the row names a next job (a claim leaves head_id on the job it
        -- started: only another one is a next job) and every job signalled is behind it.
        IF current.head_id IS NULL
            OR current.head_id IS NOT DISTINCT FROM current.running_id
            OR wanted.unknown
            OR wanted.since <= current.head_id
        THEN
            stale_keys := stale_keys || array_fill(wanted.key, ARRAY[cardinality(wanted.signalled)]);
            stale_ids := stale_ids || wanted.signalled;
        END IF;
    END LOOP;
    RETURN django_pgqueue_refresh_partitions(stale_keys, stale_ids);
END
$function$;
COMMENT ON FUNCTION django_pgqueue_fold_partitions(text[], bigint[]) IS
    'django-pgqueue: fold lazy partition signals (refresh the partitions that need it)';
"""

# The trigger function of migration 0004 (its CREATE TRIGGER stays as it is).
_SIGNAL_FUNCTION = _partition_state.SIGNAL_TRIGGER.split("CREATE TRIGGER", 1)[0]
SIGNAL_FUNCTION = _rewrite(
    _SIGNAL_FUNCTION,
    [
        (
            "    INSERT INTO django_pgqueue_partition_signal (partition_key) VALUES (NEW.partition_key);\n",
            "    INSERT INTO django_pgqueue_partition_signal (partition_key, job_id)\n"
            "    VALUES (NEW.partition_key, NEW.id);\n",
        )
    ],
)

ENQUEUE_FUNCTION = _rewrite(
    _newest.ENQUEUE_FUNCTION,
    [
        (
            """        INSERT INTO django_pgqueue_partition_signal (partition_key, urgent)
        VALUES (django_pgqueue_enqueue.partition_key, urgent);
""",
            """        INSERT INTO django_pgqueue_partition_signal (partition_key, urgent, job_id)
        VALUES (django_pgqueue_enqueue.partition_key, urgent, new_id);
""",
        )
    ],
)


class Migration(migrations.Migration):
    dependencies = [("django_pgqueue", "0023_newest_version_first")]

    operations = [
        migrations.RunSQL(sql=LOCK_TIMEOUT, reverse_sql=migrations.RunSQL.noop),
        migrations.AddField(
            model_name="partitionsignal",
            name="job_id",
            field=models.BigIntegerField(
                blank=True,
                db_comment="The oldest job signalled: the fold reads the partition's jobs "
                "from there. NULL: from the first (a signal of an older release, or a "
                "trigger).",
                null=True,
                verbose_name="job",
            ),
        ),
        migrations.RunSQL(
            sql=REFRESH_FROM_BOUNDS + FOLD_FROM_BOUNDS + SIGNAL_FUNCTION + ENQUEUE_FUNCTION,
            reverse_sql=(
                "DROP FUNCTION IF EXISTS django_pgqueue_refresh_partitions(text[], bigint[]);"
                "DROP FUNCTION IF EXISTS django_pgqueue_fold_partitions(text[], bigint[]);"
                + _SIGNAL_FUNCTION
                + _newest.ENQUEUE_FUNCTION
            ),
        ),
    ]
