"""The storefront: a checkout form, order pages that show their jobs, statement requests."""

from __future__ import annotations

from dataclasses import dataclass

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import NoReverseMatch, reverse
from django.utils import timezone
from django.views.decorators.http import require_GET, require_POST

from orders.forms import CheckoutForm
from orders.models import Customer, Order, Warehouse
from orders.services import FOLLOW_UP_TASKS, CheckoutError, place_order, request_statement

try:
    from django.tasks.exceptions import TaskResultDoesNotExist
except ImportError:  # Django 5.2 LTS: the django-tasks backport
    from django_tasks.exceptions import TaskResultDoesNotExist  # type: ignore[no-redef]


@dataclass(frozen=True, slots=True)
class JobRow:
    """One follow-up job of an order, as the order page shows it."""

    name: str
    job_id: str
    status: str
    attempts: int
    last_error: str
    admin_url: str | None


@require_GET
def home(request: HttpRequest) -> HttpResponse:
    """Show the checkout form, recent orders, customers and warehouses."""
    return _home(request, CheckoutForm())


def _home(request: HttpRequest, form: CheckoutForm, *, status: int = 200) -> HttpResponse:
    context = {
        "form": form,
        "orders": Order.objects.select_related("customer", "product")[:15],
        "customers": Customer.objects.all(),
        "warehouses": Warehouse.objects.all(),
    }
    return render(request, "orders/home.html", context, status=status)


@require_POST
def checkout(request: HttpRequest) -> HttpResponse:
    """Place the order; on a declined card or missing stock nothing at all is written."""
    form = CheckoutForm(request.POST)
    if not form.is_valid():
        return _home(request, form, status=400)
    data = form.cleaned_data
    try:
        placed = place_order(
            checkout_token=data["checkout_token"],
            customer=data["customer"],
            product=data["product"],
            quantity=data["quantity"],
            card_number=data["card_number"],
            points_redeemed=data["points_redeemed"] or 0,
        )
    except CheckoutError as error:
        form.add_error(
            None,
            f"{error}. The order was rolled back, and with it its receipt, invoice and "
            "every other job: nothing was queued.",
        )
        return _home(request, form, status=409)
    if placed.created:
        messages.success(request, f"{placed.order} placed; its jobs are queued.")
    else:
        messages.info(
            request,
            f"{placed.order} was already placed (double submit): no new order, and the "
            "idempotency keys returned the jobs it already had.",
        )
    return redirect("orders:order", pk=placed.order.pk)


@require_GET
def order_detail(request: HttpRequest, pk: int) -> HttpResponse:
    """Show an order and the progress of its jobs, read through ``Task.get_result``."""
    order = get_object_or_404(Order.objects.select_related("customer", "product"), pk=pk)
    jobs = []
    for name, task in FOLLOW_UP_TASKS.items():
        job_id = order.job_ids.get(name)
        if job_id is None:
            continue
        try:
            result = task.get_result(job_id)
        except TaskResultDoesNotExist:
            continue  # pruned after its retention period
        jobs.append(
            JobRow(
                name=name,
                job_id=job_id,
                status=str(result.status),
                attempts=result.attempts,
                last_error=result.errors[-1].exception_class_path if result.errors else "",
                admin_url=_job_admin_url(job_id),
            )
        )
    return render(request, "orders/order_detail.html", {"order": order, "jobs": jobs})


def _job_admin_url(job_id: str) -> str | None:
    try:
        return reverse("admin:django_pgqueue_job_change", args=[job_id])
    except NoReverseMatch:
        return None  # the queue's admin pages are not installed


@require_POST
def statement(request: HttpRequest, pk: int) -> HttpResponse:
    """Queue this month's statement of a customer (a multi-step job)."""
    customer = get_object_or_404(Customer, pk=pk)
    created, job_id = request_statement(customer, timezone.now().strftime("%Y-%m"))
    messages.success(
        request,
        f"Statement {created.pk} for {customer} queued as job {job_id}: render, upload, "
        "e-mail. The first upload fails; watch the retry resume after 'rendered'.",
    )
    return redirect("orders:home")
