-- Dependencies: jobs that run after other jobs (after=), and waiting for a job to finish.
--
-- Settling (a dependent becoming pending when its last blocker succeeds, or cancelled
-- when one fails) is not here: the trigger django_pgqueue_job_settle of migration 0009
-- does it inside whichever statement finished the blocker. These statements only
-- create the edges, and revive what a failure cancelled.


-- name: lock_blockers
-- Lock the jobs a new job will run after, and read their status. The lock (held until
-- the producer commits) makes a blocker's completion wait for the new edge to be
-- committed, so the settling trigger sees it; FOR NO KEY UPDATE, not FOR SHARE, because
-- enqueue_after then flags the rows (two producers sharing a blocker would otherwise
-- both hold SHARE and deadlock on the upgrade). Id order: every producer locks alike.
-- A blocker may have finished and moved to the history (where its row is locked
-- alike: a retry bringing it back waits for the producer). The job table is locked
-- first, then the history, as every statement touching both does. A blocker moving
-- between the tiers at this instant is in neither snapshot: the caller asks again.
-- Rows are found by primary key, and pgq_hist_id in each history partition.
WITH live AS (
    SELECT job.id, job.status
    FROM django_pgqueue_job AS job
    WHERE job.id = ANY (%(blocker_ids)s::bigint[])
    ORDER BY job.id
    FOR NO KEY UPDATE
),
finished AS (
    SELECT finished.id, finished.status
    FROM django_pgqueue_job_history AS finished
    WHERE finished.id = ANY (%(blocker_ids)s::bigint[])
    ORDER BY finished.id
    FOR NO KEY UPDATE
)
SELECT live.id, live.status FROM live
UNION ALL
SELECT finished.id, finished.status FROM finished


-- name: enqueue_after
-- Insert one job that runs after the given (locked, existing) jobs, with the status the
-- caller decided from their statuses: blocked, pending (every blocker had succeeded) or
-- cancelled (a blocker had failed, policy "cancel"). Records one edge per blocker, in
-- after= order, and flags the blockers so the settling trigger runs for them. Workers
-- are woken and the partition signalled only for a job that is pending and ready.
WITH inserted AS (
    INSERT INTO django_pgqueue_job (
        queue, task_path, args, kwargs, priority, status, attempts, max_attempts,
        lease_generation, available_at, created_at, finished_at, last_error, errors,
        idempotency_key, partition_key, partition_bucket, traceparent, concurrency_key,
        concurrency_limit, rate_limit, rate_period
    )
    VALUES (
        %(queue)s, %(task_path)s, %(args)s::jsonb, %(kwargs)s::jsonb, %(priority)s,
        %(status)s::text, 0, %(max_attempts)s, 0, COALESCE(%(available_at)s::timestamptz, now()),
        now(), CASE WHEN %(status)s::text = 'cancelled' THEN now() END, %(last_error)s::text,
        '[]'::jsonb, NULL, %(partition_key)s, %(partition_bucket)s, %(traceparent)s,
        %(concurrency_key)s, %(concurrency_limit)s, %(rate_limit)s, %(rate_period)s
    )
    RETURNING id, created_at, available_at, queue, partition_key, concurrency_key, status,
        priority
),
linked AS (
    INSERT INTO django_pgqueue_dependency (
        job_id, blocker_id, position, on_failure, wake_channel, cancelled_job
    )
    SELECT inserted.id, blocker.id, blocker.position - 1, %(on_failure)s::text, %(channel)s::text,
        blocker.id IS NOT DISTINCT FROM %(cancelled_by)s::bigint
    FROM inserted
    CROSS JOIN unnest(%(blocker_ids)s::bigint[]) WITH ORDINALITY AS blocker (id, position)
),
flagged AS (
    UPDATE django_pgqueue_job AS job
    SET has_dependents = true
    WHERE job.id = ANY (%(blocker_ids)s::bigint[])
      AND NOT job.has_dependents
),
flagged_finished AS (
    -- A finished blocker keeps the flag for when a retry brings it back.
    UPDATE django_pgqueue_job_history AS finished
    SET has_dependents = true
    WHERE finished.id = ANY (%(blocker_ids)s::bigint[])
      AND NOT finished.has_dependents
),
woken AS (
    SELECT pg_notify(%(channel)s::text, inserted.queue)
    FROM inserted
    WHERE inserted.status = 'pending' AND inserted.available_at <= now()
),
fresh AS (
    -- A pending job only, urgent or lazy as in enqueue.sql. A blocked job needs no
    -- signal: it is the youngest of its partition, so it can only be the next job once
    -- the others have gone, and the statements that move them read the job table.
    SELECT inserted.id, inserted.queue, inserted.available_at <= now() AS ready,
        inserted.partition_key, NOT EXISTS (
            SELECT 1 FROM django_pgqueue_partition AS part
            WHERE part.partition_key = inserted.partition_key
              AND part.head_id IS NOT NULL
              AND part.head_id IS DISTINCT FROM part.running_id
        ) AS partition_urgent,
        inserted.concurrency_key, NOT EXISTS (
            SELECT 1 FROM django_pgqueue_concurrency AS conc
            WHERE conc.concurrency_key = inserted.concurrency_key
              AND conc.head_id IS NOT NULL
              AND conc.head_available_at <= now()
              AND conc.head_priority >= inserted.priority
        ) AS key_urgent
    FROM inserted
    WHERE inserted.status = 'pending'
      AND (inserted.partition_key IS NOT NULL OR inserted.concurrency_key IS NOT NULL)
),
signalled AS (
    INSERT INTO django_pgqueue_partition_signal (partition_key, urgent)
    SELECT fresh.partition_key, fresh.partition_urgent FROM fresh
    WHERE fresh.partition_key IS NOT NULL
),
signalled_keys AS (
    INSERT INTO django_pgqueue_concurrency_signal (concurrency_key, urgent, job_id)
    SELECT fresh.concurrency_key, fresh.key_urgent, fresh.id FROM fresh
    WHERE fresh.concurrency_key IS NOT NULL
),
flow_woken AS (
    SELECT pg_notify(%(flow_channel)s::text, fresh.queue)
    FROM fresh
    WHERE fresh.ready
      AND ((fresh.partition_key IS NOT NULL AND fresh.partition_urgent)
        OR (fresh.concurrency_key IS NOT NULL AND fresh.key_urgent))
)
SELECT inserted.id, inserted.created_at, inserted.available_at,
    ((SELECT count(*) FROM woken) + (SELECT count(*) FROM flow_woken))::text AS notified
FROM inserted


-- name: revive_dependents
-- After an operator retried the given jobs: make the dependents their failure cancelled
-- blocked again (and, transitively, the dependents those cancelled), so they run once
-- the retried jobs succeed. A dependent that also waits for another failed job that is
-- not being revived stays cancelled (it could never run), and so, transitively, do the
-- dependents it would cancel again ("held_back"). Its other blockers are locked before
-- their statuses are read (id order, SKIP LOCKED: one locked elsewhere holds the
-- dependent back too, to be revived again later), so a blocker failing meanwhile cannot
-- leave it blocked behind a dead letter. Rows another transaction is touching are
-- skipped, as every operator statement does. A revived partitioned job takes its turn
-- in its partition again (a signal). pgq_dep_blocker for the walk, pgq_dep_job for the
-- other blockers.
WITH RECURSIVE tree (job_id) AS (
    SELECT dep.job_id
    FROM django_pgqueue_dependency AS dep
    WHERE dep.blocker_id = ANY (%(job_ids)s::bigint[])
      AND dep.cancelled_job
    UNION
    SELECT dep.job_id
    FROM tree
    JOIN django_pgqueue_dependency AS dep ON dep.blocker_id = tree.job_id
    WHERE dep.cancelled_job
),
candidates AS (
    SELECT job.id
    FROM django_pgqueue_job AS job
    WHERE job.id = ANY (ARRAY(SELECT tree.job_id FROM tree))
      AND job.status = 'cancelled'
    ORDER BY job.id
    FOR UPDATE SKIP LOCKED
),
other_edges AS (
    -- What else each candidate runs after: neither retried nor revived here.
    SELECT dep.job_id, dep.blocker_id, dep.on_failure
    FROM django_pgqueue_dependency AS dep
    WHERE dep.job_id = ANY (ARRAY(SELECT candidates.id FROM candidates))
      AND NOT dep.blocker_id = ANY (%(job_ids)s::bigint[])
      AND NOT dep.blocker_id = ANY (ARRAY(SELECT candidates.id FROM candidates))
      AND EXISTS (
          SELECT 1 FROM django_pgqueue_job_all AS blocker WHERE blocker.id = dep.blocker_id
      )
),
live_other_blockers AS (
    SELECT blocker.id, blocker.status
    FROM django_pgqueue_job AS blocker
    WHERE blocker.id = ANY (ARRAY(SELECT other_edges.blocker_id FROM other_edges))
    ORDER BY blocker.id
    FOR NO KEY UPDATE SKIP LOCKED
),
finished_other_blockers AS (
    -- Locked after the job table's rows, as every statement touching both tiers does.
    SELECT blocker.id, blocker.status
    FROM django_pgqueue_job_history AS blocker
    WHERE blocker.id = ANY (ARRAY(SELECT other_edges.blocker_id FROM other_edges))
    ORDER BY blocker.id
    FOR NO KEY UPDATE SKIP LOCKED
),
other_blockers AS (
    SELECT live_other_blockers.id, live_other_blockers.status FROM live_other_blockers
    UNION ALL
    SELECT finished_other_blockers.id, finished_other_blockers.status
    FROM finished_other_blockers
),
held_back (job_id) AS (
    SELECT other_edges.job_id
    FROM other_edges
    LEFT JOIN other_blockers ON other_blockers.id = other_edges.blocker_id
    WHERE other_blockers.id IS NULL
       OR (
           other_blockers.status IN ('dead_letter', 'cancelled')
           AND other_edges.on_failure = 'cancel'
       )
    UNION
    SELECT dep.job_id
    FROM held_back
    JOIN django_pgqueue_dependency AS dep ON dep.blocker_id = held_back.job_id
    WHERE dep.job_id = ANY (ARRAY(SELECT candidates.id FROM candidates))
      AND dep.on_failure = 'cancel'
),
target (id) AS (
    -- A set difference, not "<> ALL (ARRAY(...))": that compares every candidate with
    -- every job held back, the square of a large revival.
    SELECT candidates.id FROM candidates
    EXCEPT
    SELECT held_back.job_id FROM held_back
),
revived AS (
    UPDATE django_pgqueue_job AS job
    SET status = 'blocked',
        finished_at = NULL,
        last_error = NULL
    WHERE job.id = ANY (ARRAY(SELECT target.id FROM target))
      AND job.status = 'cancelled'
    RETURNING job.id, job.partition_key
),
cleared AS (
    UPDATE django_pgqueue_dependency AS dep
    SET cancelled_job = false
    WHERE dep.job_id = ANY (ARRAY(SELECT revived.id FROM revived))
      AND dep.cancelled_job
),
signalled AS (
    INSERT INTO django_pgqueue_partition_signal (partition_key)
    SELECT DISTINCT revived.partition_key FROM revived WHERE revived.partition_key IS NOT NULL
)
SELECT revived.id FROM revived


-- name: cancelled_dependents
-- The jobs the failure of the given jobs cancelled and that are still cancelled (the
-- dead-letter page offers to revive them). pgq_dep_blocker.
SELECT dep.blocker_id, job.id, job.task_path, job.queue
FROM django_pgqueue_dependency AS dep
JOIN django_pgqueue_job_all AS job ON job.id = dep.job_id
WHERE dep.blocker_id = ANY (%(job_ids)s::bigint[])
  AND dep.cancelled_job
  AND job.status = 'cancelled'
ORDER BY dep.blocker_id, job.id


-- name: mark_awaited
-- A wait() starts: ask the settling trigger to NOTIFY django_pgqueue_finished when the
-- job finishes, and read its status. A row locked by another transaction (an atomic
-- task's handler holds its own row until it commits) is not waited for: SKIP LOCKED,
-- and "locked" tells the caller to try again shortly, re-reading meanwhile. A waiter
-- therefore never queues behind a handler. Found by primary key.
WITH target AS (
    SELECT job.id
    FROM django_pgqueue_job AS job
    WHERE job.id = %(job_id)s
      AND NOT job.awaited
      AND job.status NOT IN ('succeeded', 'dead_letter', 'cancelled')
    FOR NO KEY UPDATE SKIP LOCKED
),
marked AS (
    UPDATE django_pgqueue_job AS job
    SET awaited = true
    WHERE job.id = (SELECT target.id FROM target)
    RETURNING job.id
)
SELECT job.status, job.awaited OR EXISTS (SELECT 1 FROM marked) AS awaited
FROM django_pgqueue_job_all AS job
WHERE job.id = %(job_id)s
