"""``manage.py queue_summary``: what the queue and the shop's jobs have done so far."""

from __future__ import annotations

import json
from collections import defaultdict
from typing import Any

from django.core.management.base import BaseCommand, CommandParser
from django.db.models import Count
from django.utils import timezone

from django_pgqueue import JobStatus
from django_pgqueue.models import Job
from orders.models import (
    AnalyticsEvent,
    DailyReport,
    Invoice,
    LoyaltyEntry,
    Order,
    SentEmail,
    Statement,
)


def summarise() -> dict[str, Any]:
    """Return jobs per status and per task, the dead letters, and the shop's outcomes."""
    statuses = dict.fromkeys(JobStatus.values, 0)
    for row in Job.objects.values("status").annotate(count=Count("id")):
        statuses[row["status"]] = row["count"]
    tasks: dict[str, dict[str, int]] = defaultdict(dict)
    for row in Job.objects.values("task_path", "status").annotate(count=Count("id")):
        tasks[row["task_path"].rpartition(".")[2]][row["status"]] = row["count"]
    dead_letters = [
        {
            "id": job.pk,
            "task": job.task_name,
            "attempts": job.attempts,
            "error": f"{job.last_error_class}: {job.last_error}",
        }
        for job in Job.objects.filter(status=JobStatus.DEAD_LETTER).order_by("id")
    ]
    scheduled = Job.objects.filter(
        status=JobStatus.PENDING, available_at__gt=timezone.now()
    ).count()
    statements = Statement.objects.filter(emailed_at__isnull=False)
    return {
        "jobs": statuses,
        "scheduled": scheduled,
        "tasks": dict(sorted(tasks.items())),
        "dead_letters": dead_letters,
        "orders": Order.objects.count(),
        "double_submits": Order.objects.filter(submissions__gt=1).count(),
        "receipts_sent": SentEmail.objects.filter(kind=SentEmail.Kind.RECEIPT).count(),
        "invoices": Invoice.objects.count(),
        "loyalty_entries": LoyaltyEntry.objects.count(),
        "loyalty_in_order": loyalty_in_order(),
        "statements_delivered": statements.count(),
        "statements_rendered_once": statements.filter(render_count=1).count(),
        "analytics_events": AnalyticsEvent.objects.count(),
        "daily_reports": DailyReport.objects.count(),
    }


def loyalty_in_order() -> bool:
    """Return whether each customer's points were applied in the order of their orders."""
    last_order: dict[int, int] = {}
    for customer_id, order_id in LoyaltyEntry.objects.order_by("id").values_list(
        "customer_id", "order_id"
    ):
        if order_id < last_order.get(customer_id, 0):
            return False
        last_order[customer_id] = order_id
    return True


class Command(BaseCommand):
    help = "Summarise the job queue and what the shop's jobs produced."

    def add_arguments(self, parser: CommandParser) -> None:
        """Declare the options."""
        parser.add_argument("--json", action="store_true", help="Print one JSON object.")

    def handle(self, *args: Any, **options: Any) -> None:
        """Print the summary."""
        summary = summarise()
        if options["json"]:
            self.stdout.write(json.dumps(summary))
            return
        say = self.stdout.write
        say("jobs: " + ", ".join(f"{count} {status}" for status, count in summary["jobs"].items()))
        say(f"  of which scheduled for later: {summary['scheduled']}")
        for task_name, counts in summary["tasks"].items():
            say(f"  {task_name}: " + ", ".join(f"{n} {status}" for status, n in counts.items()))
        say(f"dead letters: {len(summary['dead_letters'])}")
        for dead in summary["dead_letters"]:
            say(
                f"  #{dead['id']} {dead['task']} after {dead['attempts']} attempts: {dead['error']}"
            )
        say(
            f"orders: {summary['orders']} ({summary['double_submits']} submitted twice), "
            f"receipts sent: {summary['receipts_sent']}, invoices: {summary['invoices']}"
        )
        say(
            f"loyalty entries: {summary['loyalty_entries']}, applied in order: "
            f"{'yes' if summary['loyalty_in_order'] else 'NO'}"
        )
        say(
            f"statements delivered: {summary['statements_delivered']} "
            f"({summary['statements_rendered_once']} rendered once despite the failed upload)"
        )
        say(
            f"analytics events: {summary['analytics_events']}, "
            f"daily reports: {summary['daily_reports']}"
        )
