"""Periodic schedules.

``schedules.sql`` (sync from code, the admin's own schedules, fire exactly once, pause,
resume, run now).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime

from django_pgqueue.conf import conf
from django_pgqueue.store.notices import flow_channel
from django_pgqueue.store.statements.base import (
    SCHEDULE_SYNC_LOCK_KEY,
    StoreBase,
    timeout_setting,
)
from django_pgqueue.store.values import DueSchedule, FireResult, PausedSchedule, ScheduleDefinition


class ScheduleStatements(StoreBase):
    """Periodic schedules statements of :class:`~django_pgqueue.store.queue.QueueStore`."""

    # sql/schedules.sql: the workers' sync and firing, the Schedules admin page's actions.
    def lock_schedule_sync(self, *, timeout_seconds: float | None = None) -> None:
        """Wait for the schedule sync lock; call inside a transaction (released at COMMIT).

        With ``timeout_seconds``, every lock wait of the rest of the transaction is bounded
        by it: past it the statement fails with ``LockNotAvailable``. So is the time the
        transaction may sit idle: past it the server ends the session (a paused process
        must not keep the lock and the rows it wrote from the other workers).
        """
        if timeout_seconds is not None:
            self._run("limit_schedule_sync_wait", lock_timeout=timeout_setting(timeout_seconds))
        self._run("lock_schedule_sync", lock_key=SCHEDULE_SYNC_LOCK_KEY)

    def database_now(self) -> datetime:
        """Return the database clock (``statement_timestamp()``)."""
        now: datetime = self._run("schedule_clock").rows[0][0]
        return now

    def upsert_schedule(self, definition: ScheduleDefinition, *, next_fire_at: datetime) -> str:
        """Write one declared schedule; return ``"added"``, ``"changed"`` or ``""``.

        ``next_fire_at`` applies to a new schedule or one whose timing changed. An admin
        schedule of the same name is left as it is (``""``).
        """
        rows = self._run("upsert_schedule", **_row_values(definition, next_fire_at)).rows
        if not rows:
            return ""
        return "added" if rows[0][1] else "changed"

    def delete_undeclared_schedules(self, declared: Sequence[str]) -> list[str]:
        """Delete the code's schedules not in ``declared``; return their names."""
        rows = self._run("delete_undeclared_schedules", names=list(declared)).rows
        return sorted(row[0] for row in rows)

    def admin_schedules_named(self, names: Sequence[str]) -> list[str]:
        """Return the names among ``names`` that belong to admin schedules."""
        rows = self._run("admin_schedules_named", names=list(names)).rows
        return sorted(row[0] for row in rows)

    def add_admin_schedule(self, definition: ScheduleDefinition, *, next_fire_at: datetime) -> bool:
        """Create an admin schedule first firing at ``next_fire_at``; return whether it did.

        False: the name is taken (by the code or the admin), and nothing was written.
        """
        rows = self._run("add_admin_schedule", **_row_values(definition, next_fire_at)).rows
        return bool(rows)

    def change_admin_schedule(
        self, definition: ScheduleDefinition, *, next_fire_at: datetime
    ) -> bool:
        """Rewrite an admin schedule from ``definition``; return whether one was there.

        ``next_fire_at`` applies only if the timing changed. A code schedule of that name
        is left as it is (False).
        """
        rows = self._run("change_admin_schedule", **_row_values(definition, next_fire_at)).rows
        return bool(rows)

    def delete_admin_schedules(self, names: Sequence[str]) -> list[str]:
        """Delete the admin schedules among ``names``; return the names it deleted.

        Code schedules among them are left (the workers' sync owns them).
        """
        rows = self._run("delete_admin_schedules", names=list(names)).rows
        return sorted(row[0] for row in rows)

    def due_schedules(self, *, limit: int = 100) -> list[DueSchedule]:
        """Return up to ``limit`` active schedules, the earliest next fire first."""
        return [DueSchedule(**row) for row in self._run("due_schedules", limit=limit).dicts()]

    def fire_schedule(
        self,
        schedule: DueSchedule,
        *,
        keys: Sequence[str],
        last_fire_at: datetime | None,
        next_fire_at: datetime,
    ) -> FireResult:
        """Advance ``schedule`` past its due fire times and insert a job per key.

        Applies only if the row still has the ``next_fire_at`` and timing it was read
        with, and is not paused; one statement, so one short transaction in autocommit.
        """
        row = self._run(
            "fire_schedule",
            schedule_name=schedule.name,
            expected_next_fire_at=schedule.next_fire_at,
            timing=schedule.timing,
            next_fire_at=next_fire_at,
            last_fire_at=last_fire_at,
            keys=list(keys),
            channel=conf.NOTIFY_CHANNEL,
            flow_channel=flow_channel(),
        ).rows[0]
        return FireResult(advanced=bool(row[0]), inserted=int(row[1]))

    def pause_schedules(self, names: Sequence[str]) -> list[str]:
        """Pause the active schedules among ``names``; return those it paused."""
        return sorted(row[0] for row in self._run("pause_schedules", names=list(names)).rows)

    def paused_schedules(self, names: Sequence[str]) -> list[PausedSchedule]:
        """Return the paused schedules among ``names``."""
        rows = self._run("paused_schedules", names=list(names)).dicts()
        return [PausedSchedule(**row) for row in rows]

    def resume_schedule(self, schedule: PausedSchedule, *, next_fire_at: datetime) -> bool:
        """Resume ``schedule`` if still paused with the same timing; return whether it did."""
        rows = self._run(
            "resume_schedule",
            schedule_name=schedule.name,
            timing=schedule.timing,
            next_fire_at=next_fire_at,
        ).rows
        return bool(rows)

    def run_schedules_now(self, keys: Mapping[str, str]) -> dict[str, int]:
        """Insert one job now for each schedule name of ``keys`` (name -> idempotency key).

        Returns the new job id per name; a name whose schedule is gone, or whose key is
        already taken (a resubmitted confirmation), is missing.
        """
        names = list(keys)
        rows = self._run(
            "run_schedule_now",
            names=names,
            keys=[keys[name] for name in names],
            channel=conf.NOTIFY_CHANNEL,
            flow_channel=flow_channel(),
        ).rows
        by_key = {row[1]: row[0] for row in rows}
        return {name: by_key[key] for name, key in keys.items() if key in by_key}

    def jobs_by_keys(self, keys: Sequence[str]) -> dict[str, tuple[int, str]]:
        """Return ``(job id, status)`` of the jobs holding ``keys``, by key."""
        rows = self._run("jobs_by_keys", keys=list(keys)).rows
        return {row[0]: (row[1], row[2]) for row in rows}


def _row_values(definition: ScheduleDefinition, next_fire_at: datetime) -> dict[str, object]:
    # The parameters of a statement that writes a whole schedule row.
    values = {name: getattr(definition, name) for name in definition.__dataclass_fields__}
    values["schedule_name"] = values.pop("name")
    values["args"] = json.dumps(definition.args)
    values["kwargs"] = json.dumps(definition.kwargs)
    values["next_fire_at"] = next_fire_at
    return values
