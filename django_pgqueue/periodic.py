"""Documented import path of the ``@periodic`` decorator.

The code lives in :mod:`django_pgqueue.features.periodic`; this module only re-exports it.
"""

from django_pgqueue.features.periodic import (
    PeriodicSchedule,
    declared_schedules,
    parse_fire_key,
    periodic,
)

__all__ = ["PeriodicSchedule", "declared_schedules", "parse_fire_key", "periodic"]
