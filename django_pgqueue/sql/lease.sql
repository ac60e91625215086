-- Workers: claiming jobs and everything a lease holder may do with them.
--
-- Every write after the claim is fenced: it applies only while the caller still holds
-- that exact lease (job id + lease_generation + worker id + status 'processing'). A
-- worker that lost its lease (expired and reaped, released, finished by an operator)
-- changes nothing and learns so from the empty RETURNING.
--
-- Multi-row writes lock their rows in id order first (the "locked" CTEs), so two of them
-- touching the same jobs (a worker's completion batch and its lease-extension batch on
-- another connection) queue behind each other instead of deadlocking.


-- name: claim_batch
-- Lease ready jobs to one worker, in claim order, up to a separate limit per queue.
-- Each queue gets its own LIMIT, so a flood in one queue cannot starve the others.
-- A partitioned job is claimable only if it is the oldest pending job of its partition
-- and no job of its partition is processing; this is checked here, in the database, so
-- it holds whatever the workers believe about bucket ownership. A concurrent claimer
-- either skips the head (locked) or sees it still pending (older), so two jobs of one
-- partition can never be leased at once.
-- bucket_masks holds, per queue, 1024 characters '0'/'1' marking the owned buckets
-- (NULL: all buckets). Partitioned rows are looked at through a window of the first
-- partition_scan_limit candidates in claim order (see partition_heads).
-- Uses pgq_job_claim (unpartitioned), pgq_job_claim_part (partitioned), and for the head
-- checks pgq_job_part_pending and pgq_job_part_processing.
WITH wanted AS (
    SELECT *
    FROM unnest(%(queues)s::text[], %(bucket_masks)s::text[], %(queue_limits)s::integer[])
        AS wanted (queue, bucket_mask, queue_limit)
),
unpartitioned AS (
    SELECT wanted.queue, wanted.queue_limit, candidate.id, candidate.priority,
        candidate.available_at
    FROM wanted
    CROSS JOIN LATERAL (
        SELECT job.id, job.priority, job.available_at
        FROM django_pgqueue_job AS job
        WHERE job.status = 'pending'
          AND job.partition_key IS NULL
          AND job.queue = wanted.queue
          AND job.available_at <= now()
        ORDER BY job.priority DESC, job.available_at, job.id
        LIMIT wanted.queue_limit
        FOR UPDATE OF job SKIP LOCKED
    ) AS candidate
),
partition_heads AS (
    SELECT wanted.queue, wanted.queue_limit, candidate.id, candidate.priority,
        candidate.available_at
    FROM wanted
    CROSS JOIN LATERAL (
        SELECT job.id, job.priority, job.available_at
        FROM django_pgqueue_job AS job
        WHERE job.id IN (
                -- The scan window: the first partition_scan_limit partitioned rows in
                -- claim order. Rows behind the head of a busy partition are never
                -- claimable, and a deep backlog in one partition would otherwise make
                -- every claim walk all of it; the window bounds the work per claim.
                SELECT window_job.id
                FROM django_pgqueue_job AS window_job
                WHERE window_job.status = 'pending'
                  AND window_job.partition_bucket IS NOT NULL
                  AND window_job.queue = wanted.queue
                  AND window_job.available_at <= now()
                  AND (
                      wanted.bucket_mask IS NULL
                      OR substr(wanted.bucket_mask, window_job.partition_bucket + 1, 1) = '1'
                  )
                ORDER BY window_job.priority DESC, window_job.available_at, window_job.id
                LIMIT %(partition_scan_limit)s
            )
          AND job.status = 'pending'
          -- Head checks as scalar subqueries on purpose: PostgreSQL would turn NOT EXISTS
          -- into an anti-join over every pending partitioned row; as subqueries they are
          -- one index probe per candidate in the window.
          AND job.id = (
              SELECT min(older.id)
              FROM django_pgqueue_job AS older
              WHERE older.status = 'pending'
                AND older.partition_key = job.partition_key
          )
          AND (
              SELECT 1
              FROM django_pgqueue_job AS running
              WHERE running.status = 'processing'
                AND running.partition_key = job.partition_key
              LIMIT 1
          ) IS NULL
        ORDER BY job.priority DESC, job.available_at, job.id
        LIMIT wanted.queue_limit
        FOR UPDATE OF job SKIP LOCKED
    ) AS candidate
),
picked AS (
    -- Both branches may lock queue_limit rows of a queue; keep the best queue_limit.
    -- The others stay locked only until this statement's transaction ends.
    SELECT ranked.id
    FROM (
        SELECT candidates.id, candidates.queue_limit,
            row_number() OVER (
                PARTITION BY candidates.queue
                ORDER BY candidates.priority DESC, candidates.available_at, candidates.id
            ) AS rank
        FROM (
            SELECT * FROM unpartitioned
            UNION ALL
            SELECT * FROM partition_heads
        ) AS candidates
    ) AS ranked
    WHERE ranked.rank <= ranked.queue_limit
)
UPDATE django_pgqueue_job AS job
SET status = 'processing',
    attempts = job.attempts + 1,
    lease_generation = job.lease_generation + 1,
    claimed_by = %(worker_id)s,
    claimed_at = now(),
    started_at = COALESCE(job.started_at, now()),
    lease_expires_at = now() + make_interval(secs => %(lease_seconds)s)
-- = ANY(ARRAY(...)) rather than a join: a prepared statement's generic plan cannot know
-- how few ids come back, and would hash-join against a scan of the whole table.
WHERE job.id = ANY (ARRAY(SELECT picked.id FROM picked))
RETURNING
    job.id, job.queue, job.task_path, job.args, job.kwargs, job.priority, job.attempts,
    job.max_attempts, job.lease_generation, job.step, job.partition_key,
    job.idempotency_key, job.created_at, job.available_at, job.claimed_at,
    job.lease_expires_at, jsonb_path_query_array(job.errors, '$[*].worker') AS prior_workers


-- name: complete_if_leased
-- Mark one leased job succeeded and store its result.
-- Runs inside an atomic task's own transaction, where now() is when the handler began:
-- clock_timestamp() is when it finished.
UPDATE django_pgqueue_job
SET status = 'succeeded',
    result = %(result)s::jsonb,
    finished_at = clock_timestamp(),
    lease_expires_at = NULL
WHERE id = %(job_id)s
  AND lease_generation = %(lease_generation)s
  AND claimed_by = %(worker_id)s
  AND status = 'processing'
RETURNING id, finished_at


-- name: complete_many_if_leased
-- Mark many leased jobs succeeded, each checked against its own lease generation.
-- completions is one JSON document, [[job id, lease generation, result], ...]: cheaper to
-- send than three arrays. Returns the ids that were still leased; the others were lost
-- and are left untouched.
WITH done AS (
    SELECT (item ->> 0)::bigint AS id, (item ->> 1)::bigint AS lease_generation,
        item -> 2 AS result
    FROM jsonb_array_elements(%(completions)s::jsonb) AS item
),
locked AS (
    SELECT job.id
    FROM django_pgqueue_job AS job
    WHERE job.id = ANY (ARRAY(SELECT done.id FROM done))
    ORDER BY job.id
    FOR UPDATE
)
UPDATE django_pgqueue_job AS job
SET status = 'succeeded',
    result = done.result,
    finished_at = now(),
    lease_expires_at = NULL
FROM done
JOIN locked ON locked.id = done.id
WHERE job.id = done.id
  AND job.lease_generation = done.lease_generation
  AND job.claimed_by = %(worker_id)s
  AND job.status = 'processing'
RETURNING job.id


-- name: fail_if_leased
-- Record a failed attempt: retry after a backoff, or dead-letter when the error is
-- permanent or the attempts are used up. The backoff is computed here, on the database
-- clock: min(retry_max, retry_base * 2^(attempts - 1)) * (1 + retry_jitter * u), u in [-1, 1).
UPDATE django_pgqueue_job AS job
SET status = CASE
        WHEN %(permanent)s::boolean OR job.attempts >= job.max_attempts THEN 'dead_letter'
        ELSE 'pending'
    END,
    available_at = CASE
        WHEN %(permanent)s::boolean OR job.attempts >= job.max_attempts THEN job.available_at
        ELSE now() + make_interval(secs =>
            LEAST(%(retry_max)s, %(retry_base)s * power(2.0, GREATEST(job.attempts - 1, 0)))
            * (1 + %(retry_jitter)s * (2 * random() - 1)))
    END,
    finished_at = CASE
        WHEN %(permanent)s::boolean OR job.attempts >= job.max_attempts THEN now()
    END,
    claimed_by = CASE
        WHEN %(permanent)s::boolean OR job.attempts >= job.max_attempts THEN job.claimed_by
    END,
    lease_expires_at = NULL,
    last_error = %(message)s::text,
    last_error_class = %(error_class)s::text,
    errors = job.errors || jsonb_build_array(jsonb_build_object(
        'attempt', job.attempts,
        'exception_class', %(error_class)s::text,
        'message', %(message)s::text,
        'traceback', %(traceback)s::text,
        'worker', %(worker_id)s::text,
        'at', now()
    ))
WHERE job.id = %(job_id)s
  AND job.lease_generation = %(lease_generation)s
  AND job.claimed_by = %(worker_id)s::text
  AND job.status = 'processing'
RETURNING job.id, job.status, job.available_at, job.attempts, job.max_attempts


-- name: extend_lease_if_leased
-- Push one lease's expiry to now() + lease_seconds.
UPDATE django_pgqueue_job
SET lease_expires_at = now() + make_interval(secs => %(lease_seconds)s)
WHERE id = %(job_id)s
  AND lease_generation = %(lease_generation)s
  AND claimed_by = %(worker_id)s
  AND status = 'processing'
RETURNING id, lease_expires_at


-- name: extend_leases_if_leased
-- Push many leases' expiry to now() + lease_seconds; returns the ids still held.
-- leases is one JSON document, [[job id, lease generation], ...].
WITH held AS (
    SELECT (item ->> 0)::bigint AS id, (item ->> 1)::bigint AS lease_generation
    FROM jsonb_array_elements(%(leases)s::jsonb) AS item
),
locked AS (
    SELECT job.id
    FROM django_pgqueue_job AS job
    WHERE job.id = ANY (ARRAY(SELECT held.id FROM held))
    ORDER BY job.id
    FOR UPDATE
)
UPDATE django_pgqueue_job AS job
SET lease_expires_at = now() + make_interval(secs => %(lease_seconds)s)
FROM held
JOIN locked ON locked.id = held.id
WHERE job.id = held.id
  AND job.lease_generation = held.lease_generation
  AND job.claimed_by = %(worker_id)s
  AND job.status = 'processing'
RETURNING job.id


-- name: release_if_leased
-- Give a leased job back without using up an attempt, available again after delay_seconds.
-- The generation is bumped, so a late completion by the releasing worker is fenced off.
WITH released AS (
    UPDATE django_pgqueue_job
    SET status = 'pending',
        attempts = attempts - 1,
        lease_generation = lease_generation + 1,
        claimed_by = NULL,
        lease_expires_at = NULL,
        available_at = now() + make_interval(secs => %(delay_seconds)s),
        last_error = COALESCE(%(reason)s, last_error)
    WHERE id = %(job_id)s
      AND lease_generation = %(lease_generation)s
      AND claimed_by = %(worker_id)s
      AND status = 'processing'
    RETURNING id, queue, available_at
),
woken AS (
    SELECT pg_notify(%(channel)s, released.queue)
    FROM released
    WHERE released.available_at <= now()
)
SELECT released.id, released.available_at, (SELECT count(*) FROM woken) AS notified
FROM released


-- name: release_many_if_leased
-- Give many leased jobs back at once (worker shutdown), each fenced by its generation.
WITH held AS (
    SELECT (item ->> 0)::bigint AS id, (item ->> 1)::bigint AS lease_generation
    FROM jsonb_array_elements(%(leases)s::jsonb) AS item
),
locked AS (
    SELECT job.id
    FROM django_pgqueue_job AS job
    WHERE job.id = ANY (ARRAY(SELECT held.id FROM held))
    ORDER BY job.id
    FOR UPDATE
),
released AS (
    UPDATE django_pgqueue_job AS job
    SET status = 'pending',
        attempts = job.attempts - 1,
        lease_generation = job.lease_generation + 1,
        claimed_by = NULL,
        lease_expires_at = NULL,
        available_at = now(),
        last_error = COALESCE(%(reason)s, job.last_error)
    FROM held
    JOIN locked ON locked.id = held.id
    WHERE job.id = held.id
      AND job.lease_generation = held.lease_generation
      AND job.claimed_by = %(worker_id)s
      AND job.status = 'processing'
    RETURNING job.id, job.queue
),
woken AS (
    SELECT pg_notify(%(channel)s, ready.queue)
    FROM (SELECT DISTINCT released.queue FROM released) AS ready
)
SELECT released.id, (SELECT count(*) FROM woken) AS notified
FROM released


-- name: set_step_if_leased
-- Record the progress marker of a multi-step job, so a retry can resume after it.
UPDATE django_pgqueue_job
SET step = %(step)s
WHERE id = %(job_id)s
  AND lease_generation = %(lease_generation)s
  AND claimed_by = %(worker_id)s
  AND status = 'processing'
RETURNING id
