"""SIGTERM and SIGINT reach the worker and the supervisor through a relay thread, never
by a handler that takes a lock the interrupted main thread may hold."""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from django_pgqueue.worker.options import WorkerOptions
from django_pgqueue.worker.stopsignal import SignalRelay
from django_pgqueue.worker.supervisor import Supervisor
from tests.database import REPO

pytestmark = pytest.mark.timeout(90)

# The main thread holds the wake event's lock, as it does inside Event.wait() and
# clear() on every pass of its loop, when the signal's handler runs. A handler that set
# the event itself would wait for that lock forever, and so would the process.
_HELD_LOCK_PROBE = """
import signal
import time

import django
django.setup()
from django_pgqueue.worker import Worker, WorkerOptions
from django_pgqueue.worker.supervisor import Supervisor

options = WorkerOptions.from_settings(handle_signals=True)
worker = Worker(options)
with worker._signal_handlers():
    with worker._wake._cond:
        signal.raise_signal(signal.SIGTERM)
    print("worker", worker._wake.wait(10), worker._stop_requests, flush=True)

supervisor = Supervisor(options, 1)
with supervisor._stop_signals():
    with supervisor._wake._cond:
        signal.raise_signal(signal.SIGTERM)
        signal.raise_signal(signal.SIGINT)
    print("supervisor", supervisor._wake.wait(10), flush=True)
    deadline = time.monotonic() + 10
    while supervisor._stop_requests < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    print("requests", supervisor._stop_requests, flush=True)
"""


def test_a_stop_signal_landing_while_the_main_thread_holds_the_wake_lock_stops_it(db_url):
    env = {**os.environ, "DATABASE_URL": db_url, "DJANGO_SETTINGS_MODULE": "tests.settings"}
    try:
        done = subprocess.run(
            [sys.executable, "-c", _HELD_LOCK_PROBE],
            check=False,
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
    except subprocess.TimeoutExpired as error:
        raise AssertionError(f"the process hung in its signal handler: {error.stdout!r}") from None
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:3] == ["worker True 1", "supervisor True", "requests 2"]


def test_each_signal_is_relayed_once_in_order_and_handlers_come_back():
    before = signal.getsignal(signal.SIGUSR1), signal.getsignal(signal.SIGUSR2)
    calls: list[int] = []
    with SignalRelay(calls.append, signals=(signal.SIGUSR1, signal.SIGUSR2)):
        signal.raise_signal(signal.SIGUSR1)
        signal.raise_signal(signal.SIGUSR2)
        signal.raise_signal(signal.SIGUSR1)
        # Raised just before the exit: still relayed before __exit__ returns.
    assert calls == [signal.SIGUSR1, signal.SIGUSR2, signal.SIGUSR1]
    assert (signal.getsignal(signal.SIGUSR1), signal.getsignal(signal.SIGUSR2)) == before


def test_entering_outside_the_main_thread_fails_and_leaves_nothing_behind():
    before = signal.getsignal(signal.SIGUSR1)
    threads = threading.active_count()
    errors: list[BaseException] = []

    def enter() -> None:
        try:
            with SignalRelay(lambda signum: None, signals=(signal.SIGUSR1,)):
                pass
        except ValueError as error:  # signal only works in main thread
            errors.append(error)

    thread = threading.Thread(target=enter)
    thread.start()
    thread.join(10)
    assert len(errors) == 1
    assert signal.getsignal(signal.SIGUSR1) == before
    assert threading.active_count() == threads


def test_the_callback_may_take_a_lock_the_interrupted_thread_holds():
    lock = threading.Lock()
    relayed = threading.Event()

    def callback(signum: int) -> None:
        with lock:
            relayed.set()

    with SignalRelay(callback, signals=(signal.SIGUSR1,)):
        with lock:
            signal.raise_signal(signal.SIGUSR1)  # the handler runs here and returns
            assert not relayed.is_set()  # the relay thread waits for the lock meanwhile
        assert relayed.wait(10)


def test_a_failing_callback_is_logged_and_later_signals_still_relayed(caplog):
    calls: list[int] = []

    def callback(signum: int) -> None:
        calls.append(signum)
        if len(calls) == 1:
            raise RuntimeError("first one fails")

    with (
        caplog.at_level(logging.ERROR, logger="django_pgqueue.worker"),
        SignalRelay(callback, signals=(signal.SIGUSR1,)),
    ):
        signal.raise_signal(signal.SIGUSR1)
        signal.raise_signal(signal.SIGUSR1)
    assert calls == [signal.SIGUSR1, signal.SIGUSR1]
    assert "handling signal" in caplog.text
    assert "first one fails" in caplog.text


_ready = multiprocessing.get_context("fork").Event()


def _idle_child(options: WorkerOptions) -> None:
    _ready.set()
    time.sleep(60)


def test_a_child_signalled_before_its_worker_starts_ends_without_stopping_the_supervisor():
    """A forked child inherits the supervisor's handlers (they write to its relay pipe);
    a SIGTERM sent to the child before its worker installs its own must end the child,
    not reach the supervisor as a stop request of its own."""
    supervisor = Supervisor(WorkerOptions.from_settings(), 1, child_main=_idle_child)
    outcome: dict[str, object] = {}

    def drive() -> None:
        try:
            _ready.wait(30)
            first = next(iter(supervisor._children.values()))
            _ready.clear()
            os.kill(first.pid, signal.SIGTERM)
            assert _ready.wait(30), "the supervisor did not replace the child"
            outcome["first"] = first
            outcome["requests_before_stop"] = supervisor._stop_requests
        finally:
            os.kill(os.getpid(), signal.SIGTERM)  # stop the supervisor (and its child)

    _ready.clear()
    driver = threading.Thread(target=drive)
    driver.start()
    assert supervisor.run() == 0
    driver.join(30)
    assert outcome["requests_before_stop"] == 0
    assert outcome["first"].exitcode == -signal.SIGTERM
    assert supervisor.restarts == 1
    assert not supervisor._children
