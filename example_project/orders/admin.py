"""Admin pages of the shop; the queue's own pages come from ``django_pgqueue``."""

from __future__ import annotations

from django.contrib import admin
from django.urls import NoReverseMatch, reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from orders.models import (
    AnalyticsEvent,
    Customer,
    DailyReport,
    Invoice,
    LoyaltyEntry,
    Order,
    Product,
    SentEmail,
    Statement,
    Warehouse,
)
from orders.services import FOLLOW_UP_TASKS


@admin.register(Warehouse)
class WarehouseAdmin(admin.ModelAdmin):
    list_display = ("name", "api_online")
    list_editable = ("api_online",)


@admin.register(Product)
class ProductAdmin(admin.ModelAdmin):
    list_display = ("name", "sku", "price", "stock", "warehouse")


@admin.register(Customer)
class CustomerAdmin(admin.ModelAdmin):
    list_display = ("name", "email", "loyalty_points")


@admin.register(Order)
class OrderAdmin(admin.ModelAdmin):
    list_display = (
        "__str__",
        "customer",
        "product",
        "quantity",
        "total",
        "points_redeemed",
        "submissions",
        "created_at",
    )
    list_filter = ("customer", "product__warehouse")
    readonly_fields = ("jobs",)

    @admin.display(description="jobs")
    def jobs(self, order: Order) -> SafeString:
        """Link each follow-up job to its page in the queue's admin."""
        parts = []
        for name in FOLLOW_UP_TASKS:
            job_id = order.job_ids.get(name)
            if job_id is None:
                continue
            label = f"{name} #{job_id}"
            try:
                url = reverse("admin:django_pgqueue_job_change", args=[job_id])
            except NoReverseMatch:  # the queue's admin pages are not installed
                parts.append(format_html("{}", label))
            else:
                parts.append(format_html('<a href="{}">{}</a>', url, label))
        return format_html_join(", ", "{}", ((part,) for part in parts))


@admin.register(Invoice)
class InvoiceAdmin(admin.ModelAdmin):
    list_display = ("number", "order", "amount_cents", "issued_at")


@admin.register(LoyaltyEntry)
class LoyaltyEntryAdmin(admin.ModelAdmin):
    list_display = ("customer", "order", "earned", "redeemed", "balance_after", "applied_at")
    list_filter = ("customer",)


@admin.register(Statement)
class StatementAdmin(admin.ModelAdmin):
    list_display = ("__str__", "render_count", "rendered_at", "uploaded_link", "emailed_at")

    @admin.display(description="uploaded to")
    def uploaded_link(self, statement: Statement) -> SafeString | str:
        """Link the uploaded file, once the upload step has run."""
        if not statement.uploaded_url:
            return "-"
        return format_html('<a href="{0}">{0}</a>', statement.uploaded_url)


@admin.register(SentEmail)
class SentEmailAdmin(admin.ModelAdmin):
    list_display = ("kind", "to", "subject", "order", "sent_at")
    list_filter = ("kind",)


@admin.register(AnalyticsEvent)
class AnalyticsEventAdmin(admin.ModelAdmin):
    list_display = ("name", "order", "recorded_at")


@admin.register(DailyReport)
class DailyReportAdmin(admin.ModelAdmin):
    list_display = ("day", "orders", "revenue_cents", "compiled_at")
