"""Enqueue from SQL: ``django_pgqueue_enqueue()`` and the settings row it reads.

A trigger, a ``psql`` session or a service in another language enqueues a job in its own
transaction with ``SELECT django_pgqueue_enqueue('app.tasks.send', kwargs => ...)``. The
function checks what Python's enqueue checks and applies the same defaults, read from
``django_pgqueue_sql_settings`` (written by ``migrate`` and by each worker at start):
the queue must be one of the backends' queues on this database, priority in -100..100,
max_attempts in 1..1000 (default ``PGQUEUE_MAX_ATTEMPTS``), args a JSON array and kwargs
an object within ``PGQUEUE_MAX_PAYLOAD_BYTES``, keys non-empty and at most 255
characters. Bad input raises an error with its own SQLSTATE (class ``QJ``, see
docs/howto/sql-enqueue.md) naming the argument; nothing is written. The wake-up is the
one Python's enqueue sends (NOTIFY at commit, the partition and key signals).

New objects only (a table and two functions): no lock on the job table; workers of the
previous release never call them.
"""

import django.db.models.functions.datetime
from django.db import migrations, models

# CRC-32 (the zlib polynomial, reflected) of the bytes: the partition bucket Python
# computes with zlib.crc32 (store/partition.py), so a SQL enqueue lands in the same one.
CRC32_FUNCTION = """
CREATE OR REPLACE FUNCTION django_pgqueue_crc32(data bytea) RETURNS bigint
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
AS $$
DECLARE
    crc bigint := 4294967295;
    i integer;
    bit integer;
BEGIN
    FOR i IN 0 .. length(data) - 1 LOOP
        crc := crc # get_byte(data, i);
        FOR bit IN 1 .. 8 LOOP
            IF crc & 1 = 1 THEN
                crc := (crc >> 1) # 3988292384;
            ELSE
                crc := crc >> 1;
            END IF;
        END LOOP;
    END LOOP;
    RETURN crc # 4294967295;
END
$$
"""

ENQUEUE_FUNCTION = """
CREATE OR REPLACE FUNCTION django_pgqueue_enqueue(
    task_path text,
    args jsonb DEFAULT '[]'::jsonb,
    kwargs jsonb DEFAULT '{}'::jsonb,
    queue text DEFAULT 'default',
    priority integer DEFAULT 0,
    run_after timestamptz DEFAULT NULL,
    max_attempts integer DEFAULT NULL,
    idempotency_key text DEFAULT NULL,
    partition_key text DEFAULT NULL
) RETURNS bigint
LANGUAGE plpgsql
AS $$
#variable_conflict use_column
DECLARE
    cfg django_pgqueue_sql_settings%ROWTYPE;
    attempts_allowed integer;
    available timestamptz := COALESCE(django_pgqueue_enqueue.run_after, now());
    payload_size bigint;
    bucket smallint;
    key_name text;
    key_limit integer;
    rate jsonb;
    new_id bigint;
    urgent boolean;
BEGIN
    SELECT * INTO cfg FROM django_pgqueue_sql_settings WHERE id = 1;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'django_pgqueue_enqueue: the queue settings are not in this database'
            USING ERRCODE = 'QJ000',
                  HINT = 'run manage.py migrate (or start a worker) with the project''s settings';
    END IF;
    IF django_pgqueue_enqueue.task_path IS NULL OR django_pgqueue_enqueue.task_path = '' THEN
        RAISE EXCEPTION 'task_path: must be a non-empty string' USING ERRCODE = 'QJ002';
    END IF;
    IF char_length(django_pgqueue_enqueue.task_path) > 255 THEN
        RAISE EXCEPTION 'task_path: is longer than 255 characters' USING ERRCODE = 'QJ002';
    END IF;
    IF django_pgqueue_enqueue.queue IS NULL OR django_pgqueue_enqueue.queue = ''
        OR char_length(django_pgqueue_enqueue.queue) > 100 THEN
        RAISE EXCEPTION 'queue: must be a non-empty string of at most 100 characters'
            USING ERRCODE = 'QJ002';
    END IF;
    IF cfg.queues IS NOT NULL AND NOT cfg.queues ? django_pgqueue_enqueue.queue THEN
        RAISE EXCEPTION 'queue %: not one of the queues of this database',
            quote_literal(django_pgqueue_enqueue.queue)
            USING ERRCODE = 'QJ001',
                  DETAIL = 'queues: ' || (SELECT string_agg(value, ', ' ORDER BY value)
                                          FROM jsonb_array_elements_text(cfg.queues)),
                  HINT = 'add it to the QUEUES of a PgQueueBackend on this database and run migrate (or start a worker)';
    END IF;
    IF django_pgqueue_enqueue.priority IS NULL
        OR django_pgqueue_enqueue.priority NOT BETWEEN -100 AND 100 THEN
        RAISE EXCEPTION 'priority: % is outside -100..100', django_pgqueue_enqueue.priority
            USING ERRCODE = 'QJ002';
    END IF;
    attempts_allowed := COALESCE(django_pgqueue_enqueue.max_attempts, cfg.max_attempts);
    IF attempts_allowed NOT BETWEEN 1 AND 1000 THEN
        RAISE EXCEPTION 'max_attempts: % is outside 1..1000', attempts_allowed
            USING ERRCODE = 'QJ002';
    END IF;
    IF django_pgqueue_enqueue.args IS NULL
        OR jsonb_typeof(django_pgqueue_enqueue.args) <> 'array' THEN
        RAISE EXCEPTION 'args: must be a JSON array, not %',
            COALESCE(jsonb_typeof(django_pgqueue_enqueue.args), 'NULL')
            USING ERRCODE = 'QJ003';
    END IF;
    IF django_pgqueue_enqueue.kwargs IS NULL
        OR jsonb_typeof(django_pgqueue_enqueue.kwargs) <> 'object' THEN
        RAISE EXCEPTION 'kwargs: must be a JSON object, not %',
            COALESCE(jsonb_typeof(django_pgqueue_enqueue.kwargs), 'NULL')
            USING ERRCODE = 'QJ003';
    END IF;
    payload_size := octet_length(django_pgqueue_enqueue.args::text)
        + octet_length(django_pgqueue_enqueue.kwargs::text);
    IF payload_size > cfg.max_payload_bytes THEN
        RAISE EXCEPTION 'args/kwargs: encoded payload is % bytes, over the limit of % bytes',
            payload_size, cfg.max_payload_bytes
            USING ERRCODE = 'QJ004',
                  HINT = 'store large data elsewhere and pass a reference (PGQUEUE_MAX_PAYLOAD_BYTES)';
    END IF;
    IF django_pgqueue_enqueue.idempotency_key = ''
        OR char_length(django_pgqueue_enqueue.idempotency_key) > 255 THEN
        RAISE EXCEPTION 'idempotency_key: must be NULL or 1 to 255 characters'
            USING ERRCODE = 'QJ002';
    END IF;
    IF django_pgqueue_enqueue.partition_key IS NOT NULL THEN
        IF django_pgqueue_enqueue.partition_key = ''
            OR char_length(django_pgqueue_enqueue.partition_key) > 255 THEN
            RAISE EXCEPTION 'partition_key: must be NULL or 1 to 255 characters'
                USING ERRCODE = 'QJ002';
        END IF;
        bucket := django_pgqueue_crc32(convert_to(django_pgqueue_enqueue.partition_key, 'UTF8')) % 1024;
    ELSE
        -- Limits from the settings, as Python resolves them (store/flow_limits.py): the
        -- task's own, else its queue's. Partitioned jobs run one at a time already.
        key_name := 'task:' || django_pgqueue_enqueue.task_path;
        key_limit := (cfg.concurrency_limits ->> key_name)::integer;
        rate := cfg.rate_limits -> key_name;
        IF key_limit IS NULL AND rate IS NULL THEN
            key_name := 'queue:' || django_pgqueue_enqueue.queue;
            key_limit := (cfg.concurrency_limits ->> key_name)::integer;
            rate := cfg.rate_limits -> key_name;
        END IF;
        IF key_limit IS NULL AND rate IS NULL THEN
            key_name := NULL;
        END IF;
    END IF;

    INSERT INTO django_pgqueue_job AS job (
        queue, task_path, args, kwargs, priority, status, attempts, max_attempts,
        lease_generation, available_at, created_at, errors, idempotency_key,
        partition_key, partition_bucket, concurrency_key, concurrency_limit,
        rate_limit, rate_period
    )
    VALUES (
        django_pgqueue_enqueue.queue, django_pgqueue_enqueue.task_path,
        django_pgqueue_enqueue.args, django_pgqueue_enqueue.kwargs,
        django_pgqueue_enqueue.priority, 'pending', 0, attempts_allowed, 0, available,
        now(), '[]'::jsonb, django_pgqueue_enqueue.idempotency_key,
        django_pgqueue_enqueue.partition_key, bucket, key_name, key_limit,
        (rate ->> 0)::integer, (rate ->> 1)::double precision
    )
    ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING job.id INTO new_id;

    IF new_id IS NULL THEN
        -- The key is taken: the existing job is the answer, as in Python.
        SELECT job.id INTO new_id FROM django_pgqueue_job AS job
        WHERE job.idempotency_key = django_pgqueue_enqueue.idempotency_key;
        RETURN new_id;
    END IF;

    IF available <= now() THEN
        PERFORM pg_notify(cfg.notify_channel, django_pgqueue_enqueue.queue);
    END IF;
    IF django_pgqueue_enqueue.partition_key IS NOT NULL THEN
        urgent := NOT EXISTS (
            SELECT 1 FROM django_pgqueue_partition AS part
            WHERE part.partition_key = django_pgqueue_enqueue.partition_key
              AND part.head_id IS NOT NULL
              AND part.head_id IS DISTINCT FROM part.running_id
        );
        INSERT INTO django_pgqueue_partition_signal (partition_key, urgent)
        VALUES (django_pgqueue_enqueue.partition_key, urgent);
        IF urgent AND available <= now() THEN
            PERFORM pg_notify(cfg.flow_channel, django_pgqueue_enqueue.queue);
        END IF;
    ELSIF key_name IS NOT NULL THEN
        urgent := NOT EXISTS (
            SELECT 1 FROM django_pgqueue_concurrency AS conc
            WHERE conc.concurrency_key = key_name
              AND conc.head_id IS NOT NULL
              AND conc.head_available_at <= now()
              AND conc.head_priority >= django_pgqueue_enqueue.priority
        );
        INSERT INTO django_pgqueue_concurrency_signal (concurrency_key, urgent)
        VALUES (key_name, urgent);
        IF urgent AND available <= now() THEN
            PERFORM pg_notify(cfg.flow_channel, django_pgqueue_enqueue.queue);
        END IF;
    END IF;
    RETURN new_id;
END
$$
"""

FUNCTION_COMMENT = (
    "COMMENT ON FUNCTION django_pgqueue_enqueue(text, jsonb, jsonb, text, integer, "
    "timestamptz, integer, text, text) IS 'django-pgqueue: enqueue a job from SQL, "
    "checked and defaulted as Python does (see docs/howto/sql-enqueue.md).'"
)


class Migration(migrations.Migration):
    dependencies = [
        ("django_pgqueue", "0016_snoozes"),
    ]

    operations = [
        migrations.CreateModel(
            name="SqlSettings",
            fields=[
                ("id", models.SmallIntegerField(default=1, primary_key=True, serialize=False)),
                (
                    "queues",
                    models.JSONField(
                        blank=True,
                        db_comment="Queue names a SQL enqueue accepts (NULL: any, as a backend "
                        "whose QUEUES is empty).",
                        null=True,
                        verbose_name="queues",
                    ),
                ),
                (
                    "max_attempts",
                    models.IntegerField(
                        db_comment="PGQUEUE_MAX_ATTEMPTS: the default of max_attempts.",
                        verbose_name="max attempts",
                    ),
                ),
                (
                    "max_payload_bytes",
                    models.IntegerField(
                        db_comment="PGQUEUE_MAX_PAYLOAD_BYTES.", verbose_name="max payload bytes"
                    ),
                ),
                (
                    "notify_channel",
                    models.CharField(
                        db_comment="PGQUEUE_NOTIFY_CHANNEL (wake-ups).",
                        max_length=63,
                        verbose_name="notify channel",
                    ),
                ),
                (
                    "flow_channel",
                    models.CharField(
                        db_comment="The channel that says a partition or key can start a job.",
                        max_length=63,
                        verbose_name="flow channel",
                    ),
                ),
                (
                    "concurrency_limits",
                    models.JSONField(
                        db_comment="PGQUEUE_CONCURRENCY_LIMITS.",
                        default=dict,
                        verbose_name="concurrency limits",
                    ),
                ),
                (
                    "rate_limits",
                    models.JSONField(
                        db_comment="PGQUEUE_RATE_LIMITS, parsed: {name: [limit, period seconds]}.",
                        default=dict,
                        verbose_name="rate limits",
                    ),
                ),
                (
                    "synced_at",
                    models.DateTimeField(
                        db_default=django.db.models.functions.datetime.Now(),
                        verbose_name="synced at",
                    ),
                ),
                (
                    "synced_by",
                    models.CharField(
                        db_comment="migrate, or the worker that wrote it.",
                        max_length=200,
                        verbose_name="synced by",
                    ),
                ),
            ],
            options={
                "verbose_name": "SQL enqueue settings",
                "verbose_name_plural": "SQL enqueue settings",
                "db_table": "django_pgqueue_sql_settings",
                "db_table_comment": "django-pgqueue: the settings django_pgqueue_enqueue() applies (one row), written by migrate and by each worker at start.",
                "constraints": [
                    models.CheckConstraint(
                        condition=models.Q(("id", 1)), name="pgq_sql_settings_one_row"
                    )
                ],
            },
        ),
        migrations.RunSQL(
            sql=[CRC32_FUNCTION, ENQUEUE_FUNCTION, FUNCTION_COMMENT],
            reverse_sql=[
                "DROP FUNCTION IF EXISTS django_pgqueue_enqueue(text, jsonb, jsonb, text, "
                "integer, timestamptz, integer, text, text)",
                "DROP FUNCTION IF EXISTS django_pgqueue_crc32(bytea)",
            ],
        ),
    ]
