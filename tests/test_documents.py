"""The README's quick start and the tutorial run as written, in a brand-new project.

Each test takes the marked blocks of a document (see ``tests/documents.py``), creates a
project in a temporary folder and follows the steps (settings, models, tasks, migrate,
enqueue, a worker left running, the admin) until the job is ``SUCCESSFUL``. They run on
whichever Django the suite runs on, so the CI legs prove the documents on 5.2, 6.0 and
6.1.

The tutorial runs on a PostgreSQL server of its own, started empty for the test: its
commands create the database it configures (``createdb shop``), and its settings find
the server as ``psql`` would, through ``PGHOST``. The README starts in an existing
project whose database is PostgreSQL, so its test gives the project an empty database.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import tempfile
import threading
from collections.abc import Iterator
from contextlib import ExitStack
from datetime import datetime
from itertools import pairwise
from pathlib import Path

import psycopg
import pytest

from django_pgqueue.tools.embedded import EmbeddedPostgres
from tests.database import REPO
from tests.documents import DISTRIBUTION, Step, _runserver_address, extract, run_steps
from tests.scratch import scratch_database

pytestmark = pytest.mark.timeout(300)

# Only the database differs from what the README's project has: the reader's server is
# not the test server.
SETTINGS_SHIM = """
from mysite.settings import *  # noqa: F403

from django_pgqueue.tools.embedded import database_settings

DATABASES = {{"default": database_settings({url!r})}}
"""

#: The test's own check that the README's job ran (the worker runs in the background).
README_SUCCEEDED = Step(
    "shell",
    None,
    "import time\n"
    "deadline = time.monotonic() + 60\n"
    "while str(result.status) != 'SUCCESSFUL' and time.monotonic() < deadline:\n"
    "    time.sleep(0.1)\n"
    "    result.refresh()\n"
    "assert str(result.status) == 'SUCCESSFUL', result.status\n",
    "test",
)


def clean_environment() -> dict[str, str]:
    """Return this process's environment without the test suite's own settings."""
    return {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("PGQUEUE_", "DJANGO_", "DATABASE_URL", "PG"))
    } | {"PYTHONDONTWRITEBYTECODE": "1"}


def readme_steps() -> list[Step]:
    """Return the README's quick start, in the project with an app called shop it assumes."""
    steps = extract(REPO / "README.md")
    assert {step.action for step in steps} >= {"append", "file", "run", "shell", "background"}
    create = Step("run", None, "django-admin startproject mysite .\n", "test")
    app = Step("run", None, "python manage.py startapp shop\n", "test")
    return [create, app, *steps, README_SUCCEEDED]


@pytest.fixture
def readme_project(tmp_path: Path) -> Iterator[tuple[Path, dict[str, str]]]:
    """Return an empty project folder and the environment its commands run in."""
    with scratch_database("docs") as url:
        (tmp_path / "docs_test_settings.py").write_text(SETTINGS_SHIM.format(url=url))
        yield tmp_path, clean_environment() | {"DJANGO_SETTINGS_MODULE": "docs_test_settings"}


@pytest.fixture
def fresh_server() -> Iterator[EmbeddedPostgres]:
    """Return a PostgreSQL server started empty for the test, stopped afterwards."""
    # Not under pytest's temporary folder: as root, the server runs as a service user who
    # must traverse every folder above its data, and any pytest run starting meanwhile (CI
    # runs two side by side) closes /tmp/pytest-of-root to its owner again, after which
    # pg_ctl cannot reach the data folder to stop the server.
    folder = Path(tempfile.mkdtemp(prefix="pgqueue-fresh-server-"))
    server = EmbeddedPostgres(folder)
    server.start()
    try:
        yield server
    finally:
        try:
            server.stop("immediate")
        finally:
            shutil.rmtree(folder, ignore_errors=True)


def test_the_readme_quick_start_runs_as_written(readme_project):
    folder, env = readme_project
    run_steps(readme_steps(), folder, env)
    worker_log = (folder / ".docs-test-runqueueworker-0.log").read_text()
    # The summary line at the default verbosity, written when the worker stops.
    assert "1 job finished in the last" in worker_log, worker_log
    assert ": 1 succeeded" in worker_log, worker_log
    assert "stopped after 1 jobs" in worker_log  # Ctrl-C drained it


def test_the_tutorial_runs_as_written_on_a_new_server(tmp_path, fresh_server):
    steps = extract(REPO / "docs" / "tutorial.md")
    sessions = [step.text for step in steps if step.action == "session"]
    assert any("SUCCESSFUL" in text for text in sessions), "the tutorial must show the success"
    assert steps[0].text.startswith("pip install"), "the tutorial starts with the install"
    env = clean_environment() | {
        # What the reader's shell has: the server's client programs, and where it is.
        "PATH": f"{fresh_server.bindir}{os.pathsep}{os.environ['PATH']}",
        "PGHOST": str(fresh_server.socket_dir),
        "PGUSER": "postgres",
    }
    run_steps(steps, tmp_path, env)

    # Step 8 says what the worker logs, and how long the retries wait: check both.
    worker_log = (tmp_path / ".docs-test-runqueueworker-0.log").read_text()
    retries = re.findall(r"job 2 failed, will retry: .*", worker_log)
    assert len(retries) == 2, worker_log
    assert all(
        "error=shop.models.Order.DoesNotExist: Order matching query does not exist." in line
        for line in retries
    ), retries
    assert len(re.findall(r"job 2 dead-lettered: .*", worker_log)) == 1, worker_log
    assert worker_log.count("Traceback (most recent call last)") == 1, worker_log
    assert "stopped after" in worker_log  # Ctrl-C drained it
    with psycopg.connect(fresh_server.url("shop")) as conn:
        (history,) = conn.execute(
            "SELECT errors FROM django_pgqueue_job_all WHERE id = 2"
        ).fetchone()
    failed_at = [datetime.fromisoformat(entry["at"]) for entry in history]
    gaps = [(later - earlier).total_seconds() for earlier, later in pairwise(failed_at)]
    # 2 s then 4 s, each +/-20%, started within the poll interval (1 s), plus the attempt.
    assert 1.6 <= gaps[0] <= 2.4 + 1.5, gaps
    assert 3.2 <= gaps[1] <= 4.8 + 1.5, gaps


def test_every_install_line_names_the_distribution():
    documents = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
    installs = {
        f"{path.relative_to(REPO)}: {match.group(0)}"
        for path in documents
        for match in re.finditer(r"pip install\s+[\"']?([A-Za-z0-9_.-]+)", path.read_text())
    }
    assert installs
    assert all(
        f"install {DISTRIBUTION}" in line or f'"{DISTRIBUTION}' in line for line in installs
    ), sorted(installs)


def test_a_background_command_gets_ctrl_c_when_the_test_run_ignores_it(tmp_path):
    # A test run started as a background job of a shell without job control ignores
    # SIGINT, and would hand that to every command it starts.
    sleeper = (
        "import pathlib, sys, time\n"
        "try:\n"
        "    pathlib.Path('ready').touch()\n"
        "    time.sleep(600)\n"
        "except KeyboardInterrupt:\n"
        "    sys.exit(0)\n"
    )
    waiter = (
        "import pathlib, time\nwhile not pathlib.Path('ready').exists():\n    time.sleep(0.05)\n"
    )
    steps = [
        Step("file", "sleeper.py", sleeper, "test"),
        Step("background", None, "python sleeper.py", "test"),
        Step("file", "wait.py", waiter, "test"),
        Step("run", None, "python wait.py", "test"),
    ]
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        run_steps(steps, tmp_path, dict(os.environ))  # stops the sleeper with Ctrl-C
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN, "put back as it was"
    finally:
        signal.signal(signal.SIGINT, previous)


def test_runserver_runs_take_turns_with_its_address_and_a_taken_one_is_named(tmp_path):
    step = Step("background", None, "python manage.py runserver", "test")
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    lock = tmp_path / "address.lock"
    first = _runserver_address(step, port, lock)
    second: list[ExitStack] = []
    waiting = threading.Thread(target=lambda: second.append(_runserver_address(step, port, lock)))
    waiting.start()
    waiting.join(timeout=0.5)
    assert waiting.is_alive(), "a second run waits for its turn"
    first.close()
    waiting.join(timeout=30)
    assert second, "and has it once the first is done"
    second[0].close()

    with socket.socket() as listener:
        listener.bind(("127.0.0.1", port))
        listener.listen()
        with pytest.raises(AssertionError, match=f"127.0.0.1:{port} is taken"):
            _runserver_address(step, port, lock)
    _runserver_address(step, port, lock).close()  # the failed attempt let go of the turn
