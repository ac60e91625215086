"""Run several worker processes and replace the ones that die.

One Python process runs handlers on one core at a time (the GIL); to use a machine's
cores, ``runqueueworker --processes N`` forks N workers from this supervisor. A child
that crashes (or is killed) is restarted with backoff; a child that exits normally after
``--max-jobs`` is replaced (worker recycling), and so is, at once, a child that stopped
because a handler was stuck (exit code 3, see ``LeaseKeeper._replace_if_stuck``); in
``--burst`` mode children are not replaced and the supervisor exits when all are done.
SIGTERM/SIGINT are passed on to the children, which drain as usual; a second signal is
passed on too (immediate stop).
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from multiprocessing.process import BaseProcess

from django.db import connections

from django_pgqueue.worker import observe
from django_pgqueue.worker.leases import EXIT_STUCK
from django_pgqueue.worker.loop import Worker
from django_pgqueue.worker.options import WorkerOptions, default_worker_id
from django_pgqueue.worker.stopsignal import STOP_SIGNALS, SignalRelay

__all__ = ["Supervisor"]

logger = logging.getLogger("django_pgqueue.worker")

_MAX_BACKOFF = 30.0


def _run_child(main: Callable[[WorkerOptions], None], options: WorkerOptions) -> None:
    # The fork copied the supervisor's handlers, which write to the supervisor's relay
    # pipe: a stop signal arriving before the worker installs its own must end this
    # child (it holds no job yet), not reach the supervisor as if sent to it.
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_DFL)
    main(options)


def _child_main(options: WorkerOptions) -> None:
    # A fresh id per child (and per restart): ids are never reused by a new process.
    code = Worker(replace(options, worker_id=default_worker_id())).run()
    os._exit(code)


class Supervisor:
    """Keeps ``processes`` worker children running until told to stop."""

    def __init__(
        self,
        options: WorkerOptions,
        processes: int,
        *,
        child_main: Callable[[WorkerOptions], None] = _child_main,
    ) -> None:
        self.options = options
        self.processes = processes
        self._child_main = child_main
        self._context = multiprocessing.get_context("fork")
        self._children: dict[int, BaseProcess] = {}
        self._stop_requests = 0
        self._wake = threading.Event()
        self.restarts = 0

    def run(self) -> int:
        """Supervise until stopped (or, in burst mode, until every child is done)."""
        with self._stop_signals():
            return self._supervise()

    def _stop_signals(self) -> SignalRelay:
        return SignalRelay(self._on_signal, name="pgqueue supervisor signals")

    def _supervise(self) -> int:
        for slot in range(self.processes):
            self._spawn(slot)
        backoff = dict.fromkeys(range(self.processes), 1.0)
        forwarded = 0
        while self._children:
            if self._stop_requests > forwarded:
                forwarded = self._stop_requests
                self._forward(signal.SIGTERM)
            self._wake.wait(0.2)
            self._wake.clear()
            for slot, child in list(self._children.items()):
                if child.is_alive():
                    continue
                child.join()
                del self._children[slot]
                if child.pid is not None:
                    observe.current.process_exited(child.pid)
                code = child.exitcode
                if self._stop_requests:
                    continue
                if code == 0 and self.options.burst:
                    continue
                if code == EXIT_STUCK:
                    # A handler was stuck: the child drained and exited to free its
                    # thread. Not a crash: no backoff.
                    logger.warning(
                        "worker process %s exited to free a stuck handler; replacing it",
                        child.pid,
                    )
                    backoff[slot] = 1.0
                elif code != 0:
                    logger.warning(
                        "worker process %s exited with %s; restarting in %.0fs",
                        child.pid,
                        code,
                        backoff[slot],
                    )
                    self._sleep(backoff[slot])
                    backoff[slot] = min(backoff[slot] * 2, _MAX_BACKOFF)
                else:
                    backoff[slot] = 1.0
                if not self._stop_requests:
                    self.restarts += 1
                    self._spawn(slot)
        return 0

    def _spawn(self, slot: int) -> None:
        connections.close_all()  # never share a database connection with a child
        child = self._context.Process(
            target=_run_child,
            args=(self._child_main, self.options),
            name=f"pgqueue-worker-{slot}",
        )
        child.start()
        self._children[slot] = child
        logger.info("started worker process %s", child.pid)

    def _forward(self, signum: int) -> None:
        for child in self._children.values():
            if child.pid is not None and child.is_alive():
                with contextlib.suppress(ProcessLookupError):  # it just exited
                    os.kill(child.pid, signum)

    def _sleep(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while not self._stop_requests and time.monotonic() < deadline:
            self._wake.wait(deadline - time.monotonic())

    def _on_signal(self, signum: int) -> None:
        # On the relay's thread: the loop forwards the signal at a safe point.
        self._stop_requests += 1
        self._wake.set()
