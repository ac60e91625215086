"""Schedules edited at run time beside the code's: the sync leaves them alone, the trigger
keeps them from an old release's sync, edits reach the firing at its next pass, and each
fire time still gets one job.

The last test is model-based (Hypothesis stateful): random sequences of code deploys
(declare, undeclare, sync; an old release's sync), admin edits (add, change, delete,
pause, resume, run now), two workers firing at once and the clock moving on, checked
after every step against a model of which rows must exist and what they hold.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections import Counter
from datetime import timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from hypothesis import HealthCheck
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    rule,
    run_state_machine_as_test,
)

from django_pgqueue.features.periodic import PeriodicSchedule, parse_fire_key
from django_pgqueue.features.scheduling import (
    delete_admin_schedules,
    fire_due,
    pause,
    resume,
    run_now,
    save_admin_schedule,
)
from django_pgqueue.store.queue import QueueStore
from django_pgqueue.worker.scheduler import Scheduler
from tests.schedules import PROBE, jobs_per_fire, make_due, schedule, scheduled_jobs, sync
from tests.workers import wait_for

pytestmark = pytest.mark.timeout(120)

#: What a previous release's sync runs (before migration 0018): delete every undeclared
#: name, whatever wrote it.
OLD_DELETE = (
    "DELETE FROM django_pgqueue_schedule WHERE NOT (name = ANY (%s::text[])) RETURNING name"
)


def admin(store: QueueStore, name: str = "probe", expression: str = "@daily", **options: Any):
    """Create admin schedule ``name`` (or change it, if it exists) of the probe task."""
    declared = PeriodicSchedule(name=name, task_path=PROBE, expression=expression, **options)
    if save_admin_schedule(store, declared, adding=True):
        return True
    return save_admin_schedule(store, declared, adding=False)


def rows(conn) -> dict[str, tuple[Any, ...]]:
    found = conn.execute(
        "SELECT name, source, expression, args::text, queue, next_fire_at, paused_at "
        "FROM django_pgqueue_schedule"
    ).fetchall()
    return {row[0]: (row[1], row[2], json.loads(row[3]), row[4], row[5], row[6]) for row in found}


def test_the_sync_leaves_admin_schedules_alone_and_reports_a_taken_name(observer, store, caplog):
    assert admin(store, "shared", "@hourly", args=(1,))
    assert admin(store, "mine", "@daily")
    caplog.set_level(logging.ERROR, logger="django_pgqueue.schedules")
    report = sync(observer, schedule("shared", "@daily", args=(2,)), schedule("code", "@daily"))
    assert (report.added, report.changed, report.removed) == (("code",), (), ())
    assert report.conflicts == ("shared",)
    assert "schedule shared is declared in code, but an admin schedule has that name" in (
        caplog.text
    )
    found = rows(observer)
    assert found["shared"][:3] == ("admin", "@hourly", [1])  # not overwritten
    # Nothing declared: the code's row goes, the admin's stay.
    report = sync(observer)
    assert (report.removed, report.conflicts) == (("code",), ())
    assert sorted(rows(observer)) == ["mine", "shared"]
    # The admin cannot edit or delete the code's rows either.
    sync(observer, schedule("code", "@daily"))
    code = PeriodicSchedule(name="code", task_path=PROBE, expression="@hourly")
    assert save_admin_schedule(store, code, adding=True) is False
    assert save_admin_schedule(store, code, adding=False) is False
    assert delete_admin_schedules(store, ["code", "mine"]) == ["mine"]
    assert rows(observer)["code"][:2] == ("code", "@daily")


def test_the_trigger_keeps_admin_rows_from_an_old_release_sync(observer, store):
    assert admin(store, "edited")
    sync(observer, schedule("declared", "@daily"), schedule("dropped", "@daily"))
    deleted = observer.execute(OLD_DELETE, [["declared"]]).fetchall()
    assert deleted == [("dropped",)]  # the admin's row was skipped, not deleted
    assert sorted(rows(observer)) == ["declared", "edited"]
    # A plain DELETE by name is skipped too, before and after the admin's own delete
    # (whose setting ends with its statement's transaction).
    assert (
        observer.execute("DELETE FROM django_pgqueue_schedule WHERE name = 'edited'").rowcount == 0
    )
    assert admin(store, "other")
    assert delete_admin_schedules(store, ["edited"]) == ["edited"]
    assert (
        observer.execute("DELETE FROM django_pgqueue_schedule WHERE name = 'other'").rowcount == 0
    )
    assert (
        store.runner.connection.execute(  # type: ignore[attr-defined]
            "DELETE FROM django_pgqueue_schedule WHERE name = 'other'"
        ).rowcount
        == 0
    )
    # An operator's script deletes one in a transaction that says so.
    with observer.transaction():
        observer.execute("SELECT set_config('django_pgqueue.delete_admin_schedule', 'on', true)")
        gone = observer.execute("DELETE FROM django_pgqueue_schedule WHERE name = 'other'")
        assert gone.rowcount == 1
    assert sorted(rows(observer)) == ["declared"]


def test_edits_take_effect_at_the_scheduler_next_pass(observer, store):
    assert admin(store, "probe", "@every 1s", args=(1,))
    scheduler = Scheduler(alias="default", name="pgqueue test scheduler")
    scheduler.start()
    try:

        def jobs_with(args, queue="default"):
            return [
                job
                for job in observer.execute(
                    "SELECT args::text, queue FROM django_pgqueue_job_all "
                    "WHERE idempotency_key LIKE 'pgqueue:schedule:probe:%'"
                ).fetchall()
                if (json.loads(job[0]), job[1]) == (args, queue)
            ]

        def passes_after_now():
            # A pass that starts after this call: it reads the table as it is now.
            target = scheduler.passes + 2
            wait_for(lambda: scheduler.passes >= target, timeout=10, message="two passes")

        wait_for(lambda: jobs_with([1]), timeout=10, message="a fire with the first args")
        assert admin(store, "probe", "@every 1s", args=(2,), queue_name="emails")
        passes_after_now()
        wait_for(lambda: jobs_with([2], "emails"), timeout=10, message="the edited fire")

        assert pause(store, ["probe"]) == ["probe"]
        passes_after_now()
        paused = sum(jobs_per_fire(observer).values())
        passes_after_now()
        assert sum(jobs_per_fire(observer).values()) == paused

        assert resume(store, ["probe"]) == ["probe"]
        wait_for(
            lambda: sum(jobs_per_fire(observer).values()) > paused, timeout=10, message="resumed"
        )
        assert delete_admin_schedules(store, ["probe"]) == ["probe"]
        passes_after_now()
        deleted = sum(jobs_per_fire(observer).values())
        passes_after_now()
        assert sum(jobs_per_fire(observer).values()) == deleted
    finally:
        scheduler.stop()
        scheduler.join(10)
    assert set(jobs_per_fire(observer).values()) == {1}


def test_a_new_expression_or_time_zone_moves_the_next_fire(observer, store):
    assert admin(store, "probe", "0 2 * * *", timezone="UTC")
    assert rows(observer)["probe"][4].astimezone(ZoneInfo("UTC")).hour == 2
    assert admin(store, "probe", "0 2 * * *", timezone="Europe/Berlin")
    assert rows(observer)["probe"][4].astimezone(ZoneInfo("Europe/Berlin")).hour == 2
    assert admin(store, "probe", "* * * * *", timezone="Europe/Berlin")
    next_fire = rows(observer)["probe"][4]
    assert next_fire - store.database_now() <= timedelta(minutes=1)
    make_due(observer, "probe")
    assert fire_due(store).fired == {"probe": 1}


def test_a_firer_that_read_the_old_timing_fires_nothing(observer, store):
    assert admin(store, "probe", "* * * * *")
    make_due(observer, "probe", 2)
    [due] = store.due_schedules()
    assert admin(store, "probe", "*/2 * * * *")  # the edit lands between read and fire
    result = store.fire_schedule(due, keys=["x"], last_fire_at=None, next_fire_at=due.database_now)
    assert (result.advanced, result.inserted) == (False, 0)
    assert scheduled_jobs(observer) == []


def test_racing_firers_after_an_edit_insert_each_fire_time_once(open_connection, observer, store):
    assert admin(store, "probe", "* * * * *", downtime="catch_up", catch_up=3, args=(1,))
    assert admin(store, "probe", "* * * * *", downtime="catch_up", catch_up=3, args=(2,))
    make_due(observer, "probe", 5)
    stores = [QueueStore(store.runner.__class__(open_connection(), "default")) for _ in range(8)]
    barrier = threading.Barrier(len(stores))
    reports = []

    def firer(firing):
        barrier.wait(10)
        reports.append(fire_due(firing))

    threads = [threading.Thread(target=firer, args=(s,)) for s in stores]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert len(reports) == 8
    assert [r.fired for r in reports if r.fired] == [{"probe": 3}]
    assert sorted(jobs_per_fire(observer).values()) == [1, 1, 1]
    assert {json.dumps(args) for _, args, _, _ in scheduled_jobs(observer)} == {"[2]"}


def test_a_schedule_deleted_and_created_again_never_fires_a_time_twice(observer, store):
    assert admin(store, "probe", "* * * * *")
    make_due(observer, "probe", 1)
    assert fire_due(store).fired == {"probe": 1}
    [fired] = jobs_per_fire(observer)
    assert delete_admin_schedules(store, ["probe"]) == ["probe"]
    assert admin(store, "probe", "* * * * *", args=(9,))
    # Its timetable back where the first one's was: the same fire time is due again.
    observer.execute("UPDATE django_pgqueue_schedule SET next_fire_at = %s", [fired])
    report = fire_due(store)
    assert report.fired == {"probe": 0}  # advanced, but the fire time had its job
    assert jobs_per_fire(observer) == Counter({fired: 1})


# ---------------------------------------------------------------------- the model
NAMES = ("s1", "s2", "s3")
# Periods of half an hour or more: the real clock never passes a fire time between the two
# firers of one step (the fence check), and the clock rule makes them due.
EXPRESSIONS = ("@every 1h", "@daily", "*/30 * * * *")
QUEUES = ("default", "emails")
EXAMPLES = int(os.environ.get("PGQUEUE_MODEL_EXAMPLES", "100"))
STEPS = int(os.environ.get("PGQUEUE_MODEL_STEPS", "30"))


class ScheduleMachine(RuleBasedStateMachine):
    """Code deploys and admin edits of schedules, fired by two workers, beside a model."""

    store: QueueStore  # set by the test before the machine runs
    second: QueueStore  # another worker's connection

    def __init__(self) -> None:
        super().__init__()
        self.conn = self.store.runner.connection  # type: ignore[attr-defined]
        self.conn.execute(
            "TRUNCATE django_pgqueue_schedule, django_pgqueue_job, django_pgqueue_dependency, "
            "django_pgqueue_concurrency_signal"
        )
        #: What the code declares now, and what the last sync wrote (name -> (expr, args)).
        self.declared: dict[str, tuple[str, list[int]]] = {}
        self.code: dict[str, tuple[str, list[int]]] = {}
        #: The admin's schedules: name -> (expression, args, queue).
        self.admin: dict[str, tuple[str, list[int], str]] = {}
        self.paused: set[str] = set()
        self.checked: Counter[str] = Counter()

    def _sync(self) -> None:
        declarations = [
            schedule(name, expression, args=tuple(args))
            for name, (expression, args) in sorted(self.declared.items())
        ]
        report = sync(self.conn, *declarations)
        conflicts = set(self.declared) & set(self.admin)
        assert set(report.conflicts) == conflicts
        if conflicts:
            self.checked["a sync reported a name the admin has"] += 1
        for name in set(self.code) - set(self.declared):
            self.paused.discard(name)
        self.code = {n: v for n, v in self.declared.items() if n not in conflicts}

    # ------------------------------------------------------------------ the code
    @rule(
        name=st.sampled_from(NAMES), expression=st.sampled_from(EXPRESSIONS), arg=st.integers(0, 3)
    )
    def deploy_declaring(self, name: str, expression: str, arg: int) -> None:
        self.declared[name] = (expression, [arg])
        self._sync()

    @rule(name=st.sampled_from(NAMES))
    def deploy_without(self, name: str) -> None:
        self.declared.pop(name, None)
        self._sync()

    @rule(old_names=st.sets(st.sampled_from(NAMES)))
    def old_release_sync(self, old_names: set[str]) -> None:
        # A worker of the previous release starts: its DELETE spares only its code's names.
        deleted = {row[0] for row in self.conn.execute(OLD_DELETE, [sorted(old_names)])}
        assert not deleted & set(self.admin), "an old sync deleted an admin schedule"
        assert deleted == set(self.code) - old_names
        if set(self.admin) - old_names:
            self.checked["the trigger kept admin rows from an old sync"] += 1
        self.code = {n: v for n, v in self.code.items() if n in old_names}
        self.paused -= deleted

    # ------------------------------------------------------------------ the admin
    @rule(
        name=st.sampled_from(NAMES),
        expression=st.sampled_from(EXPRESSIONS),
        arg=st.integers(0, 3),
        queue=st.sampled_from(QUEUES),
        adding=st.booleans(),
    )
    def admin_save(self, name: str, expression: str, arg: int, queue: str, adding: bool) -> None:
        declared = PeriodicSchedule(
            name=name, task_path=PROBE, expression=expression, args=(arg,), queue_name=queue
        )
        before = self.conn.execute(
            "SELECT next_fire_at, timing FROM django_pgqueue_schedule WHERE name = %s", [name]
        ).fetchone()
        saved = save_admin_schedule(self.store, declared, adding=adding)
        taken = name in self.code or name in self.admin
        expected = (not taken) if adding else (name in self.admin)
        assert saved == expected, (name, adding, saved)
        if not saved:
            return
        self.checked["added" if adding else "edited"] += 1
        self.admin[name] = (expression, [arg], queue)
        if adding:
            self.paused.discard(name)
        next_fire_at, timing = self.conn.execute(
            "SELECT next_fire_at, timing FROM django_pgqueue_schedule WHERE name = %s", [name]
        ).fetchone()
        if before is not None and before[1] == timing:
            assert next_fire_at == before[0]  # same timing: the next fire stays
        elif before is None or before[1] != timing:
            assert next_fire_at > self.store.database_now() - timedelta(seconds=5)

    @rule(name=st.sampled_from(NAMES))
    def admin_delete(self, name: str) -> None:
        deleted = delete_admin_schedules(self.store, [name])
        assert deleted == ([name] if name in self.admin else [])
        if deleted:
            del self.admin[name]
            self.paused.discard(name)

    @rule(name=st.sampled_from(NAMES), pausing=st.booleans())
    def pause_or_resume(self, name: str, pausing: bool) -> None:
        exists = name in self.code or name in self.admin
        if pausing:
            assert pause(self.store, [name]) == (
                [name] if exists and name not in self.paused else []
            )
            if exists:
                self.paused.add(name)
        else:
            assert resume(self.store, [name]) == ([name] if name in self.paused else [])
            self.paused.discard(name)

    @rule(name=st.sampled_from(NAMES))
    def run_now(self, name: str) -> None:
        done = run_now(self.store, [name], requested_at=self.store.database_now())
        assert set(done) == ({name} & (set(self.code) | set(self.admin)))

    # ------------------------------------------------------------------ the workers
    @rule()
    def fire_by_two(self) -> None:
        before = self._fires()
        barrier = threading.Barrier(2)
        reports: list[Any] = []
        errors: list[BaseException] = []

        def firer(store: QueueStore) -> None:
            try:
                barrier.wait(10)
                reports.append(fire_due(store))
            except BaseException as error:
                errors.append(error)

        threads = [threading.Thread(target=firer, args=(s,)) for s in (self.store, self.second)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        assert not errors, errors
        assert len(reports) == 2
        # The fence: one of the two advanced each schedule.
        fired = Counter(name for report in reports for name in report.fired)
        assert all(count == 1 for count in fired.values()), fired
        after = self._fires()
        for name, jobs in after.items():
            new = jobs - before.get(name, Counter())
            if not new:
                continue
            self.checked["fired"] += 1
            assert name not in self.paused, f"paused schedule {name} fired"
            assert name in self.code or name in self.admin, f"{name} fired after it was gone"
            # Every new job carries what the schedule holds now (edits apply at once).
            args = self.admin[name][1] if name in self.admin else self.code[name][1]
            queue = self.admin[name][2] if name in self.admin else "default"
            for key in new:
                job = self.conn.execute(
                    "SELECT args::text, queue "
                    "FROM django_pgqueue_job_all WHERE idempotency_key = %s",
                    [key],
                ).fetchone()
                assert (json.loads(job[0]), job[1]) == (args, queue), name

    @rule(seconds=st.sampled_from((30, 600, 7200)))
    def advance_clock(self, seconds: int) -> None:
        # The database clock cannot move: the timetables move back instead.
        self.conn.execute(
            "UPDATE django_pgqueue_schedule "
            "SET next_fire_at = next_fire_at - make_interval(secs => %s)",
            [seconds],
        )

    def _fires(self) -> dict[str, Counter[str]]:
        # The timetable's jobs (not run-now's) per schedule, by key.
        found: dict[str, Counter[str]] = {}
        for (key,) in self.conn.execute(
            "SELECT idempotency_key FROM django_pgqueue_job_all "
            "WHERE idempotency_key LIKE 'pgqueue:schedule:%'"
        ):
            fire = parse_fire_key(key)
            if fire is not None and not fire.manual:
                found.setdefault(fire.schedule, Counter())[key] += 1
        return found

    # ------------------------------------------------------------------ invariants
    @invariant()
    def table_matches_model(self) -> None:
        found = rows(self.conn)
        code = {name: row for name, row in found.items() if row[0] == "code"}
        admin_rows = {name: row for name, row in found.items() if row[0] == "admin"}
        assert {n: (r[1], r[2]) for n, r in code.items()} == self.code
        assert {n: (r[1], r[2], r[3]) for n, r in admin_rows.items()} == self.admin
        assert {n for n, r in found.items() if r[5] is not None} == self.paused

    @invariant()
    def one_job_per_fire_time(self) -> None:
        for name, jobs in self._fires().items():
            assert set(jobs.values()) <= {1}, name


def test_code_deploys_and_admin_edits_together_match_the_model(store, make_store):
    ScheduleMachine.store = store
    ScheduleMachine.second = make_store()
    checked: Counter[str] = Counter()

    class Recording(ScheduleMachine):
        def teardown(self) -> None:
            checked.update(self.checked)
            super().teardown()

    run_state_machine_as_test(
        Recording,
        settings=hypothesis_settings(
            max_examples=EXAMPLES,
            stateful_step_count=STEPS,
            deadline=None,
            derandomize=not os.environ.get("PGQUEUE_MODEL_EXAMPLES"),
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )
    print(dict(checked))
    if os.environ.get("PGQUEUE_MODEL_EXAMPLES"):
        return
    for what in (
        "added",
        "edited",
        "fired",
        "a sync reported a name the admin has",
        "the trigger kept admin rows from an old sync",
    ):
        assert checked[what], f"never exercised: {what}"
