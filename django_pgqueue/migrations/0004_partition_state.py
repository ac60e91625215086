"""Partition claim state: one row per active partition key, kept by the queue's statements.

The claim used to look for partition heads in a window of the first N pending
partitioned rows; a head that sorted after the window (a retry in backoff, a lower
priority than the rows behind it) never ran, and one deep partition hid the others.
Now every partition with work has a row in ``django_pgqueue_partition`` saying which job
is next and whether one is running; the claim reads only idle partitions with a ready
next job (``pgq_partition_claim``), whatever lies behind them.

``django_pgqueue_refresh_partitions(keys)`` recomputes those rows from the job table. It
locks each row first, in key order (so two callers cannot deadlock), and only then reads
the job table, in a new statement with a new snapshot: whatever committed before it got
the lock is seen, and whoever commits later refreshes again after it. Every statement of
``sql/lease.sql`` and ``sql/maintenance.sql`` that moves a partitioned job calls it in the
same transaction; producers and operators append a ``django_pgqueue_partition_signal``
row instead (no lock that a worker could wait on), which claims fold in.

Safe on a live table, and not atomic on purpose, so no lock outlives its own step: two
new tables and a function (nothing else touches them yet), a nullable column (a catalog
change: ACCESS EXCLUSIVE for an instant, no rewrite), a trigger (SHARE ROW EXCLUSIVE for
an instant), and one signal per partition that has work, found with a skip scan of
``pgq_job_part_pending`` (one index probe per partition) while writes go on. Workers of
the previous release keep working meanwhile: their claim checks partition heads on the
job table itself, and what they enqueue or finish is picked up by the partition repair
of this release's housekeeping.
"""

from django.db import migrations, models
from django.db.models.functions import Now

REFRESH_FUNCTION = """
CREATE OR REPLACE FUNCTION django_pgqueue_refresh_partitions(keys text[])
RETURNS integer
LANGUAGE plpgsql
VOLATILE
AS $function$
DECLARE
    partition text;
    head record;
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
        -- pgq_job_part_pending: the oldest pending job is the next one.
        SELECT job.id, job.queue, job.priority, job.available_at, job.partition_bucket
        INTO head
        FROM django_pgqueue_job AS job
        WHERE job.partition_key = partition
          AND job.status = 'pending'
        ORDER BY job.id
        LIMIT 1;
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

# A pending partitioned job whose availability or priority changes outside the queue's
# own statements (an UPDATE through the ORM or by hand; run_jobs_now also signals
# itself) leaves a signal, so its partition row follows. Pending rows only: every other
# status change is made by a statement that refreshes the partition itself.
SIGNAL_TRIGGER = """
CREATE OR REPLACE FUNCTION django_pgqueue_signal_partition()
RETURNS trigger
LANGUAGE plpgsql
AS $function$
BEGIN
    INSERT INTO django_pgqueue_partition_signal (partition_key) VALUES (NEW.partition_key);
    RETURN NULL;
END
$function$;
CREATE TRIGGER django_pgqueue_job_partition_signal
AFTER UPDATE OF available_at, priority ON django_pgqueue_job
FOR EACH ROW
WHEN (
    NEW.partition_key IS NOT NULL
    AND OLD.status = 'pending'
    AND NEW.status = 'pending'
    AND (
        OLD.available_at IS DISTINCT FROM NEW.available_at
        OR OLD.priority IS DISTINCT FROM NEW.priority
    )
)
EXECUTE FUNCTION django_pgqueue_signal_partition();
"""

# One signal per partition that has work now (a skip scan: one probe per partition).
BACKFILL_SIGNALS = """
INSERT INTO django_pgqueue_partition_signal (partition_key)
WITH RECURSIVE active (partition_key) AS (
    (
        SELECT job.partition_key FROM django_pgqueue_job AS job
        WHERE job.status = 'pending' AND job.partition_key IS NOT NULL
        ORDER BY job.partition_key, job.id
        LIMIT 1
    )
    UNION ALL
    SELECT next_key.partition_key
    FROM active
    CROSS JOIN LATERAL (
        SELECT job.partition_key FROM django_pgqueue_job AS job
        WHERE job.status = 'pending' AND job.partition_key > active.partition_key
        ORDER BY job.partition_key, job.id
        LIMIT 1
    ) AS next_key
)
SELECT active.partition_key FROM active
UNION
SELECT DISTINCT job.partition_key FROM django_pgqueue_job AS job
WHERE job.status = 'processing' AND job.partition_key IS NOT NULL
"""


class Migration(migrations.Migration):
    atomic = False

    dependencies = [("django_pgqueue", "0003_admin_indexes")]

    operations = [
        migrations.AddField(
            model_name="job",
            name="unknown_task_since",
            field=models.DateTimeField(
                blank=True,
                db_comment="When a worker first could not import the task: the start of the "
                "unknown-task window (the time the job was ready). NULL once a worker knows it.",
                null=True,
                verbose_name="waiting for its task since",
            ),
        ),
        migrations.CreateModel(
            name="Partition",
            fields=[
                (
                    "partition_key",
                    models.CharField(
                        max_length=255,
                        primary_key=True,
                        serialize=False,
                        verbose_name="partition key",
                    ),
                ),
                (
                    "queue",
                    models.CharField(
                        blank=True,
                        max_length=100,
                        null=True,
                        verbose_name="queue of the next job",
                    ),
                ),
                (
                    "partition_bucket",
                    models.SmallIntegerField(
                        blank=True, null=True, verbose_name="partition bucket"
                    ),
                ),
                (
                    "head_id",
                    models.BigIntegerField(
                        blank=True,
                        db_comment="Oldest pending job; NULL: none.",
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
                    "running_id",
                    models.BigIntegerField(
                        blank=True,
                        db_comment="The processing job; NULL: idle.",
                        null=True,
                        verbose_name="running job",
                    ),
                ),
                (
                    "refreshed_at",
                    models.DateTimeField(db_default=Now(), verbose_name="refreshed at"),
                ),
            ],
            options={
                "verbose_name": "partition",
                "verbose_name_plural": "partitions",
                "db_table": "django_pgqueue_partition",
                "db_table_comment": "django-pgqueue partition claim state; written only by queue SQL.",
                "indexes": [
                    models.Index(
                        condition=models.Q(
                            ("head_id__isnull", False), ("running_id__isnull", True)
                        ),
                        fields=["queue", "-head_priority", "head_available_at", "head_id"],
                        name="pgq_partition_claim",
                    ),
                    models.Index(
                        condition=models.Q(("running_id__isnull", False)),
                        fields=["running_id"],
                        name="pgq_partition_running",
                    ),
                ],
            },
        ),
        migrations.CreateModel(
            name="PartitionSignal",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                (
                    "partition_key",
                    models.CharField(max_length=255, verbose_name="partition key"),
                ),
            ],
            options={
                "verbose_name": "partition signal",
                "verbose_name_plural": "partition signals",
                "db_table": "django_pgqueue_partition_signal",
                "db_table_comment": "django-pgqueue: partitions to refresh; folded in by claims.",
            },
        ),
        migrations.RunSQL(
            sql=REFRESH_FUNCTION,
            reverse_sql="DROP FUNCTION IF EXISTS django_pgqueue_refresh_partitions(text[])",
        ),
        migrations.RunSQL(
            sql=SIGNAL_TRIGGER,
            reverse_sql="DROP TRIGGER IF EXISTS django_pgqueue_job_partition_signal "
            "ON django_pgqueue_job; DROP FUNCTION IF EXISTS django_pgqueue_signal_partition()",
        ),
        migrations.RunSQL(sql=BACKFILL_SIGNALS, reverse_sql=migrations.RunSQL.noop),
    ]
