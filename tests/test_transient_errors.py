"""A deadlock victim, a lock timeout or a serialization failure is retried on the same
connection; only a lost connection is reconnected.

psycopg makes every one of those errors an ``OperationalError``, as it does a lost
connection, so a handler of ``CONNECTION_ERRORS`` placed first catches them all: the
worker then closed a healthy session, forgot its claim floors and logged "connection
lost" for a deadlock. The errors here are raised by the server itself.
"""

from __future__ import annotations

import ast
import logging
import threading
from pathlib import Path

import psycopg
import pytest

import django_pgqueue
from django_pgqueue.store.queue import QueueStore
from django_pgqueue.worker.connection import ConnectionSlot
from django_pgqueue.worker.housekeeping import Housekeeper
from tests.workers import wait_for

pytestmark = pytest.mark.timeout(60)

PACKAGE = Path(django_pgqueue.__file__).parent


def _raise_sqlstate(store: QueueStore, sqlstate: str) -> None:
    store.runner.connection.execute(
        f"DO $$ BEGIN RAISE EXCEPTION 'injected' USING ERRCODE = '{sqlstate}'; END $$"
    )


def _names(node: ast.expr | None) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)} if node else set()


def test_every_handler_of_transient_errors_comes_before_one_of_connection_errors():
    misplaced = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.Try):
                continue
            caught = [_names(handler.type) for handler in node.handlers]
            connection = [i for i, names in enumerate(caught) if "CONNECTION_ERRORS" in names]
            transient = [i for i, names in enumerate(caught) if "TRANSIENT_ERRORS" in names]
            if connection and transient and min(transient) > min(connection):
                misplaced.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    assert not misplaced, f"CONNECTION_ERRORS caught before TRANSIENT_ERRORS at {misplaced}"


@pytest.mark.parametrize(
    ("sqlstate", "error"),
    [
        ("40P01", psycopg.errors.DeadlockDetected),
        ("55P03", psycopg.errors.LockNotAvailable),
        ("40001", psycopg.errors.SerializationFailure),
        ("57014", psycopg.errors.QueryCanceled),
    ],
)
def test_a_transient_error_keeps_the_slots_connection(transactional_db, sqlstate, error):
    slot = ConnectionSlot("default", "test-transient")
    try:
        pid = slot.connection.info.backend_pid
        with pytest.raises(error):
            slot.run(lambda store: _raise_sqlstate(store, sqlstate))
        assert slot.connection.info.backend_pid == pid
        assert slot.run(lambda store: store.runner.connection.execute("SELECT 1").fetchone()) == (
            1,
        )
    finally:
        slot.close()


def test_a_lost_connection_is_reopened(transactional_db):
    slot = ConnectionSlot("default", "test-transient")
    try:
        pid = slot.connection.info.backend_pid
        with pytest.raises(psycopg.OperationalError):
            slot.run(
                lambda store: store.runner.connection.execute(
                    "SELECT pg_terminate_backend(pg_backend_pid())"
                )
            )
        assert slot.connection.info.backend_pid != pid
    finally:
        slot.close()


def test_housekeeping_retries_a_deadlock_victim_on_the_same_connection(
    transactional_db, monkeypatch, caplog
):
    fold = QueueStore.fold_lazy_signals
    raised = threading.Event()

    def deadlocked_once(store: QueueStore, **kwargs: object) -> tuple[int, int]:
        if not raised.is_set():
            raised.set()
            _raise_sqlstate(store, "40P01")
        return fold(store, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(QueueStore, "fold_lazy_signals", deadlocked_once)
    housekeeper = Housekeeper(
        alias="default", interval=0.1, worker_timeout=30, name="test-transient"
    )
    pid = housekeeper._slot.connection.info.backend_pid
    caplog.set_level(logging.WARNING, logger="django_pgqueue.worker")
    housekeeper.start()
    try:
        wait_for(lambda: housekeeper.passes >= 1, timeout=30, message="a housekeeping pass")
        after = housekeeper._slot.connection.info.backend_pid
    finally:
        housekeeper.stop()
        housekeeper.join(10)
    assert raised.is_set()
    messages = [record.getMessage() for record in caplog.records]
    assert any(
        m.startswith("housekeeping: injected") and m.endswith("; retrying") for m in messages
    ), messages
    assert not any("connection lost" in m for m in messages), messages
    assert after == pid
