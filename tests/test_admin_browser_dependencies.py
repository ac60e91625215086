"""In a real headless Chromium: a dead letter's cancelled dependents, revived by the
operator through "Retry and revive dependents", then run by a real worker in order."""

from __future__ import annotations

import pytest

from django_pgqueue.store.values import Failure, JobSpec
from tests.test_admin_browser import _click_and_wait, _log_in, browser  # noqa: F401
from tests.workers import wait_for

pytestmark = [pytest.mark.browser, pytest.mark.timeout(300)]


def test_operator_revives_the_dependents_of_a_dead_letter(
    live_server,
    browser,  # noqa: F811
    store,
    observer,
    workers,
):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    blocker = store.enqueue(JobSpec("tests.tasks.add", queue="high", args=[2, 3], max_attempts=1))
    dependent = store.enqueue(
        JobSpec("tests.tasks.add", queue="high", args=[4, 5], after=[blocker.id])
    )
    (claimed,) = store.claim("web-7:77", ["high"], per_queue=1, lease_seconds=30)
    store.fail_if_leased(claimed.lease, Failure("ConnectionError", "gateway unreachable"))
    base = live_server.url
    _log_in(browser, base)

    # The dead-letter page counts the dependent its failure cancelled.
    browser.get(f"{base}/admin/django_pgqueue/deadletter/?queue=high")
    assert "1 cancelled" in browser.find_element(By.ID, "result_list").text
    browser.find_element(By.CSS_SELECTOR, f"input.action-select[value='{blocker.id}']").click()
    Select(browser.find_element(By.NAME, "action")).select_by_value("retry_and_revive")
    _click_and_wait(browser, browser.find_element(By.CSS_SELECTOR, "#changelist-form [name=index]"))
    revived = browser.find_element(By.ID, "pgq-cancelled-dependents").text
    assert f"#{dependent.id}" in revived
    _click_and_wait(
        browser, browser.find_element(By.CSS_SELECTOR, "#content-main input[type=submit]")
    )
    assert "revived" in browser.find_element(By.CSS_SELECTOR, "ul.messagelist").text

    # A worker runs the blocker, then the dependent; the dependent's page links both ways.
    worker = workers("--queue", "high", "--concurrency", "2")
    wait_for(
        lambda: observer.execute(
            "SELECT status = 'succeeded' FROM django_pgqueue_job_all WHERE id = %s", [dependent.id]
        ).fetchone()[0],
        timeout=60,
        message=f"job {dependent.id} to run\n{worker.output()}",
    )
    browser.get(f"{base}/admin/django_pgqueue/job/{dependent.id}/change/")
    runs_after = browser.find_element(By.ID, "pgq-runs-after")
    assert f"#{blocker.id}" in runs_after.text
    assert "Succeeded" in runs_after.text
    assert browser.find_element(By.ID, "pgq-result").text.strip() == "9"
