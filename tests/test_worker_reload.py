"""``runqueueworker --reload``: a changed task module restarts the worker with the new code.

A real ``runqueueworker --reload`` subprocess (Django's autoreloader: a parent process
and a child running the worker), a task module of the test's own in a temporary folder,
and an edit to it while the worker runs.
"""

from __future__ import annotations

import importlib
import os
import sys
import uuid
from pathlib import Path

import pytest

from django_pgqueue.compat import TaskResultStatus, task_backends
from tests.workers import wait_for

pytestmark = pytest.mark.timeout(120)

TASK_MODULE = """
from django_pgqueue import task


@task()
def code_version():
    return {version!r}
"""


def _write(path: Path, version: str, mtime: float) -> None:
    path.write_text(TASK_MODULE.format(version=version))
    # A later mtime every time: the reloader compares them, and a cached .pyc with the
    # same second and size would be loaded instead of the new source.
    os.utime(path, (mtime, mtime))


def _result(result_id: str):
    result = task_backends["default"].get_result(result_id)
    return result if result.status == TaskResultStatus.SUCCESSFUL else None


def test_a_changed_task_module_restarts_the_worker_with_the_new_code(
    workers, tmp_path, monkeypatch
):
    name = f"reload_probe_{uuid.uuid4().hex[:8]}"
    source = tmp_path / f"{name}.py"
    mtime = source.parent.stat().st_mtime
    _write(source, "first", mtime)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), *sys.path]))
    probe = importlib.import_module(name)

    worker = workers("--reload", "--poll-interval", "0.1")
    first = probe.code_version.enqueue()
    # The worker imports the module for this job; from then on the reloader watches it.
    assert wait_for(lambda: _result(first.id), timeout=60).return_value == "first"
    assert worker.output().count("started: queues=") == 1

    edits = iter(range(1, 1000))

    def edit_and_see_restart() -> bool:
        # The reloader snapshots mtimes once a second: edit until it notices.
        _write(source, "second", mtime + next(edits))
        return worker.output().count("started: queues=") == 2

    wait_for(edit_and_see_restart, timeout=60, interval=0.5, message="the worker to restart")
    output = worker.output()
    assert f"{source} changed: restarting the worker" in output
    assert "stopped after 1 jobs" in output
    assert worker.process.poll() is None  # the parent lives on across restarts

    second = probe.code_version.enqueue()
    assert wait_for(lambda: _result(second.id), timeout=60).return_value == "second"


def test_reload_and_processes_do_not_mix(workers):
    worker = workers("--reload", "--processes", "2")
    assert worker.wait() == 2
    assert "--reload cannot be combined with --processes" in worker.output()
