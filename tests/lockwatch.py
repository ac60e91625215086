"""Sample ``pg_stat_activity`` for backends waiting on a lock, from a thread of the test.

Used by the tests that prove the bookkeeping path never waits on a row lock (and meant
for the soak's lock-wait figures). Every ``interval`` seconds it records each backend of
the watched database whose ``application_name`` starts with ``prefix`` and whose
``wait_event_type`` is ``Lock``. A wait is identified by (backend pid, statement start);
its length is the longest ``clock_timestamp() - query_start`` seen while it waited, which
for the short statements of the bookkeeping path is the time spent waiting, to within one
sampling interval.

    with LockWatch(db_url) as watch:
        ...
    assert watch.longest() is None or watch.longest().seconds < 0.5, watch.report()
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg

__all__ = ["LockWait", "LockWatch", "deadlocks_after_workers_left"]

_SAMPLE = """
SELECT pid, application_name, query_start, wait_event,
    extract(epoch FROM clock_timestamp() - query_start)::float8 AS waited, query
FROM pg_stat_activity
WHERE datname = current_database()
  AND wait_event_type = 'Lock'
  AND application_name LIKE %(pattern)s
  AND pid <> pg_backend_pid()
"""


@dataclass(slots=True)
class LockWait:
    """One statement of one backend seen waiting on a lock."""

    pid: int
    application_name: str
    query_start: Any
    wait_event: str
    query: str
    seconds: float = 0.0
    samples: int = 0


class LockWatch:
    """A background sampler of lock waits; use as a context manager or start()/stop()."""

    def __init__(self, conninfo: str, *, prefix: str = "pgqueue", interval: float = 0.05) -> None:
        self.conninfo = conninfo
        self.prefix = prefix
        self.interval = interval
        self.waits: dict[tuple[int, Any], LockWait] = {}
        self.samples = 0
        self.errors: list[BaseException] = []
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lockwatch", daemon=True)

    def __enter__(self) -> LockWatch:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        """Start sampling in a daemon thread."""
        self._thread.start()

    def stop(self) -> None:
        """Stop sampling and wait for the thread."""
        self._stopping.set()
        self._thread.join(10)

    def _run(self) -> None:
        pattern = self.prefix.replace("%", r"\%").replace("_", r"\_") + "%"
        try:
            with psycopg.connect(
                self.conninfo, autocommit=True, application_name="test lockwatch"
            ) as conn:
                while not self._stopping.is_set():
                    for pid, name, started, event, waited, query in conn.execute(
                        _SAMPLE, {"pattern": pattern}
                    ).fetchall():
                        wait = self.waits.setdefault(
                            (pid, started), LockWait(pid, name, started, event, query)
                        )
                        wait.seconds = max(wait.seconds, waited)
                        wait.samples += 1
                    self.samples += 1
                    self._stopping.wait(self.interval)
        except BaseException as error:  # reported by the test, never swallowed
            self.errors.append(error)

    def longest(self, where: Callable[[LockWait], bool] | None = None) -> LockWait | None:
        """Return the longest wait seen (of the backends ``where`` accepts), if any."""
        found = [wait for wait in self.waits.values() if where is None or where(wait)]
        return max(found, key=lambda wait: wait.seconds, default=None)

    def report(self, limit: int = 8) -> str:
        """Describe the longest waits, for assertion messages."""
        waits = sorted(self.waits.values(), key=lambda wait: wait.seconds, reverse=True)
        lines = [f"{self.samples} samples, {len(waits)} lock waits"]
        lines += [
            f"  {wait.seconds:6.2f}s {wait.application_name!r} ({wait.wait_event}): "
            f"{' '.join(wait.query.split())[:160]}"
            for wait in waits[:limit]
        ]
        return "\n".join(lines)


def deadlocks_after_workers_left(conn: psycopg.Connection[Any], *, prefix: str = "pgqueue") -> int:
    """Return how many deadlocks the server detected in this database, once no backend
    whose ``application_name`` starts with ``prefix`` is left (a backend reports its
    counts as it exits, so a deadlock it saw is counted by then)."""
    pattern = prefix.replace("%", r"\%").replace("_", r"\_") + "%"
    for _ in range(200):
        left = conn.execute(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE datname = current_database() AND application_name LIKE %s",
            [pattern],
        ).fetchone()
        if left is not None and left[0] == 0:
            break
        time.sleep(0.05)
    else:
        raise AssertionError(f"backends named {prefix}* still connected after 10s")
    conn.execute("SELECT pg_stat_clear_snapshot()")
    row = conn.execute(
        "SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()"
    ).fetchone()
    assert row is not None
    return int(row[0])
