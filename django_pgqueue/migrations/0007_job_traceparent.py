"""The job's trace context: the W3C traceparent of the span that enqueued it.

A nullable column without a default: PostgreSQL adds it to the catalog only (no table
rewrite, no index), holding the ACCESS EXCLUSIVE lock for an instant. Older workers
ignore it; older producers leave it NULL.

The lock is waited for at most five seconds (SET LOCAL lock_timeout, this migration's
transaction only): queued behind a long transaction on the job table, it would stop
every claim and enqueue meanwhile. Past it the migration fails, changes nothing, and can
be run again.
"""

from django.db import migrations, models

#: The longest this migration waits for the job table's lock.
LOCK_TIMEOUT = "SET LOCAL lock_timeout = '5s'"


class Migration(migrations.Migration):
    dependencies = [("django_pgqueue", "0006_lag_page")]

    operations = [
        migrations.RunSQL(sql=LOCK_TIMEOUT, reverse_sql=migrations.RunSQL.noop),
        migrations.AddField(
            model_name="job",
            name="traceparent",
            field=models.TextField(
                blank=True,
                db_comment="W3C traceparent of the span that enqueued the job (OpenTelemetry); "
                "each attempt's span links to it.",
                null=True,
                verbose_name="trace parent",
            ),
        ),
        # Reversed first: the same bound on the lock wait when migrating back.
        migrations.RunSQL(sql=migrations.RunSQL.noop, reverse_sql=LOCK_TIMEOUT),
    ]
