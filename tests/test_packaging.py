"""The distributions: built from the source tree, their metadata checked, the wheel installed
into a fresh virtual environment, and the README's quick start run against it.

The editable install of the test suite would hide a file the wheel forgets (an SQL file,
a template) and metadata PyPI would refuse; this test sees what a user's ``pip install``
gets. ``make dist`` builds the same files into ``dist/``; with ``PGQUEUE_TEST_DIST``
naming that folder, the test checks and installs those instead of building its own (CI
does this, so the files it checked are the ones it built).
"""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from email.parser import Parser
from pathlib import Path

import django
import pytest

from tests.database import REPO
from tests.documents import DISTRIBUTION, Step, run_steps
from tests.scratch import scratch_database
from tests.test_documents import SETTINGS_SHIM, clean_environment, readme_steps

pytestmark = [pytest.mark.timeout(600), pytest.mark.one_server]

#: Files the package cannot work without, which only package-data puts in the wheel.
PACKAGE_DATA = (
    "django_pgqueue/py.typed",
    "django_pgqueue/store/sql/lease.sql",
    "django_pgqueue/store/sql/admin.sql",
    "django_pgqueue/templates/django_pgqueue/admin/job_detail.html",
    "django_pgqueue/static/django_pgqueue/admin/pgqueue.css",
)


def _run(command: list[str], **kwargs: object) -> str:
    completed = subprocess.run(
        command, capture_output=True, text=True, check=False, timeout=300, **kwargs
    )
    output = completed.stdout + completed.stderr
    assert completed.returncode == 0, f"{' '.join(command)} exited {completed.returncode}\n{output}"
    return output


@pytest.fixture(scope="module")
def distributions(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Return the sdist and the wheel: ``PGQUEUE_TEST_DIST``'s, or built now."""
    given = os.environ.get("PGQUEUE_TEST_DIST")
    if given:
        folder = Path(given) if Path(given).is_absolute() else REPO / given
    else:
        folder = tmp_path_factory.mktemp("dist")
        # Without --sdist/--wheel, build makes the sdist and then the wheel from it: a file
        # missing from the sdist breaks the wheel too.
        _run([sys.executable, "-m", "build", "--outdir", str(folder), str(REPO)])
    (sdist,) = folder.glob("*.tar.gz")
    (wheel,) = folder.glob("*.whl")
    return sdist, wheel


def test_twine_accepts_the_metadata_of_both(distributions):
    output = _run([sys.executable, "-m", "twine", "check", "--strict", *map(str, distributions)])
    assert output.count("PASSED") == 2, output


def test_the_wheel_holds_the_license_the_package_data_and_the_classifiers(distributions):
    _sdist, wheel = distributions
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        (metadata_name,) = [name for name in names if name.endswith(".dist-info/METADATA")]
        metadata = Parser().parsestr(archive.read(metadata_name).decode())
        license_names = [name for name in names if name.endswith("licenses/LICENSE")]
        assert license_names, sorted(names)
        license_text = archive.read(license_names[0]).decode()
    assert "BSD 3-Clause License" in license_text
    assert set(PACKAGE_DATA) <= names, set(PACKAGE_DATA) - names
    assert metadata["Name"] == DISTRIBUTION
    assert metadata["License-Expression"] == "BSD-3-Clause"
    classifiers = metadata.get_all("Classifier")
    for series in ("5.2", "6.0", "6.1"):
        assert f"Framework :: Django :: {series}" in classifiers


def test_the_readme_quick_start_runs_on_the_installed_wheel(distributions, tmp_path):
    _sdist, wheel = distributions
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", str(venv)])
    python = str(venv / "bin" / "python")
    # The Django series of this run, so each CI leg installs the wheel next to its own.
    _run(
        [
            python,
            "-m",
            "pip",
            "install",
            "--quiet",
            f"{DISTRIBUTION}[binary] @ {wheel.as_uri()}",
            f"Django~={django.VERSION[0]}.{django.VERSION[1]}.0",
        ]
    )
    project = tmp_path / "project"
    project.mkdir()
    # The project must import the installed package, not the source tree.
    installed = Step(
        "shell",
        None,
        "import django_pgqueue\n"
        f"assert django_pgqueue.__file__.startswith({str(venv)!r}), django_pgqueue.__file__\n",
        "test",
    )
    with scratch_database("wheel") as url:
        (project / "docs_test_settings.py").write_text(SETTINGS_SHIM.format(url=url))
        env = clean_environment() | {"DJANGO_SETTINGS_MODULE": "docs_test_settings"}
        run_steps([*readme_steps(), installed], project, env, python=python)
    # The summary line of the default verbosity, written when the worker stops.
    assert ": 1 succeeded" in (project / ".docs-test-runqueueworker-0.log").read_text()
