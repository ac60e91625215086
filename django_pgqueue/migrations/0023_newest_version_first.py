"""Partition and key rows are looked up newest version first.

Every job a partition (or concurrency key) starts or finishes writes a new version of its
row. Until VACUUM removes the old ones (between two autovacuums of a busy queue, or all
along while a long transaction holds a snapshot), a lookup by ``key = x`` visits every
version, oldest first: about 200 buffer pages per lookup on a queue of 1,000 partitions
after a minute and a half of a held snapshot. Equal keys sit in the primary key's index in
heap order, and new versions go to the end of the table once its pages are full, so a
range read backward (``key >= x AND key <= x ORDER BY key DESC LIMIT 1``; with ``=`` the
ORDER BY is redundant and the scan runs forward) meets the visible version after at most
the versions not committed yet: 3 pages instead of 200.

The lock-or-create loops of the refresh and fold functions and the SQL enqueue function's
probes read that way now (the statements in ``store/sql/enqueue.sql`` do the same). A lock
taken through the backward read is the same lock: a version updated meanwhile is followed
to its newest version and rechecked, as before. Same signatures and behaviour: workers of
the previous release call the new functions as soon as this migration has run.
"""

from importlib import import_module

from django.db import migrations

_history_moves = import_module("django_pgqueue.migrations.0020_history_moves")
_fold_lock_order = import_module("django_pgqueue.migrations.0021_fold_lock_order")
_refresh_by_row = import_module("django_pgqueue.migrations.0022_refresh_by_row")
_rewrite = _refresh_by_row._rewrite

#: The lock of a partition's row, as the refresh and fold functions take it.
_PARTITION_LOCK = (
    "            FROM django_pgqueue_partition AS part\n"
    "            WHERE part.partition_key = partition\n"
    "            FOR UPDATE;\n",
    "            FROM django_pgqueue_partition AS part\n"
    "            -- Newest version first (migration 0023).\n"
    "            WHERE part.partition_key >= partition AND part.partition_key <= partition\n"
    "            ORDER BY part.partition_key DESC\n"
    "            LIMIT 1\n"
    "            FOR UPDATE;\n",
)

_KEY_LOCK = (
    "            FROM django_pgqueue_concurrency AS conc\n"
    "            WHERE conc.concurrency_key = key\n"
    "            FOR UPDATE;\n",
    "            FROM django_pgqueue_concurrency AS conc\n"
    "            -- Newest version first (migration 0023).\n"
    "            WHERE conc.concurrency_key >= key AND conc.concurrency_key <= key\n"
    "            ORDER BY conc.concurrency_key DESC\n"
    "            LIMIT 1\n"
    "            FOR UPDATE;\n",
)

REFRESH_FUNCTIONS = _rewrite(_refresh_by_row.REFRESH_PARTITIONS, [_PARTITION_LOCK]) + _rewrite(
    _refresh_by_row.REFRESH_CONCURRENCY, [_KEY_LOCK]
)

FOLD_FUNCTIONS = _rewrite(_fold_lock_order.FOLD_FUNCTIONS, [_PARTITION_LOCK, _KEY_LOCK])

# The SQL enqueue function's probes: is the row's next job another one, older than
# this? Read on the one visible version, not as a filter of the scan.
ENQUEUE_FUNCTION = _rewrite(
    _history_moves.ENQUEUE_FUNCTION,
    [
        (
            """        urgent := NOT EXISTS (
            SELECT 1 FROM django_pgqueue_partition AS part
            WHERE part.partition_key = django_pgqueue_enqueue.partition_key
              AND part.head_id IS NOT NULL
              AND part.head_id IS DISTINCT FROM part.running_id
        );
""",
            """        -- Newest version first (migration 0023).
        urgent := NOT COALESCE((
            SELECT part.head_id IS NOT NULL
                AND part.head_id IS DISTINCT FROM part.running_id
            FROM django_pgqueue_partition AS part
            WHERE part.partition_key >= django_pgqueue_enqueue.partition_key
              AND part.partition_key <= django_pgqueue_enqueue.partition_key
            ORDER BY part.partition_key DESC
            LIMIT 1
        ), false);
""",
        ),
        (
            """        urgent := NOT EXISTS (
            SELECT 1 FROM django_pgqueue_concurrency AS conc
            WHERE conc.concurrency_key = key_name
              AND conc.head_id IS NOT NULL
              AND conc.head_available_at <= now()
              AND conc.head_priority >= django_pgqueue_enqueue.priority
        );
""",
            """        urgent := NOT COALESCE((
            SELECT (
                conc.head_id IS NOT NULL
                AND conc.head_available_at <= now()
                AND conc.head_priority >= django_pgqueue_enqueue.priority
            ) IS TRUE
            FROM django_pgqueue_concurrency AS conc
            WHERE conc.concurrency_key >= key_name AND conc.concurrency_key <= key_name
            ORDER BY conc.concurrency_key DESC
            LIMIT 1
        ), false);
""",
        ),
    ],
)


class Migration(migrations.Migration):
    dependencies = [("django_pgqueue", "0022_refresh_by_row")]

    operations = [
        migrations.RunSQL(
            sql=REFRESH_FUNCTIONS + FOLD_FUNCTIONS + ENQUEUE_FUNCTION,
            reverse_sql=(
                _refresh_by_row.REFRESH_PARTITIONS
                + _refresh_by_row.REFRESH_CONCURRENCY
                + _fold_lock_order.FOLD_FUNCTIONS
                + _history_moves.ENQUEUE_FUNCTION
            ),
        ),
    ]
