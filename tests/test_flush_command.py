"""The test project's ``flush`` (tests/management/commands/flush.py) leaves the database as
Django's own does: every table empty but what ``post_migrate`` makes, and that made again
when a test changed it. It is what empties the tables after every transactional test, so
a difference here would leak rows from one test into the next.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.contrib.auth.models import Permission
from django.core.management import call_command
from django.core.management.commands.flush import Command as DjangoFlush
from django.db import connection
from django.db.models.signals import post_migrate

from django_pgqueue.models import SqlSettings
from django_pgqueue.store.values import JobSpec

pytestmark = pytest.mark.timeout(120)


def _flush() -> None:
    call_command("flush", verbosity=0, interactive=False, reset_sequences=False)


def _django_flush() -> None:
    call_command(DjangoFlush(), verbosity=0, interactive=False, reset_sequences=False)


def _rows() -> dict[str, int]:
    """Every Django table's row count."""
    tables = connection.introspection.django_table_names(only_existing=True, include_views=False)
    with connection.cursor() as cursor:
        counts = {}
        for table in tables:
            cursor.execute(f'SELECT count(*) FROM "{table}"')
            counts[table] = cursor.fetchone()[0]
    return counts


def _made() -> tuple[set[tuple[str, str]], Any]:
    """What ``post_migrate`` writes, without the ids a new row gets."""
    permissions = set(Permission.objects.values_list("content_type__app_label", "codename"))
    settings = SqlSettings.objects.values().get()
    settings.pop("synced_at", None)
    return permissions, settings


@pytest.fixture
def post_migrates() -> Iterator[list[str]]:
    sent: list[str] = []

    def receiver(*, using: str, **kwargs: Any) -> None:
        sent.append(using)

    post_migrate.connect(receiver, dispatch_uid="tests.flush_command")
    yield sent
    post_migrate.disconnect(dispatch_uid="tests.flush_command")


def _dirty(store: Any) -> None:
    """What a test leaves: jobs (live and finished), a permission gone, a settings change."""
    job = store.enqueue(JobSpec(task_path="tests.tasks.noop"))
    store.enqueue(JobSpec(task_path="tests.tasks.noop"))
    store.cancel([job.id])
    Permission.objects.filter(codename="view_job").delete()
    SqlSettings.objects.update(synced_by="a test")


def test_it_empties_what_a_test_wrote_and_makes_post_migrate_rows_again(store, post_migrates):
    _flush()
    expected_rows, expected_made = _rows(), _made()
    _dirty(store)
    assert _rows() != expected_rows
    _flush()
    assert _rows() == expected_rows
    assert _made() == expected_made
    assert post_migrates, "post_migrate must be sent when a test changed what it makes"
    # The job table and the history partition the cancelled job went to held rows:
    # truncated, they hold no page, as after Django's flush.
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_relation_size('django_pgqueue_job')")
        assert cursor.fetchone()[0] == 0
        cursor.execute(
            "SELECT count(*) FROM pg_partition_tree('django_pgqueue_job_history') "
            "WHERE isleaf AND pg_relation_size(relid) > 0"
        )
        assert cursor.fetchone()[0] == 0


def test_it_leaves_the_same_rows_as_djangos_flush(store):
    _dirty(store)
    _django_flush()
    django_rows, django_made = _rows(), _made()
    _dirty(store)
    _flush()
    assert _rows() == django_rows
    assert _made() == django_made


def test_without_changes_to_what_post_migrate_makes_it_sends_no_post_migrate(store, post_migrates):
    _flush()
    post_migrates.clear()
    store.enqueue(JobSpec(task_path="tests.tasks.noop"))
    _flush()
    assert post_migrates == []
    assert _rows()["django_pgqueue_job"] == 0
    assert Permission.objects.filter(codename="view_job").exists()


def test_a_changed_settings_row_alone_is_made_again(store, post_migrates):
    _flush()
    before = _made()
    SqlSettings.objects.update(synced_by="a test")
    post_migrates.clear()
    _flush()
    assert post_migrates
    assert _made() == before
