"""End to end in a real headless Chromium: log in, visit every admin page, retry a dead
letter through the action and its confirmation, and see a real worker run it.

Screenshots of the pages are taken on realistic data; `make screenshots` (which sets
PGQUEUE_SCREENSHOTS) saves them to docs/_static/admin/ for the documentation. Debian's
chromium and chromedriver are used; nothing is downloaded.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User

from django_pgqueue.manager import Failure, JobSpec
from tests.admin_seed import seed
from tests.workers import wait_for

pytestmark = [pytest.mark.browser, pytest.mark.timeout(300)]

# `make screenshots` refreshes the documentation's images; otherwise they go to a
# temporary folder, so a test run does not rewrite tracked files.
SCREENSHOTS = (
    Path(os.environ["PGQUEUE_SCREENSHOTS"])
    if os.environ.get("PGQUEUE_SCREENSHOTS")
    else Path(tempfile.gettempdir()) / "django-pgqueue-screenshots"
)
CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
WIDTH = 1440


@pytest.fixture
def browser() -> Iterator[Any]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    if not (Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()):
        pytest.fail("Debian's chromium and chromium-driver are needed (see .ci/ensure-browser)")
    profile = tempfile.mkdtemp(prefix="pgq-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        f"--user-data-dir={profile}",
        f"--window-size={WIDTH},900",
    ):
        options.add_argument(argument)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.implicitly_wait(5)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def _screenshot(driver: Any, name: str) -> None:
    """Save the whole page (up to 2,000 pixels high) as <SCREENSHOTS>/<name>.png."""
    height = driver.execute_script("return document.documentElement.scrollHeight")
    driver.set_window_size(WIDTH, min(max(height, 700), 2000))
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    assert driver.save_screenshot(str(SCREENSHOTS / f"{name}.png"))
    driver.set_window_size(WIDTH, 900)


def _click_and_wait(driver: Any, element: Any) -> None:
    """Click something that loads a new page, and wait until the new page replaced the old."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions
    from selenium.webdriver.support.ui import WebDriverWait

    old_page = driver.find_element(By.TAG_NAME, "html")
    element.click()
    WebDriverWait(driver, 30).until(expected_conditions.staleness_of(old_page))


def _dead_letter_to_retry(store: Any) -> int:
    job = store.enqueue(JobSpec("tests.tasks.add", queue="high", args=[2, 3], max_attempts=1)).job
    (claimed,) = store.claim("web-7:77", ["high"], per_queue=1, lease_seconds=30)
    assert claimed.id == job.pk
    store.fail_if_leased(
        claimed.lease,
        Failure(
            "ConnectionError",
            "payment gateway unreachable",
            'Traceback (most recent call last):\n  File "tasks.py", line 12, in add\n'
            "ConnectionError: payment gateway unreachable",
        ),
    )
    return job.pk


def test_operator_retries_a_dead_letter_and_sees_it_run(
    live_server, browser, store, observer, workers
):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    seed(observer, finished=20_000, ready=2_000, scheduled=500, processing=40, expired=5)
    job_id = _dead_letter_to_retry(store)
    User.objects.create_superuser("operator", password="correct horse")
    base = live_server.url
    dead_sample = observer.execute(
        "SELECT max(id) FROM django_pgqueue_job "
        "WHERE status = 'dead_letter' AND task_path = 'shop.tasks.send_receipt'"
    ).fetchone()[0]

    # Log in.
    browser.get(f"{base}/admin/")
    browser.find_element(By.NAME, "username").send_keys("operator")
    browser.find_element(By.NAME, "password").send_keys("correct horse")
    _click_and_wait(browser, browser.find_element(By.CSS_SELECTOR, "input[type=submit]"))
    assert "Site administration" in browser.title
    # Screenshots without the navigation sidebar: the listings need the width.
    browser.execute_script("localStorage.setItem('django.admin.navSidebarIsOpen', 'false')")

    # A worker serving the dead letter's queue (the seeded jobs use other queues).
    worker = workers("--queue", "high", "--concurrency", "2")
    worker.wait_registered(observer)

    # Every page renders; each gets its screenshot.
    browser.get(f"{base}/admin/django_pgqueue/job/")
    assert browser.find_element(By.ID, "result_list")
    _screenshot(browser, "inbox")
    browser.get(f"{base}/admin/django_pgqueue/job/{dead_sample}/change/")
    assert "Attempt 3" in browser.page_source
    _screenshot(browser, "job_detail")
    browser.get(f"{base}/admin/django_pgqueue/deadletter/groups/")
    assert browser.find_element(By.ID, "pgq-groups")
    _screenshot(browser, "dead_letter_groups")
    browser.get(f"{base}/admin/django_pgqueue/deadletter/")
    assert browser.find_element(By.ID, "result_list")
    _screenshot(browser, "dead_letters")
    browser.get(f"{base}/admin/django_pgqueue/job/lag/")
    assert browser.find_element(By.CSS_SELECTOR, "svg.pgq-chart")
    _screenshot(browser, "lag")
    browser.get(f"{base}/admin/django_pgqueue/worker/")
    assert f":{worker.pid}" in browser.find_element(By.ID, "result_list").text
    _screenshot(browser, "workers")

    # Retry the dead letter: select it, pick the action, confirm.
    browser.get(f"{base}/admin/django_pgqueue/deadletter/?queue=high")
    browser.find_element(By.CSS_SELECTOR, f"input.action-select[value='{job_id}']").click()
    Select(browser.find_element(By.NAME, "action")).select_by_value("retry_now")
    _click_and_wait(browser, browser.find_element(By.CSS_SELECTOR, "#changelist-form [name=index]"))
    assert "selected job" in browser.find_element(By.ID, "content-main").text
    _click_and_wait(
        browser, browser.find_element(By.CSS_SELECTOR, "#content-main input[type=submit]")
    )
    assert "Retried 1 job." in browser.find_element(By.CSS_SELECTOR, "ul.messagelist").text

    # The worker runs it; the job page shows the result.
    wait_for(
        lambda: observer.execute(
            "SELECT status = 'succeeded' FROM django_pgqueue_job WHERE id = %s", [job_id]
        ).fetchone()[0],
        timeout=60,
        message=f"job {job_id} to run\n{worker.output()}",
    )
    browser.get(f"{base}/admin/django_pgqueue/job/{job_id}/change/")
    page = browser.find_element(By.ID, "content-main").text
    assert "Succeeded" in page
    assert "ConnectionError" in page  # the error history of the failed attempt stays
    assert browser.find_element(By.ID, "pgq-result").text.strip() == "5"
