"""A claim costs the same however much flow-control state the database holds.

The state is built through the store, as producers and workers build it, and never
vacuumed: keys at their concurrency limit, keys out of rate tokens (each had a job start
and has another waiting), and a flood of jobs on the busy keys, each leaving a signal.
Then the round a worker sends to claim 20 ready plain jobs (the plain claim alone, while
nothing says a partition or key can start) is measured with EXPLAIN (ANALYZE, BUFFERS),
rolled back: buffers are asserted (pages touched, the same on any machine),
milliseconds only printed; so are the statements of a full round, for the record.

``PGQUEUE_TEST_FLOW_KEYS`` (comma-separated) measures other sizes; the default is the
issue's: 100,000 keys at their concurrency or rate limit and 100,000 pending signals.
"""

from __future__ import annotations

import json
import os
from typing import Any

import pytest

from django_pgqueue.store.notices import flow_channel
from django_pgqueue.store.sql import QUERIES
from django_pgqueue.store.values import JobSpec
from tests.claim_params import claim_params
from tests.plans import walk

pytestmark = [pytest.mark.timeout(1800), pytest.mark.one_server]

SIZES = [int(n) for n in os.environ.get("PGQUEUE_TEST_FLOW_KEYS", "100000").split(",")]
PLAIN_JOBS = 20
#: What the flow state may add to a round claiming 20 plain jobs, as a share of what the
#: round costs without it. The round writes 20 row versions into every index of the job
#: table, and those indexes are deeper and split differently with 300,000 rows beside
#: the 20 than without them: measured, 2% to 40% more pages (PostgreSQL 15 and 18). A
#: claim that walked the flow state would read thousands (100,000 keys and signals).
FLOW_MARGIN = 1.0
#: The pause table's indexes (its primary key, and Django's pattern index on it) and the
#: concurrency and partition tables': a lookup by key may use either.
PAUSE_INDEXES = {
    "django_pgqueue_queue_pause_pkey",
    "django_pgqueue_queue_pause_queue_566c16dd_like",
}
KEY_INDEXES = {
    "django_pgqueue_concurrency_concurrency_key_cf7e4e7e_like",
    "django_pgqueue_partition_partition_key_9c032d8a_like",
}


def _explain(conn, name: str, params: dict[str, Any]) -> tuple[int, float, set[str], int]:
    """Return (buffers, ms, indexes, rows) of one statement, in a rolled-back transaction."""
    with conn.transaction(force_rollback=True):
        rows = conn.execute(
            "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + QUERIES[name].text, params
        ).fetchone()[0]
    plan = (json.loads(rows) if isinstance(rows, str) else rows)[0]
    top = plan["Plan"]
    buffers = top["Shared Hit Blocks"] + top["Shared Read Blocks"]
    indexes = {node["Index Name"] for node in walk(top) if "Index Name" in node}
    scans = [
        (
            node["Shared Hit Blocks"] + node["Shared Read Blocks"],
            node["Node Type"],
            node.get("Index Name") or node.get("Relation Name"),
            node.get("Actual Rows"),
        )
        for node in walk(top)
        if "Scan" in node["Node Type"]
    ]
    print(f"{name}: scans {sorted(scans, key=lambda scan: -scan[0])[:6]}")
    return buffers, plan["Execution Time"], indexes, top["Actual Rows"]


def _build(store, keys: int) -> None:
    """``keys`` keys, half at their limit, half out of tokens, each with a job waiting;
    and a flood on the busy ones: two more jobs each, each insert leaving a signal."""
    busy = [
        JobSpec("tests.tasks.noop", queue="busy", concurrency_key=f"busy-{n}", concurrency_limit=1)
        for n in range(keys // 2)
    ]
    rated = [
        JobSpec("tests.tasks.noop", queue="busy", concurrency_key=f"rated-{n}", rate_limit="1/h")
        for n in range(keys - keys // 2)
    ]
    for specs in (busy, busy, rated, rated):
        store.enqueue_many(specs)
    # Workers start what they can: one job of each key (a limit of 1; one token).
    started = 0
    while True:
        round_ = store.claim_round("w", ["busy"], per_queue=2000, lease_seconds=3600)
        started += len(round_.jobs)
        if not round_.jobs and not round_.more_signals:
            break
    assert started == keys
    for _ in range(2):
        for spec in busy:  # one insert per job, as producers in a flood make them
            store.enqueue(spec)


@pytest.mark.parametrize("keys", SIZES)
def test_a_claim_of_plain_jobs_costs_the_same_with_any_amount_of_flow_state(
    store, open_connection, keys
):
    conn = open_connection(prepare=False)
    # Planned as a worker's session plans it (store/pgconn.py): with sequential scans
    # off, the claim's update reads its rows by primary key however small the table,
    # rather than scanning the 20-row table of the baseline.
    conn.execute("SET enable_seqscan = off")
    # The same claim with no flow state at all: what claiming 20 jobs costs by itself
    # (reading them, and writing their new row versions and index entries).
    store.enqueue_many(JobSpec("tests.tasks.noop") for _ in range(PLAIN_JOBS))
    baseline = _explain(conn, "claim_batch_plain", claim_params(PLAIN_JOBS))
    print(f"no flow state: claim_batch_plain {baseline[0]} buffers, {baseline[1]:.2f} ms")
    _build(store, keys)
    (signals,) = conn.execute("SELECT count(*) FROM django_pgqueue_concurrency_signal").fetchone()
    (at_limit,) = conn.execute(
        "SELECT count(*) FROM django_pgqueue_concurrency "
        "WHERE in_flight >= max_in_flight OR wake_at > now()"
    ).fetchone()
    assert signals >= keys
    assert at_limit == keys

    # The round a worker sends while nothing says a partition or key can start: the plain
    # claim alone. And, for the record, the statements of a full round (sent when one
    # may start, and once per poll interval).
    plain = _explain(conn, "claim_batch_plain", claim_params(PLAIN_JOBS))
    full = {
        "fold_signals": _explain(conn, "fold_signals", {"batch_size": 1000}),
        "wake_due": _explain(conn, "wake_due", {"batch_size": 1000}),
        "claim_batch": _explain(conn, "claim_batch", claim_params(PLAIN_JOBS)),
    }
    for name, (buffers, ms, _, _) in {"claim_batch_plain": plain, **full}.items():
        print(f"{keys} keys, {signals} signals: {name} {buffers} buffers, {ms:.2f} ms")
    assert plain[3] == PLAIN_JOBS + 1  # the jobs and the round's last row
    # Flat: the flow state adds (next to) nothing to what the claim costs by itself.
    assert plain[0] <= baseline[0] * (1 + FLOW_MARGIN), (baseline, plain)
    # It reads the plain jobs' own index, never the flow state beside it.
    assert plain[2] <= {"pgq_job_claim", "django_pgqueue_job_pkey", *PAUSE_INDEXES}
    assert full["fold_signals"][2] <= {
        "pgq_partition_signal_urgent",
        "pgq_concurrency_signal_urgent",
        "django_pgqueue_partition_signal_pkey",
        "django_pgqueue_concurrency_signal_pkey",
    }
    assert full["wake_due"][2] <= {
        "pgq_partition_wake",
        "pgq_concurrency_wake",
        "django_pgqueue_partition_pkey",
        "django_pgqueue_concurrency_pkey",
        *KEY_INDEXES,
    }

    # A job on an idle key is announced, and starts in the next (full) round, whatever
    # the backlog of the other keys' signals.
    listen = open_connection(prepare=False)
    listen.execute(f"LISTEN {flow_channel()}")
    idle = store.enqueue(
        JobSpec("tests.tasks.noop", concurrency_key="idle", concurrency_limit=1)
    ).id
    assert [n.payload for n in listen.notifies(timeout=2, stop_after=1)] == ["default"]
    taken = store.claim_round("w", ["default"], per_queue=50, lease_seconds=30).jobs
    assert idle in {job.id for job in taken}
    assert len(taken) == PLAIN_JOBS + 1
