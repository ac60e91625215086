"""The execution-safety invariants, checked against the ledger the test tasks write.

A fault-injection test (``test_soak_faults``) runs tasks that record in the ledger
(``tests.ledger``) when each execution started and how it left; this module reads that
ledger, the job rows and the test's record of the faults it injected, and says which
promises held. Other tests can use it the same way::

    evidence = load_evidence(conn, job_ids)
    report = check(evidence, faults=faults, exits=exits, lease_seconds=2)
    print(report.summary())
    report.assert_ok()

An execution is one lease's run of a handler: the ledger entries of one (job id, lease
generation). Ledger events: ``start``; ``end`` (returned a storable value); ``fail`` (about
to raise); ``late-end`` (returned after its worker gave up on it, e.g. past its timeout);
``end-unstorable`` (returned a value the database refuses); ``commit`` (an atomic task's
transaction committed).

Attribution. Two executions of one job, or of two jobs of one partition, may overlap only
when the older one lost its lease to a real fault the test injected into its process (a
pause, kill -9, terminated connections) or a server restart, at some time between its
start (less a lease, since a pause can land between claim and start) and the other's start.
Every other overlap is a violation. A run after a success is judged the same way, by the
older of the two leases: usually the success (its outcome was never recorded, so the job
was claimed again), but it can be the later run, an older lease whose handler started
late (its process paused between the worker's lease check and the handler's start, say).
"""

from __future__ import annotations

import bisect
import datetime as dt
import itertools
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg.rows import dict_row

__all__ = [
    "Evidence",
    "Execution",
    "Fault",
    "ProcessExit",
    "Report",
    "Violation",
    "check",
    "load_evidence",
]

TERMINAL = frozenset({"succeeded", "dead_letter", "cancelled"})
RETURNED = frozenset({"end", "late-end", "end-unstorable"})
LEFT = RETURNED | {"fail"}
FOREVER = dt.datetime.max.replace(tzinfo=dt.UTC)
# How many ledger lines and violations a failure message shows.
SHOW_LINES = 12
SHOW_VIOLATIONS = 6


@dataclass(frozen=True, slots=True)
class Fault:
    """A fault the test injected: into some processes, or (pids None) into the server."""

    kind: str
    start: dt.datetime
    end: dt.datetime
    pids: frozenset[int] | None = None
    detail: str = ""

    def hits(self, pid: int, since: dt.datetime, until: dt.datetime) -> bool:
        """Return whether this fault touched process ``pid`` between ``since`` and ``until``."""
        return (self.pids is None or pid in self.pids) and (
            self.start <= until and self.end >= since
        )


@dataclass(frozen=True, slots=True)
class ProcessExit:
    """A worker process that ended, by the test's hand (``injected``) or on its own."""

    pid: int
    at: dt.datetime
    code: int | None
    injected: bool
    detail: str = ""


@dataclass(slots=True)
class Execution:
    """One lease's run of a handler, as the ledger recorded it."""

    job_id: int
    lease_generation: int
    attempt: int
    pid: int
    label: str
    start: dt.datetime
    end: dt.datetime | None = None
    how: str | None = None
    entries: list[dict[str, Any]] = field(default_factory=list)

    @property
    def until(self) -> dt.datetime:
        """Return when the execution ended, or the end of time if it never did."""
        return self.end or FOREVER

    @property
    def succeeded(self) -> bool:
        """Return whether the handler returned a storable value in time."""
        return self.how == "end"

    def describe(self) -> str:
        end = self.end.isoformat(timespec="microseconds") if self.end else "never"
        return (
            f"job {self.job_id} attempt {self.attempt} generation {self.lease_generation} "
            f"pid {self.pid} [{self.label}] {self.start.isoformat(timespec='microseconds')} "
            f"-> {end} ({self.how or 'no end recorded'})"
        )


@dataclass(slots=True)
class Evidence:
    """Everything the checker reads: the jobs and their ledger."""

    jobs: dict[int, dict[str, Any]]
    expected_ids: list[int]
    ledger: list[dict[str, Any]]
    #: Job ids with a domain row (``tests_order``) written by an atomic task.
    orders: set[int]
    #: The after= edges among the jobs: (dependent, blocker, policy).
    edges: list[tuple[int, int, str]] = field(default_factory=list)
    #: Where each job's row is: "live" (the job table), "history", or both (a fault).
    tiers: dict[int, list[str]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Violation:
    """One broken promise, with what proves it."""

    invariant: str
    job_id: int | None
    detail: str
    lines: tuple[str, ...] = ()
    #: What the ledger suggests caused it (a timed-out handler still running, a worker
    #: crash, a lease that expired with no fault on its process), or "".
    cause: str = ""


@dataclass(slots=True)
class Report:
    """What the checker looked at, what it excused and what it found."""

    checks: Counter[str] = field(default_factory=Counter)
    excused: Counter[str] = field(default_factory=Counter)
    violations: list[Violation] = field(default_factory=list)

    def summary(self) -> str:
        """Return the counts of checks, excused overlaps and violations, one per line."""
        lines = ["invariants checked:"]
        lines += [f"  {name}: {count}" for name, count in sorted(self.checks.items())]
        if self.excused:
            lines.append("overlaps attributed to injected faults:")
            lines += [f"  {name}: {count}" for name, count in sorted(self.excused.items())]
        by_invariant = Counter(violation.invariant for violation in self.violations)
        lines.append(f"violations: {len(self.violations)}")
        for name, count in sorted(by_invariant.items()):
            lines.append(f"  {name}: {count}")
            causes = Counter(v.cause for v in self.violations if v.invariant == name and v.cause)
            lines += [f"    {count:>5} {cause}" for cause, count in causes.most_common()]
        return "\n".join(lines)

    def details(self) -> str:
        """Return every violation with its evidence (the failure message shows a few)."""
        parts = []
        for violation in self.violations:
            job = f"job {violation.job_id}: " if violation.job_id is not None else ""
            cause = f" [{violation.cause}]" if violation.cause else ""
            parts.append(f"{violation.invariant}: {job}{violation.detail}{cause}")
            parts += [f"    {line}" for line in violation.lines]
        return "\n".join(parts)

    def assert_ok(self) -> None:
        """Raise AssertionError naming the first violations of each invariant."""
        if not self.violations:
            return
        grouped: dict[str, list[Violation]] = defaultdict(list)
        for violation in self.violations:
            grouped[violation.invariant].append(violation)
        parts = [self.summary()]
        for invariant, violations in grouped.items():
            parts.append(f"\n=== {invariant}: {len(violations)} violation(s)")
            for violation in violations[:SHOW_VIOLATIONS]:
                job = f"job {violation.job_id}: " if violation.job_id is not None else ""
                cause = f" [{violation.cause}]" if violation.cause else ""
                parts.append(f"- {job}{violation.detail}{cause}")
                parts += [f"    {line}" for line in violation.lines[:SHOW_LINES]]
        raise AssertionError("\n".join(parts))


# ---------------------------------------------------------------------- loading
def load_evidence(conn: psycopg.Connection[Any], job_ids: Sequence[int]) -> Evidence:
    """Read the jobs ``job_ids``, the whole ledger and the atomic tasks' domain rows."""
    with conn.cursor(row_factory=dict_row) as cursor:
        jobs = {
            row["id"]: row
            for row in cursor.execute(
                "SELECT id, task_path, queue, status, attempts, max_attempts, "
                "lease_generation, partition_key, errors, result, kwargs, "
                "concurrency_key, concurrency_limit, rate_limit, rate_period, finished_at "
                "FROM django_pgqueue_job_all WHERE id = ANY(%s)",
                [list(job_ids)],
            ).fetchall()
        }
        edges = [
            (row["job_id"], row["blocker_id"], row["on_failure"])
            for row in cursor.execute(
                "SELECT job_id, blocker_id, on_failure FROM django_pgqueue_dependency "
                "WHERE job_id = ANY(%s) ORDER BY job_id, position",
                [list(job_ids)],
            ).fetchall()
        ]
        ledger = cursor.execute(
            "SELECT id, job_id, event, attempt, lease_generation, worker_pid, label, at "
            "FROM tests_ledgerentry ORDER BY at, id"
        ).fetchall()
        orders = {row["job_id"] for row in cursor.execute("SELECT job_id FROM tests_order")}
        tiers: dict[int, list[str]] = {}
        for row in cursor.execute(
            "SELECT id, 'live' AS tier FROM django_pgqueue_job WHERE id = ANY(%(ids)s) "
            "UNION ALL SELECT id, 'history' FROM django_pgqueue_job_history "
            "WHERE id = ANY(%(ids)s)",
            {"ids": list(job_ids)},
        ).fetchall():
            tiers.setdefault(row["id"], []).append(row["tier"])
    for row in jobs.values():
        for column in ("errors", "result", "kwargs"):
            if isinstance(row[column], str):
                import json

                row[column] = json.loads(row[column])
    return Evidence(jobs, list(job_ids), ledger, orders, edges, tiers)


#: How long after a process was killed the server may still run a statement it sent.
KILL_SLACK = dt.timedelta(seconds=1)


def executions(evidence: Evidence, exits: Sequence[ProcessExit]) -> dict[int, list[Execution]]:
    """Group the ledger into executions per job, ordered by start.

    An execution without an end event ended when its process did, if it did.
    """
    by_lease: dict[tuple[int, int], Execution] = {}
    for entry in evidence.ledger:
        key = (entry["job_id"], entry["lease_generation"])
        execution = by_lease.get(key)
        if execution is None:
            execution = by_lease[key] = Execution(
                entry["job_id"],
                entry["lease_generation"],
                entry["attempt"],
                entry["worker_pid"],
                entry["label"],
                entry["at"],
            )
        execution.entries.append(entry)
        if entry["event"] == "start":
            execution.start = min(execution.start, entry["at"])
        elif entry["event"] in LEFT and execution.how is None:
            execution.end, execution.how = entry["at"], entry["event"]
    for execution in by_lease.values():
        if execution.end is None:
            # A statement the process sent just before it was killed still runs after the
            # kill, and the server stamps the ledger row then: a start up to KILL_SLACK
            # after the recorded kill is the last thing that process did.
            ended = [
                e for e in exits if e.pid == execution.pid and e.at >= execution.start - KILL_SLACK
            ]
            if ended:
                first = min(ended, key=lambda e: e.at)
                execution.end = max(first.at, execution.start)
                execution.how = "killed" if first.injected else f"process exited ({first.code})"
    grouped: dict[int, list[Execution]] = defaultdict(list)
    for execution in by_lease.values():
        grouped[execution.job_id].append(execution)
    for runs in grouped.values():
        runs.sort(key=lambda run: (run.start, run.lease_generation))
    return grouped


# ---------------------------------------------------------------------- checking
def check(
    evidence: Evidence,
    *,
    faults: Sequence[Fault],
    exits: Sequence[ProcessExit] = (),
    lease_seconds: float,
    atomic_label: str = "atomic",
    operated: Iterable[int] = (),
) -> Report:
    """Check every invariant; return the report (call ``assert_ok`` on it).

    ``operated``: jobs an operator cancelled or retried during the run. A retry resets a
    job's attempts and runs it again after it finished (and after younger jobs of its
    partition ran meanwhile), and revives what it cancelled, so those jobs, and every job
    that runs after them, are spared the attempt-numbering, re-run and order checks. The
    safety checks (no overlap, limits, dependents after their blockers) spare nothing.
    """
    report = Report()
    runs = executions(evidence, exits)
    margin = dt.timedelta(seconds=lease_seconds)
    spared = _with_dependents(set(operated), evidence.edges)

    def excuse(stale: Execution, later: dt.datetime) -> Fault | None:
        for fault in faults:
            if fault.hits(stale.pid, stale.start - margin, later):
                return fault
        return None

    def job_lines(job_id: int) -> list[str]:
        job = evidence.jobs.get(job_id)
        lines = []
        if job is not None:
            errors = [
                f"#{error.get('attempt')} {error.get('exception_class')}: "
                f"{str(error.get('message'))[:70]!r}"
                for error in job["errors"]
            ]
            lines.append(
                f"row: {job['status']} attempts {job['attempts']}/{job['max_attempts']} "
                f"generation {job['lease_generation']} partition {job['partition_key']!r} "
                f"task {job['task_path']} errors {errors}"
            )
        entries = sorted(
            (entry for run in runs.get(job_id, ()) for entry in run.entries),
            key=lambda entry: (entry["at"], entry["id"]),
        )
        lines += [_ledger_line(entry) for entry in entries]
        return lines

    def crashes_after(run: Execution) -> list[str]:
        """Say whether the run's process later exited on its own (a crash is no excuse)."""
        return [
            f"  (pid {run.pid} exited on its own with code {exit_.code} at "
            f"{exit_.at.isoformat(timespec='microseconds')})"
            for exit_ in exits
            if exit_.pid == run.pid and not exit_.injected and exit_.at >= run.start
        ][:1]

    def violate(
        invariant: str, job_id: int | None, detail: str, *extra: str, cause: str = ""
    ) -> None:
        lines = list(extra) + (job_lines(job_id) if job_id is not None else [])
        report.violations.append(Violation(invariant, job_id, detail, tuple(lines), cause))

    def cause_of(run: Execution) -> str:
        """Say what the ledger and the job row suggest made ``run`` lose its job."""
        if run.how == "late-end":
            return "its handler had timed out and was still running"
        crashed = [e for e in exits if e.pid == run.pid and not e.injected and e.at >= run.start]
        if crashed:
            return f"its worker process crashed (exit {crashed[0].code})"
        late = [
            fault
            for fault in faults
            if fault.hits(run.pid, run.start - margin, (run.end or run.start) + margin)
        ]
        if late:
            return f"a {late[0].kind} hit its process, but only after the job was taken from it"
        job = evidence.jobs.get(run.job_id)
        errors = job["errors"] if job else []
        if any(
            error.get("attempt") == run.attempt
            and str(error.get("exception_class", "")).endswith("LeaseExpired")
            for error in errors
        ):
            return "its lease expired although no fault hit its process"
        return "no timeout, crash or expiry recorded"

    # ---- the process exits the test did not cause
    for exit_ in exits:
        report.checks["no worker process exited on its own"] += 1
        if not exit_.injected:
            violate(
                "no worker process exited on its own",
                None,
                f"pid {exit_.pid} exited with {exit_.code} at {exit_.at.isoformat()}",
                *exit_.detail.splitlines()[-SHOW_LINES:],
            )

    # ---- one tier: a finished job is in the history, any other in the job table, and
    # never one in both (the move happens in the statement that finishes it). A finished
    # job an operator's retry brought back and did not retry waits in the job table for
    # housekeeping, so operated jobs may be finished there.
    for job_id, where in evidence.tiers.items():
        report.checks["each job in one tier"] += 1
        status = evidence.jobs[job_id]["status"]
        if len(where) > 1:
            violate("each job in one tier", job_id, f"in {' and '.join(where)}")
        elif (where == ["history"]) != (status in TERMINAL) and not (
            where == ["live"] and job_id in spared
        ):
            violate("each job in one tier", job_id, f"{status} in the {where[0]} tier")

    # ---- every job terminal, none lost
    for job_id in evidence.expected_ids:
        report.checks["every job terminal, none lost"] += 1
        job = evidence.jobs.get(job_id)
        if job is None:
            violate("every job terminal, none lost", job_id, "the job row is gone (lost)")
        elif job["status"] not in TERMINAL:
            violate("every job terminal, none lost", job_id, f"left in {job['status']}")

    for job_id, job in evidence.jobs.items():
        job_runs = runs.get(job_id, [])
        started = [run for run in job_runs if any(e["event"] == "start" for e in run.entries)]
        status = job["status"]

        # ---- attempts within max_attempts, and every attempt recorded
        report.checks["attempts never exceed max_attempts"] += 1
        if job["attempts"] > job["max_attempts"]:
            violate(
                "attempts never exceed max_attempts",
                job_id,
                f"attempts {job['attempts']} > max_attempts {job['max_attempts']}",
            )
        # A job an operator retried counts its attempts anew, and may run again after a
        # success: it is spared these two checks (the safety checks below still apply).
        report.checks["every attempt recorded"] += 1
        if job_id not in spared:
            highest = max((run.attempt for run in started), default=0)
            if highest > job["attempts"]:
                violate(
                    "every attempt recorded",
                    job_id,
                    f"a handler ran attempt {highest} but the row counts "
                    f"{job['attempts']} attempts",
                )
            by_attempt: dict[int, list[Execution]] = defaultdict(list)
            for run in started:
                by_attempt[run.attempt].append(run)
            for attempt, same in sorted(by_attempt.items()):
                if len(same) > 1:
                    violate(
                        "every attempt recorded",
                        job_id,
                        f"{len(same)} executions ran as attempt {attempt}: an attempt whose "
                        "handler ran was given back (refunded) instead of counted",
                        *(line for run in same for line in (run.describe(), *crashes_after(run))),
                        cause=min((cause_of(run) for run in same), key=_cause_rank),
                    )
            numbers = [error.get("attempt") for error in job["errors"]]
            if status in TERMINAL and status != "cancelled":
                failed = job["attempts"] - (1 if status == "succeeded" else 0)
                if numbers != list(range(1, failed + 1)):
                    violate(
                        "every attempt recorded",
                        job_id,
                        f"{status} after {job['attempts']} attempts, so attempts 1..{failed} "
                        f"should each have one error entry; errors has attempts {numbers}",
                    )

            # ---- no re-run after a success
            report.checks["no job re-run after its handler succeeded"] += 1
            successes = [run for run in job_runs if run.succeeded]
            for first in successes[:1]:
                for later in started:
                    if later.start <= first.until or later is first:
                        continue
                    # Which lease was lost: the successful one (its outcome never recorded, so
                    # the job was claimed again), or, when the later start holds an older
                    # lease, that one, whose handler started late. The rule is the overlap
                    # check's: a fault on that lease's process, from one lease before its
                    # start.
                    stale = later if later.lease_generation < first.lease_generation else first
                    fault = excuse(stale, later.start)
                    if fault is not None:
                        report.excused[f"re-run after success, {fault.kind}"] += 1
                        continue
                    violate(
                        "no job re-run after its handler succeeded",
                        job_id,
                        "its handler returned successfully, then the job ran again with no "
                        + (
                            "injected fault on the first execution's process"
                            if stale is first
                            else "injected fault on the process of the later start's (older) lease"
                        ),
                        first.describe(),
                        *crashes_after(first),
                        later.describe(),
                        cause=cause_of(stale),
                    )
                    break

        # ---- the result is the one a recorded execution returned
        if (
            status == "succeeded"
            and isinstance(job["result"], dict)
            and "generation" in (job["result"])
        ):
            report.checks["a success's result came from a recorded execution"] += 1
            generation = job["result"]["generation"]
            if not any(run.lease_generation == generation and run.succeeded for run in job_runs):
                violate(
                    "a success's result came from a recorded execution",
                    job_id,
                    f"result {job['result']} matches no execution that returned in time",
                )

        # ---- atomic tasks: one commit, domain row iff succeeded
        if any(run.label == atomic_label for run in job_runs):
            report.checks["atomic: exactly one commit, domain row iff succeeded"] += 1
            commits = [
                entry for run in job_runs for entry in run.entries if entry["event"] == "commit"
            ]
            has_order = job_id in evidence.orders
            if (
                len(commits) > 1
                or (status == "succeeded") != has_order
                or ((status == "succeeded") != (len(commits) == 1))
            ):
                violate(
                    "atomic: exactly one commit, domain row iff succeeded",
                    job_id,
                    f"{status} with {len(commits)} commit(s) and "
                    f"{'a' if has_order else 'no'} domain row",
                )

        # ---- no overlapping executions of one job
        report.checks["no overlapping executions of one job"] += 1
        by_generation = sorted(started, key=lambda run: run.lease_generation)
        for index, stale in enumerate(by_generation):
            for newer in by_generation[index + 1 :]:
                if not (newer.start < stale.until and stale.start < newer.until):
                    continue
                fault = excuse(stale, max(newer.start, stale.start))
                if fault is not None:
                    report.excused[f"job overlap, {fault.kind}"] += 1
                    continue
                violate(
                    "no overlapping executions of one job",
                    job_id,
                    "two executions of the job ran at once with no injected fault on the "
                    "older lease's process",
                    stale.describe(),
                    *crashes_after(stale),
                    newer.describe(),
                    cause=cause_of(stale),
                )

    # ---- partitions: no overlap, first starts in id order
    by_partition: dict[str, list[Execution]] = defaultdict(list)
    for job_id, job in evidence.jobs.items():
        if job["partition_key"] is not None:
            by_partition[job["partition_key"]].extend(
                run
                for run in runs.get(job_id, [])
                if any(e["event"] == "start" for e in run.entries)
            )
    for key, partition_runs in sorted(by_partition.items()):
        partition_runs.sort(key=lambda run: run.start)
        report.checks["no two jobs of one partition overlapping"] += 1
        for index, older in enumerate(partition_runs):
            for newer in partition_runs[index + 1 :]:
                if newer.start >= older.until:
                    continue
                if newer.job_id == older.job_id:
                    continue  # the job-overlap check covers these
                fault = excuse(older, newer.start)
                if fault is not None:
                    report.excused[f"partition overlap, {fault.kind}"] += 1
                    continue
                violate(
                    "no two jobs of one partition overlapping",
                    newer.job_id,
                    f"partition {key!r}: job {newer.job_id} started while job {older.job_id} "
                    "still ran, with no injected fault on the older one's process",
                    older.describe(),
                    *crashes_after(older),
                    newer.describe(),
                    *job_lines(older.job_id),
                    cause=cause_of(older),
                )
        report.checks["partition order kept (first starts in id order)"] += 1
        first_starts: dict[int, dt.datetime] = {}
        for run in partition_runs:
            # An operator's retry puts a finished job back in line, after younger ones.
            if run.job_id not in spared:
                first_starts.setdefault(run.job_id, run.start)
        order = sorted(first_starts, key=lambda job_id: first_starts[job_id])
        for earlier, later in itertools.pairwise(order):
            if earlier > later:
                violate(
                    "partition order kept (first starts in id order)",
                    later,
                    f"partition {key!r}: job {earlier} first started at "
                    f"{first_starts[earlier].isoformat()}, before older job {later} "
                    f"({first_starts[later].isoformat()})",
                )

    # ---- concurrency keys: never more than the limit in flight; rates within the burst
    by_key: dict[str, list[Execution]] = defaultdict(list)
    limits: dict[str, tuple[int | None, int | None, float | None]] = {}
    for job_id, job in evidence.jobs.items():
        key = job.get("concurrency_key")
        if key is not None:
            limits[key] = (job["concurrency_limit"], job["rate_limit"], job["rate_period"])
            by_key[key].extend(
                run
                for run in runs.get(job_id, [])
                if any(e["event"] == "start" for e in run.entries)
            )
    for key, key_runs in sorted(by_key.items()):
        key_runs.sort(key=lambda run: run.start)
        concurrency, rate, period = limits[key]
        if concurrency is not None:
            report.checks["a concurrency key's limit never exceeded"] += 1
            for index, newer in enumerate(key_runs):
                # Older executions still running when this one started, unless a fault
                # on their process let their lease go (their slot was rightly reused).
                flying = [
                    older
                    for older in key_runs[:index]
                    if older.until > newer.start and older.job_id != newer.job_id
                ]
                counted = [older for older in flying if excuse(older, newer.start) is None]
                if len(flying) >= concurrency > len(counted):
                    report.excused["concurrency overlap, a fault"] += 1
                if len(counted) >= concurrency:
                    violate(
                        "a concurrency key's limit never exceeded",
                        newer.job_id,
                        f"key {key!r} (limit {concurrency}): job {newer.job_id} started while "
                        f"{len(counted)} of its jobs still ran, with no injected fault",
                        *(older.describe() for older in counted),
                        newer.describe(),
                    )
                    break
        if rate is not None and period is not None:
            report.checks["a rate limit's starts within limit + burst per period"] += 1
            window = dt.timedelta(seconds=period)
            starts = [run.start for run in key_runs]
            # A start recorded late by a paused process may bunch with others: such
            # starts are excused (the claim, on the database clock, happened earlier).
            late = [
                any(fault.hits(run.pid, run.start - margin, run.start) for fault in faults)
                for run in key_runs
            ]
            for index, at in enumerate(starts):
                inside = range(index, bisect.bisect_left(starts, at + window))
                counted_starts = sum(1 for i in inside if not late[i])
                # The documented burst: the bucket holds one period's worth.
                if counted_starts > 2 * rate:
                    violate(
                        "a rate limit's starts within limit + burst per period",
                        key_runs[index].job_id,
                        f"key {key!r} ({rate}/{period:g}s): {counted_starts} starts within "
                        f"{period:g}s from {at.isoformat()}, over twice the limit",
                    )
                    break

    # ---- dependents: run only once their blockers finished; never after a failure
    # cancelled them (policy "cancel"); settled at the end (the terminal check above)
    blockers_of: dict[int, list[tuple[int, str]]] = defaultdict(list)
    for dependent, blocker, policy in evidence.edges:
        blockers_of[dependent].append((blocker, policy))
    for dependent, blockers in sorted(blockers_of.items()):
        job = evidence.jobs.get(dependent)
        if job is None:
            continue
        report.checks["a dependent runs only after its blockers finished"] += 1
        starts = [
            run.start
            for run in runs.get(dependent, [])
            if any(e["event"] == "start" for e in run.entries)
        ]
        if not starts:
            continue
        first = min(starts)
        for blocker_id, policy in blockers:
            blocker = evidence.jobs.get(blocker_id)
            if blocker is None or blocker_id in spared:
                continue
            ended = _finished_at(blocker, runs.get(blocker_id, []))
            if ended is None or ended > first:
                when = "had not finished" if ended is None else f"finished at {ended.isoformat()}"
                violate(
                    "a dependent runs only after its blockers finished",
                    dependent,
                    f"it started at {first.isoformat()}, but job {blocker_id}, which it runs "
                    f"after, {when}",
                    *job_lines(blocker_id),
                )
            elif (
                policy == "cancel"
                and blocker["status"] in ("dead_letter", "cancelled")
                and dependent not in spared
            ):
                violate(
                    "a dependent runs only after its blockers finished",
                    dependent,
                    f"it ran although job {blocker_id}, which it runs after with policy "
                    f"'cancel', ended {blocker['status']}",
                    *job_lines(blocker_id),
                )

    # ---- every execution ended
    for job_runs in runs.values():
        for run in job_runs:
            report.checks["every execution ended (returned, raised or was killed)"] += 1
            if run.end is None:
                violate(
                    "every execution ended (returned, raised or was killed)",
                    run.job_id,
                    f"no end recorded and its process was not killed: {run.describe()}",
                )
    return report


def _with_dependents(job_ids: set[int], edges: Sequence[tuple[int, int, str]]) -> set[int]:
    """Return ``job_ids`` and every job that runs after one of them, transitively."""
    after: dict[int, list[int]] = defaultdict(list)
    for dependent, blocker, _ in edges:
        after[blocker].append(dependent)
    found = set(job_ids)
    frontier = list(job_ids)
    while frontier:
        for dependent in after.get(frontier.pop(), []):
            if dependent not in found:
                found.add(dependent)
                frontier.append(dependent)
    return found


def _finished_at(job: dict[str, Any], job_runs: Sequence[Execution]) -> dt.datetime | None:
    """Return when a blocker finished, as far as its dependents are concerned.

    A success: the end of the execution that returned it (the row's finish is recorded a
    moment later, and its dependents may start in that transaction). Otherwise the row's
    finish time, or None if it is not finished.
    """
    if job["status"] == "succeeded":
        ends = [run.end for run in job_runs if run.succeeded and run.end is not None]
        return min(ends) if ends else job["finished_at"]
    if job["status"] in TERMINAL:
        return job["finished_at"]
    return None


def _cause_rank(cause: str) -> int:
    """Order causes from the most to the least telling."""
    for rank, word in enumerate(("timed out", "crashed", "hit its process", "expired")):
        if word in cause:
            return rank
    return 9


def _ledger_line(entry: dict[str, Any]) -> str:
    return (
        f"ledger {entry['at'].isoformat(timespec='microseconds')} {entry['event']:<14} "
        f"attempt {entry['attempt']} generation {entry['lease_generation']} "
        f"pid {entry['worker_pid']} [{entry['label']}]"
    )


def count_by(items: Iterable[Any], key: str) -> Counter[str]:
    """Return how many ``items`` have each value of attribute ``key``."""
    return Counter(str(getattr(item, key)) for item in items)
