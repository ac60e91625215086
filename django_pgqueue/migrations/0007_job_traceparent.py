"""The job's trace context: the W3C traceparent of the span that enqueued it.

A nullable column without a default: PostgreSQL adds it to the catalog only (no table
rewrite, no index), holding the ACCESS EXCLUSIVE lock for an instant. Older workers
ignore it; older producers leave it NULL.
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("django_pgqueue", "0006_lag_page")]

    operations = [
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
    ]
