"""Dependencies after the fact.

``dependencies.sql``: revive or list the dependents a failure cancelled, and ask to be
told when a job finishes.
"""

from __future__ import annotations

from collections.abc import Iterable

from django_pgqueue.states import JobStatus
from django_pgqueue.store.statements.base import StoreBase, unique_ids


class DependencyStatements(StoreBase):
    """Dependencies after the fact statements of :class:`~django_pgqueue.store.queue.QueueStore`."""

    def revive_dependents(self, job_ids: Iterable[int]) -> list[int]:
        """Make the dependents the failure of ``job_ids`` cancelled blocked again.

        Call it in the transaction that retried ``job_ids``; return the revived ids.
        """
        ids = unique_ids(job_ids)
        return [row[0] for row in self._run("revive_dependents", job_ids=ids).rows]

    def cancelled_dependents(self, job_ids: Iterable[int]) -> dict[int, list[int]]:
        """Return, per job, the dependents its failure cancelled (still cancelled)."""
        found: dict[int, list[int]] = {}
        for blocker_id, job_id, *_ in self._run(
            "cancelled_dependents", job_ids=unique_ids(job_ids)
        ).rows:
            found.setdefault(blocker_id, []).append(job_id)
        return found

    def mark_awaited(self, job_id: int) -> tuple[JobStatus, bool] | None:
        """Ask for a NOTIFY when ``job_id`` finishes; return (status, awaited) or None.

        ``awaited`` is False only while another transaction holds the row (try again).
        """
        rows = self._run_retrying_moves("mark_awaited", job_id=job_id).rows
        if not rows:
            return None
        return JobStatus(rows[0][0]), bool(rows[0][1])
