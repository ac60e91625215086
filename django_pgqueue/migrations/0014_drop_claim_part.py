"""Drop ``pgq_job_claim_part``, an index no statement reads any more.

It once let the claim find a queue's ready partitioned jobs in claim order. Since 0004
the claim finds them through the partition table (one row per partition, naming its
head job) and reads each head by primary key, so nothing scans this index, and the
statement-plan tests forbid any statement to. Every enqueue, retry and release of a
partitioned job still wrote to it. On PostgreSQL 15, a plain INSERT of 1,000 partitioned
jobs per statement went from 45,700 to 65,500 rows/s without it; through
``Job.objects.enqueue_many`` (1,000 per call), where Python's per-job work dominates,
from 13,500 to 14,000 jobs/s.

DROP INDEX CONCURRENTLY: enqueues and workers never wait. Not atomic, so no lock
outlives its own step. Reversed, the index is rebuilt concurrently as 0001 made it,
with the comment 0002 gave it.
"""

from django.db import migrations

import django_pgqueue.schema


class Migration(migrations.Migration):
    atomic = False

    dependencies = [("django_pgqueue", "0013_small_filter_brin")]

    operations = [
        django_pgqueue.schema.RemoveIndexConcurrentlyExactly(
            "job",
            "pgq_job_claim_part",
            sql='CREATE INDEX CONCURRENTLY "pgq_job_claim_part" ON "django_pgqueue_job" '
            '("queue", "priority" DESC, "available_at", "id") '
            'WHERE ("status" = \'pending\' AND "partition_bucket" IS NOT NULL)',
            comment="claim_batch: ready partitioned jobs of a queue (bucket-filtered)",
        ),
    ]
