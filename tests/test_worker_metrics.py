"""runqueueworker --metrics-port: a real worker's metrics, scraped over HTTP and parsed."""

from __future__ import annotations

import socket
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from django_pgqueue.models import Job
from django_pgqueue.states import JobStatus
from tests import tasks
from tests.workers import wait_for

pytestmark = pytest.mark.timeout(120)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def scrape(port: int) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def total(samples, name: str, **labels: str) -> float:
    wanted = set(labels.items())
    return sum(value for (n, got), value in samples.items() if n == name and wanted <= got)


def _serving(port: int):
    try:
        return scrape(port)
    except OSError:
        return None


def _done(count: int) -> bool:
    finished = (JobStatus.SUCCEEDED, JobStatus.DEAD_LETTER)
    return Job.objects.filter(status__in=finished).count() == count


def test_a_worker_serves_its_metrics(workers, observer):
    port = _free_port()
    for index in range(5):
        tasks.add.enqueue(index, 1)
    tasks.always_fails.using(max_attempts=1).enqueue("nope")
    worker = workers("--metrics-port", str(port), "--metrics-addr", "127.0.0.1", "-v2")
    worker.wait_registered(observer)
    wait_for(lambda: _done(6), timeout=60, message="six finished jobs")
    samples = wait_for(
        lambda: (s := _serving(port)) and total(s, "pgqueue_worker_jobs_finished_total") == 6 and s,
        timeout=30,
        message=f"the metrics endpoint\n{worker.output()}",
    )
    add = {"queue": "default", "task": "tests.tasks.add"}
    fails = {"queue": "default", "task": "tests.tasks.always_fails"}
    assert total(samples, "pgqueue_worker_jobs_started_total", **add) == 5
    assert total(samples, "pgqueue_worker_jobs_finished_total", outcome="succeeded", **add) == 5
    assert (
        total(samples, "pgqueue_worker_jobs_finished_total", outcome="dead_lettered", **fails) == 1
    )
    assert total(samples, "pgqueue_worker_job_duration_seconds_count", **add) == 5
    assert total(samples, "pgqueue_worker_job_duration_seconds_bucket", le="+Inf", **add) == 5
    assert total(samples, "pgqueue_worker_claimed_jobs_total") == 6
    assert total(samples, "pgqueue_worker_claim_seconds_count") >= 1
    assert total(samples, "pgqueue_worker_jobs_in_flight") == 0
    assert ("pgqueue_worker_lease_extensions_total", frozenset()) in samples
    assert ("pgqueue_worker_leases_lost_total", frozenset()) in samples


def test_lease_extensions_and_losses_are_counted(workers, observer):
    port = _free_port()
    sleeper = tasks.ledger_sleep.enqueue(seconds=30)
    worker = workers(
        "--metrics-port", str(port), "--metrics-addr", "127.0.0.1", "--lease-seconds", "1.5"
    )
    worker.wait_registered(observer)
    samples = wait_for(
        lambda: (
            (s := _serving(port)) and total(s, "pgqueue_worker_lease_extensions_total") >= 2 and s
        ),
        timeout=30,
        message="two lease extensions",
    )
    assert total(samples, "pgqueue_worker_jobs_in_flight") == 1
    observer.execute(
        "UPDATE django_pgqueue_job SET lease_generation = lease_generation + 1 WHERE id = %s",
        [int(sleeper.id)],
    )
    samples = wait_for(
        lambda: (s := _serving(port)) and total(s, "pgqueue_worker_leases_lost_total") == 1 and s,
        timeout=30,
        message="the lost lease",
    )
    wait_for(
        lambda: total(_serving(port) or {}, "pgqueue_worker_jobs_in_flight") == 0,
        timeout=30,
        message="the abandoned attempt to leave",
    )


def test_processes_are_summed_on_one_port(workers, observer):
    port = _free_port()
    for index in range(40):
        tasks.add.enqueue(index, 1)
    worker = workers("--processes", "2", "--metrics-port", str(port), "--metrics-addr", "127.0.0.1")
    wait_for(lambda: _done(40), timeout=60, message=f"forty jobs\n{worker.output()}")
    samples = wait_for(
        lambda: (
            (s := _serving(port)) and total(s, "pgqueue_worker_jobs_finished_total") == 40 and s
        ),
        timeout=30,
        message="the summed metrics",
    )
    assert total(samples, "pgqueue_worker_jobs_started_total") == 40
    assert total(samples, "pgqueue_worker_job_duration_seconds_count") == 40
    children = {
        pid
        for (pid,) in observer.execute(
            "SELECT pid FROM django_pgqueue_worker WHERE status = 'alive'"
        ).fetchall()
    }
    assert len(children) == 2


def test_a_taken_port_is_a_usage_error(workers):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        worker = workers("--metrics-port", str(port), "--metrics-addr", "127.0.0.1")
        assert worker.wait(60) == 2
    assert f"--metrics-port {port}: cannot listen on 127.0.0.1:{port}" in worker.output()
