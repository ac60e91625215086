"""Idempotency and coalesce keys stop relying on the job table's unique indexes.

A job table split into segments (so that a long transaction cannot keep its dead rows
forever) cannot carry ``pgq_job_idempotency_key`` or ``pgq_job_coalesce_key``: a unique
index of a partitioned table must include its partition key. This release makes both
unneeded, so that a later one can drop them; it keeps them, because the previous
release's producers name them in their ``ON CONFLICT`` clauses.

- Coalesce keys get their own table, ``django_pgqueue_coalesce_key``: a producer locks
  the key's row (making it if missing) until its transaction ends, reads the key's
  holder through the row in its next statement, and points the row at the job it
  inserts. Two producers of one key decide one after the other, as the unique index
  made them. The index stays a backstop for the previous release's producers.
- Idempotency keys have been taken in ``django_pgqueue_job_key`` by a trigger since
  0020, and this release's statements no longer name the index;
  ``django_pgqueue_enqueue`` (the SQL enqueue) loses its clause as well. Jobs enqueued
  before 0020 and still in the job table held their key in the index only: 0027 takes
  their keys.
- The trigger that takes an idempotency key (``django_pgqueue_claim_key``) now takes a
  stale key anew when housekeeping freed it while the trigger waited for its row: it
  used to insert the job with its key taken nowhere but in the unique index.

No lock is taken on the job table: the new table is created empty, and replacing a
function takes no table lock.
"""

from importlib import import_module

from django.db import migrations, models
from django.db.models.functions import Now

_rewrite = import_module("django_pgqueue.migrations.0022_refresh_by_row")._rewrite
_previous = import_module("django_pgqueue.migrations.0025_fold_keys_by_claim_order")
_moves = import_module("django_pgqueue.migrations.0020_history_moves")

ENQUEUE_FUNCTION = _rewrite(
    _previous.ENQUEUE_FUNCTION,
    [
        (
            "    ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING\n",
            "",
        )
    ],
)

# Written out rather than made by Django, which would add a "_like" index to the primary
# key: one more index to write on every new holder, which no statement reads.
KEY_TABLE = (
    "CREATE TABLE django_pgqueue_coalesce_key ("
    "coalesce_key varchar(255) PRIMARY KEY, "
    "job_id bigint NULL, "
    "checked_at timestamptz NOT NULL DEFAULT statement_timestamp())",
    "CREATE INDEX pgq_coalesce_checked ON django_pgqueue_coalesce_key (checked_at)",
    "COMMENT ON TABLE django_pgqueue_coalesce_key IS 'django-pgqueue: the pending job holding "
    "each coalesce key; written only by the queue''s SQL.'",
    "COMMENT ON COLUMN django_pgqueue_coalesce_key.job_id IS 'The job that took the key last: "
    "it holds it while it is pending with this coalesce_key (never claimed). NULL until the "
    "first producer''s job is in.'",
    "COMMENT ON COLUMN django_pgqueue_coalesce_key.checked_at IS 'When the row was made or "
    "housekeeping last found its job holding the key (housekeeping deletes a row whose job "
    "no longer holds it).'",
)

# A coalesced enqueue (enqueue_coalesced in sql/enqueue.sql calls it). A function: its
# statements each take a new snapshot after the key's row is locked (so a second
# producer sees the job the first one committed), it is one round trip without a
# savepoint, and its plans are kept for the session. The section between "begin
# backstop" and "end backstop" is for the previous release's producers, which insert
# holders the key's row does not name (pgq_job_coalesce_key decides against them); the
# release that drops the index drops it.
ENQUEUE_COALESCED = """
CREATE OR REPLACE FUNCTION django_pgqueue_enqueue_coalesced(
    queue text, task_path text, args jsonb, kwargs jsonb, priority integer,
    max_attempts integer, available_at timestamptz, debounce_seconds double precision,
    coalesce_key text, partition_key text, partition_bucket integer, traceparent text,
    concurrency_key text, concurrency_limit integer, rate_limit integer,
    rate_period double precision, channel text, flow_channel text
)
RETURNS TABLE (job django_pgqueue_job, created boolean, notified integer)
LANGUAGE plpgsql
VOLATILE
AS $function$
#variable_conflict use_column
DECLARE
    held django_pgqueue_job%ROWTYPE;
    named bigint;
    new_id bigint;
    is_new boolean := false;
    urgent boolean;
    woke integer := 0;
    start timestamptz := GREATEST(
        COALESCE(django_pgqueue_enqueue_coalesced.available_at, now()),
        now() + make_interval(
            secs => COALESCE(django_pgqueue_enqueue_coalesced.debounce_seconds, 0)
        )
    );
BEGIN
    -- Lock the key's row, making it if missing, until the transaction ends; DO UPDATE
    -- ... WHERE false locks it without writing it.
    INSERT INTO django_pgqueue_coalesce_key AS taken (coalesce_key)
    VALUES (django_pgqueue_enqueue_coalesced.coalesce_key)
    ON CONFLICT (coalesce_key) DO UPDATE SET job_id = taken.job_id WHERE false;
    -- The job the row names holds the key while it is pending with it. IS NOT DISTINCT
    -- FROM: by primary key, never the key's entries in pgq_job_coalesce_key (every
    -- earlier holder's, while a long transaction holds a snapshot). A claim that locked
    -- it makes FOR UPDATE wait, then find it no longer pending.
    -- The row's newest version first, as a range read backward (migration 0023): every
    -- holder it named left a version, which a held snapshot keeps.
    SELECT taken.job_id INTO named
    FROM django_pgqueue_coalesce_key AS taken
    WHERE taken.coalesce_key >= django_pgqueue_enqueue_coalesced.coalesce_key
      AND taken.coalesce_key <= django_pgqueue_enqueue_coalesced.coalesce_key
    ORDER BY taken.coalesce_key DESC
    LIMIT 1;
    SELECT * INTO held
    FROM django_pgqueue_job AS pending
    WHERE pending.id = named
      AND pending.coalesce_key IS NOT DISTINCT FROM django_pgqueue_enqueue_coalesced.coalesce_key
      AND pending.status = 'pending'
    FOR UPDATE;
    IF FOUND THEN
        IF held.task_path IS DISTINCT FROM django_pgqueue_enqueue_coalesced.task_path THEN
            -- Another task's job holds the key: returned unchanged.
            RETURN QUERY SELECT held, false, 0;
            RETURN;
        END IF;
        UPDATE django_pgqueue_job AS pending
        SET args = django_pgqueue_enqueue_coalesced.args,
            kwargs = django_pgqueue_enqueue_coalesced.kwargs,
            available_at = CASE
                WHEN django_pgqueue_enqueue_coalesced.debounce_seconds IS NULL
                    THEN pending.available_at
                ELSE GREATEST(pending.available_at, start)
            END
        WHERE pending.id = held.id
        RETURNING * INTO held;
    ELSE
        INSERT INTO django_pgqueue_job AS pending (
            queue, task_path, args, kwargs, priority, status, attempts, max_attempts,
            lease_generation, available_at, created_at, errors, idempotency_key,
            partition_key, partition_bucket, traceparent, coalesce_key, concurrency_key,
            concurrency_limit, rate_limit, rate_period
        )
        VALUES (
            django_pgqueue_enqueue_coalesced.queue,
            django_pgqueue_enqueue_coalesced.task_path,
            django_pgqueue_enqueue_coalesced.args, django_pgqueue_enqueue_coalesced.kwargs,
            django_pgqueue_enqueue_coalesced.priority, 'pending', 0,
            django_pgqueue_enqueue_coalesced.max_attempts, 0, start, now(), '[]'::jsonb,
            NULL, django_pgqueue_enqueue_coalesced.partition_key,
            django_pgqueue_enqueue_coalesced.partition_bucket,
            django_pgqueue_enqueue_coalesced.traceparent,
            django_pgqueue_enqueue_coalesced.coalesce_key,
            django_pgqueue_enqueue_coalesced.concurrency_key,
            django_pgqueue_enqueue_coalesced.concurrency_limit,
            django_pgqueue_enqueue_coalesced.rate_limit,
            django_pgqueue_enqueue_coalesced.rate_period
        )
        -- begin backstop
        ON CONFLICT (coalesce_key) WHERE status = 'pending' AND coalesce_key IS NOT NULL
        DO UPDATE SET
            args = EXCLUDED.args,
            kwargs = EXCLUDED.kwargs,
            available_at = CASE
                WHEN django_pgqueue_enqueue_coalesced.debounce_seconds IS NULL
                    THEN pending.available_at
                ELSE GREATEST(pending.available_at, EXCLUDED.available_at)
            END
        WHERE pending.task_path = EXCLUDED.task_path
        -- end backstop
        RETURNING pending.id, pending.xmax = 0 INTO new_id, is_new;
        IF new_id IS NULL THEN
            -- (The backstop's) another task's job holds the key: returned unchanged.
            SELECT * INTO held
            FROM django_pgqueue_job AS pending
            WHERE pending.coalesce_key = django_pgqueue_enqueue_coalesced.coalesce_key
              AND pending.status = 'pending';
            RETURN QUERY SELECT held, false, 0;
            RETURN;
        END IF;
        SELECT * INTO held FROM django_pgqueue_job AS pending WHERE pending.id = new_id;
        -- job_id alone, no indexed column: the update can stay on the row's page
        -- (HOT), adding no index entry for later lookups to walk.
        UPDATE django_pgqueue_coalesce_key AS taken
        SET job_id = new_id
        WHERE taken.coalesce_key >= django_pgqueue_enqueue_coalesced.coalesce_key
          AND taken.coalesce_key <= django_pgqueue_enqueue_coalesced.coalesce_key;
    END IF;

    IF held.available_at <= now() THEN
        PERFORM pg_notify(django_pgqueue_enqueue_coalesced.channel, held.queue);
        woke := 1;
    END IF;
    -- A new job's partition or key needs its row refreshed by the next claim (urgent)
    -- or only if the row changes before this commits (lazy), as in sql/enqueue.sql; a
    -- pending job whose start a debounce moved is signalled by the triggers on
    -- available_at of migrations 0004 and 0011. Newest version first (0023).
    IF is_new AND held.partition_key IS NOT NULL THEN
        urgent := NOT COALESCE((
            SELECT part.head_id IS NOT NULL
                AND part.head_id IS DISTINCT FROM part.running_id
            FROM django_pgqueue_partition AS part
            WHERE part.partition_key >= held.partition_key
              AND part.partition_key <= held.partition_key
            ORDER BY part.partition_key DESC
            LIMIT 1
        ), false);
        INSERT INTO django_pgqueue_partition_signal (partition_key, urgent, job_id)
        VALUES (held.partition_key, urgent, held.id);
        IF urgent AND held.available_at <= now() THEN
            PERFORM pg_notify(django_pgqueue_enqueue_coalesced.flow_channel, held.queue);
            woke := woke + 1;
        END IF;
    END IF;
    IF is_new AND held.concurrency_key IS NOT NULL THEN
        urgent := NOT COALESCE((
            SELECT (
                conc.head_id IS NOT NULL
                AND conc.head_available_at <= now()
                AND conc.head_priority >= held.priority
            ) IS TRUE
            FROM django_pgqueue_concurrency AS conc
            WHERE conc.concurrency_key >= held.concurrency_key
              AND conc.concurrency_key <= held.concurrency_key
            ORDER BY conc.concurrency_key DESC
            LIMIT 1
        ), false);
        INSERT INTO django_pgqueue_concurrency_signal (concurrency_key, urgent, job_id)
        VALUES (held.concurrency_key, urgent, held.id);
        IF urgent AND held.available_at <= now() THEN
            PERFORM pg_notify(django_pgqueue_enqueue_coalesced.flow_channel, held.queue);
            woke := woke + 1;
        END IF;
    END IF;
    RETURN QUERY SELECT held, is_new, woke;
END
$function$;
COMMENT ON FUNCTION django_pgqueue_enqueue_coalesced(
    text, text, jsonb, jsonb, integer, integer, timestamptz, double precision, text, text,
    integer, text, text, integer, integer, double precision, text, text
) IS 'django-pgqueue: insert a coalesced job, or update the pending job holding its key (0026)';
"""
DROP_ENQUEUE_COALESCED = """
DROP FUNCTION django_pgqueue_enqueue_coalesced(
    text, text, jsonb, jsonb, integer, integer, timestamptz, double precision, text, text,
    integer, text, text, integer, integer, double precision, text, text
)
"""

# As in 0020, plus the loop: housekeeping (free_idempotency_keys) deletes a stale key
# while holding its row's lock, so the UPDATE that waited for it finds no row; the key
# is then free, and taken anew.
CLAIM_KEY = """
CREATE OR REPLACE FUNCTION django_pgqueue_claim_key() RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    LOOP
        INSERT INTO django_pgqueue_job_key (idempotency_key)
        VALUES (NEW.idempotency_key)
        ON CONFLICT (idempotency_key) DO NOTHING;
        IF FOUND THEN
            RETURN NEW;
        END IF;
        IF django_pgqueue_key_held(NEW.idempotency_key) THEN
            RETURN NULL;
        END IF;
        -- A stale key. Locking its row makes two producers taking it over decide one
        -- after the other; the second then sees the first's job (a new snapshot).
        UPDATE django_pgqueue_job_key AS taken
        SET checked_at = now()
        WHERE taken.idempotency_key = NEW.idempotency_key;
        IF FOUND THEN
            IF django_pgqueue_key_held(NEW.idempotency_key) THEN
                RETURN NULL;
            END IF;
            RETURN NEW;
        END IF;
    END LOOP;
END
$$
"""


class Migration(migrations.Migration):
    dependencies = [("django_pgqueue", "0025_fold_keys_by_claim_order")]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[
                migrations.RunSQL(
                    sql=KEY_TABLE, reverse_sql="DROP TABLE django_pgqueue_coalesce_key"
                )
            ],
            state_operations=[
                migrations.CreateModel(
                    name="CoalesceKey",
                    fields=[
                        (
                            "coalesce_key",
                            models.CharField(
                                max_length=255,
                                primary_key=True,
                                serialize=False,
                                verbose_name="coalesce key",
                            ),
                        ),
                        (
                            "job_id",
                            models.BigIntegerField(
                                db_comment="The job that took the key last: it holds it while it is "
                                "pending with this coalesce_key (never claimed). NULL until the first "
                                "producer's job is in.",
                                null=True,
                                verbose_name="job",
                            ),
                        ),
                        (
                            "checked_at",
                            models.DateTimeField(
                                db_comment="When the row was made or housekeeping last found its "
                                "job holding the key (housekeeping deletes a row whose job no longer "
                                "holds it).",
                                db_default=Now(),
                                verbose_name="last checked at",
                            ),
                        ),
                    ],
                    options={
                        "verbose_name": "coalesce key",
                        "verbose_name_plural": "coalesce keys",
                        "db_table": "django_pgqueue_coalesce_key",
                        "db_table_comment": "django-pgqueue: the pending job holding each coalesce key; "
                        "written only by the queue's SQL.",
                        "indexes": [
                            models.Index(fields=["checked_at"], name="pgq_coalesce_checked")
                        ],
                    },
                ),
            ],
        ),
        migrations.RunSQL(sql=ENQUEUE_FUNCTION, reverse_sql=_previous.ENQUEUE_FUNCTION),
        migrations.RunSQL(sql=ENQUEUE_COALESCED, reverse_sql=DROP_ENQUEUE_COALESCED),
        migrations.RunSQL(
            sql=CLAIM_KEY,
            reverse_sql=_moves.CLAIM_KEY.replace(
                "CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1
            ),
        ),
    ]
