"""``runqueueworker --reload``: a changed task module restarts the worker with the new code.

A real ``runqueueworker --reload`` subprocess (Django's autoreloader: a parent process
and a child running the worker), a task module of the test's own in a temporary folder,
and an edit to it while the worker runs.
"""

from __future__ import annotations

import importlib
import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from django_pgqueue.compat import TaskResultStatus, task_backends
from django_pgqueue.models import Job
from tests.database import REPO
from tests.workers import wait_for

pytestmark = [pytest.mark.timeout(120), pytest.mark.one_server]

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


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_signal_drains_the_reloading_worker(workers, observer, signum):
    # SIGTERM to the parent alone (docker stop, kill), or SIGINT to the whole process
    # group (Ctrl-C in a terminal): either way the running job finishes and is recorded,
    # instead of the child being SIGKILLed and the job waiting out its lease.
    worker = workers("--reload", "--poll-interval", "0.1", "--grace-seconds", "30")
    job = Job.objects.enqueue("tests.tasks.ledger_sleep", kwargs={"seconds": 2.0})
    wait_for(
        lambda: observer.execute(
            "SELECT 1 FROM tests_ledgerentry WHERE job_id = %s AND event = 'start'", [job.id]
        ).fetchone(),
        timeout=60,
        message="the job to start",
    )
    if signum == signal.SIGINT:
        os.killpg(worker.pid, signum)
    else:
        worker.send(signum)
    assert worker.wait(60) == 0
    assert observer.execute(
        "SELECT status FROM django_pgqueue_job_all WHERE id = %s", [job.id]
    ).fetchone() == ("succeeded",)
    events = [
        row[0]
        for row in observer.execute(
            "SELECT event FROM tests_ledgerentry WHERE job_id = %s ORDER BY id", [job.id]
        ).fetchall()
    ]
    assert events == ["start", "end"]
    output = worker.output()
    assert "stopped after 1 jobs" in output
    assert output.count("started: queues=") == 1


RELOAD_SETTINGS = """
from tests.settings import *  # noqa: F403

INSTALLED_APPS = [*INSTALLED_APPS, {app!r}]  # noqa: F405
ROOT_URLCONF = "{app}.urls"
"""
# Like the tutorial's shop: the URLs import the views, the views the tasks, so the system
# checks import the task module before any job runs.
RELOAD_URLS = """
from . import tasks  # noqa: F401

urlpatterns = []
"""
BROKEN_TASKS = """
from django_pgqueue import task


@task()
def code_version(:
    return "broken"
"""


def test_a_syntax_error_keeps_the_worker_watching_and_the_fix_restarts_it(
    db_url, tmp_path, observer
):
    app = f"reload_app_{uuid.uuid4().hex[:8]}"
    package = tmp_path / app
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "urls.py").write_text(RELOAD_URLS)
    tasks = package / "tasks.py"
    mtime = tmp_path.stat().st_mtime
    _write(tasks, "first", mtime)
    (tmp_path / f"{app}_settings.py").write_text(RELOAD_SETTINGS.format(app=app))
    env = {
        **os.environ,
        "DATABASE_URL": db_url,
        "DJANGO_SETTINGS_MODULE": f"{app}_settings",
        "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)]),
        "PYTHONUNBUFFERED": "1",
    }
    log = tmp_path / "worker.log"
    with log.open("wb") as handle:
        process = subprocess.Popen(
            [sys.executable, "-m", "tests.manage", "runqueueworker", "--reload", "-v1"],
            cwd=REPO,
            env=env,
            stdout=handle,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:

        def output() -> str:
            return log.read_text(errors="replace")

        def run(version: str) -> None:
            job = Job.objects.enqueue(f"{app}.tasks.code_version")
            wait_for(
                lambda: observer.execute(
                    "SELECT result "
                    "FROM django_pgqueue_job_all WHERE id = %s AND status = 'succeeded'",
                    [job.pk],
                ).fetchone(),
                timeout=60,
                message=f"job {job.pk} to succeed with {version!r}\n{output()}",
            )
            (result,) = observer.execute(
                "SELECT result FROM django_pgqueue_job_all WHERE id = %s", [job.pk]
            ).fetchone()
            assert json.loads(result) == version

        wait_for(lambda: "started: queues=" in output(), timeout=60, message="the worker")
        run("first")

        edits = iter(range(1, 1000))

        def break_and_see_it_reported() -> bool:
            # The reloader snapshots mtimes once a second: edit until it notices.
            tasks.write_text(BROKEN_TASKS)
            step = next(edits)
            os.utime(tasks, (mtime + step, mtime + step))
            return "the worker is not running: " in output()

        wait_for(break_and_see_it_reported, timeout=60, interval=0.5, message="the report")
        text = output()
        assert "SyntaxError" in text
        assert str(tasks) in text  # which file, as the traceback says
        assert "restarts the worker once a watched file changes" in text
        assert process.poll() is None, text  # the command lives on

        def fix_and_see_restart() -> bool:
            _write(tasks, "second", mtime + next(edits))
            return output().count("started: queues=") == 2

        wait_for(fix_and_see_restart, timeout=60, interval=0.5, message="the restart")
        run("second")
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            code = process.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            code = process.wait()
        print(log.read_text(errors="replace"))
    assert code == 0


class _FakeReloader:
    def __init__(self) -> None:
        self.stopped = False

    def stop(self) -> None:
        self.stopped = True


def _reloading_worker(prepare):
    from django_pgqueue.worker.options import WorkerOptions
    from django_pgqueue.worker.reloader import _ReloadingWorker

    options = WorkerOptions.from_settings(burst=True, handle_signals=False)
    return _ReloadingWorker(options, prepare)


def test_an_error_before_the_reloader_starts_keeps_it_watching(db_url):
    # A new child whose checks fail at once: the worker's thread has ended (with the
    # error) before Django's reloader sends autoreload_started. It must keep watching,
    # so that fixing the file restarts the worker; it used to stop, and the command
    # exited with 0.
    def broken() -> None:
        raise SyntaxError("invalid syntax")

    reloading = _reloading_worker(broken)
    with pytest.raises(SyntaxError):
        reloading.run()
    reloader = _FakeReloader()
    reloading._reloader_started(reloader)
    assert reloader.stopped is False


def test_a_burst_that_ended_before_the_reloader_starts_stops_it(db_url):
    reloading = _reloading_worker(lambda: None)
    reloading.run()  # --burst on an empty queue: returns at once
    reloader = _FakeReloader()
    reloading._reloader_started(reloader)
    assert reloader.stopped is True
