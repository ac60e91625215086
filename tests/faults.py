"""Fault injection for worker soaks: a fleet of worker processes to hurt, and a lock-wait probe.

:class:`WorkerFleet` runs standalone ``runqueueworker`` processes and one ``--processes``
supervisor, pauses (SIGSTOP/SIGCONT), kills (SIGKILL) and cuts off (``pg_terminate_backend``)
its worker processes, and notices the ones that exit on their own; every fault and exit is
recorded with its time, as :mod:`tests.invariants` needs. :class:`LockWaitSampler` samples
``pg_stat_activity`` for worker connections waiting on a lock.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import re
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import psutil
import psycopg

from tests.invariants import Fault, ProcessExit
from tests.workers import WorkerProcess


def utcnow() -> dt.datetime:
    """Return the current time, comparable with the ledger's database timestamps."""
    return dt.datetime.now(dt.UTC)


class Database:
    """An autocommit connection that reconnects after the server restarted or cut it off."""

    def __init__(self, url: str, application_name: str = "soak observer") -> None:
        self.url = url
        self.application_name = application_name
        self._conn: psycopg.Connection[Any] | None = None

    @property
    def conn(self) -> psycopg.Connection[Any]:
        if self._conn is None or self._conn.closed or self._conn.broken:
            self._conn = psycopg.connect(
                self.url, autocommit=True, application_name=self.application_name
            )
        return self._conn

    def execute(self, sql: str, params: Any = None, *, patience: float = 30.0) -> Any:
        """Run ``sql`` and return its rows (or None), retrying while the server is away."""
        deadline = time.monotonic() + patience
        while True:
            try:
                cursor = self.conn.execute(sql, params)
                return cursor.fetchall() if cursor.description else None
            except psycopg.OperationalError:
                self.close()
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(psycopg.Error):
                self._conn.close()
            self._conn = None


# ---------------------------------------------------------------------- the fleet
@dataclass
class WorkerFleet:
    """Worker processes under fault injection, with the record of what was done to them."""

    db_url: str
    args: tuple[str, ...]
    settings: dict[str, Any]
    standalone: int = 2
    supervised: int = 2
    faults: list[Fault] = field(default_factory=list)
    exits: list[ProcessExit] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)
    _workers: list[WorkerProcess] = field(default_factory=list)
    _supervisor: WorkerProcess | None = None
    _paused: dict[int, tuple[dt.datetime, float]] = field(default_factory=dict)
    _children: set[int] = field(default_factory=set)
    _killed: set[int] = field(default_factory=set)
    _retired: list[WorkerProcess] = field(default_factory=list)

    def start(self) -> None:
        """Start the standalone workers and the supervisor."""
        self._workers = [self._spawn() for _ in range(self.standalone)]
        if self.supervised:
            self._supervisor = WorkerProcess(
                self.db_url, *self.args, "--processes", str(self.supervised), settings=self.settings
            )

    def _spawn(self) -> WorkerProcess:
        return WorkerProcess(self.db_url, *self.args, settings=self.settings)

    def _count(self, name: str) -> None:
        self.counts[name] = self.counts.get(name, 0) + 1

    def leaves(self) -> list[int]:
        """Return the pids of the processes that run jobs (not the supervisor itself)."""
        pids = [worker.pid for worker in self._workers if worker.process.poll() is None]
        pids += self._supervised_children()
        return pids

    def _supervised_children(self) -> list[int]:
        return sorted(self._children_now() or ())

    def _children_now(self) -> set[int] | None:
        """The supervisor's live children; None when they could not be listed.

        A child that exits between the listing and its status check is skipped on its
        own: one killed child must not make every other child look gone (as a listing
        given up whole did, recording a running child as one that exited on its own).
        """
        if self._supervisor is None or self._supervisor.process.poll() is not None:
            return set()
        try:
            listed = psutil.Process(self._supervisor.pid).children()
        except psutil.Error:
            return None
        alive = set()
        for child in listed:
            with contextlib.suppress(psutil.NoSuchProcess):
                if child.status() != psutil.STATUS_ZOMBIE:
                    alive.add(child.pid)
        return alive

    # ------------------------------------------------------------------ faults
    def pause(self, pid: int, seconds: float) -> None:
        """SIGSTOP ``pid``; :meth:`tick` sends SIGCONT after ``seconds``."""
        if pid in self._paused:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGSTOP)
            self._paused[pid] = (utcnow(), time.monotonic() + seconds)
            self._count("pause (SIGSTOP/SIGCONT)")

    def resume(self, pid: int) -> None:
        """SIGCONT ``pid`` and record the pause."""
        started, _ = self._paused.pop(pid)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
        self.faults.append(Fault("pause", started, utcnow(), frozenset({pid})))

    def kill(self, pid: int) -> None:
        """SIGKILL ``pid``; a standalone worker is replaced, the supervisor replaces its own."""
        at = utcnow()
        self._killed.add(pid)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        if pid in self._paused:
            started, _ = self._paused.pop(pid)
            self.faults.append(Fault("pause", started, at, frozenset({pid})))
        self.faults.append(Fault("kill -9", at, at, frozenset({pid})))
        self.exits.append(ProcessExit(pid, at, -9, injected=True))
        self._count("kill -9")
        for index, worker in enumerate(self._workers):
            if worker.pid == pid:
                worker.process.wait(10)
                self._retired.append(worker)
                self._workers[index] = self._spawn()

    def terminate_connections(self, pid: int, db: Database) -> int:
        """pg_terminate_backend every queue connection of the worker process ``pid``."""
        rows = db.execute(
            "SELECT id FROM django_pgqueue_worker WHERE pid = %s ORDER BY started_at DESC LIMIT 1",
            [pid],
        )
        if not rows:
            return 0
        worker_id = rows[0][0]
        # The names the worker gives its connections (cut to PostgreSQL's 63 characters).
        names = [
            f"pgqueue {kind} {worker_id}"[:63]
            for kind in ("dispatcher", "recorder", "heartbeat", "listener", "housekeeping")
        ]
        at = utcnow()
        terminated = db.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE application_name = ANY(%s)",
            [names],
        )
        self.faults.append(Fault("pg_terminate_backend", at, utcnow(), frozenset({pid})))
        self._count("pg_terminate_backend (connections of one worker)")
        self.counts["connections terminated"] = self.counts.get("connections terminated", 0) + (
            len(terminated or [])
        )
        return len(terminated or [])

    def server_fault(self, kind: str, action: Callable[[], None]) -> None:
        """Run ``action`` (a server restart, say) and record it as a fault of every process."""
        at = utcnow()
        action()
        self.faults.append(Fault(kind, at, utcnow(), None))
        self._count(kind)

    # ------------------------------------------------------------------ upkeep
    def tick(self) -> None:
        """Resume pauses that are due; record and replace processes that exited on their own."""
        now = time.monotonic()
        for pid, (_, resume_at) in list(self._paused.items()):
            if now >= resume_at:
                self.resume(pid)
        for index, worker in enumerate(self._workers):
            code = worker.process.poll()
            if code is not None and worker.pid not in self._killed:
                self.exits.append(
                    ProcessExit(
                        worker.pid, utcnow(), code, injected=False, detail=_why(worker.output())
                    )
                )
                self._retired.append(worker)
                self._workers[index] = self._spawn()
        children = self._children_now()
        if children is None:
            return
        for gone in self._children - children:
            if gone not in self._killed:
                self.exits.append(ProcessExit(gone, utcnow(), None, injected=False))
        self._children = children

    def resume_all(self) -> None:
        """SIGCONT every paused process."""
        for pid in list(self._paused):
            self.resume(pid)

    def stop(self) -> None:
        """Stop every process (SIGTERM, then SIGKILL) and fill in the supervisor's exit codes."""
        self.resume_all()
        supervisor_log = self._supervisor.output() if self._supervisor else ""
        for worker in [*self._workers, *self._retired]:
            worker.stop()
        if self._supervisor is not None:
            self._supervisor.stop()
        for index, exit_ in enumerate(self.exits):
            if exit_.injected or exit_.code is not None:
                continue
            found = re.search(rf"worker process {exit_.pid} exited with (-?\d+)", supervisor_log)
            lines = [line for line in supervisor_log.splitlines() if str(exit_.pid) in line]
            self.exits[index] = ProcessExit(
                exit_.pid,
                exit_.at,
                int(found.group(1)) if found else None,
                injected=False,
                detail="\n".join(lines),
            )

    def outputs(self) -> Iterator[tuple[int, str]]:
        """Yield (pid, output) of every standalone worker and the supervisor."""
        for worker in [*self._workers, *self._retired]:
            yield worker.pid, worker.output()
        if self._supervisor is not None:
            yield self._supervisor.pid, self._supervisor.output()


def _why(output: str) -> str:
    """Return the lines of a worker's output that say why it exited: errors, then the end."""
    lines = output.splitlines()
    errors = [line for line in lines if "ERROR" in line or "Error" in line][-4:]
    return "\n".join([*errors, "...", *lines[-6:]])


# ---------------------------------------------------------------------- lock waits
@dataclass
class LockWait:
    """One statement of a worker connection seen waiting on a lock."""

    kind: str
    application_name: str
    query: str
    first_seen: float
    last_seen: float
    blockers: set[str] = field(default_factory=set)

    @property
    def seconds(self) -> float:
        return self.last_seen - self.first_seen


def connection_kind(application_name: str) -> str:
    """Return heartbeat / dispatcher / housekeeping / listener / other for a connection."""
    if not application_name:
        return "unnamed (a handler's own connection)"
    words = application_name.split()
    if words[0] == "pgqueue" and len(words) > 1:
        return words[1]
    return application_name.split(" ", maxsplit=1)[0]


class LockWaitSampler(threading.Thread):
    """Samples ``pg_stat_activity`` for worker connections waiting on a heavyweight lock.

    A wait's length is measured from the first to the last sample that saw the same
    statement (backend pid and query start) waiting, so it is accurate to one interval.
    """

    def __init__(self, db_url: str, interval: float = 0.075) -> None:
        super().__init__(name="lock-wait sampler", daemon=True)
        self.db = Database(db_url, "soak lock sampler")
        self.interval = interval
        self.samples = 0
        self.waits: dict[tuple[int, Any], LockWait] = {}
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.wait(self.interval):
            try:
                rows = self.db.conn.execute(
                    "SELECT a.pid, a.application_name, a.query_start, left(a.query, 200), "
                    "ARRAY(SELECT b.application_name FROM pg_stat_activity AS b "
                    "      WHERE b.pid = ANY(pg_blocking_pids(a.pid))) "
                    "FROM pg_stat_activity AS a "
                    "WHERE a.datname = current_database() AND a.wait_event_type = 'Lock' "
                    "AND a.application_name LIKE 'pgqueue%'"
                ).fetchall()
            except psycopg.Error:
                self.db.close()
                continue
            self.samples += 1
            now = time.monotonic()
            for pid, name, query_start, query, blockers in rows:
                wait = self.waits.get((pid, query_start))
                if wait is None:
                    wait = self.waits[(pid, query_start)] = LockWait(
                        connection_kind(name), name, " ".join(query.split()), now, now
                    )
                wait.last_seen = now
                wait.blockers.update(connection_kind(blocker) for blocker in blockers)

    def stop(self) -> None:
        self._stop_event.set()
        self.join(5)
        self.db.close()

    def longest(self) -> dict[str, LockWait]:
        """Return the longest wait of each connection kind."""
        longest: dict[str, LockWait] = {}
        for wait in self.waits.values():
            if wait.kind not in longest or wait.seconds > longest[wait.kind].seconds:
                longest[wait.kind] = wait
        return longest

    def summary(self) -> str:
        """Return the longest lock wait per connection kind, as the lead reports it."""
        lines = [
            f"lock waits of worker connections ({self.samples} samples every "
            f"{self.interval * 1000:.0f} ms; {len(self.waits)} statements seen waiting):"
        ]
        for kind in ("heartbeat", "dispatcher", "housekeeping"):
            if kind not in self.longest():
                lines.append(f"  {kind}: never seen waiting")
        for kind, wait in sorted(self.longest().items()):
            blockers = ", ".join(sorted(wait.blockers)) or "?"
            lines.append(
                f"  {kind}: longest {wait.seconds:.2f}s (+/-{self.interval:.2f}s) behind "
                f"[{blockers}]: {wait.query[:110]}"
            )
        long_waits = Counter(wait.kind for wait in self.waits.values() if wait.seconds >= 1.0)
        if long_waits:
            lines.append(f"  waits of 1 s or more, by kind: {dict(long_waits)}")
        return "\n".join(lines)
