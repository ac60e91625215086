-- Housekeeping: recovering expired leases, pruning, the worker registry and statistics.
--
-- One worker at a time runs a housekeeping pass, inside one transaction that holds a
-- transaction-level advisory lock (try_housekeeping_lock). Transaction-level, not
-- session-level: it is released by COMMIT, so it also works behind PgBouncer in
-- transaction pooling mode, and a crashed worker cannot leave it held.


-- name: try_housekeeping_lock
-- Take the housekeeping lock for the current transaction, if no one else holds it.
SELECT pg_try_advisory_xact_lock(%(lock_key)s) AS acquired


-- name: reap_expired
-- Recover jobs whose lease ran out (their worker crashed, was killed or cut off): back
-- to pending after a backoff, or to dead_letter when that was the last attempt.
-- Attempts were counted at claim, so a job that kills its worker every time still ends
-- in dead_letter. SKIP LOCKED and the re-checked WHERE guarantee that a row completed or
-- extended meanwhile is never touched. job_ids NULL means any expired job.
-- Uses pgq_job_lease.
WITH expired AS (
    SELECT job.id
    FROM django_pgqueue_job AS job
    WHERE job.status = 'processing'
      AND job.lease_expires_at < now()
      AND (%(job_ids)s::bigint[] IS NULL OR job.id = ANY (%(job_ids)s::bigint[]))
    ORDER BY job.lease_expires_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
UPDATE django_pgqueue_job AS job
SET status = CASE WHEN job.attempts >= job.max_attempts THEN 'dead_letter' ELSE 'pending' END,
    available_at = CASE
        WHEN job.attempts >= job.max_attempts THEN job.available_at
        ELSE now() + make_interval(secs =>
            LEAST(%(retry_max)s, %(retry_base)s * power(2.0, GREATEST(job.attempts - 1, 0)))
            * (1 + %(retry_jitter)s * (2 * random() - 1)))
    END,
    finished_at = CASE WHEN job.attempts >= job.max_attempts THEN now() END,
    claimed_by = CASE WHEN job.attempts >= job.max_attempts THEN job.claimed_by END,
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
  AND job.lease_expires_at < now()
RETURNING job.id, job.status, job.queue


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
