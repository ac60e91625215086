"""The shop's background jobs, written the way a django-pgqueue user writes them.

Options set in ``@task(...)`` apply to every call; per-call options (idempotency and
partition keys, ``run_after``) are set where the job is enqueued, in ``services.py``.

- ``send_receipt``: its own queue and a higher priority; enqueued with an idempotency key.
- ``create_invoice``, ``apply_loyalty_points``: ``atomic=True``, their writes commit
  together with the job's completion; loyalty points also run in per-customer order.
- ``notify_warehouse``: retries with backoff while a warehouse is down, then dead-letters.
- ``buy_shipping_label``: calls a shipping-label API that allows 5 requests a second
  for the whole shop: ``rate_limit="5/s"`` holds across every worker (see the admin's
  Flow control page).
- ``deliver_statement``: a multi-step job that resumes after its last finished step.
- ``record_analytics_event``: an async task.
- ``request_review``, ``compile_daily_sales``: scheduled with ``run_after``.
- ``price_line`` and ``render_invoice_pdf``: a fan-out/fan-in workflow. Each line of the
  invoice (goods, shipping, tax) is priced by its own job, side by side; the PDF job is
  enqueued ``after=`` all of them, waits ``blocked`` (see the job's page in the admin:
  what it runs after, each linked), and reads their results from its context.
- ``nightly_sales_report``: a periodic task, every night at 02:30 shop time (the workers
  fire it; see the Schedules page of the admin).

Workers run jobs at least once: a job runs again if its worker dies before recording the
outcome. The atomic tasks cannot apply twice, the others are written to be harmless when
repeated, except that an e-mail sent just before such a crash goes out twice.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import time
from typing import Any
from zoneinfo import ZoneInfo

from django.core.mail import send_mail
from django.db import transaction
from django.db.models import Count, Sum
from django.utils import timezone

# django_pgqueue.task is Django's @task with the queue's options spelled out: typed, and
# the same on every supported Django (6.0's own decorator rejects options like max_attempts).
from django_pgqueue import task
from django_pgqueue.exceptions import PermanentError
from django_pgqueue.features.periodic import periodic
from django_pgqueue.tasks.context import JobContext
from orders.models import (
    AnalyticsEvent,
    Counter,
    Customer,
    DailyReport,
    Invoice,
    LoyaltyEntry,
    Order,
    SentEmail,
    Statement,
)

logger = logging.getLogger("orders")

#: The steps of a statement delivery, in order; ``context.step`` holds the last one done.
STATEMENT_STEPS = ("rendered", "uploaded", "emailed")


class WarehouseUnavailable(Exception):
    """The warehouse API did not answer; worth retrying later."""


class StorageUnavailable(Exception):
    """The file store refused an upload; worth retrying later."""


def _order(order_id: int) -> Order:
    """Return the order; a deleted order fails the job for good (a retry cannot help)."""
    try:
        return Order.objects.select_related("customer", "product__warehouse").get(pk=order_id)
    except Order.DoesNotExist as error:
        raise PermanentError(f"order {order_id} no longer exists") from error


def _send(kind: str, to: str, subject: str, body: str, order: Order | None = None) -> None:
    """Send one e-mail and keep a record of it for the admin."""
    send_mail(subject, body, None, [to])
    SentEmail.objects.create(kind=kind, to=to, subject=subject, body=body, order=order)


# ---------------------------------------------------------------- invoice workflow
#: The lines of an invoice, each priced by its own job.
INVOICE_LINES = ("goods", "shipping", "tax")
#: Shipping is free from this order total on.
FREE_SHIPPING_CENTS = 10_000
SHIPPING_CENTS = 495
TAX_PERCENT = 19


@task
def price_line(order_id: int, line: str) -> dict[str, Any]:
    """Price one line of an order's invoice; return ``{"line": ..., "cents": ...}``."""
    order = _order(order_id)
    goods = order.total_cents
    if line == "goods":
        cents = goods
    elif line == "shipping":
        cents = 0 if goods >= FREE_SHIPPING_CENTS else SHIPPING_CENTS
    elif line == "tax":
        cents = goods * TAX_PERCENT // 100
    else:
        raise PermanentError(f"unknown invoice line {line!r}")
    return {"line": line, "cents": cents}


@task(takes_context=True)
def render_invoice_pdf(context: JobContext, order_id: int) -> dict[str, Any]:
    """Render the invoice PDF once every line is priced (enqueued ``after=`` them).

    The priced lines arrive in ``context.dependency_results``, in the order the pricing
    jobs were given. Returns what the PDF shows (the demo does not write a file).
    """
    lines = context.dependency_results
    total = sum(line["cents"] for line in lines)
    return {
        "order": order_id,
        "file": f"invoice-{order_id}.pdf",
        "lines": lines,
        "total_cents": total,
    }


# ---------------------------------------------------------------- the order's jobs
@task(queue_name="emails", priority=10, max_attempts=8)
def send_receipt(order_id: int) -> str:
    """E-mail the receipt of an order; return the recipient."""
    order = _order(order_id)
    _send(
        SentEmail.Kind.RECEIPT,
        order.customer.email,
        f"Your receipt for order #{order.pk}",
        f"{order.quantity} x {order.product.name}: {order.total}.",
        order,
    )
    return order.customer.email


@task(atomic=True)
def create_invoice(order_id: int) -> str:
    """Issue the order's invoice with the next gap-free number; return the number.

    ``atomic=True``: the counter, the invoice and the job's completion commit in one
    transaction. If the worker dies or loses its lease before the commit, all of it rolls
    back and the retry starts clean, so no number is ever burnt or used twice.
    """
    order = _order(order_id)
    counter, _ = Counter.objects.select_for_update().get_or_create(name="invoice")
    counter.value += 1
    counter.save(update_fields=["value"])
    invoice = Invoice.objects.create(
        order=order, number=f"INV-{counter.value:06d}", amount_cents=order.total_cents
    )
    return invoice.number


@task(atomic=True)
def apply_loyalty_points(order_id: int) -> int:
    """Add the points an order earns and take off those it redeems; return the balance.

    Enqueued with ``partition_key=f"customer:{id}"``, so one customer's orders apply one
    at a time, in the order they were placed: a redemption always sees the points earned
    before it. ``atomic=True`` makes the balance change and the job's completion one
    commit: points are never applied twice.
    """
    order = _order(order_id)
    customer = Customer.objects.select_for_update().get(pk=order.customer_id)
    balance = customer.loyalty_points + order.points_earned - order.points_redeemed
    if balance < 0:
        # Retrying cannot create points: fail for good, straight to the dead letters.
        raise PermanentError(
            f"{customer} has {customer.loyalty_points} points; order #{order.pk} "
            f"redeems {order.points_redeemed}"
        )
    customer.loyalty_points = balance
    customer.save(update_fields=["loyalty_points"])
    LoyaltyEntry.objects.create(
        customer=customer,
        order=order,
        earned=order.points_earned,
        redeemed=order.points_redeemed,
        balance_after=balance,
    )
    return balance


@task(takes_context=True, max_attempts=4)
def notify_warehouse(context: JobContext, order_id: int) -> str:
    """Ask the order's warehouse to ship it; return the warehouse's name.

    While the warehouse API is down every attempt fails; the job comes back after a
    growing backoff and is dead-lettered once its 4 attempts are used. An operator can
    retry it from the admin's dead letters when the API is back.
    """
    order = _order(order_id)
    warehouse = order.product.warehouse
    if not warehouse.api_online:
        raise WarehouseUnavailable(
            f"{warehouse} warehouse API did not answer (attempt {context.attempt})"
        )
    Order.objects.filter(pk=order.pk).update(warehouse_notified_at=timezone.now())
    return warehouse.name


@task(rate_limit="5/s", max_attempts=6)
def buy_shipping_label(order_id: int) -> str:
    """Buy the order's shipping label from the carrier; return its tracking number.

    The carrier's API allows 5 requests a second for the whole account. The rate limit
    is enforced by the claim, across every worker process: jobs beyond it wait pending
    (holding no worker thread) until the next token, and the admin's job page says so.
    """
    time.sleep(0.05)  # stands in for the HTTP request to the carrier
    return f"LBL{order_id:08d}"


@task
async def record_analytics_event(name: str, order_id: int) -> None:
    """Report an event to the analytics service.

    An async task runs on the worker's event loop: many of them can wait on the network
    at once without holding a thread each.
    """
    await asyncio.sleep(0.05)  # stands in for the HTTP request to the analytics service
    await AnalyticsEvent.objects.acreate(name=name, order_id=order_id)


@task(queue_name="emails")
def request_review(order_id: int) -> str:
    """Ask the customer to review what they bought (enqueued days ahead with run_after)."""
    order = _order(order_id)
    _send(
        SentEmail.Kind.REVIEW,
        order.customer.email,
        f"How is your {order.product.name}?",
        f"Tell us what you think of the {order.product.name} from order #{order.pk}.",
        order,
    )
    return order.customer.email


# ---------------------------------------------------------------- a multi-step job
@task(queue_name="reports", takes_context=True, max_attempts=3)
def deliver_statement(context: JobContext, statement_id: int) -> dict[str, Any]:
    """Render, upload and e-mail a monthly statement, resuming after the last step done.

    Each step is recorded with ``context.set_step`` once it is done. A retry reads
    ``context.step`` and skips what is finished, so a failed upload does not render
    the statement again. A step interrupted before it was recorded runs again: each
    step must be safe to repeat.
    """
    statement = Statement.objects.select_related("customer").get(pk=statement_id)
    actions = {
        "rendered": _render_statement,
        "uploaded": _upload_statement,
        "emailed": _email_statement,
    }
    done = STATEMENT_STEPS.index(context.step) + 1 if context.step else 0
    if done:
        logger.info(
            "statement %s: attempt %d resumes after step %r",
            statement.pk,
            context.attempt,
            context.step,
        )
    for step in STATEMENT_STEPS[done:]:
        actions[step](statement, context)
        context.set_step(step)
        logger.info("statement %s: %s", statement.pk, step)
    return {"statement": statement.pk, "url": statement.uploaded_url}


def _render_statement(statement: Statement, context: JobContext) -> None:
    orders = statement.customer.orders.order_by("id")
    lines = [f"Statement {statement.period} for {statement.customer}"]
    lines += [f"#{order.pk}: {order.total}" for order in orders]
    statement.body = "\n".join(lines)
    statement.render_count += 1
    statement.rendered_at = timezone.now()
    statement.save(update_fields=["body", "render_count", "rendered_at"])


def _upload_statement(statement: Statement, context: JobContext) -> None:
    if context.attempt == 1:
        # A simulated outage of the file store, on every first attempt, so the demo
        # always shows a retry resuming here instead of rendering again.
        raise StorageUnavailable("file store answered 503 Service Unavailable")
    statement.uploaded_url = f"https://files.example.com/statements/{statement.pk}.pdf"
    statement.save(update_fields=["uploaded_url"])


def _email_statement(statement: Statement, context: JobContext) -> None:
    _send(
        SentEmail.Kind.STATEMENT,
        statement.customer.email,
        f"Your statement for {statement.period}",
        f"Download it from {statement.uploaded_url}\n\n{statement.body}",
    )
    statement.emailed_at = timezone.now()
    statement.save(update_fields=["emailed_at"])


# ---------------------------------------------------------------- a scheduled report
@task(queue_name="reports")
def compile_daily_sales(day: str) -> dict[str, int]:
    """Compile the sales of ``day`` (ISO date); running it again just recompiles."""
    date = datetime.date.fromisoformat(day)
    totals = Order.objects.filter(created_at__date=date).aggregate(
        orders=Count("id"), revenue=Sum("total_cents")
    )
    with transaction.atomic():
        DailyReport.objects.update_or_create(
            day=date,
            defaults={"orders": totals["orders"], "revenue_cents": totals["revenue"] or 0},
        )
    return {"orders": totals["orders"], "revenue_cents": totals["revenue"] or 0}


#: The shop's own clock, for "yesterday" in the nightly report.
SHOP_TIMEZONE = "Europe/Berlin"


@periodic("30 2 * * *", name="nightly-sales-report", timezone=SHOP_TIMEZONE)
@task(queue_name="reports", takes_context=True)
def nightly_sales_report(context: JobContext) -> dict[str, int]:
    """Compile the sales of the day before the night the schedule fired for.

    ``context.fire_time`` is the fire time this job stands for (None when enqueued by
    hand), so a job that runs late, or a second time, still reports the right day.
    """
    fired = context.fire_time or timezone.now()
    day = fired.astimezone(ZoneInfo(SHOP_TIMEZONE)).date() - datetime.timedelta(days=1)
    result: dict[str, int] = compile_daily_sales.func(day.isoformat())
    return result
