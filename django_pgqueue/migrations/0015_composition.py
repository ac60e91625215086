"""Features that compose: cancels keep their slot, flow state that costs a claim nothing.

What changes, and why (docs/explanation/guarantees.md, "Across features"):

* ``job.cancel_requested_at``: cancelling a running job no longer finishes it at once.
  The job stays ``processing`` (its lease, partition turn and concurrency slot stay
  taken) until its handler returns and the worker records the outcome, which the outcome
  statements turn into ``cancelled``; or until its lease expires (the worker died), when
  the reaper does. Nothing can start a second attempt beside the running one.
* ``wake_at`` on the partition and concurrency-key rows: a partition or key is in its
  claim index (``pgq_partition_claim``, ``pgq_concurrency_claim``) only while one of its
  jobs can start now. A key out of rate tokens, or whose next job is scheduled, leaves
  it until ``wake_at`` (a small index of its own, ``pgq_*_wake``): the claim no longer
  walks a hundred thousand throttled keys to find none.
* ``partition.head_blocked``: a job waiting for its dependencies (``blocked``) keeps its
  place at the head of its partition; the partition waits for it as for a running job.
  ``pgq_job_part_pending`` now holds the blocked jobs of partitions too, so one probe
  answers "the oldest job not started yet".
* ``urgent`` on the signal tables: producers mark a signal lazy when the key or
  partition already has a row naming a next job (the new job can only be found again by
  the statements that move that row), so the claim folds only the signals that can let
  a job start, and housekeeping folds the rest. Old producers' signals default to urgent.
* Functions: the refresh functions learn blocked heads and wake times (same signatures,
  so workers of the previous release keep calling them);
  ``django_pgqueue_lock_dependents`` lets a statement that finishes many jobs lock all
  their dependents in one id order before the settling trigger runs (two completion
  batches sharing dependents used to deadlock); the lazy folds; the settling trigger
  signals the partition of a dependent it cancels.

Non-atomic: every index is built CONCURRENTLY; the claim indexes are rebuilt beside the
old ones under a new name, the old dropped CONCURRENTLY, the new renamed. Columns are
nullable or have constant defaults (catalog changes, no rewrite). Workers of the previous
release keep working: their statements read the same tables (the claim checks the rows
it reads), their signals are urgent, and their completions of a job whose cancel was
requested record it as they did before this release (see docs/howto/upgrading.md).
"""

from importlib import import_module

from django.contrib.postgres.operations import RemoveIndexConcurrently
from django.db import migrations, models

import django_pgqueue.schema

_0004 = import_module("django_pgqueue.migrations.0004_partition_state")
_0009 = import_module("django_pgqueue.migrations.0009_dependencies")
_0011 = import_module("django_pgqueue.migrations.0011_flow_limits")

# When a key's next job can start, if not now: the later of its next job's availability
# and the moment its token bucket holds one token again (tokens are counted as of
# tokens_at and refill at rate_limit per rate_period). Ten microseconds more, so that
# timestamps' microsecond rounding never puts the wake-up before the token it waits for
# (a wake-up that still finds too few tokens is simply set again: see wake_due).
KEY_WAKE_AT_FUNCTION = """
CREATE OR REPLACE FUNCTION django_pgqueue_key_wake_at(
    head_id bigint,
    head_available_at timestamptz,
    rate_limit integer,
    rate_period double precision,
    tokens double precision,
    tokens_at timestamptz
)
RETURNS timestamptz
LANGUAGE sql
STABLE
AS $function$
SELECT CASE
    WHEN head_id IS NULL THEN NULL
    WHEN GREATEST(
        head_available_at,
        CASE WHEN rate_limit IS NOT NULL AND tokens < 1 THEN
            tokens_at + make_interval(secs => (1 - tokens) * rate_period / rate_limit + 0.00001)
        END
    ) > now() THEN GREATEST(
        head_available_at,
        CASE WHEN rate_limit IS NOT NULL AND tokens < 1 THEN
            tokens_at + make_interval(secs => (1 - tokens) * rate_period / rate_limit + 0.00001)
        END
    )
END
$function$;
COMMENT ON FUNCTION django_pgqueue_key_wake_at(
    bigint, timestamptz, integer, double precision, double precision, timestamptz
) IS 'django-pgqueue: when a concurrency key''s next job can start, if it cannot now';
"""

REFRESH_PARTITIONS = """
CREATE OR REPLACE FUNCTION django_pgqueue_refresh_partitions(keys text[])
RETURNS integer
LANGUAGE plpgsql
VOLATILE
AS $function$
DECLARE
    partition text;
    head record;
    head_is_blocked boolean;
    running bigint;
    refreshed integer := 0;
BEGIN
    -- Key order: every caller locks partition rows in the same order.
    FOR partition IN
        SELECT DISTINCT wanted.key FROM unnest(keys) AS wanted (key)
        WHERE wanted.key IS NOT NULL
        ORDER BY 1
    LOOP
        -- Lock the row, creating it first if needed (a refresher may delete it meanwhile).
        LOOP
            INSERT INTO django_pgqueue_partition (partition_key, refreshed_at)
            VALUES (partition, now())
            ON CONFLICT (partition_key) DO NOTHING;
            PERFORM 1 FROM django_pgqueue_partition
            WHERE partition_key = partition
            FOR UPDATE;
            EXIT WHEN FOUND;
        END LOOP;
        -- New statements, new snapshots: everything committed before the lock is seen.
        -- pgq_job_part_pending: the next job is the oldest that has not started, pending
        -- or waiting for its dependencies (a blocked job keeps its turn).
        SELECT job.id, job.queue, job.priority, job.available_at, job.partition_bucket,
            job.status
        INTO head
        FROM django_pgqueue_job AS job
        WHERE job.partition_key = partition
          AND job.status IN ('pending', 'blocked')
        ORDER BY job.id
        LIMIT 1;
        head_is_blocked := head.id IS NOT NULL AND head.status = 'blocked';
        -- pgq_job_part_processing.
        SELECT job.id INTO running
        FROM django_pgqueue_job AS job
        WHERE job.partition_key = partition
          AND job.status = 'processing'
        LIMIT 1;
        IF head.id IS NULL AND running IS NULL THEN
            DELETE FROM django_pgqueue_partition WHERE partition_key = partition;
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
            WHERE partition_key = partition;
        END IF;
        refreshed := refreshed + 1;
    END LOOP;
    RETURN refreshed;
END
$function$;
COMMENT ON FUNCTION django_pgqueue_refresh_partitions(text[]) IS
    'django-pgqueue: recompute the claim state of the given partitions from the job table';
"""

REFRESH_CONCURRENCY = """
CREATE OR REPLACE FUNCTION django_pgqueue_refresh_concurrency(keys text[], channel text)
RETURNS integer
LANGUAGE plpgsql
VOLATILE
AS $function$
DECLARE
    key text;
    current record;
    head record;
    flying integer;
    limit_now integer;
    rate integer;
    period double precision;
    bucket double precision;
    bucket_at timestamptz;
    wake timestamptz;
    refreshed integer := 0;
BEGIN
    -- Key order: every caller locks concurrency rows in the same order (and after its
    -- partition rows, which django_pgqueue_refresh_partitions locks first).
    FOR key IN
        SELECT DISTINCT wanted.key FROM unnest(keys) AS wanted (key)
        WHERE wanted.key IS NOT NULL
        ORDER BY 1
    LOOP
        LOOP
            INSERT INTO django_pgqueue_concurrency (concurrency_key, refreshed_at)
            VALUES (key, now())
            ON CONFLICT (concurrency_key) DO NOTHING;
            SELECT conc.max_in_flight, conc.rate_limit, conc.rate_period, conc.tokens,
                conc.tokens_at
            INTO current
            FROM django_pgqueue_concurrency AS conc
            WHERE conc.concurrency_key = key
            FOR UPDATE;
            EXIT WHEN FOUND;
        END LOOP;
        -- New statements, new snapshots: everything committed before the lock is seen.
        -- pgq_job_conc_pending: the best ready job in claim order ...
        SELECT job.id, job.queue, job.priority, job.available_at, job.concurrency_limit,
            job.rate_limit, job.rate_period
        INTO head
        FROM django_pgqueue_job AS job
        WHERE job.concurrency_key = key
          AND job.status = 'pending'
          AND COALESCE(job.available_at, now()) <= now()
        ORDER BY job.priority DESC, job.available_at, job.id
        LIMIT 1;
        IF head.id IS NULL THEN
            -- ... else the one ready soonest (none is ready: the key waits for it).
            SELECT job.id, job.queue, job.priority, job.available_at, job.concurrency_limit,
                job.rate_limit, job.rate_period
            INTO head
            FROM django_pgqueue_job AS job
            WHERE job.concurrency_key = key
              AND job.status = 'pending'
            ORDER BY job.available_at, job.id
            LIMIT 1;
        END IF;
        -- pgq_job_conc_processing: live leases, never a counter kept by a worker. A job
        -- whose cancel was requested is still processing: it keeps its slot until its
        -- handler has returned.
        SELECT count(*) INTO flying
        FROM django_pgqueue_job AS job
        WHERE job.concurrency_key = key
          AND job.status = 'processing';
        IF head.id IS NULL AND flying = 0 THEN
            -- A rate-limited key keeps its row until its bucket is full again: a new row
            -- starts full, and deleting a half-empty bucket would hand out a new burst.
            DELETE FROM django_pgqueue_concurrency AS conc
            WHERE conc.concurrency_key = key
              AND (
                  conc.rate_limit IS NULL
                  OR conc.tokens + GREATEST(extract(epoch FROM now() - conc.tokens_at), 0)
                      * conc.rate_limit / conc.rate_period >= conc.rate_limit
              );
            UPDATE django_pgqueue_concurrency
            SET in_flight = 0, head_id = NULL, head_priority = NULL, head_available_at = NULL,
                wake_at = NULL, refreshed_at = now()
            WHERE concurrency_key = key;
        ELSE
            IF head.id IS NULL THEN
                limit_now := current.max_in_flight;
                rate := current.rate_limit;
                period := current.rate_period;
                bucket := current.tokens;
                bucket_at := current.tokens_at;
            ELSE
                -- No concurrency limit (a rate limit only): no bound on in flight.
                limit_now := GREATEST(COALESCE(head.concurrency_limit, 2147483647), 1);
                rate := head.rate_limit;
                period := head.rate_period;
                IF head.rate_limit IS NULL THEN
                    bucket := NULL;
                    bucket_at := NULL;
                ELSE
                    -- A new bucket starts full (one period's worth: the documented burst).
                    bucket := LEAST(COALESCE(current.tokens, head.rate_limit), head.rate_limit);
                    bucket_at := COALESCE(current.tokens_at, now());
                END IF;
            END IF;
            wake := django_pgqueue_key_wake_at(
                head.id, head.available_at, rate, period, bucket, bucket_at
            );
            UPDATE django_pgqueue_concurrency
            SET queue = COALESCE(head.queue, queue),
                max_in_flight = limit_now,
                rate_limit = rate,
                rate_period = period,
                tokens = bucket,
                tokens_at = bucket_at,
                in_flight = flying,
                head_id = head.id,
                head_priority = head.priority,
                head_available_at = head.available_at,
                wake_at = wake,
                refreshed_at = now()
            WHERE concurrency_key = key;
            -- A slot is free and the next job can start now: wake the queue's workers (at
            -- COMMIT), so a job waiting on the limit starts now, not at the next poll.
            IF channel IS NOT NULL AND head.id IS NOT NULL AND wake IS NULL
               AND flying < limit_now THEN
                PERFORM pg_notify(channel, head.queue);
            END IF;
        END IF;
        refreshed := refreshed + 1;
    END LOOP;
    RETURN refreshed;
END
$function$;
COMMENT ON FUNCTION django_pgqueue_refresh_concurrency(text[], text) IS
    'django-pgqueue: recompute the claim state of the given concurrency keys from the job table';
"""

# The lazy folds (housekeeping's fold_lazy_signals). A lazy signal was left by a producer
# that saw the partition or key already had a row naming a next job: the new job can
# only matter again through the statements that move that row, and each of those reads
# the job table afresh. So under the row's lock, a partition whose row still names a
# next job, or a key at its limit or with a ready next job, needs nothing; the rest (the
# row changed between the producer's look and its commit) are refreshed.
FOLD_FUNCTIONS = """
CREATE OR REPLACE FUNCTION django_pgqueue_fold_partitions(keys text[])
RETURNS integer
LANGUAGE plpgsql
VOLATILE
AS $function$
DECLARE
    partition text;
    stale text[] := '{}';
BEGIN
    FOR partition IN
        SELECT DISTINCT wanted.key FROM unnest(keys) AS wanted (key)
        WHERE wanted.key IS NOT NULL
        ORDER BY 1
    LOOP
        -- A claim leaves head_id on the job it started: only another one is a next job.
        PERFORM 1 FROM django_pgqueue_partition AS part
        WHERE part.partition_key = partition
          AND part.head_id IS NOT NULL
          AND part.head_id IS DISTINCT FROM part.running_id
        FOR UPDATE;
        IF NOT FOUND THEN
            stale := stale || partition;
        END IF;
    END LOOP;
    RETURN django_pgqueue_refresh_partitions(stale);
END
$function$;
COMMENT ON FUNCTION django_pgqueue_fold_partitions(text[]) IS
    'django-pgqueue: fold lazy partition signals (refresh the partitions that need it)';

CREATE OR REPLACE FUNCTION django_pgqueue_fold_concurrency(keys text[], channel text)
RETURNS integer
LANGUAGE plpgsql
VOLATILE
AS $function$
DECLARE
    key text;
    current record;
    stale text[] := '{}';
BEGIN
    FOR key IN
        SELECT DISTINCT wanted.key FROM unnest(keys) AS wanted (key)
        WHERE wanted.key IS NOT NULL
        ORDER BY 1
    LOOP
        SELECT conc.in_flight, conc.max_in_flight, conc.head_id, conc.head_available_at
        INTO current
        FROM django_pgqueue_concurrency AS conc
        WHERE conc.concurrency_key = key
        FOR UPDATE;
        IF NOT FOUND OR NOT (
            current.in_flight >= current.max_in_flight
            OR (current.head_id IS NOT NULL AND current.head_available_at <= now())
        ) THEN
            stale := stale || key;
        END IF;
    END LOOP;
    RETURN django_pgqueue_refresh_concurrency(stale, channel);
END
$function$;
COMMENT ON FUNCTION django_pgqueue_fold_concurrency(text[], text) IS
    'django-pgqueue: fold lazy concurrency signals (refresh the keys that need it)';
"""

# A statement that finishes many jobs locks all their blocked dependents here, in one id
# order, before any settling trigger runs: each trigger locks only its own job's
# dependents, so two batches sharing dependents, each locking in its own rows' order,
# could deadlock. ``finished`` settle their direct dependents; ``failing`` (ending
# dead-lettered or cancelled) also cancel, transitively through "cancel" edges, the
# blocked jobs after them, as the trigger will.
LOCK_DEPENDENTS = """
CREATE OR REPLACE FUNCTION django_pgqueue_lock_dependents(finished bigint[], failing bigint[])
RETURNS integer
LANGUAGE sql
VOLATILE
AS $function$
WITH RECURSIVE doomed (job_id) AS (
    SELECT dep.job_id
    FROM django_pgqueue_dependency AS dep
    JOIN django_pgqueue_job AS job ON job.id = dep.job_id
    WHERE dep.blocker_id = ANY (failing)
      AND dep.on_failure = 'cancel'
      AND job.status = 'blocked'
    UNION
    SELECT dep.job_id
    FROM doomed
    JOIN django_pgqueue_dependency AS dep ON dep.blocker_id = doomed.job_id
    JOIN django_pgqueue_job AS job ON job.id = dep.job_id
    WHERE dep.on_failure = 'cancel'
      AND job.status = 'blocked'
)
SELECT count(*)::integer
FROM (
    SELECT job.id
    FROM django_pgqueue_job AS job
    WHERE (
        job.id = ANY (ARRAY(
            SELECT dep.job_id FROM django_pgqueue_dependency AS dep
            WHERE dep.blocker_id = ANY (finished) OR dep.blocker_id = ANY (failing)
        ))
        OR job.id = ANY (ARRAY(SELECT doomed.job_id FROM doomed))
    )
      AND job.status = 'blocked'
    ORDER BY job.id
    FOR NO KEY UPDATE
) AS locked
$function$;
COMMENT ON FUNCTION django_pgqueue_lock_dependents(bigint[], bigint[]) IS
    'django-pgqueue: lock the blocked dependents of jobs a statement finishes, in id order';
"""

HELPERS_REVERSE = """
DROP FUNCTION IF EXISTS django_pgqueue_lock_dependents(bigint[], bigint[]);
DROP FUNCTION IF EXISTS django_pgqueue_key_wake_at(
    bigint, timestamptz, integer, double precision, double precision, timestamptz
);
"""
FOLD_FUNCTIONS_REVERSE = """
DROP FUNCTION IF EXISTS django_pgqueue_fold_partitions(text[]);
DROP FUNCTION IF EXISTS django_pgqueue_fold_concurrency(text[], text);
"""

# As in 0009, with two changes: a blocked dependent this cancels leaves a partition
# signal, since a blocked job holds its partition's turn and the partition must move on;
# and a partitioned or limited dependent made pending is announced on the flow channel.
# The function settles the dependents of a job that just finished, in the transaction
# that finished it (see 0009 for the whole story).
SETTLE_TRIGGER = """
CREATE OR REPLACE FUNCTION django_pgqueue_settle_dependents()
RETURNS trigger
LANGUAGE plpgsql
VOLATILE
AS $function$
DECLARE
    waiting bigint[];
    doomed_jobs bigint[];
    doomed_blockers bigint[];
    woken integer;
BEGIN
    IF NEW.awaited THEN
        PERFORM pg_notify('django_pgqueue_finished', NEW.id::text);
    END IF;
    IF NOT NEW.has_dependents THEN
        RETURN NULL;
    END IF;
    IF NEW.status IN ('dead_letter', 'cancelled') THEN
        -- Policy "cancel": every blocked job that (transitively, through "cancel" edges)
        -- runs after this one is cancelled here, in one statement, rather than by this
        -- trigger firing again level by level: a chain of any length cannot exhaust the
        -- stack. Each edge is walked once (UNION), however many paths lead to it.
        -- pgq_dep_blocker, then the primary key.
        WITH RECURSIVE doomed (job_id, blocker_id) AS (
            SELECT dep.job_id, dep.blocker_id
            FROM django_pgqueue_dependency AS dep
            JOIN django_pgqueue_job AS job ON job.id = dep.job_id
            WHERE dep.blocker_id = NEW.id
              AND dep.on_failure = 'cancel'
              AND job.status = 'blocked'
            UNION
            SELECT dep.job_id, dep.blocker_id
            FROM doomed
            JOIN django_pgqueue_dependency AS dep ON dep.blocker_id = doomed.job_id
            JOIN django_pgqueue_job AS job ON job.id = dep.job_id
            WHERE dep.on_failure = 'cancel'
              AND job.status = 'blocked'
        )
        SELECT array_agg(doomed.job_id), array_agg(doomed.blocker_id)
        INTO doomed_jobs, doomed_blockers
        FROM doomed;
    END IF;
    -- Lock the blocked dependents (and what the cancel reaches) in id order, in one pass
    -- (every settler locks in that order). Two blockers of one job finishing at once in
    -- two transactions thus settle it one after the other, and the second sees the
    -- first's commit in its next statement's snapshot: the job cannot be left blocked
    -- with every blocker done. pgq_dep_blocker, then the primary key.
    SELECT array_agg(locked.id ORDER BY locked.id) INTO waiting
    FROM (
        SELECT job.id
        FROM django_pgqueue_job AS job
        WHERE (
            job.id = ANY (ARRAY(
                SELECT dep.job_id FROM django_pgqueue_dependency AS dep
                WHERE dep.blocker_id = NEW.id
            ))
            OR job.id = ANY (COALESCE(doomed_jobs, '{}'))
        )
          AND job.status = 'blocked'
        ORDER BY job.id
        FOR NO KEY UPDATE
    ) AS locked;
    IF waiting IS NULL THEN
        RETURN NULL;
    END IF;
    IF doomed_jobs IS NOT NULL THEN
        -- The reason names the job that cancelled it, as an operator's cancel gives one.
        -- Their own triggers then find nothing left to cancel, and settle only their
        -- dependents with policy "run" (one level deeper, never more).
        WITH edge AS (
            SELECT edge.job_id, edge.blocker_id
            FROM unnest(doomed_jobs, doomed_blockers) AS edge (job_id, blocker_id)
        ),
        cause AS (
            SELECT DISTINCT ON (edge.job_id) edge.job_id, edge.blocker_id
            FROM edge
            ORDER BY edge.job_id, edge.blocker_id = NEW.id DESC, edge.blocker_id
        ),
        marked AS (
            UPDATE django_pgqueue_dependency AS dep
            SET cancelled_job = true
            FROM edge
            WHERE dep.job_id = edge.job_id
              AND dep.blocker_id = edge.blocker_id
        ),
        cancelled AS (
            UPDATE django_pgqueue_job AS job
            SET status = 'cancelled',
                finished_at = now(),
                last_error = format(
                    'job %s, which it runs after, ended %s', cause.blocker_id,
                    CASE WHEN cause.blocker_id = NEW.id
                        THEN replace(NEW.status, '_', '-')
                        ELSE 'cancelled'
                    END
                )
            FROM cause
            WHERE job.id = cause.job_id
              AND job.id = ANY (waiting)
              AND job.status = 'blocked'
            RETURNING job.partition_key
        )
        -- A blocked job holds its partition's turn: the partition moves on now.
        INSERT INTO django_pgqueue_partition_signal (partition_key)
        SELECT DISTINCT cancelled.partition_key FROM cancelled
        WHERE cancelled.partition_key IS NOT NULL;
    END IF;
    -- A new statement, a new snapshot: every blocker committed before the locks above
    -- were granted is seen. pgq_dep_job for each dependent's blockers.
    WITH ready AS (
        UPDATE django_pgqueue_job AS job
        SET status = 'pending',
            available_at = GREATEST(job.available_at, now())
        WHERE job.id = ANY (waiting)
          AND job.status = 'blocked'
          AND NOT EXISTS (
              SELECT 1
              FROM django_pgqueue_dependency AS other
              JOIN django_pgqueue_job AS blocker ON blocker.id = other.blocker_id
              WHERE other.job_id = job.id
                AND blocker.status <> 'succeeded'
                AND NOT (
                    other.on_failure = 'run'
                    AND blocker.status IN ('dead_letter', 'cancelled')
                )
          )
        RETURNING job.id, job.queue, job.partition_key, job.concurrency_key, job.available_at
    ),
    signalled AS (
        INSERT INTO django_pgqueue_partition_signal (partition_key)
        SELECT DISTINCT ready.partition_key FROM ready WHERE ready.partition_key IS NOT NULL
    ),
    wake AS (
        -- A partitioned or limited dependent is signalled (its key's concurrency signal
        -- comes from the trigger of 0011): its workers are told on the flow channel too,
        -- named as notices.flow_channel() names it, to claim with partitions and keys.
        SELECT DISTINCT dep.wake_channel AS channel, ready.queue
        FROM ready
        JOIN django_pgqueue_dependency AS dep
          ON dep.job_id = ready.id AND dep.blocker_id = NEW.id
        WHERE ready.available_at <= now()
        UNION
        SELECT DISTINCT left(dep.wake_channel, 58) || '_flow', ready.queue
        FROM ready
        JOIN django_pgqueue_dependency AS dep
          ON dep.job_id = ready.id AND dep.blocker_id = NEW.id
        WHERE ready.available_at <= now()
          AND (ready.partition_key IS NOT NULL OR ready.concurrency_key IS NOT NULL)
    )
    SELECT count(pg_notify(wake.channel, wake.queue)) INTO woken FROM wake;
    RETURN NULL;
END
$function$;
COMMENT ON FUNCTION django_pgqueue_settle_dependents() IS
    'django-pgqueue: settle the dependents of a job that finished; notify its waiters';
DROP TRIGGER IF EXISTS django_pgqueue_job_settle ON django_pgqueue_job;
CREATE TRIGGER django_pgqueue_job_settle
AFTER UPDATE OF status ON django_pgqueue_job
FOR EACH ROW
WHEN (
    (NEW.has_dependents OR NEW.awaited)
    AND OLD.status IS DISTINCT FROM NEW.status
    AND NEW.status IN ('succeeded', 'dead_letter', 'cancelled')
)
EXECUTE FUNCTION django_pgqueue_settle_dependents();
"""


PART_PENDING_COMMENT = (
    "claim_batch head check and refresh_partitions: a partition's jobs not started yet "
    "(pending or blocked), oldest first"
)


def _claim_index(name: str, condition: models.Q) -> models.Index:
    return models.Index(
        fields=["queue", "-head_priority", "head_available_at", "head_id"],
        name=name,
        condition=condition,
    )


PARTITION_CLAIM = models.Q(
    ("head_blocked", False),
    ("head_id__isnull", False),
    ("running_id__isnull", True),
    ("wake_at__isnull", True),
)
CONCURRENCY_CLAIM = models.Q(
    ("head_id__isnull", False),
    ("in_flight__lt", models.F("max_in_flight")),
    ("wake_at__isnull", True),
)


class Migration(migrations.Migration):
    atomic = False

    dependencies = [("django_pgqueue", "0014_drop_claim_part")]

    operations = [
        migrations.AddField(
            model_name="job",
            name="cancel_requested_at",
            field=models.DateTimeField(
                blank=True,
                db_comment="An operator cancelled the job while it ran: it stays processing "
                "(lease, slot and partition turn held) until its handler returns or its "
                "lease expires, and then ends cancelled.",
                null=True,
                verbose_name="cancel requested at",
            ),
        ),
        migrations.AddField(
            model_name="partition",
            name="head_blocked",
            field=models.BooleanField(
                db_comment="The next job waits for its dependencies: the partition waits too.",
                db_default=False,
                verbose_name="next job blocked",
            ),
        ),
        migrations.AddField(
            model_name="partition",
            name="wake_at",
            field=models.DateTimeField(
                blank=True,
                db_comment="The next job is scheduled: out of the claim index until then.",
                null=True,
                verbose_name="next job can start at",
            ),
        ),
        migrations.AddField(
            model_name="concurrencykey",
            name="wake_at",
            field=models.DateTimeField(
                blank=True,
                db_comment="The next job is scheduled or the rate bucket is empty: out of "
                "the claim index until then.",
                null=True,
                verbose_name="next job can start at",
            ),
        ),
        migrations.AddField(
            model_name="partitionsignal",
            name="urgent",
            field=models.BooleanField(
                db_comment="The claim folds it (a job may be able to start); else housekeeping.",
                db_default=True,
                verbose_name="urgent",
            ),
        ),
        migrations.AddField(
            model_name="concurrencysignal",
            name="urgent",
            field=models.BooleanField(
                db_comment="The claim folds it (a job may be able to start); else housekeeping.",
                db_default=True,
                verbose_name="urgent",
            ),
        ),
        migrations.RunSQL(
            sql=KEY_WAKE_AT_FUNCTION + LOCK_DEPENDENTS,
            reverse_sql=HELPERS_REVERSE,
        ),
        migrations.RunSQL(sql=REFRESH_PARTITIONS, reverse_sql=_0004.REFRESH_FUNCTION),
        migrations.RunSQL(sql=REFRESH_CONCURRENCY, reverse_sql=_0011.REFRESH_FUNCTION),
        migrations.RunSQL(sql=FOLD_FUNCTIONS, reverse_sql=FOLD_FUNCTIONS_REVERSE),
        migrations.RunSQL(sql=SETTLE_TRIGGER, reverse_sql=_0009.SETTLE_TRIGGER),
        # pgq_job_part_pending takes the blocked jobs in too: a blocked job keeps its
        # partition's turn, and one index answers "the oldest job not started yet".
        django_pgqueue.schema.EnsureIndexConcurrently(
            "job",
            models.Index(
                condition=models.Q(
                    ("status__in", ["blocked", "pending"]), ("partition_key__isnull", False)
                ),
                fields=["partition_key", "id"],
                name="pgq_job_part_pending_next",
            ),
            comment=PART_PENDING_COMMENT,
        ),
        RemoveIndexConcurrently(model_name="job", name="pgq_job_part_pending"),
        migrations.RenameIndex(
            model_name="job", new_name="pgq_job_part_pending", old_name="pgq_job_part_pending_next"
        ),
        django_pgqueue.schema.EnsureIndexConcurrently(
            "partition",
            models.Index(
                condition=models.Q(("wake_at__isnull", False)),
                fields=["wake_at"],
                name="pgq_partition_wake",
            ),
            comment="fold_signals: partitions whose next job becomes ready",
        ),
        django_pgqueue.schema.EnsureIndexConcurrently(
            "concurrencykey",
            models.Index(
                condition=models.Q(("wake_at__isnull", False)),
                fields=["wake_at"],
                name="pgq_concurrency_wake",
            ),
            comment="fold_signals: concurrency keys whose next job or token becomes ready",
        ),
        django_pgqueue.schema.EnsureIndexConcurrently(
            "partitionsignal",
            models.Index(
                condition=models.Q(("urgent", True)),
                fields=["id"],
                name="pgq_partition_signal_urgent",
            ),
            comment="fold_signals and the claim's probe: the urgent signals, oldest first",
        ),
        django_pgqueue.schema.EnsureIndexConcurrently(
            "partitionsignal",
            models.Index(
                condition=models.Q(("urgent", False)),
                fields=["id"],
                name="pgq_partition_signal_lazy",
            ),
            comment="fold_lazy_signals: the lazy signals, oldest first",
        ),
        django_pgqueue.schema.EnsureIndexConcurrently(
            "concurrencysignal",
            models.Index(
                condition=models.Q(("urgent", True)),
                fields=["id"],
                name="pgq_concurrency_signal_urgent",
            ),
            comment="fold_signals and the claim's probe: the urgent signals, oldest first",
        ),
        django_pgqueue.schema.EnsureIndexConcurrently(
            "concurrencysignal",
            models.Index(
                condition=models.Q(("urgent", False)),
                fields=["id"],
                name="pgq_concurrency_signal_lazy",
            ),
            comment="fold_lazy_signals: the lazy signals, oldest first",
        ),
        # The claim indexes with their new predicates: built beside the old ones, which
        # are then dropped; a claim always has one of the two to read.
        django_pgqueue.schema.EnsureIndexConcurrently(
            "partition",
            _claim_index("pgq_partition_claim_next", PARTITION_CLAIM),
            comment="claim_batch: partitions whose next job can start now, in claim order",
        ),
        RemoveIndexConcurrently(model_name="partition", name="pgq_partition_claim"),
        migrations.RenameIndex(
            model_name="partition",
            new_name="pgq_partition_claim",
            old_name="pgq_partition_claim_next",
        ),
        django_pgqueue.schema.EnsureIndexConcurrently(
            "concurrencykey",
            _claim_index("pgq_concurrency_claim_next", CONCURRENCY_CLAIM),
            comment="claim_batch: concurrency keys whose next job can start now, in claim order",
        ),
        RemoveIndexConcurrently(model_name="concurrencykey", name="pgq_concurrency_claim"),
        migrations.RenameIndex(
            model_name="concurrencykey",
            new_name="pgq_concurrency_claim",
            old_name="pgq_concurrency_claim_next",
        ),
    ]
