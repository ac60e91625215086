"""The metrics view: every queue's state in Prometheus' text format, for one scrape.

Mount it in the project's URLconf::

    from django_pgqueue.metrics.views import metrics_view

    urlpatterns = [path("metrics/", metrics_view)]

A scraper authenticates with ``Authorization: Bearer <PGQUEUE_METRICS_TOKEN>``; a logged-in
staff user may also open it in a browser. Anyone else gets 401: queue names, depths and
worker counts are operational details, not public data.
"""

from __future__ import annotations

import hmac

from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed

from django_pgqueue.conf import conf
from django_pgqueue.metrics._client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from django_pgqueue.metrics.collector import QueueCollector

__all__ = ["is_authorized", "metrics_view"]

_BEARER = "bearer "


def is_authorized(request: HttpRequest) -> bool:
    """Return whether ``request`` carries the metrics token or comes from a staff user."""
    token = conf.METRICS_TOKEN
    header = request.headers.get("Authorization", "")
    if token and header[: len(_BEARER)].lower() == _BEARER:
        offered = header[len(_BEARER) :].strip()
        # Constant time: the comparison must not tell an attacker how much of it matched.
        if hmac.compare_digest(offered.encode(), token.encode()):
            return True
    user = getattr(request, "user", None)
    return bool(user is not None and user.is_active and user.is_staff)


def metrics_view(request: HttpRequest) -> HttpResponse:
    """Return the queue metrics of every database of ``TASKS`` (GET or HEAD only)."""
    if request.method not in ("GET", "HEAD"):
        return HttpResponseNotAllowed(["GET", "HEAD"])
    if not is_authorized(request):
        response = HttpResponse("Authentication required\n", status=401, content_type="text/plain")
        response["WWW-Authenticate"] = 'Bearer realm="pgqueue metrics"'
        return response
    registry = CollectorRegistry(auto_describe=False)
    registry.register(QueueCollector())
    response = HttpResponse(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)
    # Every scrape must reach the database: a cached answer would hide a stalled queue.
    response["Cache-Control"] = "no-store"
    return response
