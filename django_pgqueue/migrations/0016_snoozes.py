"""Snooze: ``job.snoozes`` counts the times a handler asked to run again later.

An integer column with a constant default: PostgreSQL 11+ stores the default in the
catalog (no table rewrite, no index), holding the ACCESS EXCLUSIVE lock for an instant.
Workers of the previous release never snooze and ignore the column; their producers'
rows get the default. The comment on ``errors`` changes with plain ``COMMENT ON``:
Django's AlterField would also run ``ALTER COLUMN ... TYPE jsonb``, which takes the
table's ACCESS EXCLUSIVE lock for a no-op.

The lock is waited for at most five seconds (SET LOCAL lock_timeout, this migration's
transaction only): queued behind a long transaction on the job table, it would stop
every claim and enqueue meanwhile. Past it the migration fails, changes nothing, and can
be run again.
"""

from django.db import migrations, models

#: The longest this migration waits for the job table's lock.
LOCK_TIMEOUT = "SET LOCAL lock_timeout = '5s'"

ERRORS_COMMENT = (
    "One object per failed attempt (class, message, traceback, worker, at) "
    "or snoozed one (snoozed: seconds, worker, at)."
)
OLD_ERRORS_COMMENT = "One object per failed attempt: class, message, traceback, worker, at."


class Migration(migrations.Migration):
    dependencies = [("django_pgqueue", "0015_composition")]

    operations = [
        migrations.RunSQL(sql=LOCK_TIMEOUT, reverse_sql=migrations.RunSQL.noop),
        migrations.AddField(
            model_name="job",
            name="snoozes",
            field=models.IntegerField(
                db_comment="Times the job's handler asked to run again later (Snooze) without "
                "using an attempt; capped by the task's max_snoozes.",
                db_default=0,
                verbose_name="snoozes",
            ),
        ),
        migrations.RunSQL(
            sql=[("COMMENT ON COLUMN django_pgqueue_job.errors IS %s", [ERRORS_COMMENT])],
            reverse_sql=[
                ("COMMENT ON COLUMN django_pgqueue_job.errors IS %s", [OLD_ERRORS_COMMENT])
            ],
            state_operations=[
                migrations.AlterField(
                    model_name="job",
                    name="errors",
                    field=models.JSONField(
                        db_comment=ERRORS_COMMENT, default=list, verbose_name="error history"
                    ),
                ),
            ],
        ),
        # Reversed first: the same bound on the lock wait when migrating back.
        migrations.RunSQL(sql=migrations.RunSQL.noop, reverse_sql=LOCK_TIMEOUT),
    ]
