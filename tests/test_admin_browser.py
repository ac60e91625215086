"""End to end in a real headless Chromium: every admin page at laptop and phone sizes, and
an operator retrying a dead letter through the action and seeing a real worker run it.

The sizes are what on-call engineers use: 1280x800 and 1440x900 with Django's
navigation sidebar open (its default), and a 390x844 phone. On each, no page may be
wider than the screen, every table must fit inside its column (a table wider than its
column scrolls sideways inside the page, which the page's width does not show), and the
columns that matter (id, task, status, queue, when, error) must lie inside the screen,
one line per job on the laptop.

Screenshots of every page are taken on realistic data at 1280x800 with the sidebar
open, and of some at phone size; `make screenshots` (which sets
PGQUEUE_TEST_SCREENSHOTS) saves them to docs/_static/admin/ for the documentation.
Debian's chromium and chromedriver are used; nothing is downloaded.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User

from django_pgqueue.store.values import Failure, JobSpec
from tests.admin_seed import seed, seed_recent_activity
from tests.workers import wait_for

pytestmark = [pytest.mark.browser, pytest.mark.timeout(300)]

# `make screenshots` refreshes the documentation's images; otherwise they go to a
# temporary folder, so a test run does not rewrite tracked files. (PGQUEUE_TEST_: the
# test settings read other PGQUEUE_ variables as settings, in JSON.)
SCREENSHOTS = (
    Path(os.environ["PGQUEUE_TEST_SCREENSHOTS"])
    if os.environ.get("PGQUEUE_TEST_SCREENSHOTS")
    else Path(tempfile.gettempdir()) / "django-pgqueue-screenshots"
)
CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"


@dataclass(frozen=True)
class Size:
    name: str
    width: int
    height: int

    @property
    def phone(self) -> bool:
        return self.width < 768


LAPTOP = Size("laptop", 1280, 800)
DESKTOP = Size("desktop", 1440, 900)
PHONE = Size("phone", 390, 844)
#: A job row on a laptop is one line of text: taller means something wrapped.
ONE_LINE_ROW = 40

#: On a laptop, at least this much of the error shows ("ReadTimeout HTTPSConnectionPo…"):
#: at 1280x800 the dead letters once showed three characters of it ("Per…").
ERROR_MIN_WIDTH = 200
#: The cells of the first job rows that must lie inside the screen, per listing.
JOB_COLUMNS = (
    "field-id",
    "field-task",
    "field-status_display",
    "field-queue_name",
    "field-when",
    "field-error:not(:empty)",  # a job without an error has an empty cell
)
#: The dead letters: every row is one, so no status column.
DEAD_LETTER_COLUMNS = tuple(column for column in JOB_COLUMNS if column != "field-status_display")
#: The pages docs/howto/admin.md shows at 1280x800 (all of them), and on a phone.
SCREENSHOT_PAGES = {
    "index",
    "inbox",
    "job_detail",
    "dead_letters",
    "dead_letter_groups",
    "lag",
    "pause_queue",
    "workers",
    "worker",
    "schedules",
    "schedule",
    "flow_control",
}
PHONE_SCREENSHOT_PAGES = {"inbox", "dead_letter_groups", "lag"}
WORKER_COLUMNS = ("field-id", "field-status_display", "field-in_flight", "field-last_seen")
SCHEDULE_COLUMNS = ("field-name", "field-description", "field-next_fire", "field-state")
FLOW_COLUMNS = ("field-concurrency_key", "field-in_flight_display", "field-waiting")


def _seed_schedules_and_limits(observer: Any, store: Any) -> None:
    """Add what the schedules and flow control pages show: schedules, busy limited keys."""
    from tests.schedules import schedule, sync

    sync(
        observer,
        schedule("nightly-invoices", "30 2 * * *", timezone="Europe/Berlin"),
        schedule("hourly-digest", "0 * * * *", downtime="catch_up", catch_up=3),
        schedule("refresh-exchange-rates", "@every 15m", queue_name="reports"),
    )
    observer.execute(
        "UPDATE django_pgqueue_schedule SET paused_at = now() - interval '20 minutes' "
        "WHERE name = 'hourly-digest'"
    )
    store.enqueue_many(
        [
            JobSpec(
                "billing.tasks.sync_customer",
                queue="low",
                concurrency_key=f"tenant:{n % 6}",
                concurrency_limit=2,
            )
            for n in range(40)
        ]
        + [JobSpec("shipping.tasks.buy_label", queue="low", rate_limit="20/s") for _ in range(5)]
    )
    store.claim("web-1:1000", ["low"], per_queue=12, lease_seconds=600)


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
        "--hide-scrollbars",
        f"--user-data-dir={profile}",
        f"--window-size={DESKTOP.width},{DESKTOP.height}",
    ):
        options.add_argument(argument)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.implicitly_wait(5)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def _resize(driver: Any, size: Size) -> None:
    """Make the page's viewport exactly ``size``; a phone also honours the viewport meta tag."""
    driver.execute_cdp_cmd(
        "Emulation.setDeviceMetricsOverride",
        {
            "width": size.width,
            "height": size.height,
            "deviceScaleFactor": 2 if size.phone else 1,
            "mobile": size.phone,
        },
    )


def _screenshot(driver: Any, name: str) -> None:
    """Save what the screen shows as <SCREENSHOTS>/<name>.png."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    assert driver.save_screenshot(str(SCREENSHOTS / f"{name}.png"))


def _click_and_wait(driver: Any, element: Any) -> None:
    """Click something that loads a new page, and wait until the new page replaced the old."""
    from selenium.common.exceptions import StaleElementReferenceException, WebDriverException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    old_page = driver.find_element(By.TAG_NAME, "html")
    element.click()

    def replaced(_driver: Any) -> bool:
        try:
            old_page.is_enabled()
        except StaleElementReferenceException:
            return True
        except WebDriverException as error:
            # Asked mid-navigation, chromedriver can answer "Node with given id does not
            # belong to the document" instead of reporting the element stale: the old
            # page is gone all the same (seen on CI).
            if "does not belong to the document" in str(error):
                return True
            raise
        return False

    WebDriverWait(driver, 30).until(replaced)


def _log_in(driver: Any, base: str) -> None:
    from selenium.webdriver.common.by import By

    User.objects.create_superuser("operator", password="correct horse")
    driver.get(f"{base}/admin/")
    driver.find_element(By.NAME, "username").send_keys("operator")
    driver.find_element(By.NAME, "password").send_keys("correct horse")
    _click_and_wait(driver, driver.find_element(By.CSS_SELECTOR, "input[type=submit]"))
    assert "Site administration" in driver.title


# Measures the page in one round trip: its width, the viewport's, the sidebar, and for
# each selector the boxes of the (first 20) elements it matches.
MEASURE = """
const [selectors, rowSelector] = arguments;
const box = (element) => {
    const rect = element.getBoundingClientRect();
    return {left: rect.left, right: rect.right, width: rect.width, height: rect.height,
            text: (element.innerText || element.textContent || "").trim().slice(0, 40)};
};
const sidebar = document.getElementById("nav-sidebar");
return {
    scrollWidth: document.documentElement.scrollWidth,
    viewport: document.documentElement.clientWidth,
    sidebar: sidebar ? sidebar.getBoundingClientRect().width : 0,
    boxes: Object.fromEntries(selectors.map((selector) => [
        selector,
        Array.from(document.querySelectorAll(selector)).slice(0, 20).map(box),
    ])),
    // The innermost elements that stick out on the right, to say what is too wide.
    overflowing: Array.from(document.body.querySelectorAll("*"))
        .filter((element) => element.getBoundingClientRect().right
            > document.documentElement.clientWidth + 0.5
            && !Array.from(element.children).some((child) =>
                child.getBoundingClientRect().right > document.documentElement.clientWidth + 0.5))
        .slice(0, 3)
        .map((element) => element.tagName.toLowerCase() + (element.id ? "#" + element.id : "")
            + (element.className && element.className.baseVal === undefined
                ? "." + String(element.className).trim().replace(/ +/g, ".") : "")),
    rows: rowSelector
        ? Array.from(document.querySelectorAll(rowSelector)).slice(0, 20).map(box) : [],
    // Task names are never cut (the module after them may be), on every row.
    clippedNames: Array.from(document.querySelectorAll("#content .pgq-task-name"))
        .filter((name) => name.scrollWidth > name.clientWidth + 0.5
            || name.getBoundingClientRect().right
                > name.closest("td, th, dd").getBoundingClientRect().right + 0.5)
        .slice(0, 3).map((name) => name.textContent),
    errorWidths: Array.from(document.querySelectorAll("#result_list td.field-error"))
        .map((cell) => cell.getBoundingClientRect().width),
    // Every table of the page against the column that holds it: a wider table scrolls
    // sideways inside its column (Django's changelist wraps it in an overflow box).
    tables: Array.from(document.querySelectorAll("#content table")).map((table) => ({
        name: table.id || table.className || "table",
        width: table.getBoundingClientRect().width,
        column: table.parentElement.clientWidth,
    })),
};
"""


def _check_page(driver: Any, size: Size, page: str, selectors: list[str], rows: str) -> list[str]:
    """Return what is wrong with the page at ``size``: too wide, cells off screen, wraps."""
    measured = driver.execute_script(MEASURE, selectors, rows)
    viewport = measured["viewport"]
    problems = []
    if measured["scrollWidth"] > viewport:
        problems.append(
            f"page is {measured['scrollWidth']} px wide in {viewport} px "
            f"(sticking out: {', '.join(measured['overflowing'])})"
        )
    # The admin index has no sidebar: its app list is the same list.
    if not size.phone and page != "index" and measured["sidebar"] < 200:
        problems.append("the navigation sidebar is not open")
    for selector, boxes in measured["boxes"].items():
        if not boxes:
            problems.append(f"{selector}: not on the page")
        for box in boxes:
            if box["width"] <= 0 or box["left"] < 0 or box["right"] > viewport + 0.5:
                problems.append(
                    f"{selector} {box['text']!r}: {box['left']:.0f}..{box['right']:.0f} px, "
                    f"outside the {viewport} px screen"
                )
                break
    if measured["clippedNames"]:
        problems.append(f"task names cut short: {measured['clippedNames']}")
    if not size.phone and any(width < ERROR_MIN_WIDTH for width in measured["errorWidths"]):
        narrowest = min(measured["errorWidths"])
        problems.append(f"the error column is {narrowest:.0f} px wide (< {ERROR_MIN_WIDTH})")
    for table in measured["tables"]:
        if table["width"] > table["column"] + 0.5:
            problems.append(
                f"table {table['name']} is {table['width']:.0f} px wide in its "
                f"{table['column']} px column: it scrolls sideways"
            )
    if not size.phone:
        for row in measured["rows"]:
            if row["height"] > ONE_LINE_ROW:
                problems.append(f"row {row['text']!r} is {row['height']:.0f} px high: it wraps")
                break
    return [f"{page} at {size.name} ({size.width}x{size.height}): {p}" for p in problems]


def _row_cells(table: str, columns: tuple[str, ...]) -> list[str]:
    return [f"{table} tbody tr .{column}" for column in columns]


def test_every_page_fits_laptop_and_phone_screens(live_server, browser, observer, store):
    """At 1280x800 and 1440x900 (sidebar open) and 390x844, every page fits the screen,
    and every table its column."""
    # A few running jobs per worker, within its concurrency; the expired leases are the
    # dead worker's.
    seed(observer, finished=20_000, ready=2_000, scheduled=500, processing=12, expired=5)
    seed_recent_activity(observer)
    _seed_schedules_and_limits(observer, store)
    base = live_server.url
    dead_sample, partitioned = observer.execute(
        "SELECT max(id) FILTER (WHERE status = 'dead_letter'), "
        "max(id) FILTER (WHERE status = 'pending' AND partition_key IS NOT NULL) "
        "FROM django_pgqueue_job_all"
    ).fetchone()
    _log_in(browser, base)
    # Django's default, stated: the sidebar open takes 299 px of a laptop's width.
    browser.execute_script("localStorage.setItem('django.admin.navSidebarIsOpen', 'true')")

    admin = f"{base}/admin/django_pgqueue"
    pages: list[tuple[str, str, list[str], str]] = [
        ("index", f"{base}/admin/", ["#content-main a[href$='/lag/']"], ""),
        (
            "inbox",
            f"{admin}/job/",
            _row_cells("#result_list", JOB_COLUMNS),
            "#result_list tbody tr",
        ),
        (
            "dead_letters",
            f"{admin}/deadletter/",
            _row_cells("#result_list", DEAD_LETTER_COLUMNS),
            "#result_list tbody tr",
        ),
        (
            "dead_letter_groups",
            f"{admin}/deadletter/groups/",
            [
                "#pgq-groups tbody tr .pgq-group-count",
                "#pgq-groups tbody tr .pgq-error-class",
                "#pgq-groups tbody tr .pgq-fill",
                "#pgq-groups tbody tr input[type=submit]",
            ],
            "#pgq-groups tbody tr",
        ),
        (
            "lag",
            f"{admin}/lag/",
            [
                "#pgq-queues tbody tr td",
                "#pgq-queues tbody tr .pgq-lag",
                "CHART",
            ],
            "#pgq-queues tbody tr",
        ),
        (
            "workers",
            f"{admin}/worker/",
            _row_cells("#result_list", WORKER_COLUMNS),
            "#result_list tbody tr",
        ),
        ("worker", f"{admin}/worker/web-1:1000/change/", ["#pgq-in-flight", ".pgq-facts"], ""),
        (
            "job_detail",
            f"{admin}/job/{dead_sample}/change/",
            [".pgq-operations input[type=submit]", ".pgq-facts", ".pgq-attempt", "pre"],
            "",
        ),
        (
            "partitioned_job",
            f"{admin}/job/{partitioned}/change/",
            [".pgq-facts", ".pgq-timeline", "pre"],
            "",
        ),
        ("pause_queue", f"{admin}/lag/pause/?queue=emails", ["#id_reason"], ""),
        (
            "schedules",
            f"{admin}/schedule/",
            _row_cells("#result_list", SCHEDULE_COLUMNS),
            "#result_list tbody tr",
        ),
        ("schedule", f"{admin}/schedule/nightly-invoices/change/", [".pgq-facts"], ""),
        (
            "flow_control",
            f"{admin}/concurrencykey/",
            _row_cells("#result_list", FLOW_COLUMNS),
            "#result_list tbody tr",
        ),
    ]
    problems: list[str] = []
    for size in (LAPTOP, DESKTOP, PHONE):
        _resize(browser, size)
        for name, address, selectors, rows in pages:
            browser.get(address)
            # The lag page draws its chart twice; a phone shows the narrow drawing.
            chart = ".pgq-chart-narrow svg" if size.phone else ".pgq-chart-wide svg"
            shown = [selector.replace("CHART", chart) for selector in selectors]
            problems += _check_page(browser, size, name, shown, rows)
            if size == LAPTOP and name in SCREENSHOT_PAGES:
                _screenshot(browser, name)
            if size == PHONE and name in PHONE_SCREENSHOT_PAGES:
                _screenshot(browser, f"{name}_phone")
    assert not problems, "\n".join(problems)


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

    seed(observer, finished=2_000, ready=200, scheduled=50, processing=10, expired=2)
    job_id = _dead_letter_to_retry(store)
    base = live_server.url
    _log_in(browser, base)

    # A worker serving the dead letter's queue (the seeded jobs use other queues).
    worker = workers("--queue", "high", "--concurrency", "2")
    worker.wait_registered(observer)
    browser.get(f"{base}/admin/django_pgqueue/worker/")
    assert f":{worker.pid}" in browser.find_element(By.ID, "result_list").text

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
            "SELECT status = 'succeeded' FROM django_pgqueue_job_all WHERE id = %s", [job_id]
        ).fetchone()[0],
        timeout=60,
        message=f"job {job_id} to run\n{worker.output()}",
    )
    browser.get(f"{base}/admin/django_pgqueue/job/{job_id}/change/")
    page = browser.find_element(By.ID, "content-main").text
    assert "Succeeded" in page
    assert "ConnectionError" in page  # the error history of the failed attempt stays
    assert browser.find_element(By.ID, "pgq-result").text.strip() == "5"
