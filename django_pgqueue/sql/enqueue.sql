-- Producers: putting jobs into the inbox.
--
-- NOTIFY is only a wake-up hint, never the source of truth and never the payload: the
-- payload names the queue, nothing else. PostgreSQL delivers it at COMMIT and folds
-- identical (channel, payload) pairs raised in one transaction into one, so a transaction
-- enqueuing a thousand jobs into a queue wakes its workers once.


-- name: enqueue
-- Insert one job, or return the job already holding its idempotency key.
-- A key held by an uncommitted insert makes ON CONFLICT wait for that transaction: if it
-- commits, this insert does nothing (the caller then reads the winner with
-- select_by_idempotency_keys, in a new snapshot); if it rolls back, this insert wins.
-- Uses pgq_job_idempotency_key (the unique partial index) for the conflict check.
WITH inserted AS (
    INSERT INTO django_pgqueue_job (
        queue, task_path, args, kwargs, priority, status, attempts, max_attempts,
        lease_generation, available_at, created_at, errors, idempotency_key,
        partition_key, partition_bucket
    )
    VALUES (
        %(queue)s, %(task_path)s, %(args)s::jsonb, %(kwargs)s::jsonb, %(priority)s,
        'pending', 0, %(max_attempts)s, 0, COALESCE(%(available_at)s::timestamptz, now()),
        now(), '[]'::jsonb, %(idempotency_key)s, %(partition_key)s, %(partition_bucket)s
    )
    ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING *
),
woken AS (
    SELECT pg_notify(%(channel)s, inserted.queue)
    FROM inserted
    WHERE inserted.available_at <= now()
)
SELECT inserted.*, true AS created, (SELECT count(*) FROM woken) AS notified
FROM inserted
UNION ALL
SELECT existing.*, false AS created, 0 AS notified
FROM django_pgqueue_job AS existing
WHERE existing.idempotency_key = %(idempotency_key)s
  AND NOT EXISTS (SELECT 1 FROM inserted)


-- name: enqueue_many
-- Insert many jobs in one statement; rows whose idempotency key is taken are skipped.
-- The arrays are parallel (one element per job). Rows come back in input order; skipped
-- rows are missing and the caller reads them with select_by_idempotency_keys.
WITH incoming AS (
    SELECT *
    FROM unnest(
        %(queues)s::text[], %(task_paths)s::text[], %(args)s::text[], %(kwargs)s::text[],
        %(priorities)s::smallint[], %(max_attempts)s::integer[],
        %(available_at)s::timestamptz[], %(idempotency_keys)s::text[],
        %(partition_keys)s::text[], %(partition_buckets)s::smallint[]
    ) WITH ORDINALITY AS incoming (
        queue, task_path, args, kwargs, priority, max_attempts, available_at,
        idempotency_key, partition_key, partition_bucket, position
    )
),
inserted AS (
    INSERT INTO django_pgqueue_job (
        queue, task_path, args, kwargs, priority, status, attempts, max_attempts,
        lease_generation, available_at, created_at, errors, idempotency_key,
        partition_key, partition_bucket
    )
    SELECT
        incoming.queue, incoming.task_path, incoming.args::jsonb, incoming.kwargs::jsonb,
        incoming.priority, 'pending', 0, incoming.max_attempts, 0,
        COALESCE(incoming.available_at, now()), now(), '[]'::jsonb,
        incoming.idempotency_key, incoming.partition_key, incoming.partition_bucket
    FROM incoming
    ORDER BY incoming.position
    ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING *
),
woken AS (
    SELECT pg_notify(%(channel)s, ready.queue)
    FROM (SELECT DISTINCT inserted.queue FROM inserted WHERE inserted.available_at <= now()) AS ready
)
SELECT inserted.*, true AS created, (SELECT count(*) FROM woken) AS notified
FROM inserted


-- name: select_by_idempotency_keys
-- Read the jobs holding the given idempotency keys (after ON CONFLICT skipped them).
-- Uses pgq_job_idempotency_key.
SELECT job.*, false AS created, 0 AS notified
FROM django_pgqueue_job AS job
WHERE job.idempotency_key = ANY (%(idempotency_keys)s::text[])
