"""Flow control: paused queues, and the coalesce key of pending jobs.

The pause table is new and small (one row per paused queue, read by every claim through
its primary key). The job table gets a nullable column without a default (catalog only,
no rewrite) and a UNIQUE partial index over pending jobs that carry a coalesce key,
built CONCURRENTLY through ``EnsureIndexConcurrently`` (so the migration is not atomic:
if the build is interrupted, running ``migrate`` again rebuilds it). The index holds only
pending coalesced jobs: a few rows, none at all for plain jobs.
"""

import django.db.models.functions.datetime
from django.db import migrations, models

import django_pgqueue.schema


class Migration(migrations.Migration):
    atomic = False

    dependencies = [("django_pgqueue", "0009_dependencies")]

    operations = [
        migrations.CreateModel(
            name="QueuePause",
            fields=[
                (
                    "queue",
                    models.CharField(
                        max_length=100, primary_key=True, serialize=False, verbose_name="queue"
                    ),
                ),
                (
                    "paused_at",
                    models.DateTimeField(
                        db_default=django.db.models.functions.datetime.Now(),
                        verbose_name="paused at",
                    ),
                ),
                (
                    "paused_by",
                    models.CharField(
                        blank=True, default="", max_length=150, verbose_name="paused by"
                    ),
                ),
                ("reason", models.TextField(blank=True, default="", verbose_name="reason")),
            ],
            options={
                "verbose_name": "queue pause",
                "verbose_name_plural": "queue pauses",
                "db_table": "django_pgqueue_queue_pause",
                "db_table_comment": "django-pgqueue paused queues; the claim skips them.",
                "ordering": ("queue",),
            },
        ),
        migrations.AddField(
            model_name="job",
            name="coalesce_key",
            field=models.CharField(
                blank=True,
                db_comment="While the job is pending, enqueueing with this key returns it "
                "instead of inserting another (pgq_job_coalesce_key).",
                max_length=255,
                null=True,
                verbose_name="coalesce key",
            ),
        ),
        django_pgqueue.schema.EnsureIndexConcurrently(
            "job",
            models.Index(
                condition=models.Q(("status", "pending"), ("coalesce_key__isnull", False)),
                fields=["coalesce_key"],
                name="pgq_job_coalesce_key",
            ),
            sql=(
                'CREATE UNIQUE INDEX CONCURRENTLY "pgq_job_coalesce_key" '
                'ON "django_pgqueue_job" ("coalesce_key") '
                "WHERE status = 'pending' AND coalesce_key IS NOT NULL"
            ),
            comment="enqueue_coalesced: at most one pending job per coalesce key",
        ),
    ]
