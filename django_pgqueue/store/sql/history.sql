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


-- name: move_finished
-- Move up to `limit` finished jobs from the job table to the history, oldest finish
-- first: the rows finished before migration 0020 (a few thousand per housekeeping
-- pass, each batch its own short transaction, so the upgrade never holds the table),
-- and rows an operator's retry brought back and did not retry. Every other finished
-- job moves in the statement that finished it (django_pgqueue_job_to_history). Rows
-- locked by someone else are skipped. The keys they hold are recorded as taken.
-- pgq_job_finished, then the primary key.
WITH target AS (
    SELECT job.id
    FROM django_pgqueue_job AS job
    WHERE job.status IN ('succeeded', 'dead_letter', 'cancelled')
    ORDER BY job.finished_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
),
moved AS (
    DELETE FROM django_pgqueue_job AS job
    WHERE job.id = ANY (ARRAY(SELECT target.id FROM target))
      AND job.status IN ('succeeded', 'dead_letter', 'cancelled')
    RETURNING job.*
),
keys AS (
    INSERT INTO django_pgqueue_job_key (idempotency_key)
    SELECT moved.idempotency_key FROM moved WHERE moved.idempotency_key IS NOT NULL
    ON CONFLICT (idempotency_key) DO NOTHING
),
inserted AS (
    INSERT INTO django_pgqueue_job_history (
        id, queue, task_path, args, kwargs, priority, status, attempts, max_attempts,
        lease_generation, claimed_by, claimed_at, lease_expires_at, available_at,
        created_at, started_at, finished_at, last_error, last_error_class, errors,
        result, idempotency_key, partition_key, partition_bucket, step,
        unknown_task_since, traceparent, awaited, has_dependents, coalesce_key,
        concurrency_key, concurrency_limit, rate_limit, rate_period,
        cancel_requested_at, snoozes,
        history_class
    )
    SELECT
        moved.id, moved.queue, moved.task_path, moved.args, moved.kwargs,
        moved.priority, moved.status, moved.attempts, moved.max_attempts,
        moved.lease_generation, moved.claimed_by, moved.claimed_at,
        moved.lease_expires_at, moved.available_at, moved.created_at, moved.started_at,
        coalesce(moved.finished_at, now()), moved.last_error, moved.last_error_class,
        moved.errors, moved.result, moved.idempotency_key, moved.partition_key,
        moved.partition_bucket, moved.step, moved.unknown_task_since, moved.traceparent,
        moved.awaited, moved.has_dependents, moved.coalesce_key, moved.concurrency_key,
        moved.concurrency_limit, moved.rate_limit, moved.rate_period,
        moved.cancel_requested_at, moved.snoozes,
        django_pgqueue_history_class_of(moved.status, moved.queue)
    FROM moved
    RETURNING 1
)
SELECT count(*) AS moved FROM inserted


-- name: lock_idempotency_keys
-- The first of two statements freeing idempotency keys no job holds any more (its job
-- was pruned or discarded): lock up to `limit` of them, the keys least recently found
-- held first, each at most once per recheck_seconds. A key a producer is taking right
-- now is locked by it (or not committed yet), so never a candidate. The check follows
-- in free_idempotency_keys, in the same transaction: its new snapshot sees every job a
-- producer committed before the lock was taken, which this statement's may not (a
-- producer that took the key over would otherwise lose it to this one). pgq_key_checked.
SELECT taken.idempotency_key
FROM django_pgqueue_job_key AS taken
WHERE taken.checked_at < now() - make_interval(secs => %(recheck_seconds)s)
ORDER BY taken.checked_at
LIMIT %(limit)s
FOR UPDATE SKIP LOCKED


-- name: free_idempotency_keys
-- Delete the locked keys no job holds, in either tier; mark the others checked.
-- pgq_job_idempotency_key and pgq_hist_idempotency_key.
WITH held AS (
    -- "= ANY (...)": probes of the keys' indexes, whatever the plan's estimates (an
    -- EXISTS could become a hash join over the whole job table).
    SELECT job.idempotency_key
    FROM django_pgqueue_job AS job
    WHERE job.idempotency_key = ANY (%(keys)s::text[])
    UNION
    SELECT finished.idempotency_key
    FROM django_pgqueue_job_history AS finished
    WHERE finished.idempotency_key = ANY (%(keys)s::text[])
),
rechecked AS (
    UPDATE django_pgqueue_job_key AS taken
    SET checked_at = now()
    WHERE taken.idempotency_key = ANY (ARRAY(SELECT held.idempotency_key FROM held))
),
freed AS (
    -- The keys less the held ones as a set difference, then probes of the primary key:
    -- "<> ALL" of the held keys compared every key with every held one, 2 s for a
    -- batch of 20,000 keys that jobs still hold.
    DELETE FROM django_pgqueue_job_key AS taken
    WHERE taken.idempotency_key = ANY (ARRAY(
        SELECT given.key FROM unnest(%(keys)s::text[]) AS given (key)
        EXCEPT
        SELECT held.idempotency_key FROM held
    ))
    RETURNING 1
)
SELECT count(*) AS freed FROM freed
