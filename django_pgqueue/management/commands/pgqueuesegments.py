"""``manage.py pgqueuesegments status|prepare|enable|disable``: the job table in segments.

A long transaction (a report, a backup, a forgotten ``BEGIN``) keeps every dead version
of the job table's rows until it ends, and the queue slows as they pile up. In segments,
the job table is a partitioned table whose segments housekeeping empties whole once
their jobs have left, which no snapshot stops (docs/howto/segments.md).
"""

from __future__ import annotations

from argparse import ArgumentParser
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.db import router

from django_pgqueue.models import Job
from django_pgqueue.store import segments
from django_pgqueue.store.pgconn import connect
from django_pgqueue.store.segments import SegmentLayoutError


class Command(BaseCommand):
    help = (
        "Put the job table in segments, which housekeeping empties whole so that a long "
        "transaction cannot keep its dead rows (enable), or make it plain again (disable). "
        "Both run on a live queue. status says how it is stored."
    )

    def add_arguments(self, parser: ArgumentParser) -> None:
        """Declare the action and the options."""
        parser.add_argument(
            "action",
            choices=["status", "prepare", "enable", "disable"],
            help="status; prepare (the long steps of enable, ahead of it); enable; disable.",
        )
        parser.add_argument(
            "--lock-timeout",
            type=float,
            default=0.5,
            help="Seconds a statement that needs the job table's lock waits for it (0.5).",
        )
        parser.add_argument(
            "--tries", type=int, default=120, help="Tries of such a statement (120)."
        )
        parser.add_argument(
            "--wait",
            type=float,
            default=600.0,
            help="disable: seconds to wait for the jobs of other segments to move or finish (600).",
        )
        parser.add_argument("--database", help="Database alias (default: the job table's).")

    def handle(self, *args: Any, **options: Any) -> None:
        """Run the action on a connection of its own; say what it did."""
        alias = options["database"] or router.db_for_write(Job)
        patience = {"lock_timeout": options["lock_timeout"], "tries": options["tries"]}
        with connect(alias, prepare=False, application_name="pgqueuesegments") as conn:
            try:
                action = options["action"]
                if action == "prepare":
                    segments.prepare(conn, **patience)
                    self.stdout.write("Prepared: enable will only swap the tables.")
                elif action == "enable":
                    report = segments.enable(conn, **patience)
                    self.stdout.write(
                        f"The job table is in segments: the swap held its lock "
                        f"{report.lock_held_ms:.0f} ms (try {report.tries})."
                    )
                elif action == "disable":
                    report = segments.disable(conn, wait=options["wait"], **patience)
                    self.stdout.write(
                        f"The job table is a plain table again: the swap held its lock "
                        f"{report.lock_held_ms:.0f} ms (try {report.tries})."
                    )
                self._status(conn)
            except SegmentLayoutError as error:
                raise CommandError(str(error), returncode=2) from error

    def _status(self, conn: Any) -> None:
        layout = segments.layout(conn)
        if not layout.segmented:
            self.stdout.write("Layout: plain table.")
            return
        self.stdout.write(
            f"Layout: segments {', '.join(map(str, layout.segments))}; new jobs go to "
            f"segment {layout.current}."
        )
        for number, jobs in segments.jobs_per_segment(conn).items():
            label = "parked" if number == segments.PARKED else f"segment {number}"
            self.stdout.write(f"  {label}: {jobs} jobs")
