"""Storage parameters for update-heavy tables, and index comments for DBAs.

The job table is written three times per job (insert, claim, completion) plus lease
extensions, so it produces dead tuples quickly:

* fillfactor 75 leaves room on each page, so a row's new version usually lands on the
  same page (fewer pages touched; HOT when no indexed column changed, as for ``step``).
* Autovacuum starts after 2% of the table changed instead of 20%, and runs unthrottled,
  so dead tuples and index entries are reclaimed before they bloat the claim's indexes;
  the insert threshold keeps the visibility map fresh for index-only scans.

The worker registry and the per-minute statistics are updated in place on every
heartbeat; with spare room on their pages those updates are HOT (no index touched).
"""

from django.db import migrations

JOB_STORAGE = (
    "fillfactor = 75, autovacuum_vacuum_scale_factor = 0.02, "
    "autovacuum_vacuum_insert_scale_factor = 0.02, autovacuum_analyze_scale_factor = 0.02, "
    "autovacuum_vacuum_cost_delay = 0"
)
JOB_STORAGE_KEYS = (
    "fillfactor, autovacuum_vacuum_scale_factor, autovacuum_vacuum_insert_scale_factor, "
    "autovacuum_analyze_scale_factor, autovacuum_vacuum_cost_delay"
)

INDEX_COMMENTS = {
    "pgq_job_claim": "claim_batch: ready unpartitioned jobs of a queue in claim order",
    "pgq_job_claim_part": "claim_batch: ready partitioned jobs of a queue (bucket-filtered)",
    "pgq_job_part_pending": "claim_batch head check: older pending job in the partition?",
    "pgq_job_part_processing": "claim_batch head check: job of the partition processing?",
    "pgq_job_lease": "reap_expired and the admin stuck count: expired leases",
    "pgq_job_pending": "lag page and scheduled listing: pending jobs by availability",
    "pgq_job_finished": "prune_finished, prune_dead_letters, finished-at filters",
    "pgq_job_dead": "dead-letter page: grouped by task and error class",
    "pgq_job_created_brin": "admin created-at range filters",
    "pgq_job_idempotency_key": "enqueue ON CONFLICT: one job per idempotency key",
}


def _comments(text_for):
    return ";\n".join(
        f"COMMENT ON INDEX {name} IS {text_for(comment)}"
        for name, comment in INDEX_COMMENTS.items()
    )


class Migration(migrations.Migration):
    dependencies = [("django_pgqueue", "0001_initial")]

    operations = [
        migrations.RunSQL(
            sql=[
                f"ALTER TABLE django_pgqueue_job SET ({JOB_STORAGE})",
                "ALTER TABLE django_pgqueue_worker SET (fillfactor = 50)",
                "ALTER TABLE django_pgqueue_queuestat SET (fillfactor = 70)",
            ],
            reverse_sql=[
                f"ALTER TABLE django_pgqueue_job RESET ({JOB_STORAGE_KEYS})",
                "ALTER TABLE django_pgqueue_worker RESET (fillfactor)",
                "ALTER TABLE django_pgqueue_queuestat RESET (fillfactor)",
            ],
        ),
        migrations.RunSQL(
            sql=_comments(lambda comment: "'" + comment.replace("'", "''") + "'"),
            reverse_sql=_comments(lambda comment: "NULL"),
        ),
    ]
