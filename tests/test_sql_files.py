"""The SQL files: well formed, all used, and faithful to the state machine."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from psycopg import _queries

import django_pgqueue.store.statements
from django_pgqueue.states import TRANSITIONS, JobStatus, Transition, WorkerStatus
from django_pgqueue.store.sql import QUERIES, parse

STATEMENTS = Path(django_pgqueue.store.statements.__file__).parent
#: Each statement module's source, by name (one module per sql/*.sql file).
STATEMENT_SOURCES = {path.stem: path.read_text() for path in STATEMENTS.glob("*.py")}

#: Which transitions each status-changing statement performs.
STATUS_WRITES = {
    "claim_batch": {Transition.CLAIM},
    "claim_batch_plain": {Transition.CLAIM},
    "complete_if_leased": {Transition.COMPLETE},
    "complete_many_if_leased": {Transition.COMPLETE, Transition.STOP},
    "fail_if_leased": {Transition.RETRY_LATER, Transition.DEAD_LETTER, Transition.STOP},
    "release_if_leased": {Transition.RELEASE, Transition.STOP},
    "release_many_if_leased": {Transition.RELEASE, Transition.STOP},
    "reap_expired": {Transition.REAP, Transition.REAP_EXHAUSTED, Transition.STOP},
    "retry_jobs": {Transition.RETRY, Transition.RETRY_BLOCKED},
    "cancel_jobs": {Transition.CANCEL},
    "revive_dependents": {Transition.REVIVE},
}
#: Transitions made outside sql/*.sql: RUN_NOW changes no status; UNBLOCK (and the
#: cancel of a failed blocker's dependents) is the settling trigger of migration 0009,
#: checked by tests/test_dependencies.py.
ELSEWHERE = {Transition.RUN_NOW, Transition.UNBLOCK}

# A status set by an UPDATE, or the final status of a job a statement moves to the
# history itself (a DELETE ... RETURNING ... AS final_status and an INSERT).
_SET_STATUS = re.compile(
    r"(?:SET status = (?:'(\w+)'|CASE(.*?)END)|CASE(.*?)END\s+AS final_status)", re.S
)
_LITERAL = re.compile(r"'(\w+)'")


def test_every_query_is_described_and_used_by_the_store():
    every_source = "".join(STATEMENT_SOURCES.values())
    for name, query in QUERIES.items():
        assert query.description, f"{name} has no description"
        assert f'"{name}"' in every_source, f"{name} is never run by the store"


def test_each_sql_file_has_its_statement_module():
    # The Python follows the SQL's seams: sql/lease.sql is run by statements/lease.py.
    files = {path.stem for path in (STATEMENTS.parent / "sql").glob("*.sql")}
    assert files <= set(STATEMENT_SOURCES), files - set(STATEMENT_SOURCES)


def test_status_literals_are_job_statuses():
    statuses = set(JobStatus.values)
    worker_statuses = set(WorkerStatus.values)
    for name, query in QUERIES.items():
        for match in re.finditer(r"(?:(\w+)\.)?status\s*(?:=|<>|IN)\s*\(?([^)\n]*)", query.text):
            # The registry's rows (alias "worker", or the worker queries' bare column)
            # have statuses of their own.
            of_workers = match.group(1) == "worker" or (match.group(1) is None and "worker" in name)
            for literal in _LITERAL.findall(match.group(2)):
                known = worker_statuses if of_workers else statuses
                assert literal in known, f"{name}: unknown status {literal!r}"


@pytest.mark.parametrize("name", sorted(STATUS_WRITES))
def test_status_changes_follow_the_state_machine(name):
    text = QUERIES[name].text
    targets = set()
    for simple, updated, moved in _SET_STATUS.findall(text):
        case = updated or moved
        targets.update(
            [simple]
            if simple
            else _LITERAL.findall(case.split("ELSE")[-1]) + re.findall(r"THEN '(\w+)'", case)
        )
    expected_targets = {TRANSITIONS[t][1].value for t in STATUS_WRITES[name]}
    assert targets == expected_targets, name
    sources = set().union(*(TRANSITIONS[t][0] for t in STATUS_WRITES[name]))
    for source in sources:
        assert f"'{source.value}'" in text, f"{name} never checks for {source.value}"


def test_status_writes_cover_every_transition_but_run_now_and_unblock():
    covered = set().union(*STATUS_WRITES.values())
    assert covered | ELSEWHERE == set(Transition)


def test_terminal_statuses_only_leave_through_an_explicit_retry():
    for transition, (sources, _target) in TRANSITIONS.items():
        if any(source.is_terminal for source in sources):
            # REVIVE happens only when an operator retries the job that cancelled it;
            # RETRY_BLOCKED is a retry of a job whose blockers have not finished.
            assert transition in {Transition.RETRY, Transition.RETRY_BLOCKED, Transition.REVIVE}


def test_parser_rejects_duplicates_and_empty_blocks():
    with pytest.raises(ValueError, match="twice"):
        parse("-- name: a\n-- x\nSELECT 1;\n-- name: a\n-- y\nSELECT 2;", "t.sql")
    with pytest.raises(ValueError, match="no statement"):
        parse("-- name: a\n-- only a comment\n", "t.sql")
    parsed = parse("-- header\n\n-- name: one\n-- Does one thing.\nSELECT %(x)s;\n", "t.sql")
    assert parsed["one"].description == "Does one thing."
    assert parsed["one"].text == "SELECT %(x)s"
    assert parsed["one"].parameters == {"x"}


def test_a_variant_is_its_statement_without_the_named_sections():
    queries = parse(
        "-- name: full\n-- Both.\n-- variant: lean without extra\nSELECT 1\n"
        "-- begin extra\n, 2\n-- end extra\n, 3\n",
        "t.sql",
    )
    assert queries["full"].text.splitlines() == [
        "SELECT 1",
        "-- begin extra",
        ", 2",
        "-- end extra",
        ", 3",
    ]
    assert queries["full"].description == "Both."
    assert queries["lean"].text.splitlines() == ["SELECT 1", ", 3"]
    assert queries["lean"].description == "full without its extra sections."
    for broken in ("-- begin extra\nSELECT 1\n", "SELECT 1\n-- end extra\n", "SELECT 1\n"):
        with pytest.raises(ValueError, match="extra"):
            parse(f"-- name: full\n-- variant: lean without extra\n{broken}", "t.sql")


def test_the_plain_claim_is_the_claim_without_its_partitions_and_keys():
    full, plain = QUERIES["claim_batch"].text, QUERIES["claim_batch_plain"].text
    flow = (
        "open_keys",
        "key_jobs",
        "counted",
        "idle_partitions",
        "partition_heads",
        "django_pgqueue_concurrency AS conc\n",
        "django_pgqueue_partition AS part",
        "_signal",
    )
    for part in flow:
        assert part in full
        assert part not in plain
    # Both end with the same last row (signals and flow_open false in the plain one).
    assert plain.endswith(full[full.rindex("    summary.flow_open") :])


def test_no_statement_needs_the_job_tables_unique_key_indexes():
    """A segmented job table cannot have pgq_job_idempotency_key or pgq_job_coalesce_key
    (migration 0026): no statement names them as an ON CONFLICT arbiter. (The coalesced
    enqueue function keeps one for the previous release's producers, in a section that
    tests/key_indexes.py drops.)"""
    arbiters = {
        name
        for name, query in QUERIES.items()
        # The job table's partial indexes (the key tables' ON CONFLICT has no WHERE).
        if re.search(r"ON CONFLICT \((idempotency_key|coalesce_key)\) WHERE", query.text)
    }
    assert arbiters == set()


#: Statements sent once per job: by a producer per enqueue, by a worker per attempt.
PER_JOB = (
    "enqueue",
    "enqueue_at",
    "enqueue_after",
    "enqueue_idempotent",
    "enqueue_coalesced",
    "select_by_idempotency_keys",
    "complete_if_leased",
    "fail_if_leased",
    "extend_lease_if_leased",
    "release_if_leased",
    "snooze_if_leased",
    "set_step_if_leased",
)


@pytest.mark.parametrize("name", PER_JOB)
def test_statements_sent_per_job_fit_psycopgs_conversion_cache(name):
    """psycopg converts a query's placeholders once and caches the result only for a
    query of at most MAX_CACHED_STATEMENT_LENGTH bytes and MAX_CACHED_STATEMENT_PARAMS
    parameters; a longer one is converted again on every call, which made a first
    version of the coalesced enqueue twice as slow (performance.md)."""
    query = QUERIES[name]
    assert len(query.text.encode()) <= _queries.MAX_CACHED_STATEMENT_LENGTH
    assert len(query.parameters) <= _queries.MAX_CACHED_STATEMENT_PARAMS
