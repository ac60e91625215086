"""Finding the pages: the lag page in the index and sidebar, "View" links for read-only
pages, and one coherent report after acting from a job's own page."""

from __future__ import annotations

import re

import pytest

from tests.admin_fixtures import (
    CHANGE,
    VIEW,
    dead_letter,
    login,
    make_user,
    messages_of,
    store,
    url,
)

pytestmark = [pytest.mark.timeout(60), pytest.mark.django_db]

APP_PAGES = {
    "django_pgqueue_deadletter_changelist": "Dead letters",
    "django_pgqueue_job_changelist": "Jobs",
    "django_pgqueue_lag": "Queue lag",
    "django_pgqueue_worker_changelist": "Workers",
}


def _app_links(html: str) -> dict[str, str]:
    """Return the app list's links of the queue, by page: its "View"/"Change" link class."""
    links = {}
    for name in APP_PAGES:
        address = re.escape(url(name))
        match = re.search(rf'<a href="{address}" class="(\w+)"', html)
        if match:
            links[name] = match.group(1)
    return links


def test_the_index_lists_every_queue_page_with_a_view_link(client):
    login(client, superuser=True)
    response = client.get(url("index"))
    assert response.status_code == 200
    # "Change" would promise a form; every page only views, and acts through actions.
    assert _app_links(response.text) == dict.fromkeys(APP_PAGES, "viewlink")
    for name, label in APP_PAGES.items():
        assert re.search(rf'<a href="{re.escape(url(name))}">{label}</a>', response.text), label


def test_the_sidebar_links_to_the_lag_page_from_every_page(client):
    login(client, superuser=True)
    job = dead_letter()
    lag_link = f'<a href="{url("django_pgqueue_lag")}"'
    for page in (
        url("django_pgqueue_job_changelist"),
        url("django_pgqueue_job_change", job.pk),
        url("django_pgqueue_deadletter_groups"),
        url("django_pgqueue_worker_changelist"),
        url("django_pgqueue_lag"),
    ):
        sidebar = client.get(page).text.split('id="nav-sidebar"', 1)[1].split("</nav>", 1)[0]
        assert lag_link in sidebar, page
    # On its own page, the sidebar marks it as the current one.
    sidebar = client.get(url("django_pgqueue_lag")).text.split('id="nav-sidebar"', 1)[1]
    assert re.search(r'<tr class="model-lag current-model">', sidebar)


def test_the_lag_entry_follows_the_job_view_permission(client):
    login(client, "view_deadletter")
    response = client.get(url("index"))
    assert url("django_pgqueue_lag") not in response.text
    assert client.get(url("django_pgqueue_lag")).status_code == 403
    client.force_login(make_user(*VIEW, username="viewer"))  # view_job among them
    assert url("django_pgqueue_lag") in client.get(url("index")).text
    assert client.get(url("django_pgqueue_lag")).status_code == 200


def _detail_form(html: str, action: str) -> dict[str, str]:
    """Return the fields of the detail page's form that runs ``action``, as posted."""
    for form in re.findall(r"<form .*?</form>", html, flags=re.DOTALL):
        fields = dict(re.findall(r'name="([^"]+)" value="([^"]*)"', form))
        if fields.get("action") == action:
            target = re.search(r'action="([^"]+)"', form)
            assert target
            fields["_target"] = target.group(1)
            return fields
    raise AssertionError(f"no {action} form on the page")


@pytest.mark.parametrize("permissions", [CHANGE, ("view_deadletter", "change_deadletter")])
def test_retry_from_a_dead_letters_own_page_reports_one_outcome(client, permissions):
    login(client, *permissions)
    job = dead_letter()
    page = client.get(url("django_pgqueue_deadletter_change", job.pk))
    form = _detail_form(page.text, "retry_now")
    target = form.pop("_target")
    response = client.post(target, {**form, "confirmed": "yes"}, follow=True)
    # One message, and a page that shows the job as it now is (it left the dead letters).
    assert messages_of(response) == ["Retried 1 job."]
    if "view_job" in permissions:
        assert response.redirect_chain[-1][0] == url("django_pgqueue_job_change", job.pk)
        assert "Pending" in response.text
    else:  # the job's page in the inbox is not theirs to see: the dead letters are
        assert response.redirect_chain[-1][0] == url("django_pgqueue_deadletter_changelist")


def test_a_dead_letter_retried_elsewhere_leads_to_its_page_in_the_inbox(client):
    login(client, superuser=True)
    job = dead_letter()
    assert store().retry([job.pk]).done == (job.pk,)  # in another tab, say
    response = client.get(url("django_pgqueue_deadletter_change", job.pk), follow=True)
    assert response.redirect_chain[-1][0] == url("django_pgqueue_job_change", job.pk)
    assert messages_of(response) == [
        f"Job #{job.pk} is no longer a dead letter; here it is among all jobs."
    ]


def test_a_discarded_job_leads_back_to_the_listing(client):
    login(client, superuser=True)
    job = dead_letter()
    assert store().discard([job.pk]).done == (job.pk,)
    response = client.get(url("django_pgqueue_deadletter_change", job.pk), follow=True)
    assert response.redirect_chain[-1][0] == url("django_pgqueue_deadletter_changelist")
    assert messages_of(response) == [
        f"Job #{job.pk} is not here: it may have been discarded or retried."
    ]
