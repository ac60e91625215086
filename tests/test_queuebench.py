"""``manage.py queuebench``: real runs on the test database, and its input checks.

Figures are only checked for shape (present, positive, consistent), never for speed:
the machine is shared, and speed is what the command reports, not what tests assert.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import asdict
from typing import Any

import psycopg
import pytest

from django_pgqueue.tools.bench import BenchConfig, BenchReport
from django_pgqueue.tools.bench.ceiling import _CEILING_CLAIM, _CEILING_FILL
from django_pgqueue.tools.bench.run import _PREFILL_SQL
from tests import tasks
from tests.database import REPO
from tests.plans import walk

pytestmark = pytest.mark.timeout(300)

QUEUE = "queuebench"


def _queuebench(db_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DATABASE_URL": db_url, "DJANGO_SETTINGS_MODULE": "tests.settings"}
    return subprocess.run(
        [sys.executable, "-m", "tests.manage", "queuebench", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )


def _report(db_url: str, *args: str) -> dict[str, Any]:
    done = _queuebench(db_url, "--json", *args)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _rows(observer: psycopg.Connection[Any], query: str, *params: Any) -> list[tuple[Any, ...]]:
    return observer.execute(query, params).fetchall()


def test_a_noop_run_reports_every_figure_and_leaves_nothing_behind(db_url, observer):
    report = _report(
        db_url,
        *("--jobs", "400", "--repeat", "2", "--processes", "2", "--prefill", "500"),
        *("--single-enqueues", "30", "--latency-jobs", "10", "--latency-rate", "50"),
        *("--io-jobs", "0", "--ceiling-jobs", "250"),
    )
    assert report["config"]["task_path"] == "django_pgqueue.tools.bench.tasks.noop"
    ceilings = report["ceilings_per_second"]
    assert set(ceilings) == {"claim_10", "claim_100", "claim_complete_100"}
    assert all(rate > 0 for rate in ceilings.values())
    assert len(report["drain_per_second"]) == 2
    assert len(report["bulk_enqueue_per_second"]) == 2
    assert all(rate > 0 for rate in report["drain_per_second"] + report["bulk_enqueue_per_second"])
    assert report["drain_median_per_second"] > 0
    assert report["single_enqueue_per_second"] > 0
    assert report["single_enqueue_atomic_per_second"] > 0
    assert report["single_insert_floor_per_second"] > 0
    latency = report["latency_ms"]
    assert latency["samples"] == 10
    assert 0 <= latency["p50"] <= latency["p99"] <= latency["max"]
    assert report["server_version"]
    assert report["django_debug"] is False  # tests/settings.py
    # The benchmark's jobs (prefilled history included), workers and counters are gone.
    assert _rows(observer, "SELECT 1 FROM django_pgqueue_job_all WHERE queue = %s", QUEUE) == []
    assert _rows(observer, "SELECT 1 FROM django_pgqueue_worker WHERE queues ? %s", QUEUE) == []


def test_the_text_report_names_each_figure(db_url):
    done = _queuebench(
        db_url,
        *("--jobs", "200", "--repeat", "1", "--single-enqueues", "10", "--latency-jobs", "0"),
        *("--io-jobs", "100", "--ceiling-jobs", "120"),
    )
    assert done.returncode == 0, done.stderr
    for label in (
        "Django DEBUG is off",
        "single enqueue (autocommit)",
        "single enqueue (in atomic())",
        "plain INSERT + COMMIT (the floor)",
        "bulk enqueue (enqueue_many, 1,000 per call)",
        "I/O-bound, 1 process, 100 jobs of 5 ms: sync",
        "2 processes x concurrency 10, batch 500, prefetch 0, prefetch window 0.05s",
        "drain:",
        "task: django_pgqueue.tools.bench.tasks.noop",
        "raw SQL ceilings, one connection: claim 10 per statement",
        "claim + fenced completion 100",
    ):
        assert label in done.stdout, done.stdout


def test_a_given_task_runs_with_its_arguments(db_url, observer):
    report = _report(
        db_url,
        *("--task", "tests.tasks.add", "--args", "[2]", "--kwargs", '{"b": 3}', "--keep"),
        *("--jobs", "150", "--repeat", "2", "--single-enqueues", "5", "--latency-jobs", "0"),
        *("--io-jobs", "0", "--ceiling-jobs", "0"),
    )
    assert report["config"]["task_path"] == "tests.tasks.add"
    assert report["config"]["args"] == [2]
    assert report["config"]["kwargs"] == {"b": 3}
    outcomes = _rows(
        observer,
        "SELECT task_path, status, result::text, count(*) FROM django_pgqueue_job_all "
        "WHERE queue = %s GROUP BY 1, 2, 3",
        QUEUE,
    )
    assert outcomes == [("tests.tasks.add", "succeeded", "5", 300)]


@pytest.mark.one_server
def test_worker_memory_is_sampled_across_the_run(db_url):
    report = _report(
        db_url,
        *("--jobs", "100", "--repeat", "1", "--single-enqueues", "0", "--latency-jobs", "0"),
        *("--memory-jobs", "20000", "--io-jobs", "0", "--ceiling-jobs", "0"),
    )
    memory = report["memory_rss_mb"]
    assert memory["first"] > 0
    assert memory["last"] > 0
    assert memory["growth_percent"] == pytest.approx(
        (memory["last"] - memory["first"]) / memory["first"] * 100
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--jobs", "0"), "--jobs must be at least 1"),
        (("--prefill", "-1"), "--prefill must be 0 or more"),
        (("--latency-rate", "0"), "--latency-rate must be positive"),
        (("--task", "tests.tasks.no_such_task"), "cannot be imported"),
        (("--task", "tests.tasks.Any"), "not a task"),
        (("--task", "tests.tasks.add", "--args", "[1, 2, 3]"), "do not match tests.tasks.add"),
        (("--task", "tests.tasks.add", "--args", "[1]"), "missing a required argument: 'b'"),
        (("--args", "[1"), "--args is not valid JSON"),
        (("--prefetch-window", "61"), "--prefetch-window must be 0 to 60 seconds"),
        (("--io-jobs", "-1"), "--io-jobs must be 0 or more"),
        (("--ceiling-jobs", "-1"), "--ceiling-jobs must be 0 or more"),
        (("--profile", "fastest"), "invalid choice: 'fastest'"),
        (("--args", '{"a": 1}'), "--args must be a JSON list"),
        (("--kwargs", "[]"), "--kwargs must be a JSON object"),
        (("--task", "tests.tasks.add", "--args", "[NaN, 1]"), "args[0]"),
    ],
)
def test_bad_options_fail_before_anything_is_written(db_url, observer, args, message):
    done = _queuebench(db_url, *args)
    assert done.returncode == 2, done.stderr
    assert message in done.stderr
    assert _rows(observer, "SELECT 1 FROM django_pgqueue_job_all WHERE queue = %s", QUEUE) == []


def test_a_task_that_fails_makes_the_run_fail_with_a_count(db_url):
    done = _queuebench(
        db_url,
        *("--task", "tests.tasks.always_fails", "--jobs", "50", "--repeat", "1"),
        *("--single-enqueues", "0", "--latency-jobs", "0", "--io-jobs", "0", "--ceiling-jobs", "0"),
    )
    assert done.returncode == 1, done.stderr
    assert "queuebench failed: only 0 of 50 benchmark jobs succeeded (50 did not" in done.stderr


def test_the_workers_run_with_the_settings_runqueueworker_would_use(db_url):
    env_settings = {"PGQUEUE_CONCURRENCY": "4", "PGQUEUE_PREFETCH_WINDOW_SECONDS": "0.02"}
    done = subprocess.run(
        [
            *(sys.executable, "-m", "tests.manage", "queuebench", "--json", "--io-jobs", "0"),
            *("--ceiling-jobs", "0"),
            *("--jobs", "100", "--repeat", "1", "--single-enqueues", "0", "--latency-jobs", "0"),
        ],
        cwd=REPO,
        env={
            **os.environ,
            **env_settings,
            "DATABASE_URL": db_url,
            "DJANGO_SETTINGS_MODULE": "tests.settings",
        },
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    config = json.loads(done.stdout)["config"]
    assert (config["concurrency"], config["batch_size"], config["prefetch"]) == (4, 500, 0)
    assert config["prefetch_window"] == 0.02


_SMALL = (
    *("--jobs", "60", "--repeat", "1", "--single-enqueues", "0", "--latency-jobs", "0"),
    *("--io-jobs", "0", "--ceiling-jobs", "0"),
)
# What runqueueworker's own handler writes (management/commands/runqueueworker.py).
_STARTED = re.compile(
    r"^\d{4}-\d\d-\d\d [\d:,]+ INFO \[\d+\] django_pgqueue\.worker: worker \S+ started: "
)


def test_the_workers_run_runqueueworker_and_log_as_it_does(db_url, workers):
    done = _queuebench(db_url, *_SMALL)
    assert done.returncode == 0, done.stderr
    assert (
        "workers: runqueueworker --backend queuebench --queue queuebench --concurrency 10 "
        "--batch-size 500 --prefetch 0 --prefetch-window 0.05 --burst --verbosity 1 "
        "(verbosity 1: their logging is runqueueworker's)"
    ) in done.stdout
    lines = done.stderr.splitlines()
    started = [line for line in lines if _STARTED.match(line)]
    assert len(started) == 2, done.stderr
    assert all("queues=queuebench concurrency=10" in line for line in started)
    # The default verbosity: no line per job, a summary line counting them.
    assert not any(re.search(r"job \d+ (started|succeeded)", line) for line in lines)
    counted = sum(
        int(line.split(": ")[-1].split(" succeeded")[0].replace(",", ""))
        for line in lines
        if "finished in the last" in line
    )
    assert counted == 60, done.stderr
    # runqueueworker started by hand writes the same lines the same way.
    tasks.noop.enqueue()
    worker = workers("--burst")
    assert worker.wait(60) == 0, worker.output()
    assert any(_STARTED.match(line) for line in worker.output().splitlines())


def test_the_workers_take_the_benchmark_verbosity(db_url):
    quiet = _queuebench(db_url, "--verbosity", "0", *_SMALL)
    assert quiet.returncode == 0, quiet.stderr
    assert "--verbosity 0 (verbosity 0: their logging is runqueueworker's)" in quiet.stdout
    assert " INFO " not in quiet.stderr
    chatty = _queuebench(db_url, "--verbosity", "2", *_SMALL)
    assert chatty.returncode == 0, chatty.stderr
    per_job = [line for line in chatty.stderr.splitlines() if re.search(r"job \d+ succeeded", line)]
    assert len(per_job) == 60


def test_the_tuned_profile_and_explicit_options(db_url):
    report = _report(
        db_url,
        *("--profile", "tuned", "--prefetch", "50", "--jobs", "100", "--repeat", "1"),
        *("--single-enqueues", "0", "--latency-jobs", "0", "--io-jobs", "0", "--ceiling-jobs", "0"),
    )
    config = report["config"]
    # The profile's settings, except the one given explicitly.
    assert (config["concurrency"], config["batch_size"], config["prefetch"]) == (1, 500, 50)


@pytest.mark.one_server
def test_io_bound_runs_report_sync_and_async_rates(db_url, observer):
    report = _report(
        db_url,
        *("--jobs", "100", "--repeat", "1", "--single-enqueues", "0", "--latency-jobs", "0"),
        *("--io-jobs", "200", "--io-concurrency", "50", "--concurrency", "4", "--keep"),
    )
    assert set(report["io_per_second"]) == {"sync", "async"}
    assert all(rate > 0 for rate in report["io_per_second"].values())
    ran = dict(
        _rows(
            observer,
            "SELECT task_path, count(*) FROM django_pgqueue_job_all "
            "WHERE queue = %s AND status = 'succeeded' GROUP BY 1",
            QUEUE,
        )
    )
    assert ran == {
        "django_pgqueue.tools.bench.tasks.noop": 100,
        "django_pgqueue.tools.bench.tasks.io_sync": 200,
        "django_pgqueue.tools.bench.tasks.io_async": 200,
    }


def test_the_claim_ceiling_walks_the_claims_own_index(observer):
    # The ceiling is only a ceiling of *our* claim if it reads the rows the same way: a
    # plan that sorted every pending row would make the drain look close to it.
    observer.execute(_CEILING_FILL, {"queue": QUEUE, "rows": 5000})
    observer.execute(_PREFILL_SQL, {"queue": QUEUE, "rows": 20000})
    observer.execute("ANALYZE django_pgqueue_job")
    plan = observer.execute(
        "EXPLAIN (FORMAT JSON) " + _CEILING_CLAIM, {"queue": QUEUE, "limit": 100}
    ).fetchone()[0]
    nodes = list(walk(plan[0]["Plan"]))
    scans = [
        (node["Node Type"], node.get("Index Name"))
        for node in nodes
        if node.get("Relation Name") == "django_pgqueue_job"
    ]
    assert ("Index Scan", "pgq_job_claim") in scans, scans
    assert not any(node == "Seq Scan" for node, _ in scans), scans
    assert not any(node["Node Type"] == "Sort" for node in nodes), nodes


def test_the_text_report_warns_when_django_debug_is_on():
    config = asdict(BenchConfig(concurrency=10, batch_size=500, prefetch=0, prefetch_window=0.05))
    assert "DEBUG is on" in BenchReport(config=config, django_debug=True).as_text()
    assert "DEBUG is on" not in BenchReport(config=config, django_debug=False).as_text()
