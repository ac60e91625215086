"""OpenTelemetry: enqueue stores the active span's context; each attempt's span links to it.

Spans are collected with the SDK's in-memory exporter from an in-process worker (the
worker's threads report to this process's tracer provider).
"""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from django_pgqueue.exceptions import InvalidOption
from django_pgqueue.models import Job
from django_pgqueue.states import JobStatus
from django_pgqueue.store import tracing
from django_pgqueue.store.values import JobSpec
from django_pgqueue.worker import Worker, WorkerOptions, execution
from tests import tasks
from tests.workers import wait_for

pytestmark = pytest.mark.timeout(60)

_EXPORTER = InMemorySpanExporter()
FINISHED = (JobStatus.SUCCEEDED, JobStatus.DEAD_LETTER)


def _provider() -> TracerProvider:
    # The global provider can be set once per process: install ours the first time.
    current = trace.get_tracer_provider()
    if isinstance(current, TracerProvider):
        return current
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(_EXPORTER))
    trace.set_tracer_provider(provider)
    return provider


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    _provider()
    _EXPORTER.clear()
    yield _EXPORTER
    _EXPORTER.clear()


def _run_until_finished(*job_ids: int) -> None:
    """Run an in-process worker until every job is succeeded or dead-lettered."""
    options = WorkerOptions.from_settings(handle_signals=False, concurrency=2, poll_interval=0.05)
    worker = Worker(options)
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        wait_for(
            lambda: Job.objects.filter(pk__in=job_ids, status__in=FINISHED).count() == len(job_ids),
            timeout=30,
            message="the jobs to finish",
        )
    finally:
        worker.request_stop()
        thread.join(30)
    assert not thread.is_alive()


def test_enqueue_stores_the_active_span_context(spans, db):
    tracer = trace.get_tracer("tests")
    with tracer.start_as_current_span("request") as request_span:
        result = tasks.add.enqueue(1, 2)
        context = request_span.get_span_context()
    stored = Job.objects.get(pk=int(result.id)).traceparent
    flags = int(context.trace_flags)
    assert stored == f"00-{context.trace_id:032x}-{context.span_id:016x}-{flags:02x}"
    # Outside any span nothing is stored.
    assert Job.objects.get(pk=int(tasks.add.enqueue(1, 2).id)).traceparent is None


def test_enqueue_many_stores_it_for_every_job(spans, db):
    with trace.get_tracer("tests").start_as_current_span("batch") as batch:
        jobs = Job.objects.enqueue_many([JobSpec("tests.tasks.add", args=[i, 1]) for i in range(3)])
        trace_id = f"{batch.get_span_context().trace_id:032x}"
    stored = {job.traceparent for job in Job.objects.filter(pk__in=[j.pk for j in jobs])}
    assert len(stored) == 1
    assert stored.pop().split("-")[1] == trace_id


def test_an_explicit_traceparent_is_validated(db):
    given = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    store = Job.objects.store()
    job = store.enqueue(JobSpec("tests.tasks.add", args=[1, 2], traceparent=given)).job
    assert Job.objects.get(pk=job.pk).traceparent == given
    with pytest.raises(InvalidOption, match="traceparent"):
        store.enqueue(JobSpec("tests.tasks.add", args=[1, 2], traceparent="not-a-traceparent"))
    assert not Job.objects.filter(traceparent="not-a-traceparent").exists()


def test_each_attempt_runs_in_a_span_linked_to_the_enqueue(spans, db_url):
    with trace.get_tracer("tests").start_as_current_span("request") as request_span:
        ok = tasks.add.enqueue(2, 3)
        failing = tasks.always_fails.using(max_attempts=2).enqueue("nope")
        enqueued = request_span.get_span_context()
    _run_until_finished(int(ok.id), int(failing.id))

    attempts = [s for s in spans.get_finished_spans() if s.name.startswith("run ")]
    by_job: dict[int, list] = {}
    for span in attempts:
        by_job.setdefault(span.attributes[tracing.JOB_ID], []).append(span)
    assert sorted(by_job) == sorted([int(ok.id), int(failing.id)])

    (success,) = by_job[int(ok.id)]
    assert success.name == "run tests.tasks.add"
    assert success.kind is SpanKind.CONSUMER
    assert success.attributes[tracing.TASK] == "tests.tasks.add"
    assert success.attributes[tracing.QUEUE] == "default"
    assert success.attributes[tracing.ATTEMPT] == 1
    assert success.attributes[tracing.OUTCOME] == "succeeded"
    assert success.status.status_code is not StatusCode.ERROR
    # Linked to the enqueuing span, not its child: a new trace per attempt.
    assert [link.context.span_id for link in success.links] == [enqueued.span_id]
    assert success.links[0].context.trace_id == enqueued.trace_id
    assert success.parent is None

    failures = sorted(by_job[int(failing.id)], key=lambda s: s.attributes[tracing.ATTEMPT])
    assert [s.attributes[tracing.ATTEMPT] for s in failures] == [1, 2]
    for span in failures:
        assert span.attributes[tracing.OUTCOME] == "failed"
        assert span.status.status_code is StatusCode.ERROR
        (event,) = [e for e in span.events if e.name == "exception"]
        assert event.attributes["exception.type"] == "ValueError"
        assert event.attributes["exception.message"] == "nope"
        assert [link.context.span_id for link in span.links] == [enqueued.span_id]


def test_a_job_enqueued_outside_a_span_gets_an_unlinked_span(spans, db_url):
    job = tasks.add.enqueue(1, 1)
    _run_until_finished(int(job.id))
    (span,) = [s for s in spans.get_finished_spans() if s.name.startswith("run ")]
    assert span.attributes[tracing.JOB_ID] == int(job.id)
    assert span.links == ()


def test_without_opentelemetry_nothing_is_stored_or_made(monkeypatch, spans, db):
    monkeypatch.setattr(tracing, "AVAILABLE", False)
    with trace.get_tracer("tests").start_as_current_span("request"):
        assert tracing.current_traceparent() is None
        result = tasks.add.enqueue(1, 2)
    assert Job.objects.get(pk=int(result.id)).traceparent is None
    spans.clear()
    with tracing.attempt_span(Job.objects.get(pk=int(result.id))) as span:  # type: ignore[arg-type]
        assert span is None
    assert spans.get_finished_spans() == ()


_WITHOUT_AN_SDK = """
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from django_pgqueue.store import tracing

before = tracing.recording()
with tracing.attempt_span(None) as span:
    made = span is not None
trace.set_tracer_provider(TracerProvider())
print(before, made, tracing.recording())
"""


def test_the_worker_asks_for_spans_only_once_an_sdk_is_configured():
    # A fresh interpreter: this process's provider was set by the tests above. Without
    # an SDK no span is made (the worker skips attempt_span); a provider set later is
    # seen at the next ask.
    completed = subprocess.run(
        [sys.executable, "-c", _WITHOUT_AN_SDK],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.split() == ["False", "False", "True"]


def test_attempts_skip_the_span_machinery_without_an_sdk(monkeypatch, db_url):
    # recording() says no: run_sync must not enter attempt_span at all (it would raise).
    def no_span(job):
        raise AssertionError("attempt_span entered without an SDK")

    monkeypatch.setattr(execution, "recording", lambda: False)
    monkeypatch.setattr(execution, "attempt_span", no_span)
    job = tasks.add.enqueue(2, 3)
    _run_until_finished(int(job.id))
    assert Job.objects.get(pk=int(job.id)).status == JobStatus.SUCCEEDED
