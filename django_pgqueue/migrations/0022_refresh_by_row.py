"""The refresh functions find a partition's (or key's) row once, not three times.

Every job a partition starts or finishes writes a new version of its partition's row
(and likewise a concurrency key's), each with its own entries in the row's indexes: its
claim state is in ``pgq_partition_claim``, so no update can be HOT. Until VACUUM removes
the old versions (between two autovacuums of a busy queue, or all along while a long
transaction holds a snapshot), a lookup by key visits every one of them: measured on a
queue of 1,000 partitions, about 200 buffer pages per lookup after a minute and a half of
a held snapshot.

``django_pgqueue_refresh_partitions`` and ``django_pgqueue_refresh_concurrency`` looked the
row up three times per key: ``INSERT ... ON CONFLICT DO NOTHING`` (its conflict check),
``SELECT ... FOR UPDATE``, then ``UPDATE`` or ``DELETE`` by key. They now lock it first
(creating it only when it is missing) and write the version they locked by its ``ctid``,
which cannot move while they hold the lock. The lazy folds of migration 0021 lock first
too. Same signatures and behaviour: workers of the previous release call the new
functions as soon as this migration has run.
"""

from importlib import import_module

from django.db import migrations

_composition = import_module("django_pgqueue.migrations.0015_composition")


def _rewrite(text: str, changes: list[tuple[str, str]]) -> str:
    """Apply each (old, new) change, each of which must match exactly once."""
    for old, new in changes:
        if text.count(old) != 1:
            raise ValueError(f"expected exactly one {old!r} in the function")
        text = text.replace(old, new)
    return text


REFRESH_PARTITIONS = _rewrite(
    _composition.REFRESH_PARTITIONS,
    [
        ("    running bigint;\n", "    running bigint;\n    locked tid;\n"),
        (
            """        -- Lock the row, creating it first if needed (a refresher may delete it meanwhile).
        LOOP
            INSERT INTO django_pgqueue_partition (partition_key, refreshed_at)
            VALUES (partition, now())
            ON CONFLICT (partition_key) DO NOTHING;
            PERFORM 1 FROM django_pgqueue_partition
            WHERE partition_key = partition
            FOR UPDATE;
            EXIT WHEN FOUND;
        END LOOP;
""",
            """        -- Lock the row, creating it if missing (a refresher may delete it meanwhile).
        -- Its ctid then names the locked version: the writes below go straight to it
        -- rather than visiting every version of the key again.
        LOOP
            SELECT part.ctid INTO locked
            FROM django_pgqueue_partition AS part
            WHERE part.partition_key = partition
            FOR UPDATE;
            EXIT WHEN FOUND;
            INSERT INTO django_pgqueue_partition (partition_key, refreshed_at)
            VALUES (partition, now())
            ON CONFLICT (partition_key) DO NOTHING;
        END LOOP;
""",
        ),
        (
            "DELETE FROM django_pgqueue_partition WHERE partition_key = partition;",
            "DELETE FROM django_pgqueue_partition WHERE ctid = locked;",
        ),
        (
            "                refreshed_at = now()\n            WHERE partition_key = partition;",
            "                refreshed_at = now()\n            WHERE ctid = locked;",
        ),
    ],
)

REFRESH_CONCURRENCY = _rewrite(
    _composition.REFRESH_CONCURRENCY,
    [
        (
            """        LOOP
            INSERT INTO django_pgqueue_concurrency (concurrency_key, refreshed_at)
            VALUES (key, now())
            ON CONFLICT (concurrency_key) DO NOTHING;
            SELECT conc.max_in_flight, conc.rate_limit, conc.rate_period, conc.tokens,
                conc.tokens_at
            INTO current
            FROM django_pgqueue_concurrency AS conc
            WHERE conc.concurrency_key = key
            FOR UPDATE;
            EXIT WHEN FOUND;
        END LOOP;
""",
            """        -- Locked first, created only if missing; written below by its ctid (as in
        -- django_pgqueue_refresh_partitions).
        LOOP
            SELECT conc.max_in_flight, conc.rate_limit, conc.rate_period, conc.tokens,
                conc.tokens_at, conc.ctid AS locked
            INTO current
            FROM django_pgqueue_concurrency AS conc
            WHERE conc.concurrency_key = key
            FOR UPDATE;
            EXIT WHEN FOUND;
            INSERT INTO django_pgqueue_concurrency (concurrency_key, refreshed_at)
            VALUES (key, now())
            ON CONFLICT (concurrency_key) DO NOTHING;
        END LOOP;
""",
        ),
        (
            """            DELETE FROM django_pgqueue_concurrency AS conc
            WHERE conc.concurrency_key = key
""",
            """            DELETE FROM django_pgqueue_concurrency AS conc
            WHERE conc.ctid = current.locked
""",
        ),
        (
            """                wake_at = NULL, refreshed_at = now()
            WHERE concurrency_key = key;""",
            """                wake_at = NULL, refreshed_at = now()
            WHERE ctid = current.locked;""",
        ),
        (
            """                wake_at = wake,
                refreshed_at = now()
            WHERE concurrency_key = key;""",
            """                wake_at = wake,
                refreshed_at = now()
            WHERE ctid = current.locked;""",
        ),
    ],
)


class Migration(migrations.Migration):
    dependencies = [("django_pgqueue", "0021_fold_lock_order")]

    operations = [
        migrations.RunSQL(
            sql=REFRESH_PARTITIONS + REFRESH_CONCURRENCY,
            reverse_sql=_composition.REFRESH_PARTITIONS + _composition.REFRESH_CONCURRENCY,
        ),
    ]
