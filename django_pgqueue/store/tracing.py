"""OpenTelemetry: the enqueuing span's context travels with the job to every attempt.

With ``opentelemetry-api`` installed (the ``otel`` extra) and a span active at enqueue,
the job stores the span's W3C ``traceparent``. The worker runs each attempt in a span of
its own (kind CONSUMER), linked to that context (a link, not a parent: an attempt may
start hours later and there may be several), with the task, queue, job id, attempt and
outcome as attributes and the handler's exception recorded.

Without the package every function here returns at once: no import is attempted again,
no span is made.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from django_pgqueue.store.values import ClaimedJob

try:
    from opentelemetry import trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError:  # the otel extra is not installed
    AVAILABLE = False
else:
    AVAILABLE = True
    # W3C trace context whatever the project's global propagator: the column holds a
    # traceparent header and nothing else.
    _PROPAGATOR = TraceContextTextMapPropagator()
    # The providers the API hands out while no SDK is configured.
    _NO_SDK = (trace.ProxyTracerProvider, trace.NoOpTracerProvider)

_sdk_seen = False

__all__ = [
    "ATTEMPT",
    "AVAILABLE",
    "JOB_ID",
    "OUTCOME",
    "QUEUE",
    "TASK",
    "attempt_span",
    "current_traceparent",
    "record_exception",
    "recording",
    "set_outcome",
]

#: Span attribute names (besides OpenTelemetry's messaging.* conventions).
TASK = "pgqueue.task"
QUEUE = "pgqueue.queue"
JOB_ID = "pgqueue.job_id"
ATTEMPT = "pgqueue.attempt"
OUTCOME = "pgqueue.outcome"


def current_traceparent() -> str | None:
    """Return the active span's W3C ``traceparent``; None without a valid span or the API."""
    if not AVAILABLE:
        return None
    if not trace.get_current_span().get_span_context().is_valid:
        return None
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier)
    return carrier.get("traceparent")


def recording() -> bool:
    """Whether an SDK is configured, so that :func:`attempt_span` makes real spans.

    The worker asks before every attempt and skips :func:`attempt_span` (a generator
    context manager) when the answer is no: without an SDK every span would be a no-op,
    yet building one (links, attributes, context tokens) costs more than a short job. A
    provider set later is seen at the next attempt; once one is seen the answer stays
    yes (OpenTelemetry's global provider cannot be unset), and the API is not asked
    again (asking reads the environment while no provider is set).
    """
    global _sdk_seen  # noqa: PLW0603 (set once, read on every attempt)
    if not AVAILABLE:
        return False
    if _sdk_seen:
        return True
    if isinstance(trace.get_tracer_provider(), _NO_SDK):
        return False
    _sdk_seen = True
    return True


@contextmanager
def attempt_span(job: ClaimedJob) -> Iterator[Any]:
    """Run the block in a span for one attempt of ``job`` (yields None without an SDK)."""
    if not recording():
        yield None
        return
    links = []
    if job.traceparent:
        context = _PROPAGATOR.extract({"traceparent": job.traceparent})
        enqueued = trace.get_current_span(context).get_span_context()
        if enqueued.is_valid:
            links.append(trace.Link(enqueued))
    tracer = trace.get_tracer("django_pgqueue")
    with tracer.start_as_current_span(
        f"run {job.task_path}",
        kind=trace.SpanKind.CONSUMER,
        links=links,
        attributes={
            TASK: job.task_path,
            QUEUE: job.queue,
            JOB_ID: job.id,
            ATTEMPT: job.attempts,
            "messaging.system": "pgqueue",
            "messaging.operation.type": "process",
            "messaging.destination.name": job.queue,
            "messaging.message.id": str(job.id),
        },
    ) as span:
        yield span


def set_outcome(span: Any, outcome: str) -> None:
    """Record the attempt's outcome on ``span`` (from :func:`attempt_span`; None: nothing)."""
    if span is not None:
        span.set_attribute(OUTCOME, outcome)


def record_exception(error: BaseException) -> None:
    """Record ``error`` on the current span and mark it failed (no-op without the API)."""
    if not AVAILABLE:
        return
    span = trace.get_current_span()
    if span.is_recording():
        span.record_exception(error)
        span.set_status(trace.Status(trace.StatusCode.ERROR, type(error).__name__))
