"""``manage.py seed_demo``: add a fresh batch of orders and jobs that shows every feature."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandParser
from django.db import transaction
from django.utils import timezone

from django_pgqueue.models import Job
from orders.models import Customer, Product, Warehouse
from orders.services import (
    APPROVED_CARD,
    DECLINED_CARD,
    CheckoutError,
    PlacedOrder,
    place_order,
    request_statement,
)
from orders.tasks import compile_daily_sales

WAREHOUSES = {"Rotterdam": True, "Leipzig": False}
# sku: (name, price in cents, warehouse)
PRODUCTS = {
    "BEANS-1KG": ("Espresso beans, 1 kg", 1900, "Rotterdam"),
    "GRINDER": ("Burr grinder", 8900, "Leipzig"),
    "MUG": ("Stoneware mug", 1200, "Rotterdam"),
    "KETTLE": ("Pour-over kettle", 4500, "Leipzig"),
}
CUSTOMERS = {
    "ada@example.com": "Ada Lovelace",
    "grace@example.com": "Grace Hopper",
    "alan@example.com": "Alan Turing",
    "katherine@example.com": "Katherine Johnson",
}
# (customer, sku, quantity, points redeemed). Grace's redemptions need the points her
# earlier orders earn: only in-order processing (her partition key) makes them succeed.
ORDERS = (
    ("ada@example.com", "BEANS-1KG", 2, 0),
    ("grace@example.com", "GRINDER", 1, 0),
    ("alan@example.com", "MUG", 4, 0),
    ("grace@example.com", "BEANS-1KG", 1, 60),
    ("katherine@example.com", "KETTLE", 1, 0),
    ("grace@example.com", "MUG", 2, 0),
    ("grace@example.com", "BEANS-1KG", 1, 40),
)
RESTOCK = 500


class Command(BaseCommand):
    help = (
        "Add a fresh batch of demo data: orders with their jobs, a double submit, a declined "
        "card, in-order loyalty points, a multi-step statement, a warehouse outage that "
        "produces dead letters, and a scheduled report."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        """Declare the options."""
        parser.add_argument(
            "--report-delay",
            type=float,
            default=15.0,
            help="Seconds until the scheduled daily sales report runs (default 15).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        """Seed one batch and describe every job it queued."""
        jobs_before = Job.objects.count()
        customers, products = self._catalogue()
        say = self.stdout.write

        for email, sku, quantity, redeemed in ORDERS:
            placed = self._order(customers[email], products[sku], quantity, redeemed)
            order = placed.order
            redeeming = f", redeeming {redeemed} points" if redeemed else ""
            say(f"order #{order.pk}: {order.customer}, {quantity} x {order.product}{redeeming}")
            say(f"  jobs: {self._jobs(placed)}")

        # Alan redeems far more points than he has: the loyalty job fails for good
        # (PermanentError) and goes straight to the dead letters, without retries.
        greedy = self._order(customers["alan@example.com"], products["MUG"], 1, 5000)
        say(
            f"order #{greedy.order.pk}: Alan Turing redeems 5000 points he does not have: its "
            f"loyalty job {greedy.job_ids['loyalty']} will be dead-lettered at once"
        )

        # The same checkout token twice: a double click on "Place order".
        token = uuid.uuid4()
        first = self._order(customers["ada@example.com"], products["MUG"], 1, 0, token=token)
        second = self._order(customers["ada@example.com"], products["MUG"], 1, 0, token=token)
        same = first.job_ids == second.job_ids and first.order.pk == second.order.pk
        say(
            f"double submit: the checkout form of order #{first.order.pk} posted twice -> "
            f"{'one order, the same receipt job ' if same else 'DIFFERENT jobs '}"
            f"{second.job_ids['receipt']} (idempotency key receipt:{first.order.pk})"
        )

        # A declined card after the order row and its jobs were written: all roll back.
        before = Job.objects.count()
        try:
            self._order(
                customers["katherine@example.com"], products["BEANS-1KG"], 3, 0, card=DECLINED_CARD
            )
        except CheckoutError as error:
            say(
                f"declined card: {error}; the order rolled back with its jobs "
                f"(jobs in the queue: {before} before, {Job.objects.count()} after)"
            )
        else:
            raise AssertionError("the declined card was charged")

        statement, job_id = request_statement(
            customers["ada@example.com"], timezone.now().strftime("%Y-%m")
        )
        say(
            f"statement {statement.pk} for {statement.customer}: multi-step job {job_id} "
            "(render -> upload -> e-mail; the first upload fails, the retry resumes)"
        )

        run_after = timezone.now() + timedelta(seconds=options["report_delay"])
        with transaction.atomic():
            report = compile_daily_sales.using(run_after=run_after).enqueue(
                timezone.localdate().isoformat()
            )
        say(
            f"daily sales report: job {report.id} scheduled for {run_after:%H:%M:%S} "
            f"(in {options['report_delay']:.0f}s)"
        )

        offline = [name for name, online in WAREHOUSES.items() if not online]
        say(
            f"warehouse API offline: {', '.join(offline)}; its notify_warehouse jobs retry "
            "with backoff and are dead-lettered after 4 attempts"
        )
        grace = customers["grace@example.com"]
        say(
            f"loyalty points of {grace}: 4 jobs in partition customer:{grace.pk}, "
            "applied one at a time, in order"
        )
        say(f"seeded: {Job.objects.count() - jobs_before} new jobs")

    def _catalogue(self) -> tuple[dict[str, Customer], dict[str, Product]]:
        """Create or refresh warehouses, products (restocked) and customers."""
        warehouses = {}
        for name, online in WAREHOUSES.items():
            warehouse, _ = Warehouse.objects.update_or_create(
                name=name, defaults={"api_online": online}
            )
            warehouses[name] = warehouse
        products = {}
        for sku, (name, price, warehouse_name) in PRODUCTS.items():
            product, _ = Product.objects.update_or_create(
                sku=sku,
                defaults={
                    "name": name,
                    "price_cents": price,
                    "warehouse": warehouses[warehouse_name],
                    "stock": RESTOCK,
                },
            )
            products[sku] = product
        customers = {}
        for email, name in CUSTOMERS.items():
            customer, _ = Customer.objects.get_or_create(email=email, defaults={"name": name})
            customers[email] = customer
        return customers, products

    def _order(
        self,
        customer: Customer,
        product: Product,
        quantity: int,
        redeemed: int,
        *,
        token: uuid.UUID | None = None,
        card: str = APPROVED_CARD,
    ) -> PlacedOrder:
        """Place an order through the same code path as the checkout view."""
        return place_order(
            checkout_token=token or uuid.uuid4(),
            customer=customer,
            product=product,
            quantity=quantity,
            card_number=card,
            points_redeemed=redeemed,
        )

    @staticmethod
    def _jobs(placed: PlacedOrder) -> str:
        return ", ".join(f"{name} {job_id}" for name, job_id in placed.job_ids.items())
