-- pgbench script: the raw SQL ceiling of draining the job table.
--
-- Each transaction claims 100 ready jobs with FOR UPDATE SKIP LOCKED and completes them
-- with one UPDATE: what a queue could do with no client work at all. Jobs drained per
-- second = transactions per second x 100. See bench/README.md.
BEGIN;
WITH picked AS (
    SELECT id FROM django_pgqueue_job
    WHERE status = 'pending' AND queue = 'queuebench' AND partition_key IS NULL
      AND available_at <= now()
    ORDER BY priority DESC, available_at, id
    LIMIT 100
    FOR UPDATE SKIP LOCKED
)
UPDATE django_pgqueue_job AS job
SET status = 'processing', attempts = job.attempts + 1,
    lease_generation = job.lease_generation + 1, claimed_by = 'pgbench-' || :client_id,
    claimed_at = now(), started_at = now(), lease_expires_at = now() + interval '30 seconds'
WHERE job.id = ANY (ARRAY(SELECT picked.id FROM picked));
-- Found through pgq_job_lease (processing rows with a lease), as the reaper finds them.
UPDATE django_pgqueue_job
SET status = 'succeeded', result = 'null', finished_at = now(), lease_expires_at = NULL
WHERE status = 'processing' AND lease_expires_at > '-infinity'
  AND claimed_by = 'pgbench-' || :client_id;
COMMIT;
