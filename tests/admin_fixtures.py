"""Helpers of the admin tests: users, jobs in every state, and admin requests.

Jobs are made through the queue manager on Django's connection (so they live in the
test's transaction and the test client sees them), the way workers would make them:
enqueue, claim, fail or complete.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Iterable, Sequence
from typing import Any

from django.contrib.auth.models import Permission, User
from django.contrib.messages import get_messages
from django.db import connection
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from django_pgqueue.models import Job
from django_pgqueue.store.values import ClaimedJob, Failure, JobSpec

SCRIPT = "<script>alert('xss')</script>"
ESCAPED_SCRIPT = "&lt;script&gt;"

#: Permissions by role.
VIEW = ("view_job", "view_deadletter", "view_worker")
CHANGE = (*VIEW, "change_job", "change_deadletter")
DELETE = (*VIEW, "delete_job", "delete_deadletter")


def make_user(*codenames: str, username: str = "operator") -> User:
    """Return a staff user holding the given django_pgqueue permissions."""
    user = User.objects.create_user(username, password="secret", is_staff=True)
    user.user_permissions.set(
        Permission.objects.filter(content_type__app_label="django_pgqueue", codename__in=codenames)
    )
    return user


def login(client: Client, *codenames: str, superuser: bool = False) -> User:
    """Log ``client`` in as a fresh staff user with the given permissions."""
    if superuser:
        user = User.objects.create_superuser("root", password="secret")
    else:
        user = make_user(*codenames)
    client.force_login(user)
    return user


def store():
    """Return a QueueStore on Django's connection (the test's transaction)."""
    return Job.objects.store()


def enqueue(task_path: str = "tests.tasks.add", **options: Any) -> Job:
    """Enqueue one job through the manager."""
    return store().enqueue(JobSpec(task_path, **options)).job


def claim(job: Job, worker_id: str = "web-1:100", lease_seconds: float = 30) -> ClaimedJob:
    """Lease ``job`` to ``worker_id`` (it must be the next job of its queue)."""
    claimed = store().claim(worker_id, [job.queue], per_queue=1, lease_seconds=lease_seconds)
    assert [c.id for c in claimed] == [job.pk], "another job of the queue was claimed first"
    return claimed[0]


def dead_letter(
    task_path: str = "tests.tasks.add",
    *,
    error_class: str = "ValueError",
    message: str = "boom",
    traceback: str = "Traceback (most recent call last):\nValueError: boom",
    worker_id: str = "web-1:100",
    **options: Any,
) -> Job:
    """Return a job that failed its only attempt and was dead-lettered."""
    # Available long ago: the claim below takes it before any other job of its queue.
    options.setdefault("available_at", timezone.now() - dt.timedelta(days=365))
    job = enqueue(task_path, max_attempts=1, **options)
    lease = claim(job, worker_id).lease
    store().fail_if_leased(lease, Failure(error_class, message, traceback))
    return Job.objects.get(pk=job.pk)


def succeeded(task_path: str = "tests.tasks.add", result: Any = None, **options: Any) -> Job:
    """Return a job that ran and returned ``result``."""
    options.setdefault("available_at", timezone.now() - dt.timedelta(days=365))
    job = enqueue(task_path, **options)
    store().complete_if_leased(claim(job).lease, json.dumps(result))
    return Job.objects.get(pk=job.pk)


def running(task_path: str = "tests.tasks.add", *, expired: bool = False, **options: Any) -> Job:
    """Return a job leased to a worker; ``expired`` makes its lease run out already."""
    options.setdefault("available_at", timezone.now() - dt.timedelta(days=365))
    job = enqueue(task_path, **options)
    claim(job)
    if expired:
        with connection.cursor() as cursor:
            cursor.execute(
                "UPDATE django_pgqueue_job SET lease_expires_at = now() - interval '1 minute' "
                "WHERE id = %s",
                [job.pk],
            )
    return Job.objects.get(pk=job.pk)


def scheduled(task_path: str = "tests.tasks.add", **options: Any) -> Job:
    """Return a pending job that becomes ready in a day."""
    return enqueue(task_path, available_at=timezone.now() + dt.timedelta(days=1), **options)


def cancelled(task_path: str = "tests.tasks.add", **options: Any) -> Job:
    """Return a job cancelled before it ran."""
    job = enqueue(task_path, **options)
    assert store().cancel([job.pk]).done == (job.pk,)
    return Job.objects.get(pk=job.pk)


def url(name: str, *args: Any, **query: Any) -> str:
    """Return the admin URL ``admin:<name>`` with ``query`` as its query string."""
    path = reverse(f"admin:{name}", args=args or None)
    if query:
        from urllib.parse import urlencode

        path += "?" + urlencode(query)
    return path


def post_action(
    client: Client,
    path: str,
    action: str,
    ids: Iterable[int] = (),
    *,
    confirmed: bool = True,
    select_across: bool = False,
    follow: bool = False,
    **extra: Any,
) -> Any:
    """POST an admin action as the changelist (or its confirmation page) would."""
    data: dict[str, Any] = {
        "action": action,
        "index": "0",
        "select_across": "1" if select_across else "0",
        "_selected_action": [str(i) for i in ids],
        **extra,
    }
    if confirmed:
        data["confirmed"] = "yes"
    return client.post(path, data, follow=follow)


def messages_of(response: Any) -> list[str]:
    """Return the admin messages a response carries."""
    return [str(message) for message in get_messages(response.wsgi_request)]


def row_ids(response: Any) -> list[int]:
    """Return the job ids listed on a changelist page, in order."""
    return [
        int(i) for i in re.findall(r'class="field-id"><a href="[^"]*/(\d+)/change/', response.text)
    ]


def statuses(ids: Sequence[int]) -> dict[int, str]:
    """Return the current status of each job (missing ones are absent)."""
    return dict(Job.objects.filter(pk__in=ids).values_list("pk", "status"))


def row_cells(response: Any) -> dict[Any, dict[str, str]]:
    """Return the cells of each listed row, as HTML by column name, by job (or worker) id."""
    rows: dict[Any, dict[str, str]] = {}
    for row in re.findall(r"<tr>(.*?)</tr>", response.text, flags=re.DOTALL):
        cells = dict(
            re.findall(r'<t[hd] class="field-(\w+)[^"]*">(.*?)</t[hd]>', row, flags=re.DOTALL)
        )
        if "id" in cells:
            row_id = text_of(cells["id"])
            rows[int(row_id) if row_id.isdigit() else row_id] = cells
    return rows


def text_of(html: str) -> str:
    """Return the text of an HTML fragment, tags removed and spaces collapsed."""
    blocks = re.sub(r"</?(?:br|d[dlt]|div|h\d|li|ol|p|section|t[dhr]|ul)\b[^>]*>", " ", html)
    return " ".join(re.sub(r"<[^>]+>", "", blocks).split())
