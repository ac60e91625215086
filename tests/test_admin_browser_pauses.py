"""In a real headless Chromium: an operator pauses a queue in two clicks from the lag page
or the inbox (the queue's button, then "Yes, pause") and resumes it, at laptop and phone
sizes; the confirmation page, the banner and the badge fit."""

from __future__ import annotations

from typing import Any

import pytest

from django_pgqueue import paused_queues, resume_queue
from django_pgqueue.store.values import JobSpec
from tests.test_admin_browser import (  # noqa: F401 (browser is a fixture)
    LAPTOP,
    PHONE,
    Size,
    _check_page,
    _click_and_wait,
    _log_in,
    _resize,
    browser,
)

pytestmark = [pytest.mark.browser, pytest.mark.timeout(300)]

LAG_SELECTORS = [
    "#pgq-paused-banner",
    "#pgq-queues tbody tr[data-queue='emails'] .pgq-paused",
    "#pgq-paused-banner .pgq-pause-button",
]


def _pause_and_resume(driver: Any, base: str, size: Size) -> list[str]:
    from selenium.webdriver.common.by import By

    _resize(driver, size)
    problems = []
    lag = f"{base}/admin/django_pgqueue/lag/"
    driver.get(lag)
    pause = "#pgq-queue-bar li[data-queue='emails'] .pgq-pause-button"
    problems += _check_page(driver, size, "lag", [pause], "")
    clicks = 0
    _click_and_wait(driver, driver.find_element(By.CSS_SELECTOR, pause))
    clicks += 1
    assert "Pause queue “emails”?" in driver.find_element(By.ID, "content-main").text
    problems += _check_page(driver, size, "pause confirmation", ["#id_reason"], "")
    driver.find_element(By.ID, "id_reason").send_keys(f"incident at {size.name} size")
    _click_and_wait(
        driver, driver.find_element(By.CSS_SELECTOR, "#content-main input[type=submit]")
    )
    clicks += 1
    assert clicks == 2
    assert "Queue emails is paused" in driver.find_element(By.CSS_SELECTOR, "ul.messagelist").text
    banner = driver.find_element(By.ID, "pgq-paused-banner").text
    assert f"incident at {size.name} size" in banner
    assert "by operator" in banner
    problems += _check_page(driver, size, "lag (paused)", LAG_SELECTORS, "")
    problems += _banner_problems(driver, size)
    assert paused_queues()["emails"].paused_by == "operator"
    driver.get(f"{base}/admin/django_pgqueue/job/")
    problems += _check_page(driver, size, "inbox (paused)", ["#pgq-paused-banner"], "")

    driver.get(lag)
    button = driver.find_element(
        By.CSS_SELECTOR, "#pgq-paused-banner li[data-queue='emails'] .pgq-pause-button"
    )
    assert button.text == "Resume…"
    _click_and_wait(driver, button)
    _click_and_wait(
        driver, driver.find_element(By.CSS_SELECTOR, "#content-main input[type=submit]")
    )
    assert "Queue emails is resumed" in driver.find_element(By.CSS_SELECTOR, "ul.messagelist").text
    assert not driver.find_elements(By.ID, "pgq-paused-banner")
    assert paused_queues() == {}

    # From the inbox: the queue's button, then "Yes, pause"; back on the inbox.
    inbox = f"{base}/admin/django_pgqueue/job/?queue=emails"
    driver.get(inbox)
    button = "#pgq-queue-bar li[data-queue='emails'] .pgq-pause-button"
    problems += _check_page(driver, size, "inbox", [button], "")
    _click_and_wait(driver, driver.find_element(By.CSS_SELECTOR, button))
    _click_and_wait(
        driver, driver.find_element(By.CSS_SELECTOR, "#content-main input[type=submit]")
    )
    assert driver.current_url == inbox
    assert "Queue emails is paused" in driver.find_element(By.CSS_SELECTOR, "ul.messagelist").text
    assert "emails" in paused_queues()
    driver.find_element(By.ID, "pgq-paused-banner")
    resume_queue("emails")
    return problems


#: Smallest height of a button one can hit with a finger (and see at a glance).
BUTTON_MIN_HEIGHT = 24

BANNER = """
const banner = document.getElementById("pgq-paused-banner");
const item = banner.querySelector("li");
const button = banner.querySelector(".pgq-pause-button").getBoundingClientRect();
return {
    marker: getComputedStyle(item).listStyleType,
    before: getComputedStyle(item, "::marker").content,
    buttonHeight: button.height,
};
"""


def _banner_problems(driver: Any, size: Size) -> list[str]:
    """Return what is wrong with the paused banner: a list bullet, a tiny button."""
    measured = driver.execute_script(BANNER)
    problems = []
    if measured["marker"] != "none":
        problems.append(f"banner at {size.name}: its line has a {measured['marker']} bullet")
    if measured["buttonHeight"] < BUTTON_MIN_HEIGHT:
        problems.append(
            f"banner at {size.name}: the Resume button is {measured['buttonHeight']:.0f} px high"
        )
    return problems


def test_operator_pauses_and_resumes_a_queue_at_laptop_and_phone_sizes(
    live_server,
    browser,  # noqa: F811
    store,
):
    store.enqueue_many([JobSpec("tests.tasks.noop", queue="emails") for _ in range(5)])
    base = live_server.url
    _log_in(browser, base)
    problems = []
    for size in (LAPTOP, PHONE):
        problems += _pause_and_resume(browser, base, size)
    assert not problems, "\n".join(problems)
