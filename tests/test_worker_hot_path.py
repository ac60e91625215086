"""Shortcuts on the per-job path of a worker, held to what they replace.

* the claim decodes ``[]`` and ``{}`` without the JSON parser: the values must equal what
  the parser returns, and be fresh containers (a task may change what it is given);
* an attempt's cancel event is made on first use: whoever asks first (the handler's
  context, the worker cancelling it) must get the same event, even at the same instant.
"""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest
from hypothesis import given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from django_pgqueue.models import Job
from django_pgqueue.store.queue import QueueStore
from django_pgqueue.store.statements.base import loads_json as _loads_json
from django_pgqueue.store.values import ClaimedJob, JobSpec
from django_pgqueue.worker.flight import InFlight

pytestmark = pytest.mark.timeout(120)

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)


@hypothesis_settings(max_examples=300, deadline=None)
@given(json_values, st.sampled_from([None, 0, 2]))
def test_decoding_equals_the_json_parser(value: Any, indent: int | None):
    text = json.dumps(value, indent=indent)
    assert _loads_json(text) == json.loads(text)
    assert type(_loads_json(text)) is type(json.loads(text))


def test_empty_containers_are_fresh_each_time():
    first, second = _loads_json("[]"), _loads_json("[]")
    first.append(1)
    assert second == []
    assert _loads_json("[]") == []
    mapping = _loads_json("{}")
    mapping["changed"] = True
    assert _loads_json("{}") == {}


def test_claimed_jobs_get_their_arguments_and_fresh_empty_ones(store: QueueStore):
    Job.objects.enqueue_many(
        [
            JobSpec("tests.tasks.noop"),
            JobSpec("tests.tasks.noop"),
            JobSpec("tests.tasks.noop", args=[[], {}], kwargs={"a": [1, {"b": None}]}),
        ]
    )
    jobs = sorted(store.claim("w", ["default"], per_queue=10, lease_seconds=60), key=lambda j: j.id)
    assert [(j.args, j.kwargs, j.prior_workers) for j in jobs] == [
        ([], {}, []),
        ([], {}, []),
        ([[], {}], {"a": [1, {"b": None}]}, []),
    ]
    jobs[0].args.append("mine")
    jobs[0].kwargs["mine"] = 1
    assert (jobs[1].args, jobs[1].kwargs) == ([], {})


def test_every_asker_gets_the_same_cancel_event():
    job = ClaimedJob.__new__(ClaimedJob)
    for _ in range(500):
        flight = InFlight(job, None)
        barrier = threading.Barrier(4)
        got: list[threading.Event] = []

        def ask(
            flight: InFlight = flight,
            barrier: threading.Barrier = barrier,
            got: list[threading.Event] = got,
        ) -> None:
            barrier.wait()
            got.append(flight.cancel)

        threads = [threading.Thread(target=ask) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(10)
        assert len(got) == 4
        assert all(event is got[0] for event in got)
        got[0].set()
        assert flight.cancel.is_set()
