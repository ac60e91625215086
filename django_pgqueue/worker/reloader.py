"""``runqueueworker --reload``: restart the worker when code changes, as ``runserver`` does.

Django's own autoreloader does the watching and the restarting: the command's process
stays as a parent that starts a child, the child runs the worker in a thread while its
main thread watches every imported module (the tasks included), and a change makes the
child exit with code 3, which the parent answers with a fresh child. Before that exit,
the worker is asked to stop gracefully, so jobs it runs finish (within the grace period)
and jobs it holds go back to the queue at once instead of waiting for their leases.

Code that does not import (a SyntaxError in a task module, met by the system checks or
when the worker starts) does not end the command either: as in ``runserver``, the
checks and the worker run in the reloaded function, whose failure Django's reloader
records, file included. The child logs what is wrong and keeps watching, and the first
change to a watched file (the broken one among them) starts a fresh child.

A stop signal drains the worker too. Django's own parent answers SIGTERM by exiting,
and its ``subprocess.run`` then SIGKILLs the child: the running jobs waited out their
leases. So the parent here is our own loop around Django's child arguments: it passes
SIGTERM on to the child and waits for it, and the child, once Django's handler has ended
its reloader (SIGTERM) or Ctrl-C has (SIGINT, which the terminal sends to both
processes), stops its worker gracefully before it exits.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import traceback
from collections.abc import Callable
from typing import Any

from django.utils import autoreload

from django_pgqueue.worker.leases import EXIT_STUCK
from django_pgqueue.worker.loop import Worker
from django_pgqueue.worker.options import WorkerOptions
from django_pgqueue.worker.stopsignal import SignalRelay

__all__ = ["run_with_reloader"]

logger = logging.getLogger("django_pgqueue.worker")


#: The exit code with which Django's reloader asks for a fresh child.
RESTART_CODE = 3


def run_with_reloader(options: WorkerOptions, prepare: Callable[[], None] = lambda: None) -> None:
    """Run a worker under Django's autoreloader until it exits or is stopped.

    ``prepare`` (the system checks) runs in each child before its worker starts; if it
    or the worker's start raises, the child reports it and waits for a code change.
    """
    if os.environ.get(autoreload.DJANGO_AUTORELOAD_ENV) == "true":
        _run_child(options, prepare)
    else:
        sys.exit(_run_parent())


def _run_parent() -> int:
    """Start children until one exits other than for a restart; return its exit code."""
    environ = {**os.environ, autoreload.DJANGO_AUTORELOAD_ENV: "true"}
    if _unbuffered():
        environ.setdefault("PYTHONUNBUFFERED", "1")
    arguments = autoreload.get_child_arguments()
    lock = threading.Lock()
    state: dict[str, Any] = {"stopping": False, "child": None}

    def on_signal(signum: int) -> None:
        with lock:
            state["stopping"] = True
            child = state["child"]
        # SIGINT from a terminal reaches the child as well (one process group); passing
        # it on would make it a second request, which skips the grace period.
        if signum == signal.SIGTERM and child is not None and child.poll() is None:
            child.send_signal(signal.SIGTERM)

    with SignalRelay(on_signal, name="pgqueue reload signals"):
        while True:
            with lock:  # a signal either stops the loop here or finds the child
                if state["stopping"]:  # before the first child, or between two
                    return 0
                child = state["child"] = subprocess.Popen(arguments, env=environ, close_fds=False)
            code = child.wait()
            if code != RESTART_CODE:
                return code


def _unbuffered() -> bool:
    # python -u (alone or among other single-letter flags) is not among the options
    # get_child_arguments() passes on; the environment variable does the same.
    return any(
        argument == "-u"
        or (
            argument.startswith("-")
            and not argument.startswith(("--", "-X", "-W"))
            and argument[1:].isalpha()
            and "u" in argument
        )
        for argument in getattr(sys, "orig_argv", ())[1:]
    )


def _run_child(options: WorkerOptions, prepare: Callable[[], None]) -> None:
    reloading = _ReloadingWorker(options, prepare)
    try:
        autoreload.run_with_reloader(reloading.run)
    except SystemExit as exit_:
        if exit_.code != RESTART_CODE:  # Django's SIGTERM handler exited the reloader
            reloading.drain()
        raise
    reloading.drain()  # Ctrl-C ended the reloader (or the worker finished)
    if reloading.replace:
        # Django's parent starts a fresh child on this code; the stuck thread (a daemon)
        # ends with this process.
        logger.warning("replacing the worker's process to free a stuck handler")
        sys.exit(RESTART_CODE)


class _ReloadingWorker:
    """The child's worker thread, and the receivers that tie it to the reloader."""

    def __init__(self, options: WorkerOptions, prepare: Callable[[], None]) -> None:
        self.worker = Worker(options)
        self.prepare = prepare
        self.thread: threading.Thread | None = None
        self.grace_seconds = options.grace_seconds
        self.reloader: Any = None
        self.finished = threading.Event()
        # The worker ended with an error: the reloader must keep watching, even if it
        # starts only after the error (a check failing at once in a new child).
        self.failed = False
        self._lock = threading.Lock()
        self._stop_requested = False
        #: The worker drained to free a stuck handler's thread: the child exits for a new one.
        self.replace = False

    def run(self) -> None:
        """Run the worker in this (non-main) thread; stop the reloader once it returns."""
        self.thread = threading.current_thread()
        # weak=False: the receivers are bound methods of an object nothing else holds.
        autoreload.autoreload_started.connect(self._reloader_started, weak=False)
        autoreload.file_changed.connect(self._file_changed, weak=False)
        try:
            self.prepare()
            if self.worker.run() == EXIT_STUCK:
                # A handler stuck past its grace: this child exits for a fresh one, as a
                # supervisor replaces its process (see _run_child).
                self.replace = True
        except Exception as error:
            # Django's reloader records the file of the error and keeps watching it (the
            # exception goes on to it), so fixing the file restarts the worker.
            with self._lock:
                self.failed = True
                self.finished.set()
            what = "".join(traceback.format_exception_only(error)).strip()
            logger.error(
                "the worker is not running: %s. Fix the code: --reload restarts the worker "
                "once a watched file changes.",
                what,
            )
            raise
        with self._lock:
            self.finished.set()
            reloader = self.reloader
        if reloader is not None:
            reloader.stop()  # --burst or --max-jobs is done: let the process exit

    def drain(self) -> None:
        """Stop the worker gracefully and wait for it; a further signal stops it at once.

        Call in the main thread, once the reloader has ended.
        """
        if self.thread is None or self.finished.is_set():
            return
        with SignalRelay(lambda signum: self.worker.request_stop(), name="pgqueue signals"):
            with self._lock:
                if not self._stop_requested:
                    self._stop_requested = True
                    self.worker.request_stop()
            self.thread.join(self.grace_seconds + 5.0)

    def _reloader_started(self, sender: Any, **kwargs: Any) -> None:
        with self._lock:
            self.reloader = sender
            done = self.finished.is_set() and not self.failed
        if done:  # --burst or --max-jobs ended before the reloader started
            sender.stop()

    def _file_changed(self, sender: Any, file_path: Any, **kwargs: Any) -> None:
        # Runs in the main thread, just before Django exits the child to restart it.
        logger.info("%s changed: restarting the worker", file_path)
        with self._lock:
            self._stop_requested = True
        self.worker.request_stop()
        if self.thread is not None:
            self.thread.join(self.grace_seconds + 5.0)
