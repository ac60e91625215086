-- The metrics view's read-only queries (django_pgqueue.metrics). The view also reuses
-- queue_lag, known_queues and job_table_health from admin.sql.
--
-- A scrape runs every 15 to 60 seconds from every Prometheus replica, so none of these
-- reads the job table: the per-minute counters and the worker registry are small tables
-- (tests/test_metrics_indexes.py checks the plans next to a million-row job table).


-- name: queue_finished_totals
-- Per queue: attempts finished by outcome and the longest wait of a claimed job, summed
-- over the workers' per-minute counters of the minutes that started in the last
-- `minutes` minutes (the current, partial minute included).
-- Uses pgq_stat_queue_minute (one range scan per queue); the job table is not read.
SELECT
    wanted.queue,
    COALESCE(sum(stat.succeeded), 0)::bigint AS succeeded,
    COALESCE(sum(stat.failed), 0)::bigint AS failed,
    COALESCE(sum(stat.dead_lettered), 0)::bigint AS dead_lettered,
    COALESCE(max(stat.wait_ms_max), 0)::bigint AS wait_ms_max
FROM (SELECT DISTINCT unnest(%(queues)s::text[]) AS queue) AS wanted
LEFT JOIN django_pgqueue_queuestat AS stat
    ON stat.queue = wanted.queue
   AND stat.minute > now() - make_interval(mins => %(minutes)s)
GROUP BY wanted.queue
ORDER BY wanted.queue


-- name: queue_workers
-- Per queue: the workers serving it that are live (alive and heard from within the
-- timeout), draining, or silent (alive or draining but not heard from: crashed or cut
-- off, not yet marked dead by housekeeping).
-- Uses no index: the registry holds one row per worker process and dead rows are pruned.
SELECT
    wanted.queue,
    count(worker.id) FILTER (
        WHERE worker.status = 'alive'
          AND worker.last_seen_at >= now() - make_interval(secs => %(timeout_seconds)s)
    ) AS live,
    count(worker.id) FILTER (
        WHERE worker.status = 'draining'
          AND worker.last_seen_at >= now() - make_interval(secs => %(timeout_seconds)s)
    ) AS draining,
    count(worker.id) FILTER (
        WHERE worker.status IN ('alive', 'draining')
          AND worker.last_seen_at < now() - make_interval(secs => %(timeout_seconds)s)
    ) AS silent
FROM (SELECT DISTINCT unnest(%(queues)s::text[]) AS queue) AS wanted
LEFT JOIN django_pgqueue_worker AS worker
    ON worker.queues ? wanted.queue
GROUP BY wanted.queue
ORDER BY wanted.queue
