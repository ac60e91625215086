"""'Which jobs are stuck, and since when?': the panel the lag page and the inbox share.

Four things hold work up, and each has a different fix, so the panel names them apart:
running jobs whose lease ran out (their worker died or hangs: housekeeping requeues
them), a worker that stopped heartbeating while alive (stopped, frozen, cut off: it may
still hold jobs), a queue with ready jobs that no live worker serves (start one, or fix
``--queue``), and a concurrency key at its limit with ready jobs waiting (a slow or hung
job holds the slots). Each line says since when, and links to the jobs, the worker or
the key. The query is ``stuck_work`` (``sql/admin.sql``), through the queue manager.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

from django.contrib.admin.utils import quote
from django.http import HttpRequest
from django.urls import NoReverseMatch, reverse
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.translation import gettext, ngettext
from django.utils.translation import gettext_lazy as _

from django_pgqueue.admin.filters import EXPIRED, READY
from django_pgqueue.admin.formatting import moment
from django_pgqueue.admin.queues import known_queues
from django_pgqueue.conf import conf
from django_pgqueue.models import Job
from django_pgqueue.store.reports import StuckKind, StuckWork

if TYPE_CHECKING:
    from django.contrib.admin import ModelAdmin

__all__ = ["COUNT_LIMIT", "StuckLine", "stuck_lines"]

#: Job counts of the panel stop here ("10,000+").
COUNT_LIMIT = 10_000
#: Lines of each kind asked for, and shown (the longest stuck first): the panel stays a
#: few lines above the page, and says how many more there are.
ROWS_SHOWN = 20
LINES_SHOWN = 3

_KIND_LABELS = {
    StuckKind.EXPIRED_LEASE: _("lease expired"),
    StuckKind.STALLED_WORKER: _("worker silent"),
    StuckKind.UNSERVED_QUEUE: _("no live worker"),
    StuckKind.FULL_KEY: _("limit full"),
}


@dataclass(frozen=True, slots=True)
class StuckLine:
    """One line of the panel: what, how many, since when, and where to look."""

    kind: StuckKind
    label: str
    text: str
    since: SafeString
    url: str

    @property
    def html(self) -> SafeString:
        """Return the line's text, linked to where to look (when the user may see it)."""
        if not self.url:
            return format_html("{}", self.text)
        return format_html('<a href="{}">{}</a>', self.url, self.text)


def stuck_lines(
    model_admin: ModelAdmin[Any], request: HttpRequest, queues: list[str] | None = None
) -> list[StuckLine]:
    """Return what is stuck now, as lines for the panel (empty: nothing is).

    ``queues``: the queues worth showing, if the page has them already.
    """
    using = model_admin.model.objects.db
    stuck = Job.objects.store(using).stuck_work(
        known_queues(using) if queues is None else queues,
        timeout_seconds=conf.WORKER_TIMEOUT_SECONDS,
        count_limit=COUNT_LIMIT,
        row_limit=ROWS_SHOWN,
    )
    now = timezone.now()
    site = model_admin.admin_site.name
    lines: list[StuckLine] = []
    for kind in StuckKind:
        of_kind = [item for item in stuck if item.kind is kind]
        lines += [_line(item, site, request, now) for item in of_kind[:LINES_SHOWN]]
        if len(of_kind) > LINES_SHOWN:
            lines.append(_more(kind, of_kind[LINES_SHOWN:], site, request))
    return lines


def _more(kind: StuckKind, rest: list[StuckWork], site: str, request: HttpRequest) -> StuckLine:
    """Return the line that stands for the rest of a kind: how many, and where they are."""
    count = f"{len(rest)}+" if len(rest) + LINES_SHOWN >= ROWS_SHOWN else str(len(rest))
    texts = {
        StuckKind.EXPIRED_LEASE: _("and %(count)s more queues with expired leases"),
        StuckKind.STALLED_WORKER: _("and %(count)s more silent workers"),
        StuckKind.UNSERVED_QUEUE: _("and %(count)s more queues without a live worker"),
        StuckKind.FULL_KEY: _("and %(count)s more keys at their limit"),
    }
    pages = {
        StuckKind.EXPIRED_LEASE: ("job", f"?{urlencode({'status': EXPIRED})}"),
        StuckKind.STALLED_WORKER: ("worker", ""),
        StuckKind.UNSERVED_QUEUE: ("lag", ""),
        StuckKind.FULL_KEY: ("concurrencykey", ""),
    }
    model, query = pages[kind]
    page = _url("job" if model == "lag" else model, "changelist", site, request)
    if page and model == "lag":
        page = reverse("admin:django_pgqueue_lag", current_app=site)
    return StuckLine(
        kind,
        str(_KIND_LABELS[kind]),
        str(texts[kind]) % {"count": count},
        SafeString(""),
        page and page + query,
    )


def _count(jobs: int) -> str:
    return f"{jobs:,}+" if jobs >= COUNT_LIMIT else f"{jobs:,}"


def _url(
    model: str, view: str, site: str, request: HttpRequest, args: list[Any] | None = None
) -> str:
    """Return the admin URL of ``model``'s ``view``, or "" if the user may not see it."""
    if not any(
        request.user.has_perm(f"django_pgqueue.{action}_{model}") for action in ("view", "change")
    ):
        return ""
    try:
        return reverse(f"admin:django_pgqueue_{model}_{view}", args=args, current_app=site)
    except NoReverseMatch:
        return ""


def _line(item: StuckWork, site: str, request: HttpRequest, now: Any) -> StuckLine:
    jobs = _count(item.jobs)
    inbox = _url("job", "changelist", site, request)
    if item.kind is StuckKind.EXPIRED_LEASE:
        text = ngettext(
            "queue %(queue)s: %(jobs)s running job whose lease expired, not requeued yet",
            "queue %(queue)s: %(jobs)s running jobs whose leases expired, not requeued yet",
            item.jobs,
        ) % {"queue": item.subject, "jobs": jobs}
        url = inbox and f"{inbox}?{urlencode({'status': EXPIRED, 'queue': item.subject})}"
        since = moment(item.since, gettext("first lease expired at"), now=now)
    elif item.kind is StuckKind.STALLED_WORKER:
        text = ngettext(
            "worker %(worker)s stopped heartbeating, holding %(jobs)s job",
            "worker %(worker)s stopped heartbeating, holding %(jobs)s jobs",
            item.jobs,
        ) % {"worker": item.subject, "jobs": jobs}
        url = _url("worker", "change", site, request, [quote(item.subject)])
        since = moment(item.since, gettext("last heartbeat at"), now=now)
    elif item.kind is StuckKind.UNSERVED_QUEUE:
        text = ngettext(
            "queue %(queue)s: %(jobs)s ready job and no live worker serves the queue",
            "queue %(queue)s: %(jobs)s ready jobs and no live worker serves the queue",
            item.jobs,
        ) % {"queue": item.subject, "jobs": jobs}
        url = inbox and f"{inbox}?{urlencode({'status': READY, 'queue': item.subject})}"
        since = moment(item.since, gettext("oldest ready job ready since"), now=now)
    else:
        text = ngettext(
            "concurrency key %(key)s is at its limit (%(limit)s in flight), %(jobs)s ready job "
            "waits",
            "concurrency key %(key)s is at its limit (%(limit)s in flight), %(jobs)s ready "
            "jobs wait",
            item.jobs,
        ) % {"key": item.subject, "limit": item.max_in_flight, "jobs": jobs}
        flow = _url("concurrencykey", "changelist", site, request)
        url = flow and f"{flow}?{urlencode({'q': item.subject})}"
        since = moment(item.since, gettext("oldest waiting job ready since"), now=now)
    return StuckLine(item.kind, str(_KIND_LABELS[item.kind]), text, since, url)
