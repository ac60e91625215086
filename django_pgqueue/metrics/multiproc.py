"""Prepare prometheus_client's multiprocess mode for ``runqueueworker --processes``.

prometheus_client decides at import whether metric values live in memory or in files
under ``PROMETHEUS_MULTIPROC_DIR``. The system checks import the project's URLconf, and
with it the metrics view and prometheus_client, before the command runs: so after setting
the directory this module asks prometheus_client again (``values.get_value_class``), and
the worker metrics, created afterwards, write to files.
"""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile

from django_pgqueue.exceptions import ConfigurationError

__all__ = ["ENVIRONMENT_VARIABLE", "prepare_multiprocess_dir"]

ENVIRONMENT_VARIABLE = "PROMETHEUS_MULTIPROC_DIR"


def prepare_multiprocess_dir() -> str:
    """Return the directory of the children's metric files, made (and removed at exit) if unset.

    Raises :class:`ConfigurationError` when ``PROMETHEUS_MULTIPROC_DIR`` names no directory.
    """
    given = os.environ.get(ENVIRONMENT_VARIABLE)
    if given:
        if not os.path.isdir(given):
            raise ConfigurationError(f"{ENVIRONMENT_VARIABLE}={given!r} is not a directory")
        directory = given
    else:
        directory = tempfile.mkdtemp(prefix="pgqueue-metrics-")
        os.environ[ENVIRONMENT_VARIABLE] = directory
        owner = os.getpid()

        def remove() -> None:
            if os.getpid() == owner:  # not in a forked child that exits through atexit
                shutil.rmtree(directory, ignore_errors=True)

        atexit.register(remove)
    if "prometheus_client.values" in sys.modules:
        from prometheus_client import values

        values.ValueClass = values.get_value_class()  # type: ignore[no-untyped-call]
    return directory
