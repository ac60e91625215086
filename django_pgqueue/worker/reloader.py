"""``runqueueworker --reload``: restart the worker when code changes, as ``runserver`` does.

Django's own autoreloader does the watching and the restarting: the command's process
stays as a parent that starts a child, the child runs the worker in a thread while its
main thread watches every imported module (the tasks included), and a change makes the
child exit with code 3, which the parent answers with a fresh child. Before that exit,
the worker is asked to stop gracefully, so jobs it runs finish (within the grace period)
and jobs it holds go back to the queue at once instead of waiting for their leases.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from django.utils import autoreload

from .loop import Worker
from .options import WorkerOptions

__all__ = ["run_with_reloader"]

logger = logging.getLogger("django_pgqueue.worker")


def run_with_reloader(options: WorkerOptions) -> None:
    """Run a worker under Django's autoreloader until it exits or is interrupted."""
    autoreload.run_with_reloader(_ReloadingWorker(options).run)


class _ReloadingWorker:
    """The child's worker thread, and the receivers that tie it to the reloader."""

    def __init__(self, options: WorkerOptions) -> None:
        self.worker = Worker(options)
        self.thread: threading.Thread | None = None
        self.grace_seconds = options.grace_seconds
        self.reloader: Any = None
        self.finished = threading.Event()
        self._lock = threading.Lock()

    def run(self) -> None:
        """Run the worker in this (non-main) thread; stop the reloader once it returns."""
        self.thread = threading.current_thread()
        # weak=False: the receivers are bound methods of an object nothing else holds.
        autoreload.autoreload_started.connect(self._reloader_started, weak=False)
        autoreload.file_changed.connect(self._file_changed, weak=False)
        try:
            self.worker.run()
        finally:
            with self._lock:
                self.finished.set()
                reloader = self.reloader
            if reloader is not None:
                reloader.stop()  # --burst or --max-jobs is done: let the process exit

    def _reloader_started(self, sender: Any, **kwargs: Any) -> None:
        with self._lock:
            self.reloader = sender
            finished = self.finished.is_set()
        if finished:
            sender.stop()

    def _file_changed(self, sender: Any, file_path: Any, **kwargs: Any) -> None:
        # Runs in the main thread, just before Django exits the child to restart it.
        logger.info("%s changed: restarting the worker", file_path)
        self.worker.request_stop()
        if self.thread is not None:
            self.thread.join(self.grace_seconds + 5.0)
