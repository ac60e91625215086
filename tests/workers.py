"""Run real ``manage.py runqueueworker`` subprocesses against a test database."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg

from tests.database import REPO


def wait_for(
    condition: Callable[[], Any], *, timeout: float, interval: float = 0.05, message: str = ""
) -> Any:
    """Poll ``condition`` until it returns something truthy; fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {message or condition}")
        time.sleep(interval)


class WorkerProcess:
    """One ``runqueueworker`` subprocess with its output captured to a file."""

    def __init__(
        self,
        db_url: str,
        *args: str,
        settings: dict[str, Any] | None = None,
        verbosity: int = 1,
        cwd: Path | None = None,
    ) -> None:
        self.db_url = db_url
        self.args = args
        #: What the worker printed, kept when :meth:`stop` removes the log file.
        self._final_output = ""
        self._log = tempfile.NamedTemporaryFile("w+", prefix="worker-", suffix=".log", delete=False)  # noqa: SIM115
        env = {
            **os.environ,
            "DATABASE_URL": db_url,
            "DJANGO_SETTINGS_MODULE": "tests.settings",
            "PYTHONUNBUFFERED": "1",
            # A worker that hangs is sent SIGABRT (see wait()): faulthandler then prints
            # every thread's stack, which says where it hung.
            "PYTHONFAULTHANDLER": "1",
        }
        for key, value in (settings or {}).items():
            env[f"PGQUEUE_{key}"] = json.dumps(value)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.manage", "runqueueworker", f"-v{verbosity}", *args],
            # Another checkout (an older release's code, for rolling-deploy tests) runs its
            # own package and test settings.
            cwd=cwd or REPO,
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    @property
    def pid(self) -> int:
        return self.process.pid

    def registry_row(self, conn: psycopg.Connection[Any]) -> tuple[str, str] | None:
        """Return ``(id, status)`` of this process's newest registry row, if any."""
        return conn.execute(
            "SELECT id, status FROM django_pgqueue_worker WHERE pid = %s "
            "ORDER BY started_at DESC LIMIT 1",
            [self.pid],
        ).fetchone()

    def wait_registered(self, conn: psycopg.Connection[Any], timeout: float = 30) -> str:
        """Wait until the worker is in the registry as alive; return its id."""
        row = wait_for(
            lambda: (r := self.registry_row(conn)) and r[1] == "alive" and r,
            timeout=timeout,
            message=f"worker {self.pid} to register\n{self.output()}",
        )
        return row[0]

    def send(self, signum: int) -> None:
        """Send ``signum`` to the worker process."""
        os.kill(self.pid, signum)

    def kill(self) -> None:
        """SIGKILL the worker (no cleanup of any kind happens)."""
        if self.process.poll() is None:
            os.kill(self.pid, signal.SIGKILL)
            self.process.wait(10)

    def wait(self, timeout: float = 30) -> int:
        """Wait for the process to exit and return its exit code."""
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.dump_stacks()
            raise AssertionError(f"worker {self.pid} did not exit\n{self.output()}") from None

    def dump_stacks(self) -> None:
        """Abort a hung worker so that faulthandler prints every thread's stack to its log."""
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGABRT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(10)

    def output(self) -> str:
        """Return everything the worker printed so far."""
        path = Path(self._log.name)
        return path.read_text(errors="replace") if path.exists() else self._final_output

    def stop(self) -> None:
        """Terminate politely, then forcefully; used in teardown."""
        if self.process.poll() is None:
            try:
                os.killpg(self.pid, signal.SIGTERM)
                self.process.wait(10)
            except (subprocess.TimeoutExpired, ProcessLookupError):
                self.dump_stacks()  # its log then says where it hung
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.pid, signal.SIGKILL)
                self.process.wait(10)
        if not self._log.closed:
            self._final_output = self.output()
            self._log.close()
            os.unlink(self._log.name)
