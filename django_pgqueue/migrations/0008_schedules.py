"""Periodic schedules: one row per declared schedule, synced from code at worker start.

A new, small table: its index is built plainly. The job table is not touched (a
scheduled job's fire time lives in its idempotency key, which is already indexed).
"""

import django.db.models.functions.datetime
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("django_pgqueue", "0007_job_traceparent"),
    ]

    operations = [
        migrations.CreateModel(
            name="Schedule",
            fields=[
                (
                    "name",
                    models.CharField(
                        max_length=150, primary_key=True, serialize=False, verbose_name="name"
                    ),
                ),
                ("task_path", models.CharField(max_length=255, verbose_name="task")),
                ("queue", models.CharField(max_length=100, verbose_name="queue")),
                ("priority", models.SmallIntegerField(verbose_name="priority")),
                ("max_attempts", models.IntegerField(verbose_name="max attempts")),
                ("args", models.JSONField(default=list, verbose_name="positional arguments")),
                ("kwargs", models.JSONField(default=dict, verbose_name="keyword arguments")),
                ("expression", models.CharField(max_length=200, verbose_name="expression")),
                ("description", models.CharField(max_length=500, verbose_name="when")),
                ("timezone", models.CharField(max_length=64, verbose_name="timezone")),
                ("downtime", models.CharField(max_length=16, verbose_name="after downtime")),
                ("catch_up", models.SmallIntegerField(verbose_name="catch up at most")),
                (
                    "timing",
                    models.CharField(
                        db_comment="Fingerprint of expression and timezone: a change moves next_fire_at.",
                        max_length=32,
                    ),
                ),
                ("next_fire_at", models.DateTimeField(verbose_name="next fire")),
                (
                    "last_fire_at",
                    models.DateTimeField(blank=True, null=True, verbose_name="last fire"),
                ),
                (
                    "paused_at",
                    models.DateTimeField(blank=True, null=True, verbose_name="paused at"),
                ),
                (
                    "created_at",
                    models.DateTimeField(
                        db_default=django.db.models.functions.datetime.Now(),
                        verbose_name="created at",
                    ),
                ),
                (
                    "updated_at",
                    models.DateTimeField(
                        db_default=django.db.models.functions.datetime.Now(),
                        verbose_name="updated at",
                    ),
                ),
            ],
            options={
                "verbose_name": "schedule",
                "verbose_name_plural": "schedules",
                "db_table": "django_pgqueue_schedule",
                "db_table_comment": "django-pgqueue periodic schedules; synced from code by workers.",
                "ordering": ("name",),
                "indexes": [
                    models.Index(
                        condition=models.Q(("paused_at__isnull", True)),
                        fields=["next_fire_at"],
                        name="pgq_schedule_due",
                    )
                ],
                "constraints": [
                    models.CheckConstraint(
                        condition=models.Q(("downtime__in", ["latest", "skip", "catch_up"])),
                        name="pgq_schedule_downtime_valid",
                    )
                ],
            },
        ),
    ]
