"""An earlier release's code, for rolling-deploy tests: its workers run from a checkout."""

from __future__ import annotations

import subprocess
import tarfile
from io import BytesIO
from pathlib import Path

from tests.database import REPO


def previous_release(migration: str) -> str:
    """The commit before the one that added ``migration`` (HEAD if it is not committed)."""
    added = subprocess.run(
        [
            "git",
            "log",
            "--diff-filter=A",
            "--format=%H",
            "--",
            f"django_pgqueue/migrations/{migration}.py",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return f"{added[-1]}^" if added else "HEAD"


def checkout(commit: str, into: Path) -> None:
    """Extract the package and the tests of ``commit`` into ``into``."""
    archive = subprocess.run(
        ["git", "archive", "--format=tar", commit, "django_pgqueue", "tests"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
