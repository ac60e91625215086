"""Concurrency limits: at most N jobs of a key in flight, kept by the queue's statements.

The generalisation of the partition state of migration 0004 (a partition is "1 in
flight, in order"; a concurrency key is "N in flight, any order"). Each key with work
has a row in ``django_pgqueue_concurrency``: its limit, how many of its jobs are in
flight and its next job. The claim walks only keys under their limit with a ready next
job (``pgq_concurrency_claim``), counts what it takes in the same statement, and every
statement that moves a limited job recounts the row with
``django_pgqueue_refresh_concurrency(keys)`` (same locking discipline as
``django_pgqueue_refresh_partitions``: row lock in key order first, then a new snapshot
of the job table). Producers append a ``django_pgqueue_concurrency_signal`` row.

``pgq_job_claim`` loses the limited jobs: it is rebuilt with ``concurrency_key IS NULL``
in its predicate (built CONCURRENTLY under a new name, the old one dropped
CONCURRENTLY, then renamed), so a claim of plain jobs never reads past jobs waiting on a
limit. Not atomic on purpose: no lock outlives its own step. Two nullable columns (no
rewrite), two new tables, a function, and three indexes built CONCURRENTLY.
"""

from django.contrib.postgres.operations import RemoveIndexConcurrently
from django.db import migrations, models
from django.db.models.functions import Now

import django_pgqueue.schema

REFRESH_FUNCTION = """
CREATE OR REPLACE FUNCTION django_pgqueue_refresh_concurrency(keys text[], channel text)
RETURNS integer
LANGUAGE plpgsql
VOLATILE
AS $function$
DECLARE
    key text;
    head record;
    flying integer;
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
            PERFORM 1 FROM django_pgqueue_concurrency
            WHERE concurrency_key = key
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
        -- pgq_job_conc_processing: live leases, never a counter kept by a worker.
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
                refreshed_at = now()
            WHERE concurrency_key = key;
        ELSE
            UPDATE django_pgqueue_concurrency
            SET queue = COALESCE(head.queue, queue),
                -- No concurrency limit (a rate limit only): no bound on in flight.
                max_in_flight = CASE
                    WHEN head.id IS NULL THEN max_in_flight
                    ELSE GREATEST(COALESCE(head.concurrency_limit, 2147483647), 1)
                END,
                rate_limit = CASE WHEN head.id IS NULL THEN rate_limit ELSE head.rate_limit END,
                rate_period = CASE
                    WHEN head.id IS NULL THEN rate_period ELSE head.rate_period
                END,
                -- A new bucket starts full (one period's worth: the documented burst).
                tokens = CASE
                    WHEN head.id IS NULL THEN tokens
                    WHEN head.rate_limit IS NULL THEN NULL
                    WHEN tokens IS NULL THEN head.rate_limit
                    ELSE LEAST(tokens, head.rate_limit)
                END,
                tokens_at = CASE
                    WHEN head.id IS NULL THEN tokens_at
                    WHEN head.rate_limit IS NULL THEN NULL
                    ELSE COALESCE(tokens_at, now())
                END,
                in_flight = flying,
                head_id = head.id,
                head_priority = head.priority,
                head_available_at = head.available_at,
                refreshed_at = now()
            WHERE concurrency_key = key;
            -- A slot is free and a job is ready: wake the queue's workers (at COMMIT), so
            -- a job waiting on the limit starts now, not at the next poll.
            IF channel IS NOT NULL AND head.id IS NOT NULL AND head.available_at <= now()
               AND flying < COALESCE(head.concurrency_limit, 2147483647) THEN
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

# As for partitions: a pending limited job whose availability or priority changes
# outside the queue's statements leaves a signal, so its key's row follows; so does a
# blocked one that the settling trigger of 0009 makes pending (its last blocker succeeded).
SIGNAL_TRIGGER = """
CREATE OR REPLACE FUNCTION django_pgqueue_signal_concurrency()
RETURNS trigger
LANGUAGE plpgsql
AS $function$
BEGIN
    INSERT INTO django_pgqueue_concurrency_signal (concurrency_key) VALUES (NEW.concurrency_key);
    RETURN NULL;
END
$function$;
CREATE TRIGGER django_pgqueue_job_concurrency_signal
AFTER UPDATE OF available_at, priority, status ON django_pgqueue_job
FOR EACH ROW
WHEN (
    NEW.concurrency_key IS NOT NULL
    AND NEW.status = 'pending'
    AND (
        OLD.status = 'blocked'
        OR (
            OLD.status = 'pending'
            AND (
                OLD.available_at IS DISTINCT FROM NEW.available_at
                OR OLD.priority IS DISTINCT FROM NEW.priority
            )
        )
    )
)
EXECUTE FUNCTION django_pgqueue_signal_concurrency();
"""

CLAIM_COMMENT = "claim_batch: ready unpartitioned, unlimited jobs of a queue in claim order"


class Migration(migrations.Migration):
    atomic = False

    dependencies = [("django_pgqueue", "0010_pause_and_coalesce")]

    operations = [
        migrations.AddField(
            model_name="job",
            name="concurrency_key",
            field=models.CharField(
                blank=True,
                db_comment="Jobs sharing it run at most concurrency_limit at a time, in any order.",
                max_length=255,
                null=True,
                verbose_name="concurrency key",
            ),
        ),
        migrations.AddField(
            model_name="job",
            name="concurrency_limit",
            field=models.IntegerField(
                blank=True,
                db_comment="Jobs of concurrency_key in flight at most (from the task or settings).",
                null=True,
                verbose_name="concurrency limit",
            ),
        ),
        migrations.AddField(
            model_name="job",
            name="rate_limit",
            field=models.IntegerField(
                blank=True,
                db_comment="Starts of concurrency_key per rate_period at most.",
                null=True,
                verbose_name="rate limit",
            ),
        ),
        migrations.AddField(
            model_name="job",
            name="rate_period",
            field=models.FloatField(
                blank=True,
                db_comment="Seconds of the rate limit's period.",
                null=True,
                verbose_name="rate period",
            ),
        ),
        migrations.CreateModel(
            name="ConcurrencyKey",
            fields=[
                (
                    "concurrency_key",
                    models.CharField(
                        max_length=255,
                        primary_key=True,
                        serialize=False,
                        verbose_name="concurrency key",
                    ),
                ),
                (
                    "queue",
                    models.CharField(
                        blank=True, max_length=100, null=True, verbose_name="queue of the next job"
                    ),
                ),
                (
                    "max_in_flight",
                    models.IntegerField(
                        db_comment="Jobs in flight at most (the newest job's limit).",
                        db_default=1,
                        verbose_name="limit",
                    ),
                ),
                (
                    "in_flight",
                    models.IntegerField(
                        db_comment="Processing jobs of the key (leased).",
                        db_default=0,
                        verbose_name="in flight",
                    ),
                ),
                (
                    "rate_limit",
                    models.IntegerField(
                        blank=True,
                        db_comment="Starts per rate_period at most; NULL: no rate limit.",
                        null=True,
                        verbose_name="rate limit",
                    ),
                ),
                (
                    "rate_period",
                    models.FloatField(blank=True, null=True, verbose_name="rate period (s)"),
                ),
                (
                    "tokens",
                    models.FloatField(
                        blank=True,
                        db_comment="Token bucket: starts allowed as of tokens_at (at most "
                        "rate_limit).",
                        null=True,
                        verbose_name="tokens",
                    ),
                ),
                (
                    "tokens_at",
                    models.DateTimeField(blank=True, null=True, verbose_name="tokens counted at"),
                ),
                (
                    "head_id",
                    models.BigIntegerField(
                        blank=True,
                        db_comment="Best ready pending job (else the soonest ready); NULL: none.",
                        null=True,
                        verbose_name="next job",
                    ),
                ),
                (
                    "head_priority",
                    models.SmallIntegerField(
                        blank=True, null=True, verbose_name="next job's priority"
                    ),
                ),
                (
                    "head_available_at",
                    models.DateTimeField(
                        blank=True, null=True, verbose_name="next job available at"
                    ),
                ),
                (
                    "refreshed_at",
                    models.DateTimeField(db_default=Now(), verbose_name="refreshed at"),
                ),
            ],
            options={
                "verbose_name": "concurrency key",
                "verbose_name_plural": "flow control",
                "db_table": "django_pgqueue_concurrency",
                "db_table_comment": "django-pgqueue concurrency-limit claim state; "
                "written only by queue SQL.",
                "indexes": [
                    models.Index(
                        condition=models.Q(
                            ("head_id__isnull", False), ("in_flight__lt", models.F("max_in_flight"))
                        ),
                        fields=["queue", "-head_priority", "head_available_at", "head_id"],
                        name="pgq_concurrency_claim",
                    ),
                ],
            },
        ),
        migrations.CreateModel(
            name="ConcurrencySignal",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                (
                    "concurrency_key",
                    models.CharField(max_length=255, verbose_name="concurrency key"),
                ),
            ],
            options={
                "verbose_name": "concurrency signal",
                "verbose_name_plural": "concurrency signals",
                "db_table": "django_pgqueue_concurrency_signal",
                "db_table_comment": "django-pgqueue: concurrency keys to refresh; "
                "folded in by claims.",
            },
        ),
        migrations.RunSQL(
            sql=REFRESH_FUNCTION,
            reverse_sql="DROP FUNCTION IF EXISTS django_pgqueue_refresh_concurrency(text[], text)",
        ),
        migrations.RunSQL(
            sql=SIGNAL_TRIGGER,
            reverse_sql="DROP TRIGGER IF EXISTS django_pgqueue_job_concurrency_signal "
            "ON django_pgqueue_job; DROP FUNCTION IF EXISTS django_pgqueue_signal_concurrency()",
        ),
        django_pgqueue.schema.EnsureIndexConcurrently(
            "job",
            models.Index(
                condition=models.Q(("status", "pending"), ("concurrency_key__isnull", False)),
                fields=["concurrency_key", "-priority", "available_at", "id"],
                name="pgq_job_conc_pending",
            ),
            comment="claim_batch: a concurrency key's pending jobs in claim order",
        ),
        django_pgqueue.schema.EnsureIndexConcurrently(
            "job",
            models.Index(
                condition=models.Q(("status", "processing"), ("concurrency_key__isnull", False)),
                fields=["concurrency_key"],
                name="pgq_job_conc_processing",
            ),
            comment="django_pgqueue_refresh_concurrency: a key's jobs in flight",
        ),
        # pgq_job_claim without the limited jobs: build the new one beside the old, drop
        # the old, take over its name. A claim always has one of the two to read.
        django_pgqueue.schema.EnsureIndexConcurrently(
            "job",
            models.Index(
                condition=models.Q(
                    ("status", "pending"),
                    ("partition_key__isnull", True),
                    ("concurrency_key__isnull", True),
                ),
                fields=["queue", "-priority", "available_at", "id"],
                name="pgq_job_claim_unlimited",
            ),
            comment=CLAIM_COMMENT,
        ),
        RemoveIndexConcurrently(model_name="job", name="pgq_job_claim"),
        migrations.RenameIndex(
            model_name="job", new_name="pgq_job_claim", old_name="pgq_job_claim_unlimited"
        ),
    ]
