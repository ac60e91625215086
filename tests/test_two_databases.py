"""Past one PostgreSQL: two TASKS backends on two databases, each served by its own worker.

No job crosses: each worker claims only from its backend's database, registers only
there, and the metrics view reports both databases in one scrape.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import psycopg
import pytest
from django.db import connections
from django.test import override_settings
from prometheus_client.parser import text_string_to_metric_families

from django_pgqueue.exceptions import DependencyInOtherDatabase
from django_pgqueue.models import Job
from django_pgqueue.store.values import JobSpec
from django_pgqueue.tools.embedded import database_settings
from tests import tasks
from tests.admin_fixtures import login
from tests.database import REPO
from tests.scratch import scratch_database

pytestmark = pytest.mark.timeout(180)

TWO_BACKENDS = {
    "default": {
        "BACKEND": "django_pgqueue.backend.PgQueueBackend",
        "QUEUES": ["default", "emails", "reports", "high", "low"],
    },
    "second": {
        "BACKEND": "django_pgqueue.backend.PgQueueBackend",
        "QUEUES": ["default", "emails"],
        "OPTIONS": {"DATABASE": "second"},
    },
}


@pytest.fixture
def second_url(db_url, django_db_blocker) -> Iterator[str]:
    """Return a migrated second database, also configured as alias ``second`` here."""
    with scratch_database("second") as url:
        env = {**os.environ, "DATABASE_URL": url, "DJANGO_SETTINGS_MODULE": "tests.settings"}
        subprocess.run(
            [sys.executable, "-m", "tests.manage", "migrate", "-v0"],
            cwd=REPO,
            env=env,
            check=True,
            timeout=120,
        )
        extra = connections.configure_settings(
            {
                "default": dict(connections.settings["default"]),
                "second": database_settings(url),
            }
        )
        connections.settings["second"] = extra["second"]
        with django_db_blocker.unblock():
            yield url
            connections["second"].close()
        del connections["second"]
        del connections.settings["second"]


def _jobs(url: str) -> list[tuple[list[int], str, str]]:
    with psycopg.connect(url) as conn:
        return conn.execute(
            "SELECT args, status, claimed_by FROM django_pgqueue_job_all ORDER BY id"
        ).fetchall()


def _workers(url: str) -> set[str]:
    with psycopg.connect(url) as conn:
        return {row[0] for row in conn.execute("SELECT id FROM django_pgqueue_worker")}


def test_each_database_is_served_by_its_own_workers(
    db_url, second_url, workers, monkeypatch, client
):
    with override_settings(TASKS=TWO_BACKENDS):
        for index in range(30):
            tasks.add.using(backend="default").enqueue(index, 1)
        for index in range(100, 120):
            tasks.add.using(backend="second").enqueue(index, 1)

        # The worker subprocesses see the second database through this variable.
        monkeypatch.setenv("PGQUEUE_TEST_SECOND_DATABASE_URL", second_url)
        first = workers("--backend", "default", "--burst", "--concurrency", "4")
        second = workers("--backend", "second", "--burst", "--concurrency", "4")
        assert first.wait(90) == 0, first.output()
        assert second.wait(90) == 0, second.output()

        first_jobs, second_jobs = _jobs(db_url), _jobs(second_url)
        assert sorted(args[0] for args, _, _ in first_jobs) == list(range(30))
        assert sorted(args[0] for args, _, _ in second_jobs) == list(range(100, 120))
        assert {status for _, status, _ in first_jobs + second_jobs} == {"succeeded"}
        first_ids, second_ids = _workers(db_url), _workers(second_url)
        assert len(first_ids) == len(second_ids) == 1
        assert {claimed_by for _, _, claimed_by in first_jobs} == first_ids
        assert {claimed_by for _, _, claimed_by in second_jobs} == second_ids
        assert first_ids != second_ids

        # One scrape reports both databases.
        login(client)
        response = client.get("/metrics/")
        assert response.status_code == 200
        databases = {
            sample.labels["database"]
            for family in text_string_to_metric_families(response.content.decode())
            if family.name == "pgqueue_jobs"
            for sample in family.samples
        }
        assert databases == {"default", "second"}


def test_after_a_job_of_the_other_database_is_refused_naming_both(db_url, second_url):
    with override_settings(TASKS=TWO_BACKENDS):
        elsewhere = tasks.noop.using(backend="second").enqueue()
        other_job = Job.objects.using("second").get(pk=int(elsewhere.id))
        before = len(_jobs(db_url)), len(_jobs(second_url))
        # The same id may well name a job here: it must not be linked to.
        Job.objects.enqueue("tests.tasks.noop")
        before = (before[0] + 1, before[1])
        with pytest.raises(DependencyInOtherDatabase) as raised:
            tasks.noop.using(backend="default", after=[elsewhere]).enqueue()
        assert (raised.value.blocker_alias, raised.value.alias) == ("second", "default")
        assert "'second'" in str(raised.value)
        assert "'default'" in str(raised.value)
        with pytest.raises(DependencyInOtherDatabase):
            Job.objects.enqueue("tests.tasks.noop", after=[other_job])
        # A batch is checked whole before its first job is written.
        with pytest.raises(DependencyInOtherDatabase):
            Job.objects.enqueue_many(
                [JobSpec("tests.tasks.noop"), JobSpec("tests.tasks.noop", after=[other_job])]
            )
        assert (len(_jobs(db_url)), len(_jobs(second_url))) == before
        # On its own database it is fine.
        tasks.noop.using(backend="second", after=[elsewhere]).enqueue()
        assert len(_jobs(second_url)) == before[1] + 1
