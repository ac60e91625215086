-- The admin's read-only queries: queue lag, table health, estimates, dead-letter groups,
-- partition blockers and jobs in flight.
--
-- None of them writes or locks anything. Each reaches the rows it needs through one of the
-- partial indexes (named in its description) or reads the catalog only; none scans the
-- job table, which holds millions of finished rows (tests/test_admin_indexes.py checks
-- the plans on a million-row table). Counts that could be large stop at count_limit: a
-- backlog of millions is shown as "10,000+" rather than counted on every page view.


-- name: estimated_job_count
-- The planner's estimate of the jobs of both tiers: each table's reltuples scaled to its
-- current size, as the planner itself does, summed over the job table's storage (the
-- table itself, or its segments: a partitioned table has none of its own) and the
-- history's partitions. NULL until the job table has been analyzed (a segment not
-- analyzed yet counts as empty once another has been; a history partition always
-- does). Uses no index: it reads pg_class only.
WITH stored AS (
    -- pg_partition_tree lists nothing for a table that is not partitioned.
    SELECT 'django_pgqueue_job'::regclass::oid AS oid, 'job' AS tier
    UNION ALL
    SELECT tree.relid, 'job'
    FROM pg_partition_tree('django_pgqueue_job'::regclass) AS tree
    WHERE tree.isleaf
    UNION ALL
    SELECT tree.relid, 'history'
    FROM pg_partition_tree('django_pgqueue_job_history'::regclass) AS tree
    WHERE tree.isleaf
),
estimated AS (
    SELECT stored.tier,
        CASE WHEN cls.reltuples < 0 OR cls.relpages = 0 THEN NULL
        ELSE cls.reltuples / cls.relpages
            * (pg_relation_size(cls.oid) / current_setting('block_size')::integer)
        END AS rows
    FROM stored
    JOIN pg_class AS cls ON cls.oid = stored.oid
)
SELECT (
    -- sum() skips the NULLs of tables not analyzed, and is NULL when all of them are.
    (SELECT sum(estimated.rows) FROM estimated WHERE estimated.tier = 'job')
    + COALESCE((SELECT sum(estimated.rows) FROM estimated WHERE estimated.tier = 'history'), 0)
)::bigint AS estimate


-- name: job_table_health
-- Size, live and dead tuples, and the last vacuum and analyze of the job table: summed
-- over its segments when it is in segments (a partitioned table has no storage and no
-- statistics of its own; the latest vacuum and analyze of any segment). No row when
-- the statistics views show none of it. Uses no index: it reads the statistics views
-- only.
SELECT
    sum(pg_total_relation_size(stat.relid))::bigint AS total_bytes,
    sum(pg_relation_size(stat.relid))::bigint AS table_bytes,
    sum(pg_indexes_size(stat.relid))::bigint AS index_bytes,
    sum(stat.n_live_tup)::bigint AS live_tuples,
    sum(stat.n_dead_tup)::bigint AS dead_tuples,
    sum(stat.n_mod_since_analyze)::bigint AS modified_since_analyze,
    max(stat.last_vacuum) AS last_vacuum,
    max(stat.last_autovacuum) AS last_autovacuum,
    max(stat.last_analyze) AS last_analyze,
    max(stat.last_autoanalyze) AS last_autoanalyze,
    sum(stat.autovacuum_count)::bigint AS autovacuum_count,
    sum(stat.autoanalyze_count)::bigint AS autoanalyze_count
FROM pg_stat_user_tables AS stat
WHERE stat.relid = 'django_pgqueue_job'::regclass
    -- pg_partition_tree lists nothing for a table that is not partitioned; a
    -- partitioned one's own row holds zeros.
    OR stat.relid IN (
        SELECT tree.relid
        FROM pg_partition_tree('django_pgqueue_job'::regclass) AS tree
        WHERE tree.isleaf
    )
HAVING count(*) > 0


-- name: vacuum_horizon
-- What holds VACUUM back the longest: the oldest snapshot or transaction id of a session
-- of this database, of a standby's feedback (a walsender), of a prepared transaction of
-- this database, or of a replication slot. VACUUM keeps every row version such a holder
-- may still see, so the job table's dead tuples grow for as long as it stays. Sessions of
-- other roles are visible only to members of pg_read_all_stats (pg_monitor); the
-- session running this statement and autovacuum's are left out. No row: nothing holds one.
-- Uses no index: it reads the statistics and catalog views only.
SELECT holder.*
FROM (
    SELECT
        'session' AS kind,
        activity.pid,
        activity.usename::text AS role,
        activity.application_name AS name,
        host(activity.client_addr) AS client,
        activity.state,
        EXTRACT(EPOCH FROM now() - activity.xact_start)::float8 AS age_seconds,
        age(coalesce(activity.backend_xmin, activity.backend_xid)) AS xid_age,
        left(activity.query, 200) AS query
    FROM pg_stat_activity AS activity
    WHERE coalesce(activity.backend_xmin, activity.backend_xid) IS NOT NULL
      AND activity.pid <> pg_backend_pid()
      -- An autovacuum worker's snapshot lasts one table's analyze: nothing to act on.
      AND activity.backend_type <> 'autovacuum worker'
      AND (activity.datname = current_database() OR activity.backend_type = 'walsender')
    UNION ALL
    SELECT
        'prepared transaction', NULL, prepared.owner::text, prepared.gid, NULL, NULL,
        EXTRACT(EPOCH FROM now() - prepared.prepared)::float8, age(prepared.transaction),
        NULL
    FROM pg_prepared_xacts AS prepared
    WHERE prepared.database = current_database()
    UNION ALL
    SELECT
        'replication slot', slot.active_pid, NULL, slot.slot_name::text, NULL, NULL, NULL,
        age(slot.xmin), NULL
    FROM pg_replication_slots AS slot
    WHERE slot.xmin IS NOT NULL
) AS holder
ORDER BY holder.xid_age DESC, holder.age_seconds DESC NULLS LAST
LIMIT 1


-- name: known_queues
-- Every queue worth showing: the configured ones, those with pending jobs or dead letters
-- or running jobs, those workers serve and those with statistics in the last hour.
-- Uses pgq_job_pending and pgq_job_dead_queue as loose index scans (one probe per
-- queue: "the first queue name after the previous one"), and pgq_job_lease.
-- "available_at > '-infinity'" rather than "IS NOT NULL": PostgreSQL 17+ drops IS NOT NULL
-- on a NOT NULL column before matching partial-index predicates, and would then not see
-- that pgq_job_pending (WHERE ... available_at IS NOT NULL) holds every pending row.
WITH RECURSIVE pending_queue AS (
    (
        SELECT job.queue
        FROM django_pgqueue_job AS job
        WHERE job.status = 'pending'
          AND job.available_at > '-infinity'::timestamptz
        ORDER BY job.queue
        LIMIT 1
    )
    UNION ALL
    SELECT (
        SELECT job.queue
        FROM django_pgqueue_job AS job
        WHERE job.status = 'pending'
          AND job.available_at > '-infinity'::timestamptz
          AND job.queue > previous.queue
        ORDER BY job.queue
        LIMIT 1
    )
    FROM pending_queue AS previous
    WHERE previous.queue IS NOT NULL
),
dead_queue AS (
    (
        SELECT job.queue
        FROM django_pgqueue_job_all AS job
        WHERE job.status = 'dead_letter'
        ORDER BY job.queue
        LIMIT 1
    )
    UNION ALL
    SELECT (
        SELECT job.queue
        FROM django_pgqueue_job_all AS job
        WHERE job.status = 'dead_letter'
          AND job.queue > previous.queue
        ORDER BY job.queue
        LIMIT 1
    )
    FROM dead_queue AS previous
    WHERE previous.queue IS NOT NULL
)
SELECT known.queue
FROM (
    SELECT unnest(%(configured)s::text[]) AS queue
    UNION
    SELECT pending_queue.queue FROM pending_queue
    UNION
    SELECT dead_queue.queue FROM dead_queue
    UNION
    SELECT job.queue
    FROM django_pgqueue_job AS job
    WHERE job.status = 'processing'
      AND job.lease_expires_at IS NOT NULL
    UNION
    SELECT jsonb_array_elements_text(worker.queues) FROM django_pgqueue_worker AS worker
    UNION
    SELECT stat.queue
    FROM django_pgqueue_queuestat AS stat
    WHERE stat.minute > now() - interval '1 hour'
) AS known
WHERE known.queue IS NOT NULL
ORDER BY known.queue


-- name: queue_lag
-- Per queue: ready and scheduled depth, running jobs, expired leases, dead letters,
-- jobs waiting for a worker that can import their task (their own kind: not counted as
-- ready or scheduled), and the oldest ready job (its available_at: how long the queue
-- makes users wait). Depths and dead letters stop counting at count_limit.
-- Uses pgq_job_pending (ready, scheduled, oldest ready), pgq_job_lease (running,
-- expired), pgq_job_dead_queue (dead letters), pgq_job_unknown_task and pgq_job_blocked
-- (jobs waiting for the jobs they run after: not ready, not lag, counted apart).
WITH wanted AS (
    SELECT DISTINCT unnest(%(queues)s::text[]) AS queue
),
running AS (
    SELECT
        job.queue,
        count(*) AS processing,
        count(*) FILTER (WHERE job.lease_expires_at < now()) AS expired
    FROM django_pgqueue_job AS job
    WHERE job.status = 'processing'
      AND job.lease_expires_at IS NOT NULL
    GROUP BY job.queue
)
SELECT
    wanted.queue,
    (
        SELECT count(*)
        FROM (
            SELECT 1
            FROM django_pgqueue_job AS job
            WHERE job.status = 'pending'
              AND job.queue = wanted.queue
              AND job.available_at <= now()
              AND job.unknown_task_since IS NULL
            LIMIT %(count_limit)s
        ) AS capped
    ) AS ready,
    (
        SELECT count(*)
        FROM (
            SELECT 1
            FROM django_pgqueue_job AS job
            WHERE job.status = 'pending'
              AND job.queue = wanted.queue
              AND job.available_at > now()
              AND job.unknown_task_since IS NULL
            LIMIT %(count_limit)s
        ) AS capped
    ) AS scheduled,
    (
        SELECT count(*)
        FROM (
            SELECT 1
            FROM django_pgqueue_job AS job
            WHERE job.status = 'pending'
              AND job.queue = wanted.queue
              AND job.unknown_task_since IS NOT NULL
            LIMIT %(count_limit)s
        ) AS capped
    ) AS unknown_task,
    (
        SELECT count(*)
        FROM (
            SELECT 1
            FROM django_pgqueue_job AS job
            WHERE job.status = 'blocked'
              AND job.queue = wanted.queue
            LIMIT %(count_limit)s
        ) AS capped
    ) AS blocked,
    COALESCE(running.processing, 0) AS processing,
    COALESCE(running.expired, 0) AS expired,
    (
        SELECT count(*)
        FROM (
            SELECT 1
            FROM django_pgqueue_job_all AS job
            WHERE job.status = 'dead_letter'
              AND job.queue = wanted.queue
            LIMIT %(count_limit)s
        ) AS capped
    ) AS dead_letters,
    (
        SELECT min(job.available_at)
        FROM django_pgqueue_job AS job
        WHERE job.status = 'pending'
          AND job.queue = wanted.queue
          AND job.available_at <= now()
          AND job.unknown_task_since IS NULL
    ) AS oldest_ready_at,
    now() AS measured_at
FROM wanted
LEFT JOIN running ON running.queue = wanted.queue
ORDER BY wanted.queue


-- name: queue_minutes
-- The workers' per-minute counters of the given queues over the last minutes, oldest
-- first: finished jobs by outcome and the longest wait of a job claimed in that minute.
-- Uses pgq_stat_queue_minute (one range scan per queue); the job table is not read.
SELECT stat.queue, stat.minute, stat.succeeded, stat.failed, stat.dead_lettered,
    stat.wait_ms_max
FROM (SELECT DISTINCT unnest(%(queues)s::text[]) AS queue) AS wanted
JOIN django_pgqueue_queuestat AS stat
    ON stat.queue = wanted.queue
   AND stat.minute > date_trunc('minute', now()) - make_interval(mins => %(minutes)s)
ORDER BY stat.queue, stat.minute


-- name: dead_letter_groups
-- Dead letters grouped by task and error class, largest group first: how many, and the
-- newest one with its error as a sample. In both tiers (a dead letter is in the history
-- unless a retry brought it back and did not retry it).
-- Uses pgq_job_dead and pgq_hist_dead: index-only scans for the counts (or
-- pgq_job_revivable while the visibility map is not set yet), then, per group, the
-- primary key and pgq_hist_id for its newest job (a lookup per group, never a join
-- over every job).
SELECT grp.task_path, grp.last_error_class, grp.jobs, sample.id AS sample_job_id,
    sample.queue AS sample_queue, sample.last_error AS sample_error,
    sample.finished_at AS sample_finished_at
FROM (
    SELECT job.task_path, job.last_error_class, count(*) AS jobs, max(job.id) AS newest_id
    FROM django_pgqueue_job_all AS job
    WHERE job.status = 'dead_letter'
    GROUP BY job.task_path, job.last_error_class
) AS grp
CROSS JOIN LATERAL (
    SELECT newest.id, newest.queue, newest.last_error, newest.finished_at
    FROM django_pgqueue_job_all AS newest
    WHERE newest.id = grp.newest_id
    LIMIT 1
) AS sample
ORDER BY grp.jobs DESC, grp.task_path, grp.last_error_class NULLS FIRST
LIMIT %(limit)s


-- name: partition_blocker
-- The job holding up a pending job of a partition: the partition's running job, or else
-- its oldest pending job older than this one. Nothing when the job is the head.
-- Uses pgq_job_part_processing, then pgq_job_part_pending.
(
    SELECT job.id, job.status
    FROM django_pgqueue_job AS job
    WHERE job.status = 'processing'
      AND job.partition_key = %(partition_key)s
      AND job.id <> %(job_id)s
    ORDER BY job.id
    LIMIT 1
)
UNION ALL
(
    SELECT job.id, job.status
    FROM django_pgqueue_job AS job
    WHERE job.status = 'pending'
      AND job.partition_key = %(partition_key)s
      AND job.id < %(job_id)s
    ORDER BY job.id
    LIMIT 1
)
LIMIT 1


-- name: partition_waiting
-- The pending jobs of a partition waiting behind a job, oldest first: every other pending
-- job of the partition when the job is running, the younger ones when it is pending.
-- Uses pgq_job_part_pending.
SELECT job.id
FROM django_pgqueue_job AS job
WHERE job.status = 'pending'
  AND job.partition_key = %(partition_key)s
  AND job.id <> %(job_id)s
  AND (%(include_older)s OR job.id > %(job_id)s)
ORDER BY job.id
LIMIT %(limit)s


-- name: jobs_in_flight
-- Running jobs per worker (by claimed_by), and how many of their leases have expired.
-- Uses pgq_job_lease.
SELECT job.claimed_by AS worker_id, count(*) AS jobs,
    count(*) FILTER (WHERE job.lease_expires_at < now()) AS expired
FROM django_pgqueue_job AS job
WHERE job.status = 'processing'
  AND job.lease_expires_at IS NOT NULL
  AND job.claimed_by = ANY (%(worker_ids)s::text[])
GROUP BY job.claimed_by


-- name: stuck_work
-- What is stuck, and since when: running jobs whose lease ran out (per queue); workers
-- alive or draining that stopped heartbeating (a crash, SIGSTOP, a cut network), with
-- the jobs they hold; queues with ready jobs that no live worker serves (paused queues
-- aside: they are stopped on purpose); and concurrency keys at their in-flight limit
-- with ready jobs waiting. At most row_limit rows of each kind, the oldest first; job
-- counts stop at count_limit.
-- Uses pgq_job_lease (expired leases, and each silent worker's jobs), the registry,
-- the pauses and the concurrency keys whole (one row per worker process, paused queue
-- or key with work), pgq_job_pending (one capped probe per unserved queue) and
-- pgq_job_conc_pending (one capped probe per key at its limit).
WITH live_worker AS (
    SELECT worker.queues
    FROM django_pgqueue_worker AS worker
    WHERE worker.status = 'alive'
      AND worker.last_seen_at >= now() - make_interval(secs => %(timeout_seconds)s)
),
expired AS (
    SELECT 'expired_lease'::text AS kind, job.queue AS subject, job.queue,
        count(*) AS jobs, min(job.lease_expires_at) AS since, NULL::integer AS max_in_flight
    FROM django_pgqueue_job AS job
    WHERE job.status = 'processing'
      AND job.lease_expires_at IS NOT NULL
      AND job.lease_expires_at < now()
    GROUP BY job.queue
    ORDER BY since
    LIMIT %(row_limit)s
),
silent AS (
    SELECT 'stalled_worker'::text AS kind, worker.id AS subject, NULL::text AS queue,
        (
            SELECT count(*)
            FROM django_pgqueue_job AS job
            WHERE job.status = 'processing'
              AND job.lease_expires_at IS NOT NULL
              AND job.claimed_by = worker.id
        ) AS jobs,
        worker.last_seen_at AS since, NULL::integer AS max_in_flight
    FROM django_pgqueue_worker AS worker
    WHERE worker.status IN ('alive', 'draining')
      AND worker.last_seen_at < now() - make_interval(secs => %(timeout_seconds)s)
    ORDER BY worker.last_seen_at
    LIMIT %(row_limit)s
),
unserved AS (
    SELECT 'unserved_queue'::text AS kind, wanted.queue AS subject, wanted.queue,
        (
            SELECT count(*)
            FROM (
                SELECT 1
                FROM django_pgqueue_job AS job
                WHERE job.status = 'pending'
                  AND job.queue = wanted.queue
                  AND job.available_at <= now()
                  AND job.unknown_task_since IS NULL
                LIMIT %(count_limit)s
            ) AS capped
        ) AS jobs,
        (
            SELECT min(job.available_at)
            FROM django_pgqueue_job AS job
            WHERE job.status = 'pending'
              AND job.queue = wanted.queue
              AND job.available_at <= now()
              AND job.unknown_task_since IS NULL
        ) AS since,
        NULL::integer AS max_in_flight
    FROM (SELECT DISTINCT unnest(%(queues)s::text[]) AS queue) AS wanted
    WHERE NOT EXISTS (SELECT 1 FROM live_worker WHERE live_worker.queues ? wanted.queue)
      AND NOT EXISTS (
          SELECT 1 FROM django_pgqueue_queue_pause AS pause WHERE pause.queue = wanted.queue
      )
),
full_key AS (
    SELECT 'full_key'::text AS kind, limited.concurrency_key AS subject, limited.queue,
        (
            SELECT count(*)
            FROM (
                SELECT 1
                FROM django_pgqueue_job AS job
                WHERE job.status = 'pending'
                  AND job.concurrency_key = limited.concurrency_key
                  AND job.available_at <= now()
                LIMIT %(count_limit)s
            ) AS capped
        ) AS jobs,
        (
            SELECT min(job.available_at)
            FROM django_pgqueue_job AS job
            WHERE job.status = 'pending'
              AND job.concurrency_key = limited.concurrency_key
              AND job.available_at <= now()
        ) AS since,
        limited.max_in_flight
    FROM django_pgqueue_concurrency AS limited
    WHERE limited.in_flight >= limited.max_in_flight
)
SELECT stuck.kind, stuck.subject, stuck.queue, stuck.jobs, stuck.since, stuck.max_in_flight
FROM (
    SELECT * FROM expired
    UNION ALL
    SELECT * FROM silent
    UNION ALL
    (SELECT * FROM unserved WHERE unserved.jobs > 0 ORDER BY unserved.since LIMIT %(row_limit)s)
    UNION ALL
    (SELECT * FROM full_key WHERE full_key.jobs > 0 ORDER BY full_key.since LIMIT %(row_limit)s)
) AS stuck
ORDER BY array_position(
    ARRAY['expired_lease', 'stalled_worker', 'unserved_queue', 'full_key'], stuck.kind
), stuck.since, stuck.subject
