"""Admin search and filters take any text: no 500, a sensible result or a clear message.

Values come straight from the URL, so anything can arrive: digits that are not ASCII
(``int("²")`` raises), NUL characters (PostgreSQL text cannot hold them), very long text.
"""

from __future__ import annotations

import pytest
from django.contrib.messages import get_messages

from tests.admin_fixtures import dead_letter, enqueue, login, row_ids, url

pytestmark = [pytest.mark.timeout(120), pytest.mark.django_db]

ODD_VALUES = ["²", "#²", "①", "١٢", "a\x00b", "\x00", "x" * 5000, "9" * 5000, "#" + "9" * 30]
JOB_PARAMETERS = [
    "q",
    "status",
    "queue",
    "task",
    "partition_key",
    "created_at__range__gte_0",
    "created_at__range__gte_1",
    "available_at__range__lte_0",
    "p",
    "o",
]
DEAD_LETTER_PARAMETERS = [
    "q",
    "queue",
    "task",
    "error_class",
    "finished_at__range__gte_0",
    "created_at__range__lte_1",
]
WORKER_PARAMETERS = ["q", "status", "hostname", "o"]


@pytest.fixture
def listed(client):
    login(client, superuser=True)
    return enqueue(idempotency_key="order-42"), dead_letter()


def _get(client, name, parameter, value):
    response = client.get(url(name), {parameter: value}, follow=True)
    assert response.status_code == 200, (parameter, value[:20], response.status_code)
    return response


def _refusals(client, name, parameters):
    """Return the (parameter, value, status) of every request that did not end in a 200."""
    failed = []
    for parameter in parameters:
        for value in ODD_VALUES:
            try:
                status = client.get(url(name), {parameter: value}, follow=True).status_code
            except Exception as error:  # the test client re-raises view errors
                status = f"{type(error).__name__}: {str(error)[:80]}"
            if status != 200:
                failed.append((parameter, value[:12], status))
    return failed


# One test per page (a superuser's login costs a password hash); each lists every failure.
def test_the_inbox_takes_any_text(client, listed):
    assert _refusals(client, "django_pgqueue_job_changelist", JOB_PARAMETERS) == []


def test_the_dead_letters_page_takes_any_text(client, listed):
    assert _refusals(client, "django_pgqueue_deadletter_changelist", DEAD_LETTER_PARAMETERS) == []


def test_the_worker_registry_takes_any_text(client, listed):
    assert _refusals(client, "django_pgqueue_worker_changelist", WORKER_PARAMETERS) == []


def test_a_search_for_a_number_that_is_not_a_job_id_finds_nothing(client, listed):
    for term in ["²", "#²", "①", "9" * 5000, "#" + "9" * 30]:
        response = _get(client, "django_pgqueue_job_changelist", "q", term)
        assert row_ids(response) == [], term[:12]


def test_a_search_for_an_id_still_finds_it(client, listed):
    ready, _dead = listed
    response = _get(client, "django_pgqueue_job_changelist", "q", f"#{ready.pk}")
    assert row_ids(response) == [ready.pk]


def test_a_nul_character_is_ignored_with_a_message(client, listed):
    response = client.get(
        url("django_pgqueue_job_changelist"), {"task": "a\x00b", "q": "order-42"}, follow=True
    )
    assert response.status_code == 200
    assert response.redirect_chain, "the parameter holding NUL is dropped by a redirect"
    assert "task=" not in response.redirect_chain[-1][0]
    messages = [str(message) for message in get_messages(response.wsgi_request)]
    assert any("NUL" in message and "task" in message for message in messages), messages
    # The other parameters still apply.
    assert row_ids(response) == [listed[0].pk]
