"""Operator actions: retry now, run now, cancel, requeue expired leases, discard.

Every action goes through the queue manager (``Job.objects``), never through ORM writes.
It first shows a confirmation page with the number of jobs; once confirmed, it hands the
ids over a chunk at a time. The manager's statements lock rows with SKIP LOCKED: a job a
worker is claiming or finishing at that very moment is skipped and reported, never
waited on, and never fails the request (cancel tries such a job again for about a second,
then reports it as locked: a running atomic task's open transaction holds its row). The
action then reports what it did and what it skipped, and records one admin log entry per
job it changed.

"All N matching" (select across) works on the whole filtered set, not only the visible
page: its ids are read newest first in chunks (keyset on the primary key, so each chunk
is one index range scan), restricted to the jobs the action applies to.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django.contrib import admin, messages
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.contrib.admin.models import CHANGE, DELETION, LogEntry
from django.contrib.auth import get_permission_codename
from django.contrib.contenttypes.models import ContentType
from django.core.exceptions import PermissionDenied
from django.db.models import Q, QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.utils import timezone
from django.utils.http import url_has_allowed_host_and_scheme
from django.utils.translation import gettext_lazy as _
from django.utils.translation import ngettext

from django_pgqueue.admin.filters import ANY_TIME
from django_pgqueue.admin.pagination import RowCount, count_rows
from django_pgqueue.models import Job
from django_pgqueue.states import TERMINAL_STATUSES, TRANSITIONS, Transition
from django_pgqueue.store.queue import OPERATOR_CHUNK
from django_pgqueue.store.values import OperatorResult

if TYPE_CHECKING:
    from django.contrib.admin import ModelAdmin
    from django.utils.functional import _StrPromise

__all__ = [
    "OPERATIONS",
    "RETRY_REVIVE",
    "Operation",
    "has_operation_permission",
    "operation_actions",
]

#: Job ids listed on the confirmation page and in the report; beyond that, only a count.
LISTED_IDS = 20
#: Form field naming a page to return to after the action (the job detail page).
RETURN_TO = "_return_to"


def _sources(transition: Transition) -> list[str]:
    return sorted(str(status) for status in TRANSITIONS[transition][0])


@dataclass(frozen=True, slots=True)
class Operation:
    """One operator action: what it applies to, how it runs and how it is reported."""

    name: str
    label: _StrPromise
    #: The model permission it needs ("change" or "delete").
    permission: str
    #: The jobs it applies to (used to narrow "all matching"), built when it runs.
    eligible: Callable[[], Q]
    #: Whether it applies to one job (which buttons the detail page offers).
    applies: Callable[[Job], bool]
    #: Calls the queue manager for a chunk of ids on a database alias.
    apply: Callable[[Sequence[int], str], OperatorResult]
    #: The report of what was done, given the number of jobs.
    done: Callable[[int], str]
    #: Why a job can be skipped.
    skip_reason: _StrPromise
    #: Shown on the confirmation page.
    explanation: _StrPromise
    log_flag: int
    log_message: str


RETRY = Operation(
    name="retry_now",
    label=_("Retry now"),
    permission="change",
    eligible=lambda: Q(status__in=_sources(Transition.RETRY)),
    applies=lambda job: job.status in _sources(Transition.RETRY),
    apply=lambda ids, using: Job.objects.retry(ids, using=using),
    done=lambda count: (
        ngettext("Retried %(count)d job.", "Retried %(count)d jobs.", count) % {"count": count}
    ),
    skip_reason=_("not dead-lettered or cancelled, or being changed by a worker"),
    explanation=_(
        "Dead-lettered and cancelled jobs go back to pending, ready now, with their "
        "attempts reset. Their error history is kept. Other jobs are skipped."
    ),
    log_flag=CHANGE,
    log_message="Retried now from the admin (attempts reset, ready now).",
)
RETRY_REVIVE = Operation(
    name="retry_and_revive",
    label=_("Retry and revive dependents"),
    permission="change",
    eligible=lambda: Q(status__in=_sources(Transition.RETRY), has_dependents=True),
    applies=lambda job: job.status in _sources(Transition.RETRY) and job.has_dependents,
    apply=lambda ids, using: Job.objects.retry(ids, revive_dependents=True, using=using),
    done=lambda count: (
        ngettext(
            "Retried %(count)d job and revived what it cancelled.",
            "Retried %(count)d jobs and revived what they cancelled.",
            count,
        )
        % {"count": count}
    ),
    skip_reason=_("not dead-lettered or cancelled, or being changed by a worker"),
    explanation=_(
        "As “Retry now”; besides, the jobs that were cancelled because these failed "
        "(they ran after them) wait for them again, and run once they succeed."
    ),
    log_flag=CHANGE,
    log_message="Retried now from the admin, reviving the dependents it had cancelled.",
)
RUN_NOW = Operation(
    name="run_now",
    label=_("Run now"),
    permission="change",
    eligible=lambda: Q(status__in=_sources(Transition.RUN_NOW), available_at__gt=timezone.now()),
    applies=lambda job: (
        job.status in _sources(Transition.RUN_NOW) and job.available_at > timezone.now()
    ),
    apply=lambda ids, using: Job.objects.run_now(ids, using=using),
    done=lambda count: (
        ngettext("Made %(count)d job ready now.", "Made %(count)d jobs ready now.", count)
        % {"count": count}
    ),
    skip_reason=_("not pending with a later start time, or being changed by a worker"),
    explanation=_(
        "Scheduled or backing-off pending jobs become ready now. Other jobs are skipped."
    ),
    log_flag=CHANGE,
    log_message="Made ready now from the admin.",
)
CANCEL = Operation(
    name="cancel",
    label=_("Cancel"),
    permission="change",
    eligible=lambda: Q(
        status__in=_sources(Transition.CANCEL) + _sources(Transition.STOP),
        available_at__gt=ANY_TIME,
    ),
    applies=lambda job: job.status in _sources(Transition.CANCEL) + _sources(Transition.STOP),
    apply=lambda ids, using: Job.objects.cancel(
        ids, reason="cancelled from the admin", using=using
    ),
    done=lambda count: (
        ngettext("Cancelled %(count)d job.", "Cancelled %(count)d jobs.", count) % {"count": count}
    ),
    skip_reason=_("already finished"),
    explanation=_(
        "Pending and blocked jobs are cancelled and will not run; the jobs waiting for "
        "them are cancelled too. Running jobs are asked to stop: their worker is told at "
        "once (the task sees context.cancelled, an async task gets CancelledError), and "
        "each ends cancelled, its result dropped, when its handler returns; until then it "
        "keeps its concurrency slot and its partition's turn, so nothing starts in its "
        "place. Finished jobs are skipped; a cancelled job can be retried later."
    ),
    log_flag=CHANGE,
    log_message="Cancelled from the admin.",
)
REQUEUE = Operation(
    name="requeue_expired",
    label=_("Requeue expired leases"),
    permission="change",
    eligible=lambda: Q(status__in=_sources(Transition.REAP), lease_expires_at__lt=timezone.now()),
    applies=lambda job: (
        job.status in _sources(Transition.REAP)
        and job.lease_expires_at is not None
        and job.lease_expires_at < timezone.now()
    ),
    apply=lambda ids, using: Job.objects.requeue_expired(ids, using=using),
    done=lambda count: (
        ngettext("Requeued %(count)d job.", "Requeued %(count)d jobs.", count) % {"count": count}
    ),
    skip_reason=_("not running with an expired lease, or being finished by its worker"),
    explanation=_(
        "Running jobs whose lease has expired (their worker stopped extending it) go "
        "back to pending now, or to the dead letters if that was their last attempt, "
        "instead of at the next housekeeping pass. A late result from the old worker is "
        "rejected. Jobs with a live lease are skipped."
    ),
    log_flag=CHANGE,
    log_message="Requeued from the admin (lease expired).",
)
DISCARD = Operation(
    name="discard",
    label=_("Discard"),
    permission="delete",
    eligible=lambda: Q(status__in=sorted(TERMINAL_STATUSES)),
    applies=lambda job: job.status in TERMINAL_STATUSES,
    apply=lambda ids, using: Job.objects.discard(ids, using=using),
    done=lambda count: (
        ngettext("Discarded %(count)d job.", "Discarded %(count)d jobs.", count) % {"count": count}
    ),
    skip_reason=_("not finished (pending or running), or being changed by a worker"),
    explanation=_(
        "Finished jobs (succeeded, dead-lettered or cancelled) are deleted for good, with "
        "their result and error history. Pending and running jobs are skipped."
    ),
    log_flag=DELETION,
    log_message="Discarded from the admin.",
)

#: Every operation by action name.
OPERATIONS: dict[str, Operation] = {
    operation.name: operation
    for operation in (RETRY, RETRY_REVIVE, RUN_NOW, CANCEL, REQUEUE, DISCARD)
}


def has_operation_permission(
    model_admin: ModelAdmin[Any], request: HttpRequest, operation: Operation
) -> bool:
    """Return whether the user holds the model permission ``operation`` needs.

    Checked against the model's permissions directly: the admins answer False to
    ``has_delete_permission`` so that Django's ORM deletion views stay closed.
    """
    opts = model_admin.opts
    codename = get_permission_codename(operation.permission, opts)
    return bool(request.user.has_perm(f"{opts.app_label}.{codename}"))


def operation_actions(*operations: Operation) -> list[Callable[..., HttpResponse | None]]:
    """Return admin action functions for ``operations``."""
    return [_action(operation) for operation in operations]


def _action(operation: Operation) -> Callable[..., HttpResponse | None]:
    # "discard" needs the model's delete permission, checked by has_discard_permission
    # (has_delete_permission is False: it would open Django's ORM delete views).
    permission = "discard" if operation.permission == "delete" else operation.permission

    @admin.action(description=operation.label, permissions=[permission])
    def action(
        model_admin: ModelAdmin[Any], request: HttpRequest, queryset: QuerySet[Job]
    ) -> HttpResponse | None:
        return perform(model_admin, request, queryset, operation)

    action.__name__ = operation.name
    return action


def perform(
    model_admin: ModelAdmin[Any],
    request: HttpRequest,
    queryset: QuerySet[Job],
    operation: Operation,
) -> HttpResponse | None:
    """Confirm, then run ``operation`` on the selected jobs or on all matching ones."""
    if not has_operation_permission(model_admin, request, operation):
        raise PermissionDenied
    across = request.POST.get("select_across") == "1"
    target = queryset.filter(operation.eligible())
    # Without "all matching", the admin's own queryset still decides what may be
    # selected (the dead-letter page only ever acts on dead letters, whatever is posted).
    selected = [] if across else sorted(queryset.values_list("pk", flat=True))
    if request.POST.get("confirmed") != "yes":
        if across:
            # Django needs one checked row with "all matching"; any posted one will do.
            posted = request.POST.getlist(ACTION_CHECKBOX_NAME)[:1]
            return _confirmation(model_admin, request, operation, count_rows(target), posted)
        count = RowCount(len(selected), estimated=False)
        return _confirmation(model_admin, request, operation, count, selected)

    using = queryset.db
    done = 0
    skipped: list[int] = []
    busy: list[int] = []
    running: list[int] = []
    for chunk in _chunks(target) if across else _split(selected):
        result = operation.apply(chunk, using)
        _log(request, result.done, operation)
        done += len(result.done)
        skipped.extend(job_id for job_id in result.skipped if job_id not in result.busy)
        busy.extend(result.busy)
        running.extend(result.running)
    _report(model_admin, request, operation, done, skipped, busy=busy, running=running)
    return_to = _safe_return_to(request)
    return HttpResponseRedirect(return_to) if return_to else None


def _safe_return_to(request: HttpRequest) -> str:
    """Return the posted page to go back to, if it is one of this site's."""
    return_to = request.POST.get(RETURN_TO, "")
    if return_to and url_has_allowed_host_and_scheme(
        return_to, allowed_hosts={request.get_host()}, require_https=request.is_secure()
    ):
        return return_to
    return ""


def _split(ids: list[int]) -> Iterator[list[int]]:
    for start in range(0, len(ids), OPERATOR_CHUNK):
        yield ids[start : start + OPERATOR_CHUNK]


def _chunks(queryset: QuerySet[Job]) -> Iterator[list[int]]:
    ids = queryset.order_by("-pk").values_list("pk", flat=True)
    last: int | None = None
    while True:
        page = ids if last is None else ids.filter(pk__lt=last)
        chunk = list(page[:OPERATOR_CHUNK])
        if not chunk:
            return
        yield chunk
        last = chunk[-1]


def _confirmation(
    model_admin: ModelAdmin[Any],
    request: HttpRequest,
    operation: Operation,
    count: RowCount,
    selected: Sequence[int | str],
) -> TemplateResponse:
    opts = model_admin.opts
    across = request.POST.get("select_across") == "1"
    context = {
        **model_admin.admin_site.each_context(request),
        "title": _("Are you sure?"),
        "subtitle": operation.label,
        "opts": opts,
        "operation": operation,
        "count": count,
        "select_across": across,
        "selected": selected,
        "shown_ids": [] if across else selected[:LISTED_IDS],
        "return_to": _safe_return_to(request),
        "back_url": _safe_return_to(request) or request.get_full_path(),
        "index": request.POST.get("index", "0"),
        **_cancelled_dependents(model_admin, request, operation, selected),
    }
    request.current_app = model_admin.admin_site.name
    return TemplateResponse(request, "django_pgqueue/admin/confirm_action.html", context)


def _cancelled_dependents(
    model_admin: ModelAdmin[Any],
    request: HttpRequest,
    operation: Operation,
    selected: Sequence[int | str],
) -> dict[str, Any]:
    """Return the jobs the selected jobs' failure cancelled (a retry may revive them)."""
    if operation.name not in {RETRY.name, RETRY_REVIVE.name} or not selected:
        return {}
    store = Job.objects.store(model_admin.get_queryset(request).db)
    found = store.cancelled_dependents(int(job_id) for job_id in selected)
    dependents = sorted({job_id for jobs in found.values() for job_id in jobs})
    return {
        "cancelled_dependents": dependents[:LISTED_IDS],
        "cancelled_dependents_count": len(dependents),
        "revives": operation.name == RETRY_REVIVE.name,
        "revive_offered": RETRY_REVIVE.name in model_admin.get_actions(request),
    }


def _log(request: HttpRequest, job_ids: Sequence[int], operation: Operation) -> None:
    if not job_ids:
        return
    # Always against the job model: retries from the dead-letter page then show in the
    # job's own history.
    content_type = ContentType.objects.get_for_model(Job)
    user_id: Any = request.user.pk
    LogEntry.objects.bulk_create(
        [
            LogEntry(
                user_id=user_id,
                content_type_id=content_type.pk,
                object_id=str(job_id),
                object_repr=f"#{job_id}",
                action_flag=operation.log_flag,
                change_message=operation.log_message,
            )
            for job_id in job_ids
        ],
        batch_size=OPERATOR_CHUNK,
    )


def _report(
    model_admin: ModelAdmin[Any],
    request: HttpRequest,
    operation: Operation,
    done: int,
    skipped: list[int],
    *,
    busy: Sequence[int] = (),
    running: Sequence[int] = (),
) -> None:
    model_admin.message_user(
        request, operation.done(done), messages.SUCCESS if done else messages.INFO
    )
    if running:
        message = ngettext(
            "%(ids)s was running: its handler was asked to stop, and it ends cancelled "
            "when the handler returns (it keeps its slot until then).",
            "%(count)d of them were running (%(ids)s): their handlers were asked to stop, "
            "and each ends cancelled when its handler returns (keeping its slot until then).",
            len(running),
        ) % {"count": len(running), "ids": _listed(running)}
        model_admin.message_user(request, message, messages.INFO)
    if skipped:
        message = ngettext(
            "Skipped %(count)d job (%(reason)s): %(ids)s.",
            "Skipped %(count)d jobs (%(reason)s): %(ids)s.",
            len(skipped),
        ) % {"count": len(skipped), "reason": operation.skip_reason, "ids": _listed(skipped)}
        model_admin.message_user(request, message, messages.WARNING)
    if busy:
        message = ngettext(
            "Not changed, locked by an open transaction (an atomic task still running, "
            "say; try again when it ends): %(ids)s.",
            "Not changed, locked by open transactions (atomic tasks still running, say; "
            "try again when they end): %(ids)s.",
            len(busy),
        ) % {"ids": _listed(busy)}
        model_admin.message_user(request, message, messages.WARNING)


def _listed(job_ids: Sequence[int]) -> str:
    listed = ", ".join(f"#{job_id}" for job_id in job_ids[:LISTED_IDS])
    if len(job_ids) > LISTED_IDS:
        listed += ", …"
    return listed
