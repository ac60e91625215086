"""The admin filters' BRIN index with smaller bloom summaries, so each job pays less.

``pgq_job_filter_brin`` summarises each 16-page range of the job table with one bloom
filter per text column. PostgreSQL sizes them by default for a tenth of the most rows a
range can hold (about 460 distinct values: some 560 bytes each, stored compressed), and
every new row version (an enqueue, a claim, a completion) brings its range's summary
into memory, checks it and may rewrite it. Measured with hand-written lifecycle
statements on a vacuumed table, that made the index a quarter to two fifths of the
server's work per job. A range holds a few hundred rows of a few queues and tasks:
sized for 16 queues, 32 task paths and 32 partition keys per range (1% false positives
at those counts), the filters are about 100 bytes in all and the index costs little. A range holding more distinct values than that
still answers correctly; the filter just reads more ranges (BRIN rechecks every row).

Built beside the old index with CREATE INDEX CONCURRENTLY, then the old one is dropped
concurrently and the new one takes its name: the admin always has one of the two, and
enqueues and workers never wait for either (SHARE UPDATE EXCLUSIVE on the table only).
Not atomic: no lock outlives its own step. An interrupted build leaves an INVALID index,
which running ``migrate`` again replaces (W002 names it).
"""

from django.db import migrations

import django_pgqueue.models
import django_pgqueue.schema

COMMENT = "admin inbox filters: queue, task, partition key (bloom), available_at ranges"
OPCLASSES = [
    "text_bloom_ops(n_distinct_per_range = 16)",
    "text_bloom_ops(n_distinct_per_range = 32)",
    "text_bloom_ops(n_distinct_per_range = 32)",
    "timestamptz_minmax_multi_ops",
]


class Migration(migrations.Migration):
    atomic = False

    dependencies = [("django_pgqueue", "0012_schedule_limits")]

    operations = [
        django_pgqueue.schema.EnsureIndexConcurrently(
            "job",
            django_pgqueue.models.BrinIndex(
                fields=["queue", "task_path", "partition_key", "available_at"],
                name="pgq_job_filter_small",
                opclasses=OPCLASSES,
            ),
            sql='CREATE INDEX CONCURRENTLY "pgq_job_filter_small" ON "django_pgqueue_job" '
            'USING brin ("queue" text_bloom_ops(n_distinct_per_range = 16), '
            '"task_path" text_bloom_ops(n_distinct_per_range = 32), '
            '"partition_key" text_bloom_ops(n_distinct_per_range = 32), '
            '"available_at" timestamptz_minmax_multi_ops) WITH (pages_per_range = 16)',
            comment=COMMENT,
        ),
        # Reversed, the old index is rebuilt as 0003 made it (pages_per_range included).
        django_pgqueue.schema.RemoveIndexConcurrentlyExactly(
            "job",
            "pgq_job_filter_brin",
            sql='CREATE INDEX CONCURRENTLY "pgq_job_filter_brin" ON "django_pgqueue_job" '
            'USING brin ("queue" text_bloom_ops, "task_path" text_bloom_ops, '
            '"partition_key" text_bloom_ops, "available_at" timestamptz_minmax_multi_ops) '
            "WITH (pages_per_range = 16)",
            comment=COMMENT,
        ),
        migrations.RenameIndex(
            model_name="job", new_name="pgq_job_filter_brin", old_name="pgq_job_filter_small"
        ),
    ]
