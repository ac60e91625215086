"""The Flow control page and what the job page says about a job held back by a limit."""

from __future__ import annotations

import pytest

from tests.admin_fixtures import enqueue, login, store, text_of, url

pytestmark = [pytest.mark.timeout(60), pytest.mark.django_db]


def _tenant_at_its_limit():
    jobs = [
        enqueue(concurrency_key="tenant:42", concurrency_limit=2, kwargs={"a": n, "b": 1})
        for n in range(3)
    ]
    claimed = store().claim("web-1:100", ["default"], per_queue=10, lease_seconds=30)
    assert sorted(c.id for c in claimed) == [jobs[0].pk, jobs[1].pk]
    return jobs


def test_the_job_page_says_what_a_limited_job_waits_for(client):
    login(client, superuser=True)
    jobs = _tenant_at_its_limit()
    waiting = text_of(client.get(url("django_pgqueue_job_change", jobs[2].pk)).text)
    assert "Waiting for concurrency key tenant:42 (2/2 in flight)" in waiting
    running = text_of(client.get(url("django_pgqueue_job_change", jobs[0].pk)).text)
    assert "Counts against concurrency key tenant:42 (2/2 in flight)" in running


def test_the_job_page_says_when_a_rate_limit_holds_a_job(client):
    login(client, superuser=True)
    jobs = [enqueue(concurrency_key="label-api", rate_limit="1/h") for _ in range(2)]
    claimed = store().claim("web-1:100", ["default"], per_queue=10, lease_seconds=30)
    assert [c.id for c in claimed] == [jobs[0].pk]
    text = text_of(client.get(url("django_pgqueue_job_change", jobs[1].pk)).text)
    assert "Waiting for the rate limit of key label-api (1 per 3600 s; 1 started this period)" in (
        text
    )


def test_the_flow_control_page_lists_each_key(client):
    login(client, superuser=True)
    _tenant_at_its_limit()
    enqueue(concurrency_key="label-api", rate_limit="20/s")
    store().fold_partition_signals()  # as the next claim would
    response = client.get(url("django_pgqueue_concurrencykey_changelist"))
    assert response.status_code == 200
    text = text_of(response.text)
    assert "tenant:42" in text
    assert "tenant:42 default 2/2" in text  # in flight, of the limit
    assert "label-api" in text
    assert "20/1s · 0 used" in text
    assert 'title="20 per 1 s; 0 started this period"' in response.text  # in words


def test_the_flow_control_page_is_read_only(client):
    login(client, superuser=True)
    _tenant_at_its_limit()
    response = client.get(url("django_pgqueue_concurrencykey_changelist"))
    assert "Add concurrency key" not in response.text
    assert client.get(url("django_pgqueue_concurrencykey_add")).status_code == 403


def test_an_empty_flow_control_page_says_why(client):
    login(client, superuser=True)
    page = client.get(url("django_pgqueue_concurrencykey_changelist")).text
    assert "0 concurrency keys with work" in page
    assert "0 flow control" not in page
    assert 'id="pgq-flow-empty"' in page
    assert "once its last job has finished it leaves this page" in page
