"""The lazy folds lock their rows in key order, so they no longer deadlock.

Every statement that locks several partition rows (or concurrency-key rows) takes them
in key order, so two of them can wait on each other only one way. The lazy folds of
migration 0015 (housekeeping's ``fold_lazy_signals``) did not: a row that no longer named
a next job was not locked in the first pass, only later by the refresh, after rows of
greater keys; and a key without a row was created by the refresh the same way. Beside an
urgent fold or a completion batch refreshing the same partitions, that deadlocked:
measured on a queue of 1,000 partitions, 21 deadlocks in its first 30 seconds, each
costing the waiters ``deadlock_timeout`` and one side its statement (retried).

Both folds now lock (or create, then lock) every row they were given, in key order,
before looking at it, as the refresh functions themselves do; what they then pass to the
refresh is already locked by their own transaction. Same signatures: workers of the
previous release call the fixed functions as soon as this migration has run.
"""

from django.db import migrations

FOLD_FUNCTIONS = """
CREATE OR REPLACE FUNCTION django_pgqueue_fold_partitions(keys text[])
RETURNS integer
LANGUAGE plpgsql
VOLATILE
AS $function$
DECLARE
    partition text;
    current record;
    stale text[] := '{}';
BEGIN
    FOR partition IN
        SELECT DISTINCT wanted.key FROM unnest(keys) AS wanted (key)
        WHERE wanted.key IS NOT NULL
        ORDER BY 1
    LOOP
        -- Every row locked here, in key order, even one that is stale (a missing one
        -- created first): the refresh below then waits on none (a lock taken there
        -- would come after rows of greater keys locked here).
        LOOP
            SELECT part.head_id, part.running_id
            INTO current
            FROM django_pgqueue_partition AS part
            WHERE part.partition_key = partition
            FOR UPDATE;
            EXIT WHEN FOUND;
            INSERT INTO django_pgqueue_partition (partition_key, refreshed_at)
            VALUES (partition, now())
            ON CONFLICT (partition_key) DO NOTHING;
        END LOOP;
        -- A claim leaves head_id on the job it started: only another one is a next job.
        IF current.head_id IS NULL OR current.head_id IS NOT DISTINCT FROM current.running_id
        THEN
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
        -- As above: every row locked (a missing one created) in key order first.
        LOOP
            SELECT conc.in_flight, conc.max_in_flight, conc.head_id, conc.head_available_at
            INTO current
            FROM django_pgqueue_concurrency AS conc
            WHERE conc.concurrency_key = key
            FOR UPDATE;
            EXIT WHEN FOUND;
            INSERT INTO django_pgqueue_concurrency (concurrency_key, refreshed_at)
            VALUES (key, now())
            ON CONFLICT (concurrency_key) DO NOTHING;
        END LOOP;
        IF NOT (
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


def _previous_folds() -> str:
    from importlib import import_module

    return str(import_module("django_pgqueue.migrations.0015_composition").FOLD_FUNCTIONS)


class Migration(migrations.Migration):
    dependencies = [("django_pgqueue", "0020_history_moves")]

    operations = [
        migrations.RunSQL(sql=FOLD_FUNCTIONS, reverse_sql=_previous_folds()),
    ]
