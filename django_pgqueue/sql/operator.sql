-- Operators (the admin, scripts): explicit moves of jobs by id.
--
-- Each locks its rows in id order with SKIP LOCKED: a row a worker is touching at that
-- moment (claiming, completing) is skipped and reported back as such, never waited on,
-- so an admin action cannot block on a busy queue or fail with a lock error. The only
-- move of a running job here is cancel_jobs, fenced like the workers' own writes. Rows are found by primary key; "= ANY (ARRAY(...))" keeps that true in the
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
-- Cancel pending, blocked and running jobs. A running job leaves 'processing' with its
-- lease cleared and its lease generation moved on, so every later fenced write of the
-- worker that ran it (completion, failure, step, extension) is refused; that worker is
-- told at once on the lease channel (a hint: its next heartbeat finds the lease gone
-- anyway). A cancelled job's dependents are settled by the job table's status trigger
-- (migration 0009) like any finish. A row locked right now (claimed or finished this
-- instant, or held by an atomic task's open transaction) is not waited on: it comes back
-- with cancelled = false ("busy") and the manager tries it again briefly. Rows found by
-- primary key.
WITH target AS (
    SELECT job.id, job.status, job.claimed_by, job.lease_generation
    FROM django_pgqueue_job AS job
    WHERE job.id = ANY (%(job_ids)s::bigint[])
      AND job.status IN ('pending', 'blocked', 'processing')
    ORDER BY job.id
    FOR UPDATE SKIP LOCKED
),
cancelled AS (
    UPDATE django_pgqueue_job AS job
    SET status = 'cancelled',
        finished_at = now(),
        lease_expires_at = NULL,
        lease_generation = job.lease_generation
            + CASE WHEN job.status = 'processing' THEN 1 ELSE 0 END,
        last_error = COALESCE(%(reason)s, job.last_error)
    WHERE job.id = ANY (ARRAY(SELECT target.id FROM target))
      AND job.status IN ('pending', 'blocked', 'processing')
    RETURNING job.id, job.queue, job.partition_key, job.concurrency_key
),
stopped AS (
    -- The running ones, with the lease their worker held.
    SELECT target.id, target.claimed_by, target.lease_generation, cancelled.queue,
        cancelled.partition_key, cancelled.concurrency_key
    FROM target
    JOIN cancelled ON cancelled.id = target.id
    WHERE target.status = 'processing'
),
told AS (
    SELECT pg_notify(%(lease_channel)s, json_build_object(
        'worker', stopped.claimed_by,
        'job', stopped.id,
        'generation', stopped.lease_generation,
        'reason', 'cancelled'
    )::text)
    FROM stopped
),
woken AS (
    -- A running partitioned or limited job held its partition or a slot of its key: wake
    -- the queue's workers, whose next claim folds the signals below and starts the next job.
    SELECT pg_notify(%(channel)s, freed.queue)
    FROM (
        SELECT DISTINCT stopped.queue FROM stopped
        WHERE stopped.partition_key IS NOT NULL OR stopped.concurrency_key IS NOT NULL
    ) AS freed
),
signalled AS (
    INSERT INTO django_pgqueue_partition_signal (partition_key)
    SELECT DISTINCT cancelled.partition_key FROM cancelled
    WHERE cancelled.partition_key IS NOT NULL
),
busy AS (
    -- Cancellable, but locked by someone else at this instant.
    SELECT job.id
    FROM django_pgqueue_job AS job
    WHERE job.id = ANY (%(job_ids)s::bigint[])
      AND job.status IN ('pending', 'blocked', 'processing')
      AND job.id <> ALL (ARRAY(SELECT target.id FROM target))
),
signalled_keys AS (
    INSERT INTO django_pgqueue_concurrency_signal (concurrency_key)
    SELECT DISTINCT cancelled.concurrency_key FROM cancelled
    WHERE cancelled.concurrency_key IS NOT NULL
)
SELECT cancelled.id, true AS cancelled,
    (SELECT count(*) FROM told) + (SELECT count(*) FROM woken) AS notified
FROM cancelled
UNION ALL
SELECT busy.id, false AS cancelled, 0 AS notified
FROM busy


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
