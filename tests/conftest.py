"""Shared fixtures: real PostgreSQL connections to the test database.

Tests that need committed data visible to other connections (threads, worker
subprocesses) use ``transactional_db`` through the fixtures below; pytest-django empties
the tables after each of them.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from django.db import connection
from psycopg.conninfo import make_conninfo

from django_pgqueue.store.pgconn import connect
from django_pgqueue.store.queue import QueueStore
from django_pgqueue.store.runners import PsycopgRunner
from django_pgqueue.tools.embedded import EmbeddedPostgresError, with_dbname
from tests import key_indexes
from tests.database import embedded_server, ensure_server, rebuild_embedded_server
from tests.workers import WorkerProcess

#: The test modules of what the supported Django series do differently: the task API
#: (decorator, results, signals, the 5.2 backport), the admin, migrations, checks, and
#: the worker command running real tasks under Django's autoreloader or without it. The
#: Django-version legs of ``.ci/run`` run only these (``-m django_surface``); the SQL,
#: lease and crash tests depend on the server, not on Django, and run in full on both
#: servers' legs.
DJANGO_SURFACE = frozenset(
    {
        "test_admin_actions.py",
        "test_admin_concurrency.py",
        "test_admin_dead_letters.py",
        "test_admin_dependencies.py",
        "test_admin_detail.py",
        "test_admin_edited_schedules.py",
        "test_admin_flow.py",
        "test_admin_formatting.py",
        "test_admin_inbox.py",
        "test_admin_input.py",
        "test_admin_lag.py",
        "test_admin_navigation.py",
        "test_admin_pauses.py",
        "test_admin_permissions.py",
        "test_admin_schedules.py",
        "test_admin_stuck.py",
        "test_admin_unknown_tasks.py",
        "test_admin_workers.py",
        "test_argument_fidelity.py",
        "test_backend.py",
        "test_bulk_validation.py",
        "test_checks.py",
        "test_coalesce.py",
        "test_conf.py",
        "test_dependencies.py",
        "test_documents.py",
        "test_enqueue.py",
        "test_flush_command.py",
        "test_idempotency.py",
        "test_metrics_view.py",
        "test_middleware.py",
        "test_migrations.py",
        "test_not_migrated.py",
        "test_not_postgresql.py",
        "test_operator.py",
        "test_payload.py",
        "test_results.py",
        "test_schedule_checks.py",
        "test_schedule_plan.py",
        "test_task_failures.py",
        "test_task_results.py",
        "test_tracing.py",
        "test_two_databases.py",
        "test_unknown_tasks.py",
        "test_vacuum_horizon.py",
        "test_validation.py",
        "test_worker_inprocess.py",
        "test_worker_jobs.py",
        "test_worker_log_extra.py",
        "test_worker_logging.py",
        "test_worker_reload.py",
        "test_workflows.py",
    }
)


#: The other test modules: the server's side (SQL, leases, crashes, partitions, flow
#: control, the browser, soak). Every module is in exactly one of the two sets, so a new
#: one cannot miss the Django-version legs by being forgotten: it must be placed.
SERVER_SIDE = frozenset(
    {
        "test_adaptive_prefetch.py",
        "test_admin_browser.py",
        "test_admin_browser_cancel.py",
        "test_admin_browser_dependencies.py",
        "test_admin_browser_flow.py",
        "test_admin_browser_pauses.py",
        "test_admin_indexes.py",
        "test_attempt_bookkeeping.py",
        "test_batches.py",
        "test_bookkeeping_locks.py",
        "test_cancel_running.py",
        "test_check_invalid_indexes.py",
        "test_claim.py",
        "test_claim_floors.py",
        "test_claim_rounds.py",
        "test_composition.py",
        "test_composition_workers.py",
        "test_concurrency_claim_cost.py",
        "test_concurrency_limits.py",
        "test_concurrent_index.py",
        "test_embedded.py",
        "test_example_project.py",
        "test_fencing.py",
        "test_flow_floors.py",
        "test_flow_state_claim_cost.py",
        "test_flow_combinations.py",
        "test_history.py",
        "test_history_tiers.py",
        "test_history_upgrade.py",
        "test_housekeeping.py",
        "test_indexes.py",
        "test_invariants.py",
        "test_lease_loss_races.py",
        "test_lock_order.py",
        "test_metrics_indexes.py",
        "test_migration_interrupted.py",
        "test_module_sets.py",
        "test_newest_version.py",
        "test_outcome_storage.py",
        "test_packaging.py",
        "test_partition_claim_cost.py",
        "test_partition_liveness.py",
        "test_partition_ring.py",
        "test_partition_state.py",
        "test_partitions.py",
        "test_prepared_statements.py",
        "test_pause.py",
        "test_pgbouncer.py",
        "test_plain_claim.py",
        "test_public_names.py",
        "test_architecture.py",
        "test_queuebench.py",
        "test_queuehealth.py",
        "test_rate_limits.py",
        "test_reaper.py",
        "test_recorder.py",
        "test_refresh_bounds.py",
        "test_key_fold_order.py",
        "test_key_tables.py",
        "test_refresh_bounds_upgrade.py",
        "test_fold_keys_upgrade.py",
        "test_claim_key_upgrade.py",
        "test_statement_scaling.py",
        "test_segments.py",
        "test_schedule_cadence.py",
        "test_schedule_firing.py",
        "test_schedule_limits.py",
        "test_schedule_runtime_edits.py",
        "test_schedule_sync_wait.py",
        "test_schedule_workers.py",
        "test_snooze.py",
        "test_sql_enqueue.py",
        "test_soak.py",
        "test_soak_faults.py",
        "test_sql_files.py",
        "test_state_model.py",
        "test_stuck_handlers.py",
        "test_stop_signals.py",
        "test_timed_out_handlers.py",
        "test_transient_errors.py",
        "test_worker_crashes.py",
        "test_worker_faults.py",
        "test_worker_hot_path.py",
        "test_worker_metrics.py",
        "test_worker_partitions.py",
        "test_worker_registry.py",
        "test_worker_shutdown.py",
        "test_worker_supervisor.py",
        "test_worker_wakeup.py",
    }
)


def pytest_configure(config: pytest.Config) -> None:
    """Check that every test module is in exactly one of :data:`DJANGO_SURFACE` and
    :data:`SERVER_SIDE`, then start the embedded server (unless DATABASE_URL is set)
    before any test connects."""
    check_module_sets(Path(__file__).parent)
    ensure_server()


def check_module_sets(tests: Path) -> None:
    """Raise a UsageError naming any test module not placed, placed twice, or gone."""
    # A renamed or new module would otherwise drop out of the Django-version legs unnoticed.
    present = {path.name for path in tests.glob("test_*.py")}
    problems = {
        "in neither DJANGO_SURFACE nor SERVER_SIDE": present - DJANGO_SURFACE - SERVER_SIDE,
        "in both DJANGO_SURFACE and SERVER_SIDE": DJANGO_SURFACE & SERVER_SIDE,
        "listed but missing": (DJANGO_SURFACE | SERVER_SIDE) - present,
    }
    found = [f"{what}: {sorted(names)}" for what, names in problems.items() if names]
    if found:
        raise pytest.UsageError("tests/conftest.py's module sets: " + "; ".join(found))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark the tests of :data:`DJANGO_SURFACE` modules ``django_surface``."""
    for item in items:
        if item.path.name in DJANGO_SURFACE:
            item.add_marker(pytest.mark.django_surface)


@pytest.fixture(autouse=True)
def _server_left_running(request: pytest.FixtureRequest) -> Iterator[None]:
    """After a test that restarts the suite's own server, make sure it runs again.

    Such a test fails on its own when a restart goes wrong; without this, every test
    after it would fail too and hide which one broke the server.
    """
    yield
    restarts_ours = request.node.get_closest_marker("server_control") or (
        request.node.get_closest_marker("soak") and not os.environ.get("DATABASE_URL")
    )
    if restarts_ours:
        server = embedded_server()
        if not server.is_running():
            try:
                server.start()
            except EmbeddedPostgresError as exc:
                rebuild_embedded_server()
                pytest.fail(
                    f"{request.node.nodeid} left the embedded PostgreSQL unable to start; "
                    f"its data folder was rebuilt for the tests that follow:\n{exc}"
                )
            pytest.fail(f"{request.node.nodeid} left the embedded PostgreSQL stopped; restarted it")


@pytest.fixture
def db_url(transactional_db: None) -> str:
    """Return a libpq URL of the test database (data committed by tests is visible)."""
    settings = connection.settings_dict
    params = {
        "host": settings["HOST"] or "",
        "port": str(settings["PORT"] or ""),
        "user": settings["USER"] or "",
        "password": settings["PASSWORD"] or "",
    }
    base = make_conninfo(**{k: v for k, v in params.items() if v})
    return with_dbname(base, settings["NAME"])


@pytest.fixture
def open_connection(transactional_db: None) -> Iterator[Callable[..., psycopg.Connection[Any]]]:
    """Return a factory of dedicated autocommit connections, all closed at teardown."""
    opened: list[psycopg.Connection[Any]] = []

    def factory(**kwargs: Any) -> psycopg.Connection[Any]:
        conn = connect("default", **kwargs)
        opened.append(conn)
        return conn

    yield factory
    for conn in opened:
        conn.close()


@pytest.fixture
def store(open_connection: Callable[..., psycopg.Connection[Any]]) -> QueueStore:
    """Return a QueueStore on its own autocommit connection (like a worker's)."""
    return QueueStore(PsycopgRunner(open_connection(), "default"))


@pytest.fixture
def without_unique_indexes(observer: psycopg.Connection[Any]) -> Iterator[None]:
    """The job table without pgq_job_idempotency_key and pgq_job_coalesce_key (and the
    coalesced enqueue's clause naming one), as a segmented job table will be."""
    with key_indexes.without_unique_indexes(observer):
        yield


@pytest.fixture
def make_store(
    open_connection: Callable[..., psycopg.Connection[Any]],
) -> Callable[[], QueueStore]:
    """Return a factory of QueueStores, each on its own connection."""
    return lambda: QueueStore(PsycopgRunner(open_connection(), "default"))


@pytest.fixture
def workers(db_url: str) -> Iterator[Callable[..., WorkerProcess]]:
    """Return a factory of worker subprocesses on the test database, stopped at teardown."""
    started: list[WorkerProcess] = []

    def start(*args: str, **kwargs: Any) -> WorkerProcess:
        worker = WorkerProcess(db_url, *args, **kwargs)
        started.append(worker)
        return worker

    yield start
    for worker in started:
        worker.stop()
        # Captured by pytest and shown only when the test failed: what each worker logged.
        print(f"--- worker {worker.pid} ({' '.join(worker.args)}) ---\n{worker.output()}")


@pytest.fixture
def observer(open_connection: Callable[..., psycopg.Connection[Any]]) -> psycopg.Connection[Any]:
    """Return an autocommit connection for the test's own reads and writes."""
    return open_connection(prepare=False)
