"""Schedule operations on the database: sync from code, the admin's own schedules (add,
change, delete), fire what is due, pause, resume, run now. The worker's scheduler and the
admin call these; the SQL runs in the store.

A schedule declared in code and one created in the admin are the same declaration
(:class:`PeriodicSchedule`), checked by the same rules and fired by the same statement;
only who writes the row differs (``source``). The sync never changes or deletes an admin
row, and the admin never edits or deletes a code row.

Every time comparison uses the database clock (read in the same statement as the rows),
so hosts with skewed clocks agree on what is due.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from django_pgqueue.conf import conf
from django_pgqueue.exceptions import InvalidOption, InvalidSchedule, UnknownTask
from django_pgqueue.features.cadence import CadenceError, parse_cadence, zone
from django_pgqueue.features.periodic import (
    PeriodicSchedule,
    fire_key,
    plan_fires,
    run_now_key,
    schedule_backend_problem,
    schedule_database,
    task_defaults,
    task_limits,
)
from django_pgqueue.store.queue import QueueStore
from django_pgqueue.store.values import DueSchedule, ScheduleDefinition

__all__ = [
    "FireReport",
    "SyncReport",
    "admin_schedule_problems",
    "definition_of",
    "delete_admin_schedules",
    "fire_due",
    "pause",
    "resume",
    "run_now",
    "save_admin_schedule",
    "sync_schedules",
]

logger = logging.getLogger("django_pgqueue.schedules")


@dataclass(frozen=True, slots=True)
class SyncReport:
    """What a sync changed, by schedule name."""

    added: tuple[str, ...] = ()
    changed: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()
    #: Declared in code, but an admin schedule has the name: not synced (the admin's stays).
    conflicts: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class FireReport:
    """What one firing pass did."""

    #: Jobs inserted, by schedule name.
    fired: Mapping[str, int]
    #: The earliest next fire time among the active schedules (None: there are none).
    next_fire_at: datetime | None
    #: The database clock when the pass read the schedules.
    database_now: datetime | None
    #: More schedules may be due than one pass read.
    more: bool = False


def definition_of(schedule: PeriodicSchedule) -> ScheduleDefinition:
    """Return the row ``schedule`` should have; raise :class:`InvalidSchedule` if invalid.

    Imports the task (its queue and priority are the defaults).
    """
    problems = schedule.problems()
    if problems:
        raise InvalidSchedule(schedule.name, "declaration", problems[0][1])
    try:
        queue, priority, max_attempts = task_defaults(schedule)
    except UnknownTask as error:
        raise InvalidSchedule(schedule.name, "task", str(error)) from error
    try:
        limits = task_limits(schedule, queue)
    except InvalidOption as error:
        raise InvalidSchedule(schedule.name, "limits", str(error)) from error
    cadence = schedule.cadence
    return ScheduleDefinition(
        name=schedule.name,
        task_path=schedule.task_path,
        queue=queue,
        priority=priority,
        max_attempts=max_attempts or conf.MAX_ATTEMPTS,
        args=list(schedule.args),
        kwargs=dict(schedule.kwargs),
        expression=cadence.text,
        description=cadence.describe(),
        timezone=schedule.timezone_name,
        downtime=schedule.downtime,
        catch_up=schedule.catch_up_limit,
        timing=schedule.timing(),
        concurrency_key=limits.key,
        concurrency_limit=limits.concurrency,
        rate_limit=None if limits.rate is None else limits.rate.limit,
        rate_period=None if limits.rate is None else limits.rate.period,
    )


def sync_schedules(
    store: QueueStore,
    schedules: Iterable[PeriodicSchedule],
    *,
    lock_timeout: float | None = None,
) -> SyncReport:
    """Make the code's rows of the schedule table match ``schedules``: add, change, remove.

    Admin schedules are left as they are. A declaration whose name an admin schedule has
    is not written: it is logged as an error and returned in ``conflicts``.
    Call inside a transaction on ``store``'s connection: it takes the sync lock, so
    workers starting together sync one after the other. Raises
    :class:`InvalidSchedule` (changing nothing) if a declaration is invalid. With
    ``lock_timeout`` (seconds), a lock held longer than that by another session fails
    the sync with ``LockNotAvailable`` instead of waiting for it.
    """
    definitions = [(definition_of(s), s) for s in schedules]
    store.lock_schedule_sync(timeout_seconds=lock_timeout)
    now = store.database_now()
    added: list[str] = []
    changed: list[str] = []
    for definition, schedule in definitions:
        next_fire_at = schedule.cadence.next_after(now, schedule.zone)
        outcome = store.upsert_schedule(definition, next_fire_at=next_fire_at)
        if outcome == "added":
            added.append(definition.name)
        elif outcome == "changed":
            changed.append(definition.name)
    declared = [d.name for d, _ in definitions]
    removed = store.delete_undeclared_schedules(declared)
    # Read after the upserts, which skipped these rows: an admin schedule added meanwhile
    # is reported too.
    conflicts = store.admin_schedules_named(declared)
    for name in conflicts:
        logger.error(
            "schedule %s is declared in code, but an admin schedule has that name: the "
            "admin's is kept and the code's is not synced (rename one of them)",
            name,
        )
    return SyncReport(tuple(added), tuple(changed), tuple(removed), tuple(conflicts))


#: The field of a declaration each check is about. The admin's form checks the JSON of
#: the arguments and the downtime choice itself, so there E205 is about ``catch_up`` and
#: E207 about the name.
_PROBLEM_FIELDS = {
    "django_pgqueue.E201": "expression",
    "django_pgqueue.E202": "timezone",
    "django_pgqueue.E203": "task_path",
    "django_pgqueue.E204": "queue_name",
    "django_pgqueue.E205": "catch_up",
    "django_pgqueue.E206": "expression",
    "django_pgqueue.E207": "name",
    "django_pgqueue.E208": "priority",
}


def admin_schedule_problems(
    schedule: PeriodicSchedule, *, alias: str, declared: Collection[str]
) -> list[tuple[str, str]]:
    """Return ``(field, message)`` for what keeps ``schedule`` from being saved in the admin.

    ``field`` names an attribute of :class:`PeriodicSchedule`. The rules are the system
    checks' (E201-E208) and the sync's (:func:`definition_of`), plus: the name is not one
    of ``declared`` (the code's names), and the task's jobs go to database ``alias``,
    whose workers fire the schedule. Imports the task.
    """
    found = [(_PROBLEM_FIELDS[check_id], message) for check_id, message in schedule.problems()]
    if schedule.name in declared:
        found.append(("name", f"{schedule.name!r} is declared in code; choose another name"))
    backend = schedule_backend_problem(schedule)
    if backend is not None:
        check_id, message = backend
        found.append((_PROBLEM_FIELDS[check_id], message))
    elif schedule_database(schedule) != alias:
        found.append(
            (
                "task_path",
                f"the jobs of {schedule.task_path} go to database "
                f"{schedule_database(schedule)!r}; these are the schedules of {alias!r}",
            )
        )
    if not found:
        try:
            definition_of(schedule)
        except InvalidSchedule as error:
            # "task": it cannot be imported; "limits": its flow limits are invalid.
            found.append(("task_path", str(error)))
    return found


def save_admin_schedule(store: QueueStore, schedule: PeriodicSchedule, *, adding: bool) -> bool:
    """Create (``adding``) or rewrite an admin schedule; return whether it did.

    A new schedule, or one whose expression or timezone changed, fires next at the
    first fire time after the database clock; any other change keeps the next fire and
    applies from it. Never writes a code schedule: False if the name is taken (adding)
    or is not an admin schedule's (changing). Raises :class:`InvalidSchedule` if the
    declaration is invalid (check :func:`admin_schedule_problems` first).
    """
    definition = definition_of(schedule)
    next_fire_at = schedule.cadence.next_after(store.database_now(), schedule.zone)
    if adding:
        return store.add_admin_schedule(definition, next_fire_at=next_fire_at)
    return store.change_admin_schedule(definition, next_fire_at=next_fire_at)


def delete_admin_schedules(store: QueueStore, names: Sequence[str]) -> list[str]:
    """Delete the admin schedules among ``names``; return the names it deleted.

    Their jobs stay, and their fire keys keep a schedule re-created under the same name
    from firing a time twice. Code schedules among ``names`` are left.
    """
    return store.delete_admin_schedules(names)


def fire_due(store: QueueStore, *, limit: int = 100) -> FireReport:
    """Fire every due schedule once (one short statement each); return what happened.

    Run in autocommit: each fire commits on its own, so a slow schedule never holds
    another's row. A schedule another worker fired first is left alone.
    """
    schedules = store.due_schedules(limit=limit)
    fired: dict[str, int] = {}
    upcoming: list[datetime] = []
    for schedule in schedules:
        if not schedule.due:
            upcoming.append(schedule.next_fire_at)
            break
        next_fire_at = _fire(store, schedule, fired)
        if next_fire_at is not None:
            upcoming.append(next_fire_at)
    return FireReport(
        fired=fired,
        next_fire_at=min(upcoming) if upcoming else None,
        database_now=schedules[0].database_now if schedules else None,
        more=len(schedules) >= limit and all(s.due for s in schedules),
    )


def _fire(store: QueueStore, schedule: DueSchedule, fired: dict[str, int]) -> datetime | None:
    try:
        cadence = parse_cadence(schedule.expression)
        timezone = zone(schedule.timezone)
    except (CadenceError, ImportError) as error:
        # A row written by another release this one cannot read: leave it to that one.
        logger.error("schedule %s cannot be fired by this worker: %s", schedule.name, error)
        return None
    plan = plan_fires(
        cadence,
        timezone,
        due_since=schedule.next_fire_at,
        now=schedule.database_now,
        downtime=schedule.downtime,
        catch_up=schedule.catch_up,
    )
    result = store.fire_schedule(
        schedule,
        keys=[fire_key(schedule.name, fire) for fire in plan.fire_times],
        last_fire_at=plan.fire_times[-1] if plan.fire_times else None,
        next_fire_at=plan.next_fire_at,
    )
    if result.advanced:
        fired[schedule.name] = result.inserted
        if plan.fire_times:
            logger.info(
                "schedule %s fired for %s (%d jobs); next fire %s",
                schedule.name,
                ", ".join(f"{fire:%Y-%m-%d %H:%M:%S}Z" for fire in plan.fire_times),
                result.inserted,
                f"{plan.next_fire_at:%Y-%m-%d %H:%M:%S}Z",
            )
        else:
            logger.info(
                "schedule %s: missed fire times skipped (downtime='%s'); next fire %s",
                schedule.name,
                schedule.downtime,
                f"{plan.next_fire_at:%Y-%m-%d %H:%M:%S}Z",
            )
    return plan.next_fire_at


def pause(store: QueueStore, names: Sequence[str]) -> list[str]:
    """Pause the active schedules among ``names``; return the names it paused."""
    return store.pause_schedules(names)


def resume(store: QueueStore, names: Sequence[str]) -> list[str]:
    """Resume the paused schedules among ``names`` from the next fire after now.

    Fire times missed while paused are not owed. Returns the names it resumed.
    """
    resumed: list[str] = []
    for paused in store.paused_schedules(names):
        try:
            cadence = parse_cadence(paused.expression)
            next_fire_at = cadence.next_after(paused.database_now, zone(paused.timezone))
        except (CadenceError, ImportError) as error:
            logger.error("schedule %s cannot be resumed here: %s", paused.name, error)
            continue
        if store.resume_schedule(paused, next_fire_at=next_fire_at):
            resumed.append(paused.name)
    return sorted(resumed)


def run_now(store: QueueStore, names: Sequence[str], *, requested_at: datetime) -> dict[str, int]:
    """Enqueue one job of each schedule in ``names`` now; return the job id per name.

    ``requested_at`` (the time the operator's confirmation page was shown) goes into
    each job's key, so submitting the same confirmation twice enqueues once.
    """
    return store.run_schedules_now({name: run_now_key(name, requested_at) for name in names})
