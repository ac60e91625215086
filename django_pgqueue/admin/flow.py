"""Flow control: every concurrency key with work, its limits and what waits on them.

Read-only: the rows belong to the queue's statements (claim, complete, fail, release,
reap), which keep them in step with the job table. A key's row exists while it has a
pending or processing job (a rate-limited key keeps it until its bucket is full again).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from django.contrib import admin
from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from django_pgqueue.models import ConcurrencyKey, Job
from django_pgqueue.states import JobStatus

__all__ = ["FlowControlAdmin", "describe_wait", "tokens_now"]

#: max_in_flight of a key with a rate limit only.
UNBOUNDED = 2147483647

if TYPE_CHECKING:
    _ModelAdmin = admin.ModelAdmin[ConcurrencyKey]
else:  # ModelAdmin is generic for the type checker only
    _ModelAdmin = admin.ModelAdmin


def tokens_now(row: ConcurrencyKey) -> float | None:
    """Return the key's bucket as of now (None: no rate limit), as the claim computes it."""
    if row.rate_limit is None or row.rate_period is None or row.tokens is None:
        return None
    elapsed = 0.0
    if row.tokens_at is not None:
        elapsed = max((timezone.now() - row.tokens_at).total_seconds(), 0.0)
    return min(float(row.rate_limit), row.tokens + elapsed * row.rate_limit / row.rate_period)


def _limit_text(row: ConcurrencyKey) -> str:
    if row.max_in_flight >= UNBOUNDED:
        return gettext("%(n)s in flight, no limit") % {"n": row.in_flight}
    return gettext("%(n)s/%(limit)s in flight") % {"n": row.in_flight, "limit": row.max_in_flight}


def _rate_text(row: ConcurrencyKey) -> str:
    tokens = tokens_now(row)
    if tokens is None or row.rate_limit is None or row.rate_period is None:
        return "—"
    return gettext("%(limit)s per %(period)s s; %(used)s started this period") % {
        "limit": row.rate_limit,
        "period": f"{row.rate_period:g}",
        "used": max(row.rate_limit - int(tokens), 0),
    }


def describe_wait(job: Job) -> str | None:
    """Return what a limited job waits on, in words (None: it has no concurrency key)."""
    if job.concurrency_key is None or job.status not in {
        JobStatus.PENDING,
        JobStatus.PROCESSING,
    }:
        return None
    row = ConcurrencyKey.objects.using(job._state.db).filter(pk=job.concurrency_key).first()
    if row is None:
        return gettext("concurrency key %(key)s (no job of it in flight)") % {
            "key": job.concurrency_key
        }
    state = _limit_text(row)
    if job.status == JobStatus.PROCESSING:
        return gettext("counts against concurrency key %(key)s (%(state)s)") % {
            "key": row.concurrency_key,
            "state": state,
        }
    if row.in_flight >= row.max_in_flight:
        return gettext("waiting for concurrency key %(key)s (%(state)s)") % {
            "key": row.concurrency_key,
            "state": state,
        }
    tokens = tokens_now(row)
    if tokens is not None and tokens < 1:
        return gettext("waiting for the rate limit of key %(key)s (%(rate)s)") % {
            "key": row.concurrency_key,
            "rate": _rate_text(row),
        }
    return gettext("concurrency key %(key)s (%(state)s): a slot is free") % {
        "key": row.concurrency_key,
        "state": state,
    }


class FlowControlAdmin(_ModelAdmin):
    """Each concurrency key with work: limit, in flight, rate, jobs waiting on it."""

    list_display = ("concurrency_key", "queue_name", "in_flight_display", "rate_display", "waiting")
    list_filter = ("queue",)
    show_facets = admin.ShowFacets.NEVER
    search_fields = ("concurrency_key",)
    ordering = ("queue", "concurrency_key")
    list_per_page = 100
    # Says what the page lists, and why it may be empty right after limited jobs ran.
    change_list_template = "django_pgqueue/admin/flow_changelist.html"

    class Media:
        css: ClassVar[dict[str, tuple[str, ...]]] = {"all": ("django_pgqueue/admin/pgqueue.css",)}

    def has_add_permission(self, request: HttpRequest) -> bool:
        """Return False: the queue's statements create the rows."""
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        """Return False: the rows are written by the queue's statements only."""
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        """Return False: a row goes away with its key's last job."""
        return False

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        """Render the listing under the page's own title."""
        return super().changelist_view(
            request,
            {"title": _("Flow control: concurrency and rate limits"), **(extra_context or {})},
        )

    # The list's cells are short ("3/4", "20/1s · 5 used") so that the table fits its
    # column at 1280x800 with the sidebar open; a job's page says it in words.
    @admin.display(description=_("in flight"))
    def in_flight_display(self, row: ConcurrencyKey) -> str:
        """Return "3/4" (in flight, of the limit), or "3, no limit"."""
        if row.max_in_flight >= UNBOUNDED:
            return gettext("%(n)s, no limit") % {"n": row.in_flight}
        return f"{row.in_flight}/{row.max_in_flight}"

    @admin.display(description=_("rate"))
    def rate_display(self, row: ConcurrencyKey) -> SafeString | str:
        """Return the rate limit and how much of this period's budget is spent."""
        tokens = tokens_now(row)
        if tokens is None or row.rate_limit is None or row.rate_period is None:
            return "—"
        return format_html(
            '<span title="{}">{}/{}s · {}</span>',
            _rate_text(row),
            row.rate_limit,
            f"{row.rate_period:g}",
            gettext("%(used)s used") % {"used": max(row.rate_limit - int(tokens), 0)},
        )

    @admin.display(description=_("queue"), ordering="queue")
    def queue_name(self, row: ConcurrencyKey) -> str:
        """Return the queue of the key's next job (the model's label is long for a header)."""
        return row.queue or "—"

    @admin.display(description=_("jobs waiting"))
    def waiting(self, row: ConcurrencyKey) -> int:
        """Return the key's pending jobs (pgq_job_conc_pending)."""
        return (
            Job.objects.using(row._state.db)
            .filter(status=JobStatus.PENDING, concurrency_key=row.concurrency_key)
            .count()
        )
