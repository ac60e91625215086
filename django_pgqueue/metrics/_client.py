"""The parts of ``prometheus_client`` the metrics use, or an error naming the extra."""

from __future__ import annotations

try:
    from prometheus_client import (
        CONTENT_TYPE_LATEST,
        CollectorRegistry,
        Counter,
        Gauge,
        Histogram,
        generate_latest,
        start_http_server,
    )
    from prometheus_client.core import GaugeMetricFamily, Metric
    from prometheus_client.registry import Collector
except ImportError as error:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "django_pgqueue.metrics needs prometheus_client: "
        "pip install 'django-tasks-pgqueue[metrics]'"
    ) from error

__all__ = [
    "CONTENT_TYPE_LATEST",
    "Collector",
    "CollectorRegistry",
    "Counter",
    "Gauge",
    "GaugeMetricFamily",
    "Histogram",
    "Metric",
    "generate_latest",
    "start_http_server",
]
