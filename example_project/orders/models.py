"""The shop's data, and the rows its background jobs write (e-mails, invoices, ledgers)."""

from __future__ import annotations

from django.db import models
from django.db.models import Q


def euros(cents: int) -> str:
    """Return an amount in cents as euros, e.g. ``€38.00``."""
    return f"€{cents / 100:.2f}"


class Warehouse(models.Model):
    """Where products ship from; each warehouse is told about new orders through its API."""

    name = models.CharField(max_length=50, unique=True)
    api_online = models.BooleanField(
        default=True,
        help_text="Untick to simulate an outage of this warehouse's API: its notification "
        "jobs then retry with backoff and end up as dead letters.",
    )

    def __str__(self) -> str:
        return self.name


class Product(models.Model):
    """Something the shop sells."""

    sku = models.CharField(max_length=32, unique=True)
    name = models.CharField(max_length=100)
    price_cents = models.PositiveIntegerField()
    stock = models.IntegerField(default=0)
    warehouse = models.ForeignKey(Warehouse, on_delete=models.PROTECT, related_name="products")

    class Meta:
        ordering = ("name",)
        constraints = (
            models.CheckConstraint(condition=Q(stock__gte=0), name="stock_not_negative"),
        )

    def __str__(self) -> str:
        return self.name

    @property
    def price(self) -> str:
        """Return the price in euros."""
        return euros(self.price_cents)


class Customer(models.Model):
    """A customer and the loyalty points applied to their account so far."""

    name = models.CharField(max_length=100)
    email = models.EmailField(unique=True)
    loyalty_points = models.IntegerField(default=0)

    class Meta:
        ordering = ("name",)

    def __str__(self) -> str:
        return self.name


class Order(models.Model):
    """One checkout: created with its follow-up jobs in a single transaction."""

    #: One per checkout form: a double submit carries the same token and finds this order.
    checkout_token = models.UUIDField(unique=True)
    customer = models.ForeignKey(Customer, on_delete=models.PROTECT, related_name="orders")
    product = models.ForeignKey(Product, on_delete=models.PROTECT, related_name="orders")
    quantity = models.PositiveIntegerField()
    total_cents = models.PositiveIntegerField()
    points_redeemed = models.PositiveIntegerField(default=0)
    submissions = models.PositiveIntegerField(
        default=1, help_text="How many times the checkout form was submitted for this order."
    )
    #: The ids of the order's follow-up jobs by name, to show their progress.
    job_ids = models.JSONField(default=dict, blank=True)
    warehouse_notified_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ("-id",)

    def __str__(self) -> str:
        return f"Order #{self.pk}"

    @property
    def total(self) -> str:
        """Return the total in euros."""
        return euros(self.total_cents)

    @property
    def points_earned(self) -> int:
        """Return the loyalty points this order earns: one per whole euro."""
        return self.total_cents // 100


class Counter(models.Model):
    """A named gap-free sequence (invoice numbers), advanced under a row lock."""

    name = models.CharField(max_length=50, primary_key=True)
    value = models.BigIntegerField(default=0)

    def __str__(self) -> str:
        return f"{self.name} = {self.value}"


class Invoice(models.Model):
    """The invoice of one order, issued by the ``create_invoice`` job."""

    order = models.OneToOneField(Order, on_delete=models.CASCADE, related_name="invoice")
    number = models.CharField(max_length=20, unique=True)
    amount_cents = models.PositiveIntegerField()
    issued_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ("-id",)

    def __str__(self) -> str:
        return self.number


class LoyaltyEntry(models.Model):
    """One change of a customer's points; rows per customer are in the order applied."""

    customer = models.ForeignKey(Customer, on_delete=models.CASCADE, related_name="loyalty")
    order = models.OneToOneField(Order, on_delete=models.CASCADE, related_name="loyalty_entry")
    earned = models.PositiveIntegerField()
    redeemed = models.PositiveIntegerField()
    balance_after = models.IntegerField()
    applied_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ("customer", "id")
        verbose_name_plural = "loyalty entries"

    def __str__(self) -> str:
        return f"{self.customer}: +{self.earned} -{self.redeemed} = {self.balance_after}"


class Statement(models.Model):
    """A customer's monthly statement, delivered by a multi-step job."""

    customer = models.ForeignKey(Customer, on_delete=models.CASCADE, related_name="statements")
    period = models.CharField(max_length=7, help_text="YYYY-MM")
    body = models.TextField(blank=True)
    render_count = models.PositiveIntegerField(
        default=0, help_text="Times the statement was rendered; 1 when a retry resumed."
    )
    rendered_at = models.DateTimeField(null=True, blank=True)
    uploaded_url = models.URLField(blank=True)
    emailed_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ("-id",)

    def __str__(self) -> str:
        return f"{self.customer} {self.period}"


class SentEmail(models.Model):
    """An e-mail the jobs sent (the demo keeps mail in memory; this is the record)."""

    class Kind(models.TextChoices):
        RECEIPT = "receipt", "Receipt"
        STATEMENT = "statement", "Statement"
        REVIEW = "review", "Review request"

    kind = models.CharField(max_length=16, choices=Kind.choices)
    to = models.EmailField()
    subject = models.CharField(max_length=200)
    body = models.TextField()
    order = models.ForeignKey(
        Order, on_delete=models.CASCADE, null=True, blank=True, related_name="emails"
    )
    sent_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ("-id",)

    def __str__(self) -> str:
        return f"{self.kind} to {self.to}"


class AnalyticsEvent(models.Model):
    """An event reported to the (simulated) analytics service by an async job."""

    name = models.CharField(max_length=50)
    order = models.ForeignKey(Order, on_delete=models.CASCADE, related_name="analytics_events")
    recorded_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ("-id",)

    def __str__(self) -> str:
        return f"{self.name} #{self.order_id}"


class DailyReport(models.Model):
    """Sales of one day, compiled by a scheduled job."""

    day = models.DateField(unique=True)
    orders = models.PositiveIntegerField()
    revenue_cents = models.PositiveIntegerField()
    compiled_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ("-day",)

    def __str__(self) -> str:
        return f"Sales of {self.day}"
