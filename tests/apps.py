"""The test app: connects a signal receiver used by the crash tests."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

from django.apps import AppConfig


class TestsConfig(AppConfig):
    name = "tests"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django_pgqueue.compat import task_finished, task_started

        task_finished.connect(_die_after_return, dispatch_uid="tests.die_after_return")
        task_finished.connect(_linger_after_return, dispatch_uid="tests.linger_after_return")
        task_started.connect(_record_signal, dispatch_uid="tests.record_started")
        task_finished.connect(_record_signal, dispatch_uid="tests.record_finished")


def _die_after_return(sender: Any, task_result: Any, **kwargs: Any) -> None:
    # task_finished fires after the handler returned and before the worker records the
    # outcome: killing the process here is "kill -9 between handler and completion".
    if task_result.task.name == "ledger_die_after_return" and task_result.attempts == 1:
        os.kill(os.getpid(), signal.SIGKILL)


def _linger_after_return(sender: Any, task_result: Any, **kwargs: Any) -> None:
    # A slow task_finished receiver: the outcome reaches the dispatcher this much later
    # than the handler returned (for an atomic task, than its transaction committed).
    if task_result.task.name == "ledger_atomic_step_hold":
        time.sleep(task_result.kwargs.get("linger_after_return", 0))


def _record_signal(sender: Any, task_result: Any, signal: Any, **kwargs: Any) -> None:
    if not task_result.task.name.startswith("signal_"):
        return
    from django_pgqueue.compat import task_started
    from tests import ledger

    event = "signal:started" if signal is task_started else "signal:finished"
    ledger.write(
        int(task_result.id), event, attempt=task_result.attempts, label=str(task_result.status)
    )
