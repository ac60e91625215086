-- Flow control: paused queues.
--
-- A paused queue has a row in django_pgqueue_queue_pause; claim_batch (lease.sql) skips
-- its queue while the row exists. Enqueue is not affected. The rows are few (one per
-- paused queue) and read by primary key.


-- name: pause_queue
-- Pause a queue; return its pause row and whether this call created it. A queue already
-- paused keeps its first pause (who, when, why). Uses the table's primary key.
WITH inserted AS (
    INSERT INTO django_pgqueue_queue_pause (queue, paused_at, paused_by, reason)
    VALUES (%(queue)s, now(), %(paused_by)s, %(reason)s)
    ON CONFLICT (queue) DO NOTHING
    RETURNING queue, paused_at, paused_by, reason
)
SELECT inserted.queue, inserted.paused_at, inserted.paused_by, inserted.reason,
    true AS created
FROM inserted
UNION ALL
SELECT paused.queue, paused.paused_at, paused.paused_by, paused.reason, false AS created
FROM django_pgqueue_queue_pause AS paused
WHERE paused.queue = %(queue)s
  AND NOT EXISTS (SELECT 1 FROM inserted)


-- name: resume_queue
-- Resume a queue: delete its pause row (returned; nothing if it was not paused) and wake
-- its workers, which may be idle-waiting for a notification. Uses the primary key.
WITH removed AS (
    DELETE FROM django_pgqueue_queue_pause AS paused
    WHERE paused.queue = %(queue)s
    RETURNING paused.queue, paused.paused_at, paused.paused_by, paused.reason
)
SELECT removed.queue, removed.paused_at, removed.paused_by, removed.reason,
    pg_notify(%(channel)s, removed.queue)::text AS notified
FROM removed


-- name: paused_queues
-- Every paused queue with who paused it, when and why. A sequential scan of a table of
-- a few rows.
SELECT paused.queue, paused.paused_at, paused.paused_by, paused.reason
FROM django_pgqueue_queue_pause AS paused
ORDER BY paused.queue
