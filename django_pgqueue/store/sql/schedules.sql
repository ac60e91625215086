-- Periodic schedules: syncing them from code, firing them, and the operator's actions.
--
-- A row is the code's (source 'code': written only by the workers' sync) or the admin's
-- (source 'admin': created, edited and deleted in the admin at run time). Neither writer
-- touches the other's rows: every sync statement and every admin edit says which source
-- it writes. Firing, pausing, resuming and "run now" treat both alike.
--
-- Exactly one job per fire time, however many workers fire: fire_schedule advances the
-- schedule row only if next_fire_at still holds the value the worker planned from (a
-- second worker's UPDATE waits for the first one's row lock, re-reads the row, and no
-- longer matches), and inserts the jobs in the same statement. Each job's idempotency
-- key names the schedule and fire time (pgqueue:schedule:<name>:<UTC time>), so even a
-- schedule re-created after removal cannot fire the same time twice. Fire times and keys
-- are computed by the caller from the database clock (cron lives in Python, cronsim).


-- name: lock_schedule_sync
-- Serialise the schedule sync of workers starting together (transaction-level lock:
-- released at COMMIT, safe behind PgBouncer in transaction mode).
SELECT pg_advisory_xact_lock(%(lock_key)s)


-- name: limit_schedule_sync_wait
-- Bound how long the rest of this transaction (the sync) waits for any lock: a session
-- that holds the sync lock and never commits must not keep a starting worker from its
-- jobs. And as long, how long it may sit idle: a worker paused in the middle of its
-- sync (SIGSTOP, a frozen VM) keeps its connection open, and would hold the sync lock
-- and the schedule rows it wrote, which every worker's firing of those schedules waits
-- for; the server ends its session instead. SET LOCAL: ends with the transaction, safe
-- behind PgBouncer.
SELECT set_config('lock_timeout', %(lock_timeout)s, true),
    set_config('idle_in_transaction_session_timeout', %(lock_timeout)s, true)


-- name: schedule_clock
-- The database clock (every schedule computation counts from it, never the host's).
SELECT statement_timestamp() AS database_now


-- name: upsert_schedule
-- Add a declared schedule, or update it if its declaration changed. A changed
-- expression or timezone (timing) moves next_fire_at to the caller's value (the first
-- fire after now); anything else keeps it, so an unchanged schedule that was due while
-- the workers were down still gets its downtime policy. paused_at and last_fire_at are
-- the operator's and the history's: never overwritten. An admin schedule of the same
-- name is never overwritten either (the WHERE's source test: the caller reports the name
-- as a conflict). Returns a row only when something was added or changed; added is true
-- for a new row (xmax is 0 for a fresh insert).
INSERT INTO django_pgqueue_schedule AS schedule (
    name, task_path, queue, priority, max_attempts, args, kwargs, expression, description,
    timezone, downtime, catch_up, concurrency_key, concurrency_limit, rate_limit, rate_period,
    timing, next_fire_at, last_fire_at, paused_at, created_at, updated_at, source
)
VALUES (
    %(schedule_name)s, %(task_path)s, %(queue)s, %(priority)s, %(max_attempts)s, %(args)s::jsonb,
    %(kwargs)s::jsonb, %(expression)s, %(description)s, %(timezone)s, %(downtime)s,
    %(catch_up)s, %(concurrency_key)s, %(concurrency_limit)s, %(rate_limit)s, %(rate_period)s,
    %(timing)s, %(next_fire_at)s, NULL, NULL, now(), now(), 'code'
)
ON CONFLICT (name) DO UPDATE SET
    task_path = EXCLUDED.task_path,
    queue = EXCLUDED.queue,
    priority = EXCLUDED.priority,
    max_attempts = EXCLUDED.max_attempts,
    args = EXCLUDED.args,
    kwargs = EXCLUDED.kwargs,
    expression = EXCLUDED.expression,
    description = EXCLUDED.description,
    timezone = EXCLUDED.timezone,
    downtime = EXCLUDED.downtime,
    catch_up = EXCLUDED.catch_up,
    concurrency_key = EXCLUDED.concurrency_key,
    concurrency_limit = EXCLUDED.concurrency_limit,
    rate_limit = EXCLUDED.rate_limit,
    rate_period = EXCLUDED.rate_period,
    timing = EXCLUDED.timing,
    next_fire_at = CASE
        WHEN schedule.timing = EXCLUDED.timing THEN schedule.next_fire_at
        ELSE EXCLUDED.next_fire_at
    END,
    updated_at = now()
WHERE schedule.source = 'code' AND (
    schedule.task_path, schedule.queue, schedule.priority, schedule.max_attempts,
    schedule.args, schedule.kwargs, schedule.expression, schedule.description,
    schedule.timezone, schedule.downtime, schedule.catch_up, schedule.concurrency_key,
    schedule.concurrency_limit, schedule.rate_limit, schedule.rate_period, schedule.timing
) IS DISTINCT FROM (
    EXCLUDED.task_path, EXCLUDED.queue, EXCLUDED.priority, EXCLUDED.max_attempts,
    EXCLUDED.args, EXCLUDED.kwargs, EXCLUDED.expression, EXCLUDED.description,
    EXCLUDED.timezone, EXCLUDED.downtime, EXCLUDED.catch_up, EXCLUDED.concurrency_key,
    EXCLUDED.concurrency_limit, EXCLUDED.rate_limit, EXCLUDED.rate_period, EXCLUDED.timing
)
RETURNING schedule.name, (schedule.xmax = 0) AS added


-- name: delete_undeclared_schedules
-- Remove the code's schedules no longer declared (their jobs stay); the admin's are not
-- the code's to remove. Sequential scan of a table of a few rows.
DELETE FROM django_pgqueue_schedule AS schedule
WHERE NOT (schedule.name = ANY (%(names)s::text[]))
  AND schedule.source = 'code'
RETURNING schedule.name


-- name: admin_schedules_named
-- Which of the names the code declares belong to admin schedules: the sync skipped them
-- (upsert_schedule never overwrites one) and reports them. Primary key lookups.
SELECT schedule.name
FROM django_pgqueue_schedule AS schedule
WHERE schedule.name = ANY (%(names)s::text[])
  AND schedule.source = 'admin'


-- name: add_admin_schedule
-- Create a schedule from the admin, first fire at the caller's next_fire_at (the first
-- after the database clock). A name already taken, by the code or the admin, inserts
-- nothing and returns no row.
INSERT INTO django_pgqueue_schedule AS schedule (
    name, task_path, queue, priority, max_attempts, args, kwargs, expression, description,
    timezone, downtime, catch_up, concurrency_key, concurrency_limit, rate_limit, rate_period,
    timing, next_fire_at, last_fire_at, paused_at, created_at, updated_at, source
)
VALUES (
    %(schedule_name)s, %(task_path)s, %(queue)s, %(priority)s, %(max_attempts)s, %(args)s::jsonb,
    %(kwargs)s::jsonb, %(expression)s, %(description)s, %(timezone)s, %(downtime)s,
    %(catch_up)s, %(concurrency_key)s, %(concurrency_limit)s, %(rate_limit)s, %(rate_period)s,
    %(timing)s, %(next_fire_at)s, NULL, NULL, now(), now(), 'admin'
)
ON CONFLICT (name) DO NOTHING
RETURNING schedule.name


-- name: change_admin_schedule
-- Edit an admin schedule; never a code one (the source test). As for a sync, a changed
-- expression or timezone (timing) moves next_fire_at to the caller's value, and any other
-- edit keeps it. A worker that read the old timing and fires now matches nothing
-- (fire_schedule fences on next_fire_at and timing); one that fires with the same timing
-- inserts the edited arguments and queue (its UPDATE returns the row as it is now).
-- paused_at and last_fire_at stay. Primary key lookup.
UPDATE django_pgqueue_schedule AS schedule
SET task_path = %(task_path)s,
    queue = %(queue)s,
    priority = %(priority)s,
    max_attempts = %(max_attempts)s,
    args = %(args)s::jsonb,
    kwargs = %(kwargs)s::jsonb,
    expression = %(expression)s,
    description = %(description)s,
    timezone = %(timezone)s,
    downtime = %(downtime)s,
    catch_up = %(catch_up)s,
    concurrency_key = %(concurrency_key)s,
    concurrency_limit = %(concurrency_limit)s,
    rate_limit = %(rate_limit)s,
    rate_period = %(rate_period)s,
    next_fire_at = CASE
        WHEN schedule.timing = %(timing)s THEN schedule.next_fire_at
        ELSE %(next_fire_at)s
    END,
    timing = %(timing)s,
    updated_at = now()
WHERE schedule.name = %(schedule_name)s
  AND schedule.source = 'admin'
RETURNING schedule.name


-- name: delete_admin_schedules
-- Delete admin schedules (never a code one; their jobs stay). Migration 0018's trigger
-- skips the delete of an admin row unless the transaction set
-- django_pgqueue.delete_admin_schedule to on: the MATERIALIZED CTE sets it (locally, so
-- it ends with this statement's transaction) and the join makes it run before any row
-- reaches the DELETE and its trigger. Primary key lookups.
WITH allowed AS MATERIALIZED (
    SELECT set_config('django_pgqueue.delete_admin_schedule', 'on', true) AS setting
)
DELETE FROM django_pgqueue_schedule AS schedule
USING allowed
WHERE schedule.name = ANY (%(names)s::text[])
  AND schedule.source = 'admin'
  AND allowed.setting = 'on'
RETURNING schedule.name


-- name: due_schedules
-- The active schedules in fire order, the earliest first, with the database clock: the
-- caller fires those due and sleeps until the next one. Uses pgq_schedule_due.
SELECT schedule.name, schedule.expression, schedule.timezone, schedule.downtime,
    schedule.catch_up, schedule.timing, schedule.next_fire_at,
    statement_timestamp() AS database_now
FROM django_pgqueue_schedule AS schedule
WHERE schedule.paused_at IS NULL
ORDER BY schedule.next_fire_at
LIMIT %(limit)s


-- name: fire_schedule
-- Advance one schedule from the next_fire_at the caller planned from (the fence) and
-- insert a job per planned fire time, in one statement. A worker that lost the race
-- (the row moved on, was paused, or its timing changed) inserts nothing. A fire time
-- that already has its job keeps it: its key is taken (the trigger
-- django_pgqueue_job_claim_key skips the row; see enqueue_idempotent). The jobs
-- carry the schedule's flow limits and, like every enqueue of a limited job, leave a
-- concurrency signal so the claim folds their key in.
WITH advanced AS (
    UPDATE django_pgqueue_schedule AS schedule
    SET next_fire_at = %(next_fire_at)s,
        last_fire_at = COALESCE(%(last_fire_at)s::timestamptz, schedule.last_fire_at)
    WHERE schedule.name = %(schedule_name)s
      AND schedule.next_fire_at = %(expected_next_fire_at)s
      AND schedule.timing = %(timing)s
      AND schedule.paused_at IS NULL
    RETURNING schedule.queue, schedule.task_path, schedule.args, schedule.kwargs,
        schedule.priority, schedule.max_attempts, schedule.concurrency_key,
        schedule.concurrency_limit, schedule.rate_limit, schedule.rate_period
),
inserted AS (
    INSERT INTO django_pgqueue_job (
        queue, task_path, args, kwargs, priority, status, attempts, max_attempts,
        lease_generation, available_at, created_at, errors, idempotency_key,
        partition_key, partition_bucket, concurrency_key, concurrency_limit, rate_limit,
        rate_period
    )
    SELECT advanced.queue, advanced.task_path, advanced.args, advanced.kwargs,
        advanced.priority, 'pending', 0, advanced.max_attempts, 0, now(), now(),
        '[]'::jsonb, fire.key, NULL, NULL, advanced.concurrency_key,
        advanced.concurrency_limit, advanced.rate_limit, advanced.rate_period
    FROM advanced
    CROSS JOIN unnest(%(keys)s::text[]) WITH ORDINALITY AS fire (key, position)
    ORDER BY fire.position
    RETURNING id, queue, concurrency_key
),
signalled AS (
    INSERT INTO django_pgqueue_concurrency_signal (concurrency_key)
    SELECT DISTINCT inserted.concurrency_key FROM inserted
    WHERE inserted.concurrency_key IS NOT NULL
    RETURNING concurrency_key
),
woken AS (
    SELECT pg_notify(%(channel)s, ready.queue)
    FROM (SELECT DISTINCT inserted.queue FROM inserted) AS ready
),
flow_woken AS (
    -- Limited jobs' keys are signalled: the workers claim with the keys next.
    SELECT pg_notify(%(flow_channel)s, ready.queue)
    FROM (
        SELECT DISTINCT inserted.queue FROM inserted WHERE inserted.concurrency_key IS NOT NULL
    ) AS ready
)
SELECT (SELECT count(*) FROM advanced) AS advanced,
    (SELECT count(*) FROM inserted) AS inserted,
    (SELECT count(*) FROM woken) + (SELECT count(*) FROM flow_woken) AS notified,
    (SELECT count(*) FROM signalled) AS signalled


-- name: pause_schedules
-- Pause active schedules (already paused ones are left as they are and not returned).
-- Primary key lookups.
UPDATE django_pgqueue_schedule AS schedule
SET paused_at = now(), updated_at = now()
WHERE schedule.name = ANY (%(names)s::text[])
  AND schedule.paused_at IS NULL
RETURNING schedule.name


-- name: paused_schedules
-- The timing of the paused schedules among names, to plan their next fire on resume.
-- Primary key lookups.
SELECT schedule.name, schedule.expression, schedule.timezone, schedule.timing,
    statement_timestamp() AS database_now
FROM django_pgqueue_schedule AS schedule
WHERE schedule.name = ANY (%(names)s::text[])
  AND schedule.paused_at IS NOT NULL


-- name: resume_schedule
-- Resume one paused schedule from the caller's next fire time (the first after now:
-- fires missed while paused are not owed). Fenced on still being paused with the timing
-- the caller planned from. Primary key lookup.
UPDATE django_pgqueue_schedule AS schedule
SET paused_at = NULL, next_fire_at = %(next_fire_at)s, updated_at = now()
WHERE schedule.name = %(schedule_name)s
  AND schedule.paused_at IS NOT NULL
  AND schedule.timing = %(timing)s
RETURNING schedule.name


-- name: run_schedule_now
-- Insert one job of each named schedule now, outside its timetable; next_fire_at does
-- not move. The key (pgqueue:schedule:<name>:run-now:<time the operator confirmed>)
-- makes a resubmitted confirmation a no-op (the trigger django_pgqueue_job_claim_key
-- skips a row whose key is taken).
-- The jobs carry the schedule's flow limits, as fired ones do.
WITH inserted AS (
    INSERT INTO django_pgqueue_job (
        queue, task_path, args, kwargs, priority, status, attempts, max_attempts,
        lease_generation, available_at, created_at, errors, idempotency_key,
        partition_key, partition_bucket, concurrency_key, concurrency_limit, rate_limit,
        rate_period
    )
    SELECT schedule.queue, schedule.task_path, schedule.args, schedule.kwargs,
        schedule.priority, 'pending', 0, schedule.max_attempts, 0, now(), now(),
        '[]'::jsonb, wanted.key, NULL, NULL, schedule.concurrency_key,
        schedule.concurrency_limit, schedule.rate_limit, schedule.rate_period
    FROM unnest(%(names)s::text[], %(keys)s::text[]) AS wanted (name, key)
    JOIN django_pgqueue_schedule AS schedule ON schedule.name = wanted.name
    RETURNING id, queue, idempotency_key, concurrency_key
),
signalled AS (
    INSERT INTO django_pgqueue_concurrency_signal (concurrency_key)
    SELECT DISTINCT inserted.concurrency_key FROM inserted
    WHERE inserted.concurrency_key IS NOT NULL
),
woken AS (
    SELECT pg_notify(%(channel)s, ready.queue)
    FROM (SELECT DISTINCT inserted.queue FROM inserted) AS ready
),
flow_woken AS (
    SELECT pg_notify(%(flow_channel)s, ready.queue)
    FROM (
        SELECT DISTINCT inserted.queue FROM inserted WHERE inserted.concurrency_key IS NOT NULL
    ) AS ready
)
SELECT inserted.id, inserted.idempotency_key,
    (SELECT count(*) FROM woken) + (SELECT count(*) FROM flow_woken) AS notified
FROM inserted


-- name: jobs_by_keys
-- The id and status of the jobs holding the given idempotency keys (the admin's "last
-- fire" column). Uses pgq_job_idempotency_key.
SELECT job.idempotency_key, job.id, job.status
FROM django_pgqueue_job_all AS job
WHERE job.idempotency_key = ANY (%(keys)s::text[])
