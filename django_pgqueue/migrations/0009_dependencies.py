"""Dependencies between jobs: the ``blocked`` status, the dependency table, the settling trigger.

Non-atomic: the job table's new index is built CONCURRENTLY (``EnsureIndexConcurrently``;
running ``migrate`` again repairs an interrupted build). Nothing rewrites the job table:
the two new columns have constant defaults. The status CHECK constraint is replaced
without a long lock: the new one is added NOT VALID (a brief lock, no scan), validated
while writes continue (SHARE UPDATE EXCLUSIVE), and only then swapped for the old one.

The trigger ``django_pgqueue_job_settle`` runs only when a job with dependents (or one
somebody ``wait()``s for) finishes: its WHEN clause is evaluated in C, so plain jobs never
enter PL/pgSQL. See docs/explanation/state-machine.md and docs/howto/workflows.md.
"""

import django.db.models.deletion
from django.db import migrations, models

import django_pgqueue.schema

FOREIGN_KEYS = """
ALTER TABLE django_pgqueue_dependency
    ADD CONSTRAINT pgq_dep_job_fk FOREIGN KEY (job_id)
        REFERENCES django_pgqueue_job (id) ON DELETE CASCADE,
    ADD CONSTRAINT pgq_dep_blocker_fk FOREIGN KEY (blocker_id)
        REFERENCES django_pgqueue_job (id) ON DELETE CASCADE;
"""

_STATUSES = "'blocked', 'pending', 'processing', 'succeeded', 'dead_letter', 'cancelled'"
_OLD_STATUSES = "'pending', 'processing', 'succeeded', 'dead_letter', 'cancelled'"

# Each statement in its own transaction (the migration is non-atomic): only ADD ... NOT
# VALID and the final DROP/RENAME take ACCESS EXCLUSIVE, and both are instant.
CHECK_SWAP = [
    "ALTER TABLE django_pgqueue_job DROP CONSTRAINT IF EXISTS pgq_job_status_valid_new",
    f"""ALTER TABLE django_pgqueue_job ADD CONSTRAINT pgq_job_status_valid_new
        CHECK ("status" IN ({_STATUSES})) NOT VALID""",
    "ALTER TABLE django_pgqueue_job VALIDATE CONSTRAINT pgq_job_status_valid_new",
    """BEGIN;
    ALTER TABLE django_pgqueue_job DROP CONSTRAINT pgq_job_status_valid;
    ALTER TABLE django_pgqueue_job
        RENAME CONSTRAINT pgq_job_status_valid_new TO pgq_job_status_valid;
    COMMIT""",
]
CHECK_SWAP_REVERSE = [
    f"""BEGIN;
    ALTER TABLE django_pgqueue_job DROP CONSTRAINT pgq_job_status_valid;
    ALTER TABLE django_pgqueue_job ADD CONSTRAINT pgq_job_status_valid
        CHECK ("status" IN ({_OLD_STATUSES})) NOT VALID;
    COMMIT""",
    "ALTER TABLE django_pgqueue_job VALIDATE CONSTRAINT pgq_job_status_valid",
]

# Settles the dependents of a job that just finished, in the transaction that finished it,
# whichever statement did (completion, batched completion, failure, reap, an operator's
# cancel): the dependents whose every blocker is now settled become pending (their
# workers woken, their partitions signalled); with policy "cancel", a failed blocker
# cancels its blocked dependents, and their own rows fire this trigger again (cascade).
# Also NOTIFYs django_pgqueue_finished for a job a wait() marked as awaited.
SETTLE_TRIGGER = """
CREATE OR REPLACE FUNCTION django_pgqueue_settle_dependents()
RETURNS trigger
LANGUAGE plpgsql
VOLATILE
AS $function$
DECLARE
    waiting bigint[];
    doomed_jobs bigint[];
    doomed_blockers bigint[];
    woken integer;
BEGIN
    IF NEW.awaited THEN
        PERFORM pg_notify('django_pgqueue_finished', NEW.id::text);
    END IF;
    IF NOT NEW.has_dependents THEN
        RETURN NULL;
    END IF;
    IF NEW.status IN ('dead_letter', 'cancelled') THEN
        -- Policy "cancel": every blocked job that (transitively, through "cancel" edges)
        -- runs after this one is cancelled here, in one statement, rather than by this
        -- trigger firing again level by level: a chain of any length cannot exhaust the
        -- stack. Each edge is walked once (UNION), however many paths lead to it.
        -- pgq_dep_blocker, then the primary key.
        WITH RECURSIVE doomed (job_id, blocker_id) AS (
            SELECT dep.job_id, dep.blocker_id
            FROM django_pgqueue_dependency AS dep
            JOIN django_pgqueue_job AS job ON job.id = dep.job_id
            WHERE dep.blocker_id = NEW.id
              AND dep.on_failure = 'cancel'
              AND job.status = 'blocked'
            UNION
            SELECT dep.job_id, dep.blocker_id
            FROM doomed
            JOIN django_pgqueue_dependency AS dep ON dep.blocker_id = doomed.job_id
            JOIN django_pgqueue_job AS job ON job.id = dep.job_id
            WHERE dep.on_failure = 'cancel'
              AND job.status = 'blocked'
        )
        SELECT array_agg(doomed.job_id), array_agg(doomed.blocker_id)
        INTO doomed_jobs, doomed_blockers
        FROM doomed;
    END IF;
    -- Lock the blocked dependents (and what the cancel reaches) in id order, in one pass
    -- (every settler locks in that order). Two blockers of one job finishing at once in
    -- two transactions thus settle it one after the other, and the second sees the
    -- first's commit in its next statement's snapshot: the job cannot be left blocked
    -- with every blocker done. pgq_dep_blocker, then the primary key.
    SELECT array_agg(locked.id ORDER BY locked.id) INTO waiting
    FROM (
        SELECT job.id
        FROM django_pgqueue_job AS job
        WHERE (
            job.id = ANY (ARRAY(
                SELECT dep.job_id FROM django_pgqueue_dependency AS dep
                WHERE dep.blocker_id = NEW.id
            ))
            OR job.id = ANY (COALESCE(doomed_jobs, '{}'))
        )
          AND job.status = 'blocked'
        ORDER BY job.id
        FOR NO KEY UPDATE
    ) AS locked;
    IF waiting IS NULL THEN
        RETURN NULL;
    END IF;
    IF doomed_jobs IS NOT NULL THEN
        -- The reason names the job that cancelled it, as an operator's cancel gives one.
        -- Their own triggers then find nothing left to cancel, and settle only their
        -- dependents with policy "run" (one level deeper, never more).
        WITH edge AS (
            SELECT edge.job_id, edge.blocker_id
            FROM unnest(doomed_jobs, doomed_blockers) AS edge (job_id, blocker_id)
        ),
        cause AS (
            SELECT DISTINCT ON (edge.job_id) edge.job_id, edge.blocker_id
            FROM edge
            ORDER BY edge.job_id, edge.blocker_id = NEW.id DESC, edge.blocker_id
        ),
        marked AS (
            UPDATE django_pgqueue_dependency AS dep
            SET cancelled_job = true
            FROM edge
            WHERE dep.job_id = edge.job_id
              AND dep.blocker_id = edge.blocker_id
        )
        UPDATE django_pgqueue_job AS job
        SET status = 'cancelled',
            finished_at = now(),
            last_error = format(
                'job %s, which it runs after, ended %s', cause.blocker_id,
                CASE WHEN cause.blocker_id = NEW.id
                    THEN replace(NEW.status, '_', '-')
                    ELSE 'cancelled'
                END
            )
        FROM cause
        WHERE job.id = cause.job_id
          AND job.id = ANY (waiting)
          AND job.status = 'blocked';
    END IF;
    -- A new statement, a new snapshot: every blocker committed before the locks above
    -- were granted is seen. pgq_dep_job for each dependent's blockers.
    WITH ready AS (
        UPDATE django_pgqueue_job AS job
        SET status = 'pending',
            available_at = GREATEST(job.available_at, now())
        WHERE job.id = ANY (waiting)
          AND job.status = 'blocked'
          AND NOT EXISTS (
              SELECT 1
              FROM django_pgqueue_dependency AS other
              JOIN django_pgqueue_job AS blocker ON blocker.id = other.blocker_id
              WHERE other.job_id = job.id
                AND blocker.status <> 'succeeded'
                AND NOT (
                    other.on_failure = 'run'
                    AND blocker.status IN ('dead_letter', 'cancelled')
                )
          )
        RETURNING job.id, job.queue, job.partition_key, job.available_at
    ),
    signalled AS (
        INSERT INTO django_pgqueue_partition_signal (partition_key)
        SELECT DISTINCT ready.partition_key FROM ready WHERE ready.partition_key IS NOT NULL
    ),
    wake AS (
        SELECT DISTINCT dep.wake_channel, ready.queue
        FROM ready
        JOIN django_pgqueue_dependency AS dep
          ON dep.job_id = ready.id AND dep.blocker_id = NEW.id
        WHERE ready.available_at <= now()
    )
    SELECT count(pg_notify(wake.wake_channel, wake.queue)) INTO woken FROM wake;
    RETURN NULL;
END
$function$;
COMMENT ON FUNCTION django_pgqueue_settle_dependents() IS
    'django-pgqueue: settle the dependents of a job that finished; notify its waiters';
DROP TRIGGER IF EXISTS django_pgqueue_job_settle ON django_pgqueue_job;
CREATE TRIGGER django_pgqueue_job_settle
AFTER UPDATE OF status ON django_pgqueue_job
FOR EACH ROW
WHEN (
    (NEW.has_dependents OR NEW.awaited)
    AND OLD.status IS DISTINCT FROM NEW.status
    AND NEW.status IN ('succeeded', 'dead_letter', 'cancelled')
)
EXECUTE FUNCTION django_pgqueue_settle_dependents();
"""
SETTLE_TRIGGER_REVERSE = """
DROP TRIGGER IF EXISTS django_pgqueue_job_settle ON django_pgqueue_job;
DROP FUNCTION IF EXISTS django_pgqueue_settle_dependents();
"""


class Migration(migrations.Migration):
    atomic = False

    dependencies = [("django_pgqueue", "0008_schedules")]

    operations = [
        migrations.CreateModel(
            name="Dependency",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                (
                    "position",
                    models.IntegerField(
                        db_comment="Index of the blocker in the after= list.",
                        verbose_name="position",
                    ),
                ),
                (
                    "on_failure",
                    models.CharField(
                        choices=[
                            ("cancel", "cancel the dependent"),
                            ("run", "run the dependent anyway"),
                        ],
                        default="cancel",
                        max_length=8,
                        verbose_name="if it fails",
                    ),
                ),
                (
                    "wake_channel",
                    models.CharField(
                        db_comment="NOTIFY channel of the dependent's workers (PGQUEUE_NOTIFY_CHANNEL at enqueue): the settling trigger wakes them when the dependent becomes pending.",
                        max_length=63,
                        verbose_name="wake-up channel",
                    ),
                ),
                (
                    "cancelled_job",
                    models.BooleanField(
                        db_comment="The blocker's failure cancelled the dependent: retrying it may revive it.",
                        db_default=False,
                        verbose_name="cancelled the job",
                    ),
                ),
            ],
            options={
                "verbose_name": "dependency",
                "verbose_name_plural": "dependencies",
                "db_table": "django_pgqueue_dependency",
                "db_table_comment": "django-pgqueue: job runs after blocker; written only by queue SQL.",
            },
        ),
        migrations.AddField(
            model_name="dependency",
            name="blocker",
            field=models.ForeignKey(
                db_constraint=False,
                db_index=False,
                on_delete=django.db.models.deletion.DO_NOTHING,
                related_name="dependents",
                to="django_pgqueue.job",
                verbose_name="runs after",
            ),
        ),
        migrations.AddField(
            model_name="dependency",
            name="job",
            field=models.ForeignKey(
                db_constraint=False,
                db_index=False,
                on_delete=django.db.models.deletion.DO_NOTHING,
                related_name="dependencies",
                to="django_pgqueue.job",
                verbose_name="dependent job",
            ),
        ),
        migrations.AddIndex(
            model_name="dependency",
            index=models.Index(fields=["blocker", "job"], name="pgq_dep_blocker"),
        ),
        migrations.AddConstraint(
            model_name="dependency",
            constraint=models.UniqueConstraint(fields=("job", "blocker"), name="pgq_dep_job"),
        ),
        migrations.AddConstraint(
            model_name="dependency",
            constraint=models.CheckConstraint(
                condition=models.Q(("on_failure__in", ["cancel", "run"])), name="pgq_dep_on_failure"
            ),
        ),
        migrations.RunSQL(FOREIGN_KEYS, migrations.RunSQL.noop),
        migrations.AddField(
            model_name="job",
            name="awaited",
            field=models.BooleanField(
                db_comment="A wait() is (or was) waiting for this job: its end is NOTIFYed.",
                db_default=False,
                verbose_name="awaited",
            ),
        ),
        migrations.AddField(
            model_name="job",
            name="has_dependents",
            field=models.BooleanField(
                db_comment="Some job was enqueued after= this one: its status changes settle them (the trigger django_pgqueue_job_settle runs only for such rows and awaited ones).",
                db_default=False,
                verbose_name="has dependents",
            ),
        ),
        migrations.AlterField(
            model_name="job",
            name="status",
            field=models.CharField(
                choices=[
                    ("blocked", "Blocked"),
                    ("pending", "Pending"),
                    ("processing", "Processing"),
                    ("succeeded", "Succeeded"),
                    ("dead_letter", "Dead letter"),
                    ("cancelled", "Cancelled"),
                ],
                default="pending",
                max_length=16,
                verbose_name="status",
            ),
        ),
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.RemoveConstraint(
                    model_name="job",
                    name="pgq_job_status_valid",
                ),
                migrations.AddConstraint(
                    model_name="job",
                    constraint=models.CheckConstraint(
                        condition=models.Q(
                            (
                                "status__in",
                                [
                                    "blocked",
                                    "pending",
                                    "processing",
                                    "succeeded",
                                    "dead_letter",
                                    "cancelled",
                                ],
                            )
                        ),
                        name="pgq_job_status_valid",
                    ),
                ),
            ],
            database_operations=[migrations.RunSQL(CHECK_SWAP, CHECK_SWAP_REVERSE)],
        ),
        django_pgqueue.schema.EnsureIndexConcurrently(
            "job",
            models.Index(
                condition=models.Q(("status", "blocked")), fields=["queue"], name="pgq_job_blocked"
            ),
            comment="admin lag page and metrics: blocked jobs per queue",
        ),
        migrations.RunSQL(SETTLE_TRIGGER, SETTLE_TRIGGER_REVERSE),
    ]
