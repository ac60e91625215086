"""URLs of the test project: the admin and the metrics view."""

from django.contrib import admin
from django.urls import path

from django_pgqueue.metrics.views import metrics_view

urlpatterns = [
    path("admin/", admin.site.urls),
    path("metrics/", metrics_view, name="pgqueue-metrics"),
]
