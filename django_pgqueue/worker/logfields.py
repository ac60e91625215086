"""The ``extra`` fields of every log record about a job, under stable names.

JSON formatters (python-json-logger, structlog's stdlib bridge) and Sentry's logging
integration copy a record's extra attributes into the event, so a log search by job id
or task finds every line about it. The names are part of the public interface: change
them and dashboards break.
"""

from __future__ import annotations

from typing import Any, Final

from django_pgqueue.store.values import ClaimedJob

__all__ = [
    "ATTEMPT",
    "CLAIM_SECONDS",
    "DURATION",
    "HORIZON_AGE",
    "HORIZON_PID",
    "INTERVAL",
    "JOB_ID",
    "OUTCOME",
    "OUTCOMES",
    "QUEUE",
    "TASK",
    "WORKER",
    "job_extra",
]

JOB_ID: Final = "pgqueue_job_id"
TASK: Final = "pgqueue_task"
QUEUE: Final = "pgqueue_queue"
#: The attempt's number, 1 for the first run.
ATTEMPT: Final = "pgqueue_attempt"
WORKER: Final = "pgqueue_worker"
#: Only on the line that records an attempt's end: "succeeded", "dead-lettered", ...
OUTCOME: Final = "pgqueue_outcome"
#: Only with OUTCOME: the attempt's run time in seconds.
DURATION: Final = "pgqueue_duration_seconds"
#: Only on the worker's summary line: {outcome: attempts} since the previous summary.
OUTCOMES: Final = "pgqueue_outcomes"
#: Only with OUTCOMES: the seconds the summary covers.
INTERVAL: Final = "pgqueue_interval_seconds"
#: On the warning about a slow claim from the head (worker/horizon.py): how long it took,
#: and the pid and seconds open of what holds VACUUM back (None: nothing visible).
CLAIM_SECONDS: Final = "pgqueue_claim_seconds"
HORIZON_PID: Final = "pgqueue_horizon_pid"
HORIZON_AGE: Final = "pgqueue_horizon_age_seconds"


def job_extra(
    job: ClaimedJob, *, outcome: str | None = None, duration: float | None = None
) -> dict[str, Any]:
    """Return the ``extra`` of a log call about ``job`` (and its outcome, if known)."""
    extra: dict[str, Any] = {
        JOB_ID: job.id,
        TASK: job.task_path,
        QUEUE: job.queue,
        ATTEMPT: job.attempts,
        WORKER: job.worker_id,
    }
    if outcome is not None:
        extra[OUTCOME] = outcome
        extra[DURATION] = duration
    return extra
