"""The index behind the admin's count of jobs waiting for a worker that knows their task.

Built CONCURRENTLY (no write is blocked) through ``EnsureIndexConcurrently``: if the
build is interrupted, running ``migrate`` again drops the INVALID leftover and rebuilds.
It holds only pending jobs that no worker could import the task of: a few rows at most.
"""

from django.db import migrations, models

import django_pgqueue.schema


class Migration(migrations.Migration):
    atomic = False

    dependencies = [("django_pgqueue", "0004_partition_state")]

    operations = [
        django_pgqueue.schema.EnsureIndexConcurrently(
            "job",
            models.Index(
                condition=models.Q(("status", "pending"), ("unknown_task_since__isnull", False)),
                fields=["queue"],
                name="pgq_job_unknown_task",
            ),
            comment="admin: pending jobs waiting for a worker that knows their task",
        ),
    ]
