-- Operators (the admin, scripts): explicit moves of jobs by id.
--
-- Each locks its rows in id order with SKIP LOCKED: a row a worker is touching at that
-- moment (claiming, completing) is skipped and reported back as such, never waited on,
-- so an admin action cannot block on a busy queue or fail with a lock error. A running
-- job is never changed here; the state machine keeps operators to pending and terminal
-- rows. Rows are found by primary key; "= ANY (ARRAY(...))" keeps that true in the
-- generic plans of prepared statements.
-- A partitioned job moved here leaves a partition signal (see enqueue.sql) rather than
-- refreshing its partition: an operator's transaction may stay open for a while, and a
-- partition row it locked would hold up the workers' bookkeeping.


-- name: retry_jobs
-- Revive dead-lettered or cancelled jobs: pending, ready now, attempts reset.
-- The lease generation is kept (it only ever grows), so fencing still holds.
WITH target AS (
    SELECT job.id
    FROM django_pgqueue_job AS job
    WHERE job.id = ANY (%(job_ids)s::bigint[])
      AND job.status IN ('dead_letter', 'cancelled')
    ORDER BY job.id
    FOR UPDATE SKIP LOCKED
),
retried AS (
    UPDATE django_pgqueue_job AS job
    SET status = 'pending',
        attempts = 0,
        available_at = now(),
        finished_at = NULL,
        claimed_by = NULL,
        claimed_at = NULL,
        lease_expires_at = NULL,
        result = NULL,
        unknown_task_since = NULL
    WHERE job.id = ANY (ARRAY(SELECT target.id FROM target))
      AND job.status IN ('dead_letter', 'cancelled')
    RETURNING job.id, job.queue, job.partition_key, job.concurrency_key
),
woken AS (
    SELECT pg_notify(%(channel)s, ready.queue)
    FROM (SELECT DISTINCT retried.queue FROM retried) AS ready
),
signalled AS (
    INSERT INTO django_pgqueue_partition_signal (partition_key)
    SELECT DISTINCT retried.partition_key FROM retried WHERE retried.partition_key IS NOT NULL
),
signalled_keys AS (
    INSERT INTO django_pgqueue_concurrency_signal (concurrency_key)
    SELECT DISTINCT retried.concurrency_key FROM retried
    WHERE retried.concurrency_key IS NOT NULL
)
SELECT retried.id, (SELECT count(*) FROM woken) AS notified
FROM retried


-- name: run_jobs_now
-- Make scheduled or backing-off pending jobs ready now.
-- The rows must be found by id, through the primary key. A plain "available_at > now()"
-- would let the planner prefer an index on available_at instead (the pending index, or a
-- BRIN scan of every block range holding a scheduled job), which on a big backlog reads
-- far more than a thousand ids; COALESCE hides the column from index matching.
WITH target AS (
    SELECT job.id
    FROM django_pgqueue_job AS job
    WHERE job.id = ANY (%(job_ids)s::bigint[])
      AND job.status = 'pending'
    ORDER BY job.id
    FOR UPDATE SKIP LOCKED
),
readied AS (
    UPDATE django_pgqueue_job AS job
    SET available_at = now()
    WHERE job.id = ANY (ARRAY(SELECT target.id FROM target))
      AND job.status = 'pending'
      AND COALESCE(job.available_at, now()) > now()
    RETURNING job.id, job.queue, job.partition_key, job.concurrency_key
),
woken AS (
    SELECT pg_notify(%(channel)s, ready.queue)
    FROM (SELECT DISTINCT readied.queue FROM readied) AS ready
),
signalled AS (
    INSERT INTO django_pgqueue_partition_signal (partition_key)
    SELECT DISTINCT readied.partition_key FROM readied WHERE readied.partition_key IS NOT NULL
),
signalled_keys AS (
    INSERT INTO django_pgqueue_concurrency_signal (concurrency_key)
    SELECT DISTINCT readied.concurrency_key FROM readied
    WHERE readied.concurrency_key IS NOT NULL
)
SELECT readied.id, (SELECT count(*) FROM woken) AS notified
FROM readied


-- name: cancel_jobs
-- Cancel pending jobs. A job being claimed at this instant is skipped (it runs).
WITH target AS (
    SELECT job.id
    FROM django_pgqueue_job AS job
    WHERE job.id = ANY (%(job_ids)s::bigint[])
      AND job.status = 'pending'
    ORDER BY job.id
    FOR UPDATE SKIP LOCKED
),
cancelled AS (
    UPDATE django_pgqueue_job AS job
    SET status = 'cancelled',
        finished_at = now(),
        last_error = COALESCE(%(reason)s, job.last_error)
    WHERE job.id = ANY (ARRAY(SELECT target.id FROM target))
      AND job.status = 'pending'
    RETURNING job.id, job.partition_key, job.concurrency_key
),
signalled AS (
    INSERT INTO django_pgqueue_partition_signal (partition_key)
    SELECT DISTINCT cancelled.partition_key FROM cancelled
    WHERE cancelled.partition_key IS NOT NULL
),
signalled_keys AS (
    INSERT INTO django_pgqueue_concurrency_signal (concurrency_key)
    SELECT DISTINCT cancelled.concurrency_key FROM cancelled
    WHERE cancelled.concurrency_key IS NOT NULL
)
SELECT cancelled.id FROM cancelled


-- name: discard_jobs
-- Delete finished jobs (succeeded, dead-lettered or cancelled); others are skipped.
WITH target AS (
    SELECT job.id
    FROM django_pgqueue_job AS job
    WHERE job.id = ANY (%(job_ids)s::bigint[])
      AND job.status IN ('succeeded', 'dead_letter', 'cancelled')
    ORDER BY job.id
    FOR UPDATE SKIP LOCKED
)
DELETE FROM django_pgqueue_job AS job
WHERE job.id = ANY (ARRAY(SELECT target.id FROM target))
RETURNING job.id
