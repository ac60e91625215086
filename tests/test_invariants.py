"""The soak's invariant checker reads a killed process's last statement right."""

from __future__ import annotations

import datetime as dt

import pytest

from tests import invariants

pytestmark = pytest.mark.timeout(10)

KILLED_AT = dt.datetime(2026, 11, 23, 17, 20, 45, tzinfo=dt.UTC)


def _start(at: dt.datetime) -> dict[str, object]:
    return {
        "id": 1,
        "job_id": 7,
        "event": "start",
        "attempt": 1,
        "lease_generation": 1,
        "worker_pid": 4242,
        "label": "plain",
        "at": at,
    }


def _runs(start: dt.datetime) -> list[invariants.Execution]:
    evidence = invariants.Evidence({}, [7], [_start(start)], set())
    kill = invariants.ProcessExit(4242, KILLED_AT, -9, injected=True)
    return invariants.executions(evidence, [kill])[7]


def test_a_start_the_server_stamped_just_after_the_kill_ended_with_the_kill():
    # The process sent its ledger INSERT, was killed, and the server ran the INSERT 5 ms
    # later: that execution was killed, not left running.
    (run,) = _runs(KILLED_AT + dt.timedelta(milliseconds=5))
    assert run.how == "killed"
    assert run.end == run.start


def test_a_start_long_after_the_kill_is_not_explained_by_it():
    (run,) = _runs(KILLED_AT + dt.timedelta(seconds=5))
    assert run.how is None
    assert run.end is None
