"""The test project's ``flush``: what pytest-django runs after each transactional test.

Django's ``flush`` truncates every table (with the history's partitions and all their
indexes, some 240 relations) and then sends ``post_migrate``, which makes the content
types, the permissions and the SQL enqueue settings row again: about a third of a
second after every test that committed anything. This one leaves the database exactly as
that would, doing less:

* a table that holds no page is empty and has not held a row since it was last
  truncated: truncating it changes nothing a test can see, so only the tables (and of a
  partitioned table, the partitions) that hold a page are truncated;
* the tables ``post_migrate`` fills (content types, permissions, the SQL settings row)
  are kept when they hold what the last ``post_migrate`` wrote, compared by content, and
  ``post_migrate`` is then not sent; if a test changed any of them, they are truncated
  and ``post_migrate`` is sent, as Django does.

``reset_sequences`` (a test asking for sequences to restart) takes Django's own path.
"""

from __future__ import annotations

from typing import Any

from django.core.management.color import no_style
from django.core.management.commands import flush
from django.core.management.sql import emit_post_migrate_signal
from django.db import connections

#: The tables ``post_migrate`` writes in the test project.
MADE_BY_POST_MIGRATE = ("django_content_type", "auth_permission", "django_pgqueue_sql_settings")

#: Per database, the content of those tables the last ``post_migrate`` left.
_made: dict[str, str] = {}

_HOLDING_A_PAGE = """
SELECT root.relname
FROM pg_class AS root
WHERE root.relname = ANY (%(tables)s)
  AND root.relnamespace = current_schema()::regnamespace
  AND root.relkind = 'r'
  AND pg_relation_size(root.oid) > 0
UNION ALL
-- A partitioned table (the history) by its partitions that hold a page: truncating the
-- parent would truncate every partition made ahead, with all their indexes.
SELECT leaf.relname
FROM pg_class AS root
CROSS JOIN LATERAL pg_partition_tree(root.oid) AS tree
JOIN pg_class AS leaf ON leaf.oid = tree.relid
WHERE root.relname = ANY (%(tables)s)
  AND root.relnamespace = current_schema()::regnamespace
  AND root.relkind = 'p'
  AND tree.isleaf
  AND pg_relation_size(tree.relid) > 0
"""


def _content(cursor: Any, tables: list[str]) -> str:
    parts = []
    for table in tables:
        cursor.execute(
            "SELECT string_agg(row_text, chr(10) ORDER BY row_text) "
            f'FROM (SELECT t::text AS row_text FROM "{table}" AS t) AS table_rows'
        )
        parts.append(f"{table}:{cursor.fetchone()[0]}")
    return "\n".join(parts)


class Command(flush.Command):
    def handle(self, **options: Any) -> None:
        if options.get("reset_sequences", True) or options.get("interactive", True):
            super().handle(**options)
            return
        database = options["database"]
        connection = connections[database]
        tables = connection.introspection.django_table_names(
            only_existing=True, include_views=False
        )
        made = [table for table in MADE_BY_POST_MIGRATE if table in tables]
        with connection.cursor() as cursor:
            keep = _made.get(database) == _content(cursor, made)
            cursor.execute(_HOLDING_A_PAGE, {"tables": tables})
            used = [name for (name,) in cursor.fetchall() if not (keep and name in made)]
        # CASCADE: a table that references a truncated one and is left out holds no row.
        connection.ops.execute_sql_flush(
            connection.ops.sql_flush(no_style(), used, allow_cascade=True)
        )
        if keep or options.get("inhibit_post_migrate", False):
            return
        emit_post_migrate_signal(options["verbosity"], False, database)
        with connection.cursor() as cursor:
            _made[database] = _content(cursor, made)
