"""What the views (and the demo's seeding) do: place orders, request statements.

The interesting part is :func:`place_order`: the order row, the stock reservation and every
follow-up job are written in one transaction, and the card is charged last. A declined
card raises, the transaction rolls back, and the jobs vanish with the order: no receipt
for an order that does not exist.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import timedelta

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from django_pgqueue.features.workflows import group, step
from orders.models import Customer, Order, Product, Statement
from orders.tasks import (
    INVOICE_LINES,
    apply_loyalty_points,
    buy_shipping_label,
    create_invoice,
    deliver_statement,
    notify_warehouse,
    price_line,
    record_analytics_event,
    render_invoice_pdf,
    request_review,
    send_receipt,
)

#: The card number the simulated payment provider declines (as in real test modes).
DECLINED_CARD = "4000000000000002"
#: A card it accepts.
APPROVED_CARD = "4242424242424242"
#: How long after an order the customer is asked for a review.
REVIEW_DELAY = timedelta(days=3)


class CheckoutError(Exception):
    """The order could not be placed; nothing was written."""


class OutOfStock(CheckoutError):
    """Fewer items are in stock than were ordered."""


class PaymentDeclined(CheckoutError):
    """The payment provider declined the card."""


@dataclass(frozen=True, slots=True)
class PlacedOrder:
    """An order and the ids of the jobs that follow it."""

    order: Order
    #: False on a double submit: the order (and its jobs) already existed.
    created: bool
    job_ids: dict[str, str]


def place_order(
    *,
    checkout_token: uuid.UUID,
    customer: Customer,
    product: Product,
    quantity: int,
    card_number: str,
    points_redeemed: int = 0,
) -> PlacedOrder:
    """Create the order, queue its follow-up jobs and charge the card: all or nothing.

    A second call with the same ``checkout_token`` (a double click, a browser retrying
    the POST) finds the first order and neither reserves stock nor charges again. It does
    enqueue the jobs again, and their idempotency keys return the jobs the first call
    queued instead of adding new ones: the customer gets one receipt, even when both
    requests race. Raises :class:`OutOfStock` or :class:`PaymentDeclined`, having
    written nothing.
    """
    with transaction.atomic():
        order, created = Order.objects.get_or_create(
            checkout_token=checkout_token,
            defaults={
                "customer": customer,
                "product": product,
                "quantity": quantity,
                "total_cents": product.price_cents * quantity,
                "points_redeemed": points_redeemed,
            },
        )
        if created:
            reserved = Product.objects.filter(pk=product.pk, stock__gte=quantity).update(
                stock=F("stock") - quantity
            )
            if not reserved:
                left = Product.objects.values_list("stock", flat=True).get(pk=product.pk)
                raise OutOfStock(f"only {left} x {product.name} left")
        else:
            Order.objects.filter(pk=order.pk).update(submissions=F("submissions") + 1)
        job_ids = _queue_follow_ups(order)
        if created:
            job_ids["invoice_pdf"] = _queue_invoice_pdf(order)
        elif "invoice_pdf" in order.job_ids:
            # A double submit: the first call queued the workflow (it has no idempotency
            # key: jobs enqueued after= others cannot have one).
            job_ids["invoice_pdf"] = order.job_ids["invoice_pdf"]
        if created:
            order.job_ids = job_ids
            order.save(update_fields=["job_ids"])
            # Charged last: it is the one step a rollback cannot undo. If it raises, the
            # order, the reservation and the jobs above roll back together.
            _charge_card(order, card_number)
    return PlacedOrder(order=order, created=created, job_ids=job_ids)


#: The tasks behind the names in ``Order.job_ids``.
FOLLOW_UP_TASKS = {
    "receipt": send_receipt,
    "invoice": create_invoice,
    "loyalty": apply_loyalty_points,
    "warehouse": notify_warehouse,
    "analytics": record_analytics_event,
    "review": request_review,
    "invoice_pdf": render_invoice_pdf,
    "label": buy_shipping_label,
}


def _queue_invoice_pdf(order: Order) -> str:
    """Fan out one pricing job per invoice line, fan in to the PDF; return the PDF job's id.

    In the caller's transaction: a declined card rolls the whole workflow back.
    """
    priced = group(*(step(price_line, order.pk, line) for line in INVOICE_LINES))
    return render_invoice_pdf.using(after=priced).enqueue(order.pk).id


def _queue_follow_ups(order: Order) -> dict[str, str]:
    """Enqueue the order's jobs in the caller's transaction; return their ids by name."""
    pk = order.pk
    results = {
        "receipt": send_receipt.using(idempotency_key=f"receipt:{pk}").enqueue(pk),
        "invoice": create_invoice.using(idempotency_key=f"invoice:{pk}").enqueue(pk),
        # Points must apply in order (a redemption needs the points earned before it):
        # jobs sharing a partition key run one at a time, oldest first.
        "loyalty": apply_loyalty_points.using(
            partition_key=f"customer:{order.customer_id}", idempotency_key=f"loyalty:{pk}"
        ).enqueue(pk),
        "warehouse": notify_warehouse.using(idempotency_key=f"warehouse:{pk}").enqueue(pk),
        # The carrier allows 5 label requests a second, shop-wide: the task's rate limit.
        "label": buy_shipping_label.using(idempotency_key=f"label:{pk}").enqueue(pk),
        "analytics": record_analytics_event.using(idempotency_key=f"analytics:{pk}").enqueue(
            "order_placed", pk
        ),
        "review": request_review.using(
            run_after=timezone.now() + REVIEW_DELAY, idempotency_key=f"review:{pk}"
        ).enqueue(pk),
    }
    return {name: result.id for name, result in results.items()}


def _charge_card(order: Order, card_number: str) -> None:
    """Charge the order's total; stands in for a payment provider's API call."""
    if card_number.replace(" ", "") == DECLINED_CARD:
        raise PaymentDeclined(f"card ending {card_number[-4:]} was declined")


def request_statement(customer: Customer, period: str) -> tuple[Statement, str]:
    """Create a statement and queue its delivery; return it and the job id."""
    with transaction.atomic():
        statement = Statement.objects.create(customer=customer, period=period)
        result = deliver_statement.enqueue(statement.pk)
    return statement, result.id
