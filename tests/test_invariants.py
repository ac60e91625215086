"""The invariant checker of the soak finds what it names, and excuses only injected faults."""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import signal
import subprocess

import psutil
import pytest

from tests.faults import WorkerFleet
from tests.invariants import Evidence, Fault, ProcessExit, check, executions
from tests.workers import wait_for

pytestmark = pytest.mark.timeout(30)

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def at(seconds: float) -> dt.datetime:
    return T0 + dt.timedelta(seconds=seconds)


def job(job_id: int, *, attempts: int = 1, partition: str | None = None, errors=()) -> dict:
    return {
        "id": job_id,
        "task_path": "tests.tasks.soak_plain",
        "queue": "default",
        "status": "succeeded",
        "attempts": attempts,
        "max_attempts": 5,
        "lease_generation": attempts,
        "partition_key": partition,
        "errors": [{"attempt": n} for n in errors],
        "result": {"attempt": attempts, "generation": attempts},
        "kwargs": {},
    }


def run(job_id: int, generation: int, start: float, end: float, *, pid: int = 100, how="end"):
    """Return the ledger entries of one execution (attempt = generation)."""
    common = {"job_id": job_id, "attempt": generation, "lease_generation": generation}
    return [
        {**common, "id": 0, "event": "start", "worker_pid": pid, "label": "plain", "at": at(start)},
        {**common, "id": 0, "event": how, "worker_pid": pid, "label": "plain", "at": at(end)},
    ]


def evidence(jobs: list[dict], *runs: list[dict]) -> Evidence:
    ledger = sorted((entry for entries in runs for entry in entries), key=lambda e: e["at"])
    for index, entry in enumerate(ledger):
        entry["id"] = index
    return Evidence({j["id"]: j for j in jobs}, [j["id"] for j in jobs], ledger, set())


def invariants_broken(report) -> set[str]:
    return {violation.invariant for violation in report.violations}


def test_a_clean_ledger_has_no_violations():
    report = check(
        evidence(
            [job(1), job(2, attempts=2, errors=[1])],
            run(1, 1, 0, 1),
            run(2, 1, 0, 1, how="fail"),
            run(2, 2, 2, 3),
        ),
        faults=[],
        lease_seconds=2,
    )
    assert report.violations == []
    assert report.checks["no overlapping executions of one job"] == 2


def test_overlapping_executions_of_one_job_are_a_violation_naming_both():
    report = check(
        evidence(
            [job(1, attempts=2, errors=[1])], run(1, 1, 0, 5, how="late-end"), run(1, 2, 2, 3)
        ),
        faults=[],
        lease_seconds=2,
    )
    assert invariants_broken(report) == {"no overlapping executions of one job"}
    (violation,) = report.violations
    assert violation.job_id == 1
    assert any("generation 1" in line and "late-end" in line for line in violation.lines)
    assert violation.cause == "its handler had timed out and was still running"
    with pytest.raises(AssertionError, match="no overlapping executions of one job: 1"):
        report.assert_ok()


def test_an_overlap_after_a_pause_of_the_older_process_is_excused():
    pause = Fault("pause", at(1), at(4), frozenset({100}))
    report = check(
        evidence(
            [job(1, attempts=2, errors=[1])], run(1, 1, 0, 5, pid=100), run(1, 2, 2, 3, pid=200)
        ),
        faults=[pause],
        lease_seconds=2,
    )
    assert report.violations == []
    assert report.excused == {"job overlap, pause": 1}


def test_a_pause_of_another_process_excuses_nothing():
    pause = Fault("pause", at(1), at(4), frozenset({300}))
    report = check(
        evidence(
            [job(1, attempts=2, errors=[1])], run(1, 1, 0, 5, pid=100), run(1, 2, 2, 3, pid=200)
        ),
        faults=[pause],
        lease_seconds=2,
    )
    assert invariants_broken(report) == {"no overlapping executions of one job"}


def test_a_rerun_after_success_and_a_refunded_attempt_are_violations():
    # Generation 1 succeeded and was given back (attempt 1 again under generation 2).
    refunded = [*run(1, 1, 0, 1), *run(1, 2, 2, 3)]
    for entry in refunded:
        entry["attempt"] = 1
    data = evidence([job(1)], refunded)
    data.jobs[1]["lease_generation"] = 2
    data.jobs[1]["result"] = {"attempt": 1, "generation": 2}
    crash = ProcessExit(100, at(1.5), 1, injected=False, detail="Traceback: boom")
    report = check(data, faults=[], exits=[crash], lease_seconds=2)
    assert invariants_broken(report) == {
        "every attempt recorded",
        "no job re-run after its handler succeeded",
        "no worker process exited on its own",
    }
    rerun = next(v for v in report.violations if v.invariant.startswith("no job re-run"))
    assert any("exited on its own with code 1" in line for line in rerun.lines)
    assert rerun.cause == "its worker process crashed (exit 1)"


def _late_older_lease() -> Evidence:
    # Generation 2 (pid 200) succeeded from 0 to 1; generation 1's handler (pid 100) only
    # started at 2.5, after the job had been claimed again, and failed its fenced end.
    return evidence(
        [job(1, attempts=2, errors=[1])],
        run(1, 2, 0, 1, pid=200),
        run(1, 1, 2.5, 2.6, pid=100, how="fail"),
    )


@pytest.mark.parametrize(
    ("fault", "excused"),
    [
        (Fault("PostgreSQL restart (immediate)", at(1.0), at(1.3)), True),
        (Fault("pause", at(0.8), at(1.2), frozenset({100})), True),
        # On the process of the lease that succeeded: not what made the older one start.
        (Fault("pause", at(0.2), at(0.4), frozenset({200})), False),
        # On the older lease's process, but more than a lease before its handler started.
        (Fault("pause", at(0.1), at(0.3), frozenset({100})), False),
        (None, False),
    ],
    ids=["server restart", "pause of its process", "pause of the other", "too early", "none"],
)
def test_an_older_lease_starting_after_the_success_is_excused_only_by_a_fault_on_it(fault, excused):
    report = check(_late_older_lease(), faults=[fault] if fault else [], lease_seconds=2)
    if excused:
        assert report.violations == []
        assert report.excused == {f"re-run after success, {fault.kind}": 1}
        return
    assert invariants_broken(report) == {"no job re-run after its handler succeeded"}
    (violation,) = report.violations
    assert "older) lease" in violation.detail
    assert any("generation 1 pid 100" in line for line in violation.lines)


def test_partition_overlap_and_order_are_checked():
    report = check(
        evidence(
            [job(1, partition="p"), job(2, partition="p"), job(3, partition="p")],
            run(1, 1, 0, 2),
            run(2, 1, 1, 3),  # starts while job 1 runs
            run(3, 1, 4, 5),
        ),
        faults=[],
        lease_seconds=2,
    )
    assert invariants_broken(report) == {"no two jobs of one partition overlapping"}
    order = check(
        evidence([job(1, partition="p"), job(2, partition="p")], run(2, 1, 0, 1), run(1, 1, 2, 3)),
        faults=[],
        lease_seconds=2,
    )
    assert invariants_broken(order) == {"partition order kept (first starts in id order)"}


def test_a_job_left_pending_or_missing_is_a_violation():
    pending = job(1)
    pending["status"] = "pending"
    data = evidence([pending], run(1, 1, 0, 1))
    data.expected_ids.append(2)
    report = check(data, faults=[], lease_seconds=2)
    details = [v.detail for v in report.violations if v.invariant.startswith("every job")]
    assert sorted(details) == ["left in pending", "the job row is gone (lost)"]


def limited(job_id: int, *, limit: int | None = 2, rate: int | None = None) -> dict:
    return {
        **job(job_id),
        "concurrency_key": "tenant",
        "concurrency_limit": limit,
        "rate_limit": rate,
        "rate_period": None if rate is None else 1.0,
    }


def test_a_concurrency_key_over_its_limit_is_a_violation_unless_a_fault_explains_it():
    jobs = [limited(1), limited(2), limited(3)]
    runs = [run(1, 1, 0, 3, pid=100), run(2, 1, 0.5, 3, pid=200), run(3, 1, 1, 2, pid=300)]
    report = check(evidence(jobs, *runs), faults=[], lease_seconds=0.1)
    assert invariants_broken(report) == {"a concurrency key's limit never exceeded"}
    # The first execution's process was paused: its lease went, its slot was reused.
    pause = Fault("pause", at(0.2), at(0.8), frozenset({100}))
    report = check(evidence(jobs, *runs), faults=[pause], lease_seconds=0.1)
    assert report.violations == []
    assert report.excused["concurrency overlap, a fault"] == 1


def test_a_rate_limit_over_twice_its_limit_in_a_period_is_a_violation():
    jobs = [limited(n, limit=None, rate=2) for n in range(1, 7)]
    bunched = [run(n, 1, 0.1 * n, 0.1 * n + 0.01) for n in range(1, 6)]
    report = check(evidence(jobs[:5], *bunched), faults=[], lease_seconds=0.1)
    assert invariants_broken(report) == {"a rate limit's starts within limit + burst per period"}
    spread = [run(n, 1, 0.6 * n, 0.6 * n + 0.01) for n in range(1, 7)]
    assert check(evidence(jobs, *spread), faults=[], lease_seconds=0.1).violations == []


def _started_only(start: float) -> list:
    """The executions of a job whose process wrote its start, then was killed at 0 s."""
    entry = run(7, 1, start, start)[0]  # the start entry alone: no end was written
    kill = ProcessExit(100, at(0), -9, injected=True)
    return executions(evidence([job(7)], [entry]), [kill])[7]


def test_a_start_the_server_stamped_just_after_the_kill_ended_with_the_kill():
    # The process sent its ledger INSERT, was killed, and the server ran the INSERT 5 ms
    # later: that execution was killed, not left running.
    (killed,) = _started_only(0.005)
    assert killed.how == "killed"
    assert killed.end == killed.start


def test_a_start_long_after_the_kill_is_not_explained_by_it():
    (running,) = _started_only(5.0)
    assert running.how is None
    assert running.end is None


class _Parent:
    """A stand-in supervisor: a shell with two children, as ``WorkerFleet`` sees one."""

    def __init__(self) -> None:
        self.process = subprocess.Popen(["sh", "-c", "sleep 60 & sleep 60 & wait"])
        self.pid = self.process.pid

    def children(self) -> list[int]:
        with contextlib.suppress(psutil.Error):
            return sorted(child.pid for child in psutil.Process(self.pid).children())
        return []


def test_the_fleet_records_a_child_gone_only_when_it_is_gone(monkeypatch):
    # A child reaped between the supervisor's listing and its status check once made the
    # whole listing fail: every other child looked gone, and a running worker was
    # reported as having exited on its own.
    parent = _Parent()
    try:
        wait_for(lambda: len(parent.children()) == 2, timeout=10, message="two children")
        first, second = parent.children()
        fleet = WorkerFleet(db_url="", args=(), settings={}, standalone=0, supervised=0)
        fleet._supervisor = parent  # type: ignore[assignment]
        fleet.tick()
        assert fleet._children == {first, second}
        real_status = psutil.Process.status

        def status(process: psutil.Process) -> str:
            if process.pid == first:
                raise psutil.NoSuchProcess(first)
            return real_status(process)

        monkeypatch.setattr(psutil.Process, "status", status)
        fleet.tick()
        # The vanished child is gone; the other still runs, and no exit is made up for it.
        assert [exit_.pid for exit_ in fleet.exits] == [first]
        assert fleet._children == {second}
        monkeypatch.undo()
        os.kill(second, signal.SIGKILL)
        wait_for(lambda: parent.children() == [first], timeout=10, message="the kill")
        fleet.tick()
        assert [exit_.pid for exit_ in fleet.exits] == [first, second]
    finally:
        parent.process.kill()
        parent.process.wait(10)
