-- The history tier: retention classes, partitions made ahead, pruning by partition.
--
-- Finished jobs go to django_pgqueue_job_history, partitioned by retention class and
-- then by finish time (migration 0019). These statements run in housekeeping, one
-- worker at a time (each step's transaction takes the housekeeping lock first), and
-- bound every lock wait with a short lock_timeout: DDL queued behind a long reader
-- would stop every writer of the same table behind it.


-- name: limit_history_lock_wait
-- Bound how long the rest of this transaction waits for any lock. SET LOCAL: ends with
-- the transaction, safe behind PgBouncer.
SELECT set_config('lock_timeout', %(lock_timeout)s, true)


-- name: sync_history_classes
-- Write the retention classes the settings define: classes is one JSON document,
-- [[status, queue or null, keep seconds or null], ...], with the three classes of every
-- queue (queue null) first. A row is only written when it changes. A queue class no
-- longer in the settings is retired: no new job goes to it, and it is kept as long as
-- its status's class for every queue says. Uses pgq_history_class_unique (NULLS NOT
-- DISTINCT: the every-queue rows conflict on a NULL queue too).
WITH wanted AS (
    SELECT item ->> 0 AS status, item ->> 1 AS queue, (item ->> 2)::float8 AS keep_seconds
    FROM jsonb_array_elements(%(classes)s::jsonb) AS item
),
written AS (
    INSERT INTO django_pgqueue_history_class AS cls (status, queue, keep_seconds, retired)
    SELECT wanted.status, wanted.queue, wanted.keep_seconds, false
    FROM wanted
    ON CONFLICT (status, queue) DO UPDATE
    SET keep_seconds = excluded.keep_seconds, retired = false
    WHERE (cls.keep_seconds, cls.retired) IS DISTINCT FROM (excluded.keep_seconds, false)
    RETURNING cls.id
),
retired AS (
    UPDATE django_pgqueue_history_class AS cls
    SET retired = true,
        keep_seconds = every_queue.keep_seconds
    FROM wanted AS every_queue
    WHERE every_queue.queue IS NULL
      AND every_queue.status = cls.status
      AND cls.queue IS NOT NULL
      AND (
          NOT cls.retired
          OR cls.keep_seconds IS DISTINCT FROM every_queue.keep_seconds
      )
      AND NOT EXISTS (
          SELECT 1 FROM wanted
          WHERE wanted.status = cls.status AND wanted.queue = cls.queue
      )
    RETURNING cls.id
)
SELECT (SELECT count(*) FROM written) AS written, (SELECT count(*) FROM retired) AS retired


-- name: ensure_history_partitions
-- Make what is missing of every class's partitions, from the current period to `ahead`
-- periods later (django_pgqueue_ensure_history, migration 0019). Returns how many were
-- made and how many periods could not be attached (see the function).
SELECT ensured.created, ensured.skipped
FROM django_pgqueue_ensure_history(%(period)s, %(ahead)s) AS ensured


-- name: prune_history
-- Drop up to max_drops partitions whose period ended longer ago than their class is
-- kept, oldest first, and delete up to default_limit expired rows of the DEFAULT
-- partitions (django_pgqueue_prune_history, migration 0019). A partition whose lock is
-- not granted within the lock_timeout is left for the next pass (deferred).
SELECT pruned.dropped, pruned.rows_estimate, pruned.deferred, pruned.deleted
FROM django_pgqueue_prune_history(%(max_drops)s, %(default_limit)s) AS pruned


-- name: history_partitions
-- Every range and DEFAULT partition of the history with its class, bounds and the
-- planner's row estimate (-1 until first analyzed is shown as 0), oldest first. Reads
-- the catalog only.
SELECT cls.id AS class_id, cls.status, cls.queue, cls.keep_seconds, cls.retired,
    child.relname AS partition_name,
    substring(pg_get_expr(child.relpartbound, child.oid) FROM 'FROM \(''([^'']+)''\)')::timestamptz
        AS lower_bound,
    substring(pg_get_expr(child.relpartbound, child.oid) FROM 'TO \(''([^'']+)''\)')::timestamptz
        AS upper_bound,
    greatest(child.reltuples, 0)::bigint AS rows_estimate
FROM django_pgqueue_history_class AS cls
JOIN pg_inherits AS inh
  ON inh.inhparent = to_regclass(quote_ident('django_pgqueue_job_history_c' || cls.id))
JOIN pg_class AS child ON child.oid = inh.inhrelid
ORDER BY cls.id, upper_bound NULLS FIRST, child.relname
