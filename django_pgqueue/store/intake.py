"""What an enqueue checks and sends.

Every field of a :class:`~django_pgqueue.store.values.JobSpec` is checked here, before anything
is written, with a typed error naming the field (and, in a batch, the job). The settings
an enqueue reads are validated once until ``setting_changed`` names one of them, and a
bulk insert's rows travel as one JSON document.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, fields, replace
from datetime import datetime
from typing import Any

from django.conf import settings
from django.core.signals import setting_changed
from django.utils import timezone

from django_pgqueue.compat import TASK_MAX_PRIORITY, TASK_MIN_PRIORITY, TaskResult, task_backends
from django_pgqueue.conf import conf
from django_pgqueue.exceptions import (
    DependencyInOtherDatabase,
    InvalidArguments,
    InvalidOption,
    PayloadTooLarge,
)
from django_pgqueue.limits import (
    JOB_ID_MAX,
    JOB_ID_MIN,
    KEY_MAX_LENGTH,
    MAX_ATTEMPTS_LIMIT,
    QUEUE_MAX_LENGTH,
    TASK_PATH_MAX_LENGTH,
)
from django_pgqueue.states import BlockerFailure, JobStatus
from django_pgqueue.store.coalescing import check_coalescing
from django_pgqueue.store.flow_limits import resolve_limits
from django_pgqueue.store.partition import bucket_for
from django_pgqueue.store.payload import check_key, check_text, encode_arguments
from django_pgqueue.store.tracing import current_traceparent
from django_pgqueue.store.values import JobSpec

__all__ = [
    "TRACEPARENT_MAX_LENGTH",
    "EnqueueDefaults",
    "blocker_ids",
    "dependent_status",
    "jobs_document",
    "validated",
    "validated_calls",
    "validated_many",
]


@dataclass(frozen=True, slots=True)
class EnqueueDefaults:
    """Settings read once per enqueue call rather than once per job."""

    max_attempts: int
    payload_limit: int
    use_tz: bool
    #: The active span's W3C traceparent (None without OpenTelemetry or without a span).
    traceparent: str | None
    #: PGQUEUE_CONCURRENCY_LIMITS and PGQUEUE_RATE_LIMITS (declared in settings).
    concurrency_limits: dict[str, int]
    rate_limits: dict[str, str]

    @classmethod
    def read(cls) -> EnqueueDefaults:
        cached = _enqueue_settings()
        return cls(
            cached.max_attempts,
            cached.payload_limit,
            cached.use_tz,
            current_traceparent(),
            cached.concurrency_limits,
            cached.rate_limits,
        )


@dataclass(frozen=True, slots=True)
class _EnqueueSettings:
    max_attempts: int
    payload_limit: int
    use_tz: bool
    concurrency_limits: dict[str, int]
    rate_limits: dict[str, str]


@functools.cache
def _enqueue_settings() -> _EnqueueSettings:
    """Return the settings every enqueue reads, validated once until one changes.

    Reading and validating them took about a quarter of an enqueue's Python time (each
    ``settings.X`` goes through ``LazySettings``; the limit dicts are checked entry by
    entry). An invalid value raises, and a raised call is not cached.
    """
    return _EnqueueSettings(
        conf.MAX_ATTEMPTS,
        conf.MAX_PAYLOAD_BYTES,
        settings.USE_TZ,
        conf.CONCURRENCY_LIMITS,
        conf.RATE_LIMITS,
    )


def _forget_enqueue_settings(*, setting: str, **kwargs: Any) -> None:
    # Sent by override_settings (Django's only supported way to change settings at run time).
    if setting == "USE_TZ" or setting.startswith("PGQUEUE_"):
        _enqueue_settings.cache_clear()


setting_changed.connect(_forget_enqueue_settings, dispatch_uid="django_pgqueue.enqueue_settings")


def validated(
    spec: JobSpec,
    defaults: EnqueueDefaults,
    *,
    position: int | None = None,
    options: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Return the statement parameters of ``spec``; raise naming the bad field.

    In a batch, the field is prefixed with the spec's position (``jobs[3].args[0]``).
    ``options`` are the checked parameters of an earlier spec with the same options
    (:func:`_options_shape`): then only the arguments and idempotency key are checked.
    """
    try:
        if options is not None:
            return _with_arguments(spec, defaults, options)
        return _checked(spec, defaults)
    except PayloadTooLarge:
        raise
    except InvalidArguments as error:
        if position is None:
            raise
        raise _in_batch(error, position) from None
    except InvalidOption as error:
        if position is None:
            raise
        raise InvalidOption(f"jobs[{position}].{error.option}", error.reason) from None


def validated_many(specs: Sequence[JobSpec], defaults: EnqueueDefaults) -> list[dict[str, Any]]:
    """Return the statement parameters of every spec, checking each set of options once.

    The specs of one ``Task.enqueue_many`` call share every option and differ only in
    their arguments (and perhaps idempotency keys), so the option checks (lengths, text,
    limits, flow settings, traceparent) run once per distinct set rather than per job.
    """
    checked: dict[tuple[Any, ...], dict[str, Any]] = {}
    prepared = []
    for position, spec in enumerate(specs):
        shape = _options_shape(spec)
        options = None if shape is None else checked.get(shape)
        params = validated(spec, defaults, position=position, options=options)
        if shape is not None and options is None:
            checked[shape] = dict(params)  # the caller pops from what it gets
        prepared.append(params)
    return prepared


def validated_calls(
    template: JobSpec,
    calls: Sequence[tuple[Sequence[Any], Mapping[str, Any]]],
    defaults: EnqueueDefaults,
) -> list[dict[str, Any]] | None:
    """Return the statement parameters of one job per ``(args, kwargs)`` of ``template``.

    ``Task.enqueue_many``'s jobs share every field but their arguments: the first call is
    checked in full, the others only for their arguments, as :func:`validated_many` does
    for specs of one shape, without building a spec per call. Returns None when
    ``template`` needs the per-spec path: it has dependencies, an idempotency key (every
    job would share it) or a coalesce key.
    """
    if not _plain_options(template) or template.idempotency_key is not None:
        return None
    args, kwargs = calls[0]
    first = validated(replace(template, args=args, kwargs=kwargs), defaults, position=0)
    del first["after"], first["on_blocker_failure"]
    prepared = [first]
    limit = defaults.payload_limit
    for position in range(1, len(calls)):
        args, kwargs = calls[position]
        try:
            args_json, kwargs_json = encode_arguments(args, kwargs, limit=limit)
        except PayloadTooLarge:
            raise
        except InvalidArguments as error:
            raise _in_batch(error, position) from None
        prepared.append({**first, "args": args_json, "kwargs": kwargs_json})
    return prepared


#: The fields whose checks do not depend on the job's arguments or idempotency key.
_OPTION_FIELDS = tuple(
    spec_field.name
    for spec_field in fields(JobSpec)
    if spec_field.name not in ("args", "kwargs", "idempotency_key")
)


def _in_batch(error: InvalidArguments, position: int) -> InvalidArguments:
    """Return ``error`` naming the job's position in a batch (``jobs[3].args[0]``)."""
    return InvalidArguments(f"jobs[{position}].{error.argument}", error.reason)


def _plain_options(spec: JobSpec) -> bool:
    """Whether ``spec`` has no dependencies and no coalescing: checks that can be shared.

    Only a plain empty ``after``: anything else (an array without a truth value, a
    generator) goes the long way, whose checks give it a typed error. Dependencies and
    coalescing are checked together with the idempotency key.
    """
    return (
        type(spec.after) in (tuple, list)
        and not spec.after
        and spec.coalesce_key is None
        and spec.debounce is None
    )


def _options_shape(spec: JobSpec) -> tuple[Any, ...] | None:
    """Return a key equal for specs whose options check the same way, or None.

    Each value is paired with its type, since ``True == 1`` and ``1.0 == 1`` but only
    one of each pair is valid. Dependencies and coalescing are checked together with the
    idempotency key, so specs carrying them are always checked in full.
    """
    if not _plain_options(spec):
        return None
    shape = tuple((type(value), value) for value in map(spec.__getattribute__, _OPTION_FIELDS))
    try:
        hash(shape)
    except TypeError:  # an unhashable option value: check it the long way
        return None
    return shape


def _with_arguments(
    spec: JobSpec, defaults: EnqueueDefaults, options: Mapping[str, Any]
) -> dict[str, Any]:
    """Return ``options`` (another spec's checked parameters) with ``spec``'s own parts.

    The same checks as :func:`_checked` makes of them, in the same order.
    """
    idempotency_key = spec.idempotency_key
    if idempotency_key is not None:
        check_key("idempotency_key", idempotency_key, max_length=KEY_MAX_LENGTH)
    args_json, kwargs_json = encode_arguments(spec.args, spec.kwargs, limit=defaults.payload_limit)
    return {
        **options,
        "args": args_json,
        "kwargs": kwargs_json,
        "idempotency_key": idempotency_key,
    }


# Computed once: ``BlockerFailure.values`` builds a new list on every access, and this
# check runs for every job of a bulk enqueue.
_BLOCKER_FAILURES = frozenset(BlockerFailure.values)


def _checked(spec: JobSpec, defaults: EnqueueDefaults) -> dict[str, Any]:
    task_path = spec.task_path
    if not isinstance(task_path, str) or not task_path:
        raise InvalidOption("task_path", "must be a non-empty string")
    if len(task_path) > TASK_PATH_MAX_LENGTH:
        raise InvalidOption("task_path", f"is longer than {TASK_PATH_MAX_LENGTH} characters")
    check_text("task_path", task_path)
    queue = spec.queue
    if not isinstance(queue, str) or not queue:
        raise InvalidOption("queue_name", "must be a non-empty string")
    if len(queue) > QUEUE_MAX_LENGTH:
        raise InvalidOption("queue_name", f"must be at most {QUEUE_MAX_LENGTH} characters")
    check_text("queue_name", queue)
    priority = spec.priority
    if type(priority) is not int:
        raise InvalidOption("priority", f"must be an integer, not {priority!r}")
    if not TASK_MIN_PRIORITY <= priority <= TASK_MAX_PRIORITY:
        raise InvalidOption(
            "priority", f"{priority} is outside {TASK_MIN_PRIORITY}..{TASK_MAX_PRIORITY}"
        )
    max_attempts = defaults.max_attempts if spec.max_attempts is None else spec.max_attempts
    if type(max_attempts) is not int:
        raise InvalidOption("max_attempts", f"must be an integer, not {max_attempts!r}")
    if not 1 <= max_attempts <= MAX_ATTEMPTS_LIMIT:
        raise InvalidOption("max_attempts", f"{max_attempts} is outside 1..{MAX_ATTEMPTS_LIMIT}")
    available_at = spec.available_at
    if available_at is not None:
        if not isinstance(available_at, datetime):
            raise InvalidOption("run_after", f"must be a datetime, not {available_at!r}")
        if timezone.is_naive(available_at):
            if defaults.use_tz:
                raise InvalidOption("run_after", "must be an aware datetime (USE_TZ is True)")
            available_at = timezone.make_aware(available_at)
    idempotency_key = spec.idempotency_key
    if idempotency_key is not None:
        check_key("idempotency_key", idempotency_key, max_length=KEY_MAX_LENGTH)
    if spec.coalesce_key is not None or spec.debounce is not None:
        check_coalescing(spec.coalesce_key, spec.debounce, idempotency_key)
    partition_key = spec.partition_key
    if partition_key is not None:
        check_key("partition_key", partition_key, max_length=KEY_MAX_LENGTH)
    flow = resolve_limits(
        task_path,
        queue,
        spec.concurrency_key,
        spec.concurrency_limit,
        spec.rate_limit,
        partition_key=partition_key,
        concurrency_limits=defaults.concurrency_limits,
        rate_limits=defaults.rate_limits,
    )
    args_json, kwargs_json = encode_arguments(spec.args, spec.kwargs, limit=defaults.payload_limit)
    after = blocker_ids(spec.after)
    if after and idempotency_key is not None:
        raise InvalidOption("after", "cannot be combined with an idempotency key (yet)")
    if after and spec.coalesce_key is not None:
        raise InvalidOption("after", "cannot be combined with a coalesce key")
    if spec.on_blocker_failure not in _BLOCKER_FAILURES:
        raise InvalidOption(
            "on_blocker_failure",
            f"must be one of {', '.join(BlockerFailure.values)}, not {spec.on_blocker_failure!r}",
        )
    return {
        "after": after,
        "on_blocker_failure": str(spec.on_blocker_failure),
        "queue": queue,
        "task_path": task_path,
        "args": args_json,
        "kwargs": kwargs_json,
        "priority": priority,
        "max_attempts": max_attempts,
        "available_at": available_at,
        "idempotency_key": idempotency_key,
        "partition_key": partition_key,
        "partition_bucket": None if partition_key is None else bucket_for(partition_key),
        "traceparent": _traceparent(spec.traceparent, defaults),
        "concurrency_key": flow.key,
        "concurrency_limit": flow.concurrency,
        "rate_limit": None if flow.rate is None else flow.rate.limit,
        "rate_period": None if flow.rate is None else flow.rate.period,
    }


_TRACEPARENT = re.compile(r"^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}(-[^\x00]*)?$")
#: Longer than any W3C traceparent version yet (55 characters for version 00).
TRACEPARENT_MAX_LENGTH = 256


def blocker_ids(after: Any) -> list[int]:
    """Return the job ids of ``after`` (ids, or results/jobs with an id), first ones first."""
    if isinstance(after, str | bytes) or not isinstance(after, Iterable):
        raise InvalidOption("after", f"must be a list of jobs or job ids, not {after!r}")
    ids: list[int] = []
    for item in after:
        value = getattr(item, "id", item)
        if isinstance(value, str) and value.isdigit():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise InvalidOption("after", f"{item!r} is not a job, a task result or a job id")
        if not JOB_ID_MIN <= value <= JOB_ID_MAX:
            raise InvalidOption("after", f"{value} is outside the range of job ids (bigint)")
        if value not in ids:
            ids.append(value)
    return ids


def check_blocker_databases(after: Iterable[Any], alias: str) -> None:
    """Raise :class:`DependencyInOtherDatabase` if ``after`` names a job of another database.

    A task result names its backend, whose database holds the job; a job instance or an
    enqueue outcome names its database. Bare ids are taken as ids of ``alias``.
    """
    for item in after:
        where = _database_of(item)
        if where is not None and where != alias:
            raise DependencyInOtherDatabase(_blocker_id(item), where, alias)


def _database_of(item: Any) -> str | None:
    if isinstance(item, TaskResult):
        backend = task_backends[item.backend]
        stored_in = getattr(backend, "database", None)
        if not isinstance(stored_in, str):
            raise InvalidOption(
                "after",
                f"the result of task {item.id!r} comes from backend {item.backend!r}, "
                "which does not keep its jobs in a django-pgqueue database",
            )
        return stored_in
    state = getattr(item, "_state", None)
    if state is not None and isinstance(getattr(state, "db", None), str):
        database: str = state.db
        return database
    alias = getattr(item, "alias", None)
    return alias if isinstance(alias, str) else None


def _blocker_id(item: Any) -> int:
    value = getattr(item, "id", item)
    return int(value)


def dependent_status(
    blocker_ids: list[int], statuses: Mapping[int, JobStatus], on_failure: str
) -> tuple[JobStatus, str | None, int | None]:
    """Return (status, last_error, blocker that cancelled it) of a new dependent."""
    failed = [
        job_id
        for job_id in blocker_ids
        if statuses[job_id] in (JobStatus.DEAD_LETTER, JobStatus.CANCELLED)
    ]
    if failed and on_failure == BlockerFailure.CANCEL:
        # Same words as the settling trigger of migration 0009.
        first = failed[0]
        ended = statuses[first].value.replace("_", "-")
        return JobStatus.CANCELLED, f"job {first}, which it runs after, ended {ended}", first
    settled = {JobStatus.SUCCEEDED, JobStatus.DEAD_LETTER, JobStatus.CANCELLED}
    if all(statuses[job_id] in settled for job_id in blocker_ids):
        return JobStatus.PENDING, None, None
    return JobStatus.BLOCKED, None, None


def _traceparent(given: str | None, defaults: EnqueueDefaults) -> str | None:
    if given is None:
        return defaults.traceparent
    if (
        not isinstance(given, str)
        or len(given) > TRACEPARENT_MAX_LENGTH
        or not _TRACEPARENT.match(given)
    ):
        raise InvalidOption("traceparent", f"must be a W3C traceparent header, not {given!r}")
    return given


def jobs_document(prepared: list[dict[str, Any]]) -> str:
    """Return the jobs as one JSON document, ``[[queue, task_path, args, ...], ...]``.

    Arguments are JSON already and are spliced in as they are. The rest of a row is the
    same for every job of a ``Task.enqueue_many`` call (bar an idempotency key), so each
    distinct head and tail is encoded once.
    """
    heads: dict[tuple[str, str], str] = {}
    tails: dict[tuple[Any, ...], str] = {}
    parts = []
    for p in prepared:
        head_key = (p["queue"], p["task_path"])
        head = heads.get(head_key)
        if head is None:
            head = heads[head_key] = f"[{json.dumps(head_key[0])},{json.dumps(head_key[1])},"
        tail_key = (
            p["priority"],
            p["max_attempts"],
            p["available_at"],
            p["idempotency_key"],
            p["partition_key"],
            p["partition_bucket"],
            p["traceparent"],
            p["concurrency_key"],
            p["concurrency_limit"],
            p["rate_limit"],
            p["rate_period"],
        )
        tail = tails.get(tail_key)
        if tail is None:
            tail = tails[tail_key] = _row_tail(tail_key)
        parts.append(f"{head}{p['args']},{p['kwargs']},{tail}")
    return "[" + ",".join(parts) + "]"


def _row_tail(values: tuple[Any, ...]) -> str:
    """Encode a row's fields after its arguments (see :func:`jobs_document`)."""
    available_at = values[2]
    return (
        json.dumps(
            [
                *values[:2],
                None if available_at is None else available_at.isoformat(),
                *values[3:],
            ],
            separators=(",", ":"),
        )[1:-1]
        + "]"
    )
