-- Producers: putting jobs into the inbox.
--
-- NOTIFY is only a wake-up hint, never the source of truth and never the payload: the
-- payload names the queue, nothing else. PostgreSQL delivers it at COMMIT and folds
-- identical (channel, payload) pairs raised in one transaction into one, so a transaction
-- enqueuing a thousand jobs into a queue wakes its workers once.
--
-- A partitioned job also appends a partition signal (django_pgqueue_partition_signal):
-- the next claim sees it and has its partition's row refreshed. Appending takes no lock a
-- worker could wait on, however long the producer's transaction stays open, and the
-- signal becomes visible exactly when the job does. A job under a concurrency limit
-- appends a concurrency signal (django_pgqueue_concurrency_signal) the same way.
-- A partition signal names its job (job_id, migration 0024): the fold reads the
-- partition's jobs from there on, not from its first one.
-- A signal is urgent (folded by the next claim) unless the partition's row already
-- names a next job other than its running one (a claim leaves head_id on the job it
-- started): that job is older than this one, and whatever moves the row reads the job
-- table from it and finds this job behind it. Likewise when the key's row names a ready
-- next job at least as urgent (priority) as this one: a claim of the key takes its ready jobs
-- from the job table, and every slot freed refreshes the row. Those are lazy: each worker's housekeeping thread folds them a few
-- times a second, for the case where every job ahead was taken before this transaction
-- committed. A deep backlog on a busy partition or key then costs the claims nothing.
-- One primary-key probe per distinct key, newest version first. Every job a partition
-- or key starts or finishes writes a new version of its row, and until VACUUM removes
-- the old ones (all along while a long transaction holds a snapshot) a lookup by "="
-- visits every one of them, oldest first. Equal keys sit in the index in heap order,
-- and a new version goes to the end of the table once its pages are full: read
-- backward, as a range ("key >= x AND key <= x ORDER BY key DESC LIMIT 1"; with "=" the
-- ORDER BY is redundant and the scan runs forward), the lookup meets the version this
-- statement sees after at most the ones not committed yet. Only one version of a key is
-- visible, so the probe returns that row's test rather than filtering in the scan (a
-- filter failing on the visible version would walk on through all the others).


-- name: enqueue
-- Insert one unpartitioned job, ready now and without an idempotency key (the common
-- case), and wake
-- the queue's workers. pg_notify in RETURNING rather than in a CTE: the statement is a
-- plain INSERT, which plans and runs measurably faster. Returns only what the caller
-- does not know yet.
INSERT INTO django_pgqueue_job (
    queue, task_path, args, kwargs, priority, status, attempts, max_attempts,
    lease_generation, available_at, created_at, errors, idempotency_key,
    partition_key, partition_bucket, traceparent
)
VALUES (
    %(queue)s, %(task_path)s, %(args)s::jsonb, %(kwargs)s::jsonb, %(priority)s,
    'pending', 0, %(max_attempts)s, 0, now(), now(), '[]'::jsonb, NULL,
    %(partition_key)s, %(partition_bucket)s, %(traceparent)s
)
RETURNING id, created_at, available_at, pg_notify(%(channel)s, queue)::text AS notified


-- name: enqueue_at
-- Insert one job that becomes available at a given time (NULL: now), without an
-- idempotency key; workers are woken only if that time has already come.
WITH inserted AS (
    INSERT INTO django_pgqueue_job (
        queue, task_path, args, kwargs, priority, status, attempts, max_attempts,
        lease_generation, available_at, created_at, errors, idempotency_key,
        partition_key, partition_bucket, traceparent, concurrency_key, concurrency_limit,
        rate_limit, rate_period
    )
    VALUES (
        %(queue)s, %(task_path)s, %(args)s::jsonb, %(kwargs)s::jsonb, %(priority)s,
        'pending', 0, %(max_attempts)s, 0, COALESCE(%(available_at)s::timestamptz, now()),
        now(), '[]'::jsonb, NULL, %(partition_key)s, %(partition_bucket)s, %(traceparent)s,
        %(concurrency_key)s, %(concurrency_limit)s, %(rate_limit)s, %(rate_period)s
    )
    RETURNING id, created_at, available_at, queue, partition_key, concurrency_key, priority
),
woken AS (
    SELECT pg_notify(%(channel)s, inserted.queue)
    FROM inserted
    WHERE inserted.available_at <= now()
),
fresh AS (
    -- Whether the new job's partition or key needs its row refreshed by the next claim
    -- (urgent) or only if the row changes before this commits (lazy): see the top.
    SELECT inserted.queue, inserted.available_at <= now() AS ready, inserted.id,
        inserted.partition_key, NOT COALESCE((
            SELECT part.head_id IS NOT NULL
                AND part.head_id IS DISTINCT FROM part.running_id
            FROM django_pgqueue_partition AS part
            WHERE part.partition_key >= inserted.partition_key
              AND part.partition_key <= inserted.partition_key
            ORDER BY part.partition_key DESC
            LIMIT 1
        ), false) AS partition_urgent,
        inserted.concurrency_key, NOT COALESCE((
            SELECT (
                conc.head_id IS NOT NULL
                AND conc.head_available_at <= now()
                AND conc.head_priority >= inserted.priority
            ) IS TRUE
            FROM django_pgqueue_concurrency AS conc
            WHERE conc.concurrency_key >= inserted.concurrency_key
              AND conc.concurrency_key <= inserted.concurrency_key
            ORDER BY conc.concurrency_key DESC
            LIMIT 1
        ), false) AS key_urgent
    FROM inserted
    WHERE (inserted.partition_key IS NOT NULL OR inserted.concurrency_key IS NOT NULL)
),
signalled AS (
    INSERT INTO django_pgqueue_partition_signal (partition_key, urgent, job_id)
    SELECT fresh.partition_key, fresh.partition_urgent, fresh.id FROM fresh
    WHERE fresh.partition_key IS NOT NULL
),
signalled_keys AS (
    INSERT INTO django_pgqueue_concurrency_signal (concurrency_key, urgent, job_id)
    SELECT fresh.concurrency_key, fresh.key_urgent, fresh.id FROM fresh
    WHERE fresh.concurrency_key IS NOT NULL
),
flow_woken AS (
    -- An urgent signal of a ready job: workers claim with partitions and keys next.
    SELECT pg_notify(%(flow_channel)s, fresh.queue)
    FROM fresh
    WHERE fresh.ready
      AND ((fresh.partition_key IS NOT NULL AND fresh.partition_urgent)
        OR (fresh.concurrency_key IS NOT NULL AND fresh.key_urgent))
)
SELECT inserted.id, inserted.created_at, inserted.available_at,
    ((SELECT count(*) FROM woken) + (SELECT count(*) FROM flow_woken))::text AS notified
FROM inserted


-- name: enqueue_idempotent
-- Insert one job, unless its idempotency key is taken: then nothing comes back, and the
-- caller reads the job holding it with select_by_idempotency_keys (not here: reading
-- both tiers, every partition of the history, cost each new key's enqueue about 3 ms of
-- planning and probes).
-- The key is taken in django_pgqueue_job_key by the trigger django_pgqueue_job_claim_key
-- (migration 0020), which skips the row when a job of either tier holds it. A key held
-- by an uncommitted insert makes the trigger wait for that transaction: if it commits,
-- this insert does nothing; if it rolls back, this insert wins.
-- No ON CONFLICT: the job table's unique index pgq_job_idempotency_key is kept only for
-- the previous release's producers (migration 0026), and a segmented job table cannot
-- have it.
WITH inserted AS (
    INSERT INTO django_pgqueue_job (
        queue, task_path, args, kwargs, priority, status, attempts, max_attempts,
        lease_generation, available_at, created_at, errors, idempotency_key,
        partition_key, partition_bucket, traceparent, concurrency_key, concurrency_limit,
        rate_limit, rate_period
    )
    VALUES (
        %(queue)s, %(task_path)s, %(args)s::jsonb, %(kwargs)s::jsonb, %(priority)s,
        'pending', 0, %(max_attempts)s, 0, COALESCE(%(available_at)s::timestamptz, now()),
        now(), '[]'::jsonb, %(idempotency_key)s, %(partition_key)s, %(partition_bucket)s,
        %(traceparent)s, %(concurrency_key)s, %(concurrency_limit)s, %(rate_limit)s,
        %(rate_period)s
    )
    RETURNING *
),
woken AS (
    SELECT pg_notify(%(channel)s, inserted.queue)
    FROM inserted
    WHERE inserted.available_at <= now()
),
fresh AS (
    -- Whether the new job's partition or key needs its row refreshed by the next claim
    -- (urgent) or only if the row changes before this commits (lazy): see the top.
    SELECT inserted.queue, inserted.available_at <= now() AS ready, inserted.id,
        inserted.partition_key, NOT COALESCE((
            SELECT part.head_id IS NOT NULL
                AND part.head_id IS DISTINCT FROM part.running_id
            FROM django_pgqueue_partition AS part
            WHERE part.partition_key >= inserted.partition_key
              AND part.partition_key <= inserted.partition_key
            ORDER BY part.partition_key DESC
            LIMIT 1
        ), false) AS partition_urgent,
        inserted.concurrency_key, NOT COALESCE((
            SELECT (
                conc.head_id IS NOT NULL
                AND conc.head_available_at <= now()
                AND conc.head_priority >= inserted.priority
            ) IS TRUE
            FROM django_pgqueue_concurrency AS conc
            WHERE conc.concurrency_key >= inserted.concurrency_key
              AND conc.concurrency_key <= inserted.concurrency_key
            ORDER BY conc.concurrency_key DESC
            LIMIT 1
        ), false) AS key_urgent
    FROM inserted
    WHERE (inserted.partition_key IS NOT NULL OR inserted.concurrency_key IS NOT NULL)
),
signalled AS (
    INSERT INTO django_pgqueue_partition_signal (partition_key, urgent, job_id)
    SELECT fresh.partition_key, fresh.partition_urgent, fresh.id FROM fresh
    WHERE fresh.partition_key IS NOT NULL
),
signalled_keys AS (
    INSERT INTO django_pgqueue_concurrency_signal (concurrency_key, urgent, job_id)
    SELECT fresh.concurrency_key, fresh.key_urgent, fresh.id FROM fresh
    WHERE fresh.concurrency_key IS NOT NULL
),
flow_woken AS (
    -- An urgent signal of a ready job: workers claim with partitions and keys next.
    SELECT pg_notify(%(flow_channel)s, fresh.queue)
    FROM fresh
    WHERE fresh.ready
      AND ((fresh.partition_key IS NOT NULL AND fresh.partition_urgent)
        OR (fresh.concurrency_key IS NOT NULL AND fresh.key_urgent))
)
-- The job's columns by name: a prepared statement survives a migration adding one.
SELECT
    inserted.id, inserted.queue, inserted.task_path, inserted.args, inserted.kwargs,
    inserted.priority, inserted.status, inserted.attempts, inserted.max_attempts,
    inserted.lease_generation, inserted.claimed_by, inserted.claimed_at,
    inserted.lease_expires_at, inserted.available_at, inserted.created_at,
    inserted.started_at, inserted.finished_at, inserted.last_error,
    inserted.last_error_class, inserted.errors, inserted.result,
    inserted.idempotency_key, inserted.partition_key, inserted.partition_bucket,
    inserted.step, inserted.unknown_task_since, inserted.traceparent, inserted.awaited,
    inserted.has_dependents, inserted.coalesce_key, inserted.concurrency_key,
    inserted.concurrency_limit, inserted.rate_limit, inserted.rate_period,
    inserted.cancel_requested_at, inserted.snoozes,
    true AS created,
    (SELECT count(*) FROM woken) + (SELECT count(*) FROM flow_woken) AS notified
FROM inserted


-- name: enqueue_many
-- Insert many jobs in one statement; rows whose idempotency key is taken are skipped.
-- jobs is one JSON document, [[queue, task_path, args, kwargs, priority, max_attempts,
-- available_at, idempotency_key, partition_key, partition_bucket, traceparent,
-- concurrency_key, concurrency_limit, rate_limit, rate_period], ...]: cheaper to send
-- and parse than ten parallel arrays. What the caller does not know yet comes back in
-- input order; skipped rows are missing and the caller reads them with
-- select_by_idempotency_keys.
-- A taken key makes the trigger django_pgqueue_job_claim_key skip its row (see
-- enqueue_idempotent), also when an earlier row of the same batch took it.
WITH incoming AS (
    SELECT incoming.item, incoming.position
    FROM jsonb_array_elements(%(jobs)s::jsonb) WITH ORDINALITY AS incoming (item, position)
),
inserted AS (
    INSERT INTO django_pgqueue_job (
        queue, task_path, args, kwargs, priority, status, attempts, max_attempts,
        lease_generation, available_at, created_at, errors, idempotency_key,
        partition_key, partition_bucket, traceparent, concurrency_key, concurrency_limit,
        rate_limit, rate_period
    )
    SELECT
        incoming.item ->> 0, incoming.item ->> 1, incoming.item -> 2, incoming.item -> 3,
        (incoming.item ->> 4)::smallint, 'pending', 0, (incoming.item ->> 5)::integer, 0,
        COALESCE((incoming.item ->> 6)::timestamptz, now()), now(), '[]'::jsonb,
        incoming.item ->> 7, incoming.item ->> 8, (incoming.item ->> 9)::smallint,
        incoming.item ->> 10, incoming.item ->> 11, (incoming.item ->> 12)::integer,
        (incoming.item ->> 13)::integer, (incoming.item ->> 14)::double precision
    FROM incoming
    ORDER BY incoming.position
    RETURNING id, created_at, available_at, idempotency_key, queue, partition_key,
        concurrency_key, priority
),
woken AS (
    SELECT pg_notify(%(channel)s, ready.queue)
    FROM (SELECT DISTINCT inserted.queue FROM inserted WHERE inserted.available_at <= now()) AS ready
),
fresh_partitions AS (
    -- Per partition of the new jobs: urgent or lazy (see the top).
    SELECT grouped.partition_key, grouped.ready, grouped.id, grouped.queues,
        NOT COALESCE((
            SELECT part.head_id IS NOT NULL
                AND part.head_id IS DISTINCT FROM part.running_id
            FROM django_pgqueue_partition AS part
            WHERE part.partition_key >= grouped.partition_key
              AND part.partition_key <= grouped.partition_key
            ORDER BY part.partition_key DESC
            LIMIT 1
        ), false) AS urgent
    FROM (
        SELECT inserted.partition_key, bool_or(inserted.available_at <= now()) AS ready,
            min(inserted.id) AS id, array_agg(DISTINCT inserted.queue) AS queues
        FROM inserted
        WHERE inserted.partition_key IS NOT NULL
        GROUP BY inserted.partition_key
    ) AS grouped
),
fresh_keys AS (
    -- Per concurrency key of the new jobs: urgent or lazy, by its best new job.
    SELECT grouped.concurrency_key, grouped.ready, grouped.best_ready_id, grouped.queues,
        NOT COALESCE((
            SELECT (
                conc.head_id IS NOT NULL
                AND conc.head_available_at <= now()
                AND conc.head_priority >= grouped.priority
            ) IS TRUE
            FROM django_pgqueue_concurrency AS conc
            WHERE conc.concurrency_key >= grouped.concurrency_key
              AND conc.concurrency_key <= grouped.concurrency_key
            ORDER BY conc.concurrency_key DESC
            LIMIT 1
        ), false) AS urgent
    FROM (
        SELECT inserted.concurrency_key, bool_or(inserted.available_at <= now()) AS ready,
            max(inserted.priority) AS priority, array_agg(DISTINCT inserted.queue) AS queues,
            -- The signal names the best of them that is ready (NULL: none is), which
            -- the lazy fold compares with the key's row (migration 0025).
            (array_agg(inserted.id ORDER BY inserted.priority DESC, inserted.available_at,
                inserted.id) FILTER (WHERE inserted.available_at <= now()))[1] AS best_ready_id
        FROM inserted
        WHERE inserted.concurrency_key IS NOT NULL
        GROUP BY inserted.concurrency_key
    ) AS grouped
),
signalled AS (
    INSERT INTO django_pgqueue_partition_signal (partition_key, urgent, job_id)
    SELECT fresh_partitions.partition_key, fresh_partitions.urgent, fresh_partitions.id
    FROM fresh_partitions
),
signalled_keys AS (
    INSERT INTO django_pgqueue_concurrency_signal (concurrency_key, urgent, job_id)
    SELECT fresh_keys.concurrency_key, fresh_keys.urgent, fresh_keys.best_ready_id
    FROM fresh_keys
),
flow_woken AS (
    -- Urgent signals of ready jobs: workers claim with partitions and keys next. The
    -- queues come with each partition's and key's group: matching the inserted rows
    -- against the urgent keys (= ANY of an array) compared every row with every key, a
    -- time growing with the square of the batch (9 s for 40,000 partitioned jobs).
    SELECT pg_notify(%(flow_channel)s, ready.queue)
    FROM (
        SELECT unnest(fresh_partitions.queues) AS queue
        FROM fresh_partitions
        WHERE fresh_partitions.urgent AND fresh_partitions.ready
        UNION
        SELECT unnest(fresh_keys.queues)
        FROM fresh_keys
        WHERE fresh_keys.urgent AND fresh_keys.ready
    ) AS ready
)
-- One row of arrays in insert order (ids follow it: the sequence is read row by row, in
-- ORDER BY position), rather than a row per job: the client decodes a thousand integers
-- in one value instead of a thousand rows with two timestamps each. created_at is now()
-- for every row; available_at is sent only when some job was given its own, and keys
-- only when some job has one. No row inserted: ids is NULL.
SELECT
    array_agg(inserted.id ORDER BY inserted.id) AS ids,
    now() AS created_at,
    CASE WHEN NOT bool_and(inserted.available_at = inserted.created_at)
        THEN array_agg(inserted.available_at ORDER BY inserted.id)
    END AS available_at,
    CASE WHEN bool_or(inserted.idempotency_key IS NOT NULL)
        THEN array_agg(inserted.idempotency_key ORDER BY inserted.id)
    END AS idempotency_keys,
    (SELECT count(*) FROM woken) + (SELECT count(*) FROM flow_woken) AS notified
FROM inserted


-- name: select_by_idempotency_keys
-- Read the jobs holding the given idempotency keys (after the trigger skipped them), in
-- either tier. Uses pgq_job_idempotency_key and pgq_hist_idempotency_key.
SELECT
    job.id, job.queue, job.task_path, job.args, job.kwargs, job.priority, job.status,
    job.attempts, job.max_attempts, job.lease_generation, job.claimed_by,
    job.claimed_at, job.lease_expires_at, job.available_at, job.created_at,
    job.started_at, job.finished_at, job.last_error, job.last_error_class, job.errors,
    job.result, job.idempotency_key, job.partition_key, job.partition_bucket, job.step,
    job.unknown_task_since, job.traceparent, job.awaited, job.has_dependents,
    job.coalesce_key, job.concurrency_key, job.concurrency_limit, job.rate_limit,
    job.rate_period, job.cancel_requested_at, job.snoozes,
    false AS created, 0 AS notified
FROM django_pgqueue_job_all AS job
WHERE job.idempotency_key = ANY (%(idempotency_keys)s::text[])


-- name: enqueue_coalesced
-- Insert one job, or update and return the pending job holding its coalesce key, with
-- django_pgqueue_enqueue_coalesced (migration 0026): it locks the key's row in
-- django_pgqueue_coalesce_key (made if missing) until the transaction ends, so
-- producers of one key decide one after the other, and reads the holder the row names
-- by primary key in a new snapshot. The pending job takes the newest arguments (the
-- reindex-after-edit case wants the latest state); its task, queue and priority stay.
-- With a debounce (debounce_seconds not NULL), its start moves to now() + debounce when
-- that is later; without, its available_at stays (so a repeatedly coalesced job keeps
-- its place). A holder of another task is returned unchanged. A claim, a retry or a
-- cancel ends a job's hold: an enqueue racing the claim waits for it, then inserts a
-- new job, which the key's row then names. A new job's partition or key is signalled as
-- by the statements above.
SELECT
    (coalesced.job).id, (coalesced.job).queue, (coalesced.job).task_path,
    (coalesced.job).args, (coalesced.job).kwargs, (coalesced.job).priority,
    (coalesced.job).status, (coalesced.job).attempts, (coalesced.job).max_attempts,
    (coalesced.job).lease_generation, (coalesced.job).claimed_by,
    (coalesced.job).claimed_at, (coalesced.job).lease_expires_at,
    (coalesced.job).available_at, (coalesced.job).created_at,
    (coalesced.job).started_at, (coalesced.job).finished_at, (coalesced.job).last_error,
    (coalesced.job).last_error_class, (coalesced.job).errors, (coalesced.job).result,
    (coalesced.job).idempotency_key, (coalesced.job).partition_key,
    (coalesced.job).partition_bucket, (coalesced.job).step,
    (coalesced.job).unknown_task_since, (coalesced.job).traceparent,
    (coalesced.job).awaited, (coalesced.job).has_dependents,
    (coalesced.job).coalesce_key, (coalesced.job).concurrency_key,
    (coalesced.job).concurrency_limit, (coalesced.job).rate_limit,
    (coalesced.job).rate_period, (coalesced.job).cancel_requested_at,
    (coalesced.job).snoozes,
    coalesced.created, coalesced.notified
FROM django_pgqueue_enqueue_coalesced(
    %(queue)s, %(task_path)s, %(args)s::jsonb, %(kwargs)s::jsonb, %(priority)s::integer,
    %(max_attempts)s::integer, %(available_at)s::timestamptz,
    %(debounce_seconds)s::float8, %(coalesce_key)s, %(partition_key)s,
    %(partition_bucket)s::integer, %(traceparent)s, %(concurrency_key)s,
    %(concurrency_limit)s::integer, %(rate_limit)s::integer, %(rate_period)s::float8,
    %(channel)s, %(flow_channel)s
) AS coalesced
