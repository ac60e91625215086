"""The changelist of the job listings: light rows, and an index-friendly order under filters."""

from __future__ import annotations

from typing import Any

from django.contrib.admin.views.main import ORDER_VAR, ChangeList
from django.db.models import QuerySet
from django.http import HttpRequest

__all__ = ["QueueChangeList"]


class QueueChangeList(ChangeList):
    """A changelist that leaves big payload columns out and lets range filters pick the order.

    The listing never shows arguments, results or error histories, which can be large;
    loading them for every row of a page would dominate its cost. And when a time-range
    filter knows a better order for its rows (see ``TimeRangeFilter.listing_order``), the
    listing uses it, unless the user sorted by a column.
    """

    def get_queryset(self, request: HttpRequest, exclude_parameters: Any = None) -> QuerySet[Any]:
        """Return the filtered, ordered rows, without the payload columns."""
        queryset: QuerySet[Any] = super().get_queryset(request, exclude_parameters)
        deferred = getattr(self.model_admin, "list_deferred_fields", ())
        return queryset.defer(*deferred) if deferred else queryset

    def get_ordering(self, request: HttpRequest, queryset: QuerySet[Any]) -> list[Any]:
        """Return the order of the rows: a range filter's column, or the admin's default."""
        ordering: list[Any] = super().get_ordering(request, queryset)
        if ORDER_VAR in self.params:
            return ordering
        for spec in self.filter_specs:
            listing_order = getattr(spec, "listing_order", None)
            column = listing_order(queryset) if listing_order else None
            if column:
                return [f"-{column}", "-pk"]
        return ordering
