"""Who sees and runs what: model permissions decide, as everywhere in the admin."""

from __future__ import annotations

import pytest

from tests.admin_fixtures import (
    CHANGE,
    DELETE,
    VIEW,
    dead_letter,
    enqueue,
    login,
    post_action,
    statuses,
    url,
)

pytestmark = [pytest.mark.timeout(60), pytest.mark.django_db]

PAGES = [
    ("django_pgqueue_job_changelist", "view_job"),
    ("django_pgqueue_lag", "view_job"),
    ("django_pgqueue_deadletter_changelist", "view_deadletter"),
    ("django_pgqueue_deadletter_groups", "view_deadletter"),
    ("django_pgqueue_worker_changelist", "view_worker"),
]


@pytest.mark.parametrize(("name", "_permission"), PAGES)
def test_anonymous_users_are_sent_to_the_login_page(client, name, _permission):
    response = client.get(url(name))
    assert response.status_code == 302
    assert response["Location"].startswith(url("login"))


@pytest.mark.parametrize(("name", "permission"), PAGES)
def test_each_page_needs_its_view_permission(client, name, permission):
    login(client, *{codename for codename in VIEW if codename != permission})
    assert client.get(url(name)).status_code == 403


@pytest.mark.parametrize(("name", "_permission"), PAGES)
def test_view_only_users_see_every_page_but_no_action(client, name, _permission):
    dead_letter()
    login(client, *VIEW)
    response = client.get(url(name))
    assert response.status_code == 200
    assert 'name="action"' not in response.text
    assert "Retry group" not in response.text


@pytest.mark.parametrize(
    ("permissions", "action", "allowed"),
    [
        (VIEW, "retry_now", False),
        (VIEW, "discard", False),
        (CHANGE, "retry_now", True),
        (CHANGE, "discard", False),
        (DELETE, "retry_now", False),
        (DELETE, "discard", True),
    ],
)
def test_posting_an_action_needs_its_permission(client, permissions, action, allowed):
    dead = dead_letter()
    login(client, *permissions)
    for page in ("django_pgqueue_job_changelist", "django_pgqueue_deadletter_changelist"):
        response = post_action(client, url(page), action, [dead.pk])
        assert response.status_code in {200, 302}
    if not allowed:
        expected = {dead.pk: "dead_letter"}
    elif action == "discard":
        expected = {}
    else:
        expected = {dead.pk: "pending"}
    assert statuses([dead.pk]) == expected


def test_change_permission_shows_change_actions_only(client):
    dead_letter()
    login(client, *CHANGE)
    response = client.get(url("django_pgqueue_job_changelist"))
    assert 'value="retry_now"' in response.text
    assert 'value="discard"' not in response.text
    assert 'value="delete_selected"' not in response.text  # never: it deletes through the ORM


def test_delete_permission_never_opens_djangos_delete_views(client):
    job = dead_letter()
    login(client, *DELETE)
    for name in ("django_pgqueue_job_delete", "django_pgqueue_deadletter_delete"):
        assert client.post(url(name, job.pk), {"post": "yes"}).status_code == 403
    response = post_action(
        client, url("django_pgqueue_job_changelist"), "delete_selected", [job.pk]
    )
    assert statuses([job.pk]) == {job.pk: "dead_letter"}
    assert response.status_code in {200, 302}


def test_dead_letter_page_acts_on_dead_letters_only(client):
    pending = enqueue()
    login(client, superuser=True)
    post_action(client, url("django_pgqueue_deadletter_changelist"), "discard", [pending.pk])
    assert statuses([pending.pk]) == {pending.pk: "pending"}


def test_workers_are_read_only(client):
    login(client, superuser=True)
    assert client.get(url("django_pgqueue_worker_add")).status_code == 403
