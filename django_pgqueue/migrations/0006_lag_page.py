"""The lag page gets an entry in the admin index and sidebar: a proxy model, no table."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("django_pgqueue", "0005_unknown_task_index"),
    ]

    operations = [
        migrations.CreateModel(
            name="Lag",
            fields=[],
            options={
                "verbose_name": "queue lag",
                "verbose_name_plural": "queue lag",
                "proxy": True,
                "indexes": [],
                "constraints": [],
            },
            bases=("django_pgqueue.job",),
        ),
    ]
