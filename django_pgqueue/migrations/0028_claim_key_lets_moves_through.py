"""The idempotency key trigger lets a job moving between segments of the job table through.

With the job table in segments (``manage.py pgqueuesegments``), housekeeping moves the
jobs left in an old segment (scheduled for later, or blocked) to the current one, so the
old one can be emptied whole. PostgreSQL moves a row between partitions as a delete and
an insert, and fires the insert's ``BEFORE INSERT`` triggers on the new segment: the
trigger that takes a new job's idempotency key (``django_pgqueue_claim_key``) would find
the key held, by the very job moving, and drop the row. The mover marks its transaction
(``django_pgqueue.moving_segments``); the trigger then keeps the row and leaves its key
as it is. Nothing else sets that setting, so every other insert is decided as before.

Replacing a function takes no table lock; the previous release's workers and producers
never set the setting.
"""

from importlib import import_module

from django.db import migrations

_previous = import_module("django_pgqueue.migrations.0026_keys_outside_job_indexes")

# A custom setting, read with missing_ok: unset, it is NULL (and '' once a transaction
# that set it locally has ended).
MOVING = "current_setting('django_pgqueue.moving_segments', true) = 'on'"

_BEGIN = "BEGIN\n    LOOP\n"
assert _previous.CLAIM_KEY.count(_BEGIN) == 1
CLAIM_KEY = _previous.CLAIM_KEY.replace(
    _BEGIN,
    "BEGIN\n"
    "    -- A job moving between segments of the job table holds its key already (0028).\n"
    f"    IF {MOVING} THEN\n"
    "        RETURN NEW;\n"
    "    END IF;\n"
    "    LOOP\n",
)


class Migration(migrations.Migration):
    dependencies = [("django_pgqueue", "0027_take_old_idempotency_keys")]

    operations = [migrations.RunSQL(sql=CLAIM_KEY, reverse_sql=_previous.CLAIM_KEY)]
