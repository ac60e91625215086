"""Periodic tasks: declared in code, fired by the workers, exactly once per fire time.

Two ways to declare a schedule, which end up as the same :class:`PeriodicSchedule`:

- the ``@periodic("0 2 * * *", timezone="Europe/Berlin")`` decorator, stacked on a task
  in an app's ``tasks`` module (the primary form, next to the code it runs);
- the ``PGQUEUE_SCHEDULES`` setting, mapping names to ``{"task": "app.tasks.f",
  "schedule": "@daily", ...}`` (for tasks declared elsewhere, or per-deployment schedules).

Nothing here touches the database. Declarations are checked by the system checks
(E201-E208) and written to the schedule table when a worker starts
(:mod:`django_pgqueue.worker.scheduler`). The database decides which worker fires: every
job of a schedule carries the idempotency key ``pgqueue:schedule:<name>:<fire time>``.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Literal, TypeVar, cast
from zoneinfo import ZoneInfo

from django.conf import settings

from django_pgqueue.compat import TASK_MAX_PRIORITY, TASK_MIN_PRIORITY, task_backends
from django_pgqueue.conf import conf
from django_pgqueue.exceptions import UnknownTask
from django_pgqueue.features.cadence import Cadence, CadenceError, parse_cadence, zone
from django_pgqueue.limits import SCHEDULE_NAME_MAX_LENGTH
from django_pgqueue.store.flow_limits import resolve_limits
from django_pgqueue.tasks.backend import PgQueueBackend, resolve_task

if TYPE_CHECKING:
    from django_pgqueue.compat import Task
    from django_pgqueue.store.flow_limits import FlowLimits

__all__ = [
    "DOWNTIME_POLICIES",
    "FirePlan",
    "PeriodicSchedule",
    "ScheduledFire",
    "declared_schedules",
    "fire_key",
    "parse_fire_key",
    "periodic",
    "plan_fires",
    "run_now_key",
]

Downtime = Literal["latest", "skip", "catch_up"]
#: What a schedule does with fire times missed while no worker ran.
DOWNTIME_POLICIES: tuple[Downtime, ...] = ("latest", "skip", "catch_up")
#: The most fires a ``catch_up`` schedule may owe after downtime.
MAX_CATCH_UP = 100
#: A missed fire time counts as late (``skip`` drops it) once it is this far behind,
#: or half its period if that is shorter.
LATE_AFTER = timedelta(seconds=60)

_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")
_KEY_PREFIX = "pgqueue:schedule:"
_KEY = re.compile(
    r"^pgqueue:schedule:(?P<name>[A-Za-z0-9_.-]+):(?:(?P<manual>run-now):)?"
    r"(?P<at>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d{6})?)Z$"
)
#: Keys a schedule entry of PGQUEUE_SCHEDULES may hold.
SETTING_KEYS = frozenset(
    {
        "task",
        "schedule",
        "timezone",
        "args",
        "kwargs",
        "queue_name",
        "priority",
        "downtime",
        "catch_up",
    }
)

TaskT = TypeVar("TaskT", bound="Task")  # type: ignore[type-arg]


@dataclass(frozen=True, slots=True)
class PeriodicSchedule:
    """One declared schedule: which task to enqueue, when, and with what.

    ``queue_name`` and ``priority`` of None mean the task's own. Validation is separate
    (:meth:`problems`), so a bad declaration becomes a system-check error rather than an
    import error.
    """

    name: str
    task_path: str
    expression: str
    timezone: str | None = None
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    queue_name: str | None = None
    priority: int | None = None
    downtime: str = "latest"
    catch_up: int | None = None
    #: Where it was declared ("@periodic on app.tasks.f", "PGQUEUE_SCHEDULES"): for messages.
    origin: str = ""

    @property
    def timezone_name(self) -> str:
        """Return the timezone the expression is read in (default: ``TIME_ZONE``)."""
        return self.timezone or getattr(settings, "TIME_ZONE", None) or "UTC"

    @property
    def zone(self) -> ZoneInfo:
        """Return the timezone; raise :class:`CadenceError` if unknown."""
        return zone(self.timezone_name)

    @property
    def cadence(self) -> Cadence:
        """Return the parsed expression; raise :class:`CadenceError` if invalid."""
        return parse_cadence(self.expression)

    @property
    def catch_up_limit(self) -> int:
        """Return how many missed fires may be made up after downtime."""
        return (self.catch_up or 1) if self.downtime == "catch_up" else 1

    def problems(self) -> list[tuple[str, str]]:
        """Return ``(check id, message)`` for what is wrong with the declaration itself.

        The task, its backend and queue are checked against the running project by
        :mod:`django_pgqueue.checks`.
        """
        found: list[tuple[str, str]] = []
        if not _NAME.match(self.name) or len(self.name) > SCHEDULE_NAME_MAX_LENGTH:
            found.append(
                (
                    "django_pgqueue.E207",
                    f"name {self.name!r} must be 1-{SCHEDULE_NAME_MAX_LENGTH} letters, "
                    "digits, '.', '_' or '-'",
                )
            )
        try:
            self.cadence  # noqa: B018 - parses it
        except CadenceError as error:
            found.append(("django_pgqueue.E201", f"expression {error}"))
        except ImportError as error:
            found.append(("django_pgqueue.E206", str(error)))
        try:
            self.zone  # noqa: B018
        except CadenceError as error:
            found.append(("django_pgqueue.E202", str(error)))
        if self.downtime not in DOWNTIME_POLICIES:
            found.append(
                (
                    "django_pgqueue.E205",
                    f"downtime {self.downtime!r} is not one of {', '.join(DOWNTIME_POLICIES)}",
                )
            )
        elif self.downtime == "catch_up" and (
            isinstance(self.catch_up, bool)
            or not isinstance(self.catch_up, int)
            or not 1 <= self.catch_up <= MAX_CATCH_UP
        ):
            found.append(
                (
                    "django_pgqueue.E205",
                    f"downtime 'catch_up' needs catch_up=N, an integer from 1 to {MAX_CATCH_UP}",
                )
            )
        elif self.downtime != "catch_up" and self.catch_up is not None:
            found.append(("django_pgqueue.E205", "catch_up only applies with downtime='catch_up'"))
        try:
            json.dumps([list(self.args), dict(self.kwargs)])
        except (TypeError, ValueError) as error:
            found.append(("django_pgqueue.E207", f"args/kwargs are not JSON: {error}"))
        # The job table's CHECK would refuse every fire (the task's own priority is
        # checked when the task is declared).
        if self.priority is not None and (
            isinstance(self.priority, bool)
            or not isinstance(self.priority, int)
            or not TASK_MIN_PRIORITY <= self.priority <= TASK_MAX_PRIORITY
        ):
            found.append(
                (
                    "django_pgqueue.E208",
                    f"priority {self.priority!r} is not a whole number between "
                    f"{TASK_MIN_PRIORITY} and {TASK_MAX_PRIORITY}",
                )
            )
        return found

    def timing(self) -> str:
        """Return a fingerprint of when it fires (a change moves the next fire time)."""
        return _digest([self.expression, self.timezone_name])


def _digest(value: object) -> str:
    text = json.dumps(value, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


# ---------------------------------------------------------------------- declaration
_declared: dict[str, PeriodicSchedule] = {}
_duplicates: list[tuple[str, str]] = []
_lock = threading.Lock()


def periodic(
    schedule: str,
    *,
    name: str | None = None,
    timezone: str | None = None,
    downtime: Downtime = "latest",
    catch_up: int | None = None,
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    queue_name: str | None = None,
    priority: int | None = None,
) -> Callable[[TaskT], TaskT]:
    """Run the task below on a schedule; stack it on ``@task``.

    ``schedule`` is a cron expression (``"*/5 * * * *"``, ``"0 2 * * mon-fri"``), a
    nickname (``"@hourly"``, ``"@daily"``...) or an interval (``"@every 30s"``). It is
    read in ``timezone`` (default ``TIME_ZONE``). ``downtime`` says what happens to fire
    times missed while no worker ran: ``"latest"`` fires the most recent once,
    ``"skip"`` fires none, ``"catch_up"`` fires the most recent ``catch_up`` of them.
    ``name`` (default: the task's path) must be unique; give one when stacking several
    schedules on a task. The task is returned unchanged.

    Declaration errors are reported by ``manage.py check`` (and before a worker starts),
    not raised here, so a typo cannot break the import of the module.
    """

    def register(task: TaskT) -> TaskT:
        module_path = getattr(task, "module_path", None)
        if not isinstance(module_path, str):
            raise TypeError(
                f"@periodic goes above @task (it needs the task object, got {type(task).__name__})"
            )
        declared = PeriodicSchedule(
            name=name or module_path,
            task_path=module_path,
            expression=schedule,
            timezone=timezone,
            args=tuple(args),
            kwargs=dict(kwargs or {}),
            queue_name=queue_name,
            priority=priority,
            downtime=downtime,
            catch_up=catch_up,
            origin=f"@periodic on {module_path}",
        )
        with _lock:
            previous = _declared.get(declared.name)
            # A module imported twice (reloads, tests) declares the same thing again.
            if previous is not None and previous != declared:
                _duplicates.append((declared.name, declared.origin))
            _declared[declared.name] = declared
        return task

    return register


def _from_setting(name: object, entry: object) -> PeriodicSchedule | tuple[str, str]:
    if not isinstance(name, str):
        return ("django_pgqueue.E207", f"PGQUEUE_SCHEDULES: the name {name!r} is not a string")
    if not isinstance(entry, Mapping):
        return ("django_pgqueue.E207", f"PGQUEUE_SCHEDULES[{name!r}] must be a dict")
    unknown = sorted(set(entry) - SETTING_KEYS)
    if unknown:
        return (
            "django_pgqueue.E207",
            f"PGQUEUE_SCHEDULES[{name!r}] has unknown keys {unknown} "
            f"(known: {', '.join(sorted(SETTING_KEYS))})",
        )
    for required in ("task", "schedule"):
        if not isinstance(entry.get(required), str):
            return (
                "django_pgqueue.E207",
                f"PGQUEUE_SCHEDULES[{name!r}] needs {required!r}, a string",
            )
    return PeriodicSchedule(
        name=name,
        task_path=entry["task"],
        expression=entry["schedule"],
        timezone=entry.get("timezone"),
        args=tuple(entry.get("args", ())),
        kwargs=dict(entry.get("kwargs", {})),
        queue_name=entry.get("queue_name"),
        priority=entry.get("priority"),
        downtime=entry.get("downtime", "latest"),
        catch_up=entry.get("catch_up"),
        origin="PGQUEUE_SCHEDULES",
    )


def declared_schedules(
    *, discover: bool = True
) -> tuple[dict[str, PeriodicSchedule], list[tuple[str, str]]]:
    """Return every declared schedule by name, and ``(check id, message)`` problems
    found while collecting them (malformed setting entries, duplicate names).

    ``discover`` first imports the ``tasks`` module of every installed app, where
    ``@periodic`` declarations live.
    """
    if discover:
        from django.utils.module_loading import autodiscover_modules

        autodiscover_modules("tasks")
    problems: list[tuple[str, str]] = []
    with _lock:
        schedules = dict(_declared)
        problems.extend(
            ("django_pgqueue.E207", f"schedule {name!r} is declared twice ({origin})")
            for name, origin in _duplicates
        )
    raw = getattr(settings, "PGQUEUE_SCHEDULES", None) or {}
    if not isinstance(raw, Mapping):
        problems.append(("django_pgqueue.E207", "PGQUEUE_SCHEDULES must be a dict"))
        raw = {}
    for name, entry in raw.items():
        made = _from_setting(name, entry)
        if isinstance(made, tuple):
            problems.append(made)
        elif made.name in schedules:
            problems.append(
                (
                    "django_pgqueue.E207",
                    f"schedule {made.name!r} is declared twice "
                    f"({schedules[made.name].origin} and PGQUEUE_SCHEDULES)",
                )
            )
        else:
            schedules[made.name] = made
    return schedules, problems


# ---------------------------------------------------------------------- fire keys
@dataclass(frozen=True, slots=True)
class ScheduledFire:
    """What a scheduled job's idempotency key says: its schedule and fire time."""

    schedule: str
    fire_time: datetime
    #: True for a job an operator started with "run now" (fire_time is when).
    manual: bool = False


def fire_key(name: str, fire_time: datetime) -> str:
    """Return the idempotency key of ``name``'s job for ``fire_time`` (one per fire)."""
    return f"{_KEY_PREFIX}{name}:{fire_time.astimezone(UTC):%Y-%m-%dT%H:%M:%S}Z"


def run_now_key(name: str, at: datetime) -> str:
    """Return the idempotency key of a "run now" job started at ``at``."""
    return f"{_KEY_PREFIX}{name}:run-now:{at.astimezone(UTC):%Y-%m-%dT%H:%M:%S.%f}Z"


def parse_fire_key(key: str | None) -> ScheduledFire | None:
    """Return what a scheduled job's key says, or None for any other key."""
    if not key or not key.startswith(_KEY_PREFIX):
        return None
    match = _KEY.match(key)
    if match is None:
        return None
    at = datetime.fromisoformat(match.group("at")).replace(tzinfo=UTC)
    return ScheduledFire(match.group("name"), at, manual=match.group("manual") is not None)


# ---------------------------------------------------------------------- fire plans
@dataclass(frozen=True, slots=True)
class FirePlan:
    """What one due schedule fires now, and when it is due next."""

    fire_times: tuple[datetime, ...]
    next_fire_at: datetime


def plan_fires(
    cadence: Cadence,
    timezone: ZoneInfo,
    *,
    due_since: datetime,
    now: datetime,
    downtime: str,
    catch_up: int = 1,
) -> FirePlan:
    """Decide which fire times in ``[due_since, now]`` get a job, by the downtime policy.

    ``due_since`` is the schedule's recorded next fire time and ``now`` the database
    clock. Normally that is one fire time, a moment ago: every policy fires it.
    After downtime there are several; ``latest`` fires the newest, ``catch_up`` the
    newest ``catch_up``, and ``skip`` fires only the newest, and only if it is not late
    (less than a minute, or half its period, behind ``now``). Never more than
    ``catch_up`` (at most :data:`MAX_CATCH_UP`) jobs, however long the downtime.
    """
    limit = min(max(catch_up, 1), MAX_CATCH_UP) if downtime == "catch_up" else 1
    fires = cadence.fires_between(due_since, now, timezone, limit=limit)
    if downtime == "skip" and fires:
        newest = fires[-1]
        period = cadence.next_after(newest, timezone) - newest
        if now - newest > min(LATE_AFTER, period / 2):
            fires = []
    return FirePlan(tuple(fires), cadence.next_after(now, timezone))


def task_limits(schedule: PeriodicSchedule, queue: str) -> FlowLimits:
    """Return the flow limits the jobs of ``schedule`` get, as an enqueue would give them.

    The task's ``concurrency_key``, ``concurrency_limit`` and ``rate_limit``, else the
    ``task:`` and ``queue:`` entries of the settings. Raises
    :class:`~django_pgqueue.exceptions.UnknownTask` or
    :class:`~django_pgqueue.exceptions.InvalidOption`.
    """

    task = resolve_task(schedule.task_path)
    return resolve_limits(
        schedule.task_path,
        queue,
        cast("str | None", getattr(task, "concurrency_key", None)),
        cast("int | None", getattr(task, "concurrency_limit", None)),
        cast("str | None", getattr(task, "rate_limit", None)),
        partition_key=None,
        concurrency_limits=conf.CONCURRENCY_LIMITS,
        rate_limits=conf.RATE_LIMITS,
    )


def task_defaults(schedule: PeriodicSchedule) -> tuple[str, int, int | None]:
    """Return the queue, priority and max_attempts jobs of ``schedule`` get.

    Imports the task; raises :class:`~django_pgqueue.exceptions.UnknownTask` if that fails.
    """

    task = resolve_task(schedule.task_path)
    queue = schedule.queue_name if schedule.queue_name is not None else task.queue_name
    priority = schedule.priority if schedule.priority is not None else task.priority
    max_attempts = cast("int | None", getattr(task, "max_attempts", None))
    return queue, priority, max_attempts


def schedule_backend_problem(schedule: PeriodicSchedule) -> tuple[str, str] | None:
    """Return ``(check id, message)`` if the task or its queue cannot take the jobs."""

    try:
        task = resolve_task(schedule.task_path)
    except UnknownTask as error:
        return ("django_pgqueue.E203", str(error))
    queue = schedule.queue_name if schedule.queue_name is not None else task.queue_name
    backend = task_backends[task.backend] if task.backend in task_backends.settings else None
    if not isinstance(backend, PgQueueBackend):
        return (
            "django_pgqueue.E203",
            f"task {schedule.task_path} uses backend {task.backend!r}, not a PgQueueBackend",
        )
    if backend.queues and queue not in backend.queues:
        return (
            "django_pgqueue.E204",
            f"queue {queue!r} is not in TASKS[{task.backend!r}]['QUEUES'] "
            f"({', '.join(sorted(backend.queues))})",
        )
    return None


def schedule_database(schedule: PeriodicSchedule) -> str | None:
    """Return the database alias the schedule's jobs go to (None: the task is unknown)."""

    try:
        task = resolve_task(schedule.task_path)
    except UnknownTask:
        return None
    backend = task_backends[task.backend] if task.backend in task_backends.settings else None
    return backend.database if isinstance(backend, PgQueueBackend) else None
