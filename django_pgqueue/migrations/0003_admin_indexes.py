"""Indexes for the admin pages: dead letters and cancelled jobs, and the inbox filters.

Built with CREATE INDEX CONCURRENTLY (hence ``atomic = False``): a plain CREATE INDEX
blocks every insert and update of the job table while it reads the whole table, which on
a busy queue stops all enqueueing and every worker for that long. The model state gets
the Index objects; the SQL adds what Django's Index cannot say (the BRIN index's
pages_per_range) and comments for DBAs, as in 0002.

A concurrent build that fails or is cancelled leaves an INVALID index behind;
``EnsureIndexConcurrently`` drops and rebuilds it when this migration runs again.
"""

from django.db import migrations, models

import django_pgqueue.models
from django_pgqueue.schema import EnsureIndexConcurrently

INDEXES = [
    (
        models.Index(
            condition=models.Q(("status__in", ["dead_letter", "cancelled"])),
            fields=["status", "id"],
            name="pgq_job_revivable",
        ),
        'CREATE INDEX CONCURRENTLY "pgq_job_revivable" ON "django_pgqueue_job" '
        '("status", "id") WHERE "status" IN (\'dead_letter\', \'cancelled\')',
        "admin: dead letters or cancelled jobs, newest first (inbox, dead letters, retry)",
    ),
    (
        models.Index(
            condition=models.Q(("status", "dead_letter")),
            fields=["queue", "id"],
            name="pgq_job_dead_queue",
        ),
        'CREATE INDEX CONCURRENTLY "pgq_job_dead_queue" ON "django_pgqueue_job" '
        '("queue", "id") WHERE "status" = \'dead_letter\'',
        "admin: dead letters per queue (lag page, dead letters filtered by queue)",
    ),
    (
        django_pgqueue.models.BrinIndex(
            fields=["queue", "task_path", "partition_key", "available_at"],
            name="pgq_job_filter_brin",
            opclasses=[
                "text_bloom_ops",
                "text_bloom_ops",
                "text_bloom_ops",
                "timestamptz_minmax_multi_ops",
            ],
        ),
        # 16 pages per range: a value found in a few rows spread over the table reads a
        # few hundred pages instead of thousands; the index stays a few MB per million rows.
        'CREATE INDEX CONCURRENTLY "pgq_job_filter_brin" ON "django_pgqueue_job" '
        'USING brin ("queue" text_bloom_ops, "task_path" text_bloom_ops, '
        '"partition_key" text_bloom_ops, "available_at" timestamptz_minmax_multi_ops) '
        "WITH (pages_per_range = 16)",
        "admin inbox filters: queue, task, partition key (bloom), available_at ranges",
    ),
]


class Migration(migrations.Migration):
    atomic = False

    dependencies = [("django_pgqueue", "0002_storage_parameters")]

    operations = [
        EnsureIndexConcurrently("job", index, sql=create, comment=comment)
        for index, create, comment in INDEXES
    ]
