-- Operators (the admin, scripts): explicit moves of jobs by id.
--
-- Each locks its rows in id order with SKIP LOCKED: a row a worker is touching at that
-- moment (claiming, completing) is skipped and reported back as such, never waited on,
-- so an admin action cannot block on a busy queue or fail with a lock error. The only
-- statement here that touches a running job is cancel_jobs, which asks it to stop and
-- leaves the rest to the worker's own fenced writes. Rows are found by primary key;
-- "= ANY (ARRAY(...))" keeps that true in the generic plans of prepared statements.
-- A partitioned job moved here leaves a partition signal (see enqueue.sql) rather than
-- refreshing its partition: an operator's transaction may stay open for a while, and a
-- partition row it locked would hold up the workers' bookkeeping.


-- name: bring_back
-- Move dead-lettered or cancelled jobs back from the history to the job table, as they
-- are, for retry_jobs (and, with_dependents, the dependents their failure cancelled,
-- transitively, for revive_dependents) to work on in the same transaction. A row
-- locked by someone else is left where it is (retry_jobs reports it busy). A row
-- brought back but not retried then is moved to the history again by housekeeping.
-- The key trigger lets a final row in with the key it already holds. pgq_dep_blocker
-- for the walk, pgq_hist_id in each history partition.
WITH RECURSIVE tree (job_id) AS (
    SELECT unnest(%(job_ids)s::bigint[])
    UNION
    SELECT dep.job_id
    FROM tree
    JOIN django_pgqueue_dependency AS dep ON dep.blocker_id = tree.job_id
    WHERE %(with_dependents)s::boolean
      AND dep.cancelled_job
),
target AS (
    SELECT finished.id
    FROM django_pgqueue_job_history AS finished
    WHERE finished.id = ANY (ARRAY(SELECT tree.job_id FROM tree))
      AND finished.status IN ('dead_letter', 'cancelled')
    ORDER BY finished.id
    FOR UPDATE SKIP LOCKED
),
moved AS (
    DELETE FROM django_pgqueue_job_history AS finished
    WHERE finished.id = ANY (ARRAY(SELECT target.id FROM target))
    RETURNING finished.*
)
INSERT INTO django_pgqueue_job (
    id, queue, task_path, args, kwargs, priority, status, attempts, max_attempts,
    lease_generation, claimed_by, claimed_at, lease_expires_at, available_at,
    created_at, started_at, finished_at, last_error, last_error_class, errors,
    result, idempotency_key, partition_key, partition_bucket, step,
    unknown_task_since, traceparent, awaited, has_dependents, coalesce_key,
    concurrency_key, concurrency_limit, rate_limit, rate_period,
    cancel_requested_at, snoozes
)
SELECT
    id, queue, task_path, args, kwargs, priority, status, attempts, max_attempts,
    lease_generation, claimed_by, claimed_at, lease_expires_at, available_at,
    created_at, started_at, finished_at, last_error, last_error_class, errors,
    result, idempotency_key, partition_key, partition_bucket, step,
    unknown_task_since, traceparent, awaited, has_dependents, coalesce_key,
    concurrency_key, concurrency_limit, rate_limit, rate_period,
    cancel_requested_at, snoozes
FROM moved
RETURNING id


-- name: retry_jobs
-- Revive dead-lettered or cancelled jobs, attempts and snoozes reset, ready now: pending,
-- or blocked if some job it runs after (after=) has not finished yet (it runs once they
-- have, as when it was enqueued). A job a failed blocker would cancel again (policy "cancel")
-- is left alone: retry that blocker (with revive_dependents) instead. Its blockers are
-- locked (id order, after the retried rows) before their statuses are read, so one
-- finishing meanwhile either committed first (and is read finished) or waits for this
-- commit (and its settling trigger then finds the job blocked). A blocker locked by
-- someone else right now (being finished this instant, or held by an atomic task's
-- transaction) is not waited on: its dependent comes back with retried = false
-- ("busy") and the manager tries again briefly. A blocker retried in this same
-- statement counts as unfinished, unless it is itself held back: then what it would
-- have done to its dependents (cancel them, or leave them busy) is done here, through
-- "held_back". The lease generation is kept (it only ever grows), so fencing still
-- holds; the coalesce key is let go (a newer job may hold it by now). pgq_dep_job for the
-- edges.
WITH RECURSIVE target AS (
    SELECT job.id
    FROM django_pgqueue_job AS job
    WHERE job.id = ANY (%(job_ids)s::bigint[])
      AND job.status IN ('dead_letter', 'cancelled')
    ORDER BY job.id
    FOR UPDATE SKIP LOCKED
),
edges AS (
    -- An edge whose blocker no longer exists in either tier (pruned) counts as gone,
    -- as it was when pruning deleted edges with their jobs.
    SELECT dep.job_id, dep.blocker_id, dep.on_failure
    FROM django_pgqueue_dependency AS dep
    WHERE dep.job_id = ANY (ARRAY(SELECT target.id FROM target))
      AND EXISTS (
          SELECT 1 FROM django_pgqueue_job_all AS blocker WHERE blocker.id = dep.blocker_id
      )
),
live_blockers AS (
    SELECT blocker.id, blocker.status
    FROM django_pgqueue_job AS blocker
    WHERE blocker.id = ANY (ARRAY(SELECT edges.blocker_id FROM edges))
    ORDER BY blocker.id
    FOR NO KEY UPDATE SKIP LOCKED
),
finished_blockers AS (
    -- In either tier: the job table first, then the history.
    SELECT blocker.id, blocker.status
    FROM django_pgqueue_job_history AS blocker
    WHERE blocker.id = ANY (ARRAY(SELECT edges.blocker_id FROM edges))
    ORDER BY blocker.id
    FOR NO KEY UPDATE SKIP LOCKED
),
blockers AS (
    SELECT live_blockers.id, live_blockers.status FROM live_blockers
    UNION ALL
    SELECT finished_blockers.id, finished_blockers.status FROM finished_blockers
),
held_back (id, busy) AS (
    -- Retried jobs that stay as they are: a blocker locked elsewhere (busy), or a
    -- failed blocker not retried here whose policy would cancel them again ...
    SELECT edges.job_id, blockers.id IS NULL
    FROM edges
    LEFT JOIN blockers ON blockers.id = edges.blocker_id
    WHERE blockers.id IS NULL
       OR (
           edges.blocker_id <> ALL (ARRAY(SELECT target.id FROM target))
           AND blockers.status IN ('dead_letter', 'cancelled')
           AND edges.on_failure = 'cancel'
       )
    UNION
    -- ... and, transitively, the retried jobs after them: cancelled again (policy
    -- "cancel"), or busy with them.
    SELECT edges.job_id, held_back.busy
    FROM held_back
    JOIN edges ON edges.blocker_id = held_back.id
    WHERE edges.on_failure = 'cancel' OR held_back.busy
),
decided AS (
    SELECT target.id,
        -- Decided on a later try (unless a failure holds it back for good anyway).
        coalesce(bool_or(held_back.busy), false) AND NOT coalesce(
            bool_or(NOT held_back.busy), false
        ) AS busy,
        -- Left alone: a failed blocker whose policy would cancel it again.
        coalesce(bool_or(NOT held_back.busy), false) AS doomed,
        -- A blocker not finished, or retried here too (and not held back): it waits,
        -- blocked.
        coalesce((
            SELECT bool_or(
                (
                    blockers.id = ANY (ARRAY(SELECT target.id FROM target))
                    AND blockers.id <> ALL (ARRAY(SELECT held_back.id FROM held_back))
                )
                OR blockers.status NOT IN ('succeeded', 'dead_letter', 'cancelled')
            )
            FROM edges
            JOIN blockers ON blockers.id = edges.blocker_id
            WHERE edges.job_id = target.id
        ), false) AS waits
    FROM target
    LEFT JOIN held_back ON held_back.id = target.id
    GROUP BY target.id
),
retried AS (
    UPDATE django_pgqueue_job AS job
    SET status = CASE WHEN decided.waits THEN 'blocked' ELSE 'pending' END,
        attempts = 0,
        snoozes = 0,
        available_at = now(),
        finished_at = NULL,
        claimed_by = NULL,
        claimed_at = NULL,
        lease_expires_at = NULL,
        result = NULL,
        unknown_task_since = NULL,
        cancel_requested_at = NULL,
        coalesce_key = NULL
    FROM decided
    WHERE job.id = decided.id
      AND NOT decided.busy
      AND NOT decided.doomed
      AND job.status IN ('dead_letter', 'cancelled')
    RETURNING job.id, job.status, job.queue, job.partition_key, job.concurrency_key
),
woken AS (
    SELECT pg_notify(%(channel)s, ready.queue)
    FROM (SELECT DISTINCT retried.queue FROM retried WHERE retried.status = 'pending') AS ready
),
signalled AS (
    -- Blocked ones too: a blocked job holds its partition's turn.
    -- Each naming its partition's oldest job retried here (migration 0024).
    INSERT INTO django_pgqueue_partition_signal (partition_key, job_id)
    SELECT retried.partition_key, min(retried.id) FROM retried
    WHERE retried.partition_key IS NOT NULL
    GROUP BY retried.partition_key
),
signalled_keys AS (
    INSERT INTO django_pgqueue_concurrency_signal (concurrency_key)
    SELECT DISTINCT retried.concurrency_key FROM retried
    WHERE retried.concurrency_key IS NOT NULL AND retried.status = 'pending'
),
flow_woken AS (
    SELECT pg_notify(%(flow_channel)s, ready.queue)
    FROM (
        SELECT DISTINCT retried.queue FROM retried
        WHERE retried.status = 'pending'
          AND (retried.partition_key IS NOT NULL OR retried.concurrency_key IS NOT NULL)
    ) AS ready
)
SELECT retried.id, true AS retried,
    (SELECT count(*) FROM woken) + (SELECT count(*) FROM flow_woken) AS notified
FROM retried
UNION ALL
-- Revivable, but its row or a blocker's is locked by someone else at this instant.
SELECT job.id, false AS retried, 0 AS notified
FROM django_pgqueue_job AS job
WHERE job.id = ANY (%(job_ids)s::bigint[])
  AND job.status IN ('dead_letter', 'cancelled')
  AND (
      job.id <> ALL (ARRAY(SELECT target.id FROM target))
      OR job.id = ANY (ARRAY(SELECT decided.id FROM decided WHERE decided.busy))
  )
UNION ALL
-- Revivable, but still in the history: bring_back found its row locked (a producer
-- enqueueing after it holds it until its commit).
SELECT finished.id, false AS retried, 0 AS notified
FROM django_pgqueue_job_history AS finished
WHERE finished.id = ANY (%(job_ids)s::bigint[])
  AND finished.status IN ('dead_letter', 'cancelled')


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
    INSERT INTO django_pgqueue_partition_signal (partition_key, job_id)
    SELECT readied.partition_key, min(readied.id) FROM readied
    WHERE readied.partition_key IS NOT NULL
    GROUP BY readied.partition_key
),
signalled_keys AS (
    INSERT INTO django_pgqueue_concurrency_signal (concurrency_key)
    SELECT DISTINCT readied.concurrency_key FROM readied
    WHERE readied.concurrency_key IS NOT NULL
),
flow_woken AS (
    -- Their partitions and keys are signalled: the workers claim with those next.
    SELECT pg_notify(%(flow_channel)s, ready.queue)
    FROM (
        SELECT DISTINCT readied.queue FROM readied
        WHERE readied.partition_key IS NOT NULL OR readied.concurrency_key IS NOT NULL
    ) AS ready
)
SELECT readied.id, (SELECT count(*) FROM woken) + (SELECT count(*) FROM flow_woken) AS notified
FROM readied


-- name: cancel_jobs
-- Cancel pending, blocked and running jobs. A pending or blocked job ends cancelled at
-- once. A running one is asked to stop: it stays processing, with its lease, its
-- partition's turn and its concurrency slot, until its handler has returned (the
-- worker's outcome statement then records it cancelled, its result dropped) or its
-- lease has expired (the reaper does); so nothing can start beside it, and a retry
-- cannot revive it while it still runs. Its worker is told at once on the lease channel
-- (a hint: its next heartbeat reads the request anyway). A cancelled job's dependents
-- are settled by the job table's status trigger (migration 0009) like any finish; their
-- locks are taken first, in id order, as complete_many_if_leased does. A row locked
-- right now (claimed or finished this instant, or held by an atomic task's open
-- transaction) is not waited on: it comes back with cancelled = false ("busy") and the
-- manager tries it again briefly. Rows found by primary key. Returns each job with
-- whether it was cancelled (or asked to stop) and whether it is still running.
WITH target AS (
    SELECT job.id, job.status, job.claimed_by, job.lease_generation, job.has_dependents
    FROM django_pgqueue_job AS job
    WHERE job.id = ANY (%(job_ids)s::bigint[])
      AND job.status IN ('pending', 'blocked', 'processing')
    ORDER BY job.id
    FOR UPDATE SKIP LOCKED
),
cancelled AS (
    UPDATE django_pgqueue_job AS job
    SET status = CASE WHEN job.status = 'processing' THEN job.status ELSE 'cancelled' END,
        finished_at = CASE WHEN job.status = 'processing' THEN NULL ELSE now() END,
        cancel_requested_at = CASE
            WHEN job.status = 'processing' THEN COALESCE(job.cancel_requested_at, now())
        END,
        last_error = COALESCE(%(reason)s, job.last_error)
    WHERE job.id = ANY (ARRAY(SELECT target.id FROM target))
      AND job.status IN ('pending', 'blocked', 'processing')
      AND (
          SELECT CASE WHEN cardinality(settling.ids) > 0 THEN
              django_pgqueue_lock_dependents('{}', settling.ids)
          ELSE 0 END
          FROM (
              SELECT ARRAY(
                  SELECT target.id FROM target
                  WHERE target.has_dependents AND target.status <> 'processing'
              ) AS ids
          ) AS settling
      ) >= 0
    RETURNING job.id, job.queue, job.status, job.partition_key, job.concurrency_key
),
stopping AS (
    -- The running ones, with the lease their worker holds.
    SELECT target.id, target.claimed_by, target.lease_generation
    FROM target
    JOIN cancelled ON cancelled.id = target.id
    WHERE cancelled.status = 'processing'
),
told AS (
    SELECT pg_notify(%(lease_channel)s, json_build_object(
        'worker', stopping.claimed_by,
        'job', stopping.id,
        'generation', stopping.lease_generation,
        'reason', 'cancelled'
    )::text)
    FROM stopping
),
signalled AS (
    -- A pending or blocked partitioned job that is cancelled may have been its
    -- partition's next job.
    INSERT INTO django_pgqueue_partition_signal (partition_key, job_id)
    SELECT cancelled.partition_key, min(cancelled.id) FROM cancelled
    WHERE cancelled.partition_key IS NOT NULL AND cancelled.status = 'cancelled'
    GROUP BY cancelled.partition_key
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
    WHERE cancelled.concurrency_key IS NOT NULL AND cancelled.status = 'cancelled'
),
flow_woken AS (
    -- A cancelled next job of a partition may let the one behind it start.
    SELECT pg_notify(%(flow_channel)s, freed.queue)
    FROM (
        SELECT DISTINCT cancelled.queue FROM cancelled
        WHERE cancelled.status = 'cancelled' AND cancelled.partition_key IS NOT NULL
    ) AS freed
)
SELECT cancelled.id, true AS cancelled, cancelled.status = 'processing' AS running,
    (SELECT count(*) FROM told) + (SELECT count(*) FROM flow_woken) AS notified
FROM cancelled
UNION ALL
SELECT busy.id, false AS cancelled, false AS running, 0 AS notified
FROM busy


-- name: discard_jobs
-- Delete finished jobs (succeeded, dead-lettered or cancelled), in either tier, and free
-- their idempotency keys; others are skipped. Rows locked by someone else are skipped
-- too. Primary key, and pgq_hist_id in each history partition.
WITH target AS (
    SELECT job.id
    FROM django_pgqueue_job AS job
    WHERE job.id = ANY (%(job_ids)s::bigint[])
      AND job.status IN ('succeeded', 'dead_letter', 'cancelled')
    ORDER BY job.id
    FOR UPDATE SKIP LOCKED
),
finished_target AS (
    SELECT finished.id
    FROM django_pgqueue_job_history AS finished
    WHERE finished.id = ANY (%(job_ids)s::bigint[])
    ORDER BY finished.id
    FOR UPDATE SKIP LOCKED
),
gone AS (
    DELETE FROM django_pgqueue_job AS job
    WHERE job.id = ANY (ARRAY(SELECT target.id FROM target))
    RETURNING job.id, job.idempotency_key
),
finished_gone AS (
    DELETE FROM django_pgqueue_job_history AS finished
    WHERE finished.id = ANY (ARRAY(SELECT finished_target.id FROM finished_target))
    RETURNING finished.id, finished.idempotency_key
),
freed_keys AS (
    -- A discarded job's key is free at once, as when the unique index held it.
    DELETE FROM django_pgqueue_job_key AS taken
    WHERE taken.idempotency_key = ANY (ARRAY(
        SELECT gone.idempotency_key FROM gone WHERE gone.idempotency_key IS NOT NULL
        UNION ALL
        SELECT finished_gone.idempotency_key FROM finished_gone
        WHERE finished_gone.idempotency_key IS NOT NULL
    ))
)
SELECT gone.id FROM gone
UNION ALL
SELECT finished_gone.id FROM finished_gone
