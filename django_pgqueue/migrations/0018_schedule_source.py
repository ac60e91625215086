"""Schedules edited at run time: ``schedule.source`` and the trigger that keeps admin rows.

``source`` is a short text column with a constant default: PostgreSQL 11+ stores the
default in the catalog, so existing rows (all declared in code) read ``code`` without a
rewrite. The CHECK constraint reads the few rows of the table once. Both take the
table's ACCESS EXCLUSIVE lock, and every worker fires from this table each second, so
the migration waits at most ``LOCK_TIMEOUT`` for it (a lock queued behind a long
transaction would stop every worker's firing meanwhile); past it the migration fails,
changes nothing, and can be run again.

The trigger protects admin schedules from the sync of the previous release, whose
``delete_undeclared_schedules`` deletes every name its code does not declare: during a
rolling deploy, an old worker starting would otherwise delete them. It skips (RETURN
NULL) the delete of an admin row unless the transaction set
``django_pgqueue.delete_admin_schedule`` to ``on``, which only the admin's delete
(``delete_admin_schedules`` in sql/schedules.sql) does.
"""

from django.db import migrations, models

#: The longest this migration waits for the schedule table's lock (SET LOCAL: this
#: migration's transaction only).
LOCK_TIMEOUT = "SET LOCAL lock_timeout = '5s'"

KEEP_FUNCTION = """
CREATE FUNCTION django_pgqueue_keep_admin_schedule() RETURNS trigger
LANGUAGE plpgsql
AS $$
BEGIN
    -- current_setting(..., true) is NULL in a session that never set it, and '' after a
    -- transaction that set it locally has ended.
    IF OLD.source = 'admin'
        AND current_setting('django_pgqueue.delete_admin_schedule', true)
            IS DISTINCT FROM 'on'
    THEN
        RETURN NULL;
    END IF;
    RETURN OLD;
END
$$
"""

KEEP_TRIGGER = """
CREATE TRIGGER django_pgqueue_keep_admin_schedule
BEFORE DELETE ON django_pgqueue_schedule
FOR EACH ROW EXECUTE FUNCTION django_pgqueue_keep_admin_schedule()
"""

FUNCTION_COMMENT = (
    "Skips the delete of an admin schedule unless the transaction set "
    "django_pgqueue.delete_admin_schedule to on (the admin's delete does): a previous "
    "release's sync deletes every undeclared name."
)


class Migration(migrations.Migration):
    dependencies = [("django_pgqueue", "0017_sql_enqueue")]

    operations = [
        migrations.RunSQL(sql=LOCK_TIMEOUT, reverse_sql=migrations.RunSQL.noop),
        migrations.AlterModelTableComment(
            name="schedule",
            table_comment="django-pgqueue periodic schedules; synced from code by workers, "
            "or edited in the admin.",
        ),
        migrations.AddField(
            model_name="schedule",
            name="source",
            field=models.CharField(
                choices=[("code", "Code"), ("admin", "Admin")],
                db_comment="Where the schedule is declared: code (synced by workers at start) "
                "or admin (created and edited in the admin; a sync never changes or deletes "
                "it).",
                db_default="code",
                max_length=8,
                verbose_name="source",
            ),
        ),
        migrations.AddConstraint(
            model_name="schedule",
            constraint=models.CheckConstraint(
                condition=models.Q(("source__in", ["code", "admin"])),
                name="pgq_schedule_source_valid",
            ),
        ),
        migrations.RunSQL(
            sql=[
                KEEP_FUNCTION,
                KEEP_TRIGGER,
                (
                    "COMMENT ON FUNCTION django_pgqueue_keep_admin_schedule() IS %s",
                    [FUNCTION_COMMENT],
                ),
            ],
            reverse_sql=[
                "DROP TRIGGER IF EXISTS django_pgqueue_keep_admin_schedule "
                "ON django_pgqueue_schedule",
                "DROP FUNCTION IF EXISTS django_pgqueue_keep_admin_schedule()",
            ],
        ),
        # Reversed first: the same bound on the lock wait when migrating back.
        migrations.RunSQL(sql=migrations.RunSQL.noop, reverse_sql=LOCK_TIMEOUT),
    ]
