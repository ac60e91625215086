"""The history tier: finished jobs leave the job table for a partitioned history.

``django_pgqueue_job_history`` has the job table's columns and one more,
``history_class``: it is partitioned by LIST on the final status, each status by LIST on
the class (one per final status, and one per final status of each queue given its own
retention) and each class by RANGE on ``finished_at`` (an hour, a day or a week per partition, PGQUEUE_HISTORY_PERIOD), with a
DEFAULT partition so a row whose period has no partition yet is never refused.
Retention drops whole partitions (``django_pgqueue_prune_history``), which writes a
few catalog rows, whatever the row count. Partitions are made ahead by housekeeping
(``django_pgqueue_ensure_history``), and here for the current period and the next two.

``django_pgqueue_history_class`` says which class a finished job goes to and how long
its class is kept; housekeeping writes it from the settings.

``django_pgqueue_job_all`` is the union of both tiers, in the job table's columns: the
``Job`` model reads it from migration 0020 on.

Nothing here touches the job table: it is all new tables, functions and a view. A
later column added to the job table must be added to the history (ALTER TABLE on the
partitioned table reaches every partition) and the view recreated; tests/test_history.py
compares them.
"""

from django.db import migrations, models

#: The job table's columns at this migration, in its order: the history and the view
#: list them explicitly, so that a column added later is a visible, deliberate change.
JOB_COLUMNS = (
    "id",
    "queue",
    "task_path",
    "args",
    "kwargs",
    "priority",
    "status",
    "attempts",
    "max_attempts",
    "lease_generation",
    "claimed_by",
    "claimed_at",
    "lease_expires_at",
    "available_at",
    "created_at",
    "started_at",
    "finished_at",
    "last_error",
    "last_error_class",
    "errors",
    "result",
    "idempotency_key",
    "partition_key",
    "partition_bucket",
    "step",
    "unknown_task_since",
    "traceparent",
    "awaited",
    "has_dependents",
    "coalesce_key",
    "concurrency_key",
    "concurrency_limit",
    "rate_limit",
    "rate_period",
    "cancel_requested_at",
    "snoozes",
)

_COLUMN_LIST = ", ".join(JOB_COLUMNS)

HISTORY_TABLE = """
CREATE TABLE django_pgqueue_job_history (
    LIKE django_pgqueue_job INCLUDING DEFAULTS INCLUDING COMMENTS,
    history_class smallint NOT NULL
) PARTITION BY LIST (status)
"""

# One table per final status first, each partitioned by class: a query filtering on the
# status (the admin's status filter, the dead-letter page) reads only its partitions.
STATUS_TABLES = tuple(
    f"CREATE TABLE django_pgqueue_job_history_{status} PARTITION OF "
    f"django_pgqueue_job_history FOR VALUES IN ('{status}') PARTITION BY LIST (history_class)"
    for status in ("succeeded", "cancelled", "dead_letter")
)

# Partitioned indexes: every partition, made now or attached later, gets its own.
# pgq_hist_id: lookups by id (results, waits, the admin's job page, retry); ids are
# unique across both tiers because a row is only ever moved, never copied.
HISTORY_INDEXES = (
    "CREATE INDEX pgq_hist_id ON django_pgqueue_job_history (id)",
    # Idempotency keys held by finished jobs (enqueue_idempotent's lookup).
    "CREATE INDEX pgq_hist_idempotency_key ON django_pgqueue_job_history (idempotency_key) "
    "WHERE idempotency_key IS NOT NULL",
    # The dead-letter page: grouped by task and error class, newest first.
    "CREATE INDEX pgq_hist_dead ON django_pgqueue_job_history "
    "(task_path, last_error_class, id) WHERE status = 'dead_letter'",
    # Admin created-at range filters (finish-time ranges prune partitions instead).
    "CREATE INDEX pgq_hist_created_brin ON django_pgqueue_job_history USING brin "
    "(created_at) WITH (pages_per_range = 16)",
    # Admin filters by queue, task and partition key: rows arrive in finish order, so
    # bloom summaries of a few pages read only the ranges holding a rare value.
    "CREATE INDEX pgq_hist_filter_brin ON django_pgqueue_job_history USING brin ("
    "queue text_bloom_ops(n_distinct_per_range = 16), "
    "task_path text_bloom_ops(n_distinct_per_range = 32), "
    "partition_key text_bloom_ops(n_distinct_per_range = 32)"
    ") WITH (pages_per_range = 16)",
)

HISTORY_COMMENT = (
    "COMMENT ON TABLE django_pgqueue_job_history IS "
    "'django-pgqueue: finished jobs, partitioned by retention class and finish time; "
    "written only by the queue''s SQL.'"
)

PERIOD_START = """
CREATE FUNCTION django_pgqueue_history_period_start(at timestamptz, period text)
RETURNS timestamptz
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$ SELECT date_trunc(period, at AT TIME ZONE 'UTC') AT TIME ZONE 'UTC' $$
"""

# Creates what is missing, never alters what exists: each class's partitioned table
# and its DEFAULT partition, then the partitions of the current period and the next
# `ahead` ones. A partition is made with CREATE TABLE (LIKE ...) and ATTACH, which
# locks the parent in SHARE UPDATE EXCLUSIVE mode (CREATE TABLE ... PARTITION OF would
# take ACCESS EXCLUSIVE and stop every finishing job meanwhile). A period that cannot
# be attached is skipped and counted: it overlaps a partition of another period length
# (PGQUEUE_HISTORY_PERIOD changed: the new length starts when the old partitions end),
# or the DEFAULT partition holds rows of it (no housekeeping ran for a while; those
# rows are pruned from the DEFAULT partition row by row), or a lock was not granted in
# the caller's lock_timeout (the next pass tries again).
ENSURE = """
CREATE FUNCTION django_pgqueue_ensure_history(period text, ahead integer)
RETURNS TABLE (created integer, skipped integer)
LANGUAGE plpgsql
AS $$
DECLARE
    cls record;
    parent text;
    name text;
    start_at timestamptz;
    end_at timestamptz;
    step interval := ('1 ' || period)::interval;
BEGIN
    created := 0;
    skipped := 0;
    FOR cls IN SELECT id, status FROM django_pgqueue_history_class ORDER BY id LOOP
        parent := 'django_pgqueue_job_history_c' || cls.id;
        IF to_regclass(quote_ident(parent)) IS NULL THEN
            EXECUTE format(
                'CREATE TABLE %I (LIKE django_pgqueue_job_history INCLUDING DEFAULTS) '
                'PARTITION BY RANGE (finished_at)', parent);
            EXECUTE format('CREATE TABLE %I PARTITION OF %I DEFAULT',
                parent || '_default', parent);
            EXECUTE format('ALTER TABLE %I ATTACH PARTITION %I FOR VALUES IN (%s)',
                'django_pgqueue_job_history_' || cls.status, parent, cls.id);
        END IF;
        start_at := django_pgqueue_history_period_start(now(), period);
        FOR i IN 0..ahead LOOP
            end_at := start_at + step;
            name := parent || '_' || to_char(start_at AT TIME ZONE 'UTC', 'YYYYMMDDHH24');
            IF to_regclass(quote_ident(name)) IS NULL THEN
                BEGIN
                    EXECUTE format('CREATE TABLE %I (LIKE %I INCLUDING DEFAULTS)',
                        name, parent);
                    EXECUTE format(
                        'ALTER TABLE %I ATTACH PARTITION %I FOR VALUES FROM (%L) TO (%L)',
                        parent, name, start_at, end_at);
                    created := created + 1;
                EXCEPTION
                    WHEN invalid_object_definition OR check_violation
                        OR lock_not_available THEN
                    skipped := skipped + 1;
                END;
            END IF;
            start_at := end_at;
        END LOOP;
    END LOOP;
    RETURN NEXT;
END
$$
"""

# The range partitions of kept-for-a-while classes whose whole period is older than
# the retention, oldest first: DROP TABLE each (a catalog change, no per-row work and
# no vacuum debt). Each drop is its own subtransaction: one whose lock is not granted
# within the caller's lock_timeout (a long query reading it) is left for the next pass,
# and the others still go. Then the DEFAULT partitions' expired rows, row by row and
# at most `default_limit` (they exist only when no partition was ready in time).
PRUNE = """
CREATE FUNCTION django_pgqueue_prune_history(max_drops integer, default_limit integer)
RETURNS TABLE (dropped integer, rows_estimate bigint, deferred integer, deleted integer)
LANGUAGE plpgsql
AS $$
DECLARE
    part record;
    gone integer;
BEGIN
    dropped := 0;
    rows_estimate := 0;
    deferred := 0;
    deleted := 0;
    FOR part IN
        SELECT child.oid::regclass AS rel, greatest(child.reltuples, 0)::bigint AS rows
        FROM django_pgqueue_history_class AS cls
        JOIN pg_inherits AS inh
          ON inh.inhparent = to_regclass(quote_ident('django_pgqueue_job_history_c' || cls.id))
        JOIN pg_class AS child ON child.oid = inh.inhrelid
        CROSS JOIN LATERAL (
            SELECT substring(
                pg_get_expr(child.relpartbound, child.oid) FROM 'TO \\(''([^'']+)''\\)'
            )::timestamptz AS upper_bound
        ) AS bound
        WHERE cls.keep_seconds IS NOT NULL
          AND bound.upper_bound <= now() - make_interval(secs => cls.keep_seconds)
        ORDER BY bound.upper_bound, child.oid
        LIMIT max_drops
    LOOP
        BEGIN
            EXECUTE format('DROP TABLE %s', part.rel);
            dropped := dropped + 1;
            rows_estimate := rows_estimate + part.rows;
        EXCEPTION WHEN lock_not_available THEN
            deferred := deferred + 1;
        END;
    END LOOP;
    FOR part IN
        SELECT cls.id, cls.keep_seconds
        FROM django_pgqueue_history_class AS cls
        WHERE cls.keep_seconds IS NOT NULL
          AND to_regclass(quote_ident('django_pgqueue_job_history_c' || cls.id || '_default'))
              IS NOT NULL
        ORDER BY cls.id
    LOOP
        EXIT WHEN deleted >= default_limit;
        EXECUTE format(
            'DELETE FROM %I WHERE ctid = ANY (ARRAY('
            '  SELECT ctid FROM %I WHERE finished_at IS NULL OR finished_at < $1 LIMIT $2))',
            'django_pgqueue_job_history_c' || part.id || '_default',
            'django_pgqueue_job_history_c' || part.id || '_default')
        USING now() - make_interval(secs => part.keep_seconds), default_limit - deleted;
        GET DIAGNOSTICS gone = ROW_COUNT;
        deleted := deleted + gone;
    END LOOP;
    RETURN NEXT;
END
$$
"""

VIEW = f"""
CREATE VIEW django_pgqueue_job_all AS
SELECT {_COLUMN_LIST} FROM django_pgqueue_job
UNION ALL
SELECT {_COLUMN_LIST} FROM django_pgqueue_job_history
"""

VIEW_COMMENT = (
    "COMMENT ON VIEW django_pgqueue_job_all IS "
    "'django-pgqueue: every job, live (django_pgqueue_job) and finished "
    "(django_pgqueue_job_history); read-only.'"
)

# Not managed by Django: a test database flush (TransactionTestCase) must not empty it,
# and its rows are the queue's configuration, written by housekeeping.
CLASS_TABLE = """
CREATE TABLE django_pgqueue_history_class (
    id smallint GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
    status varchar(16) NOT NULL,
    queue varchar(100) NULL,
    keep_seconds double precision NULL,
    retired boolean NOT NULL DEFAULT false,
    CONSTRAINT pgq_history_class_unique UNIQUE NULLS NOT DISTINCT (status, queue),
    CONSTRAINT pgq_history_class_status
        CHECK (status IN ('cancelled', 'dead_letter', 'succeeded')),
    CONSTRAINT pgq_history_class_keep CHECK (keep_seconds >= 0 OR keep_seconds IS NULL)
)
"""

CLASS_COMMENTS = (
    "COMMENT ON TABLE django_pgqueue_history_class IS 'django-pgqueue: where finished jobs "
    "go and how long they are kept; written by housekeeping from the settings.'",
    "COMMENT ON COLUMN django_pgqueue_history_class.queue IS "
    "'NULL: every queue without a class of its own.'",
    "COMMENT ON COLUMN django_pgqueue_history_class.keep_seconds IS 'How long the class''s "
    "jobs are kept after they finish (whole partitions are dropped once past it); NULL "
    "keeps them.'",
    "COMMENT ON COLUMN django_pgqueue_history_class.retired IS 'No longer in the settings: "
    "no new job goes to it, and its partitions are dropped as they expire.'",
)

CLASSES = (
    "INSERT INTO django_pgqueue_history_class (id, status, queue, keep_seconds, retired) "
    "VALUES (1, 'succeeded', NULL, NULL, false), (2, 'cancelled', NULL, NULL, false), "
    "(3, 'dead_letter', NULL, NULL, false)"
)

# Past the seeded ids: classes of queues with their own retention are numbered from 4.
CLASS_SEQUENCE = "SELECT setval(pg_get_serial_sequence('django_pgqueue_history_class', 'id'), 3)"


class Migration(migrations.Migration):
    dependencies = [("django_pgqueue", "0018_schedule_source")]

    operations = [
        migrations.CreateModel(
            name="HistoryClass",
            fields=[
                ("id", models.SmallAutoField(primary_key=True, serialize=False)),
                (
                    "status",
                    models.CharField(
                        choices=[
                            ("succeeded", "Succeeded"),
                            ("dead_letter", "Dead letter"),
                            ("cancelled", "Cancelled"),
                        ],
                        max_length=16,
                        verbose_name="final status",
                    ),
                ),
                (
                    "queue",
                    models.CharField(
                        blank=True,
                        db_comment="NULL: every queue without a class of its own.",
                        max_length=100,
                        null=True,
                        verbose_name="queue",
                    ),
                ),
                (
                    "keep_seconds",
                    models.FloatField(
                        blank=True,
                        db_comment="How long the class's jobs are kept after they finish "
                        "(whole partitions are dropped once past it); NULL keeps them.",
                        null=True,
                        verbose_name="kept for (seconds)",
                    ),
                ),
                (
                    "retired",
                    models.BooleanField(
                        db_comment="No longer in the settings: no new job goes to it, and "
                        "its partitions are dropped as they expire.",
                        default=False,
                        verbose_name="retired",
                    ),
                ),
            ],
            options={
                "verbose_name": "history class",
                "verbose_name_plural": "history classes",
                "db_table": "django_pgqueue_history_class",
                "managed": False,
                "db_table_comment": "django-pgqueue: where finished jobs go and how long "
                "they are kept; written by housekeeping from the settings.",
                "constraints": [
                    models.UniqueConstraint(
                        fields=("status", "queue"),
                        name="pgq_history_class_unique",
                        nulls_distinct=False,
                    ),
                    models.CheckConstraint(
                        condition=models.Q(
                            ("status__in", ["cancelled", "dead_letter", "succeeded"])
                        ),
                        name="pgq_history_class_status",
                    ),
                    models.CheckConstraint(
                        condition=models.Q(
                            ("keep_seconds__gte", 0),
                            ("keep_seconds__isnull", True),
                            _connector="OR",
                        ),
                        name="pgq_history_class_keep",
                    ),
                ],
            },
        ),
        migrations.RunSQL(
            sql=[CLASS_TABLE, *CLASS_COMMENTS, CLASSES, CLASS_SEQUENCE],
            reverse_sql="DROP TABLE django_pgqueue_history_class",
        ),
        migrations.RunSQL(
            sql=[HISTORY_TABLE, *STATUS_TABLES, *HISTORY_INDEXES, HISTORY_COMMENT],
            reverse_sql="DROP TABLE django_pgqueue_job_history",
        ),
        migrations.RunSQL(
            sql=[PERIOD_START, ENSURE, PRUNE],
            reverse_sql=[
                "DROP FUNCTION django_pgqueue_prune_history(integer, integer)",
                "DROP FUNCTION django_pgqueue_ensure_history(text, integer)",
                "DROP FUNCTION django_pgqueue_history_period_start(timestamptz, text)",
            ],
        ),
        migrations.RunSQL(
            sql="SELECT * FROM django_pgqueue_ensure_history('day', 2)",
            reverse_sql=migrations.RunSQL.noop,
        ),
        migrations.RunSQL(sql=[VIEW, VIEW_COMMENT], reverse_sql="DROP VIEW django_pgqueue_job_all"),
    ]
