-- The probes' queries (manage.py queuehealth). Read-only; the registry holds one row per
-- worker process and dead rows are pruned, so reading it whole costs next to nothing.


-- name: worker_heartbeats
-- The registry rows that are not dead, of one host (by hostname) or one worker id, newest
-- heartbeat first, with the seconds since each one's last heartbeat (database clock).
-- Uses the primary key for a worker id; reads the registry whole for a hostname.
SELECT
    worker.id AS worker_id,
    worker.pid,
    worker.status,
    EXTRACT(EPOCH FROM now() - worker.last_seen_at)::float8 AS silent_seconds
FROM django_pgqueue_worker AS worker
WHERE worker.status <> 'dead'
  AND (worker.id = %(worker_id)s OR worker.hostname = %(hostname)s)
ORDER BY worker.last_seen_at DESC
