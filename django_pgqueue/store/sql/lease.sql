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
--   locks in key order after its job locks; the claim takes both with SKIP LOCKED. It
--   passes the jobs it moved (migration 0024): the refresh reads the partition's jobs
--   from the least of those, the row's next job and its running job, so the index
--   entries of the partition's earlier jobs are not walked.
-- * Likewise a statement that moves a job under a concurrency limit recounts its key's
--   row (django_pgqueue_refresh_concurrency, migration 0011), after its partition rows,
--   and passes the flow channel (notices.flow_channel): a key that drops under its limit
--   with a job that can start wakes its queue's workers, and tells them to claim with
--   the statement that reads the keys, so a waiting job starts as soon as a slot frees.


-- name: claim_batch
-- Lease ready jobs to one worker: at most queue_limit per queue and total_limit in all.
-- Every served queue is looked at in every claim; when the total is smaller than the
-- number of queues, each queue's best job competes in the order of "turn" (the caller
-- rotates it), so queues take turns without any of them being skipped unseen.
-- Plain jobs (no partition, no concurrency key) come from pgq_job_claim, from the head
-- of each queue, or from a floor the worker passes per queue (floor_priority,
-- floor_available_at, floor_id: its last claimed job there; NULL: the head). A floor
-- is a worker's answer to a long-held snapshot (worker/cursor.py): a job that sorts
-- before it waits for the worker's next claim from the head.
-- A partitioned job is claimed only as the next job of an idle partition
-- (pgq_partition_claim: partitions whose next job can start now, from the head or from
-- the worker's partition floor, part_floor_*, as for plain jobs): the partition row is
-- locked with SKIP LOCKED and marked running in this statement, so two jobs of one
-- partition can never be leased at once, and a deep, running, blocked or scheduled
-- partition costs the claim nothing. The job itself is re-checked against the job table
-- (the oldest pending or blocked job of its partition, none processing), so a stale
-- partition row can delay a job but never reorder one.
-- bucket_masks holds, per queue, 1024 characters '0'/'1' marking the owned buckets
-- (NULL: all buckets).
-- A job under a concurrency limit is claimed only through its key's row
-- (pgq_concurrency_claim: keys under their limit whose next job can start now; from the
-- head or from the worker's key floor, key_floor_*): the key row is locked with SKIP
-- LOCKED, at most (limit - in flight) of its ready jobs are
-- taken, and in_flight is counted up in this statement. Keys at their limit, out of
-- rate tokens or waiting for a scheduled job are not in that index (wake_at), so they
-- cost the claim nothing, and their jobs hold no lease meanwhile. A key with a rate limit
-- spends tokens of its bucket here (refilled at rate_limit per rate_period on the
-- database clock, holding at most rate_limit): no token, no start.
-- The last row has a NULL id and says whether producers left urgent signals to fold
-- (then the worker runs fold_signals and claims again), and whether partitions or keys
-- of these queues may still have a job that could start (flow_open: a branch came back
-- with as many as it could take, or a key it took from still has room).
-- variant: claim_batch_plain without flow
-- claim_batch_plain is this statement without its partition and key sections: it reads
-- pgq_job_claim and nothing else, however much flow-control state (signals, keys at
-- their limit, throttled keys, and dead index entries of all of them before a vacuum)
-- the database holds. The worker sends it, alone, while nothing says a partition or key
-- of its queues can start (see QueueStore.claim_round); it says signalled and
-- flow_open false.
WITH wanted AS (
    SELECT *
    FROM unnest(
        %(queues)s::text[], %(bucket_masks)s::text[], %(queue_limits)s::integer[],
        %(floor_priorities)s::integer[], %(floor_available_ats)s::timestamptz[],
        %(floor_ids)s::bigint[],
        %(part_floor_priorities)s::integer[], %(part_floor_available_ats)s::timestamptz[],
        %(part_floor_ids)s::bigint[],
        %(key_floor_priorities)s::integer[], %(key_floor_available_ats)s::timestamptz[],
        %(key_floor_ids)s::bigint[]
    ) WITH ORDINALITY AS wanted (
        queue, bucket_mask, queue_limit, floor_priority, floor_available_at, floor_id,
        part_floor_priority, part_floor_available_at, part_floor_id,
        key_floor_priority, key_floor_available_at, key_floor_id, turn
    )
    -- Pause: a paused queue is not served. Read here, in the claim itself, so a pause
    -- committed before this statement began holds for every worker (one probe per
    -- queue of the pause table's primary key; the table is empty or nearly).
    WHERE NOT EXISTS (
        SELECT 1 FROM django_pgqueue_queue_pause AS paused WHERE paused.queue = wanted.queue
    )
),
unpartitioned AS (
    -- pgq_job_claim, from the head of the queue's ready jobs (no floor: the whole queue).
    SELECT wanted.queue, wanted.queue_limit, wanted.turn, candidate.id, candidate.priority,
        candidate.available_at
    FROM wanted
    CROSS JOIN LATERAL (
        SELECT job.id, job.priority, job.available_at
        FROM django_pgqueue_job AS job
        WHERE wanted.floor_id IS NULL
          AND job.status = 'pending'
          AND job.partition_key IS NULL
          AND job.concurrency_key IS NULL
          AND job.queue = wanted.queue
          -- "Ready now" as a row comparison, here and below: from a plain
          -- available_at <= now() the planner proves pgq_job_pending's predicate, and a
          -- generic plan made while the table looked empty (a new or idle queue) then
          -- read every ready job of the queue through it and sorted them, on every
          -- claim, for as long as the plan stayed cached.
          AND (job.available_at, job.id) <= (now(), 9223372036854775807::bigint)
        ORDER BY job.priority DESC, job.available_at, job.id
        LIMIT wanted.queue_limit
        FOR UPDATE OF job SKIP LOCKED
    ) AS candidate
    UNION ALL
    -- With a floor (the worker's last claimed job of this queue, in claim order): the
    -- scan starts there, so the index entries of jobs claimed before it are not walked
    -- again. Those cost a heap visit each while a long transaction's snapshot keeps them
    -- from being removed. Two range scans of pgq_job_claim: the rest of the floor's
    -- priority, then the lower priorities (the gating test on floor_id runs once).
    SELECT wanted.queue, wanted.queue_limit, wanted.turn, candidate.id, candidate.priority,
        candidate.available_at
    FROM wanted
    CROSS JOIN LATERAL (
        SELECT job.id, job.priority, job.available_at
        FROM django_pgqueue_job AS job
        WHERE wanted.floor_id IS NOT NULL
          AND job.status = 'pending'
          AND job.partition_key IS NULL
          AND job.concurrency_key IS NULL
          AND job.queue = wanted.queue
          AND job.priority = wanted.floor_priority
          -- Both bounds as row comparisons: index conditions on pgq_job_claim, which
          -- pgq_job_pending (queue, available_at) cannot prove its predicate from.
          AND (job.available_at, job.id) > (wanted.floor_available_at, wanted.floor_id)
          AND (job.available_at, job.id) <= (now(), 9223372036854775807::bigint)
        ORDER BY job.available_at, job.id
        LIMIT wanted.queue_limit
        FOR UPDATE OF job SKIP LOCKED
    ) AS candidate
    UNION ALL
    SELECT wanted.queue, wanted.queue_limit, wanted.turn, candidate.id, candidate.priority,
        candidate.available_at
    FROM wanted
    CROSS JOIN LATERAL (
        SELECT job.id, job.priority, job.available_at
        FROM django_pgqueue_job AS job
        WHERE wanted.floor_id IS NOT NULL
          AND job.status = 'pending'
          AND job.partition_key IS NULL
          AND job.concurrency_key IS NULL
          AND job.queue = wanted.queue
          AND job.priority < wanted.floor_priority
          AND (job.available_at, job.id) <= (now(), 9223372036854775807::bigint)
        ORDER BY job.priority DESC, job.available_at, job.id
        LIMIT wanted.queue_limit
        FOR UPDATE OF job SKIP LOCKED
    ) AS candidate
),
-- begin flow
idle_partitions AS (
    -- pgq_partition_claim, from the head of the queue's idle partitions, or from the
    -- worker's partition floor (part_floor_*: where the last partition it claimed
    -- there sorted, NULL: the head). Each claim leaves an entry where its partition's
    -- head sorted, which a long-held snapshot keeps from being removed; a floor skips
    -- them, in two range scans as for plain jobs. A partition whose head sorts before
    -- the floor waits for the worker's next claim from the head.
    SELECT wanted.queue, wanted.queue_limit, wanted.turn, part.partition_key, part.head_id,
        part.locked_row
    FROM wanted
    CROSS JOIN LATERAL (
        SELECT part.partition_key, part.head_id, part.ctid AS locked_row
        FROM django_pgqueue_partition AS part
        WHERE wanted.part_floor_id IS NULL
          AND part.running_id IS NULL
          AND part.head_id IS NOT NULL
          AND NOT part.head_blocked
          AND part.wake_at IS NULL
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
    UNION ALL
    SELECT wanted.queue, wanted.queue_limit, wanted.turn, part.partition_key, part.head_id,
        part.locked_row
    FROM wanted
    CROSS JOIN LATERAL (
        SELECT part.partition_key, part.head_id, part.ctid AS locked_row
        FROM django_pgqueue_partition AS part
        WHERE wanted.part_floor_id IS NOT NULL
          AND part.running_id IS NULL
          AND part.head_id IS NOT NULL
          AND NOT part.head_blocked
          AND part.wake_at IS NULL
          AND part.queue = wanted.queue
          AND part.head_available_at <= now()
          AND (
              wanted.bucket_mask IS NULL
              OR substr(wanted.bucket_mask, part.partition_bucket + 1, 1) = '1'
          )
          AND part.head_priority = wanted.part_floor_priority
          AND (part.head_available_at, part.head_id)
              > (wanted.part_floor_available_at, wanted.part_floor_id)
        ORDER BY part.head_available_at, part.head_id
        LIMIT wanted.queue_limit
        FOR UPDATE OF part SKIP LOCKED
    ) AS part
    UNION ALL
    SELECT wanted.queue, wanted.queue_limit, wanted.turn, part.partition_key, part.head_id,
        part.locked_row
    FROM wanted
    CROSS JOIN LATERAL (
        SELECT part.partition_key, part.head_id, part.ctid AS locked_row
        FROM django_pgqueue_partition AS part
        WHERE wanted.part_floor_id IS NOT NULL
          AND part.running_id IS NULL
          AND part.head_id IS NOT NULL
          AND NOT part.head_blocked
          AND part.wake_at IS NULL
          AND part.queue = wanted.queue
          AND part.head_available_at <= now()
          AND (
              wanted.bucket_mask IS NULL
              OR substr(wanted.bucket_mask, part.partition_bucket + 1, 1) = '1'
          )
          AND part.head_priority < wanted.part_floor_priority
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
      -- The safety net under the partition row: no older job not started yet (pending,
      -- or blocked: it keeps its turn) and no running job in the partition. Scalar
      -- subqueries on purpose, one index probe per head (pgq_job_part_pending,
      -- pgq_job_part_processing); NOT EXISTS could become an anti-join over every
      -- pending partitioned row.
      AND (
          SELECT 1
          FROM django_pgqueue_job AS older
          WHERE older.status IN ('pending', 'blocked')
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
key_rows AS (
    -- pgq_concurrency_claim, from the head or from the worker's key floor (key_floor_*),
    -- as idle_partitions. Locked, the row is the newest version (rechecked against
    -- in_flight < max_in_flight), so two claims never both fill a key's free slots.
    SELECT wanted.queue, wanted.queue_limit, wanted.turn, conc.concurrency_key,
        conc.max_in_flight, conc.in_flight, conc.tokens, conc.tokens_at, conc.rate_limit,
        conc.rate_period, conc.locked_row
    FROM wanted
    CROSS JOIN LATERAL (
        SELECT conc.concurrency_key, conc.max_in_flight, conc.in_flight, conc.tokens_at,
            conc.rate_limit, conc.rate_period, conc.ctid AS locked_row,
            -- The bucket as of now (NULL: no rate limit), of the version locked.
            LEAST(
                conc.rate_limit::double precision,
                conc.tokens + GREATEST(extract(epoch FROM now() - conc.tokens_at), 0)
                    * conc.rate_limit / conc.rate_period
            ) AS tokens
        FROM django_pgqueue_concurrency AS conc
        WHERE wanted.key_floor_id IS NULL
          AND conc.head_id IS NOT NULL
          AND conc.in_flight < conc.max_in_flight
          AND conc.wake_at IS NULL
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
    UNION ALL
    SELECT wanted.queue, wanted.queue_limit, wanted.turn, conc.concurrency_key,
        conc.max_in_flight, conc.in_flight, conc.tokens, conc.tokens_at, conc.rate_limit,
        conc.rate_period, conc.locked_row
    FROM wanted
    CROSS JOIN LATERAL (
        SELECT conc.concurrency_key, conc.max_in_flight, conc.in_flight, conc.tokens_at,
            conc.rate_limit, conc.rate_period, conc.ctid AS locked_row,
            -- The bucket as of now (NULL: no rate limit), of the version locked.
            LEAST(
                conc.rate_limit::double precision,
                conc.tokens + GREATEST(extract(epoch FROM now() - conc.tokens_at), 0)
                    * conc.rate_limit / conc.rate_period
            ) AS tokens
        FROM django_pgqueue_concurrency AS conc
        WHERE wanted.key_floor_id IS NOT NULL
          AND conc.head_id IS NOT NULL
          AND conc.in_flight < conc.max_in_flight
          AND conc.wake_at IS NULL
          AND conc.queue = wanted.queue
          AND conc.head_available_at <= now()
          AND (
              conc.rate_limit IS NULL
              OR conc.tokens + GREATEST(extract(epoch FROM now() - conc.tokens_at), 0)
                  * conc.rate_limit / conc.rate_period >= 1
          )
          AND conc.head_priority = wanted.key_floor_priority
          AND (conc.head_available_at, conc.head_id)
              > (wanted.key_floor_available_at, wanted.key_floor_id)
        ORDER BY conc.head_available_at, conc.head_id
        LIMIT wanted.queue_limit
        FOR UPDATE OF conc SKIP LOCKED
    ) AS conc
    UNION ALL
    SELECT wanted.queue, wanted.queue_limit, wanted.turn, conc.concurrency_key,
        conc.max_in_flight, conc.in_flight, conc.tokens, conc.tokens_at, conc.rate_limit,
        conc.rate_period, conc.locked_row
    FROM wanted
    CROSS JOIN LATERAL (
        SELECT conc.concurrency_key, conc.max_in_flight, conc.in_flight, conc.tokens_at,
            conc.rate_limit, conc.rate_period, conc.ctid AS locked_row,
            -- The bucket as of now (NULL: no rate limit), of the version locked.
            LEAST(
                conc.rate_limit::double precision,
                conc.tokens + GREATEST(extract(epoch FROM now() - conc.tokens_at), 0)
                    * conc.rate_limit / conc.rate_period
            ) AS tokens
        FROM django_pgqueue_concurrency AS conc
        WHERE wanted.key_floor_id IS NOT NULL
          AND conc.head_id IS NOT NULL
          AND conc.in_flight < conc.max_in_flight
          AND conc.wake_at IS NULL
          AND conc.queue = wanted.queue
          AND conc.head_available_at <= now()
          AND (
              conc.rate_limit IS NULL
              OR conc.tokens + GREATEST(extract(epoch FROM now() - conc.tokens_at), 0)
                  * conc.rate_limit / conc.rate_period >= 1
          )
          AND conc.head_priority < wanted.key_floor_priority
        ORDER BY conc.head_priority DESC, conc.head_available_at, conc.head_id
        LIMIT wanted.queue_limit
        FOR UPDATE OF conc SKIP LOCKED
    ) AS conc
),
open_keys AS (
    SELECT key_rows.queue, key_rows.queue_limit, key_rows.turn, key_rows.concurrency_key,
        LEAST(
            key_rows.max_in_flight - key_rows.in_flight,
            COALESCE(floor(key_rows.tokens)::integer, key_rows.max_in_flight)
        ) AS free
    FROM key_rows
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
-- end flow
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
            -- begin flow
            UNION ALL
            SELECT * FROM partition_heads
            UNION ALL
            SELECT * FROM key_jobs
            -- end flow
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
-- begin flow
taken AS (
    SELECT claimed.concurrency_key, count(*) AS claimed, array_agg(claimed.id) AS ids
    FROM claimed
    WHERE claimed.concurrency_key IS NOT NULL
    GROUP BY claimed.concurrency_key
),
next_jobs AS (
    -- Each key's next job besides the jobs just taken, as the refresh function picks
    -- it: the best ready one in claim order, else the one ready soonest
    -- (pgq_job_conc_pending). A stale guess can cost a claim a probe but never a slot:
    -- in_flight is exact, and the jobs taken here refresh the row when they finish.
    SELECT taken.concurrency_key, taken.claimed,
        COALESCE(ready.id, soonest.id) AS id,
        COALESCE(ready.priority, soonest.priority) AS priority,
        COALESCE(ready.available_at, soonest.available_at) AS available_at
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
    ) AS ready ON true
    LEFT JOIN LATERAL (
        SELECT job.id, job.priority, job.available_at
        FROM django_pgqueue_job AS job
        WHERE ready.id IS NULL
          AND job.status = 'pending'
          AND job.concurrency_key = taken.concurrency_key
          AND job.id <> ALL (taken.ids)
        ORDER BY job.available_at, job.id
        LIMIT 1
    ) AS soonest ON true
),
key_updates AS (
    -- Each key's row as this claim leaves it, from the version key_rows locked (the
    -- lock keeps it as it was read): its bucket as of now less one token per start (the
    -- clock never moves back: a claim that began before another's commit must not count
    -- that refill twice), and out of the claim index (wake_at) when out of tokens or its
    -- next job is scheduled.
    SELECT key_rows.locked_row, next_jobs.concurrency_key,
        key_rows.in_flight + next_jobs.claimed AS in_flight,
        key_rows.tokens - next_jobs.claimed AS tokens,
        GREATEST(key_rows.tokens_at, now()) AS tokens_at,
        next_jobs.id AS head_id,
        next_jobs.priority AS head_priority,
        next_jobs.available_at AS head_available_at,
        django_pgqueue_key_wake_at(
            next_jobs.id, next_jobs.available_at, key_rows.rate_limit, key_rows.rate_period,
            key_rows.tokens - next_jobs.claimed, GREATEST(key_rows.tokens_at, now())
        ) AS wake_at
    FROM next_jobs
    JOIN key_rows ON key_rows.concurrency_key = next_jobs.concurrency_key
),
counted AS (
    -- Written by the ctid key_rows locked, as running below (see there).
    UPDATE django_pgqueue_concurrency AS conc
    SET in_flight = key_updates.in_flight, tokens = key_updates.tokens,
        tokens_at = key_updates.tokens_at, head_id = key_updates.head_id,
        head_priority = key_updates.head_priority,
        head_available_at = key_updates.head_available_at, wake_at = key_updates.wake_at,
        refreshed_at = now()
    FROM key_updates
    WHERE conc.ctid = key_updates.locked_row
    RETURNING conc.concurrency_key,
        conc.head_id IS NOT NULL AND conc.in_flight < conc.max_in_flight
            AND conc.wake_at IS NULL AS still_open
),
counted_late AS (
    -- A lock that took a version newer than this statement's snapshot: by key (see
    -- running_late).
    UPDATE django_pgqueue_concurrency AS conc
    SET in_flight = key_updates.in_flight, tokens = key_updates.tokens,
        tokens_at = key_updates.tokens_at, head_id = key_updates.head_id,
        head_priority = key_updates.head_priority,
        head_available_at = key_updates.head_available_at, wake_at = key_updates.wake_at,
        refreshed_at = now()
    FROM key_updates
    WHERE conc.concurrency_key = key_updates.concurrency_key
      -- An anti-join, not "<> ALL (ARRAY(...))", which compares every key with every
      -- key written: the square of a large claim (tests/test_statement_scaling.py).
      AND NOT EXISTS (
          SELECT FROM counted WHERE counted.concurrency_key = key_updates.concurrency_key
      )
    RETURNING conc.concurrency_key,
        conc.head_id IS NOT NULL AND conc.in_flight < conc.max_in_flight
            AND conc.wake_at IS NULL AS still_open
),
running AS (
    -- The partition rows were locked by idle_partitions above, which names the version
    -- it locked: written by that ctid rather than looked up by key again (a lookup by
    -- key visits every version VACUUM has not removed yet, all of them while a long
    -- transaction holds a snapshot).
    UPDATE django_pgqueue_partition AS part
    SET running_id = claimed.id,
        refreshed_at = now()
    FROM claimed
    JOIN idle_partitions ON idle_partitions.partition_key = claimed.partition_key
    WHERE part.ctid = idle_partitions.locked_row
    RETURNING part.partition_key
),
running_late AS (
    -- Unless an update committed after this statement began and before its lock: the
    -- lock then took the newer version, which this statement's snapshot does not see,
    -- so the write by ctid above finds nothing. By key, as every row once was: the
    -- version seen is updated in READ COMMITTED's way, through to the newest (locked
    -- here). Only those rows are looked up.
    UPDATE django_pgqueue_partition AS part
    SET running_id = claimed.id,
        refreshed_at = now()
    FROM claimed
    WHERE part.partition_key = claimed.partition_key
      AND NOT EXISTS (
          SELECT FROM running WHERE running.partition_key = claimed.partition_key
      )
    RETURNING part.partition_key
),
-- end flow
summary AS (
    SELECT
        -- begin flow
        (SELECT count(*) FROM running) + (SELECT count(*) FROM running_late)
            + (SELECT count(*) FROM counted) + (SELECT count(*) FROM counted_late) +
        -- end flow
        0 AS flow_started,
        -- begin flow
        -- A branch that came back full may have left more behind; a candidate the
        -- ranking dropped is still open; a key just taken from may have room left.
        EXISTS (
            SELECT 1 FROM idle_partitions
            GROUP BY idle_partitions.queue, idle_partitions.queue_limit
            HAVING count(*) >= idle_partitions.queue_limit
        )
        OR EXISTS (
            SELECT 1 FROM open_keys
            GROUP BY open_keys.queue, open_keys.queue_limit
            HAVING count(*) >= open_keys.queue_limit
        )
        OR (SELECT count(*) FROM partition_heads)
            > (SELECT count(*) FROM running) + (SELECT count(*) FROM running_late)
        OR EXISTS (SELECT 1 FROM counted WHERE counted.still_open)
        OR EXISTS (SELECT 1 FROM counted_late WHERE counted_late.still_open)
        OR
        -- end flow
        false AS flow_open
)
SELECT claimed.*, summary.flow_started, false AS signalled, false AS flow_open
FROM claimed
CROSS JOIN summary
UNION ALL
SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
    NULL, NULL, NULL, NULL, NULL, NULL, summary.flow_started,
    -- begin flow
    -- More urgent signals than the fold before this claim took?
    -- pgq_partition_signal_urgent, pgq_concurrency_signal_urgent.
    EXISTS (SELECT 1 FROM django_pgqueue_partition_signal AS signal WHERE signal.urgent)
    OR EXISTS (SELECT 1 FROM django_pgqueue_concurrency_signal AS signal WHERE signal.urgent)
    OR
    -- end flow
    false,
    summary.flow_open
FROM summary


-- name: claim_batch_mates
-- Lease more ready jobs of one task to a worker whose handler takes that task's jobs in
-- batches (a task declared with batch_size): plain jobs only (no partition, no
-- concurrency key: those are claimed by claim_batch alone, which keeps their turns and
-- limits), of one queue, in claim order, never from a paused queue. The scan reads at
-- most scan_limit rows of pgq_job_claim in claim order and keeps those of the task, so a
-- deep backlog of other tasks' jobs bounds the work instead of being read to its end;
-- the jobs it skips are the queue's next ones anyway, for the next claim. Rows are
-- re-checked and locked with SKIP LOCKED by primary key, as in claim_batch.
-- With a floor (floor_priority, floor_available_at, floor_id; NULL: the head), the scan
-- starts after it, as claim_batch's floor branches do: the worker passes one while a
-- long-held snapshot makes scans from the head walk every job claimed since.
WITH scanned AS MATERIALIZED (
    SELECT ahead.id, ahead.task_path
    FROM (
        (
            SELECT job.id, job.task_path
            FROM django_pgqueue_job AS job
            WHERE %(floor_id)s::bigint IS NULL
              AND job.status = 'pending'
              AND job.partition_key IS NULL
              AND job.concurrency_key IS NULL
              AND job.queue = %(queue)s
              -- A row comparison, so that only pgq_job_claim can serve it (claim_batch).
              AND (job.available_at, job.id) <= (now(), 9223372036854775807::bigint)
            ORDER BY job.priority DESC, job.available_at, job.id
            LIMIT %(scan_limit)s
        )
        UNION ALL
        (
            -- The rest of the floor's priority, then the lower priorities: claim order,
            -- so the LIMIT below stops the second scan once the first has enough.
            SELECT job.id, job.task_path
            FROM django_pgqueue_job AS job
            WHERE %(floor_id)s::bigint IS NOT NULL
              AND job.status = 'pending'
              AND job.partition_key IS NULL
              AND job.concurrency_key IS NULL
              AND job.queue = %(queue)s
              AND job.priority = %(floor_priority)s::integer
              AND (job.available_at, job.id)
                  > (%(floor_available_at)s::timestamptz, %(floor_id)s::bigint)
              AND (job.available_at, job.id) <= (now(), 9223372036854775807::bigint)
            ORDER BY job.available_at, job.id
            LIMIT %(scan_limit)s
        )
        UNION ALL
        (
            SELECT job.id, job.task_path
            FROM django_pgqueue_job AS job
            WHERE %(floor_id)s::bigint IS NOT NULL
              AND job.status = 'pending'
              AND job.partition_key IS NULL
              AND job.concurrency_key IS NULL
              AND job.queue = %(queue)s
              AND job.priority < %(floor_priority)s::integer
              AND (job.available_at, job.id) <= (now(), 9223372036854775807::bigint)
            ORDER BY job.priority DESC, job.available_at, job.id
            LIMIT %(scan_limit)s
        )
    ) AS ahead
    WHERE NOT EXISTS (
        SELECT 1 FROM django_pgqueue_queue_pause AS paused WHERE paused.queue = %(queue)s
    )
    LIMIT %(scan_limit)s
),
picked AS (
    SELECT job.id
    FROM django_pgqueue_job AS job
    WHERE job.id = ANY (
        ARRAY(SELECT scanned.id FROM scanned WHERE scanned.task_path = %(task_path)s)
    )
      AND job.status = 'pending'
      AND job.partition_key IS NULL
      AND job.concurrency_key IS NULL
      AND COALESCE(job.available_at, now()) <= now()
    ORDER BY job.priority DESC, job.available_at, job.id
    LIMIT %(limit)s
    FOR UPDATE OF job SKIP LOCKED
)
UPDATE django_pgqueue_job AS job
SET status = 'processing',
    attempts = job.attempts + 1,
    lease_generation = job.lease_generation + 1,
    claimed_by = %(worker_id)s,
    claimed_at = now(),
    started_at = COALESCE(job.started_at, now()),
    lease_expires_at = now() + make_interval(secs => %(lease_seconds)s)
WHERE job.id = ANY (ARRAY(SELECT picked.id FROM picked))
RETURNING
    job.id, job.queue, job.task_path, job.args, job.kwargs, job.priority, job.attempts,
    job.max_attempts, job.lease_generation, job.step, job.partition_key,
    job.idempotency_key, job.created_at, job.available_at, job.claimed_at,
    job.lease_expires_at, jsonb_path_query_array(job.errors, '$[*].worker') AS prior_workers,
    job.unknown_task_since, job.traceparent, job.concurrency_key


-- name: fold_signals
-- Bring up to date the partitions and concurrency keys that producers and operators
-- signalled urgently (pgq_partition_signal_urgent, pgq_concurrency_signal_urgent), at
-- most batch_size signals of each, oldest first; returns how many were refreshed. Its
-- own short transaction, sent in the same round trip as the claim: it waits only on
-- other refreshes of the same rows (partitions first, then keys, as every statement
-- takes them).
WITH taken AS (
    DELETE FROM django_pgqueue_partition_signal AS signal
    WHERE signal.id = ANY (ARRAY(
        SELECT pending.id
        FROM django_pgqueue_partition_signal AS pending
        WHERE pending.urgent
        ORDER BY pending.id
        LIMIT %(batch_size)s
        FOR UPDATE SKIP LOCKED
    ))
    RETURNING signal.partition_key, signal.job_id
),
taken_keys AS (
    DELETE FROM django_pgqueue_concurrency_signal AS signal
    WHERE signal.id = ANY (ARRAY(
        SELECT pending.id
        FROM django_pgqueue_concurrency_signal AS pending
        WHERE pending.urgent
        ORDER BY pending.id
        LIMIT %(batch_size)s
        FOR UPDATE SKIP LOCKED
    ))
    RETURNING signal.concurrency_key
),
partitions AS (
    -- Each partition from the job its signal names (migration 0024), paired by one
    -- aggregate.
    SELECT django_pgqueue_refresh_partitions(
        COALESCE(array_agg(taken.partition_key), '{}'),
        COALESCE(array_agg(taken.job_id), '{}')
    ) AS refreshed
    FROM taken
)
SELECT partitions.refreshed + django_pgqueue_refresh_concurrency(
    -- No channel: the producer that signalled woke the queue itself.
    ARRAY(SELECT taken_keys.concurrency_key FROM taken_keys), NULL
) AS refreshed
FROM partitions


-- name: wake_due
-- Put back in the claim indexes the partitions and keys whose wait is over: a next job
-- that was scheduled, a token bucket that refilled (pgq_partition_wake,
-- pgq_concurrency_wake; at most batch_size of each, the earliest first). Returns how
-- many can start now. A statement of its own, sent with the claim: it skips rows locked
-- right now and so never waits (a wait here, holding rows out of key order, could
-- deadlock with a refresh).
WITH woken_partitions AS (
    UPDATE django_pgqueue_partition AS part
    SET wake_at = NULL
    WHERE part.partition_key = ANY (ARRAY(
        SELECT due.partition_key
        FROM django_pgqueue_partition AS due
        WHERE due.wake_at <= now()
        ORDER BY due.wake_at
        LIMIT %(batch_size)s
        FOR UPDATE SKIP LOCKED
    ))
      AND part.wake_at <= now()
    RETURNING part.partition_key
),
woken_keys AS (
    -- The wake time is computed again on the row as it is now: a key that still has to
    -- wait (a rounding error, a bucket another claim emptied) gets its new time.
    UPDATE django_pgqueue_concurrency AS conc
    SET wake_at = django_pgqueue_key_wake_at(
        conc.head_id, conc.head_available_at, conc.rate_limit, conc.rate_period,
        LEAST(
            conc.rate_limit::double precision,
            conc.tokens + GREATEST(extract(epoch FROM now() - conc.tokens_at), 0)
                * conc.rate_limit / conc.rate_period
        ),
        GREATEST(conc.tokens_at, now())
    )
    WHERE conc.concurrency_key = ANY (ARRAY(
        SELECT due.concurrency_key
        FROM django_pgqueue_concurrency AS due
        WHERE due.wake_at <= now()
        ORDER BY due.wake_at
        LIMIT %(batch_size)s
        FOR UPDATE SKIP LOCKED
    ))
      AND conc.wake_at <= now()
    RETURNING conc.wake_at IS NULL AND conc.in_flight < conc.max_in_flight AS startable
)
SELECT (SELECT count(*) FROM woken_partitions)
    + (SELECT count(*) FROM woken_keys WHERE woken_keys.startable) AS woken


-- name: fold_lazy_signals
-- Fold the signals producers left lazily (the key or partition already had a row naming
-- a next job), at most batch_size of each, oldest first (pgq_*_signal_lazy). Sent by
-- each worker's housekeeping thread a few times a second, off the claim path. Under each
-- row's lock, only a partition or key whose row no longer covers the new job (it changed
-- between the producer's look and its commit: for a partition, its row names no next
-- job other than the running one, or one newer than a job signalled; for a key under
-- its limit, its row names no ready job, or one a ready job signalled sorts before in
-- claim order) is refreshed (django_pgqueue_fold_partitions / _concurrency, migrations
-- 0015, 0024 and 0025); a key this makes startable wakes its queue's workers on
-- channel. Returns how many signals were taken and how many rows refreshed.
WITH taken AS (
    DELETE FROM django_pgqueue_partition_signal AS signal
    WHERE signal.id = ANY (ARRAY(
        SELECT pending.id
        FROM django_pgqueue_partition_signal AS pending
        WHERE NOT pending.urgent
        ORDER BY pending.id
        LIMIT %(batch_size)s
        FOR UPDATE SKIP LOCKED
    ))
    RETURNING signal.partition_key, signal.job_id
),
taken_keys AS (
    DELETE FROM django_pgqueue_concurrency_signal AS signal
    WHERE signal.id = ANY (ARRAY(
        SELECT pending.id
        FROM django_pgqueue_concurrency_signal AS pending
        WHERE NOT pending.urgent
        ORDER BY pending.id
        LIMIT %(batch_size)s
        FOR UPDATE SKIP LOCKED
    ))
    RETURNING signal.concurrency_key, signal.job_id
),
partitions AS (
    SELECT django_pgqueue_fold_partitions(
        COALESCE(array_agg(taken.partition_key), '{}'),
        COALESCE(array_agg(taken.job_id), '{}')
    ) AS refreshed
    FROM taken
),
keys AS (
    -- Each key with the job its signal names (migration 0025), paired by one aggregate.
    SELECT COALESCE(array_agg(taken_keys.concurrency_key), '{}') AS keys,
        COALESCE(array_agg(taken_keys.job_id), '{}') AS job_ids
    FROM taken_keys
)
SELECT (SELECT count(*) FROM taken) + (SELECT count(*) FROM taken_keys) AS taken,
    partitions.refreshed + django_pgqueue_fold_concurrency(
        keys.keys, keys.job_ids, %(flow_channel)s
    ) AS refreshed
FROM partitions
CROSS JOIN keys


-- name: complete_if_leased
-- Mark one leased job succeeded and store its result; refresh its partition. Used by
-- atomic tasks, inside the handler's transaction: a job whose cancel was requested
-- while it ran is left alone (no row comes back, the caller rolls the handler's writes
-- back and records the cancel with fail_if_leased).
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
      AND cancel_requested_at IS NULL
    RETURNING id, finished_at, partition_key, concurrency_key
)
SELECT completed.id, completed.finished_at,
    CASE WHEN completed.partition_key IS NOT NULL THEN
        django_pgqueue_refresh_partitions(
            ARRAY[completed.partition_key], ARRAY[completed.id]
        )
    END AS partitions,
    CASE WHEN completed.concurrency_key IS NOT NULL THEN
        django_pgqueue_refresh_concurrency(ARRAY[completed.concurrency_key], %(flow_channel)s)
    END AS keys
FROM completed


-- name: complete_many_if_leased
-- Mark many leased jobs succeeded, each checked against its own lease generation, and
-- refresh their partitions. A job whose cancel was requested while it ran ends
-- cancelled instead, without its result. completions is one JSON document, [[job id,
-- lease generation, result], ...]: cheaper to send than three arrays. Returns the id and
-- new status of each job that was still leased; the others were lost (or already
-- completed: see succeeded_under_leases) and are left untouched.
-- The blocked dependents of every job finished here are locked first, in id order, by
-- django_pgqueue_lock_dependents (only jobs flagged has_dependents are looked up): the
-- settling trigger of each job then finds them locked already, so two batches sharing
-- dependents cannot deadlock.
WITH done AS (
    SELECT (item ->> 0)::bigint AS id, (item ->> 1)::bigint AS lease_generation,
        item -> 2 AS result
    FROM jsonb_array_elements(%(completions)s::jsonb) AS item
),
locked AS (
    -- Only rows still carrying the lease are locked: a row another worker took over
    -- (and its atomic task may hold for minutes) is never waited on.
    SELECT job.id, job.has_dependents, job.cancel_requested_at IS NOT NULL AS cancelling
    FROM django_pgqueue_job AS job
    JOIN done ON done.id = job.id AND done.lease_generation = job.lease_generation
    WHERE job.id = ANY (ARRAY(SELECT done.id FROM done))
      AND job.claimed_by = %(worker_id)s
      AND job.status = 'processing'
    ORDER BY job.id
    FOR UPDATE OF job
),
gone AS (
    -- The job leaves the job table here, for the history (below), in this statement:
    -- a DELETE and an INSERT rather than an UPDATE that the table's trigger would then
    -- move, which writes each row twice more.
    -- By id alone: each row of locked was checked against its lease and is locked by
    -- this statement, so nobody changed it since. One scan of each segment's primary
    -- key for the whole array, not a join with done, which the planner (expecting one
    -- row from locked) ran as a nested loop: a probe of every segment per job, three
    -- times the server's time of the rest of this write with three segments open.
    -- And an index condition whatever the statistics: a segment analyzed while it held
    -- no live row (its dead ones kept by a snapshot) once had its whole primary key
    -- read per job, the join's condition in a filter.
    DELETE FROM django_pgqueue_job AS job
    WHERE job.id = ANY (ARRAY(SELECT locked.id FROM locked))
      AND job.claimed_by = %(worker_id)s
      AND job.status = 'processing'
      -- An InitPlan, run before the first row is deleted: the dependents' locks. Only
      -- called when a job has dependents: the SQL function is planned at every call
      -- (0.6 ms, more than the rest of a 10-job completion).
      AND (
          SELECT CASE WHEN cardinality(dependents.finished) > 0 THEN
              django_pgqueue_lock_dependents(
                  dependents.finished,
                  ARRAY(
                      SELECT locked.id FROM locked
                      WHERE locked.has_dependents AND locked.cancelling
                  )
              )
          ELSE 0 END
          FROM (
              SELECT ARRAY(SELECT locked.id FROM locked WHERE locked.has_dependents) AS finished
          ) AS dependents
      ) >= 0
    RETURNING job.*,
        CASE WHEN job.cancel_requested_at IS NULL THEN 'succeeded' ELSE 'cancelled' END
            AS final_status
),
completed AS (
    -- Its class's partition of today (django_pgqueue_history_class_of, migration 0020);
    -- the settling trigger of the history runs for jobs with dependents or waiters.
    INSERT INTO django_pgqueue_job_history (
        id, queue, task_path, args, kwargs, priority, status, attempts,
        max_attempts, lease_generation, claimed_by, claimed_at,
        lease_expires_at, available_at, created_at, started_at, finished_at,
        last_error, last_error_class, errors, result, idempotency_key,
        partition_key, partition_bucket, step, unknown_task_since, traceparent,
        awaited, has_dependents, coalesce_key, concurrency_key,
        concurrency_limit, rate_limit, rate_period, cancel_requested_at, snoozes,
        history_class
    )
    SELECT
        gone.id, gone.queue, gone.task_path, gone.args, gone.kwargs,
        gone.priority, gone.final_status, gone.attempts, gone.max_attempts,
        gone.lease_generation, gone.claimed_by, gone.claimed_at, NULL,
        gone.available_at, gone.created_at, gone.started_at, now(),
        gone.last_error, gone.last_error_class, gone.errors, CASE WHEN
        gone.cancel_requested_at IS NULL THEN done.result END,
        gone.idempotency_key, gone.partition_key, gone.partition_bucket,
        gone.step, gone.unknown_task_since, gone.traceparent, gone.awaited,
        gone.has_dependents, gone.coalesce_key, gone.concurrency_key,
        gone.concurrency_limit, gone.rate_limit, gone.rate_period,
        gone.cancel_requested_at, gone.snoozes,
        django_pgqueue_history_class_of(gone.final_status, gone.queue)
    FROM gone
    JOIN done ON done.id = gone.id
    RETURNING id, status, partition_key, concurrency_key
),
keys AS (
    -- The keys they hold stay taken (a job enqueued before 0020 held its key in the
    -- job table's unique index only).
    INSERT INTO django_pgqueue_job_key (idempotency_key)
    SELECT gone.idempotency_key FROM gone WHERE gone.idempotency_key IS NOT NULL
    ON CONFLICT (idempotency_key) DO NOTHING
),
refreshed AS (
    -- Called only when a job had a partition, like the function below.
    SELECT CASE WHEN cardinality(keys.keys) > 0 THEN
        django_pgqueue_refresh_partitions(keys.keys, keys.finished)
    ELSE 0 END AS partitions
    FROM (
        -- Each with the job that left processing here (migration 0024), paired by one
        -- aggregate.
        SELECT COALESCE(array_agg(completed.partition_key), '{}') AS keys,
            COALESCE(array_agg(completed.id), '{}') AS finished
        FROM completed
        WHERE completed.partition_key IS NOT NULL
    ) AS keys
),
recounted AS (
    -- After the partitions (lock order); skipped when no job had a key.
    SELECT django_pgqueue_refresh_concurrency(keys.keys, %(flow_channel)s) AS keys
    FROM refreshed
    CROSS JOIN (
        SELECT ARRAY(
            SELECT completed.concurrency_key FROM completed
            WHERE completed.concurrency_key IS NOT NULL
        ) AS keys
    ) AS keys
    WHERE cardinality(keys.keys) > 0
)
SELECT completed.id, completed.status
FROM completed
CROSS JOIN refreshed
LEFT JOIN recounted ON true


-- name: succeeded_under_leases
-- Return which of the given leases' jobs already finished under that very lease (id and
-- status: succeeded, or cancelled if its cancel was requested while it ran): a
-- completion sent again after its answer was lost with the connection. No other attempt
-- or worker can hold the lease, so such a job finished by that first write. Sent only
-- when complete_many_if_leased came back short, so a drain never pays for it. leases is
-- one JSON document, [[job id, lease generation], ...]. Uses the primary key.
WITH asked AS (
    SELECT (item ->> 0)::bigint AS id, (item ->> 1)::bigint AS lease_generation
    FROM jsonb_array_elements(%(leases)s::jsonb) AS item
)
SELECT job.id, job.status
FROM django_pgqueue_job_all AS job
JOIN asked ON asked.id = job.id AND asked.lease_generation = job.lease_generation
WHERE job.id = ANY (ARRAY(SELECT asked.id FROM asked))
  AND job.claimed_by = %(worker_id)s
  AND (
      job.status = 'succeeded'
      OR (job.status = 'cancelled' AND job.cancel_requested_at IS NOT NULL)
  )


-- name: fail_if_leased
-- Record a failed attempt: retry after a backoff, or dead-letter the job when the error
-- is permanent or the attempts are used up; a job whose cancel was requested while it
-- ran ends cancelled. Refresh its partition (a retried job stays its partition's next
-- job: it keeps its place). A job going back to pending lets go of its coalesce key: a
-- newer job may hold it by now, and the one that ran keeps its own turn. The backoff is
-- computed here, on the database clock:
-- min(retry_max, retry_base * 2^(attempts - 1)) * (1 + retry_jitter * u), u in [-1, 1).
-- Every CASE reads the row itself, not a subquery: if a cancel commits while this
-- statement waits for the row, the row is read again as it is then.
WITH failed AS (
    UPDATE django_pgqueue_job AS job
    SET status = CASE
            WHEN job.cancel_requested_at IS NOT NULL THEN 'cancelled'
            WHEN %(permanent)s::boolean OR job.attempts >= job.max_attempts THEN 'dead_letter'
            ELSE 'pending'
        END,
        available_at = CASE
            WHEN job.cancel_requested_at IS NOT NULL
                OR %(permanent)s::boolean OR job.attempts >= job.max_attempts
                THEN job.available_at
            ELSE now() + make_interval(secs =>
                LEAST(%(retry_max)s, %(retry_base)s * power(2.0, GREATEST(job.attempts - 1, 0)))
                * (1 + %(retry_jitter)s * (2 * random() - 1)))
        END,
        finished_at = CASE
            WHEN job.cancel_requested_at IS NOT NULL
                OR %(permanent)s::boolean OR job.attempts >= job.max_attempts
                THEN now()
        END,
        claimed_by = CASE
            WHEN job.cancel_requested_at IS NOT NULL
                OR %(permanent)s::boolean OR job.attempts >= job.max_attempts
                THEN job.claimed_by
        END,
        coalesce_key = CASE
            WHEN job.cancel_requested_at IS NOT NULL
                OR %(permanent)s::boolean OR job.attempts >= job.max_attempts
                THEN job.coalesce_key
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
    CASE WHEN failed.partition_key IS NOT NULL THEN
        django_pgqueue_refresh_partitions(ARRAY[failed.partition_key], ARRAY[failed.id])
    END AS partitions,
    CASE WHEN failed.concurrency_key IS NOT NULL THEN
        django_pgqueue_refresh_concurrency(ARRAY[failed.concurrency_key], %(flow_channel)s)
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
-- lease (id, generation) with held = true (extended) or false (the row is locked right
-- now, by an atomic task's open transaction say, but still carries this lease: try
-- again next beat), and whether an operator asked to cancel the job (the worker stops
-- its handler; a lost notice is made up for here). A lease that is in neither list was
-- lost. Rows are locked only if they still carry the lease, so a lease that moved to
-- another worker is never locked here; and SKIP LOCKED means the heartbeat holds no
-- lock while it waits for another.
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
    -- By id alone, locked rows checked against their leases (see complete_many_if_leased).
    WHERE job.id = ANY (ARRAY(SELECT locked.id FROM locked))
      AND job.claimed_by = %(worker_id)s
      AND job.status = 'processing'
    RETURNING job.id, job.lease_generation, job.cancel_requested_at IS NOT NULL AS cancelling
)
SELECT extended.id, extended.lease_generation, true AS held, extended.cancelling
FROM extended
UNION ALL
-- Still this worker's lease as of this statement's snapshot, but locked by someone else.
SELECT job.id, job.lease_generation, false AS held,
    job.cancel_requested_at IS NOT NULL AS cancelling
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
-- A job whose cancel was requested ends cancelled instead. A job going back to pending
-- lets go of its coalesce key (see fail_if_leased).
WITH released AS (
    UPDATE django_pgqueue_job
    SET status = CASE WHEN cancel_requested_at IS NULL THEN 'pending' ELSE 'cancelled' END,
        attempts = attempts - 1,
        lease_generation = lease_generation + 1,
        claimed_by = NULL,
        lease_expires_at = NULL,
        finished_at = CASE WHEN cancel_requested_at IS NOT NULL THEN now() END,
        coalesce_key = CASE WHEN cancel_requested_at IS NOT NULL THEN coalesce_key END,
        available_at = CASE
            WHEN cancel_requested_at IS NULL THEN now() + make_interval(secs => %(delay_seconds)s)
            ELSE available_at
        END,
        last_error = COALESCE(%(reason)s, last_error),
        last_error_class = COALESCE(%(reason_class)s, last_error_class),
        unknown_task_since = COALESCE(unknown_task_since, %(unknown_since)s::timestamptz)
    WHERE id = %(job_id)s
      AND lease_generation = %(lease_generation)s
      AND claimed_by = %(worker_id)s
      AND status = 'processing'
    RETURNING id, queue, status, available_at, partition_key, concurrency_key
),
woken AS (
    SELECT pg_notify(%(channel)s, released.queue)
    FROM released
    WHERE released.status = 'pending' AND released.available_at <= now()
)
SELECT released.id, released.available_at, (SELECT count(*) FROM woken) AS notified,
    CASE WHEN released.partition_key IS NOT NULL THEN
        django_pgqueue_refresh_partitions(ARRAY[released.partition_key], ARRAY[released.id])
    END AS partitions,
    CASE WHEN released.concurrency_key IS NOT NULL THEN
        django_pgqueue_refresh_concurrency(ARRAY[released.concurrency_key], %(flow_channel)s)
    END AS keys,
    released.status
FROM released


-- name: snooze_if_leased
-- The handler asked to run again after delay_seconds without using up an attempt (it
-- raised or returned Snooze): like release_if_leased, and the job's snoozes count grows
-- and its history gains a "snoozed" entry (the worker that ran it, when, for how long).
-- A job that has already snoozed max_snoozes times is dead-lettered instead
-- (SnoozeLimitReached: the attempt counts), so it cannot snooze forever; a job whose
-- cancel was requested while it ran ends cancelled. A snoozed job keeps its partition's
-- turn (it is still the oldest not finished) and frees its concurrency slot while it
-- waits. Every CASE reads the row itself (see fail_if_leased).
WITH snoozed AS (
    UPDATE django_pgqueue_job AS job
    SET status = CASE
            WHEN job.cancel_requested_at IS NOT NULL THEN 'cancelled'
            WHEN job.snoozes >= %(max_snoozes)s THEN 'dead_letter'
            ELSE 'pending'
        END,
        attempts = CASE
            WHEN job.cancel_requested_at IS NULL AND job.snoozes < %(max_snoozes)s
                THEN job.attempts - 1
            ELSE job.attempts
        END,
        snoozes = CASE
            WHEN job.cancel_requested_at IS NULL AND job.snoozes < %(max_snoozes)s
                THEN job.snoozes + 1
            ELSE job.snoozes
        END,
        -- Bumped when it goes back to pending (a late write of this attempt is fenced
        -- off); a job it ends keeps the lease it ended under, as fail_if_leased does.
        lease_generation = CASE
            WHEN job.cancel_requested_at IS NULL AND job.snoozes < %(max_snoozes)s
                THEN job.lease_generation + 1
            ELSE job.lease_generation
        END,
        claimed_by = CASE
            WHEN job.cancel_requested_at IS NOT NULL OR job.snoozes >= %(max_snoozes)s
                THEN job.claimed_by
        END,
        lease_expires_at = NULL,
        unknown_task_since = NULL,
        finished_at = CASE
            WHEN job.cancel_requested_at IS NOT NULL OR job.snoozes >= %(max_snoozes)s
                THEN now()
        END,
        coalesce_key = CASE
            WHEN job.cancel_requested_at IS NOT NULL OR job.snoozes >= %(max_snoozes)s
                THEN job.coalesce_key
        END,
        available_at = CASE
            WHEN job.cancel_requested_at IS NULL AND job.snoozes < %(max_snoozes)s
                THEN now() + make_interval(secs => %(delay_seconds)s)
            ELSE job.available_at
        END,
        last_error = CASE
            WHEN job.cancel_requested_at IS NULL AND job.snoozes >= %(max_snoozes)s
                THEN format('asked to snooze again after %%s snoozes (max_snoozes=%%s)',
                    job.snoozes, %(max_snoozes)s)
            ELSE job.last_error
        END,
        last_error_class = CASE
            WHEN job.cancel_requested_at IS NULL AND job.snoozes >= %(max_snoozes)s
                THEN %(limit_class)s::text
            ELSE job.last_error_class
        END,
        errors = job.errors || CASE
            WHEN job.cancel_requested_at IS NULL AND job.snoozes >= %(max_snoozes)s
            THEN jsonb_build_array(jsonb_build_object(
                'attempt', job.attempts,
                'exception_class', %(limit_class)s::text,
                'message', format('asked to snooze again after %%s snoozes (max_snoozes=%%s)',
                    job.snoozes, %(max_snoozes)s),
                'traceback', '',
                'worker', %(worker_id)s::text,
                'at', now()
            ))
            ELSE jsonb_build_array(jsonb_build_object(
                'attempt', job.attempts,
                'snoozed', %(delay_seconds)s::double precision,
                'worker', %(worker_id)s::text,
                'at', now()
            ))
        END
    WHERE job.id = %(job_id)s
      AND job.lease_generation = %(lease_generation)s
      AND job.claimed_by = %(worker_id)s::text
      AND job.status = 'processing'
    RETURNING job.id, job.queue, job.status, job.available_at, job.snoozes,
        job.partition_key, job.concurrency_key
),
woken AS (
    SELECT pg_notify(%(channel)s, snoozed.queue)
    FROM snoozed
    WHERE snoozed.status = 'pending' AND snoozed.available_at <= now()
)
SELECT snoozed.id, snoozed.status, snoozed.available_at, snoozed.snoozes,
    (SELECT count(*) FROM woken) AS notified,
    CASE WHEN snoozed.partition_key IS NOT NULL THEN
        django_pgqueue_refresh_partitions(ARRAY[snoozed.partition_key], ARRAY[snoozed.id])
    END AS partitions,
    CASE WHEN snoozed.concurrency_key IS NOT NULL THEN
        django_pgqueue_refresh_concurrency(ARRAY[snoozed.concurrency_key], %(flow_channel)s)
    END AS keys
FROM snoozed


-- name: release_many_if_leased
-- Give many leased jobs back at once (worker shutdown, adaptive prefetch), each fenced by
-- its generation. A job whose cancel was requested ends cancelled instead (its
-- dependents locked first, as complete_many_if_leased does). A job going back to pending
-- lets go of its coalesce key (see fail_if_leased).
WITH held AS (
    SELECT (item ->> 0)::bigint AS id, (item ->> 1)::bigint AS lease_generation
    FROM jsonb_array_elements(%(leases)s::jsonb) AS item
),
locked AS (
    SELECT job.id, job.has_dependents AND job.cancel_requested_at IS NOT NULL AS settles
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
    SET status = CASE WHEN job.cancel_requested_at IS NULL THEN 'pending' ELSE 'cancelled' END,
        attempts = job.attempts - 1,
        lease_generation = job.lease_generation + 1,
        claimed_by = NULL,
        lease_expires_at = NULL,
        finished_at = CASE WHEN job.cancel_requested_at IS NOT NULL THEN now() END,
        coalesce_key = CASE WHEN job.cancel_requested_at IS NOT NULL THEN job.coalesce_key END,
        available_at = CASE
            WHEN job.cancel_requested_at IS NULL THEN now() ELSE job.available_at
        END,
        last_error = COALESCE(%(reason)s, job.last_error)
    -- By id alone, locked rows checked against their leases (see complete_many_if_leased).
    WHERE job.id = ANY (ARRAY(SELECT locked.id FROM locked))
      AND job.claimed_by = %(worker_id)s
      AND job.status = 'processing'
      AND (
          SELECT CASE WHEN cardinality(settling.ids) > 0 THEN
              django_pgqueue_lock_dependents('{}', settling.ids)
          ELSE 0 END
          FROM (SELECT ARRAY(SELECT locked.id FROM locked WHERE locked.settles) AS ids) AS settling
      ) >= 0
    RETURNING job.id, job.queue, job.status, job.partition_key, job.concurrency_key
),
woken AS (
    SELECT pg_notify(%(channel)s, ready.queue)
    FROM (
        SELECT DISTINCT released.queue FROM released WHERE released.status = 'pending'
    ) AS ready
),
refreshed AS (
    -- Called only when a job had a partition, like the function below.
    SELECT CASE WHEN cardinality(keys.keys) > 0 THEN
        django_pgqueue_refresh_partitions(keys.keys, keys.finished)
    ELSE 0 END AS partitions
    FROM (
        -- Each with the job that left processing here (migration 0024), paired by one
        -- aggregate.
        SELECT COALESCE(array_agg(released.partition_key), '{}') AS keys,
            COALESCE(array_agg(released.id), '{}') AS finished
        FROM released
        WHERE released.partition_key IS NOT NULL
    ) AS keys
),
recounted AS (
    SELECT django_pgqueue_refresh_concurrency(keys.keys, %(flow_channel)s) AS keys
    FROM refreshed
    CROSS JOIN (
        SELECT ARRAY(
            SELECT released.concurrency_key FROM released
            WHERE released.concurrency_key IS NOT NULL
        ) AS keys
    ) AS keys
    WHERE cardinality(keys.keys) > 0
)
SELECT released.id, (SELECT count(*) FROM woken) AS notified, released.status
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
