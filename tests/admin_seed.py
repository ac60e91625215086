"""Realistic queue contents for the admin tests, the page timings and the screenshots.

``seed(conn, finished=N)`` writes, with a few set-based statements:

* ``finished`` finished jobs over the last two days, in id order: mostly succeeded, 2%
  dead letters (four task/error groups with a three-attempt error history), 0.2%
  cancelled; 10% partitioned, 10% with an idempotency key, and a rare queue ("low",
  one job in 20,000) so that filters on rare values are exercised too;
* a backlog: 200 running jobs of which 20 have an expired lease, 5,000 scheduled jobs
  and 20,000 ready ones (half of them in 100 partitions), the newest;
* the worker registry (alive, draining, dead) and an hour of per-minute statistics.

Written with raw SQL on purpose: it is test data, produced far faster than through the
queue manager, and shaped like what the manager writes.
"""

from __future__ import annotations

from typing import Any

import psycopg

FINISHED = """
INSERT INTO django_pgqueue_job (
    queue, task_path, args, kwargs, priority, status, attempts, max_attempts,
    lease_generation, claimed_by, claimed_at, available_at, created_at, started_at,
    finished_at, last_error, last_error_class, errors, result, idempotency_key,
    partition_key, partition_bucket
)
SELECT
    seed.queue,
    seed.task_path,
    jsonb_build_array(g),
    jsonb_build_object('order_id', g, 'note', 'seeded'),
    CASE WHEN seed.queue = 'high' THEN 50 ELSE 0 END,
    seed.status,
    CASE WHEN seed.status = 'dead_letter' THEN 3 ELSE 1 END,
    CASE WHEN seed.status = 'dead_letter' THEN 3 ELSE 5 END,
    CASE WHEN seed.status = 'dead_letter' THEN 3 ELSE 1 END,
    CASE WHEN seed.status <> 'cancelled' THEN 'web-1:' || (1000 + g %% 4) END,
    CASE WHEN seed.status = 'dead_letter' THEN seed.created_at + interval '55 ms'
         WHEN seed.status <> 'cancelled' THEN seed.created_at + interval '10 ms' END,
    seed.created_at,
    seed.created_at,
    CASE WHEN seed.status <> 'cancelled' THEN seed.created_at + interval '10 ms' END,
    seed.created_at + interval '90 ms',
    seed.error_message,
    seed.error_class,
    CASE WHEN seed.status = 'dead_letter' THEN (
        SELECT jsonb_agg(jsonb_build_object(
            'attempt', attempt,
            'exception_class', seed.error_class,
            'message', seed.error_message,
            'traceback', 'Traceback (most recent call last):' || E'\n'
                || '  File "' || replace(seed.task_path, '.', '/') || '.py", line 42, in run'
                || E'\n' || '    raise ' || seed.error_class || E'\n'
                || seed.error_class || ': ' || seed.error_message,
            'worker', 'web-1:' || (1000 + attempt),
            'at', seed.created_at + interval '10 ms' + attempt * interval '20 ms'
        ))
        FROM generate_series(1, 3) AS attempt
    ) ELSE '[]'::jsonb END,
    CASE WHEN seed.status = 'succeeded' THEN jsonb_build_object('ok', true, 'order', g) END,
    CASE WHEN g %% 10 = 3 THEN 'order-' || g END,
    CASE WHEN g %% 10 = 5 THEN 'customer-' || (g %% 5000) END,
    CASE WHEN g %% 10 = 5 THEN (g %% 5000) %% 1024 END
FROM generate_series(1, %(rows)s) AS g
CROSS JOIN LATERAL (
    SELECT
        queue,
        CASE queue
            WHEN 'emails' THEN 'shop.tasks.send_receipt'
            WHEN 'reports' THEN 'reports.tasks.build_daily_report'
            WHEN 'high' THEN 'billing.tasks.charge_card'
            WHEN 'low' THEN 'maintenance.tasks.rebuild_search_index'
            ELSE (ARRAY['shop.tasks.sync_inventory', 'media.tasks.resize_image',
                        'shop.tasks.recalculate_totals'])[g %% 3 + 1]
        END AS task_path,
        status,
        now() - interval '2 days' + g * (interval '2 days' / %(rows)s) AS created_at,
        CASE WHEN status = 'dead_letter' THEN
            (ARRAY['requests.exceptions.ReadTimeout', 'billing.errors.CardDeclined',
                   'ValueError', 'KeyError'])[g / 47 %% 4 + 1]
        END AS error_class,
        CASE WHEN status = 'dead_letter' THEN
            (ARRAY['HTTPSConnectionPool(host=''api.example.com''): Read timed out.',
                   'card declined: insufficient funds',
                   'invalid literal for int() with base 10: ''N/A''',
                   '''sku'''])[g / 47 %% 4 + 1]
            WHEN status = 'cancelled' THEN 'cancelled by an operator'
        END AS error_message
    FROM (
        SELECT
            CASE
                WHEN g %% 20000 = 7 THEN 'low'
                WHEN g %% 20 < 14 THEN 'default'
                WHEN g %% 20 < 18 THEN 'emails'
                WHEN g %% 20 = 18 THEN 'reports'
                ELSE 'high'
            END AS queue,
            CASE
                WHEN g %% 47 = 0 THEN 'dead_letter'
                WHEN g %% 499 = 1 THEN 'cancelled'
                ELSE 'succeeded'
            END AS status
    ) AS kind
) AS seed
"""

READY = """
INSERT INTO django_pgqueue_job (
    queue, task_path, args, kwargs, priority, status, attempts, max_attempts,
    lease_generation, available_at, created_at, errors, partition_key, partition_bucket
)
SELECT
    CASE WHEN g %% 4 = 0 THEN 'emails' ELSE 'default' END,
    CASE WHEN g %% 4 = 0 THEN 'shop.tasks.send_receipt' ELSE 'shop.tasks.sync_inventory' END,
    jsonb_build_array(g), '{}', 0, 'pending', 0, 5, 0,
    now() - (%(rows)s - g) * interval '3 ms', now() - (%(rows)s - g) * interval '3 ms', '[]',
    CASE WHEN g %% 2 = 0 THEN 'tenant-' || (g %% 100) END,
    CASE WHEN g %% 2 = 0 THEN (g %% 100) END
FROM generate_series(1, %(rows)s) AS g
"""

SCHEDULED = """
INSERT INTO django_pgqueue_job (
    queue, task_path, args, kwargs, priority, status, attempts, max_attempts,
    lease_generation, available_at, created_at, errors
)
SELECT 'reports', 'reports.tasks.build_daily_report', jsonb_build_array(g), '{}', 0,
    'pending', 0, 5, 0, now() + g * interval '17 seconds', now() - interval '1 hour', '[]'
FROM generate_series(1, %(rows)s) AS g
"""

PROCESSING = """
INSERT INTO django_pgqueue_job (
    queue, task_path, args, kwargs, priority, status, attempts, max_attempts,
    lease_generation, claimed_by, claimed_at, lease_expires_at, available_at, created_at,
    started_at, errors, step
)
SELECT 'default', 'media.tasks.resize_image', jsonb_build_array(g), '{}', 0, 'processing',
    1, 5, 1,
    CASE WHEN g <= %(expired)s THEN 'web-9:4242' ELSE 'web-1:' || (1000 + g %% 3) END,
    now() - interval '5 seconds',
    CASE WHEN g <= %(expired)s THEN now() - interval '2 minutes'
         ELSE now() + interval '25 seconds' END,
    now() - interval '6 seconds', now() - interval '6 seconds', now() - interval '5 seconds',
    '[]', CASE WHEN g %% 3 = 0 THEN 'thumbnails' END
FROM generate_series(1, %(rows)s) AS g
"""

WORKERS = """
INSERT INTO django_pgqueue_worker (
    id, status, hostname, pid, queues, concurrency, started_at, last_seen_at, metadata
)
SELECT worker.id, worker.status, worker.hostname, worker.pid, worker.queues::jsonb,
    worker.concurrency, now() - interval '3 hours', now() - worker.silent, worker.metadata::jsonb
FROM (VALUES
    ('web-1:1000', 'alive', 'web-1', 1000, '["default", "emails"]', 16, interval '2 seconds',
     '{"version": "0.1.0", "owned_buckets": {"default": 512, "emails": 512}}'),
    ('web-1:1001', 'alive', 'web-1', 1001, '["default", "emails"]', 16, interval '1 second',
     '{"version": "0.1.0", "owned_buckets": {"default": 512, "emails": 512}}'),
    ('web-1:1002', 'draining', 'web-1', 1002, '["reports"]', 4, interval '3 seconds',
     '{"version": "0.1.0", "owned_buckets": {"reports": 1024}}'),
    ('web-9:4242', 'dead', 'web-9', 4242, '["default"]', 8, interval '10 minutes',
     '{"version": "0.1.0", "owned_buckets": {"default": 0}}')
) AS worker (id, status, hostname, pid, queues, concurrency, silent, metadata)
"""

STATS = """
INSERT INTO django_pgqueue_queuestat (
    queue, minute, succeeded, failed, dead_lettered, wait_ms_max
)
SELECT queue.name, date_trunc('minute', now()) - minute * interval '1 minute',
    (queue.rate * (1.2 + sin(minute / 6.0)))::bigint,
    (queue.rate / 50 * (1 + cos(minute / 4.0)))::bigint,
    CASE WHEN minute BETWEEN 20 AND 24 THEN queue.rate / 20 ELSE 0 END,
    (queue.lag_ms * (1.5 + sin(minute / 9.0)))::bigint
FROM (VALUES ('default', 9000, 400), ('emails', 2400, 900), ('reports', 300, 15000))
    AS queue (name, rate, lag_ms)
CROSS JOIN generate_series(0, 59) AS minute
"""


RECENT = """
INSERT INTO django_pgqueue_job (
    queue, task_path, args, kwargs, priority, status, attempts, max_attempts,
    lease_generation, claimed_by, claimed_at, lease_expires_at, available_at, created_at,
    started_at, finished_at, last_error, last_error_class, errors, result
)
SELECT recent.queue, recent.task_path, jsonb_build_array(g), '{}', 0, recent.status,
    recent.attempts, 5, recent.attempts,
    CASE WHEN recent.attempts > 0 THEN 'web-1:' || (1000 + g %% 2) END,
    CASE WHEN recent.status = 'dead_letter'
         THEN recent.created_at + (recent.attempts - 1) * interval '40 seconds'
         WHEN recent.attempts > 0 THEN recent.created_at + interval '40 ms' END,
    CASE WHEN recent.status = 'processing' THEN now() + interval '25 seconds' END,
    CASE WHEN recent.retrying THEN now() + (g %% 7 + 1) * interval '20 seconds'
         ELSE recent.created_at END,
    recent.created_at,
    CASE WHEN recent.attempts > 0 THEN recent.created_at + interval '40 ms' END,
    CASE WHEN recent.status = 'succeeded' THEN recent.created_at + interval '900 ms'
         WHEN recent.status = 'dead_letter'
         THEN recent.created_at + (recent.attempts - 1) * interval '40 seconds'
             + interval '1900 ms' END,
    CASE WHEN recent.failed THEN recent.error_message END,
    CASE WHEN recent.failed THEN recent.error_class END,
    CASE WHEN recent.failed THEN (
        SELECT jsonb_agg(jsonb_build_object(
            'attempt', attempt, 'exception_class', recent.error_class,
            'message', recent.error_message, 'worker', 'web-1:' || (1000 + attempt %% 2),
            'traceback', 'Traceback (most recent call last):' || E'\\n'
                || '  File "' || replace(recent.task_path, '.', '/') || '.py", line 42, in run'
                || E'\\n' || recent.error_class || ': ' || recent.error_message,
            'at', recent.created_at + (attempt - 1) * interval '40 seconds'
                + interval '1 second'))
        FROM generate_series(1, recent.attempts) AS attempt
    ) ELSE '[]'::jsonb END,
    CASE WHEN recent.status = 'succeeded' THEN jsonb_build_object('ok', true) END
FROM generate_series(1, %(rows)s) AS g
CROSS JOIN LATERAL (
    SELECT *,
        status = 'dead_letter' OR retrying AS failed,
        CASE WHEN status = 'pending' AND NOT retrying THEN 0
             WHEN status = 'dead_letter' THEN 5
             ELSE 1 + g %% 2 END AS attempts,
        -- A dead letter was enqueued before its five attempts, 40 seconds apart.
        base_at - CASE WHEN status = 'dead_letter' THEN interval '3 minutes'
                       ELSE interval '0' END AS created_at
    FROM (
        SELECT
            (ARRAY['default', 'emails', 'default', 'high', 'reports'])[g %% 5 + 1] AS queue,
            (ARRAY['shop.tasks.sync_inventory', 'shop.tasks.send_receipt',
                   'media.tasks.resize_image', 'billing.tasks.charge_card',
                   'reports.tasks.build_daily_report'])[g %% 5 + 1] AS task_path,
            CASE WHEN g %% 13 = 0 THEN 'dead_letter'
                 WHEN g %% 11 = 0 OR g %% 17 = 0 THEN 'pending'
                 WHEN g > %(rows)s - 12 THEN 'processing'
                 WHEN g > %(rows)s - 20 THEN 'pending'
                 ELSE 'succeeded' END AS status,
            g %% 11 = 0 AND g %% 13 <> 0 AS retrying,
            now() - (%(rows)s - g) * (%(minutes)s * interval '1 minute' / %(rows)s)
                - interval '2 seconds' AS base_at,
            (ARRAY['requests.exceptions.ReadTimeout', 'billing.errors.CardDeclined',
                   'ValueError'])[g %% 3 + 1] AS error_class,
            (ARRAY['HTTPSConnectionPool(host=''api.example.com'', port=443): Read timed out. '
                   || '(read timeout=10)',
                   'card declined: insufficient funds (customer cus_4Fh2, order 81723)',
                   'invalid literal for int() with base 10: ''N/A''']
            )[g %% 3 + 1] AS error_message
    ) AS kind
) AS recent
"""


def seed_recent_activity(
    conn: psycopg.Connection[Any], *, rows: int = 300, minutes: int = 20
) -> None:
    """Add the last ``minutes`` of a busy queue as the newest jobs.

    Mostly succeeded, some running, retrying (with their error) and dead-lettered: the
    first page of the inbox then looks like a real one (``seed``'s backlog is all
    fresh, ready jobs). ``conn`` must be in autocommit mode.
    """
    conn.execute(RECENT, {"rows": rows, "minutes": minutes})
    conn.execute("ANALYZE django_pgqueue_job")


def seed(
    conn: psycopg.Connection[Any],
    *,
    finished: int = 1_000_000,
    ready: int = 20_000,
    scheduled: int = 5_000,
    processing: int = 200,
    expired: int = 20,
    vacuum: bool = True,
) -> None:
    """Fill the queue tables (``conn`` must be in autocommit mode)."""
    conn.execute(FINISHED, {"rows": finished})
    conn.execute(PROCESSING, {"rows": processing, "expired": expired})
    conn.execute(SCHEDULED, {"rows": scheduled})
    conn.execute(READY, {"rows": ready})
    conn.execute(WORKERS)
    conn.execute(STATS)
    # As autovacuum would have, on a table this size: statistics and a visibility map.
    conn.execute("VACUUM ANALYZE django_pgqueue_job" if vacuum else "ANALYZE django_pgqueue_job")
    conn.execute("ANALYZE django_pgqueue_worker")
    conn.execute("ANALYZE django_pgqueue_queuestat")
