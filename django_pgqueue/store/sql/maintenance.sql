-- Housekeeping: recovering expired leases, pruning, the worker registry and statistics.
--
-- One worker at a time runs each housekeeping step, each in its own short transaction
-- that first takes a transaction-level advisory lock (try_housekeeping_lock).
-- Transaction-level, not session-level: it is released by COMMIT, so it also works
-- behind PgBouncer in transaction pooling mode, and a crashed worker cannot leave it held.
-- Short transactions: a row reaped or a worker marked dead is not kept locked while the
-- pass goes on pruning, so no heartbeat or outcome write waits on housekeeping.


-- name: try_housekeeping_lock
-- Take the housekeeping lock for the current transaction, if no one else holds it, and
-- bound how long this transaction may sit idle (idle_timeout, a setting such as '5000ms';
-- '0': unbounded). A worker paused inside a step (SIGSTOP, a frozen VM, a debugger) keeps its
-- connection open, since its kernel still answers TCP keepalives: it would hold the lock,
-- and with it every other worker's housekeeping (the reaper and the registry included),
-- for as long as it stays paused. The server ends such a session instead; the step rolls
-- back and is run again by whoever takes the lock next. set_config(..., true) is SET
-- LOCAL: it ends with the transaction, so it is safe behind PgBouncer.
SELECT pg_try_advisory_xact_lock(%(lock_key)s) AS acquired,
    set_config('idle_in_transaction_session_timeout', %(idle_timeout)s, true)


-- name: reap_expired
-- Recover jobs whose lease ran out (their worker crashed, was killed or cut off): back
-- to pending after a backoff, to dead_letter when that was the last attempt, or to
-- cancelled when an operator had asked to cancel it (its worker died before its
-- handler's end could be recorded). Attempts were counted at claim, so a job that kills
-- its worker every time still ends in dead_letter. SKIP LOCKED and the re-checked WHERE
-- guarantee that a row completed or extended meanwhile is never touched. job_ids NULL
-- means any expired job. A job going back to pending lets go of its coalesce key (see
-- fail_if_leased). The dependents of jobs ending here are locked first, in id order
-- (django_pgqueue_lock_dependents; see complete_many_if_leased).
-- The worker that held each lease is told at once on the lease channel (notices.py), so a
-- worker that is alive but was cut off stops work it no longer owns.
-- Uses pgq_job_lease.
WITH expired AS (
    SELECT job.id, job.claimed_by, job.lease_generation,
        job.has_dependents
            AND (job.cancel_requested_at IS NOT NULL OR job.attempts >= job.max_attempts)
            AS settles
    FROM django_pgqueue_job AS job
    WHERE job.status = 'processing'
      AND job.lease_expires_at < now()
      -- expired_since: where the caller's last pass left off (worker/cursor.py,
      -- ReapFloor; NULL: the head), so entries a long snapshot keeps are not walked
      -- on every pass.
      AND job.lease_expires_at >= COALESCE(%(expired_since)s::timestamptz, '-infinity')
      AND (%(job_ids)s::bigint[] IS NULL OR job.id = ANY (%(job_ids)s::bigint[]))
    ORDER BY job.lease_expires_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
),
reaped AS (
    UPDATE django_pgqueue_job AS job
    SET status = CASE
            WHEN job.cancel_requested_at IS NOT NULL THEN 'cancelled'
            WHEN job.attempts >= job.max_attempts THEN 'dead_letter'
            ELSE 'pending'
        END,
        available_at = CASE
            WHEN job.cancel_requested_at IS NOT NULL OR job.attempts >= job.max_attempts
                THEN job.available_at
            ELSE now() + make_interval(secs =>
                LEAST(%(retry_max)s, %(retry_base)s * power(2.0, GREATEST(job.attempts - 1, 0)))
                * (1 + %(retry_jitter)s * (2 * random() - 1)))
        END,
        finished_at = CASE
            WHEN job.cancel_requested_at IS NOT NULL OR job.attempts >= job.max_attempts
                THEN now()
        END,
        claimed_by = CASE
            WHEN job.cancel_requested_at IS NOT NULL OR job.attempts >= job.max_attempts
                THEN job.claimed_by
        END,
        coalesce_key = CASE
            WHEN job.cancel_requested_at IS NOT NULL OR job.attempts >= job.max_attempts
                THEN job.coalesce_key
        END,
        lease_expires_at = NULL,
        last_error = 'lease expired: worker ' || job.claimed_by
            || ' stopped extending it (crashed, killed or cut off from the database)',
        last_error_class = 'django_pgqueue.exceptions.LeaseExpired',
        errors = job.errors || jsonb_build_array(jsonb_build_object(
            'attempt', job.attempts,
            'exception_class', 'django_pgqueue.exceptions.LeaseExpired',
            'message', 'lease expired: worker ' || job.claimed_by || ' stopped extending it',
            'traceback', '',
            'worker', job.claimed_by,
            'at', now()
        ))
    WHERE job.id = ANY (ARRAY(SELECT expired.id FROM expired))
      AND job.status = 'processing'
      -- COALESCE hides the recheck from index matching: as a plain comparison the
      -- planner may read these ids through pgq_job_lease from its head, every entry a
      -- long snapshot keeps included, rather than by primary key.
      AND COALESCE(job.lease_expires_at, 'infinity') < now()
      AND (
          SELECT CASE WHEN cardinality(settling.ids) > 0 THEN
              django_pgqueue_lock_dependents('{}', settling.ids)
          ELSE 0 END
          FROM (
              SELECT ARRAY(SELECT expired.id FROM expired WHERE expired.settles) AS ids
          ) AS settling
      ) >= 0
    RETURNING job.id, job.status, job.queue, job.partition_key, job.concurrency_key
),
told AS (
    SELECT pg_notify(%(lease_channel)s, json_build_object(
        'worker', expired.claimed_by,
        'job', expired.id,
        'generation', expired.lease_generation,
        'reason', 'reaped'
    )::text)
    FROM expired
    JOIN reaped ON reaped.id = expired.id
),
refreshed AS (
    SELECT CASE WHEN cardinality(keys.keys) > 0 THEN
        django_pgqueue_refresh_partitions(keys.keys, keys.finished)
    ELSE 0 END AS partitions
    FROM (
        -- Each with the job that left processing here (migration 0024), paired by one
        -- aggregate.
        SELECT COALESCE(array_agg(reaped.partition_key), '{}') AS keys,
            COALESCE(array_agg(reaped.id), '{}') AS finished
        FROM reaped
        WHERE reaped.partition_key IS NOT NULL
    ) AS keys
),
recounted AS (
    -- Slots held by a dead worker's jobs come back here (after the partitions: lock
    -- order). No channel: the reaped jobs' queues are woken by the caller.
    SELECT django_pgqueue_refresh_concurrency(keys.keys, NULL) AS keys
    FROM refreshed
    CROSS JOIN (
        SELECT ARRAY(
            SELECT reaped.concurrency_key FROM reaped WHERE reaped.concurrency_key IS NOT NULL
        ) AS keys
    ) AS keys
    WHERE cardinality(keys.keys) > 0
)
SELECT reaped.id, reaped.status, reaped.queue
FROM reaped
CROSS JOIN refreshed
LEFT JOIN recounted ON true
CROSS JOIN (SELECT count(*) AS notices FROM told) AS notified


-- name: transaction_clock
-- The database clock as this transaction's statements see it (now()): where the
-- reaper's next pass may start (worker/cursor.py, ReapFloor).
SELECT now()


-- name: expired_job_ids
-- The ids of jobs whose lease ran out, the longest expired first: what reap_expired
-- takes, for reaping them one at a time when a batch was refused. Uses pgq_job_lease.
SELECT job.id
FROM django_pgqueue_job AS job
WHERE job.status = 'processing'
  AND job.lease_expires_at < now()
ORDER BY job.lease_expires_at
LIMIT %(limit)s


-- name: prune_finished
-- Delete a batch of succeeded and cancelled jobs older than the retention.
-- Uses pgq_job_finished.
WITH doomed AS (
    SELECT job.id
    FROM django_pgqueue_job AS job
    WHERE job.status IN ('succeeded', 'cancelled')
      AND job.finished_at < now() - make_interval(secs => %(retention_seconds)s)
    ORDER BY job.finished_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
DELETE FROM django_pgqueue_job AS job
WHERE job.id = ANY (ARRAY(SELECT doomed.id FROM doomed))


-- name: prune_dead_letters
-- Delete a batch of dead letters older than their (separate, longer) retention.
-- Uses pgq_job_finished.
WITH doomed AS (
    SELECT job.id
    FROM django_pgqueue_job AS job
    WHERE job.status = 'dead_letter'
      AND job.finished_at < now() - make_interval(secs => %(retention_seconds)s)
    ORDER BY job.finished_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
DELETE FROM django_pgqueue_job AS job
WHERE job.id = ANY (ARRAY(SELECT doomed.id FROM doomed))


-- name: partitions_out_of_date
-- Partitions whose row disagrees with the job table, for repair_partitions to refresh: a
-- running job that is no longer processing (uses pgq_partition_running), or a partition
-- with pending jobs whose row is missing or names another next job. Normally there are
-- none (every statement keeps the rows); they come from processes of a release before
-- migration 0004 (a rolling deploy) or from rows changed by hand. The pending side is a
-- skip scan of pgq_job_part_pending, one index probe per partition, after the key
-- after_key and at most scan_limit partitions per call: the row with kind 'scanned'
-- names the last key scanned (NULL when the scan reached the end: start over).
WITH RECURSIVE pending_partitions (partition_key, head_id, seen) AS (
    (
        SELECT job.partition_key, job.id, 1
        FROM django_pgqueue_job AS job
        WHERE job.status = 'pending'
          AND job.partition_key > %(after_key)s
        ORDER BY job.partition_key, job.id
        LIMIT 1
    )
    UNION ALL
    SELECT next_key.partition_key, next_key.id, pending_partitions.seen + 1
    FROM pending_partitions
    CROSS JOIN LATERAL (
        SELECT job.partition_key, job.id
        FROM django_pgqueue_job AS job
        WHERE job.status = 'pending'
          AND job.partition_key > pending_partitions.partition_key
        ORDER BY job.partition_key, job.id
        LIMIT 1
    ) AS next_key
    WHERE pending_partitions.seen < %(scan_limit)s
)
SELECT pending_partitions.partition_key, 'next_job' AS kind
FROM pending_partitions
-- The row's newest version first, as enqueue.sql's probes read it (see there): a join
-- by "=" would visit every version VACUUM has not removed yet.
LEFT JOIN LATERAL (
    SELECT part.partition_key, part.running_id, part.head_id
    FROM django_pgqueue_partition AS part
    WHERE part.partition_key >= pending_partitions.partition_key
      AND part.partition_key <= pending_partitions.partition_key
    ORDER BY part.partition_key DESC
    LIMIT 1
) AS part ON true
WHERE part.partition_key IS NULL
   OR (part.running_id IS NULL AND part.head_id IS DISTINCT FROM pending_partitions.head_id)
UNION ALL
SELECT part.partition_key, 'running_job'
FROM django_pgqueue_partition AS part
WHERE part.running_id IS NOT NULL
  -- A scalar subquery on purpose: one primary-key probe per running partition. NOT
  -- EXISTS became a hash anti-join over a sequential scan of the whole job table once
  -- the statistics said thousands of partitions were running.
  AND (
      SELECT job.status FROM django_pgqueue_job AS job WHERE job.id = part.running_id
  ) IS DISTINCT FROM 'processing'
UNION ALL
SELECT (
    SELECT max(pending_partitions.partition_key) FROM pending_partitions
    HAVING count(*) >= %(scan_limit)s
), 'scanned'


-- name: repair_partitions
-- Refresh the given partitions from the job table (see partitions_out_of_date).
SELECT django_pgqueue_refresh_partitions(%(partition_keys)s::text[]) AS refreshed


-- name: register_worker
-- Add a worker to the registry, or take over the row of a dead or silent worker with the
-- same id. Returns nothing if a live worker holds the id.
INSERT INTO django_pgqueue_worker AS worker (
    id, status, hostname, pid, queues, concurrency, started_at, last_seen_at, metadata
)
VALUES (
    %(worker_id)s, 'alive', %(hostname)s, %(pid)s, %(queues)s::jsonb, %(concurrency)s,
    now(), now(), %(metadata)s::jsonb
)
ON CONFLICT (id) DO UPDATE
SET status = 'alive',
    hostname = EXCLUDED.hostname,
    pid = EXCLUDED.pid,
    queues = EXCLUDED.queues,
    concurrency = EXCLUDED.concurrency,
    started_at = now(),
    last_seen_at = now(),
    metadata = EXCLUDED.metadata
WHERE worker.status = 'dead'
   OR worker.last_seen_at < now() - make_interval(secs => %(timeout_seconds)s)
RETURNING started_at


-- name: heartbeat_worker
-- Refresh a worker's last_seen_at (re-creating its row if housekeeping pruned it).
-- A worker marked dead while it was cut off comes back alive; a draining one stays so.
INSERT INTO django_pgqueue_worker (
    id, status, hostname, pid, queues, concurrency, started_at, last_seen_at, metadata
)
VALUES (
    %(worker_id)s, %(status)s, %(hostname)s, %(pid)s, %(queues)s::jsonb, %(concurrency)s,
    now(), now(), %(metadata)s::jsonb
)
ON CONFLICT (id) DO UPDATE
SET status = EXCLUDED.status,
    last_seen_at = now(),
    metadata = EXCLUDED.metadata
RETURNING last_seen_at


-- name: set_worker_status
-- Move a worker to draining (shutdown started) or dead (exited).
UPDATE django_pgqueue_worker
SET status = %(status)s,
    last_seen_at = now()
WHERE id = %(worker_id)s
RETURNING id


-- name: live_workers
-- The workers that count for partition-bucket ownership: alive and recently heard from.
-- Uses pgq_worker_alive.
SELECT worker.id, worker.queues
FROM django_pgqueue_worker AS worker
WHERE worker.status = 'alive'
  AND worker.last_seen_at >= now() - make_interval(secs => %(timeout_seconds)s)
ORDER BY worker.id


-- name: mark_silent_workers_dead
-- Mark workers dead that have not heartbeated within the timeout. Their jobs are not
-- touched here: those come back through reap_expired when their leases run out.
UPDATE django_pgqueue_worker
SET status = 'dead'
WHERE status IN ('alive', 'draining')
  AND last_seen_at < now() - make_interval(secs => %(timeout_seconds)s)
RETURNING id


-- name: prune_dead_workers
-- Forget dead workers after a while (the admin shows recent ones).
DELETE FROM django_pgqueue_worker
WHERE status = 'dead'
  AND last_seen_at < now() - make_interval(secs => %(retention_seconds)s)


-- name: record_queue_stats
-- Add a worker's finished-job counts to the current minute of each queue.
INSERT INTO django_pgqueue_queuestat (
    queue, minute, succeeded, failed, dead_lettered, wait_ms_max
)
SELECT stat.queue, date_trunc('minute', now()), stat.succeeded, stat.failed,
    stat.dead_lettered, stat.wait_ms_max
FROM unnest(
    %(queues)s::text[], %(succeeded)s::bigint[], %(failed)s::bigint[],
    %(dead_lettered)s::bigint[], %(wait_ms_max)s::bigint[]
) AS stat (queue, succeeded, failed, dead_lettered, wait_ms_max)
ON CONFLICT (queue, minute) DO UPDATE
SET succeeded = django_pgqueue_queuestat.succeeded + EXCLUDED.succeeded,
    failed = django_pgqueue_queuestat.failed + EXCLUDED.failed,
    dead_lettered = django_pgqueue_queuestat.dead_lettered + EXCLUDED.dead_lettered,
    wait_ms_max = GREATEST(django_pgqueue_queuestat.wait_ms_max, EXCLUDED.wait_ms_max)


-- name: prune_queue_stats
-- Forget per-minute statistics older than the given age.
DELETE FROM django_pgqueue_queuestat
WHERE minute < now() - make_interval(secs => %(retention_seconds)s)


-- name: missing_tables
-- Which of the queue's tables do not exist on this connection's search_path: the
-- migrations were never applied to this database. Uses no index: to_regclass reads the
-- catalog.
SELECT name FROM unnest(%(tables)s::text[]) AS name WHERE to_regclass(name) IS NULL


-- name: prune_idle_concurrency_keys
-- Forget concurrency keys with no job left whose rate bucket is full again (a key with a
-- rate limit keeps its row while the bucket refills, so a new job cannot get a fresh,
-- full bucket early). A full bucket is what a new row starts with, so nothing is lost.
-- Rows being refreshed or claimed right now are skipped (SKIP LOCKED); the small table
-- is read in full.
DELETE FROM django_pgqueue_concurrency AS conc
WHERE conc.concurrency_key IN (
    SELECT idle.concurrency_key
    FROM django_pgqueue_concurrency AS idle
    WHERE idle.head_id IS NULL
      AND idle.in_flight = 0
      AND (
          idle.rate_limit IS NULL
          OR idle.tokens + GREATEST(extract(epoch FROM now() - idle.tokens_at), 0)
              * idle.rate_limit / idle.rate_period >= idle.rate_limit
      )
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
  AND conc.head_id IS NULL
  AND conc.in_flight = 0
RETURNING conc.concurrency_key


-- name: lock_coalesce_keys
-- The first of two statements forgetting coalesce keys whose job no longer holds them
-- (it was claimed, retried, cancelled or finished): lock up to `limit` rows not made or
-- checked for recheck_seconds, oldest first. A row a producer holds is skipped. The
-- check follows in free_coalesce_keys, in the same transaction, whose new snapshot sees
-- the job of every producer that took the key before this lock. pgq_coalesce_checked.
SELECT taken.coalesce_key
FROM django_pgqueue_coalesce_key AS taken
WHERE taken.checked_at < now() - make_interval(secs => %(recheck_seconds)s)
ORDER BY taken.checked_at
LIMIT %(limit)s
FOR UPDATE SKIP LOCKED


-- name: free_coalesce_keys
-- Delete the locked rows whose job is not pending with the key any more (a producer
-- makes the row again); mark the others checked. By primary keys only.
WITH held AS (
    SELECT taken.coalesce_key
    FROM django_pgqueue_coalesce_key AS taken
    JOIN django_pgqueue_job AS job ON job.id = taken.job_id
    WHERE taken.coalesce_key = ANY (%(keys)s::text[])
      -- IS NOT DISTINCT FROM: by primary key, never pgq_job_coalesce_key's entries.
      AND job.coalesce_key IS NOT DISTINCT FROM taken.coalesce_key
      AND job.status = 'pending'
),
rechecked AS (
    UPDATE django_pgqueue_coalesce_key AS taken
    SET checked_at = now()
    WHERE taken.coalesce_key = ANY (ARRAY(SELECT held.coalesce_key FROM held))
),
freed AS (
    -- A set difference, then probes of the primary key (as free_idempotency_keys).
    DELETE FROM django_pgqueue_coalesce_key AS taken
    WHERE taken.coalesce_key = ANY (ARRAY(
        SELECT given.key FROM unnest(%(keys)s::text[]) AS given (key)
        EXCEPT
        SELECT held.coalesce_key FROM held
    ))
    RETURNING 1
)
SELECT count(*) AS freed FROM freed


-- name: sync_sql_settings
-- Write what django_pgqueue_enqueue() applies (migration 0017): the settings row, one
-- per database, by migrate and by each worker at start. Last writer wins (during a
-- rolling deploy, the settings of the release that started a worker last).
INSERT INTO django_pgqueue_sql_settings AS current (
    id, queues, max_attempts, max_payload_bytes, notify_channel, flow_channel,
    concurrency_limits, rate_limits, synced_at, synced_by
)
VALUES (
    1, %(queues)s::jsonb, %(max_attempts)s, %(max_payload_bytes)s, %(notify_channel)s,
    %(flow_channel)s, %(concurrency_limits)s::jsonb, %(rate_limits)s::jsonb, now(),
    %(synced_by)s
)
ON CONFLICT (id) DO UPDATE
SET queues = EXCLUDED.queues,
    max_attempts = EXCLUDED.max_attempts,
    max_payload_bytes = EXCLUDED.max_payload_bytes,
    notify_channel = EXCLUDED.notify_channel,
    flow_channel = EXCLUDED.flow_channel,
    concurrency_limits = EXCLUDED.concurrency_limits,
    rate_limits = EXCLUDED.rate_limits,
    synced_at = EXCLUDED.synced_at,
    synced_by = EXCLUDED.synced_by
