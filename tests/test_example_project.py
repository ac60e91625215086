"""The example project: its flows on a real database, and ``demo.py`` end to end.

Every test drives ``example_project/manage.py`` (or ``demo.py``) as a subprocess, as a
user would, against its own scratch database on the test server; nothing here imports
the example project.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from http.cookiejar import CookieJar
from typing import Any
from urllib.error import HTTPError, URLError
from urllib.parse import urlencode, urlparse
from urllib.request import HTTPCookieProcessor, OpenerDirector, build_opener

import psycopg
import pytest

from django_pgqueue.tools.embedded import with_dbname
from tests.database import REPO, database_url
from tests.documents import runserver_turn
from tests.workers import wait_for

pytestmark = pytest.mark.timeout(120)

PROJECT = REPO / "example_project"
# The per-order tasks; each order gets exactly one job of each.
ORDER_TASKS = (
    "send_receipt",
    "create_invoice",
    "apply_loyalty_points",
    "notify_warehouse",
    "record_analytics_event",
    "request_review",
    "buy_shipping_label",
)


def _drop(name: str) -> None:
    with psycopg.connect(database_url(), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def shop_database() -> Iterator[str]:
    """Return the URL of a fresh, empty scratch database; dropped afterwards."""
    name = f"pgq_example_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(database_url(), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield with_dbname(database_url(), name)
    finally:
        _drop(name)


def _env(url: str, **extra: str) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith("PGQUEUE_")}
    return {**env, "DATABASE_URL": url, "DJANGO_SETTINGS_MODULE": "shop.settings", **extra}


def _manage(url: str, *args: str, **extra: str) -> str:
    result = subprocess.run(
        [sys.executable, str(PROJECT / "manage.py"), *args],
        cwd=REPO,
        env=_env(url, **extra),
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    assert result.returncode == 0, f"manage.py {' '.join(args)}:\n{result.stdout}{result.stderr}"
    return result.stdout + result.stderr


def _rows(url: str, query: str, params: Any = None) -> list[tuple[Any, ...]]:
    with psycopg.connect(url) as conn:
        return conn.execute(query, params).fetchall()


def _jobs(url: str, task_name: str) -> list[dict[str, Any]]:
    with psycopg.connect(url) as conn, conn.cursor(row_factory=psycopg.rows.dict_row) as cur:
        return cur.execute(
            "SELECT * FROM django_pgqueue_job_all WHERE task_path = %s ORDER BY id",
            [f"orders.tasks.{task_name}"],
        ).fetchall()


def test_migrations_apply_and_checks_pass(shop_database):
    _manage(shop_database, "migrate", "--noinput")
    output = _manage(shop_database, "check", "--fail-level", "WARNING")
    assert "no issues" in output
    _manage(shop_database, "makemigrations", "--check", "--dry-run", "orders")


def test_seeded_flows_end_as_expected_after_a_burst_worker(shop_database):
    url = shop_database
    _manage(url, "migrate", "--noinput")
    seeded = _manage(url, "seed_demo")
    assert "one order, the same receipt job" in seeded
    assert "rolled back with its jobs" in seeded
    # No backoff: every retry is ready at once, so one burst run finishes everything
    # that is not scheduled for later.
    _manage(url, "runqueueworker", "--burst", PGQUEUE_RETRY_BASE_SECONDS="0")

    orders = dict(_rows(url, "SELECT id, submissions FROM orders_order"))
    assert len(orders) == 9
    # The worker wrote the shop's periodic schedule at start (the admin's Schedules page).
    assert _rows(
        url, "SELECT name, description, timezone, paused_at FROM django_pgqueue_schedule"
    ) == [("nightly-sales-report", "At 02:30 every day", "Europe/Berlin", None)]

    # Every order has exactly one job of each kind: the double submit added none.
    for task_name in ORDER_TASKS:
        jobs = _jobs(url, task_name)
        assert sorted(job["args"][-1] for job in jobs) == sorted(orders), task_name

    # The double submit: one order, posted twice, with one receipt job and one e-mail.
    [double] = [pk for pk, submissions in orders.items() if submissions == 2]
    [receipt] = [job for job in _jobs(url, "send_receipt") if job["args"] == [double]]
    assert receipt["idempotency_key"] == f"receipt:{double}"
    assert receipt["status"] == "succeeded"
    assert _rows(
        url,
        "SELECT count(*) FROM orders_sentemail WHERE kind = 'receipt' AND order_id = %s",
        [double],
    ) == [(1,)]
    assert {job["status"] for job in _jobs(url, "send_receipt")} == {"succeeded"}

    # The declined card: no order row, and the stock it reserved went back.
    assert _rows(
        url,
        "SELECT count(*) FROM orders_order o JOIN orders_customer c ON c.id = o.customer_id "
        "WHERE c.email = 'katherine@example.com' AND o.quantity = 3",
    ) == [(0,)]

    # The invoice workflow: three lines priced side by side, then the PDF, once, with all.
    assert len(_jobs(url, "price_line")) == 3 * len(orders)
    pdfs = _jobs(url, "render_invoice_pdf")
    assert sorted(job["args"][-1] for job in pdfs) == sorted(orders)
    for job in pdfs:
        assert job["status"] == "succeeded", job
        assert [line["line"] for line in job["result"]["lines"]] == ["goods", "shipping", "tax"]
        assert job["result"]["total_cents"] == sum(line["cents"] for line in job["result"]["lines"])

    # atomic=True invoices: one per order, numbered without gaps.
    numbers = [row[0] for row in _rows(url, "SELECT number FROM orders_invoice ORDER BY number")]
    assert numbers == [f"INV-{index:06d}" for index in range(1, 10)]

    # The multi-step job failed after "rendered" once, then resumed and finished.
    [statement_job] = _jobs(url, "deliver_statement")
    assert statement_job["status"] == "succeeded"
    assert statement_job["attempts"] == 2
    assert statement_job["step"] == "emailed"
    assert [error["exception_class"] for error in statement_job["errors"]] == [
        "orders.tasks.StorageUnavailable"
    ]
    assert _rows(
        url, "SELECT render_count, uploaded_url <> '', emailed_at IS NOT NULL FROM orders_statement"
    ) == [(1, True, True)]

    # The flaky warehouse job: Leipzig's API is down; every attempt used, then dead letter.
    leipzig = {
        row[0]
        for row in _rows(
            url,
            "SELECT o.id FROM orders_order o JOIN orders_product p ON p.id = o.product_id "
            "JOIN orders_warehouse w ON w.id = p.warehouse_id WHERE w.name = 'Leipzig'",
        )
    }
    assert len(leipzig) == 2
    for job in _jobs(url, "notify_warehouse"):
        if job["args"][-1] in leipzig:
            assert (job["status"], job["attempts"], job["max_attempts"]) == ("dead_letter", 4, 4)
            assert len(job["errors"]) == 4
            assert job["last_error_class"] == "orders.tasks.WarehouseUnavailable"
        else:
            assert (job["status"], job["attempts"]) == ("succeeded", 1)

    # Loyalty points: one customer's jobs ran in order, so every redemption found the
    # points earned before it; only Alan's impossible redemption failed, at once.
    loyalty = _jobs(url, "apply_loyalty_points")
    dead = [job for job in loyalty if job["status"] == "dead_letter"]
    assert [(job["attempts"], job["last_error_class"]) for job in dead] == [
        (1, "django_pgqueue.exceptions.PermanentError")
    ]
    assert all(job["partition_key"].startswith("customer:") for job in loyalty)
    assert all(job["attempts"] == 1 for job in loyalty)
    entries = _rows(
        url,
        "SELECT c.email, e.order_id, e.earned, e.redeemed, e.balance_after "
        "FROM orders_loyaltyentry e JOIN orders_customer c ON c.id = e.customer_id ORDER BY e.id",
    )
    balances: dict[str, int] = {}
    applied: dict[str, list[int]] = {}
    for email, order_id, earned, redeemed, balance_after in entries:
        balances[email] = balances.get(email, 0) + earned - redeemed
        assert balance_after == balances[email]
        applied.setdefault(email, []).append(order_id)
    assert all(order_ids == sorted(order_ids) for order_ids in applied.values())
    assert len(applied["grace@example.com"]) == 4

    # The async task ran for every order.
    assert {job["status"] for job in _jobs(url, "record_analytics_event")} == {"succeeded"}
    assert _rows(url, "SELECT count(*) FROM orders_analyticsevent") == [(9,)]

    # Scheduled jobs wait: review requests three days out, the daily report 15 s out.
    future = (
        "SELECT count(*) FROM django_pgqueue_job_all "
        "WHERE task_path = %s AND status = 'pending' AND available_at > now()"
    )
    assert _rows(url, future, ["orders.tasks.request_review"]) == [(9,)]
    assert _rows(url, future, ["orders.tasks.compile_daily_sales"]) == [(1,)]


@pytest.fixture
def storefront(shop_database: str) -> Iterator[str]:
    """Migrate and seed the scratch database, serve it with runserver; return the base URL."""
    _manage(shop_database, "migrate", "--noinput")
    _manage(shop_database, "seed_demo")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen(
        [
            sys.executable,
            str(PROJECT / "manage.py"),
            "runserver",
            f"127.0.0.1:{port}",
            "--noreload",
        ],
        cwd=REPO,
        env=_env(shop_database),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"

    def answers() -> bool:
        assert server.poll() is None, "runserver exited"
        try:
            with build_opener().open(f"{base}/", timeout=2) as response:
                return bool(response.status == 200)
        except (URLError, OSError):
            return False

    try:
        wait_for(answers, timeout=60, message="runserver to answer")
        yield base
    finally:
        # SIGTERM rather than Ctrl-C's SIGINT: a shell without job control starts a
        # background job (a CI run, say) with SIGINT ignored, Python keeps an inherited
        # SIG_IGN, and runserver then never stops on SIGINT.
        server.terminate()
        try:
            server.wait(20)
        except subprocess.TimeoutExpired:
            server.kill()  # never left running into the next test
            server.wait(5)
            raise


def _checkout(opener: OpenerDirector, base: str, **fields: str) -> tuple[int, str, str]:
    """Post the checkout form; return the final status, URL path and page."""
    with opener.open(f"{base}/", timeout=30) as response:
        page = response.read().decode()
    csrf = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page)
    assert csrf is not None
    data = urlencode({"csrfmiddlewaretoken": csrf[1], **fields}).encode()
    try:
        with opener.open(f"{base}/checkout/", data=data, timeout=30) as response:
            return response.status, urlparse(response.url).path, response.read().decode()
    except HTTPError as error:
        return error.code, urlparse(error.url).path, error.read().decode()


def test_checkout_form_double_submit_and_declined_card(shop_database, storefront):
    url = shop_database
    [(customer,)] = _rows(url, "SELECT id FROM orders_customer WHERE email = 'ada@example.com'")
    [(product,)] = _rows(url, "SELECT id FROM orders_product WHERE sku = 'MUG'")
    opener = build_opener(HTTPCookieProcessor(CookieJar()))
    form = {
        "checkout_token": str(uuid.uuid4()),
        "customer": str(customer),
        "product": str(product),
        "quantity": "2",
        "points_redeemed": "0",
        "card_number": "4242424242424242",
    }
    orders_before = _rows(url, "SELECT count(*) FROM orders_order")[0][0]

    status, first, page = _checkout(opener, storefront, **form)
    assert status == 200
    assert re.fullmatch(r"/orders/\d+/", first), first
    order_id = int(first.split("/")[2])
    assert "placed; its jobs are queued" in page
    # The order page reads its jobs back through Task.get_result().
    # Seven follow-ups, and the invoice PDF (blocked until its lines are priced: READY too).
    assert page.count(">READY</td>") == 8

    # The same form again (a double click): the same order, nothing new queued.
    jobs_before = _rows(url, "SELECT count(*) FROM django_pgqueue_job_all")
    status, second, page = _checkout(opener, storefront, **form)
    assert (status, second) == (200, first)
    assert "already placed (double submit)" in page
    assert _rows(url, "SELECT count(*) FROM django_pgqueue_job_all") == jobs_before
    assert _rows(url, "SELECT submissions FROM orders_order WHERE id = %s", [order_id]) == [(2,)]
    assert _rows(
        url,
        "SELECT count(*) FROM django_pgqueue_job_all WHERE idempotency_key = %s",
        [f"receipt:{order_id}"],
    ) == [(1,)]

    # A declined card: the order and its seven jobs roll back together.
    declined = {**form, "checkout_token": str(uuid.uuid4()), "card_number": "4000000000000002"}
    status, _, page = _checkout(opener, storefront, **declined)
    assert status == 409
    assert "rolled back" in page
    assert _rows(url, "SELECT count(*) FROM django_pgqueue_job_all") == jobs_before
    assert _rows(url, "SELECT count(*) FROM orders_order") == [(orders_before + 1,)]


@pytest.mark.one_server
def test_demo_runs_end_to_end_and_reports_what_it_did():
    # A database that does not exist yet: the demo creates it, migrates and seeds it.
    name = f"pgq_example_demo_{uuid.uuid4().hex[:8]}"
    url = with_dbname(database_url(), name)
    # The demo serves on 8000 when it is free, as the tutorial's runserver does.
    with runserver_turn(source="demo.py"):
        try:
            result = subprocess.run(
                [sys.executable, str(PROJECT / "demo.py"), "--seconds", "25"],
                cwd=REPO,
                env={**_env(url), "DEMO_ADMIN_PASSWORD": "demo-test-password"},
                capture_output=True,
                text=True,
                timeout=110,
                check=False,
            )
        finally:
            _drop(name)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    summary = output[output.index("summary after") :]
    assert f"database {name}" in output
    assert "created" in output.split("applying migrations")[0]
    assert "username 'admin', password 'demo-test-password'" in output
    assert re.search(r"served: +http://127\.0\.0\.1:\d+/admin/", summary)
    assert "as 'admin': the admin page answered HTTP 200" in summary
    assert re.search(
        r"jobs: +\d+ blocked, \d+ pending, \d+ processing, [1-9]\d* succeeded", summary
    )
    assert re.search(r"dead letters: [1-9]", summary)
    assert "orders:       9 (1 submitted twice), receipts sent 9, invoices 9" in summary
    assert "applied in order: yes" in summary
    assert "worker:       drained on SIGTERM, exit status 0" in summary
    assert output.rstrip().endswith("| OK")
