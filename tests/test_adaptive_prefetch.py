"""Adaptive prefetch: sized by the measured finishing rate, and bounded when jobs stall.

The promises, and how each could break:

* fast jobs make a worker hold more than its threads (or it would claim a handful of
  jobs per round trip);
* with the window at 0 it never holds more than its threads plus ``--prefetch``;
* a job held behind a handler that turned slow is handed back after ``hold_seconds``
  and another worker runs it, once, with its attempt refunded (not held hostage);
* a thread starting a job and the dispatcher handing it back never both win.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import psycopg
import pytest
from hypothesis import given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from django_pgqueue.models import Job
from django_pgqueue.store.values import JobSpec
from django_pgqueue.worker import Worker, WorkerOptions
from django_pgqueue.worker.flight import InFlight
from django_pgqueue.worker.pacing import AdaptivePrefetch

pytestmark = pytest.mark.timeout(90)


@pytest.fixture
def in_process_ledger() -> Any:
    """Close the ledger connection the in-process handlers opened (it holds the test
    database open otherwise)."""
    from tests import ledger

    yield ledger
    if ledger._connection is not None:
        ledger._connection.close()
        ledger._connection = None


def test_the_extra_follows_the_rate_of_the_last_second_up_to_the_cap():
    pace = AdaptivePrefetch(window=0.05, cap=100)
    assert pace.extra(now=10.0) == 0  # nothing finished yet: no bet
    pace.finished(400, now=10.0)
    assert pace.extra(now=10.5) == 20  # 400 jobs/s x 50 ms
    pace.finished(4000, now=10.6)
    assert pace.extra(now=10.7) == 100  # capped at the batch size
    assert pace.extra(now=11.05) == 100  # the 4,000 are still within the last second
    assert pace.extra(now=11.7) == 0  # a stalled worker stops prefetching within a second
    assert pace.hold_seconds == 1.0
    assert AdaptivePrefetch(window=0.2, cap=10).hold_seconds == pytest.approx(4.0)


def test_a_burst_reads_its_rate_over_the_time_it_has_run_not_the_whole_second():
    # 250 jobs in the first tenth of a second of a burst: 1,000/s over the shortest span
    # (the first sample's 50 finished before it began), not 250/s over a whole second.
    pace = AdaptivePrefetch(window=0.05, cap=500)
    pace.finished(50, now=10.0)
    pace.finished(100, now=10.05)
    pace.finished(100, now=10.1)
    assert pace.extra(now=10.1) == 50  # 200 jobs / 0.2 s x 50 ms
    assert pace.extra(now=10.5) == 20  # no more finished: 200 / 0.5 s
    pace.finished(400, now=10.5)
    assert pace.extra(now=10.5) == 60  # 600 / 0.5 s x 50 ms


def test_two_outcome_batches_a_moment_apart_are_not_read_as_a_flood():
    # A hundred slow jobs ending together, recorded in two writes a millisecond apart.
    pace = AdaptivePrefetch(window=0.05, cap=500)
    pace.finished(50, now=10.0)
    pace.finished(50, now=10.001)
    assert pace.extra(now=10.002) == 12  # 50 / 0.2 s x 50 ms, not 50 / 2 ms


def test_short_jobs_reach_the_cap_within_milliseconds_of_a_burst():
    # Ten threads of no-op jobs (50 us each): 300 finished in the burst's first 20 ms.
    # The cautious reading (300 / 0.2 s) would hold 75; their run times say the threads
    # could finish far more, so the span is read as it is: 15,000/s, capped at 500.
    pace = AdaptivePrefetch(window=0.05, cap=500, concurrency=10)
    pace.finished(10, now=10.0, run_times=[50e-6] * 10)
    pace.finished(100, now=10.01, run_times=[50e-6] * 100)
    pace.finished(200, now=10.02, run_times=[50e-6] * 200)
    assert pace.extra(now=10.02) == 500
    without_run_times = AdaptivePrefetch(window=0.05, cap=500, concurrency=10)
    for count, at in ((10, 10.0), (100, 10.01), (200, 10.02)):
        without_run_times.finished(count, now=at)
    assert without_run_times.extra(now=10.02) == 75


def test_slow_jobs_ending_together_are_not_read_as_a_flood_from_their_run_times():
    # A hundred one-second async jobs (concurrency 100) ending within 2 ms: the handlers
    # finish at most 100/s, so the quick reading is 100/s, below the cautious 250/s.
    pace = AdaptivePrefetch(window=0.05, cap=500, concurrency=100)
    pace.finished(50, now=10.0, run_times=[1.0] * 50)
    pace.finished(50, now=10.002, run_times=[1.0] * 50)
    assert pace.extra(now=10.002) == 12  # 50 / 0.2 s x 50 ms, as without run times


def test_a_fast_job_beside_stalled_threads_reads_the_rate_that_is_finishing():
    # Nine threads stuck in long handlers, one running 1 ms jobs: only what finishes
    # counts, 1,000/s, so the worker holds 50 (they start within the window).
    pace = AdaptivePrefetch(window=0.05, cap=500, concurrency=10)
    for tick in range(21):
        pace.finished(10, now=10.0 + tick * 0.01, run_times=[0.001] * 10)
    assert pace.extra(now=10.2) == 50


def test_jobs_given_back_unstarted_do_not_count_as_fast():
    # Released before they started: no run time, so only the cautious reading applies.
    pace = AdaptivePrefetch(window=0.05, cap=500, concurrency=10)
    pace.finished(200, now=10.0, run_times=[0.0] * 200)
    pace.finished(200, now=10.01, run_times=[0.0] * 200)
    assert pace.extra(now=10.01) == 50  # 200 / 0.2 s x 50 ms


@hypothesis_settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.floats(0, 0.3), st.integers(0, 2_000)), min_size=0, max_size=40),
    st.floats(0, 2),
    st.integers(1, 1_000),
)
def test_the_extra_stays_within_the_cap_and_what_the_last_second_finished(
    steps: list[tuple[float, int]], after: float, cap: int
):
    pace = AdaptivePrefetch(window=0.05, cap=cap)
    now = 100.0
    samples = []
    for gap, count in steps:
        now += gap
        pace.finished(count, now=now)
        if count:
            samples.append((now, count))
    now += after
    recent = sum(count for at, count in samples if at > now - 1.0)
    extra = pace.extra(now=now)
    assert 0 <= extra <= cap
    # Never more than the last second's finishes read over the shortest span.
    assert extra <= int(recent / 0.2 * 0.05)
    if recent == 0:
        assert extra == 0


@hypothesis_settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.floats(0, 0.3), st.integers(0, 2_000), st.floats(1e-5, 3.0)),
        max_size=40,
    ),
    st.floats(0, 2),
    st.integers(1, 1_000),
    st.integers(1, 500),
)
def test_the_quick_reading_never_exceeds_what_the_handlers_finish(
    steps: list[tuple[float, int, float]], after: float, cap: int, concurrency: int
):
    # Whatever the timing of the outcome batches, the extra is within the cap, zero
    # after a second without finishes, and above the cautious reading only as far as
    # `concurrency` handlers at the measured mean run time could finish.
    pace = AdaptivePrefetch(window=0.05, cap=cap, concurrency=concurrency)
    now = 100.0
    samples = []
    for gap, count, run_time in steps:
        now += gap
        pace.finished(count, now=now, run_times=[run_time] * count)
        if count:
            samples.append((now, count, run_time))
    now += after
    recent = [(count, run_time) for at, count, run_time in samples if at > now - 1.0]
    finished = sum(count for count, _ in recent)
    extra = pace.extra(now=now)
    assert 0 <= extra <= cap
    if finished == 0:
        assert extra == 0
        return
    busy = sum(count * run_time for count, run_time in recent)
    handlers = concurrency * finished / busy
    assert extra <= max(int(finished / 0.2 * 0.05), int(handlers * 0.05) + 1)


@pytest.mark.parametrize("rate", [20, 400, 5_000])
def test_a_steady_rate_reads_as_itself(rate: int):
    pace = AdaptivePrefetch(window=0.05, cap=10_000)
    for tick in range(40):  # 2 s of outcome batches every 50 ms
        pace.finished(rate // 20, now=10.0 + tick * 0.05)
    assert pace.extra(now=11.95) == pytest.approx(rate * 0.05, rel=0.1, abs=1)


def test_a_window_of_zero_turns_it_off():
    pace = AdaptivePrefetch(window=0.0, cap=100)
    pace.finished(100_000, now=1.0)
    assert not pace.enabled
    assert pace.extra(now=1.0) == 0


@pytest.mark.parametrize("window", [-0.1, 61, float("nan"), True, "0.05"])
def test_an_invalid_window_is_refused_by_name(window: Any):
    with pytest.raises(Exception, match="--prefetch-window"):
        WorkerOptions.from_settings(prefetch_window=window)


def test_the_window_defaults_to_the_setting(settings):
    assert WorkerOptions.from_settings().prefetch_window == 0.05
    settings.PGQUEUE_PREFETCH_WINDOW_SECONDS = 0
    assert WorkerOptions.from_settings().prefetch_window == 0.0


def test_begin_and_withdraw_never_both_win():
    """Thousands of races between a thread starting an attempt and its withdrawal."""
    from django_pgqueue.store.values import ClaimedJob

    job = ClaimedJob.__new__(ClaimedJob)
    for _ in range(2000):
        flight = InFlight(job, None)
        barrier = threading.Barrier(2)
        won: dict[str, bool] = {}

        def start(
            flight: InFlight = flight,
            barrier: threading.Barrier = barrier,
            won: dict[str, bool] = won,
        ) -> None:
            barrier.wait()
            won["begin"] = flight.begin()

        thread = threading.Thread(target=start)
        thread.start()
        barrier.wait()
        won["withdraw"] = flight.withdraw()
        thread.join(5)
        assert won["begin"] != won["withdraw"], won
        assert (flight.started_at is not None) == won["begin"]
        assert flight.abandoned == won["withdraw"]


def _max_held(worker: Worker, stop: threading.Event) -> list[int]:
    """The most jobs the worker held running or waiting to start at once.

    Attempts whose handler returned and whose outcome waits for the recorder are left
    out: they take no slot (the next claim overlaps their write), only their lease.
    """
    seen = [0]

    def sample() -> None:
        while not stop.is_set():
            with worker._flights_lock:
                held = sum(1 for flight in worker._flights.values() if flight.busy)
            seen[0] = max(seen[0], held)
            time.sleep(0.0005)

    threading.Thread(target=sample, daemon=True).start()
    return seen


@pytest.mark.parametrize(("window", "may_exceed"), [(0.05, True), (0.0, False)])
def test_fast_jobs_make_a_worker_hold_more_than_its_threads(db_url, window, may_exceed):
    Job.objects.enqueue_many([JobSpec("tests.tasks.noop") for _ in range(3000)])
    options = WorkerOptions.from_settings(
        burst=True, handle_signals=False, concurrency=2, prefetch=0, prefetch_window=window
    )
    worker = Worker(options)
    stop = threading.Event()
    held = _max_held(worker, stop)
    thread = threading.Thread(target=worker.run)
    thread.start()
    thread.join(60)
    stop.set()
    assert not thread.is_alive()
    assert worker.processed == 3000
    if may_exceed:
        assert held[0] > options.concurrency, held
        assert held[0] <= options.concurrency + options.batch_size, held
    else:
        assert held[0] <= options.concurrency, held


def test_jobs_held_behind_a_slow_handler_are_handed_back_to_another_worker(
    db_url, observer: psycopg.Connection[Any], in_process_ledger: Any
):
    fast = [JobSpec("tests.tasks.ledger_sleep", kwargs={"label": "warm"}) for _ in range(400)]
    fast.append(JobSpec("tests.tasks.ledger_sleep", kwargs={"seconds": 6, "label": "slow"}))
    fast += [JobSpec("tests.tasks.ledger_sleep", kwargs={"label": "behind"}) for _ in range(300)]
    outcomes = Job.objects.enqueue_many(fast)
    slow_id = outcomes[400].id
    first = Worker(
        WorkerOptions.from_settings(
            burst=False, handle_signals=False, concurrency=1, prefetch=0, prefetch_window=0.05
        )
    )
    threads = [threading.Thread(target=first.run)]
    threads[0].start()
    # The second worker starts once the first one runs the slow job: every job still
    # pending is either held by the first worker or free for the second.
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        row = observer.execute(
            "SELECT claimed_by FROM tests_ledgerentry l JOIN django_pgqueue_job_all j "
            "ON j.id = l.job_id WHERE l.job_id = %s AND l.event = 'start'",
            [slow_id],
        ).fetchone()
        if row:
            break
        time.sleep(0.01)
    else:
        pytest.fail("the slow job never started")
    assert row[0] == first.id
    held_behind = observer.execute(
        "SELECT count(*) FROM django_pgqueue_job_all WHERE status = 'processing' AND id > %s",
        [slow_id],
    ).fetchone()[0]
    assert held_behind > 0, "the first worker prefetched nothing behind the slow job"
    second = Worker(
        WorkerOptions.from_settings(
            burst=False, handle_signals=False, concurrency=1, prefetch=0, prefetch_window=0
        )
    )
    threads.append(threading.Thread(target=second.run))
    threads[1].start()
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            left = observer.execute(
                "SELECT count(*) "
                "FROM django_pgqueue_job_all WHERE status <> 'succeeded' AND id > %s",
                [slow_id],
            ).fetchone()[0]
            if not left:
                break
            time.sleep(0.05)
        slow_status = observer.execute(
            "SELECT status FROM django_pgqueue_job_all WHERE id = %s", [slow_id]
        ).fetchone()[0]
    finally:
        first.request_stop()
        second.request_stop()
        for thread in threads:
            thread.join(30)
    assert left == 0, f"{left} jobs behind the slow one never ran"
    # They all ran while the slow handler was still running: not held hostage.
    assert slow_status == "processing"
    handed_back = observer.execute(
        "SELECT count(*) FROM django_pgqueue_job_all WHERE id > %s AND claimed_by = %s",
        [slow_id, second.id],
    ).fetchone()[0]
    assert handed_back >= held_behind
    # Each ran once, in its first (refunded) attempt.
    runs = observer.execute(
        "SELECT j.id, j.attempts, count(l.*) FILTER (WHERE l.event = 'start') "
        "FROM django_pgqueue_job_all j LEFT JOIN tests_ledgerentry l ON l.job_id = j.id "
        "WHERE j.id > %s GROUP BY j.id, j.attempts",
        [slow_id],
    ).fetchall()
    assert len(runs) == 300
    assert {(attempts, starts) for _, attempts, starts in runs} == {(1, 1)}


def test_a_job_handed_back_and_claimed_again_by_the_same_worker_runs_once(
    db_url, observer: psycopg.Connection[Any], in_process_ledger: Any
):
    # One worker alone: the jobs it hands back while its slow job runs come back to it
    # once that job ends, under a new lease generation. The withdrawn attempt's entry
    # (same job id, older generation) must neither run the job nor end the new attempt.
    specs = [JobSpec("tests.tasks.ledger_sleep", kwargs={"label": "warm"}) for _ in range(400)]
    specs.append(JobSpec("tests.tasks.ledger_sleep", kwargs={"seconds": 3, "label": "slow"}))
    specs += [JobSpec("tests.tasks.ledger_sleep", kwargs={"label": "behind"}) for _ in range(200)]
    slow_id = Job.objects.enqueue_many(specs)[400].id
    worker = Worker(
        WorkerOptions.from_settings(
            burst=False, handle_signals=False, concurrency=1, prefetch=0, prefetch_window=0.05
        )
    )
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        deadline = time.monotonic() + 40
        while time.monotonic() < deadline:
            left = observer.execute(
                "SELECT count(*) "
                "FROM django_pgqueue_job_all WHERE status <> 'succeeded' AND id >= %s",
                [slow_id],
            ).fetchone()[0]
            if not left:
                break
            time.sleep(0.05)
    finally:
        worker.request_stop()
        thread.join(30)
    assert left == 0
    runs = observer.execute(
        "SELECT j.id, j.attempts, j.lease_generation, j.claimed_by, "
        "count(l.*) FILTER (WHERE l.event = 'start'), count(l.*) FILTER (WHERE l.event = 'end') "
        "FROM django_pgqueue_job_all j LEFT JOIN tests_ledgerentry l ON l.job_id = j.id "
        "WHERE j.id > %s GROUP BY j.id, j.attempts, j.lease_generation, j.claimed_by",
        [slow_id],
    ).fetchall()
    assert len(runs) == 200
    regained = [run for run in runs if run[2] > 1]
    assert regained, "no job was handed back while the slow one ran"
    for _, attempts, _, claimed_by, starts, ends in runs:
        assert (attempts, starts, ends, claimed_by) == (1, 1, 1, worker.id)
