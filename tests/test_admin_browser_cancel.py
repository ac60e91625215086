"""End to end in a real headless Chromium: an operator cancels a running job from its page.

A real worker runs a task that polls ``context.cancelled``; the operator presses
"Cancel" on the job's page, confirms, the handler is told, and once it returned the job
is cancelled.
"""

from __future__ import annotations

import pytest

from django_pgqueue.models import Job
from django_pgqueue.states import JobStatus
from tests import ledger
from tests.test_admin_browser import _click_and_wait, _log_in, browser  # noqa: F401
from tests.workers import wait_for

pytestmark = [pytest.mark.browser, pytest.mark.timeout(180)]


def test_operator_cancels_a_running_job_from_its_page(live_server, browser, observer, workers):  # noqa: F811
    from selenium.webdriver.common.by import By

    worker = workers("--queue", "default")
    worker.wait_registered(observer)
    job = Job.objects.enqueue("tests.tasks.ledger_until_cancelled")
    wait_for(
        lambda: any(e["event"] == "start" for e in ledger.entries(observer, job.pk)),
        timeout=30,
        message=f"job {job.pk} to start\n{worker.output()}",
    )
    base = live_server.url
    _log_in(browser, base)
    browser.get(f"{base}/admin/django_pgqueue/job/{job.pk}/change/")
    assert "Processing" in browser.find_element(By.ID, "content-main").text
    _click_and_wait(
        browser, browser.find_element(By.CSS_SELECTOR, ".pgq-operations input[value='Cancel']")
    )
    confirmation = browser.find_element(By.ID, "content-main").text
    assert "Running jobs are asked to stop" in confirmation
    _click_and_wait(
        browser, browser.find_element(By.CSS_SELECTOR, "#content-main input[type=submit]")
    )
    messages = browser.find_element(By.CSS_SELECTOR, "ul.messagelist").text
    assert "Cancelled 1 job." in messages
    assert f"#{job.pk} was running: its handler was asked to stop" in messages
    wait_for(
        lambda: any(e["event"] == "cancelled" for e in ledger.entries(observer, job.pk)),
        timeout=10,
        message="the handler to be told",
    )
    # Once its handler returned, the job ends cancelled.
    wait_for(
        lambda: Job.objects.get(pk=job.pk).status == JobStatus.CANCELLED,
        timeout=10,
        message="the job to end cancelled",
    )
    browser.get(f"{base}/admin/django_pgqueue/job/{job.pk}/change/")
    assert "Cancelled" in browser.find_element(By.ID, "content-main").text
    assert not browser.find_elements(By.CSS_SELECTOR, ".pgq-operations input[value='Cancel']")
