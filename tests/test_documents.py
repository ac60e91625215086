"""The README's quick start and the tutorial run as written, in a brand-new project.

Each test takes the marked blocks of a document (see ``tests/documents.py``), creates a
project in a temporary folder with a database of its own on the test server, follows
the steps (settings, models, tasks, migrate, enqueue, a worker with ``--burst``) and
ends with the job ``SUCCESSFUL``. They run on whichever Django the suite runs on, so
the CI legs prove the documents on 5.2, 6.0 and 6.1.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.database import REPO
from tests.documents import DISTRIBUTION, Step, extract, run_steps
from tests.scratch import scratch_database

pytestmark = pytest.mark.timeout(180)

# Only the database differs from what the documents configure: the reader's server is
# not the test server.
SETTINGS_SHIM = """
from mysite.settings import *  # noqa: F403

from django_pgqueue.embedded import database_settings

DATABASES = {{"default": database_settings({url!r})}}
"""


@pytest.fixture
def project(tmp_path: Path) -> Iterator[tuple[Path, dict[str, str]]]:
    """Return an empty project folder and the environment its commands run in."""
    with scratch_database("docs") as url:
        (tmp_path / "docs_test_settings.py").write_text(SETTINGS_SHIM.format(url=url))
        env = {
            key: value
            for key, value in os.environ.items()
            if not key.startswith(("PGQUEUE_", "DJANGO_", "DATABASE_URL"))
        }
        env |= {
            "DJANGO_SETTINGS_MODULE": "docs_test_settings",
            # The shell step imports the step runner from the repository's tests package.
            "PYTHONPATH": str(REPO),
            "PYTHONDONTWRITEBYTECODE": "1",
        }
        yield tmp_path, env


def test_the_readme_quick_start_runs_as_written(project):
    folder, env = project
    steps = extract(REPO / "README.md")
    assert {step.action for step in steps} >= {"append", "file", "run", "shell"}
    # The README starts in an existing project with an app called shop.
    create = Step("run", None, "django-admin startproject mysite .\n", "test")
    app = Step("run", None, "python manage.py startapp shop\n", "test")
    succeeded = Step(
        "shell",
        None,
        "result.refresh()\nassert str(result.status) == 'SUCCESSFUL', result.status\n",
        "test",
    )
    run_steps([create, app, *steps, succeeded], folder, env)


def test_the_tutorial_ends_in_successful(project):
    folder, env = project
    steps = extract(REPO / "docs" / "tutorial.md")
    sessions = [step.text for step in steps if step.action == "session"]
    assert any("SUCCESSFUL" in text for text in sessions), "the tutorial must show the success"
    run_steps(steps, folder, env)


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
