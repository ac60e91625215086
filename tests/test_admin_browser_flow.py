"""The Flow control page and a limited job's page, in real headless Chromium, at laptop
and phone sizes: nothing wider than the screen, the columns that matter inside it.
"""

from __future__ import annotations

import pytest

from django_pgqueue.models import Job
from django_pgqueue.store.values import JobSpec
from tests.test_admin_browser import (  # the browser fixture and the page measurements
    DESKTOP,
    LAPTOP,
    PHONE,
    _check_page,
    _log_in,
    _resize,
    browser,  # noqa: F401 - a fixture
)

pytestmark = [pytest.mark.browser, pytest.mark.timeout(300)]

FLOW_COLUMNS = (
    "field-concurrency_key",
    "field-queue_name",
    "field-in_flight_display",
    "field-rate_display",
    "field-waiting",
)


def test_flow_control_pages_fit_laptop_and_phone_screens(live_server, browser):  # noqa: F811
    store = Job.objects.store()
    specs = [
        JobSpec("tests.tasks.noop", concurrency_key=f"tenant:{n % 30}", concurrency_limit=4)
        for n in range(300)
    ]
    specs += [JobSpec("tests.tasks.noop", concurrency_key="shipping-label-api", rate_limit="20/s")]
    store.enqueue_many(specs)
    store.claim("web-1:100", ["default"], per_queue=100, lease_seconds=600)
    waiting = Job.objects.filter(status="pending", concurrency_key="tenant:0").first()
    assert waiting is not None
    base = live_server.url
    _log_in(browser, base)
    browser.execute_script("localStorage.setItem('django.admin.navSidebarIsOpen', 'true')")
    admin = f"{base}/admin/django_pgqueue"
    pages = [
        (
            "flow_control",
            f"{admin}/concurrencykey/",
            [f"#result_list tbody tr .{column}" for column in FLOW_COLUMNS],
            "#result_list tbody tr",
        ),
        ("limited_job", f"{admin}/job/{waiting.pk}/change/", ["#pgq-flow-wait", ".pgq-facts"], ""),
    ]
    problems: list[str] = []
    for size in (LAPTOP, DESKTOP, PHONE):
        _resize(browser, size)
        for name, address, selectors, rows in pages:
            browser.get(address)
            problems += _check_page(browser, size, name, selectors, rows)
    assert not problems, "\n".join(problems)
