"""A statement's work grows with its rows, not with their square.

A row set filtered by membership in an array another part of the same statement built
(``x = ANY (ARRAY(SELECT ...))`` or ``<> ALL``, outside an index condition) compares each
row with each element: a bulk enqueue of 40,000 partitioned jobs spent 9 s of its 9.4 s
matching its inserted rows against its urgent partitions that way. The plans of the
statements on the job table (``tests/test_indexes.py``'s list and the bulk enqueue), of
housekeeping's and the flow's batch statements and of the admin's queries are checked
for such filters over a CTE's rows, generic and custom.
"""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from django_pgqueue.store.notices import flow_channel
from django_pgqueue.store.sql import QUERIES
from django_pgqueue.store.values import JobSpec
from tests.claim_params import enqueue_many_params
from tests.plans import explain, walk
from tests.test_admin_indexes import ADMIN_QUERIES
from tests.test_indexes import PARAMS

pytestmark = pytest.mark.timeout(120)

NOOP = "tests.tasks.noop"
#: Housekeeping's and the flow's batch statements that do not touch the job table (not in
#: tests/test_indexes.py's list).
BATCHES: dict[str, dict[str, Any]] = {
    "fold_signals": {"batch_size": 1000},
    "fold_lazy_signals": {"batch_size": 1000, "flow_channel": "f"},
    "wake_due": {"batch_size": 1000},
    "repair_partitions": {"partition_keys": ["a", "b"]},
    "prune_idle_concurrency_keys": {"limit": 1000},
    "lock_idempotency_keys": {"limit": 1000, "recheck_seconds": 300.0},
    "lock_coalesce_keys": {"limit": 1000, "recheck_seconds": 300.0},
}
#: Membership in an array parameter: a statement parameter or an InitPlan's result,
#: "$12" before PostgreSQL 17 and "(InitPlan 9).col1" since.
MEMBERSHIP = re.compile(r"(= ANY|<> ALL) \(+(\$\d+|InitPlan \d+\))")


#: Housekeeping's statements, whose batches a setting sizes (PGQUEUE_PRUNE_BATCH_SIZE, up
#: to a million): no scan of theirs may filter its rows by "<> ALL" of another array,
#: which, never an index condition, compares each row with each element.
HOUSEKEEPING = (
    "reap_expired",
    "expired_job_ids",
    "prune_finished",
    "prune_dead_letters",
    "move_finished",
    "free_idempotency_keys",
    "free_coalesce_keys",
    "partitions_out_of_date",
    *BATCHES,
)
EXCLUSION = re.compile(r"<> ALL \(+(\$\d+|InitPlan \d+\))")


def _cte_membership_filters(plan: dict[str, Any]) -> list[tuple[str, str]]:
    return [
        (node["CTE Name"], node["Filter"])
        for node in walk(plan)
        if node["Node Type"] == "CTE Scan" and MEMBERSHIP.search(node.get("Filter", ""))
    ]


def test_no_statement_filters_a_ctes_rows_by_an_array_it_built(open_connection):
    conn = open_connection(prepare=False)
    statements = {
        **PARAMS,
        **BATCHES,
        # The admin's by-id queries name a job the plan need not find.
        **{
            name: {
                key: 1 if isinstance(value, str) and "{" in value else value
                for key, value in params.items()
            }
            for name, (params, _) in ADMIN_QUERIES.items()
        },
        "enqueue_many": enqueue_many_params(
            [
                JobSpec(NOOP, partition_key="p"),
                JobSpec(NOOP, concurrency_key="k", concurrency_limit=1),
            ]
        ),
    }
    found = [
        f"{'generic' if generic else 'custom'}: {name} filters the rows of {cte} by {condition}"
        for generic in (False, True)
        for name, params in statements.items()
        for cte, condition in _cte_membership_filters(
            explain(conn, QUERIES[name].text, params, generic=generic)
        )
    ]
    assert not found, "\n".join(found)


def test_a_bulk_enqueue_announces_each_queue_of_a_ready_urgent_partition_or_key(
    store, open_connection
):
    listen = open_connection(prepare=False)
    listen.execute(f"LISTEN {flow_channel()}")
    # Queue "lazy": its key's row comes to name a ready next job (a round folds the
    # signals and starts the first), so another job of the key signals lazily.
    lazy = JobSpec(NOOP, queue="lazy", concurrency_key="lazy-key", concurrency_limit=1)
    store.enqueue_many([lazy, lazy])
    store.claim_round("w", ["lazy"], per_queue=10, lease_seconds=30)
    list(listen.notifies(timeout=0.5))  # what the setup announced
    later = timezone.now() + timedelta(hours=1)
    store.enqueue_many(
        [
            JobSpec(NOOP, queue="parts", partition_key="p-1"),
            JobSpec(NOOP, queue="parts", partition_key="p-2"),
            JobSpec(NOOP, queue="parts", partition_key="p-1"),
            JobSpec(NOOP, queue="keys", concurrency_key="k", concurrency_limit=2),
            JobSpec(NOOP, queue="keys", concurrency_key="k", concurrency_limit=2),
            # One partition's jobs in two queues: both are told.
            JobSpec(NOOP, queue="left", partition_key="shared"),
            JobSpec(NOOP, queue="right", partition_key="shared"),
            # Not ready yet: nothing to claim, nothing to announce.
            JobSpec(
                NOOP, queue="later", concurrency_key="s", concurrency_limit=1, available_at=later
            ),
            JobSpec(NOOP, queue="plain"),
            lazy,
        ]
    )
    payloads = sorted(notify.payload for notify in listen.notifies(timeout=1))
    assert payloads == ["keys", "left", "parts", "right"]


def test_no_housekeeping_batch_filters_its_rows_by_another_array(open_connection):
    conn = open_connection(prepare=False)
    statements = {**PARAMS, **BATCHES}
    found = [
        f"{'generic' if generic else 'custom'}: {name}: {node['Node Type']} {condition}"
        for generic in (False, True)
        for name in HOUSEKEEPING
        for node in walk(explain(conn, QUERIES[name].text, statements[name], generic=generic))
        for condition in (node.get("Filter", ""), node.get("Join Filter", ""))
        if EXCLUSION.search(condition)
    ]
    assert not found, "\n".join(found)
