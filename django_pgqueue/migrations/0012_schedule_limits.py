"""Periodic fires carry their task's flow limits.

Four nullable columns without defaults on the schedule table (catalog only, no rewrite,
a table of a few rows). Workers write them when they sync the schedules; until a worker
of this release has synced, a schedule's fires carry no limit, as before.
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("django_pgqueue", "0011_flow_limits"),
    ]

    operations = [
        migrations.AddField(
            model_name="schedule",
            name="concurrency_key",
            field=models.CharField(
                blank=True,
                db_comment="The fired jobs' concurrency key (from the task or settings).",
                max_length=255,
                null=True,
                verbose_name="concurrency key",
            ),
        ),
        migrations.AddField(
            model_name="schedule",
            name="concurrency_limit",
            field=models.IntegerField(blank=True, null=True, verbose_name="concurrency limit"),
        ),
        migrations.AddField(
            model_name="schedule",
            name="rate_limit",
            field=models.IntegerField(blank=True, null=True, verbose_name="rate limit"),
        ),
        migrations.AddField(
            model_name="schedule",
            name="rate_period",
            field=models.FloatField(
                blank=True,
                db_comment="Seconds of the rate limit's period.",
                null=True,
                verbose_name="rate period",
            ),
        ),
    ]
