"""The lazy fold refreshes a key whose row no longer names its best ready job.

A producer leaves a lazy concurrency signal when the key's row already names a ready
next job of the same priority or higher. If the producer's transaction commits after
that job started, the refresh that followed could not see the new job, and named a
lower-priority one instead. The fold skipped every row naming a ready next job, so the
key kept competing with the claim at that lower priority: a claim reads the keys of a
queue in the order of the next job their rows name (``pgq_concurrency_claim``, at most
its per-queue limit of them), and the new job waited behind other keys' lower-priority
jobs until its key was taken from or refreshed again.

``django_pgqueue_fold_concurrency`` now also looks, under the row's lock (a new
statement, so it sees every job committed before the lock), for the key's best ready
job in claim order (``pgq_job_conc_pending``: one index probe), and refreshes the key
when that is not the job its row names. A key at its limit is still skipped: the
completion that frees a slot refreshes it. Concurrency signals name no job, unlike
partition signals since 0024, so the fold asks the job table; it runs in housekeeping,
off the claim's path.

Same signature: workers of the previous release call the fixed function as soon as this
migration has run.
"""

from importlib import import_module

from django.db import migrations

_rewrite = import_module("django_pgqueue.migrations.0022_refresh_by_row")._rewrite
_newest = import_module("django_pgqueue.migrations.0023_newest_version_first")

_START = "CREATE OR REPLACE FUNCTION django_pgqueue_fold_concurrency"

#: The function as migration 0023 left it (the partitions' one-argument fold, defined
#: in the same text, does not change).
PREVIOUS = _newest.FOLD_FUNCTIONS[_newest.FOLD_FUNCTIONS.index(_START) :]

FOLD_CONCURRENCY = _rewrite(
    PREVIOUS,
    [
        ("    current record;\n", "    current record;\n    best bigint;\n"),
        (
            """        IF NOT (
            current.in_flight >= current.max_in_flight
            OR (current.head_id IS NOT NULL AND current.head_available_at <= now())
        ) THEN
            stale := stale || key;
        END IF;
""",
            """        IF current.in_flight >= current.max_in_flight THEN
            -- At its limit: the completion that frees a slot refreshes the key.
            CONTINUE;
        END IF;
        IF current.head_id IS NULL OR current.head_available_at > now() THEN
            stale := stale || key;
            CONTINUE;
        END IF;
        -- The row names a ready job: is it still the key's best? A job whose
        -- producer committed after the refresh that named this one was not seen by
        -- it (migration 0025). pgq_job_conc_pending, in claim order, as the refresh
        -- reads it.
        SELECT job.id INTO best
        FROM django_pgqueue_job AS job
        WHERE job.concurrency_key = key
          AND job.status = 'pending'
          AND COALESCE(job.available_at, now()) <= now()
        ORDER BY job.priority DESC, job.available_at, job.id
        LIMIT 1;
        IF best IS DISTINCT FROM current.head_id THEN
            stale := stale || key;
        END IF;
""",
        ),
    ],
)


class Migration(migrations.Migration):
    dependencies = [("django_pgqueue", "0024_refresh_from_bounds")]

    operations = [
        migrations.RunSQL(sql=FOLD_CONCURRENCY, reverse_sql=PREVIOUS),
    ]
