"""System checks. IDs are stable; each is listed in the reference documentation.

Backend-specific checks (E001, E003, E005, E006) come from
:meth:`PgQueueBackend.check`, which ``django.tasks`` runs for every configured backend.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Sequence
from types import FrameType
from typing import Any

from django.apps import AppConfig, apps
from django.core import checks
from django.db import DatabaseError, InterfaceError, OperationalError, connections, router

from django_pgqueue.compat import task_backends
from django_pgqueue.conf import conf
from django_pgqueue.exceptions import ConfigurationError, UnknownTask
from django_pgqueue.features.periodic import declared_schedules, schedule_backend_problem
from django_pgqueue.store.schema import index_problems
from django_pgqueue.store.tables import missing_tables
from django_pgqueue.tasks.backend import PgQueueBackend, resolve_task
from django_pgqueue.tasks.middleware import middleware_problems

__all__ = ["CHECK_IDS", "MINIMUM_POSTGRESQL", "SETTING_CHECK_IDS"]

#: Oldest supported PostgreSQL major version.
MINIMUM_POSTGRESQL = 14

#: Every check ID that is not about a single setting, with what it reports.
CHECK_IDS = {
    "django_pgqueue.E001": "A PgQueueBackend stores jobs in a database that is not PostgreSQL.",
    "django_pgqueue.E002": "The PostgreSQL server is older than 14 (checked with --database).",
    "django_pgqueue.E003": "A PgQueueBackend is configured but django_pgqueue is not installed.",
    "django_pgqueue.E004": "The admin is installed but rangefilter "
    "(django-admin-rangefilter) is not.",
    "django_pgqueue.E005": "A backend's QUEUES is empty or holds an invalid queue name.",
    "django_pgqueue.E006": "A backend's OPTIONS['DATABASE'] is not a key of DATABASES.",
    "django_pgqueue.E007": "The queue's tables are missing from a backend's database: "
    "migrate was not run there (checked with --database).",
    "django_pgqueue.E129": "An entry of PGQUEUE_MIDDLEWARE cannot be imported or is not callable.",
    "django_pgqueue.E201": "A periodic schedule's expression is not valid cron, a nickname "
    "or an @every interval.",
    "django_pgqueue.E202": "A periodic schedule names an unknown timezone.",
    "django_pgqueue.E203": "A periodic schedule's task cannot be imported, is not a task, or "
    "does not use a PgQueueBackend.",
    "django_pgqueue.E204": "A periodic schedule's queue is not in its backend's QUEUES.",
    "django_pgqueue.E205": "A periodic schedule's downtime policy (or catch_up) is invalid.",
    "django_pgqueue.E206": "A periodic schedule uses a cron expression but cronsim (the "
    "'cron' extra) is not installed.",
    "django_pgqueue.E207": "A periodic schedule is declared wrongly: a bad name, a malformed "
    "PGQUEUE_SCHEDULES entry, arguments that are not JSON, or a name declared twice.",
    "django_pgqueue.E208": "A periodic schedule's priority is not a whole number between "
    "-100 and 100.",
    "django_pgqueue.E301": "A concurrency or rate limit in PGQUEUE_CONCURRENCY_LIMITS or "
    "PGQUEUE_RATE_LIMITS names a queue that is in no PgQueueBackend's QUEUES.",
    "django_pgqueue.E302": "A concurrency or rate limit in PGQUEUE_CONCURRENCY_LIMITS or "
    "PGQUEUE_RATE_LIMITS names a task that cannot be imported or is not a task.",
    "django_pgqueue.W001": "django_pgqueue is installed but no TASKS backend uses it.",
    "django_pgqueue.W002": "An index on a queue table is INVALID (an interrupted concurrent "
    "build or reindex); checked with --database and at worker start.",
}

#: One stable check ID per setting.
SETTING_CHECK_IDS = {
    "MAX_ATTEMPTS": "django_pgqueue.E101",
    "MAX_PAYLOAD_BYTES": "django_pgqueue.E102",
    "RETRY_BASE_SECONDS": "django_pgqueue.E103",
    "RETRY_MAX_SECONDS": "django_pgqueue.E104",
    "RETRY_JITTER": "django_pgqueue.E105",
    "LEASE_SECONDS": "django_pgqueue.E106",
    "HEARTBEAT_SECONDS": "django_pgqueue.E107",
    "WORKER_TIMEOUT_SECONDS": "django_pgqueue.E108",
    "POLL_INTERVAL_SECONDS": "django_pgqueue.E109",
    "CONCURRENCY": "django_pgqueue.E110",
    "BATCH_SIZE": "django_pgqueue.E111",
    "PREFETCH": "django_pgqueue.E112",
    "GRACE_SECONDS": "django_pgqueue.E113",
    "HOUSEKEEPING_INTERVAL_SECONDS": "django_pgqueue.E114",
    "RETENTION_SECONDS": "django_pgqueue.E115",
    "DEAD_LETTER_RETENTION_SECONDS": "django_pgqueue.E116",
    "PRUNE_BATCH_SIZE": "django_pgqueue.E117",
    "UNKNOWN_TASK_TIMEOUT_SECONDS": "django_pgqueue.E118",
    "NOTIFY_CHANNEL": "django_pgqueue.E119",
    "PARTITION_VNODES": "django_pgqueue.E120",
    # E121 was PARTITION_SCAN_LIMIT, removed with migration 0004 (no more scan window).
    "METRICS_TOKEN": "django_pgqueue.E122",
    "CONCURRENCY_LIMITS": "django_pgqueue.E123",
    "RATE_LIMITS": "django_pgqueue.E124",
    "PREFETCH_WINDOW_SECONDS": "django_pgqueue.E125",
    "LOG_SUMMARY_SECONDS": "django_pgqueue.E126",
    "MAX_SNOOZES": "django_pgqueue.E127",
    "MIDDLEWARE": "django_pgqueue.E128",
    "STUCK_HANDLER_GRACE_SECONDS": "django_pgqueue.E130",
    "HISTORY_PERIOD": "django_pgqueue.E131",
    "HISTORY_PREMAKE": "django_pgqueue.E132",
    "RETENTION": "django_pgqueue.E133",
    "CLAIM_FLOOR_AFTER_SECONDS": "django_pgqueue.E134",
    "SEGMENT_JOBS": "django_pgqueue.E135",
    "SEGMENT_LIMIT": "django_pgqueue.E136",
}


def _queue_backends() -> list[Any]:
    found = []
    for alias in task_backends.settings:
        try:
            backend = task_backends[alias]
        except Exception:  # noqa: S112 - a broken TASKS entry is Django's check to report
            continue
        if isinstance(backend, PgQueueBackend):
            found.append(backend)
    return found


@checks.register()
def check_settings(app_configs: Sequence[AppConfig] | None = None, **kwargs: Any) -> list[Any]:
    """Report invalid ``PGQUEUE_*`` settings (E101-E125)."""
    return [checks.Error(message, id=SETTING_CHECK_IDS[name]) for name, message in conf.problems()]


@checks.register()
def check_middleware(app_configs: Sequence[AppConfig] | None = None, **kwargs: Any) -> list[Any]:
    """Report ``PGQUEUE_MIDDLEWARE`` entries that cannot be imported or are not callable (E129)."""
    try:
        paths = conf.MIDDLEWARE
    except ConfigurationError:
        return []  # E128 says it
    return [
        checks.Error(message, id="django_pgqueue.E129") for message in middleware_problems(paths)
    ]


@checks.register()
def check_apps(app_configs: Sequence[AppConfig] | None = None, **kwargs: Any) -> list[Any]:
    """Report missing companion apps (E004) and an unused queue app (W001)."""
    messages: list[Any] = []
    if apps.is_installed("django.contrib.admin") and not apps.is_installed("rangefilter"):
        messages.append(
            checks.Error(
                "django_pgqueue's admin pages need django-admin-rangefilter.",
                hint="Add 'rangefilter' to INSTALLED_APPS.",
                id="django_pgqueue.E004",
            )
        )
    if not _queue_backends():
        messages.append(
            checks.Warning(
                "django_pgqueue is installed but no TASKS backend uses "
                "django_pgqueue.backend.PgQueueBackend.",
                hint="Set TASKS['default']['BACKEND'] = 'django_pgqueue.backend.PgQueueBackend'.",
                id="django_pgqueue.W001",
            )
        )
    return messages


@checks.register()
def check_schedules(app_configs: Sequence[AppConfig] | None = None, **kwargs: Any) -> list[Any]:
    """Report invalid periodic schedules (E201-E208), before any worker fires them."""

    schedules, problems = declared_schedules()
    for schedule in schedules.values():
        problems.extend(
            (check_id, f"schedule {schedule.name!r} ({schedule.origin}): {message}")
            for check_id, message in schedule.problems()
        )
        found = schedule_backend_problem(schedule)
        if found is not None:
            check_id, message = found
            problems.append(
                (check_id, f"schedule {schedule.name!r} ({schedule.origin}): {message}")
            )
    return [checks.Error(message, id=check_id) for check_id, message in problems]


@checks.register()
def check_flow_limits(app_configs: Sequence[AppConfig] | None = None, **kwargs: Any) -> list[Any]:
    """Report limits in settings naming an unknown queue (E301) or task (E302).

    Invalid values (a limit of 0, a period of 0 or less) are E123 and E124.
    """

    declared: list[tuple[str, str]] = []
    for setting in ("CONCURRENCY_LIMITS", "RATE_LIMITS"):
        try:
            names = getattr(conf, setting)
        except ConfigurationError:
            continue  # E123 / E124
        declared.extend((setting, name) for name in names)
    backends = _queue_backends()
    queues = set().union(*(backend.queues for backend in backends)) if backends else set()
    open_queues = any(not backend.queues for backend in backends)
    messages = []
    for setting, name in declared:
        kind, _, target = name.partition(":")
        if kind == "queue" and not open_queues and target not in queues:
            messages.append(
                checks.Error(
                    f"PGQUEUE_{setting}[{name!r}]: queue {target!r} is in no PgQueueBackend's "
                    f"QUEUES ({', '.join(sorted(queues)) or 'none'})",
                    id="django_pgqueue.E301",
                )
            )
        elif kind == "task":
            try:
                resolve_task(target)
            except UnknownTask as error:
                messages.append(
                    checks.Error(f"PGQUEUE_{setting}[{name!r}]: {error}", id="django_pgqueue.E302")
                )
    return messages


@checks.register(checks.Tags.database)
def check_database_version(
    app_configs: Sequence[AppConfig] | None = None,
    databases: Iterable[str] | None = None,
    **kwargs: Any,
) -> list[Any]:
    """Report a PostgreSQL server older than version 14 (E002); needs a connection."""
    messages: list[Any] = []
    wanted = set(databases or ())
    for backend in _queue_backends():
        alias = backend.database
        if alias not in wanted or alias not in connections:
            continue
        connection = connections[alias]
        if connection.vendor != "postgresql":
            continue  # E001 reports this
        version: int = connection.pg_version  # type: ignore[attr-defined]
        if version // 10000 < MINIMUM_POSTGRESQL:
            messages.append(
                checks.Error(
                    f"Database {alias!r} runs PostgreSQL {version // 10000}; django-pgqueue "
                    f"needs {MINIMUM_POSTGRESQL} or later.",
                    id="django_pgqueue.E002",
                )
            )
    return messages


@checks.register(checks.Tags.database)
def check_tables(
    app_configs: Sequence[AppConfig] | None = None,
    databases: Iterable[str] | None = None,
    **kwargs: Any,
) -> list[Any]:
    """Report a backend database without the queue's tables (E007); needs a connection."""

    wanted = set(databases or ())
    if not wanted or _inside_migrate():
        return []
    messages: list[Any] = []
    for alias in sorted({backend.database for backend in _queue_backends()} & wanted):
        if alias not in connections or connections[alias].vendor != "postgresql":
            continue  # E006 and E001 report these
        try:
            missing = missing_tables(alias)
        except DatabaseError:
            continue  # an unreachable database is not this check's finding
        if missing:
            messages.append(
                checks.Error(
                    f"The job queue's tables are missing from database {alias!r}: "
                    f"{', '.join(missing)}.",
                    hint="Run python manage.py migrate"
                    + ("." if alias == "default" else f" --database {alias}."),
                    id="django_pgqueue.E007",
                )
            )
    return messages


def _inside_migrate() -> bool:
    # migrate runs the database checks before it creates the tables this check looks
    # for; reporting them there would stop the very command that fixes the problem.
    from django.core.management.commands.migrate import Command as Migrate

    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        if isinstance(frame.f_locals.get("self"), Migrate):
            return True
        frame = frame.f_back
    return False


@checks.register(checks.Tags.database)
def check_invalid_indexes(
    app_configs: Sequence[AppConfig] | None = None,
    databases: Iterable[str] | None = None,
    **kwargs: Any,
) -> list[Any]:
    """Report INVALID indexes on the queue's tables (W002); needs a connection."""
    from django_pgqueue.models import Job

    messages: list[Any] = []
    for alias in sorted(set(databases or ())):
        if connections[alias].vendor != "postgresql" or not router.allow_migrate_model(alias, Job):
            continue
        try:
            problems = index_problems(alias)
        except (OperationalError, InterfaceError):
            continue  # unreachable: whoever needs the database reports that, not a check
        messages.extend(
            checks.Warning(
                f"Index {problem.index.index_name!r} on {problem.index.table_name} "
                f"(database {alias!r}) is INVALID: PostgreSQL maintains it on every write "
                f"but no query can use it. It is {problem.cause}.",
                hint=f"Repair it with: {problem.repair}",
                id="django_pgqueue.W002",
            )
            for problem in problems
            if not problem.building  # a build under way is invalid until it finishes
        )
    return messages
