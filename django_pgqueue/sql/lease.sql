-- Workers: claiming jobs and everything a lease holder may do with them.
--
-- Every write after the claim is fenced: it applies only while the caller still holds
-- that exact lease (job id + lease_generation + worker id + status 'processing'). A
-- worker that lost its lease (expired and reaped, released, finished by an operator)
-- changes nothing and learns so from the empty RETURNING.
--
-- Locks, so that no bookkeeping statement queues behind a long transaction:
-- * Multi-row writes lock their rows in id order first (the "locked" CTEs), and only rows
--   that still carry the caller's lease, so a row taken over by another worker (whose
--   atomic task may hold it for minutes) is never waited on.
-- * The lease extension never waits at all (SKIP LOCKED): the only long holder of a
--   leased row is the job's own atomic task, and its lease is kept by that lock (the
--   reaper skips locked rows too).
-- * A statement that moves a partitioned job refreshes its partition row in the same
--   transaction (django_pgqueue_refresh_partitions, migration 0004), taking partition
--   locks in key order after its job locks; the claim takes both with SKIP LOCKED.
-- * Likewise a statement that moves a job under a concurrency limit recounts its key's
--   row (django_pgqueue_refresh_concurrency, migration 0011), after its partition rows,
--   and passes the notify channel: a key that drops under its limit with a ready job
--   wakes its queue's workers, so a waiting job starts as soon as a slot frees.


-- name: claim_batch
-- Lease ready jobs to one worker: at most queue_limit per queue and total_limit in all.
-- Every served queue is looked at in every claim; when the total is smaller than the
-- number of queues, each queue's best job competes in the order of "turn" (the caller
-- rotates it), so queues take turns without any of them being skipped unseen.
-- Unpartitioned jobs come from pgq_job_claim. A partitioned job is claimed only as the
-- next job of an idle partition (pgq_partition_claim): the partition row is locked with
-- SKIP LOCKED and marked running in this statement, so two jobs of one partition can
-- never be leased at once, and a deep or blocked partition costs the claim nothing. The
-- job itself is re-checked against the job table (the oldest pending of its partition,
-- none processing), so a stale partition row can delay a job but never reorder one.
-- bucket_masks holds, per queue, 1024 characters '0'/'1' marking the owned buckets
-- (NULL: all buckets).
-- A job under a concurrency limit is claimed only through its key's row
-- (pgq_concurrency_claim: keys under their limit with a ready next job): the key row is
-- locked with SKIP LOCKED, at most (limit - in flight) of its ready jobs are taken, and
-- in_flight is counted up in this statement. Keys at their limit are not in that index,
-- so they cost the claim nothing, and their jobs hold no lease meanwhile. A key with a
-- rate limit also spends tokens of its bucket here (refilled at rate_limit per
-- rate_period on the database clock, holding at most rate_limit): no token, no start.
-- The last row has a NULL id and says whether producers left partition or concurrency
-- signals to fold (then the worker runs fold_partition_signals and claims again), and
-- whether a concurrency key of these queues has a job that could start (keys_open).
-- While none has, the worker claims with claim_batch_plain: this statement without its
-- key sections. Limited jobs are not in pgq_job_claim, so that one can never start a
-- job past its limit; it leaves them to claim_batch, which the worker sends at once
-- when keys_open turns true. Plain jobs then pay for limits only that probe of a small
-- index.
-- variant: claim_batch_plain without keys
WITH wanted AS (
    SELECT *
    FROM unnest(%(queues)s::text[], %(bucket_masks)s::text[], %(queue_limits)s::integer[])
        WITH ORDINALITY AS wanted (queue, bucket_mask, queue_limit, turn)
    -- Pause: a paused queue is not served. Read here, in the claim itself, so a pause
    -- committed before this statement began holds for every worker (one probe per
    -- queue of the pause table's primary key; the table is empty or nearly).
    WHERE NOT EXISTS (
        SELECT 1 FROM django_pgqueue_queue_pause AS paused WHERE paused.queue = wanted.queue
    )
),
unpartitioned AS (
    SELECT wanted.queue, wanted.queue_limit, wanted.turn, candidate.id, candidate.priority,
        candidate.available_at
    FROM wanted
    CROSS JOIN LATERAL (
        SELECT job.id, job.priority, job.available_at
        FROM django_pgqueue_job AS job
        WHERE job.status = 'pending'
          AND job.partition_key IS NULL
          AND job.concurrency_key IS NULL
          AND job.queue = wanted.queue
          AND job.available_at <= now()
        ORDER BY job.priority DESC, job.available_at, job.id
        LIMIT wanted.queue_limit
        FOR UPDATE OF job SKIP LOCKED
    ) AS candidate
),
idle_partitions AS (
    SELECT wanted.queue, wanted.queue_limit, wanted.turn, part.partition_key, part.head_id
    FROM wanted
    CROSS JOIN LATERAL (
        SELECT part.partition_key, part.head_id
        FROM django_pgqueue_partition AS part
        WHERE part.running_id IS NULL
          AND part.head_id IS NOT NULL
          AND part.queue = wanted.queue
          AND part.head_available_at <= now()
          AND (
              wanted.bucket_mask IS NULL
              OR substr(wanted.bucket_mask, part.partition_bucket + 1, 1) = '1'
          )
        ORDER BY part.head_priority DESC, part.head_available_at, part.head_id
        LIMIT wanted.queue_limit
        FOR UPDATE OF part SKIP LOCKED
    ) AS part
),
partition_heads AS (
    SELECT idle_partitions.queue, idle_partitions.queue_limit, idle_partitions.turn,
        job.id, job.priority, job.available_at
    FROM django_pgqueue_job AS job
    JOIN idle_partitions ON idle_partitions.head_id = job.id
    -- By primary key (= ANY (ARRAY(...)), as for the UPDATE below). COALESCE hides the
    -- readiness check from index matching: a generic plan made while the queue was empty
    -- would otherwise walk pgq_job_pending (whose predicate says available_at IS NOT
    -- NULL), filtering on id.
    WHERE job.id = ANY (ARRAY(SELECT idle_partitions.head_id FROM idle_partitions))
      AND job.status = 'pending'
      AND job.partition_key = idle_partitions.partition_key
      AND COALESCE(job.available_at, now()) <= now()
      -- The safety net under the partition row: no older pending job and no running job
      -- in the partition. Scalar subqueries on purpose, one index probe per head
      -- (pgq_job_part_pending, pgq_job_part_processing); NOT EXISTS could become an
      -- anti-join over every pending partitioned row.
      AND (
          SELECT 1
          FROM django_pgqueue_job AS older
          WHERE older.status = 'pending'
            AND older.partition_key = job.partition_key
            AND older.id < job.id
          LIMIT 1
      ) IS NULL
      AND (
          SELECT 1
          FROM django_pgqueue_job AS running
          WHERE running.status = 'processing'
            AND running.partition_key = job.partition_key
          LIMIT 1
      ) IS NULL
    FOR UPDATE OF job SKIP LOCKED
),
-- begin keys
open_keys AS (
    -- pgq_concurrency_claim. Locked, the row is the newest version (rechecked against
    -- in_flight < max_in_flight), so two claims never both fill a key's free slots.
    SELECT wanted.queue, wanted.queue_limit, wanted.turn, conc.concurrency_key,
        LEAST(
            conc.max_in_flight - conc.in_flight,
            COALESCE(floor(conc.tokens)::integer, conc.max_in_flight)
        ) AS free
    FROM wanted
    CROSS JOIN LATERAL (
        SELECT conc.concurrency_key, conc.max_in_flight, conc.in_flight,
            -- The bucket as of now (NULL: no rate limit); rechecked on the locked row.
            LEAST(
                conc.rate_limit::double precision,
                conc.tokens + GREATEST(extract(epoch FROM now() - conc.tokens_at), 0)
                    * conc.rate_limit / conc.rate_period
            ) AS tokens
        FROM django_pgqueue_concurrency AS conc
        WHERE conc.head_id IS NOT NULL
          AND conc.in_flight < conc.max_in_flight
          AND conc.queue = wanted.queue
          AND conc.head_available_at <= now()
          AND (
              conc.rate_limit IS NULL
              OR conc.tokens + GREATEST(extract(epoch FROM now() - conc.tokens_at), 0)
                  * conc.rate_limit / conc.rate_period >= 1
          )
        ORDER BY conc.head_priority DESC, conc.head_available_at, conc.head_id
        LIMIT wanted.queue_limit
        FOR UPDATE OF conc SKIP LOCKED
    ) AS conc
),
key_jobs AS (
    -- pgq_job_conc_pending: the key's ready jobs in claim order, as many as it has free
    -- slots. A job claimed a moment ago by another worker is skipped on recheck.
    SELECT open_keys.queue, open_keys.queue_limit, open_keys.turn, candidate.id,
        candidate.priority, candidate.available_at
    FROM open_keys
    CROSS JOIN LATERAL (
        SELECT job.id, job.priority, job.available_at
        FROM django_pgqueue_job AS job
        WHERE job.status = 'pending'
          AND job.concurrency_key = open_keys.concurrency_key
          AND job.queue = open_keys.queue
          -- COALESCE hides the readiness check from index matching, as in
          -- partition_heads: pgq_job_pending would otherwise tempt a generic plan.
          AND COALESCE(job.available_at, now()) <= now()
        ORDER BY job.priority DESC, job.available_at, job.id
        LIMIT LEAST(open_keys.free, open_keys.queue_limit)
        FOR UPDATE OF job SKIP LOCKED
    ) AS candidate
),
-- end keys
picked AS (
    -- All branches may lock queue_limit rows of a queue; keep the best queue_limit of
    -- each, then the first total_limit by (rank within its queue, turn). The others stay
    -- locked only until this statement's transaction ends.
    SELECT ranked.id
    FROM (
        SELECT candidates.id, candidates.queue_limit, candidates.turn,
            row_number() OVER (
                PARTITION BY candidates.queue
                ORDER BY candidates.priority DESC, candidates.available_at, candidates.id
            ) AS rank
        FROM (
            SELECT * FROM unpartitioned
            UNION ALL
            SELECT * FROM partition_heads
            -- begin keys
            UNION ALL
            SELECT * FROM key_jobs
            -- end keys
        ) AS candidates
    ) AS ranked
    WHERE ranked.rank <= ranked.queue_limit
    ORDER BY ranked.rank, ranked.turn
    LIMIT %(total_limit)s
),
claimed AS (
    UPDATE django_pgqueue_job AS job
    SET status = 'processing',
        attempts = job.attempts + 1,
        lease_generation = job.lease_generation + 1,
        claimed_by = %(worker_id)s,
        claimed_at = now(),
        started_at = COALESCE(job.started_at, now()),
        lease_expires_at = now() + make_interval(secs => %(lease_seconds)s)
    -- = ANY(ARRAY(...)) rather than a join: a prepared statement's generic plan cannot
    -- know how few ids come back, and would hash-join against a scan of the whole table.
    WHERE job.id = ANY (ARRAY(SELECT picked.id FROM picked))
    RETURNING
        job.id, job.queue, job.task_path, job.args, job.kwargs, job.priority, job.attempts,
        job.max_attempts, job.lease_generation, job.step, job.partition_key,
        job.idempotency_key, job.created_at, job.available_at, job.claimed_at,
        job.lease_expires_at, jsonb_path_query_array(job.errors, '$[*].worker') AS prior_workers,
        job.unknown_task_since, job.traceparent, job.concurrency_key
),
-- begin keys
taken AS (
    SELECT claimed.concurrency_key, count(*) AS claimed, array_agg(claimed.id) AS ids
    FROM claimed
    WHERE claimed.concurrency_key IS NOT NULL
    GROUP BY claimed.concurrency_key
),
counted AS (
    -- The key rows were locked by open_keys above. The next job is what this snapshot
    -- shows besides the jobs just taken (pgq_job_conc_pending); a stale guess can cost
    -- a claim a probe but never a slot: in_flight is exact, and the jobs taken here
    -- refresh the row when they finish.
    UPDATE django_pgqueue_concurrency AS conc
    SET in_flight = conc.in_flight + taken.claimed,
        -- Spend one token per start. The clock never moves back (a claim that began
        -- before another's commit must not count that refill twice).
        tokens = LEAST(
            conc.rate_limit::double precision,
            conc.tokens + GREATEST(extract(epoch FROM now() - conc.tokens_at), 0)
                * conc.rate_limit / conc.rate_period
        ) - taken.claimed,
        tokens_at = GREATEST(conc.tokens_at, now()),
        head_id = next_job.id,
        head_priority = next_job.priority,
        head_available_at = next_job.available_at,
        refreshed_at = now()
    FROM taken
    LEFT JOIN LATERAL (
        SELECT job.id, job.priority, job.available_at
        FROM django_pgqueue_job AS job
        WHERE job.status = 'pending'
          AND job.concurrency_key = taken.concurrency_key
          AND COALESCE(job.available_at, now()) <= now()
          AND job.id <> ALL (taken.ids)
        ORDER BY job.priority DESC, job.available_at, job.id
        LIMIT 1
    ) AS next_job ON true
    WHERE conc.concurrency_key = taken.concurrency_key
    RETURNING conc.concurrency_key
),
-- end keys
running AS (
    -- The partition rows were locked by idle_partitions above.
    UPDATE django_pgqueue_partition AS part
    SET running_id = claimed.id,
        refreshed_at = now()
    FROM claimed
    WHERE part.partition_key = claimed.partition_key
    RETURNING part.partition_key
)
SELECT claimed.*,
    (SELECT count(*) FROM running)
    -- begin keys
    + (SELECT count(*) FROM counted)
    -- end keys
    AS partitions_started, false AS signalled, false AS keys_open
FROM claimed
UNION ALL
SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
    NULL, NULL, NULL, NULL, NULL, NULL,
    (SELECT count(*) FROM running)
    -- begin keys
    + (SELECT count(*) FROM counted)
    -- end keys
    ,
    EXISTS (SELECT 1 FROM django_pgqueue_partition_signal)
    OR EXISTS (SELECT 1 FROM django_pgqueue_concurrency_signal),
    -- pgq_concurrency_claim: a key of these queues whose next job could start.
    EXISTS (
        SELECT 1 FROM django_pgqueue_concurrency AS conc
        WHERE conc.head_id IS NOT NULL
          AND conc.in_flight < conc.max_in_flight
          AND conc.queue = ANY (%(queues)s::text[])
    )


-- name: fold_partition_signals
-- Bring the partitions and concurrency keys that producers and operators signalled up
-- to date, at most batch_size signals of each at a time; returns how many were
-- refreshed. Its own short transaction: it waits only on other refreshes of the same
-- rows (partitions first, then keys, as every statement takes them).
WITH taken AS (
    DELETE FROM django_pgqueue_partition_signal AS signal
    WHERE signal.id = ANY (ARRAY(
        SELECT pending.id
        FROM django_pgqueue_partition_signal AS pending
        ORDER BY pending.id
        LIMIT %(batch_size)s
        FOR UPDATE SKIP LOCKED
    ))
    RETURNING signal.partition_key
),
taken_keys AS (
    DELETE FROM django_pgqueue_concurrency_signal AS signal
    WHERE signal.id = ANY (ARRAY(
        SELECT pending.id
        FROM django_pgqueue_concurrency_signal AS pending
        ORDER BY pending.id
        LIMIT %(batch_size)s
        FOR UPDATE SKIP LOCKED
    ))
    RETURNING signal.concurrency_key
),
partitions AS (
    SELECT django_pgqueue_refresh_partitions(ARRAY(SELECT taken.partition_key FROM taken))
        AS refreshed
)
SELECT partitions.refreshed + django_pgqueue_refresh_concurrency(
    -- No channel: the producer that signalled woke the queue itself.
    ARRAY(SELECT taken_keys.concurrency_key FROM taken_keys), NULL
) AS refreshed
FROM partitions


-- name: complete_if_leased
-- Mark one leased job succeeded and store its result; refresh its partition.
-- finished_at is clock_timestamp(): run inside an atomic task's transaction, now() would
-- be when that transaction began, not when the handler finished.
WITH completed AS (
    UPDATE django_pgqueue_job
    SET status = 'succeeded',
        result = %(result)s::jsonb,
        finished_at = clock_timestamp(),
        lease_expires_at = NULL
    WHERE id = %(job_id)s
      AND lease_generation = %(lease_generation)s
      AND claimed_by = %(worker_id)s
      AND status = 'processing'
    RETURNING id, finished_at, partition_key, concurrency_key
)
SELECT completed.id, completed.finished_at,
    django_pgqueue_refresh_partitions(ARRAY[completed.partition_key]) AS partitions,
    CASE WHEN completed.concurrency_key IS NOT NULL THEN
        django_pgqueue_refresh_concurrency(ARRAY[completed.concurrency_key], %(channel)s)
    END AS keys
FROM completed


-- name: complete_many_if_leased
-- Mark many leased jobs succeeded, each checked against its own lease generation, and
-- refresh their partitions. completions is one JSON document, [[job id, lease
-- generation, result], ...]: cheaper to send than three arrays. Returns the ids that were
-- still leased; the others were lost (or already completed: see succeeded_under_leases)
-- and are left untouched.
WITH done AS (
    SELECT (item ->> 0)::bigint AS id, (item ->> 1)::bigint AS lease_generation,
        item -> 2 AS result
    FROM jsonb_array_elements(%(completions)s::jsonb) AS item
),
locked AS (
    -- Only rows still carrying the lease are locked: a row another worker took over
    -- (and its atomic task may hold for minutes) is never waited on.
    SELECT job.id
    FROM django_pgqueue_job AS job
    JOIN done ON done.id = job.id AND done.lease_generation = job.lease_generation
    WHERE job.id = ANY (ARRAY(SELECT done.id FROM done))
      AND job.claimed_by = %(worker_id)s
      AND job.status = 'processing'
    ORDER BY job.id
    FOR UPDATE OF job
),
completed AS (
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
    RETURNING job.id, job.partition_key, job.concurrency_key
),
refreshed AS (
    SELECT django_pgqueue_refresh_partitions(ARRAY(
        SELECT completed.partition_key FROM completed WHERE completed.partition_key IS NOT NULL
    )) AS partitions
),
recounted AS (
    -- After the partitions (lock order); skipped when no job had a key.
    SELECT django_pgqueue_refresh_concurrency(keys.keys, %(channel)s) AS keys
    FROM refreshed
    CROSS JOIN (
        SELECT ARRAY(
            SELECT completed.concurrency_key FROM completed
            WHERE completed.concurrency_key IS NOT NULL
        ) AS keys
    ) AS keys
    WHERE cardinality(keys.keys) > 0
)
SELECT completed.id
FROM completed
CROSS JOIN refreshed
LEFT JOIN recounted ON true


-- name: succeeded_under_leases
-- Return which of the given leases' jobs already succeeded under that very lease: a
-- completion sent again after its answer was lost with the connection. No other attempt
-- or worker can hold the lease, so such a job succeeded by that first write. Sent only
-- when complete_many_if_leased came back short, so a drain never pays for it. leases is
-- one JSON document, [[job id, lease generation], ...]. Uses the primary key.
WITH asked AS (
    SELECT (item ->> 0)::bigint AS id, (item ->> 1)::bigint AS lease_generation
    FROM jsonb_array_elements(%(leases)s::jsonb) AS item
)
SELECT job.id
FROM django_pgqueue_job AS job
JOIN asked ON asked.id = job.id AND asked.lease_generation = job.lease_generation
WHERE job.id = ANY (ARRAY(SELECT asked.id FROM asked))
  AND job.claimed_by = %(worker_id)s
  AND job.status = 'succeeded'


-- name: fail_if_leased
-- Record a failed attempt: retry after a backoff, or dead-letter the job when the error
-- is permanent or the attempts are used up; refresh its partition (a retried job stays
-- its partition's next job: it keeps its place). The backoff is computed here, on the
-- database clock: min(retry_max, retry_base * 2^(attempts - 1)) * (1 + retry_jitter * u),
-- u in [-1, 1).
WITH failed AS (
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
        -- The worker ran it, so it knows the task: a later unknown-task wait starts anew.
        unknown_task_since = NULL,
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
    RETURNING job.id, job.status, job.available_at, job.attempts, job.max_attempts,
        job.partition_key, job.concurrency_key
)
SELECT failed.id, failed.status, failed.available_at, failed.attempts, failed.max_attempts,
    django_pgqueue_refresh_partitions(ARRAY[failed.partition_key]) AS partitions,
    CASE WHEN failed.concurrency_key IS NOT NULL THEN
        django_pgqueue_refresh_concurrency(ARRAY[failed.concurrency_key], %(channel)s)
    END AS keys
FROM failed


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
-- Push many leases' expiry to now() + lease_seconds, never waiting on a row lock.
-- leases is one JSON document, [[job id, lease generation], ...]. Returns one row per
-- lease (id, generation) with held = true (extended) or false (the row is locked right now, by an atomic
-- task's open transaction say, but still carries this lease: try again next beat).
-- A lease that is in neither list was lost. Rows are locked only if they still carry
-- the lease, so a lease that moved to another worker is never locked here; and SKIP
-- LOCKED means the heartbeat holds no lock while it waits for another.
WITH held AS (
    SELECT (item ->> 0)::bigint AS id, (item ->> 1)::bigint AS lease_generation
    FROM jsonb_array_elements(%(leases)s::jsonb) AS item
),
locked AS (
    SELECT job.id
    FROM django_pgqueue_job AS job
    JOIN held ON held.id = job.id AND held.lease_generation = job.lease_generation
    WHERE job.id = ANY (ARRAY(SELECT held.id FROM held))
      AND job.claimed_by = %(worker_id)s
      AND job.status = 'processing'
    ORDER BY job.id
    FOR UPDATE OF job SKIP LOCKED
),
extended AS (
    UPDATE django_pgqueue_job AS job
    SET lease_expires_at = now() + make_interval(secs => %(lease_seconds)s)
    FROM held
    JOIN locked ON locked.id = held.id
    WHERE job.id = held.id
      AND job.lease_generation = held.lease_generation
      AND job.claimed_by = %(worker_id)s
      AND job.status = 'processing'
    RETURNING job.id, job.lease_generation
)
SELECT extended.id, extended.lease_generation, true AS held
FROM extended
UNION ALL
-- Still this worker's lease as of this statement's snapshot, but locked by someone else.
SELECT job.id, job.lease_generation, false AS held
FROM django_pgqueue_job AS job
JOIN held ON held.id = job.id AND held.lease_generation = job.lease_generation
WHERE job.id = ANY (ARRAY(SELECT held.id FROM held))
  AND job.claimed_by = %(worker_id)s
  AND job.status = 'processing'
  AND job.id <> ALL (ARRAY(SELECT locked.id FROM locked))


-- name: release_if_leased
-- Give a leased job back without using up an attempt, available again after delay_seconds.
-- The generation is bumped, so a late completion by the releasing worker is fenced off.
-- unknown_since, when given, starts the unknown-task window (kept if already started).
WITH released AS (
    UPDATE django_pgqueue_job
    SET status = 'pending',
        attempts = attempts - 1,
        lease_generation = lease_generation + 1,
        claimed_by = NULL,
        lease_expires_at = NULL,
        available_at = now() + make_interval(secs => %(delay_seconds)s),
        last_error = COALESCE(%(reason)s, last_error),
        last_error_class = COALESCE(%(reason_class)s, last_error_class),
        unknown_task_since = COALESCE(unknown_task_since, %(unknown_since)s::timestamptz)
    WHERE id = %(job_id)s
      AND lease_generation = %(lease_generation)s
      AND claimed_by = %(worker_id)s
      AND status = 'processing'
    RETURNING id, queue, available_at, partition_key, concurrency_key
),
woken AS (
    SELECT pg_notify(%(channel)s, released.queue)
    FROM released
    WHERE released.available_at <= now()
)
SELECT released.id, released.available_at, (SELECT count(*) FROM woken) AS notified,
    django_pgqueue_refresh_partitions(ARRAY[released.partition_key]) AS partitions,
    CASE WHEN released.concurrency_key IS NOT NULL THEN
        django_pgqueue_refresh_concurrency(ARRAY[released.concurrency_key], %(channel)s)
    END AS keys
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
    JOIN held ON held.id = job.id AND held.lease_generation = job.lease_generation
    WHERE job.id = ANY (ARRAY(SELECT held.id FROM held))
      AND job.claimed_by = %(worker_id)s
      AND job.status = 'processing'
    ORDER BY job.id
    FOR UPDATE OF job
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
    RETURNING job.id, job.queue, job.partition_key, job.concurrency_key
),
woken AS (
    SELECT pg_notify(%(channel)s, ready.queue)
    FROM (SELECT DISTINCT released.queue FROM released) AS ready
),
refreshed AS (
    SELECT django_pgqueue_refresh_partitions(ARRAY(
        SELECT released.partition_key FROM released WHERE released.partition_key IS NOT NULL
    )) AS partitions
),
recounted AS (
    SELECT django_pgqueue_refresh_concurrency(keys.keys, %(channel)s) AS keys
    FROM refreshed
    CROSS JOIN (
        SELECT ARRAY(
            SELECT released.concurrency_key FROM released
            WHERE released.concurrency_key IS NOT NULL
        ) AS keys
    ) AS keys
    WHERE cardinality(keys.keys) > 0
)
SELECT released.id, (SELECT count(*) FROM woken) AS notified
FROM released
CROSS JOIN refreshed
LEFT JOIN recounted ON true


-- name: set_step_if_leased
-- Record the progress marker of a multi-step job, so a retry can resume after it.
UPDATE django_pgqueue_job
SET step = %(step)s
WHERE id = %(job_id)s
  AND lease_generation = %(lease_generation)s
  AND claimed_by = %(worker_id)s
  AND status = 'processing'
RETURNING id
