"""The lazy fold refreshes a key whose row a late job signalled sorts before.

A producer leaves a lazy concurrency signal when the key's row already names a ready
next job of the same priority or higher. If the producer's transaction commits after
that job started, the refresh that followed could not see the new job, and named a
lower-priority one instead. The fold skipped every row naming a ready job, so the key
kept competing with the claim at that lower priority: a claim reads the keys of a queue
in the order of the next job their rows name (``pgq_concurrency_claim``, at most its
per-queue limit of them), and the new job waited behind other keys' lower-priority jobs
until its key was taken from or refreshed again.

Concurrency signals now name their job, as partition signals do since 0024: the new
column ``job_id`` holds the job a producer enqueued (of a bulk enqueue, the key's best
ready one in claim order). ``django_pgqueue_fold_concurrency(keys text[], job_ids
bigint[], channel text)`` refreshes a key under its limit whose row names no ready job,
or one that a ready job signalled sorts before in claim order (a primary-key probe per
signal). A signal naming no job (of an older release, or a bulk enqueue whose new jobs
are none ready) makes it look for the key's best ready job in claim order instead
(``pgq_job_conc_pending``) and compare. A key at its limit is still skipped: the
completion that frees a slot refreshes it. The two-argument function, which workers of
the previous release call, now does the same for signals naming no job.

Adding the column takes the signal table's lock for a moment (no rewrite); it is waited
for at most five seconds, past which the migration fails, changes nothing, and can be run
again. ``django_pgqueue_enqueue`` writes the column. This release's statements call the
new function and write the column: run the migration before starting its workers.
"""

from importlib import import_module

from django.db import migrations, models

_rewrite = import_module("django_pgqueue.migrations.0022_refresh_by_row")._rewrite
_newest = import_module("django_pgqueue.migrations.0023_newest_version_first")
_bounds = import_module("django_pgqueue.migrations.0024_refresh_from_bounds")

LOCK_TIMEOUT = "SET LOCAL lock_timeout = '5s'"

_START = "CREATE OR REPLACE FUNCTION django_pgqueue_fold_concurrency"

#: The two-argument fold as migration 0023 left it (the partitions' one-argument fold,
#: defined in the same text, does not change).
PREVIOUS_FOLD = _newest.FOLD_FUNCTIONS[_newest.FOLD_FUNCTIONS.index(_START) :]

FOLD_BY_JOB = """
CREATE OR REPLACE FUNCTION django_pgqueue_fold_concurrency(
    keys text[], job_ids bigint[], channel text
)
RETURNS integer
LANGUAGE plpgsql
VOLATILE
AS $function$
DECLARE
    wanted record;
    current record;
    stale text[] := '{}';
BEGIN
    -- keys[i] goes with job_ids[i]; a NULL job id (or a missing one) means "look the
    -- key's best ready job up".
    FOR wanted IN
        SELECT given.key, bool_or(given.job_id IS NULL) AS unknown,
            array_agg(given.job_id) AS signalled
        FROM unnest(keys, job_ids) AS given (key, job_id)
        WHERE given.key IS NOT NULL
        GROUP BY given.key
        ORDER BY given.key
    LOOP
        -- Every row locked (a missing one created) in key order first (migration 0021),
        -- newest version first (0023).
        LOOP
            SELECT conc.in_flight, conc.max_in_flight, conc.head_id, conc.head_priority,
                conc.head_available_at
            INTO current
            FROM django_pgqueue_concurrency AS conc
            WHERE conc.concurrency_key >= wanted.key AND conc.concurrency_key <= wanted.key
            ORDER BY conc.concurrency_key DESC
            LIMIT 1
            FOR UPDATE;
            EXIT WHEN FOUND;
            INSERT INTO django_pgqueue_concurrency (concurrency_key, refreshed_at)
            VALUES (wanted.key, now())
            ON CONFLICT (concurrency_key) DO NOTHING;
        END LOOP;
        -- New statements, new snapshots: every job committed before the lock is seen.
        IF current.in_flight >= current.max_in_flight THEN
            -- At its limit: the completion that frees a slot refreshes the key.
            CONTINUE;
        END IF;
        IF current.head_id IS NULL OR current.head_available_at > now() THEN
            stale := stale || wanted.key;
        ELSIF wanted.unknown THEN
            -- pgq_job_conc_pending, in claim order, as the refresh reads it.
            IF (
                SELECT job.id
                FROM django_pgqueue_job AS job
                WHERE job.concurrency_key = wanted.key
                  AND job.status = 'pending'
                  AND COALESCE(job.available_at, now()) <= now()
                ORDER BY job.priority DESC, job.available_at, job.id
                LIMIT 1
            ) IS DISTINCT FROM current.head_id THEN
                stale := stale || wanted.key;
            END IF;
        ELSIF EXISTS (
            -- By primary key: a ready job signalled that sorts before the row's. (IS NOT
            -- DISTINCT FROM: no index can serve it, so the plan cannot walk the key's
            -- entries in pgq_job_conc_pending, every one a held snapshot keeps.)
            SELECT 1
            FROM django_pgqueue_job AS job
            WHERE job.id = ANY (wanted.signalled)
              AND job.concurrency_key IS NOT DISTINCT FROM wanted.key
              AND job.status = 'pending'
              AND COALESCE(job.available_at, now()) <= now()
              AND (
                  job.priority > current.head_priority
                  OR (
                      job.priority = current.head_priority
                      AND (job.available_at, job.id)
                          < (current.head_available_at, current.head_id)
                  )
              )
        ) THEN
            stale := stale || wanted.key;
        END IF;
    END LOOP;
    RETURN django_pgqueue_refresh_concurrency(stale, channel);
END
$function$;
COMMENT ON FUNCTION django_pgqueue_fold_concurrency(text[], bigint[], text) IS
    'django-pgqueue: fold lazy concurrency signals (refresh the keys that need it, 0025)';

CREATE OR REPLACE FUNCTION django_pgqueue_fold_concurrency(keys text[], channel text)
RETURNS integer
LANGUAGE sql
VOLATILE
AS $function$
    -- Signals of the previous release's workers name no job.
    SELECT django_pgqueue_fold_concurrency(keys, '{}'::bigint[], channel)
$function$;
COMMENT ON FUNCTION django_pgqueue_fold_concurrency(text[], text) IS
    'django-pgqueue: fold lazy concurrency signals (refresh the keys that need it)';
"""

ENQUEUE_FUNCTION = _rewrite(
    _bounds.ENQUEUE_FUNCTION,
    [
        (
            """        INSERT INTO django_pgqueue_concurrency_signal (concurrency_key, urgent)
        VALUES (key_name, urgent);
""",
            """        INSERT INTO django_pgqueue_concurrency_signal (concurrency_key, urgent, job_id)
        VALUES (key_name, urgent, new_id);
""",
        )
    ],
)


class Migration(migrations.Migration):
    dependencies = [("django_pgqueue", "0024_refresh_from_bounds")]

    operations = [
        migrations.RunSQL(sql=LOCK_TIMEOUT, reverse_sql=migrations.RunSQL.noop),
        migrations.AddField(
            model_name="concurrencysignal",
            name="job_id",
            field=models.BigIntegerField(
                blank=True,
                db_comment="The job enqueued (of a bulk enqueue, the key's best ready one): "
                "the lazy fold compares it with the row's next job. NULL: the fold asks the "
                "job table.",
                null=True,
                verbose_name="job",
            ),
        ),
        migrations.RunSQL(
            sql=FOLD_BY_JOB + ENQUEUE_FUNCTION,
            reverse_sql=(
                "DROP FUNCTION IF EXISTS "
                "django_pgqueue_fold_concurrency(text[], bigint[], text);"
                + PREVIOUS_FOLD
                + _bounds.ENQUEUE_FUNCTION
            ),
        ),
    ]
