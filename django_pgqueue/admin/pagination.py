"""Counting the rows of a changelist without counting a million rows.

``COUNT(*)`` reads every matching row; on a job table of millions that is seconds per
page view. :class:`EstimatedCountPaginator` counts exactly only while that is cheap (at
most ``EXACT_LIMIT`` rows, through the same index the listing uses) and otherwise shows
the planner's estimate, marked as such.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django.core.paginator import Paginator
from django.db.models import Model, QuerySet
from django.utils.functional import cached_property

from django_pgqueue.models import Job

__all__ = [
    "EXACT_LIMIT",
    "MAX_PAGES",
    "EstimatedCountPaginator",
    "RowCount",
    "count_rows",
    "estimate_rows",
]

#: Counts up to this many rows are exact.
EXACT_LIMIT = 10_000
#: Pages offered by a listing: deeper OFFSETs get slow; filters reach older rows instead.
MAX_PAGES = 1_000


@dataclass(frozen=True, slots=True)
class RowCount:
    """A number of rows, exact or estimated."""

    value: int
    estimated: bool


def count_rows(queryset: QuerySet[Any], *, exact_limit: int = EXACT_LIMIT) -> RowCount:
    """Count ``queryset``'s rows exactly if there are few, else return an estimate.

    The estimate is the planner's (EXPLAIN, nothing is read); the exact count is taken
    only when that estimate is small, and stops at ``exact_limit`` + 1 rows anyway, so a
    wrong estimate costs a bounded amount of work.
    """
    queryset = queryset.order_by()
    estimate = estimate_rows(queryset)
    if estimate > exact_limit:
        return RowCount(estimate, estimated=True)
    exact = queryset[: exact_limit + 1].count()
    if exact > exact_limit:
        return RowCount(max(exact, estimate), estimated=True)
    return RowCount(exact, estimated=False)


def estimate_rows(queryset: QuerySet[Any]) -> int:
    """Return the planner's estimate of ``queryset``'s rows; nothing is read but the catalog."""
    if queryset.query.is_empty():
        return 0
    if queryset.model._meta.concrete_model is Job and not queryset.query.where:
        # The whole table: the catalog knows its size, no EXPLAIN needed.
        estimate = Job.objects.store(queryset.db).estimated_job_count()
        if estimate is not None:
            return estimate
    plan = json.loads(queryset.order_by().explain(format="json"))
    rows: float = plan[0]["Plan"]["Plan Rows"]
    return int(rows)


if TYPE_CHECKING:
    _Paginator = Paginator[Any]
else:  # Paginator is generic for the type checker only
    _Paginator = Paginator


class EstimatedCountPaginator(_Paginator):
    """A paginator whose ``count`` is exact when cheap and estimated otherwise."""

    object_list: QuerySet[Model]

    @cached_property
    def row_count(self) -> RowCount:
        """Return the number of rows, and whether it is an estimate."""
        return count_rows(self.object_list)

    @cached_property
    def count(self) -> int:
        """Return the (possibly estimated) number of rows."""
        return self.row_count.value

    @property
    def estimated(self) -> bool:
        """Return whether ``count`` is an estimate."""
        return self.row_count.estimated

    @cached_property
    def num_pages(self) -> int:
        """Return the number of pages, at most ``MAX_PAGES``."""
        pages: int = super().num_pages
        return min(pages, MAX_PAGES)
