"""manage.py queuehealth: probes against a real worker, a stopped database, a bare one."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys

import pytest

from django_pgqueue import pause_queue
from tests.database import REPO
from tests.scratch import scratch_database
from tests.workers import wait_for

pytestmark = pytest.mark.timeout(120)

FAST_WORKER = {"HEARTBEAT_SECONDS": 0.2, "LEASE_SECONDS": 2.0, "WORKER_TIMEOUT_SECONDS": 2.0}


def probe(db_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Run queuehealth against ``db_url`` in a process of its own."""
    env = {**os.environ, "DATABASE_URL": db_url, "DJANGO_SETTINGS_MODULE": "tests.settings"}
    return subprocess.run(
        [sys.executable, "-m", "tests.manage", "queuehealth", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _one_failure_line(result: subprocess.CompletedProcess[str], probe_name: str) -> str:
    assert result.returncode == 1, result
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"{probe_name}: FAIL "), lines[0]
    return lines[0]


def test_readiness_passes_on_a_migrated_database(db_url):
    result = probe(db_url, "--readiness")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "readiness: ok database 'default' is reachable and migrated"


def test_readiness_names_paused_queues_and_still_passes(db_url):
    pause_queue("emails", by="oncall")
    result = probe(db_url, "--readiness")
    assert result.returncode == 0, result.stderr
    line = result.stdout.strip()
    assert line.startswith(
        "readiness: ok database 'default' is reachable and migrated; paused queues: emails (since "
    ), line
    assert line.endswith(" by oncall)"), line


def test_readiness_fails_while_the_database_is_unreachable():
    url = f"postgresql://postgres@127.0.0.1:{_free_port()}/nothing_listens_here"
    line = _one_failure_line(probe(url, "--readiness"), "readiness")
    assert "database 'default' is unreachable: " in line


def test_readiness_fails_without_the_queue_tables():
    with scratch_database("health_bare") as url:
        line = _one_failure_line(probe(url, "--readiness"), "readiness")
    assert "lacks the queue's tables (" in line
    assert "django_pgqueue_job" in line
    assert line.endswith("run manage.py migrate --database default")


def test_readiness_fails_with_a_migration_missing():
    with scratch_database("health_behind") as url:
        env = {**os.environ, "DATABASE_URL": url, "DJANGO_SETTINGS_MODULE": "tests.settings"}
        # Every table there, the newest migration not recorded as applied (a deploy whose
        # migrate step has not run yet, once the tables of earlier releases exist).
        for args in (["django_pgqueue"], ["django_pgqueue", "0011", "--fake"]):
            subprocess.run(
                [sys.executable, "-m", "tests.manage", "migrate", "-v0", *args],
                cwd=REPO,
                env=env,
                check=True,
                timeout=90,
            )
        line = _one_failure_line(probe(url, "--readiness"), "readiness")
    assert "has unapplied django_pgqueue migrations (0012_schedule_limits" in line


def test_liveness_follows_a_real_worker(workers, db_url, observer):
    assert "no live worker of host" in _one_failure_line(probe(db_url, "--liveness"), "liveness")

    worker = workers(settings=FAST_WORKER)
    worker_id = worker.wait_registered(observer)
    result = probe(db_url, "--liveness", "--timeout", "2")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"liveness: ok worker '{worker_id}' heartbeated ")
    assert probe(db_url, "--liveness", "--worker-id", worker_id).returncode == 0

    # Hung: the process still runs but no longer heartbeats.
    worker.send(signal.SIGSTOP)
    wait_for(
        lambda: observer.execute(
            "SELECT now() - last_seen_at > interval '2 seconds' "
            "FROM django_pgqueue_worker WHERE id = %s",
            [worker_id],
        ).fetchone()[0],
        timeout=30,
        message="the stopped worker's heartbeat to age",
    )
    line = _one_failure_line(probe(db_url, "--liveness", "--timeout", "2"), "liveness")
    assert f"worker '{worker_id}' (pid {worker.pid}) has not heartbeated for" in line
    line = _one_failure_line(
        probe(db_url, "--liveness", "--timeout", "2", "--worker-id", worker_id), "liveness"
    )
    assert f"worker '{worker_id}' has not heartbeated within 2s (last: " in line

    # Gone (killed while stopped, so it never heartbeats again): its registry row still
    # says alive until housekeeping marks it dead, and no process of that pid is left.
    worker.kill()
    line = _one_failure_line(probe(db_url, "--liveness", "--timeout", "2"), "liveness")
    assert f"no worker of host '{socket.gethostname()}' has heartbeated within 2s" in line
    line = _one_failure_line(probe(db_url, "--liveness", "--worker-id", "web-9:1:abc"), "liveness")
    assert line == "liveness: FAIL worker 'web-9:1:abc' is not registered or is dead"


def test_liveness_passes_while_the_database_is_unreachable():
    url = f"postgresql://postgres@127.0.0.1:{_free_port()}/nothing_listens_here"
    result = probe(url, "--liveness")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("liveness: ok cannot tell (database 'default' is unreachable")


def test_both_probes_by_default(db_url):
    result = probe(db_url)
    assert result.returncode == 1
    assert result.stderr.startswith("liveness: FAIL no live worker of host")


def test_an_unknown_backend_is_a_usage_error(db_url):
    result = probe(db_url, "--backend", "nope")
    assert result.returncode == 2
    assert "no TASKS backend named 'nope'" in result.stderr
