"""Take the idempotency keys of jobs enqueued before 0020 that are still in the job table.

Since 0020 a trigger takes every new job's key in ``django_pgqueue_job_key``; older jobs
held theirs in the job table's unique index only, which this release's statements no
longer name (0026). Their keys are added here, in batches of ``BATCH``, each its own
transaction: an enqueue of one of those keys waits at most for one batch. The job table
is only read.
"""

from typing import Any

from django.db import migrations

#: Keys added to django_pgqueue_job_key per transaction.
BATCH = 5000

# The live rows' keys after `after`, in the order of pgq_job_idempotency_key (which
# holds only keyed rows); a key taken already is left as it is.
BACKFILL = """
WITH batch AS (
    SELECT job.idempotency_key
    FROM django_pgqueue_job AS job
    WHERE job.idempotency_key IS NOT NULL
      AND job.idempotency_key > %s
    ORDER BY job.idempotency_key
    LIMIT %s
),
taken AS (
    INSERT INTO django_pgqueue_job_key (idempotency_key)
    SELECT batch.idempotency_key FROM batch
    ON CONFLICT (idempotency_key) DO NOTHING
)
SELECT max(batch.idempotency_key) FROM batch
"""


def take_old_keys(apps: Any, schema_editor: Any) -> None:
    connection = schema_editor.connection
    after = ""
    while True:
        with connection.cursor() as cursor:
            cursor.execute(BACKFILL, [after, BATCH])
            last = cursor.fetchone()[0]
        if last is None:
            return
        after = last


class Migration(migrations.Migration):
    # One transaction per batch (see above).
    atomic = False

    dependencies = [("django_pgqueue", "0026_keys_outside_job_indexes")]

    operations = [migrations.RunPython(take_old_keys, reverse_code=migrations.RunPython.noop)]
