"""Helpers of the periodic-schedule tests: declare, sync and count scheduled jobs."""

from __future__ import annotations

import json
from collections import Counter
from datetime import datetime
from typing import Any

import psycopg

from django_pgqueue.features.periodic import PeriodicSchedule, parse_fire_key
from django_pgqueue.features.scheduling import SyncReport, sync_schedules
from django_pgqueue.store.queue import QueueStore
from django_pgqueue.store.runners import PsycopgRunner

PROBE = "tests.tasks.scheduled_probe"


def schedule(
    name: str = "probe", expression: str = "@every 1s", **options: Any
) -> PeriodicSchedule:
    """Return a declaration of the probe task."""
    return PeriodicSchedule(name=name, task_path=PROBE, expression=expression, **options)


def sync(conn: psycopg.Connection[Any], *schedules: PeriodicSchedule) -> SyncReport:
    """Sync ``schedules`` in one transaction, as a starting worker does."""
    store = QueueStore(PsycopgRunner(conn, "default"))
    with conn.transaction():
        return sync_schedules(store, schedules)


def jobs_per_fire(conn: psycopg.Connection[Any], name: str = "probe") -> Counter[datetime]:
    """Return how many jobs each fire time of schedule ``name`` has (run-now jobs aside)."""
    rows = conn.execute(
        "SELECT idempotency_key FROM django_pgqueue_job_all WHERE idempotency_key LIKE %s",
        [f"pgqueue:schedule:{name}:%"],
    ).fetchall()
    fires = [parse_fire_key(row[0]) for row in rows]
    return Counter(fire.fire_time for fire in fires if fire is not None and not fire.manual)


def scheduled_jobs(conn: psycopg.Connection[Any], name: str = "probe") -> list[tuple[Any, ...]]:
    """Return (key, args, kwargs, status) of ``name``'s jobs, oldest first."""
    rows = conn.execute(
        "SELECT idempotency_key, args::text, kwargs::text, status FROM django_pgqueue_job_all "
        "WHERE idempotency_key LIKE %s ORDER BY id",
        [f"pgqueue:schedule:{name}:%"],
    ).fetchall()
    return [
        (key, json.loads(args), json.loads(kwargs), status) for key, args, kwargs, status in rows
    ]


def make_due(conn: psycopg.Connection[Any], name: str, minutes_ago: int = 0) -> None:
    """Pretend the workers were down: make every-minute schedule ``name`` due since the
    start of the minute ``minutes_ago`` minutes back (a real fire time of it)."""
    conn.execute(
        "UPDATE django_pgqueue_schedule SET next_fire_at = "
        "date_trunc('minute', statement_timestamp()) - make_interval(mins => %s) "
        "WHERE name = %s",
        [minutes_ago, name],
    )
