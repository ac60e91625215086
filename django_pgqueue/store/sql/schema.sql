-- Catalog queries about the queue's own schema: whether its indexes are usable.
--
-- A CREATE INDEX CONCURRENTLY or REINDEX CONCURRENTLY that fails or is cancelled leaves
-- its index in the catalog with pg_index.indisvalid = false: every write still maintains
-- it, no query can use it, and IF NOT EXISTS sees its name and skips it. The migrations'
-- helper (django_pgqueue/schema.py), the system check W002 and the lag page read these.
-- Table names are resolved through search_path, as the migrations' unqualified DDL is.


-- name: index_validity
-- Whether the index named index_name exists on table_name, and whether it is valid:
-- no row if it does not exist. Reads the catalog only (pg_index, pg_class).
SELECT pg_index.indisvalid AS valid
FROM pg_index
JOIN pg_class AS index_class ON index_class.oid = pg_index.indexrelid
WHERE pg_index.indrelid = to_regclass(quote_ident(%(table_name)s))
  AND index_class.relname = %(index_name)s


-- name: invalid_indexes
-- Every INVALID index on the given tables (missing tables are ignored), and the pid of
-- a concurrent index build under way on its table right now, if any: while one runs,
-- its own index is invalid until it finishes, which is not a fault. Reads the catalog
-- and pg_stat_progress_create_index only (other roles' builds show no table there).
SELECT
    namespace.nspname AS schema_name,
    table_class.relname AS table_name,
    index_class.relname AS index_name,
    pg_get_indexdef(pg_index.indexrelid) AS definition,
    (
        SELECT min(progress.pid)
        FROM pg_stat_progress_create_index AS progress
        WHERE progress.relid = pg_index.indrelid
    ) AS building_pid
FROM pg_index
JOIN pg_class AS index_class ON index_class.oid = pg_index.indexrelid
JOIN pg_class AS table_class ON table_class.oid = pg_index.indrelid
JOIN pg_namespace AS namespace ON namespace.oid = index_class.relnamespace
WHERE pg_index.indrelid = ANY (
        SELECT to_regclass(quote_ident(queue_table))
        FROM unnest(%(table_names)s::text[]) AS queue_table
    )
  AND NOT pg_index.indisvalid
ORDER BY table_class.relname, index_class.relname
