"""Finished jobs move to the history tier, in the transaction that finishes them.

``django_pgqueue_job_to_history`` (AFTER UPDATE OF status, only for a row entering a
final status) inserts the row into ``django_pgqueue_job_history`` under its retention
class and deletes it from the job table, inside the statement that finished it: a job
is never in neither tier or both. Every statement that finishes a job, this release's
or the previous one's (a rolling deploy), goes through it. Rows finished before this
migration are moved by housekeeping in small batches (``move_finished`` in
sql/history.sql), never here: this migration takes the job table's lock only to create
its triggers.

The settling trigger (dependents, wait() notifications) now fires when a row enters
the history, so it also runs for rows a statement moves itself.

Idempotency keys: a unique index cannot span the two tiers, so a key is taken in
``django_pgqueue_job_key`` when a job holding it is inserted (BEFORE INSERT trigger
``django_pgqueue_job_claim_key``), and stays taken after the job moves; a key already
taken makes the insert do nothing, as the unique index's ON CONFLICT did (the caller
reads the job holding it, in either tier). A finished row moving back (an operator's
retry) keeps its key without the check. Housekeeping frees keys no job holds any more.

The dependency edges lose their foreign keys (ON DELETE CASCADE would delete them when
a row moves); housekeeping deletes the edges of jobs gone from both tiers.

The ``Job`` model now reads ``django_pgqueue_job_all`` (both tiers). ``LiveJob`` and
``HistoryJob`` name the two tables for Django (a test database's flush empties them);
their columns and indexes stay defined by the SQL of the migrations.

The job table's lock (SHARE ROW EXCLUSIVE, for CREATE TRIGGER) is waited for at most
five seconds; past it the migration fails, changes nothing, and can be run again.
"""

import importlib

from django.db import migrations, models
from django.db.models.functions import Now

_history = importlib.import_module("django_pgqueue.migrations.0019_history")
_sql_enqueue = importlib.import_module("django_pgqueue.migrations.0017_sql_enqueue")

LOCK_TIMEOUT = "SET LOCAL lock_timeout = '5s'"

_COLUMNS = ", ".join(_history.JOB_COLUMNS)
# finished_at is the range key: a final row without one (none is written so) goes to
# the current period rather than to the DEFAULT partition.
_NEW_VALUES = ", ".join(
    "coalesce(NEW.finished_at, now())" if name == "finished_at" else f"NEW.{name}"
    for name in _history.JOB_COLUMNS
)

# The class of a finished row: its queue's own class for that status, else the status's
# class for every queue; the seeded ids if housekeeping never wrote a class (a database
# whose class table was emptied must still take finished jobs). pgq_history_class_unique.
CLASS_OF = """
CREATE FUNCTION django_pgqueue_history_class_of(status text, queue text)
RETURNS smallint
LANGUAGE sql STABLE PARALLEL SAFE
AS $$
    SELECT coalesce(
        (
            SELECT cls.id FROM django_pgqueue_history_class AS cls
            WHERE cls.status = $1 AND cls.queue = $2 AND NOT cls.retired
        ),
        (
            SELECT cls.id FROM django_pgqueue_history_class AS cls
            WHERE cls.status = $1 AND cls.queue IS NULL
        ),
        CASE $1 WHEN 'succeeded' THEN 1 WHEN 'cancelled' THEN 2 ELSE 3 END
    )::smallint
$$
"""

# Fired after the finishing statement's rows are written (AFTER ... FOR EACH ROW runs
# at the statement's end), so its RETURNING and CTEs saw the row in the job table as
# before. The key is recorded too: a job enqueued before 0020 holds its key only in
# the job table's unique index, which it is leaving.
TO_HISTORY = f"""
CREATE FUNCTION django_pgqueue_move_to_history() RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    INSERT INTO django_pgqueue_job_history ({_COLUMNS}, history_class)
    VALUES ({_NEW_VALUES}, django_pgqueue_history_class_of(NEW.status, NEW.queue));
    IF NEW.idempotency_key IS NOT NULL THEN
        INSERT INTO django_pgqueue_job_key (idempotency_key)
        VALUES (NEW.idempotency_key)
        ON CONFLICT (idempotency_key) DO NOTHING;
    END IF;
    DELETE FROM django_pgqueue_job WHERE id = NEW.id;
    RETURN NULL;
END
$$
"""

TO_HISTORY_TRIGGER = """
CREATE TRIGGER django_pgqueue_job_to_history
AFTER UPDATE OF status ON django_pgqueue_job
FOR EACH ROW
WHEN (NEW.status IN ('succeeded', 'dead_letter', 'cancelled'))
EXECUTE FUNCTION django_pgqueue_move_to_history()
"""

# A new job with a key takes it here first; a key already taken makes the insert do
# nothing (RETURN NULL), as the unique index's ON CONFLICT did, and the caller reads the
# job holding it. A concurrent insert of the same key that has not committed makes this
# wait (the key's primary key) and then decide on its outcome. Every query here takes a
# new snapshot, in which a holder moving between the tiers is in exactly one of them. A
# key no job holds any more (its job was pruned, and housekeeping has not freed it yet)
# is taken over. A row coming back from the history (final status) keeps its key
# without this check (see the trigger's WHEN).
CLAIM_KEY = """
CREATE FUNCTION django_pgqueue_claim_key() RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    INSERT INTO django_pgqueue_job_key (idempotency_key)
    VALUES (NEW.idempotency_key)
    ON CONFLICT (idempotency_key) DO NOTHING;
    IF FOUND THEN
        RETURN NEW;
    END IF;
    IF django_pgqueue_key_held(NEW.idempotency_key) THEN
        RETURN NULL;
    END IF;
    -- A stale key. Locking its row makes two producers taking it over decide one
    -- after the other; the second then sees the first's job (a new snapshot).
    UPDATE django_pgqueue_job_key AS taken
    SET checked_at = now()
    WHERE taken.idempotency_key = NEW.idempotency_key;
    IF django_pgqueue_key_held(NEW.idempotency_key) THEN
        RETURN NULL;
    END IF;
    RETURN NEW;
END
$$
"""

# Whether a job in either tier holds the key. pgq_job_idempotency_key and
# pgq_hist_idempotency_key.
KEY_HELD = """
CREATE FUNCTION django_pgqueue_key_held(key text) RETURNS boolean
LANGUAGE sql STABLE
AS $$
    SELECT EXISTS (
        SELECT 1 FROM django_pgqueue_job AS job WHERE job.idempotency_key = $1
    ) OR EXISTS (
        SELECT 1 FROM django_pgqueue_job_history AS finished
        WHERE finished.idempotency_key = $1
    )
$$
"""

CLAIM_KEY_TRIGGER = """
CREATE TRIGGER django_pgqueue_job_claim_key
BEFORE INSERT ON django_pgqueue_job
FOR EACH ROW
WHEN (
    NEW.idempotency_key IS NOT NULL
    AND NEW.status NOT IN ('succeeded', 'dead_letter', 'cancelled')
)
EXECUTE FUNCTION django_pgqueue_claim_key()
"""

SETTLE_ON_HISTORY = """
CREATE TRIGGER django_pgqueue_history_settle
AFTER INSERT ON django_pgqueue_job_history
FOR EACH ROW
WHEN (NEW.has_dependents OR NEW.awaited)
EXECUTE FUNCTION django_pgqueue_settle_dependents()
"""

OLD_SETTLE = """
CREATE TRIGGER django_pgqueue_job_settle
AFTER UPDATE OF status ON django_pgqueue_job
FOR EACH ROW
WHEN (
    (NEW.has_dependents OR NEW.awaited)
    AND OLD.status IS DISTINCT FROM NEW.status
    AND NEW.status IN ('succeeded', 'dead_letter', 'cancelled')
)
EXECUTE FUNCTION django_pgqueue_settle_dependents()
"""

# The SQL enqueue function reads the job holding a taken key from both tiers.
_OLD_LOOKUP = (
    "SELECT job.id INTO new_id FROM django_pgqueue_job AS job\n"
    "        WHERE job.idempotency_key = django_pgqueue_enqueue.idempotency_key;"
)
_NEW_LOOKUP = (
    "SELECT job.id INTO new_id FROM django_pgqueue_job_all AS job\n"
    "        WHERE job.idempotency_key = django_pgqueue_enqueue.idempotency_key;"
)
assert _OLD_LOOKUP in _sql_enqueue.ENQUEUE_FUNCTION
ENQUEUE_FUNCTION = _sql_enqueue.ENQUEUE_FUNCTION.replace(
    "CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1
).replace(_OLD_LOOKUP, _NEW_LOOKUP)
OLD_ENQUEUE_FUNCTION = _sql_enqueue.ENQUEUE_FUNCTION.replace(
    "CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1
)

# Made by SQL rather than by Django, which would add a varchar_pattern_ops index (for
# LIKE searches) to a character primary key: keys are only ever looked up whole, and
# every keyed enqueue would write it.
KEY_TABLE = (
    "CREATE TABLE django_pgqueue_job_key ("
    "idempotency_key varchar(255) PRIMARY KEY, "
    "checked_at timestamptz NOT NULL DEFAULT statement_timestamp())",
    "CREATE INDEX pgq_key_checked ON django_pgqueue_job_key (checked_at)",
    "COMMENT ON TABLE django_pgqueue_job_key IS 'django-pgqueue: idempotency keys taken, by "
    "a job in either tier; written only by the queue''s SQL.'",
    "COMMENT ON COLUMN django_pgqueue_job_key.checked_at IS 'When housekeeping last found a "
    "job holding the key (it frees a key no job holds any more).'",
)

DROP_FOREIGN_KEYS = (
    "ALTER TABLE django_pgqueue_dependency DROP CONSTRAINT pgq_dep_blocker_fk",
    "ALTER TABLE django_pgqueue_dependency DROP CONSTRAINT pgq_dep_job_fk",
)

# Back to one table: every finished row returns to the job table first (the keys a
# moved job held are in the unique index again), then the edges of jobs that no longer
# exist go and the foreign keys come back.
REVERSE_MOVES = (
    f"INSERT INTO django_pgqueue_job ({_COLUMNS}) "
    f"SELECT {_COLUMNS} FROM django_pgqueue_job_history",
    "TRUNCATE django_pgqueue_job_history",
    "DELETE FROM django_pgqueue_dependency AS dep WHERE NOT EXISTS ("
    "SELECT 1 FROM django_pgqueue_job AS job WHERE job.id = dep.job_id) OR NOT EXISTS ("
    "SELECT 1 FROM django_pgqueue_job AS job WHERE job.id = dep.blocker_id)",
    "ALTER TABLE django_pgqueue_dependency ADD CONSTRAINT pgq_dep_blocker_fk "
    "FOREIGN KEY (blocker_id) REFERENCES django_pgqueue_job (id) ON DELETE CASCADE",
    "ALTER TABLE django_pgqueue_dependency ADD CONSTRAINT pgq_dep_job_fk "
    "FOREIGN KEY (job_id) REFERENCES django_pgqueue_job (id) ON DELETE CASCADE",
)


def _table_model(name: str, table: str, comment: str) -> migrations.CreateModel:
    return migrations.CreateModel(
        name=name,
        fields=[("id", models.BigAutoField(primary_key=True, serialize=False))],
        options={"db_table": table, "db_table_comment": comment},
    )


class Migration(migrations.Migration):
    dependencies = [("django_pgqueue", "0019_history")]

    operations = [
        migrations.RunSQL(sql=LOCK_TIMEOUT, reverse_sql=migrations.RunSQL.noop),
        migrations.SeparateDatabaseAndState(
            database_operations=[
                migrations.RunSQL(sql=KEY_TABLE, reverse_sql="DROP TABLE django_pgqueue_job_key")
            ],
            state_operations=[
                migrations.CreateModel(
                    name="IdempotencyKey",
                    fields=[
                        (
                            "idempotency_key",
                            models.CharField(
                                max_length=255,
                                primary_key=True,
                                serialize=False,
                                verbose_name="idempotency key",
                            ),
                        ),
                        (
                            "checked_at",
                            models.DateTimeField(
                                db_comment="When housekeeping last found a job holding the key "
                                "(it frees a key no job holds any more).",
                                db_default=Now(),
                                verbose_name="last checked at",
                            ),
                        ),
                    ],
                    options={
                        "verbose_name": "idempotency key",
                        "verbose_name_plural": "idempotency keys",
                        "db_table": "django_pgqueue_job_key",
                        "db_table_comment": "django-pgqueue: idempotency keys taken, by a job in "
                        "either tier; written only by the queue's SQL.",
                        "indexes": [models.Index(fields=["checked_at"], name="pgq_key_checked")],
                    },
                ),
            ],
        ),
        migrations.RunSQL(
            sql=[CLASS_OF, TO_HISTORY, KEY_HELD, CLAIM_KEY],
            reverse_sql=[
                "DROP FUNCTION django_pgqueue_claim_key()",
                "DROP FUNCTION django_pgqueue_key_held(text)",
                "DROP FUNCTION django_pgqueue_move_to_history()",
                "DROP FUNCTION django_pgqueue_history_class_of(text, text)",
            ],
        ),
        migrations.RunSQL(
            sql=[
                SETTLE_ON_HISTORY,
                "DROP TRIGGER django_pgqueue_job_settle ON django_pgqueue_job",
                CLAIM_KEY_TRIGGER,
                TO_HISTORY_TRIGGER,
                *DROP_FOREIGN_KEYS,
            ],
            reverse_sql=[
                *REVERSE_MOVES,
                "DROP TRIGGER django_pgqueue_job_to_history ON django_pgqueue_job",
                "DROP TRIGGER django_pgqueue_job_claim_key ON django_pgqueue_job",
                OLD_SETTLE,
                "DROP TRIGGER django_pgqueue_history_settle ON django_pgqueue_job_history",
            ],
        ),
        migrations.RunSQL(sql=ENQUEUE_FUNCTION, reverse_sql=OLD_ENQUEUE_FUNCTION),
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterModelTable(name="job", table="django_pgqueue_job_all"),
                migrations.AlterModelOptions(
                    name="job",
                    options={
                        "managed": False,
                        "ordering": ("-id",),
                        "verbose_name": "job",
                        "verbose_name_plural": "jobs",
                    },
                ),
                migrations.AlterModelTableComment(
                    name="job",
                    table_comment="django-pgqueue: every job, live and finished (a view).",
                ),
                migrations.CreateModel(
                    name="LiveJob",
                    fields=[
                        ("id", models.BigAutoField(primary_key=True, serialize=False)),
                        ("queue", models.CharField(max_length=100, verbose_name="queue")),
                        ("task_path", models.CharField(max_length=255, verbose_name="task")),
                        (
                            "args",
                            models.JSONField(default=list, verbose_name="positional arguments"),
                        ),
                        (
                            "kwargs",
                            models.JSONField(default=dict, verbose_name="keyword arguments"),
                        ),
                        (
                            "priority",
                            models.SmallIntegerField(
                                db_comment="Higher runs first, -100..100 as in django.tasks.",
                                default=0,
                                verbose_name="priority",
                            ),
                        ),
                        (
                            "status",
                            models.CharField(
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
                        (
                            "attempts",
                            models.IntegerField(
                                db_comment="Attempts started; counted at claim time.",
                                default=0,
                                verbose_name="attempts",
                            ),
                        ),
                        (
                            "max_attempts",
                            models.IntegerField(default=5, verbose_name="max attempts"),
                        ),
                        (
                            "lease_generation",
                            models.BigIntegerField(
                                db_comment="Fencing token: bumped at every claim and release.",
                                default=0,
                                verbose_name="lease generation",
                            ),
                        ),
                        (
                            "claimed_by",
                            models.CharField(
                                blank=True, max_length=200, null=True, verbose_name="claimed by"
                            ),
                        ),
                        (
                            "claimed_at",
                            models.DateTimeField(blank=True, null=True, verbose_name="claimed at"),
                        ),
                        (
                            "lease_expires_at",
                            models.DateTimeField(
                                blank=True, null=True, verbose_name="lease expires at"
                            ),
                        ),
                        (
                            "available_at",
                            models.DateTimeField(db_default=Now(), verbose_name="available at"),
                        ),
                        (
                            "created_at",
                            models.DateTimeField(db_default=Now(), verbose_name="created at"),
                        ),
                        (
                            "started_at",
                            models.DateTimeField(
                                blank=True, null=True, verbose_name="first started at"
                            ),
                        ),
                        (
                            "finished_at",
                            models.DateTimeField(blank=True, null=True, verbose_name="finished at"),
                        ),
                        (
                            "last_error",
                            models.TextField(blank=True, null=True, verbose_name="last error"),
                        ),
                        (
                            "last_error_class",
                            models.CharField(
                                blank=True,
                                max_length=255,
                                null=True,
                                verbose_name="last error class",
                            ),
                        ),
                        (
                            "errors",
                            models.JSONField(
                                db_comment="One object per failed attempt (class, message, traceback, worker, at) or snoozed one (snoozed: seconds, worker, at).",
                                default=list,
                                verbose_name="error history",
                            ),
                        ),
                        (
                            "snoozes",
                            models.IntegerField(
                                db_comment="Times the job's handler asked to run again later (Snooze) without using an attempt; capped by the task's max_snoozes.",
                                db_default=0,
                                verbose_name="snoozes",
                            ),
                        ),
                        ("result", models.JSONField(blank=True, null=True, verbose_name="result")),
                        (
                            "idempotency_key",
                            models.CharField(
                                blank=True,
                                max_length=255,
                                null=True,
                                verbose_name="idempotency key",
                            ),
                        ),
                        (
                            "partition_key",
                            models.CharField(
                                blank=True, max_length=255, null=True, verbose_name="partition key"
                            ),
                        ),
                        (
                            "partition_bucket",
                            models.SmallIntegerField(
                                blank=True,
                                db_comment="Stable hash of partition_key, 0..1023; spreads partitions over workers.",
                                null=True,
                                verbose_name="partition bucket",
                            ),
                        ),
                        (
                            "step",
                            models.TextField(
                                blank=True,
                                db_comment="Progress marker of a multi-step job.",
                                null=True,
                                verbose_name="step",
                            ),
                        ),
                        (
                            "unknown_task_since",
                            models.DateTimeField(
                                blank=True,
                                db_comment="When a worker first could not import the task: the start of the unknown-task window (the time the job was ready). NULL once a worker knows it.",
                                null=True,
                                verbose_name="waiting for its task since",
                            ),
                        ),
                        (
                            "coalesce_key",
                            models.CharField(
                                blank=True,
                                db_comment="While the job is pending, enqueueing with this key returns it instead of inserting another (pgq_job_coalesce_key).",
                                max_length=255,
                                null=True,
                                verbose_name="coalesce key",
                            ),
                        ),
                        (
                            "concurrency_key",
                            models.CharField(
                                blank=True,
                                db_comment="Jobs sharing it run at most concurrency_limit at a time, in any order.",
                                max_length=255,
                                null=True,
                                verbose_name="concurrency key",
                            ),
                        ),
                        (
                            "concurrency_limit",
                            models.IntegerField(
                                blank=True,
                                db_comment="Jobs of concurrency_key in flight at most (from the task or settings).",
                                null=True,
                                verbose_name="concurrency limit",
                            ),
                        ),
                        (
                            "rate_limit",
                            models.IntegerField(
                                blank=True,
                                db_comment="Starts of concurrency_key per rate_period at most.",
                                null=True,
                                verbose_name="rate limit",
                            ),
                        ),
                        (
                            "rate_period",
                            models.FloatField(
                                blank=True,
                                db_comment="Seconds of the rate limit's period.",
                                null=True,
                                verbose_name="rate period",
                            ),
                        ),
                        (
                            "traceparent",
                            models.TextField(
                                blank=True,
                                db_comment="W3C traceparent of the span that enqueued the job (OpenTelemetry); each attempt's span links to it.",
                                null=True,
                                verbose_name="trace parent",
                            ),
                        ),
                        (
                            "cancel_requested_at",
                            models.DateTimeField(
                                blank=True,
                                db_comment="An operator cancelled the job while it ran: it stays processing (lease, slot and partition turn held) until its handler returns or its lease expires, and then ends cancelled.",
                                null=True,
                                verbose_name="cancel requested at",
                            ),
                        ),
                        (
                            "has_dependents",
                            models.BooleanField(
                                db_comment="Some job was enqueued after= this one: its status changes settle them (the trigger django_pgqueue_job_settle runs only for such rows and awaited ones).",
                                db_default=False,
                                verbose_name="has dependents",
                            ),
                        ),
                        (
                            "awaited",
                            models.BooleanField(
                                db_comment="A wait() is (or was) waiting for this job: its end is NOTIFYed.",
                                db_default=False,
                                verbose_name="awaited",
                            ),
                        ),
                    ],
                    options={
                        "verbose_name": "live job",
                        "verbose_name_plural": "live jobs",
                        "db_table": "django_pgqueue_job",
                        "db_table_comment": "django-pgqueue inbox; written only by the queue manager.",
                    },
                ),
                _table_model(
                    "HistoryJob",
                    "django_pgqueue_job_history",
                    "django-pgqueue: finished jobs, partitioned by retention class and "
                    "finish time; written only by the queue's SQL.",
                ),
            ]
        ),
        # Reversed first: the same bound on the lock wait when migrating back.
        migrations.RunSQL(sql=migrations.RunSQL.noop, reverse_sql=LOCK_TIMEOUT),
    ]
