"""Prometheus metrics: the queue as the database sees it, and each worker process's own.

* :mod:`.collector` and :mod:`.views`: one scrape of the metrics view reports every queue
  of every database the ``TASKS`` backends use, whatever the number of worker hosts.
* :mod:`.worker`: what one ``runqueueworker --metrics-port`` process did (jobs, durations,
  claim round trips, leases).

Needs ``prometheus_client`` (the ``metrics`` extra); importing :mod:`.collector`,
:mod:`.views` or :mod:`.worker` without it raises ``ImportError`` naming the extra.
"""

from __future__ import annotations

__all__: list[str] = []
